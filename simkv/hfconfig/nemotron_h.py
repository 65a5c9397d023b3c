"""Nemotron-H and Nemotron-3 (``nemotron_h``): one block per layer — Mamba-2 (``M``), attention (``*``), a
non-gated relu² MLP (``-``) or a MoE of relu² experts (``E``) — from ``layers_block_type`` or the older
``hybrid_override_pattern`` (transformers 5.20 configuration_nemotron_h.py ``NemotronHConfig.__post_init__`` /
``_pattern_to_list``; vLLM nemotron_h.py ``NemotronHModel`` builds ``len(hybrid_override_pattern)`` layers).

What each layer keeps: an attention layer K and V of ``num_key_value_heads`` x ``head_dim`` (vLLM
``NemotronHAttention``: ``config.head_dim``, transformers ``getattr(config, "head_dim", ...)``; 56B-Base spells it
``attention_head_dim``, which neither reads: both take the class default 128, so a file whose
``attention_head_dim`` differs from that is refused); a Mamba-2 layer a conv state ``[conv_dim, K]`` with
conv_dim = ``mamba_num_heads`` x ``mamba_head_dim`` + 2 x ``n_groups`` x ``ssm_state_size`` (the mixer's inner
size is heads x head size, not ``expand`` x hidden: modeling_nemotron_h.py ``NemotronHMamba2Mixer.__init__``,
vLLM ``NemotronHForCausalLM.get_mamba_state_shape_from_config``) and a recurrent ``[heads, head_dim, state]``;
MLP and MoE layers nothing. vLLM keeps the conv K − 1 columns in the model dtype and the recurrent state in
``mamba_ssm_cache_dtype`` (vllm/model_executor/models/config.py ``NemotronHForCausalLMConfig.
update_mamba_ssm_cache_dtype``: the config's value, float32 if absent); transformers' ``LinearAttentionLayer``
keeps K columns and the torch scan's f32 state."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import LEGACY_LAYER_TYPES, Config, Family, ssm_dtype_from
from simkv.hfconfig.hybrid import mamba2_state

#: NemotronHConfig._pattern_to_list.
PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
#: NemotronHConfig.validate_layer_type's valid types (after the legacy remap).
VALID = ("full_attention", "linear_attention", "moe", "mlp")


def block_types(c: Config) -> list[str]:
    """Each layer's block: ``layers_block_type`` (alias ``layer_types``; legacy ``mamba`` / ``attention``
    renamed), else ``hybrid_override_pattern`` — transformers' order: the list wins over the pattern."""
    given = c.values.get("layers_block_type", c.values.get("layer_types"))
    if given is None:
        pattern = c.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern or len(pattern) > limits.MAX_LAYERS:
            raise c.fail(f"hybrid_override_pattern must be a string of 1 to {limits.MAX_LAYERS:,} of "
                         f"{''.join(PATTERN)}, got {str(pattern)[:40]!r}")
        bad = sorted(set(pattern) - set(PATTERN))
        if bad:
            raise c.fail(f"hybrid_override_pattern holds {''.join(bad)!r}; known: M (Mamba-2), * (attention), "
                         "- (MLP), E (MoE)")
        return [PATTERN[ch] for ch in pattern]
    if not isinstance(given, list) or not 0 < len(given) <= limits.MAX_LAYERS or not all(
            isinstance(t, str) for t in given):
        raise c.fail(f"layers_block_type must be a list of 1 to {limits.MAX_LAYERS:,} strings")
    types = [LEGACY_LAYER_TYPES.get(t, t) for t in given]
    bad = sorted({t for t in types if t not in VALID})
    if bad:
        raise c.fail(f"layers_block_type holds {', '.join(bad)}; known: {', '.join(VALID)} (or mamba, attention)")
    return types


def num_layers(c: Config) -> int:
    """NemotronHConfig.num_hidden_layers: the length of the block list (a given ``num_hidden_layers`` is ignored
    by transformers with a warning; vLLM builds ``len(hybrid_override_pattern)``): one that differs is refused,
    the runtimes' readings of it disagreeing."""
    n = len(block_types(c))
    given = c.values.get("num_hidden_layers")
    if given is not None and given != n:
        raise c.fail(f"num_hidden_layers {given!r} differs from the {n} blocks of its layer pattern")
    return n


def _check(c: Config) -> None:
    head = c.int("head_dim", limits.MAX_HEAD_DIM)
    if c.get("attention_head_dim") is not None and c.get("attention_head_dim") != head:
        raise c.fail(f"attention_head_dim {c.get('attention_head_dim')!r} differs from head_dim {head}: transformers "
                     "and vLLM read head_dim only")


def mamba_dims(c: Config) -> tuple[int, int, int, int, int]:
    """(heads, head size, groups, state size, conv kernel) of every Mamba-2 layer."""
    return (c.int("mamba_num_heads", limits.MAX_HEADS), c.int("mamba_head_dim", limits.MAX_HEAD_DIM),
            c.int("n_groups", limits.MAX_HEADS), c.int("ssm_state_size", limits.MAX_HEAD_DIM),
            c.int("conv_kernel", limits.MAX_HEAD_DIM))


def _state(c: Config) -> tuple[int, int]:
    return mamba2_state(*mamba_dims(c))


def _moe(c: Config, n: int) -> list[int]:
    return [i for i, t in enumerate(block_types(c)) if t == "moe"]


def _mlp(c: Config, n: int) -> tuple[int, ...]:
    """The dense MLP size of each ``-`` layer (``intermediate_size``), 0 for the others (Mamba and attention
    layers have no MLP; MoE layers their experts)."""
    size = c.int("intermediate_size", limits.MAX_WIDTH)
    return tuple(size if t == "mlp" else 0 for t in block_types(c))


def _shared(c: Config, n: int) -> int:
    """vLLM NemotronHMoE: one shared NemotronHMLP of ``moe_shared_expert_intermediate_size x n_shared_experts``."""
    return (c.int("moe_shared_expert_intermediate_size", limits.MAX_WIDTH)
            * c.int("n_shared_experts", limits.MAX_EXPERTS, minimum=0, default=0))


def _weights_refused(c: Config) -> str:
    if c.get("moe_latent_size") is not None:
        return ("Nemotron-H latent MoE (moe_latent_size: experts at the latent size between fc1_latent_proj and "
                "fc2_latent_proj) is not counted")
    return ""


FAMILIES = {
    "nemotron_h": Family({"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                          "intermediate_size": 21504, "vocab_size": 131072, "tie_word_embeddings": False,
                          "max_position_embeddings": 4096, "ssm_state_size": 128, "mamba_num_heads": 128,
                          "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4, "mamba_ssm_cache_dtype": "float32",
                          "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
                          "moe_intermediate_size": 7688, "moe_shared_expert_intermediate_size": 7688,
                          "moe_latent_size": None},
                         types=lambda c, n, w: block_types(c), state=_state, types_keys=(),
                         num_layers=num_layers, moe_layers=_moe, per_layer_mlp=_mlp, shared=_shared,
                         mamba_dims=mamba_dims, mlp_matrices=2, ssm_dtype=ssm_dtype_from("mamba_ssm_cache_dtype"),
                         weights_refused=_weights_refused, check=_check,
                         # expand: read by neither runtime (the inner size is heads x head size); time_step_rank
                         # (56B-Base): no NemotronH class field, Mamba-2 has no dt rank; the MTP layers are not
                         # the main model's (vLLM loads them in its draft model)
                         reads=("hybrid_override_pattern", "layers_block_type", "attention_head_dim", "expand",
                                "chunk_size", "use_conv_bias", "mamba_proj_bias", "mamba_hidden_act",
                                "use_mamba_kernels", "time_step_rank", "moe_shared_expert_overlap",
                                "num_nextn_predict_layers", "mtp_hybrid_override_pattern", "mtp_layers_block_type",
                                "mlp_hidden_act"),
                         source="transformers 5.20 configuration_nemotron_h.py, modeling_nemotron_h.py; vLLM "
                                "nemotron_h.py, models/config.py NemotronHForCausalLMConfig"),
}

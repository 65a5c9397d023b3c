"""Mamba hybrids transformers 5.23 builds with ``LinearAttentionLayer`` states: Granite-4.0-H
(``granitemoehybrid``: Mamba-2 layers and attention layers from ``layers_block_type``) and Jamba (Mamba-1 layers,
attention every ``attn_layer_period``-th layer). Each Mamba layer keeps a conv and an SSM state per sequence."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family, mamba_inner


def jamba_types(c: Config, n: int, window) -> list[str]:
    """JambaConfig.layers_block_type (a read-only property): attention where ``i % attn_layer_period ==
    attn_layer_offset``, Mamba elsewhere."""
    period = c.int("attn_layer_period", limits.MAX_LAYERS)
    offset = c.int("attn_layer_offset", period - 1, minimum=0)
    return ["full_attention" if i % period == offset else "linear_attention" for i in range(n)]


def mamba2_state(heads: int, head: int, groups: int, state: int, kernel: int) -> tuple[int, int]:
    """A Mamba-2 layer's (conv, recurrent) elements per sequence as transformers keeps them: conv ``[conv_dim =
    heads x head + 2 x groups x state, kernel]``, recurrent ``[heads, head, state]`` (vLLM keeps kernel − 1 conv
    columns: simkv.serving.kv.groups.conv_columns)."""
    return (heads * head + 2 * groups * state) * kernel, heads * head * state


def granite_dims(c: Config) -> tuple[int, int, int, int, int]:
    """Granite-4's Mamba-2 (heads, head size, groups, state size, conv kernel), inner = heads x head size =
    ``mamba_expand × hidden_size``."""
    inner = mamba_inner(c)
    heads, groups = c.int("mamba_n_heads", limits.MAX_HEADS), c.int("mamba_n_groups", limits.MAX_HEADS)
    state, kernel = c.int("mamba_d_state", limits.MAX_HEAD_DIM), c.int("mamba_d_conv", limits.MAX_HEAD_DIM)
    d_head = inner // heads if c.get("mamba_d_head") == "auto" else c.int("mamba_d_head", limits.MAX_HEAD_DIM)
    if heads * d_head != inner:  # GraniteMoeHybridConfig.validate_architecture
        raise c.fail(f"mamba_n_heads x mamba_d_head ({heads} x {d_head}) must equal mamba_expand x hidden_size "
                     f"({inner})")
    return heads, d_head, groups, state, kernel


def mamba2(c: Config) -> tuple[int, int]:
    """Granite-4's Mamba-2 state per sequence (modeling_granitemoehybrid.py GraniteMoeHybridMambaLayer.forward:
    ``update_conv_state`` keeps ``[conv_dim = inner + 2·groups·d_state, d_conv]``; ``torch_chunk_scan``'s final
    state is ``[heads, d_head, d_state]``), inner = ``mamba_expand × hidden_size``."""
    return mamba2_state(*granite_dims(c))


def mamba1(c: Config) -> tuple[int, int]:
    """Jamba's Mamba state per sequence (modeling_jamba.py JambaMambaMixer.forward: conv ``[inner, d_conv]``,
    ``mamba_selective_scan``'s last state ``[inner, d_state]``), inner = ``mamba_expand × hidden_size``."""
    inner = mamba_inner(c)
    return inner * c.int("mamba_d_conv", limits.MAX_HEAD_DIM), inner * c.int("mamba_d_state", limits.MAX_HEAD_DIM)


def mamba1_dims(c: Config) -> tuple[int, int, int, int]:
    """Jamba's Mamba-1 (inner, state size, conv kernel, time-step rank): vLLM jamba.py
    ``JambaMambaDecoderLayer`` builds ``MambaMixer(intermediate_size = mamba_expand × hidden_size, ssm_state_size =
    mamba_d_state, conv_kernel_size = mamba_d_conv, time_step_rank = mamba_dt_rank)``; ``mamba_dt_rank`` "auto"
    is ``ceil(hidden_size / 16)`` (JambaConfig.__post_init__)."""
    rank = c.get("mamba_dt_rank")
    hidden = c.int("hidden_size", limits.MAX_WIDTH)
    rank = -(-hidden // 16) if rank == "auto" else c.int("mamba_dt_rank", limits.MAX_WIDTH)
    return (mamba_inner(c), c.int("mamba_d_state", limits.MAX_HEAD_DIM), c.int("mamba_d_conv", limits.MAX_HEAD_DIM),
            rank)


def jamba_moe(c: Config, n: int) -> list[int]:
    """JambaConfig.layers_num_experts: experts where ``i % expert_layer_period == expert_layer_offset``."""
    period = c.int("expert_layer_period", limits.MAX_LAYERS)
    offset = c.int("expert_layer_offset", period - 1, minimum=0)
    return [i for i in range(n) if i % period == offset] if c.int("num_experts", limits.MAX_EXPERTS) > 1 else []


FAMILIES = {
    "granitemoehybrid": Family({"num_attention_heads": 32, "num_key_value_heads": None, "intermediate_size": 11008,
                                "vocab_size": 32000, "tie_word_embeddings": False, "max_position_embeddings": 2048,
                                "num_local_experts": 8, "num_experts_per_tok": 2, "mamba_n_heads": 128,
                                "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_head": "auto",
                                "mamba_d_conv": 4, "mamba_expand": 2, "shared_intermediate_size": 1024},
                               types=lambda c, n, w: ["linear_attention"] * n, state=mamba2, mamba_dims=granite_dims,
                               types_keys=("layer_types", "layers_block_type"), dense_key="shared_intermediate_size",
                               shared=lambda c, n: c.int("shared_intermediate_size", limits.MAX_WIDTH),
                               reads=("mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias", "position_embedding_type"),
                               source="transformers 5.23 configuration_granitemoehybrid.py, modeling_granitemoehybrid.py"),
    "jamba": Family({"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                     "vocab_size": 65536, "tie_word_embeddings": False, "max_position_embeddings": 262144,
                     "num_experts": 16, "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
                     "mamba_expand": 2, "attn_layer_period": 8, "attn_layer_offset": 4, "expert_layer_period": 2,
                     "expert_layer_offset": 1, "mamba_dt_rank": "auto"},
                    types=jamba_types, state=mamba1, types_keys=(), moe_layers=jamba_moe, mamba1_dims=mamba1_dims,
                    reads=("mamba_conv_bias", "mamba_proj_bias", "use_mamba_kernels"),
                    source="transformers 5.23 configuration_jamba.py, modeling_jamba.py JambaMambaMixer; vLLM jamba.py, "
                           "mamba_mixer.py MambaMixer"),
}

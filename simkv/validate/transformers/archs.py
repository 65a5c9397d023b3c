"""Today's architectures for ``simkv validate --runtime transformers``: the tiny random configs ``--arch``
names, any ``config.json`` (``--model PATH``), and simkv's model of such a config.

The tiny configs are those of ``experiments/hf_layer_kinds/tiny_models.py``, where transformers 5.23's
allocations per layer kind were measured (docs/DESIGN.md §3c): window and chunk 4 so that short
workloads cross them, every cache tensor of a distinctive size.

:func:`model_spec` is this validator's own reading of a transformers config object (after the
config's ``__post_init__`` derived its ``layer_types``), as ``cache_utils.get_layer_types_and_kwargs``
reads it: ``layer_types`` — else sliding where ``sliding_window`` is set, else chunked where
``attention_chunk_size`` is, else full —, legacy names (``attention``, ``mamba``) mapped, ``moe`` /
``mlp`` and KV-sharing ``reuse`` layers holding nothing; MLA ranks (``kv_lora_rank``,
``qk_rope_head_dim``), Qwen3-Next's Gated DeltaNet dimensions and LFM2's ``conv`` layers (a
``LinearAttentionLayer`` holding only a conv state ``[B, hidden_size, conv_L_cache]``:
modeling_lfm2.py ``Lfm2ShortConv.forward``, cache_utils.py ``LinearAttentionLayer.lazy_initialization``). It reads the transformers object,
not the JSON file, so the kinds are what the runtime itself derives; the general loader of config
files is :mod:`simkv.hfconfig`.
"""

from __future__ import annotations

from pathlib import Path

from simkv.errors import ConfigError
from simkv.kvspec import LayerKV
from simkv.models import ModelSpec

__all__ = ["ARCHS", "WINDOW", "tiny_config", "load_config", "model_spec", "build_model"]

#: Sliding window (Gemma-3, gpt-oss) and attention chunk (Llama-4) of the tiny configs.
WINDOW = 4
_COMMON = dict(vocab_size=96, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
#: arch -> (transformers config class, its arguments). Layer kinds in the comments.
ARCHS: dict[str, tuple[str, dict]] = {
    # 6 layers, sliding_window_pattern 6: layers 0-4 sliding (W 4), layer 5 full
    "gemma3": ("Gemma3TextConfig", dict(_COMMON, intermediate_size=96, num_hidden_layers=6, query_pre_attn_scalar=16,
                                        sliding_window=WINDOW)),
    # 4 layers alternating: even layers sliding (W 4), odd full; attention sinks, 4 experts
    "gpt_oss": ("GptOssConfig", dict(_COMMON, intermediate_size=32, num_hidden_layers=4, num_local_experts=4,
                                     num_experts_per_tok=2, sliding_window=WINDOW)),
    # 4 layers, no_rope_layer_interval 4: layers 0-2 chunked (C 4), layer 3 full (NoPE)
    "llama4": ("Llama4TextConfig", dict(_COMMON, intermediate_size=32, intermediate_size_mlp=96, num_hidden_layers=4,
                                        num_local_experts=4, num_experts_per_tok=1, attention_chunk_size=WINDOW)),
    # 4 layers, full_attention_interval 4: layers 0-2 linear attention (Gated DeltaNet), layer 3 full
    "qwen3_next": ("Qwen3NextConfig", dict(_COMMON, intermediate_size=96, num_hidden_layers=4,
                                           linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=12,
                                           linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2)),
    # 3 layers (layer 0 a dense MLP, 1-2 MoE), MLA: kv_lora_rank 32, rope 8 (no layer_types: all full)
    "deepseek_v3": ("DeepseekV3Config", dict(vocab_size=96, hidden_size=64, intermediate_size=96,
                                             moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                                             num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
                                             num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                                             kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                             v_head_dim=12)),
    # 4 layers: conv, full, conv, full (LFM2's short conv: a conv state [B, 64, 3] only); head_dim 64 / 4 = 16
    "lfm2": ("Lfm2Config", dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3,
                                layer_types=["conv", "full_attention", "conv", "full_attention"])),
}

#: transformers' legacy layer-type names (configuration_utils.py).
_LEGACY = {"attention": "full_attention", "mamba": "linear_attention"}
_NONE = ("moe", "mlp", "dummy")
_LINEAR = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
           "linear_num_value_heads")


def tiny_config(arch: str):
    """The transformers config object of a tiny architecture (eager attention)."""
    import transformers

    if arch not in ARCHS:
        raise ConfigError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    cls, kwargs = ARCHS[arch]
    return getattr(transformers, cls)(**kwargs, attn_implementation="eager")


def load_config(path: str | Path):
    """A ``config.json`` (or a folder holding one), read by transformers offline; its text decoder's config
    (``text_config`` of a multimodal Gemma-3 or Llama-4). A problem is one-line :class:`ConfigError`."""
    from transformers import AutoConfig

    p = Path(path)
    if not p.exists():
        raise ConfigError(f"no such config: {path}")
    if p.is_dir() and not (p / "config.json").exists():
        raise ConfigError(f"{path} holds no config.json")
    try:
        config = AutoConfig.from_pretrained(str(p), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - transformers raises many kinds; the message is what matters
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"transformers cannot read {path}: {first}") from None
    return config.get_text_config(decoder=True)


def _layer_types(config) -> list[str]:
    layers = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if types is None:  # get_layer_types_and_kwargs infers them
        kind = ("sliding_attention" if getattr(config, "sliding_window", None) is not None else
                "chunked_attention" if getattr(config, "attention_chunk_size", None) is not None else "full_attention")
        types = [kind] * layers
    types = [_LEGACY.get(t, t) for t in types]
    sharing = getattr(config, "kv_sharing_modes", None)
    if sharing is not None:
        types = ["dummy" if mode == "reuse" else t for t, mode in zip(types, sharing)]
    if len(types) != layers:
        raise ConfigError(f"config has {len(types)} layer_types for {layers} layers")
    return types


def model_spec(config, name: str) -> ModelSpec:
    """simkv's model of a transformers config object: one :class:`LayerKV` per layer."""
    get = lambda key: getattr(config, key, None)  # noqa: E731
    heads = get("num_attention_heads")
    kv_heads = get("num_key_value_heads") or heads
    head_dim = get("head_dim") or get("hidden_size") // heads
    mla = (get("kv_lora_rank"), get("qk_rope_head_dim")) if get("kv_lora_rank") else None
    sinks = get("model_type") == "gpt_oss"
    layers = []
    for i, kind in enumerate(_layer_types(config)):
        if kind in _NONE:
            layers.append(LayerKV("none"))
        elif kind == "linear_attention":
            missing = [k for k in _LINEAR if get(k) is None]
            if missing:
                raise ConfigError(f"layer {i} is linear attention but the config lacks {', '.join(missing)}")
            kernel, dk, dv, hk, hv = (get(k) for k in _LINEAR)
            layers.append(LayerKV("linear", conv_elements=(2 * hk * dk + hv * dv) * kernel,
                                  recurrent_elements=hv * dk * dv))
        elif kind == "conv":  # LFM2: update_conv_state(B*x [B, hidden, seq], conv_kernel_size=conv_L_cache) only
            if get("conv_L_cache") is None:
                raise ConfigError(f"layer {i} is a short conv but the config lacks conv_L_cache")
            layers.append(LayerKV("linear", conv_elements=get("hidden_size") * get("conv_L_cache")))
        elif kind in ("full_attention", "sliding_attention", "chunked_attention"):
            short = kind.split("_")[0]
            window = {"sliding": get("sliding_window"), "chunked": get("attention_chunk_size")}.get(short)
            if mla:  # decompressed: per query head, K nope + rope, V v_head_dim
                dims = dict(kv_heads=heads, k_dim=get("qk_nope_head_dim") + mla[1], v_dim=get("v_head_dim"), latent=mla)
            else:
                dims = dict(kv_heads=kv_heads, k_dim=head_dim, v_dim=head_dim)
            layers.append(LayerKV(short, **dims, window=window, sinks=sinks))
        else:
            raise ConfigError(f"layer {i}'s type {kind!r} is not modelled (full, sliding, chunked and linear "
                              "attention, LFM2's conv, moe / mlp are)")
    return ModelSpec(name, layers=config.num_hidden_layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                     hidden=get("hidden_size") or 0, intermediate=get("intermediate_size") or 0,
                     vocab=get("vocab_size") or 0, layer_kv=tuple(layers), source="transformers config")


def build_model(config, dtype: str, seed: int):
    """A random-weight causal LM of the config (eager attention), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.to({"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]).eval()

"""Llama-4's text decoder: chunked local attention (``attention_chunk_size``) on the RoPE layers, full attention
on the NoPE ones (``no_rope_layers``, default every ``no_rope_layer_interval``-th), MoE every
``interleave_moe_layer_step``-th layer (transformers 5.23 ``Llama4TextConfig.__post_init__``)."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family


def llama4_types(c: Config, n: int, window) -> list[str]:
    """Llama4TextConfig.__post_init__: ``no_rope_layers`` (default: every ``no_rope_layer_interval``-th layer is
    NoPE), then chunked on the RoPE layers, full on the NoPE ones."""
    rope = c.ints("no_rope_layers", 1)
    if not rope:
        k = c.int("no_rope_layer_interval", limits.MAX_LAYERS)
        rope = [int((i + 1) % k != 0) for i in range(n)]
    if len(rope) != n:
        raise c.fail(f"no_rope_layers has {len(rope)} entries for {n} layers")
    return ["chunked_attention" if r else "full_attention" for r in rope]


def llama4_moe(c: Config, n: int) -> list[int]:
    """Llama4TextConfig.__post_init__: ``moe_layers``, default every ``interleave_moe_layer_step``-th layer."""
    if c.get("moe_layers") is not None:
        return c.ints("moe_layers", limits.MAX_LAYERS)
    step = c.int("interleave_moe_layer_step", limits.MAX_LAYERS)
    return list(range(step - 1, n, step))


FAMILIES = {
    "llama4_text": Family({"num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                           "intermediate_size": 8192, "intermediate_size_mlp": 16384, "vocab_size": 202048,
                           "tie_word_embeddings": False, "max_position_embeddings": 131072,
                           "attention_chunk_size": 8192, "num_local_experts": 16, "num_experts_per_tok": 1,
                           "moe_layers": None, "interleave_moe_layer_step": 1, "no_rope_layers": None,
                           "no_rope_layer_interval": 4},
                          types=llama4_types, moe_layers=llama4_moe, dense_key="intermediate_size_mlp",
                          shared=lambda c, n: c.int("intermediate_size", limits.MAX_WIDTH),
                          reads=("use_qk_norm", "attn_temperature_tuning", "floor_scale", "attn_scale"),
                          source="transformers 5.23 configuration_llama4.py Llama4TextConfig.__post_init__"),
}

"""Xiaomi MiMo-V2-Flash: full attention on layer 0 and every 6th layer, sliding-window attention elsewhere
(``hybrid_layer_pattern``: 0 full, 1 sliding; transformers 5.23 ``MiMoV2FlashConfig.__post_init__`` derives the
same without it), the sliding layers with twice the KV heads and learned sinks, every layer K of ``head_dim`` and
V of ``v_head_dim`` (modeling_mimo_v2_flash.py ``MiMoV2FlashAttention.__init__``: ``num_key_value_heads * 2 if
is_swa``, ``v_proj`` of ``v_head_dim``), the window ``sliding_window_size + 1`` where the file gives it (the query
and its ``sliding_window_size`` predecessors). The ``swa_*`` fields of the hub file must agree with that rule,
else the file is refused (transformers would build another model than its weights)."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family
from simkv.kvspec import LayerKV


def _types(c: Config, n: int) -> list[str]:
    derived = ["full_attention" if (i == 0 or not (i + 1) % 6) else "sliding_attention" for i in range(n)]
    given = c.get("layer_types")
    if given is not None:
        return given
    pattern = c.get("hybrid_layer_pattern")
    if pattern is not None:
        if not isinstance(pattern, list) or [("sliding_attention" if p == 1 else "full_attention") for p in pattern] \
                != derived or not all(p in (0, 1) for p in pattern):
            raise c.fail("hybrid_layer_pattern differs from the full-every-6th rule transformers builds "
                         "(MiMoV2FlashConfig.__post_init__); give layer_types")
    return derived


def mimo_layers(c: Config, n: int) -> list[LayerKV]:
    kv = c.int("num_key_value_heads", limits.MAX_HEADS)
    k_dim, v_dim = c.int("head_dim", limits.MAX_HEAD_DIM), c.int("v_head_dim", limits.MAX_HEAD_DIM)
    for key, want in (("swa_num_key_value_heads", 2 * kv), ("swa_head_dim", k_dim), ("swa_v_head_dim", v_dim),
                      ("swa_num_attention_heads", c.get("num_attention_heads"))):
        if c.get(key) is not None and c.get(key) != want:
            raise c.fail(f"{key} {c.get(key)!r} differs from what transformers builds ({want}): not read")
    size = c.get("sliding_window_size")
    window = size + 1 if isinstance(size, int) and not isinstance(size, bool) and size > 0 else c.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or not 0 < window <= limits.MAX_TOKENS:
        raise c.fail(f"sliding_window must be an integer from 1 to {limits.MAX_TOKENS:,}, got {window!r}")
    out = []
    for i, t in enumerate(_types(c, n)):
        if t == "sliding_attention":
            out.append(LayerKV("sliding", 2 * kv, k_dim, v_dim, window, sinks=True))
        elif t == "full_attention":
            out.append(LayerKV("full", kv, k_dim, v_dim))
        else:
            raise c.fail(f"layer {i} is {t!r}: MiMo-V2 has full_attention and sliding_attention layers")
    return out


def mimo_moe(c: Config, n: int) -> list[int]:
    """``moe_layer_freq`` (1: MoE) where given, else ``mlp_layer_types`` (``sparse``), else every layer but the
    first (MiMoV2FlashConfig.__post_init__)."""
    freq = c.get("moe_layer_freq")
    if isinstance(freq, list):
        return [i for i, f in enumerate(c.ints("moe_layer_freq", 1)) if f]
    kinds = c.get("mlp_layer_types")
    if isinstance(kinds, list):
        return [i for i, k in enumerate(kinds) if k == "sparse"]
    return list(range(1, n))


FAMILIES = {
    "mimo_v2_flash": Family({"num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192, "v_head_dim": 128,
                             "intermediate_size": 16384, "vocab_size": 152576, "tie_word_embeddings": False,
                             "max_position_embeddings": 131072, "moe_intermediate_size": 2048,
                             "num_experts_per_tok": 8, "n_routed_experts": 256, "sliding_window": 129},
                            layers=mimo_layers, moe_layers=mimo_moe,
                            reads=("v_head_dim", "hybrid_layer_pattern", "swa_num_key_value_heads", "swa_head_dim",
                                   "swa_v_head_dim", "swa_num_attention_heads", "sliding_window_size",
                                   "moe_layer_freq", "mlp_layer_types", "add_swa_attention_sink_bias",
                                   "add_full_attention_sink_bias", "attention_value_scale", "swa_rope_theta"),
                            source="transformers 5.23 configuration_mimo_v2_flash.py, modeling_mimo_v2_flash.py "
                                   "MiMoV2FlashAttention"),
}

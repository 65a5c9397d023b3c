"""Gemma-4's text decoder: sliding layers of ``num_key_value_heads`` x ``head_dim`` and full layers of
``global_head_dim`` (default 512) with ``num_global_key_value_heads`` KV heads where ``attention_k_eq_v`` (else
``num_key_value_heads``), layer types given or 5 sliding : 1 full, the last layer always full; with
``attention_k_eq_v`` a full layer's values are its keys before their norms, still cached as separate K and V
(transformers 5.23 ``Gemma4TextConfig.__post_init__`` per_layer_config, modeling_gemma4.py
``Gemma4TextAttention.forward``: ``past_key_values.update(key_states, value_states)``). The last
``num_kv_shared_layers`` layers reuse the KV of the last earlier layer of their type (``kv_sharing_modes``) and
keep none. A MoE block beside the dense MLP where ``enable_moe_block`` (``Gemma4TextDecoderLayer``)."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family
from simkv.kvspec import LayerKV


def _types(c: Config, n: int) -> list[str]:
    types = c.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n:
        raise c.fail(f"layer_types must be a list of {n} layer types")
    return [*types[:-1], "full_attention"] if types else types


def gemma4_layers(c: Config, n: int) -> list[LayerKV]:
    for key in ("hidden_size_per_layer_input",):
        if c.get(key):
            raise c.fail(f"{key} {c.get(key)!r}: Gemma-4's per-layer input embeddings are weights simkv does not "
                         "count")
    window = c.int("sliding_window", limits.MAX_TOKENS)
    if c.get("use_bidirectional_attention") == "all":
        window = window // 2 + 1
    kv, dim = c.int("num_key_value_heads", limits.MAX_HEADS), c.int("head_dim", limits.MAX_HEAD_DIM)
    global_kv = c.int("num_global_key_value_heads", limits.MAX_HEADS, default=kv) if c.get("attention_k_eq_v") else kv
    global_dim = c.int("global_head_dim", limits.MAX_HEAD_DIM, default=512)
    specs = {"sliding_attention": LayerKV("sliding", kv, dim, dim, window),
             "full_attention": LayerKV("full", global_kv, global_dim, global_dim)}
    types = _types(c, n)
    bad = [t for t in types if t not in specs]
    if bad:
        raise c.fail(f"layer type {bad[0]!r}: Gemma-4 has sliding_attention and full_attention layers")
    return share_kv(c, types, [specs[t] for t in types])


def share_kv(c: Config, types: list[str], out: list[LayerKV]) -> list[LayerKV]:
    """The last ``num_kv_shared_layers`` layers keep no KV: each reads the KV of the last layer of its type before
    them (Gemma4TextConfig.kv_sharing_modes; modeling_gemma3n.py ``Gemma3nTextAttention.__init__``
    ``kv_shared_layer_index``); transformers' cache holds only the layers before them (cache_utils.py:
    ``layer_types[:-num_kv_shared_layers]``)."""
    n = len(types)
    first = n - c.int("num_kv_shared_layers", n - 1, minimum=0, default=0)
    for i in range(first, n):
        producer = max((j for j in range(first) if types[j] == types[i]), default=None)
        if producer is None:
            raise c.fail(f"layer {i} shares the KV of a {types[i]} layer, but none comes before layer {first}")
        out[i] = LayerKV("none", reuses=producer)
    return out


FAMILIES = {
    "gemma4_text": Family({"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                           "intermediate_size": 9216, "vocab_size": 262144, "tie_word_embeddings": True,
                           "max_position_embeddings": 131072, "sliding_window": 512, "attention_k_eq_v": False,
                           "num_kv_shared_layers": 0, "enable_moe_block": False, "use_double_wide_mlp": False,
                           "hidden_size_per_layer_input": 256},
                          layers=gemma4_layers, k_eq_v=lambda c: bool(c.get("attention_k_eq_v")), aliases={"top_k_experts": "num_experts_per_tok"},
                          reads=("global_head_dim", "num_global_key_value_heads", "attention_k_eq_v",
                                 "num_kv_shared_layers", "enable_moe_block", "top_k_experts", "num_experts",
                                 "moe_intermediate_size", "use_double_wide_mlp", "hidden_size_per_layer_input",
                                 "vocab_size_per_layer_input", "use_bidirectional_attention"),
                          moe_layers=lambda c, n: list(range(n)) if c.get("enable_moe_block") else [],
                          shared=lambda c, n: c.int("intermediate_size", limits.MAX_WIDTH),
                          source="transformers 5.23 configuration_gemma4.py, modeling_gemma4.py Gemma4TextAttention"),
}

"""Gemma-3n's text decoder (``gemma3n_text``): sliding and full layers, every one ``num_key_value_heads`` x
``head_dim``, layer types given or 4 sliding : 1 full; the last ``num_kv_shared_layers`` layers keep no KV and
read that of the last earlier layer of their type (transformers 5.23 configuration_gemma3n.py
``Gemma3nTextConfig.__post_init__``, modeling_gemma3n.py ``Gemma3nTextAttention.__init__``; cache_utils.py builds
the cache of the first layers only). vLLM gemma3n.py ``Gemma3nAttention`` shares the same way
(``kv_sharing_target_layer_name``: no KV of its own) but names the producer ``first − 2`` for a sliding layer and
``first − 1`` for a full one, which is transformers' producer only where the last unshared layer is full and the
one before it sliding: a file where they differ is refused.

The weights are not sized (one line): the per-layer input embeddings (``vocab_size_per_layer_input`` x layers x
``hidden_size_per_layer_input``), AltUp's ``altup_num_inputs`` streams and LAuReL's rank-``laurel_rank`` blocks
are modules simkv does not count. ``intermediate_size`` may be one size per layer."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family
from simkv.hfconfig.gemma4 import share_kv
from simkv.kvspec import LayerKV


def _types(c: Config, n: int) -> list[str]:
    types = c.get("layer_types")
    if types is None:  # Gemma3nTextConfig.__post_init__
        types = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or not all(
            t in ("sliding_attention", "full_attention") for t in types):
        raise c.fail(f"layer_types must be a list of {n} of sliding_attention and full_attention")
    return types


def gemma3n_layers(c: Config, n: int) -> list[LayerKV]:
    kv, dim = c.int("num_key_value_heads", limits.MAX_HEADS), c.int("head_dim", limits.MAX_HEAD_DIM)
    window = c.int("sliding_window", limits.MAX_TOKENS)
    types = _types(c, n)
    specs = {"sliding_attention": LayerKV("sliding", kv, dim, dim, window), "full_attention": LayerKV("full", kv, dim, dim)}
    out = share_kv(c, types, [specs[t] for t in types])
    first = next((i for i, layer in enumerate(out) if layer.reuses is not None), n)
    for i in range(first, n):  # vLLM gemma3n.py Gemma3nAttention: first - 2 (sliding), first - 1 (full)
        vllm = first - (2 if types[i] == "sliding_attention" else 1)
        if out[i].reuses != vllm:
            raise c.fail(f"layer {i} reads the KV of layer {out[i].reuses} in transformers but of layer {vllm} in "
                         "vLLM (Gemma-3n's KV sharing expects the last unshared layer full, the one before sliding)")
    return out


def _mlp(c: Config, n: int) -> tuple[int, ...]:
    """Gemma3nTextConfig: ``intermediate_size`` one size, or one per layer."""
    sizes = c.get("intermediate_size")
    if isinstance(sizes, list):
        return tuple(c.ints("intermediate_size", limits.MAX_WIDTH)) if len(sizes) == n else _bad(c, n)
    return (c.int("intermediate_size", limits.MAX_WIDTH),) * n


def _bad(c: Config, n: int):
    raise c.fail(f"intermediate_size must be one size or {n}, one per layer")


def _weights_refused(c: Config) -> str:
    return ("Gemma-3n's per-layer input embeddings (hidden_size_per_layer_input, vocab_size_per_layer_input), AltUp "
            "(altup_num_inputs) and LAuReL (laurel_rank) modules are not counted")


FAMILIES = {
    "gemma3n_text": Family({"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
                            "intermediate_size": 16384, "vocab_size": 262400, "tie_word_embeddings": True,
                            "max_position_embeddings": 32768, "sliding_window": 512, "num_kv_shared_layers": 15,
                            "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144,
                            "altup_num_inputs": 4, "laurel_rank": 64},
                           layers=gemma3n_layers, per_layer_mlp=_mlp, dense_key="", weights_refused=_weights_refused,
                           reads=("altup_active_idx", "altup_coef_clip", "altup_correct_scale",
                                  "activation_sparsity_pattern"),
                           source="transformers 5.23 configuration_gemma3n.py, modeling_gemma3n.py "
                                  "Gemma3nTextAttention; vLLM gemma3n.py Gemma3nAttention"),
}

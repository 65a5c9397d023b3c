"""Model types simkv knows and refuses, each with the reason in one line: what their layers keep is a kind of
cache simkv does not hold yet (an indexer's keys, a compressed cache, a state beside attention in one layer), or a
state whose shapes it has not read from the source. Refusing them is the rule: never a number that is silently
wrong."""

from __future__ import annotations

_STATE_SPACE = "a pure state-space model (no attention layer): its recurrent state shapes are not read"

REFUSED: dict[str, str] = {
    "falcon_h1": "every Falcon-H1 layer is 'hybrid', attention KV and a Mamba state in one layer "
                 "(configuration_falcon_h1.py layers_block_type), which no simkv layer kind holds",
    "deepseek_v4": "compressed sparse attention (compress_ratios: CSA and HCA layers, transformers "
                   "compressed_sparse_attention / heavily_compressed_attention), a cache simkv does not hold yet",
    "deepseek_ref": "DeepSeek-V4's compressed sparse attention (compress_ratios), a cache simkv does not hold yet",
    "kimi_linear": "Kimi Delta Attention layers (linear_attn_config) beside MLA layers: their state shapes are not "
                   "read",
    "minimax_m3": "lightning-indexer sparse attention (sparse_attention_config: an index-key cache beside KV), a "
                  "cache simkv does not hold yet",
    "minimax_m3_vl": "lightning-indexer sparse attention (sparse_attention_config: an index-key cache beside KV), a "
                     "cache simkv does not hold yet",
    "gemma3n": "Gemma-3n's KV sharing across layers with per-layer inputs and AltUp: not read",
    "gemma3n_text": "Gemma-3n's KV sharing across layers with per-layer inputs and AltUp: not read",
    "zamba2": "attention blocks shared across Mamba layers: not read",
    "mamba": _STATE_SPACE,
    "mamba2": _STATE_SPACE,
    "falcon_mamba": _STATE_SPACE,
    "rwkv": _STATE_SPACE,
}

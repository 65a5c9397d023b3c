"""Model types simkv knows and refuses, each with the reason in one line: what their layers keep is a kind of
cache simkv does not hold yet (an indexer's keys, a compressed cache, a state beside attention in one layer), or a
state whose shapes it has not read from the source. Refusing them is the rule: never a number that is silently
wrong."""

from __future__ import annotations

_STATE_SPACE = "a pure state-space model (no attention layer): its recurrent state shapes are not read"

#: DeepSeek-V4 (and the sgl-project ``deepseek_ref`` spelling of it): per-layer ``compress_ratios`` (0: sliding
#: window only; 4: compressed sparse attention with an indexer; 128: heavily compressed attention), vLLM keeping one
#: latent per ``compress_ratio`` tokens (vllm/models/deepseek_v4/attention.py ``get_kv_cache_spec``: MLAAttentionSpec
#: ``tokens_per_state``) beside a ``sliding_window`` cache, the compressor's state and the indexer's keys.
_DSV4 = ("compressed sparse attention: compress_ratios (one latent per 4 or 128 tokens, vLLM MLAAttentionSpec "
         "tokens_per_state), the compressor's state, the sliding_window cache and the index_n_heads / index_head_dim "
         "indexer keys per compressed token are not modelled")
_MINIMAX_M3 = ("lightning-indexer sparse attention (sparse_attention_config: sparse_attention_freq per layer, "
               "sparse_num_index_heads x sparse_index_dim index keys per token beside KV, sparse_block_size blocks; "
               "vllm/models/minimax_m3) is not modelled")

REFUSED: dict[str, str] = {
    "falcon_h1": "every Falcon-H1 layer is 'hybrid', attention KV and a Mamba state in one layer "
                 "(configuration_falcon_h1.py layers_block_type), which no simkv layer kind holds",
    "deepseek_v4": _DSV4,
    "deepseek_ref": _DSV4,
    "kimi_linear": "Kimi Delta Attention layers (linear_attn_config: kda_layers, num_heads, head_dim, "
                   "short_conv_kernel_size) beside MLA layers (full_attn_layers): the KDA conv and recurrent state "
                   "shapes vLLM keeps (vllm/models/kimi_k3) are not read",
    "minimax_m3": _MINIMAX_M3,
    "minimax_m3_vl": _MINIMAX_M3,
    "zamba2": "attention blocks shared across Mamba layers: not read",
    "mamba": _STATE_SPACE,
    "mamba2": _STATE_SPACE,
    "falcon_mamba": _STATE_SPACE,
    "rwkv": _STATE_SPACE,
}

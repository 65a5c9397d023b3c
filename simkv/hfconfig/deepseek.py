"""DeepSeek-V3 / R1 and Kimi-K2 / K2.5 (same architecture and fields: vLLM's ``ModelConfig.get_head_size`` lists
``kimi_k2`` among the MLA model types and builds it with ``DeepseekV3ForCausalLM``): multi-head latent attention on
every layer, the cache one latent of ``kv_lora_rank`` + ``qk_rope_head_dim`` per token (vLLM ``MLAAttentionSpec``,
transformers 5.x ``DynamicCache``: keys ``[B, 1, L, kv_lora_rank]``, values ``[B, 1, L, qk_rope_head_dim]``),
decompressed per head K ``qk_nope_head_dim + qk_rope_head_dim``, V ``v_head_dim`` (transformers
``DeepseekV3Attention``, an optimum-intel export). The MTP layers (``num_nextn_predict_layers``) are a
speculative draft's.

DeepSeek-V3.2 (``deepseek_v32``) and GLM-5.x (``glm_moe_dsa``, which vLLM's registry builds with
deepseek_v2.py ``GlmMoeDsaForCausalLM``) are the same MLA plus DeepSeek sparse attention: vLLM gives every MLA
layer an ``Indexer`` when the config has ``index_topk`` (``DeepseekV2MLAAttention.is_v32``), whose
``DeepseekV32IndexerCache`` keeps one key of ``index_head_dim`` fp8 bytes + one f32 scale per 128 per token
(simkv.kvspec.indexer_bytes: 132 B). Only that (vLLM's) layout is read: transformers' GlmMoeDsaAttention caches
K and V expanded and keeps the indexer's bf16 keys outside DynamicCache, so simkv's runs refuse these models
(simkv.precision.Precision.check). ``index_topk`` (how many tokens attention reads) changes compute, not what is
cached.

IndexCache (GLM-5.2 / 5.3: ``index_topk_freq``, ``index_skip_topk_offset``, ``index_topk_pattern``): layers that
reuse an earlier layer's top-k build no indexer. vLLM deepseek_v2.py ``DeepseekV2MLAAttention.__init__``:
``_skip_topk = max(layer_id - index_skip_topk_offset + 1, 0) % index_topk_freq != 0`` (defaults 1 and 2), or
``index_topk_pattern[layer_id] == "S"`` when a pattern is given, and ``self.indexer`` (with its
``DeepseekV32IndexerCache``) is built only where ``not _skip_topk``; ``load_weights`` drops the checkpoint's indexer
weights of the other layers. So only those layers keep the 132 B key and weigh the indexer's projections. vLLM
does not read ``indexer_types`` (the same plan spelt ``full`` / ``shared`` per layer): a file whose list disagrees
with the rule is refused. ``index_share_for_mtp_iteration`` concerns the MTP draft layer only."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family

_V3 = {"num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
       "vocab_size": 129280, "tie_word_embeddings": False, "max_position_embeddings": 4096,
       "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
       "n_shared_experts": 1, "first_k_dense_replace": 3, "kv_lora_rank": 512,
       "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}
#: DeepSeek sparse attention's indexer: its heads and key size (what is cached), how many tokens it selects and
#: its rope layout (compute only).
_INDEXER = ("index_n_heads", "index_head_dim", "index_topk", "indexer_rope_interleave")
_READS = ("num_nextn_predict_layers", "moe_layer_freq", "rope_interleave", "kv_lora_rank", "q_lora_rank",
          "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "qk_head_dim")


def _check(c: Config) -> None:
    """The layout vLLM's DeepseekV2/V3 decoder builds: a MoE every layer from ``first_k_dense_replace`` on
    (``moe_layer_freq`` 1), ``qk_head_dim = qk_nope_head_dim + qk_rope_head_dim``."""
    if c.get("moe_layer_freq") not in (None, 1):
        raise c.fail(f"moe_layer_freq {c.get('moe_layer_freq')!r}: simkv reads a MoE on every layer after "
                     "first_k_dense_replace (moe_layer_freq 1)")
    mlp_types = c.get("mlp_layer_types")  # GLM-5.x's per-layer spelling of first_k_dense_replace; vLLM reads the latter
    if mlp_types is not None:
        first, n = c.get("first_k_dense_replace") or 0, c.get("num_hidden_layers")
        if not isinstance(n, int) or mlp_types != ["dense" if i < first else "sparse" for i in range(n)]:
            raise c.fail("mlp_layer_types disagrees with first_k_dense_replace, from which vLLM builds the MoE layers "
                         "(DeepseekV2DecoderLayer)")
    if c.get("qk_head_dim") is not None and c.get("qk_head_dim") != (c.get("qk_nope_head_dim") or 0) + (
            c.get("qk_rope_head_dim") or 0):
        raise c.fail("qk_head_dim differs from qk_nope_head_dim + qk_rope_head_dim")

def _check_sparse(c: Config) -> None:
    """DeepSeek sparse attention's families: ``_check``, and a ``layer_types`` (GLM-5.2 / 5.3-NVFP4 list
    ``deepseek_sparse_attention`` on every layer) may only say what the family builds: MLA with the indexer on
    every layer (vLLM does not read it; ``types_keys`` is empty)."""
    _check(c)
    given, n = c.get("layer_types"), c.get("num_hidden_layers")
    if given is not None and given != ["deepseek_sparse_attention"] * n:
        raise c.fail(f"layer_types {given!r:.60}: simkv reads MLA with DeepSeek sparse attention on every layer "
                     "(deepseek_sparse_attention)")


def indexed_layers(c: Config, n: int) -> list[bool]:
    """Which of the ``n`` layers build an indexer (vLLM's IndexCache rule, module docstring); ``indexer_types``,
    when given, must say the same."""
    pattern = c.get("index_topk_pattern")
    if pattern is None:
        freq = c.int("index_topk_freq", limits.MAX_LAYERS, default=1)
        offset = c.int("index_skip_topk_offset", limits.MAX_LAYERS, minimum=0, default=2)
        keep = [max(i - offset + 1, 0) % freq == 0 for i in range(n)]
    elif isinstance(pattern, (str, list)) and len(pattern) <= limits.MAX_LAYERS and all(
            isinstance(p, str) for p in pattern):
        keep = [not (i < len(pattern) and pattern[i] == "S") for i in range(n)]
    else:
        raise c.fail(f"index_topk_pattern must be a string or a list of strings, got {pattern!r:.80}")
    given = c.get("indexer_types")
    if given is not None and given != ["full" if k else "shared" for k in keep]:
        raise c.fail("indexer_types disagrees with index_topk_freq / index_skip_topk_offset / index_topk_pattern, "
                     "from which vLLM builds the indexers (DeepseekV2MLAAttention)")
    return keep


#: IndexCache's fields (which layers build an indexer) and the MTP draft's sharing switch.
_INDEX_CACHE = ("index_topk_freq", "index_skip_topk_offset", "index_topk_pattern", "indexer_types",
                "index_share_for_mtp_iteration", "mlp_layer_types",
                # the router logits' dtype (vLLM _get_moe_router_dtype: GateLinear out_dtype; f32 for every
                # glm_moe_dsa anyway): compute only, not the router's stored weights
                "moe_router_dtype")

FAMILIES = {
    "deepseek_v3": Family(_V3, mla=True, reads=_READS, check=_check,
                          source="transformers 5.23 configuration_deepseek_v3.py, modeling_deepseek_v3.py "
                                 "DeepseekV3Attention; vLLM config/model.py get_head_size (MLA)"),
    # No transformers class: the file gives every field DeepSeek-V3's class reads.
    "kimi_k2": Family({}, mla=True, reads=_READS, check=_check,
                      source="vLLM config/model.py (kimi_k2 among the MLA types), DeepseekV3ForCausalLM"),
    # No defaults: the file must give every field vLLM's Indexer and MLA read (missing: refused in one line).
    "deepseek_v32": Family({}, mla=True, indexer=True, indexed=indexed_layers, reads=_READS + _INDEXER + _INDEX_CACHE,
                           check=_check_sparse, types_keys=(),
                           source="vLLM models/deepseek_v2.py Indexer, DeepseekV32IndexerCache (the indexer's key "
                                  "cache: fp8 + f32 scale per 128)"),
    "glm_moe_dsa": Family({}, mla=True, indexer=True, indexed=indexed_layers, reads=_READS + _INDEXER + _INDEX_CACHE,
                          check=_check_sparse, types_keys=(),
                          source="vLLM models/registry.py GlmMoeDsaForCausalLM (deepseek_v2.py), Indexer, "
                                 "DeepseekV32IndexerCache"),
}

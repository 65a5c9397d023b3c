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
cached."""

from __future__ import annotations

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
    if c.get("qk_head_dim") is not None and c.get("qk_head_dim") != (c.get("qk_nope_head_dim") or 0) + (
            c.get("qk_rope_head_dim") or 0):
        raise c.fail("qk_head_dim differs from qk_nope_head_dim + qk_rope_head_dim")

FAMILIES = {
    "deepseek_v3": Family(_V3, mla=True, reads=_READS, check=_check,
                          source="transformers 5.23 configuration_deepseek_v3.py, modeling_deepseek_v3.py "
                                 "DeepseekV3Attention; vLLM config/model.py get_head_size (MLA)"),
    # No transformers class: the file gives every field DeepSeek-V3's class reads.
    "kimi_k2": Family({}, mla=True, reads=_READS, check=_check,
                      source="vLLM config/model.py (kimi_k2 among the MLA types), DeepseekV3ForCausalLM"),
    # No defaults: the file must give every field vLLM's Indexer and MLA read (missing: refused in one line).
    "deepseek_v32": Family({}, mla=True, indexer=True, reads=_READS + _INDEXER, check=_check,
                           source="vLLM models/deepseek_v2.py Indexer, DeepseekV32IndexerCache (the indexer's key "
                                  "cache: fp8 + f32 scale per 128)"),
    "glm_moe_dsa": Family({}, mla=True, indexer=True, reads=_READS + _INDEXER, check=_check,
                          source="vLLM models/registry.py GlmMoeDsaForCausalLM (deepseek_v2.py), Indexer, "
                                 "DeepseekV32IndexerCache"),
}

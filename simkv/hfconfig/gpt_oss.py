"""gpt-oss: sliding (window ``sliding_window``) and full layers alternating from layer 0, learned attention sinks
on every layer (compute only), a MoE on every layer (transformers 5.23 ``GptOssConfig.__post_init__``,
modeling_gpt_oss.py ``GptOssAttention``)."""

from __future__ import annotations

from simkv.hfconfig.base import Family, alternate

FAMILIES = {
    "gpt_oss": Family({"num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
                       "vocab_size": 201088, "tie_word_embeddings": False, "max_position_embeddings": 131072,
                       "sliding_window": 128, "num_local_experts": 128, "num_experts_per_tok": 4},
                      types=alternate, sinks=True,
                      source="transformers 5.23 configuration_gpt_oss.py GptOssConfig.__post_init__"),
}

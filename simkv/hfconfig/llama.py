"""Llama and the decoders shaped like it: one kind of attention on every layer, ``num_key_value_heads`` heads of
``head_dim`` (else ``hidden_size / num_attention_heads``), a window where ``sliding_window`` is set, a chunk where
``attention_chunk_size`` is (transformers 5.23 ``cache_utils.get_layer_types_and_kwargs``). Defaults: each
config class's fields (models/<type>/configuration_<type>.py)."""

from __future__ import annotations

from simkv.hfconfig.base import Config, Family


def _all_softmax(c: Config) -> None:
    """MiniMax's ``attn_type_list``: 1 a softmax attention layer, 0 a lightning (linear) one (vLLM
    minimax_text_01.py); M2 is softmax throughout, and a list with a 0 is refused."""
    types = c.get("attn_type_list")
    if types is not None and (not isinstance(types, list) or any(t != 1 for t in types)):
        raise c.fail("attn_type_list has lightning-attention layers (0): not read for minimax_m2")

SOURCE = "transformers 5.23 configuration_{llama,mistral,mixtral,phi3,minimax_m2}.py; cache_utils.get_layer_types_and_kwargs"

FAMILIES = {
    "llama": Family({"num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None,
                     "intermediate_size": 11008, "vocab_size": 32000, "tie_word_embeddings": False,
                     "max_position_embeddings": 2048}, source=SOURCE),
    "mistral": Family({"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None,
                       "intermediate_size": 14336, "vocab_size": 32000, "tie_word_embeddings": False,
                       "max_position_embeddings": 131072, "sliding_window": 4096}, source=SOURCE),
    "mixtral": Family({"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None,
                       "intermediate_size": 14336, "vocab_size": 32000, "tie_word_embeddings": False,
                       "max_position_embeddings": 131072, "sliding_window": None, "num_local_experts": 8,
                       "num_experts_per_tok": 2}, source=SOURCE),
    "phi3": Family({"num_attention_heads": 32, "num_key_value_heads": None, "intermediate_size": 8192,
                    "vocab_size": 32064, "tie_word_embeddings": False, "max_position_embeddings": 4096,
                    "sliding_window": None}, source=SOURCE),
    # MiniMax-M2 / M2.5 / M2.7: full attention on every layer (MiniMaxM2Attention: num_key_value_heads x head_dim),
    # a MoE on every layer; the MTP modules are a speculative draft's (not the served model's KV).
    "minimax_m2": Family({"num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
                          "intermediate_size": 1536, "vocab_size": 200064, "tie_word_embeddings": False,
                          "max_position_embeddings": 196608, "num_local_experts": 256, "num_experts_per_tok": 8},
                         reads=("use_mtp", "mtp_transformer_layers", "num_mtp_modules", "shared_intermediate_size",
                                "attn_type_list"),
                         check=_all_softmax,
                         shared=lambda c, n: c.int("shared_intermediate_size", 1 << 20, minimum=0, default=0),
                         source="transformers 5.23 configuration_minimax_m2.py, modeling_minimax_m2.py "
                                "MiniMaxM2Attention; vLLM minimax_m2.py"),
}

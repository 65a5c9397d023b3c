"""Qwen2 / Qwen3 (dense, MoE, and the text decoder of Qwen3-VL), and Xiaomi's MiMo-7B (vLLM ``mimo.py``:
``MiMoForCausalLM`` is Qwen2's model plus MTP layers that only a speculative draft runs): a window only with
``use_sliding_window``, on layers from ``max_window_layers`` on (transformers 5.23 ``Qwen2Config`` /
``Qwen3Config.__post_init__``; Qwen2-MoE every other layer below it)."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family


def qwen_window(c: Config):
    """Qwen2/Qwen3/Qwen3-MoE ``__post_init__``: the window only with ``use_sliding_window``."""
    return c.get("sliding_window") if c.get("use_sliding_window") else None


def qwen_types(c: Config, n: int, window) -> list[str]:
    """Qwen2Config/Qwen3Config.__post_init__: sliding from layer ``max_window_layers`` on, given a window."""
    start = c.int("max_window_layers", limits.MAX_LAYERS, minimum=0)
    return ["sliding_attention" if window is not None and i >= start else "full_attention" for i in range(n)]


def qwen2_moe_types(c: Config, n: int, window) -> list[str]:
    """Qwen2MoeConfig.__post_init__: every other layer below ``max_window_layers`` slides, given the window."""
    start = c.int("max_window_layers", limits.MAX_LAYERS, minimum=0)
    on = bool(c.get("use_sliding_window"))
    return ["sliding_attention" if (i + 1) % 2 and i < start and on else "full_attention" for i in range(n)]


SOURCE = "transformers 5.23 configuration_qwen2/qwen2_moe/qwen3/qwen3_moe/qwen3_vl/qwen3_vl_moe.py"
_QWEN3_MOE = {"num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 6144,
              "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 32768,
              "sliding_window": 4096, "use_sliding_window": False, "num_experts": 128,
              "num_experts_per_tok": 8, "moe_intermediate_size": 768, "mlp_only_layers": None,
              "decoder_sparse_step": 1}
FAMILIES = {
    "qwen2": Family({"num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 22016,
                     "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 32768,
                     "sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 28},
                    types=qwen_types, window=qwen_window, source=SOURCE),
    "qwen2_moe": Family({"num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
                         "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 32768,
                         "sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 28,
                         "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                         "shared_expert_intermediate_size": 5632, "mlp_only_layers": None, "decoder_sparse_step": 1},
                        types=qwen2_moe_types,
                        window=lambda c: c.get("sliding_window") if c.get("use_sliding_window") else 0,
                        source=SOURCE),
    "qwen3": Family({"num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
                     "intermediate_size": 22016, "vocab_size": 151936, "tie_word_embeddings": False,
                     "max_position_embeddings": 32768, "sliding_window": 4096, "use_sliding_window": False,
                     "max_window_layers": 28}, types=qwen_types, window=qwen_window, source=SOURCE),
    # Qwen3MoeConfig keeps max_window_layers in files but derives no per-layer window from it (every layer slides
    # with use_sliding_window).
    "qwen3_moe": Family(_QWEN3_MOE, window=qwen_window, reads=("max_window_layers", "qkv_bias"), source=SOURCE),
    # Qwen3-VL's text decoders: Qwen3's attention without a window field (Qwen3VLTextConfig has none).
    "qwen3_vl_text": Family({"num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
                             "intermediate_size": 22016, "vocab_size": 151936,
                             "max_position_embeddings": 128000}, source=SOURCE),
    "qwen3_vl_moe_text": Family({"num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": None,
                                 "intermediate_size": 5632, "vocab_size": 151936, "tie_word_embeddings": True,
                                 "max_position_embeddings": 128000, "num_experts": 60, "num_experts_per_tok": 4,
                                 "moe_intermediate_size": 1408, "mlp_only_layers": None, "decoder_sparse_step": 1},
                                source=SOURCE),
    # MiMo-7B: no transformers class; vLLM mimo.py builds Qwen2's decoder (its fields, no defaults).
    "mimo": Family({}, types=qwen_types, window=qwen_window,
                   reads=("use_sliding_window", "max_window_layers", "num_nextn_predict_layers"),
                   source="vLLM model_executor/models/mimo.py (MiMoForCausalLM over Qwen2Model); MTP layers are a "
                          "speculative draft's"),
}

"""Gemma-2 and Gemma-3: sliding-window layers and every ``sliding_window_pattern``-th layer full (Gemma-2 every
other one), every layer ``num_key_value_heads`` x ``head_dim`` (transformers 5.23 ``Gemma2Config`` /
``Gemma3TextConfig.__post_init__``)."""

from __future__ import annotations

from simkv.hfconfig.base import Config, Family, alternate, every


def gemma3_window(c: Config):
    """Gemma3TextConfig.__post_init__: a bidirectional model halves the window (exclusive bounds)."""
    window = c.get("sliding_window")
    return window // 2 + 1 if c.get("use_bidirectional_attention") and isinstance(window, int) else window


FAMILIES = {
    "gemma2": Family({"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216,
                      "vocab_size": 256000, "tie_word_embeddings": True, "max_position_embeddings": 8192,
                      "sliding_window": 4096},
                     types=alternate, source="transformers 5.23 configuration_gemma2.py Gemma2Config.__post_init__"),
    "gemma3_text": Family({"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                           "intermediate_size": 9216, "vocab_size": 262208, "tie_word_embeddings": True,
                           "max_position_embeddings": 131072, "sliding_window": 4096,
                           "use_bidirectional_attention": False, "sliding_window_pattern": 6},
                          types=lambda c, n, w: every(c, "sliding_window_pattern", 6, "sliding_attention", n),
                          window=gemma3_window, reads=("_sliding_window_pattern",),
                          source="transformers 5.23 configuration_gemma3.py Gemma3TextConfig.__post_init__"),
}

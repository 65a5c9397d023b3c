"""LFM2: short-convolution layers and full-attention layers (``full_attn_idxs`` or ``layer_types``), its MLP size
auto-adjusted (transformers 5.23 ``Lfm2Config.__post_init__``, modeling_lfm2.py)."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family


def lfm2_types(c: Config, n: int, window) -> list[str]:
    """Lfm2Config.__post_init__ without ``layer_types``: full attention on ``full_attn_idxs`` (default every
    layer), ``conv`` elsewhere."""
    full = set(c.ints("full_attn_idxs", limits.MAX_LAYERS)) if c.get("full_attn_idxs") is not None else set(range(n))
    return ["full_attention" if i in full else "conv" for i in range(n)]


def lfm2_conv(c: Config) -> tuple[int, int]:
    """LFM2's short-conv state per sequence: a conv state only, no recurrent state. transformers 5.23
    (modeling_lfm2.py ``Lfm2ShortConv.forward``: ``update_conv_state(B*x, layer_idx, conv_kernel_size=
    conv_L_cache)`` with ``B*x`` of ``[B, hidden_size, seq]``; cache_utils.py ``LinearAttentionLayer.
    lazy_initialization``: ``zeros((*conv_states.shape[:-1], conv_kernel_size))``, model dtype; no
    ``update_recurrent_state`` call, so ``recurrent_states`` stays None) keeps ``[B, hidden_size, conv_L_cache]``;
    an optimum-intel export's ``cache_params.past.conv.N`` variable is ``[?, hidden_size, conv_L_cache]`` too
    (read from the IR)."""
    return c.int("hidden_size", limits.MAX_WIDTH) * c.int("conv_L_cache", limits.MAX_HEAD_DIM), 0


def lfm2_intermediate(c: Config, size: int) -> int:
    """Lfm2MLP.__init__ (modeling_lfm2.py): with ``block_auto_adjust_ff_dim``, ``int(2·size/3)``, then with
    ``block_ffn_dim_multiplier`` that times it, rounded up to a multiple of ``block_multiple_of``."""
    if not c.get("block_auto_adjust_ff_dim"):
        return size
    size = int(2 * size / 3)
    multiplier = c.get("block_ffn_dim_multiplier")
    if multiplier is None:
        return size
    if not isinstance(multiplier, (int, float)) or isinstance(multiplier, bool) or multiplier <= 0:
        raise c.fail(f"block_ffn_dim_multiplier must be a positive number, got {multiplier!r}")
    step = c.int("block_multiple_of", limits.MAX_WIDTH)
    return step * -(-int(multiplier * size) // step)


FAMILIES = {
    "lfm2": Family({"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 12288,
                    "vocab_size": 65536, "tie_word_embeddings": True, "max_position_embeddings": 128000,
                    "conv_L_cache": 3, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0,
                    "block_auto_adjust_ff_dim": True, "full_attn_idxs": None},
                   types=lfm2_types, state=lfm2_conv, state_type="conv", intermediate=lfm2_intermediate,
                   aliases={"block_ff_dim": "intermediate_size", "tie_embedding": "tie_word_embeddings"},
                   short_conv=True, reads=("conv_bias", "block_norm_eps", "block_mlp_init_scale", "block_out_init_scale",
                                           "block_use_swiglu", "block_use_xavier_init", "block_dim", "block_ff_dim",
                                           "norm_eps", "block_ffn_dim_multiplier"),
                   source="transformers 5.23 configuration_lfm2.py, modeling_lfm2.py Lfm2ShortConv"),
}

"""Qwen3-Next and Qwen3.5 / Qwen3.6 (dense and MoE): Gated DeltaNet linear-attention layers and every
``full_attention_interval``-th layer full attention (transformers 5.23 ``Qwen3NextConfig`` /
``Qwen3_5TextConfig.__post_init__``); each linear layer keeps a conv and a recurrent state per sequence
(modeling_qwen3_next.py ``Qwen3NextGatedDeltaNet``; measured, docs/DESIGN.md §3c): conv
``[conv_dim = 2·Hk·dk + Hv·dv, kernel]``, recurrent ``[Hv, dk, dv]``, the recurrent one in f32 in transformers'
torch path (``mamba_ssm_dtype`` float32 in Qwen3.5's files says the same for vLLM)."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family, every


def gated_delta_net(c: Config) -> tuple[int, int]:
    """Qwen3-Next's Gated DeltaNet state per sequence (modeling_qwen3_next.py Qwen3NextGatedDeltaNet; measured,
    docs/DESIGN.md §3c): conv ``[conv_dim = 2·Hk·dk + Hv·dv, kernel]``, recurrent ``[Hv, dk, dv]``."""
    hk, hv = (c.int(k, limits.MAX_HEADS) for k in ("linear_num_key_heads", "linear_num_value_heads"))
    dk, dv, kernel = (c.int(k, limits.MAX_HEAD_DIM) for k in
                      ("linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"))
    return (2 * hk * dk + hv * dv) * kernel, hv * dk * dv


def _types(c: Config, n: int, window) -> list[str]:
    return every(c, "full_attention_interval", 4, "linear_attention", n)


_GDN = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "full_attention_interval": 4}
_READS = ("full_attention_interval", "attn_output_gate", "mamba_ssm_dtype", "mtp_num_hidden_layers",
          "mtp_use_dedicated_embeddings", "output_gate_type")
FAMILIES = {
    "qwen3_next": Family({"num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                          "intermediate_size": 5632, "vocab_size": 151936, "tie_word_embeddings": False,
                          "max_position_embeddings": 32768, "num_experts": 512, "num_experts_per_tok": 10,
                          "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                          "mlp_only_layers": None, "decoder_sparse_step": 1, **_GDN},
                         types=_types, state=gated_delta_net, reads=_READS,
                         source="transformers 5.23 configuration_qwen3_next.py, modeling_qwen3_next.py"),
    "qwen3_5_text": Family({"num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
                            "intermediate_size": 12288, "vocab_size": 248320, "tie_word_embeddings": False,
                            "max_position_embeddings": 32768, **_GDN},
                           types=_types, state=gated_delta_net, reads=_READS,
                           source="transformers 5.23 configuration_qwen3_5.py Qwen3_5TextConfig"),
    "qwen3_5_moe_text": Family({"num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                                "vocab_size": 248320, "tie_word_embeddings": False, "max_position_embeddings": 32768,
                                "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                                "num_experts_per_tok": 8, "num_experts": 256, **_GDN},
                               types=_types, state=gated_delta_net, reads=_READS,
                               source="transformers 5.23 configuration_qwen3_5_moe.py Qwen3_5MoeTextConfig"),
}

"""Qwen3-Next and Qwen3.5 / Qwen3.6 (dense and MoE): Gated DeltaNet linear-attention layers and every
``full_attention_interval``-th layer full attention (transformers 5.23 ``Qwen3NextConfig`` /
``Qwen3_5TextConfig.__post_init__``); each linear layer keeps a conv and a recurrent state per sequence
(modeling_qwen3_next.py ``Qwen3NextGatedDeltaNet``; measured, docs/DESIGN.md §3c): conv
``[conv_dim = 2·Hk·dk + Hv·dv, kernel]``, recurrent ``[Hv, dk, dv]``, the recurrent one in f32 in transformers'
torch path. vLLM keeps the recurrent state in ``mamba_ssm_cache_dtype``, "auto" by default: the conv's dtype,
the model's (mamba_utils.py ``MambaStateDtypeCalculator.gated_delta_net_state_dtype``). For Qwen3.5 / 3.6 vLLM
sets it from the config's ``mamba_ssm_dtype`` (vllm 0.33 model_executor/models/config.py
``Qwen3_5ForConditionalGenerationConfig.verify_and_update_config``, registered for every Qwen3_5 and Qwen3_5Moe
architecture): float32 in each shipped file, so 4 B where the model dtype gives 2. Qwen3-Next has no such hook
(no ``Qwen3Next*`` entry in ``MODELS_CONFIG_MAP``): its state stays in the model dtype."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family, every, ssm_dtype_from


def gated_delta_net(c: Config) -> tuple[int, int]:
    """Qwen3-Next's Gated DeltaNet state per sequence (modeling_qwen3_next.py Qwen3NextGatedDeltaNet; measured,
    docs/DESIGN.md §3c): conv ``[conv_dim = 2·Hk·dk + Hv·dv, kernel]``, recurrent ``[Hv, dk, dv]``."""
    hk, hv = (c.int(k, limits.MAX_HEADS) for k in ("linear_num_key_heads", "linear_num_value_heads"))
    dk, dv, kernel = (c.int(k, limits.MAX_HEAD_DIM) for k in
                      ("linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"))
    return (2 * hk * dk + hv * dv) * kernel, hv * dk * dv


def output_gate(c: Config) -> bool:
    """Every full-attention layer's q_proj yields the query and an output gate: transformers builds it so always
    (modeling_qwen3_next.py / modeling_qwen3_5.py ``q_proj``: heads x head_dim x 2), vLLM where
    ``getattr(config, "attn_output_gate", True)`` (qwen3_next.py ``Qwen3NextAttention``): a file that turns it
    off is one the two runtimes build differently, refused."""
    if c.get("attn_output_gate", True) is not True:
        raise c.fail(f"attn_output_gate {c.get('attn_output_gate')!r}: vLLM then builds no output gate, transformers "
                     "always one; simkv follows neither alone")
    return True


def _types(c: Config, n: int, window) -> list[str]:
    return every(c, "full_attention_interval", 4, "linear_attention", n)


_GDN = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "full_attention_interval": 4}
_READS = ("full_attention_interval", "attn_output_gate", "mamba_ssm_dtype", "mtp_num_hidden_layers",
          "mtp_use_dedicated_embeddings", "output_gate_type")
#: vLLM's Qwen3.5 hook: the recurrent state in the config's mamba_ssm_dtype (absent or "auto": the model dtype).
_QWEN3_5_SSM = ssm_dtype_from("mamba_ssm_dtype")
FAMILIES = {
    "qwen3_next": Family({"num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                          "intermediate_size": 5632, "vocab_size": 151936, "tie_word_embeddings": False,
                          "max_position_embeddings": 32768, "num_experts": 512, "num_experts_per_tok": 10,
                          "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                          "mlp_only_layers": None, "decoder_sparse_step": 1, **_GDN},
                         types=_types, state=gated_delta_net, reads=_READS, output_gate=output_gate,
                         source="transformers 5.23 configuration_qwen3_next.py, modeling_qwen3_next.py"),
    "qwen3_5_text": Family({"num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
                            "intermediate_size": 12288, "vocab_size": 248320, "tie_word_embeddings": False,
                            "max_position_embeddings": 32768, **_GDN},
                           types=_types, state=gated_delta_net, reads=_READS, output_gate=output_gate, ssm_dtype=_QWEN3_5_SSM,
                           source="transformers 5.23 configuration_qwen3_5.py Qwen3_5TextConfig; vLLM "
                                  "models/config.py Qwen3_5ForConditionalGenerationConfig"),
    "qwen3_5_moe_text": Family({"num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                                "vocab_size": 248320, "tie_word_embeddings": False, "max_position_embeddings": 32768,
                                "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                                "num_experts_per_tok": 8, "num_experts": 256, **_GDN},
                               types=_types, state=gated_delta_net, reads=_READS, output_gate=output_gate, ssm_dtype=_QWEN3_5_SSM,
                               source="transformers 5.23 configuration_qwen3_5_moe.py Qwen3_5MoeTextConfig; vLLM "
                                      "models/config.py Qwen3_5ForConditionalGenerationConfig"),
}

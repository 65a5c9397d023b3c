"""Tiny random-weight configs for the six architectures (transformers 5.23.0; LFM2 added after the
measurements of README.md here, validated by `experiments/hf_arch_validation.py`).

build(arch, dtype) -> (model, config). Sizes are chosen so that every cache tensor
has a distinctive byte size. Window/chunk = 4 so that short loops cross boundaries.
"""
import torch
import transformers as T

WINDOW = 4   # sliding_window (Gemma-3, gpt-oss) and attention_chunk_size (Llama-4)

COMMON = dict(vocab_size=96, attn_implementation="eager")


def gemma3():
    # 6 layers, default sliding_window_pattern=6 -> layers 0..4 sliding, layer 5 full
    return T.Gemma3TextConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        query_pre_attn_scalar=16, sliding_window=WINDOW, **COMMON), T.Gemma3ForCausalLM


def gpt_oss():
    # 4 layers, default layer_types alternate sliding/full (even idx sliding)
    return T.GptOssConfig(
        hidden_size=64, intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW, **COMMON), T.GptOssForCausalLM


def llama4():
    # 4 layers, no_rope_layer_interval=4 -> layers 0,1,2 chunked, layer 3 full (NoPE)
    return T.Llama4TextConfig(
        hidden_size=64, intermediate_size=32, intermediate_size_mlp=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_local_experts=4, num_experts_per_tok=1, attention_chunk_size=WINDOW, **COMMON), T.Llama4ForCausalLM


def qwen3_next():
    # 4 layers, full_attention_interval=4 -> layers 0,1,2 linear_attention, layer 3 full
    return T.Qwen3NextConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=12,
        linear_num_key_heads=2, linear_num_value_heads=4,
        moe_intermediate_size=32, shared_expert_intermediate_size=32,
        num_experts=4, num_experts_per_tok=2, **COMMON), T.Qwen3NextForCausalLM


def deepseek_v3():
    # 3 layers (layer 0 dense MLP, 1-2 MoE), MLA with kv_lora_rank=32, rope dim 8
    return T.DeepseekV3Config(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=48,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, **COMMON), T.DeepseekV3ForCausalLM


def lfm2():
    # 4 layers: conv, full, conv, full (LFM2 short conv: a conv state [B, 64, conv_L_cache 3], no recurrent state)
    return T.Lfm2Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3,
        layer_types=["conv", "full_attention", "conv", "full_attention"], **COMMON), T.Lfm2ForCausalLM


ARCHS = dict(gemma3=gemma3, gpt_oss=gpt_oss, llama4=llama4, qwen3_next=qwen3_next, deepseek_v3=deepseek_v3,
             lfm2=lfm2)


def build(arch, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cfg, cls = ARCHS[arch]()
    model = cls(cfg).to(dtype).eval()
    return model, cfg

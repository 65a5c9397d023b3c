"""Writes the shipped model configs: simkv/data/configs/<name>.json and simkv/data/configs/tiny/<arch>.json.

Each preset is built with transformers' own config class from the values of the model's published
``config.json`` on the Hugging Face hub (simkv/data/configs/SOURCES.md names the repository and where each
number was read), then written with ``to_json_file``, so the files have the real format (nested
``text_config``, ``layer_types`` as the config class derives them) without a download. A field not set
below is the config class's default in transformers 5.23 (and does not change simkv's numbers).
The tiny configs are the six architectures of experiments/hf_layer_kinds/tiny_models.py, same values.

Run from the repository root with transformers 5.23 installed (the ``transformers`` extra):

    python simkv/data/configs/make_configs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import transformers as T

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BF16 = "bfloat16"
#: Token ids are left out (null): simkv reads none, and the class defaults are another model's.
NO_IDS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)

#: Gemma-3 (google/gemma-3-{4b,27b}-it): the published text_config gives only what differs from
#: Gemma3TextConfig's defaults; sliding_window_pattern 6 and the vision tower are common to both.
GEMMA3_VISION = dict(model_type="siglip_vision_model", hidden_size=1152, image_size=896, intermediate_size=4304,
                     num_attention_heads=16, num_hidden_layers=27, patch_size=14, vision_use_head=False)
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_theta": 500_000.0}
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096, "rope_theta": 150_000.0}
QWEN3_ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0}


def gemma3(layers, hidden, intermediate, heads, kv_heads, head_dim, query_pre_attn_scalar):
    text = T.Gemma3TextConfig(
        num_hidden_layers=layers, hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, query_pre_attn_scalar=query_pre_attn_scalar,
        sliding_window=1024, sliding_window_pattern=6, vocab_size=262_208, max_position_embeddings=131_072,
        rope_parameters=GEMMA3_ROPE, dtype=BF16, **NO_IDS)
    return T.Gemma3Config(text_config=text, vision_config=GEMMA3_VISION, mm_tokens_per_image=256,
                          boi_token_index=255_999, eoi_token_index=256_000, image_token_index=262_144, dtype=BF16)


def gpt_oss(layers, experts):
    return T.GptOssConfig(
        num_hidden_layers=layers, num_local_experts=experts, num_experts_per_tok=4, hidden_size=2880,
        intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8, sliding_window=128,
        vocab_size=201_088, max_position_embeddings=131_072, tie_word_embeddings=False,
        rope_parameters=GPT_OSS_ROPE, dtype=BF16, **NO_IDS)


def llama31(layers, hidden, intermediate, heads):
    return T.LlamaConfig(
        num_hidden_layers=layers, hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
        num_key_value_heads=8, vocab_size=128_256, max_position_embeddings=131_072, rms_norm_eps=1e-5,
        tie_word_embeddings=False, rope_parameters=LLAMA31_ROPE, dtype=BF16, **NO_IDS)


def presets() -> dict:
    """name -> config object, each from the model's published config.json (SOURCES.md)."""
    return {
        "gemma-3-4b": gemma3(34, 2560, 10240, heads=8, kv_heads=4, head_dim=256, query_pre_attn_scalar=256),
        "gemma-3-27b": gemma3(62, 5376, 21504, heads=32, kv_heads=16, head_dim=128, query_pre_attn_scalar=168),
        "gpt-oss-20b": gpt_oss(24, 32),
        "gpt-oss-120b": gpt_oss(36, 128),
        "qwen3-8b": T.Qwen3Config(
            num_hidden_layers=36, hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, vocab_size=151_936, max_position_embeddings=40_960,
            sliding_window=None, use_sliding_window=False, max_window_layers=36, tie_word_embeddings=False,
            rope_parameters=QWEN3_ROPE, dtype=BF16, **NO_IDS),
        "qwen3-30b-a3b": T.Qwen3MoeConfig(
            num_hidden_layers=48, hidden_size=2048, intermediate_size=6144, num_attention_heads=32,
            num_key_value_heads=4, head_dim=128, vocab_size=151_936, max_position_embeddings=40_960,
            num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1,
            mlp_only_layers=[], norm_topk_prob=True, sliding_window=None, use_sliding_window=False,
            max_window_layers=48, tie_word_embeddings=False, rope_parameters=QWEN3_ROPE, dtype=BF16, **NO_IDS),
        "qwen3-next-80b-a3b": T.Qwen3NextConfig(
            num_hidden_layers=48, hidden_size=2048, intermediate_size=5120, num_attention_heads=16,
            num_key_value_heads=2, head_dim=256, vocab_size=151_936, max_position_embeddings=262_144,
            full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_num_key_heads=16, linear_num_value_heads=32, num_experts=512, num_experts_per_tok=10,
            moe_intermediate_size=512, shared_expert_intermediate_size=512, decoder_sparse_step=1, mlp_only_layers=[],
            norm_topk_prob=True, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
            dtype=BF16, **NO_IDS),
        "deepseek-v3": T.DeepseekV3Config(
            num_hidden_layers=61, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
            num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256,
            num_experts_per_tok=8, first_k_dense_replace=3, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
            qk_nope_head_dim=128, v_head_dim=128, n_group=8, topk_group=4, routed_scaling_factor=2.5,
            norm_topk_prob=True, vocab_size=129_280, max_position_embeddings=163_840, tie_word_embeddings=False,
            rope_parameters={"rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                             "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "rope_theta": 10_000.0},
            dtype=BF16, **NO_IDS),
        "llama-3.1-8b": llama31(32, 4096, 14336, heads=32),
        "llama-3.1-70b": llama31(80, 8192, 28672, heads=64),
        "llama-4-scout": T.Llama4Config(
            text_config=T.Llama4TextConfig(
                num_hidden_layers=48, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
                num_attention_heads=40, num_key_value_heads=8, head_dim=128, num_local_experts=16,
                num_experts_per_tok=1, interleave_moe_layer_step=1, attention_chunk_size=8192,
                no_rope_layer_interval=4, vocab_size=202_048, max_position_embeddings=10_485_760, use_qk_norm=True,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192, "rope_theta": 500_000.0},
                dtype=BF16, **NO_IDS),
            dtype=BF16),
        "mistral-small-3.1": T.Mistral3Config(
            text_config=T.MistralConfig(
                num_hidden_layers=40, hidden_size=5120, intermediate_size=32768, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=131_072, max_position_embeddings=131_072,
                sliding_window=None, rms_norm_eps=1e-5, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000_000.0}, dtype=BF16, **NO_IDS),
            vision_config=dict(model_type="pixtral", hidden_size=1024, image_size=1540, intermediate_size=4096,
                               num_attention_heads=16, num_hidden_layers=24, patch_size=14, head_dim=64,
                               rope_theta=10_000.0),
            image_token_index=10, spatial_merge_size=2, dtype=BF16),
        "phi-4": T.Phi3Config(
            num_hidden_layers=40, hidden_size=5120, intermediate_size=17920, num_attention_heads=40,
            num_key_value_heads=10, vocab_size=100_352, max_position_embeddings=16_384,
            original_max_position_embeddings=16_384, sliding_window=None, rms_norm_eps=1e-5,
            tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 250_000.0}, dtype=BF16, **NO_IDS),
    }


def tiny() -> dict:
    """arch -> config of experiments/hf_layer_kinds/tiny_models.py (the same function, so the same values)."""
    sys.path.insert(0, str(ROOT / "experiments" / "hf_layer_kinds"))
    import tiny_models

    return {arch: build()[0] for arch, build in tiny_models.ARCHS.items()}


def main() -> None:
    for name, config in presets().items():
        config.to_json_file(HERE / f"{name}.json")
    (HERE / "tiny").mkdir(exist_ok=True)
    for arch, config in tiny().items():
        config.to_json_file(HERE / "tiny" / f"{arch}.json")


if __name__ == "__main__":
    main()

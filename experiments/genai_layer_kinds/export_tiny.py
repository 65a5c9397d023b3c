"""Export tiny random-weight hybrid/SWA models with optimum-intel (side venv) for inspection. Research only."""
import sys, os, tempfile, time, traceback
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch, transformers
from optimum.exporters.openvino import main_export
OUT = sys.argv[1]
C = dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
         head_dim=32, max_position_embeddings=4096)
MODELS = {
  "gemma3": ("Gemma3TextConfig", dict(C, num_hidden_layers=6, sliding_window=64)),  # default pattern 5 local : 1 global
  "gptoss": ("GptOssConfig", dict(C, num_hidden_layers=4, sliding_window=64, num_local_experts=4, num_experts_per_tok=2,
                                   layer_types=["sliding_attention", "full_attention"] * 2)),
  "mistral": ("MistralConfig", dict(C, num_hidden_layers=2, sliding_window=64)),
  "qwen3": ("Qwen3Config", dict(C, num_hidden_layers=2)),  # uniform full attention (q/k norms)
  "qwen3next": ("Qwen3NextConfig", dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                 linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                 linear_conv_kernel_dim=4, full_attention_interval=4, num_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=64, shared_expert_intermediate_size=64, decoder_sparse_step=1)),
  "qwen3next8": ("Qwen3NextConfig", dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                 linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                 linear_conv_kernel_dim=4, full_attention_interval=4, num_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=64, shared_expert_intermediate_size=64, decoder_sparse_step=1)),
  "lfm2": ("Lfm2Config", dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, conv_L_cache=3,
            layer_types=["conv", "full_attention", "conv", "full_attention"])),
  "deepseekv3": ("DeepseekV3Config", dict(vocab_size=1000, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                  num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                  num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=16,
                  qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=4096)),
  # Need transformers >= 5 (>= 5.5 for GraniteMoeHybrid) and a newer optimum-intel: fail with 4.57.6.
  "gemma3n": ("Gemma3nTextConfig", dict(vocab_size=1000, vocab_size_per_layer_input=1000, hidden_size=128,
               hidden_size_per_layer_input=16, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, sliding_window=64, num_kv_shared_layers=2,
               layer_types=["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"],
               activation_sparsity_pattern=[0.0] * 6, max_position_embeddings=4096, laurel_rank=8, altup_num_inputs=4)),
  "granite": ("GraniteMoeHybridConfig", dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, num_local_experts=4,
               num_experts_per_tok=2, shared_intermediate_size=128, layer_types=["mamba", "attention", "mamba", "attention"],
               mamba_n_heads=8, mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2)),
}
for name in (sys.argv[2:] or MODELS):
    cls, kw = MODELS[name]
    dst = os.path.join(OUT, name)
    if os.path.exists(os.path.join(dst, "openvino_model.xml")):
        print(name, "kept"); continue
    t0 = time.time()
    try:
        cfg = getattr(transformers, cls)(**kw)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        with tempfile.TemporaryDirectory() as src:
            model.save_pretrained(src)
            main_export(src, output=dst, task="text-generation-with-past", stateful=True, weight_format="fp32",
                        library_name="transformers")
        print(name, "exported in", round(time.time() - t0), "s", flush=True)
    except Exception as e:
        print(name, "FAILED:", type(e).__name__, str(e)[:400], flush=True)

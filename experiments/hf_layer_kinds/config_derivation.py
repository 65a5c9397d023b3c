"""How config.layer_types is derived from the legacy/pattern fields, and what DynamicCache/StaticCache make of it.
Usage: python config_derivation.py"""
import torch, transformers as T

def show(label, cfg):
    lt = getattr(cfg, "layer_types", None)
    try:
        dc = [type(l).__name__.replace("Layer", "").replace("Dynamic", "D.") + (f"(w={l.sliding_window})" if hasattr(l, "sliding_window") else "")
              for l in T.DynamicCache(config=cfg).layers]
    except Exception as e:
        dc = f"ERROR {type(e).__name__}: {e}"
    try:
        sc = [f"{type(l).__name__.replace('Layer','')}" + (f"(max={l.max_cache_len})" if hasattr(l, 'max_cache_len') else "")
              for l in T.StaticCache(config=cfg, max_cache_len=10).layers]
    except Exception as e:
        sc = f"ERROR {type(e).__name__}: {e}"
    print(f"{label}\n   layer_types={lt}\n   Dynamic: {dc}\n   Static(10): {sc}")

small = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=96)
show("Gemma3TextConfig(num_hidden_layers=6, sliding_window=4) [default sliding_window_pattern=6]",
     T.Gemma3TextConfig(num_hidden_layers=6, sliding_window=4, **small))
show("Gemma3TextConfig(num_hidden_layers=6, sliding_window=4, sliding_window_pattern=3)",
     T.Gemma3TextConfig(num_hidden_layers=6, sliding_window=4, sliding_window_pattern=3, **small))
show("Gemma3TextConfig(num_hidden_layers=4, sliding_window=None)",
     T.Gemma3TextConfig(num_hidden_layers=4, sliding_window=None, **small))
show("GptOssConfig(num_hidden_layers=4, sliding_window=4)",
     T.GptOssConfig(num_hidden_layers=4, sliding_window=4, num_local_experts=4, num_experts_per_tok=2, **small))
show("Llama4TextConfig(num_hidden_layers=8, attention_chunk_size=4) [default no_rope_layer_interval=4]",
     T.Llama4TextConfig(num_hidden_layers=8, attention_chunk_size=4, num_local_experts=4, **small))
show("Llama4TextConfig(num_hidden_layers=4, attention_chunk_size=4, no_rope_layers=[1,0,1,0])",
     T.Llama4TextConfig(num_hidden_layers=4, attention_chunk_size=4, no_rope_layers=[1, 0, 1, 0], num_local_experts=4, **small))
show("Llama4TextConfig(num_hidden_layers=4, attention_chunk_size=None)",
     T.Llama4TextConfig(num_hidden_layers=4, attention_chunk_size=None, num_local_experts=4, **small))
show("Qwen3NextConfig(num_hidden_layers=8) [default full_attention_interval=4]",
     T.Qwen3NextConfig(num_hidden_layers=8, num_experts=4, **small))
show("Qwen3NextConfig(num_hidden_layers=4, full_attention_interval=2)",
     T.Qwen3NextConfig(num_hidden_layers=4, full_attention_interval=2, num_experts=4, **small))
show("DeepseekV3Config(num_hidden_layers=3) [no layer_types attribute]",
     T.DeepseekV3Config(num_hidden_layers=3, n_routed_experts=4, **small))

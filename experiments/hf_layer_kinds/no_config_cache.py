"""Pitfall check: DynamicCache() built WITHOUT config (layer_class_to_replicate=DynamicLayer).
What layer classes result, how much do sliding layers hold, and is the output still correct?
Usage: python no_config_cache.py"""
import torch, transformers as T
from tiny_models import build
torch.set_num_threads(1)
for arch in ["gemma3", "llama4", "qwen3_next"]:
    model, cfg = build(arch)
    ids = torch.randint(3, cfg.vocab_size, (1, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits[:, -1]
        cache = T.DynamicCache()
        try:
            model(ids[:, :6], past_key_values=cache, use_cache=True)
            for s in range(6, 13):
                model(ids[:, s:s + 1], past_key_values=cache, use_cache=True)
            out = model(ids[:, 13:14], past_key_values=cache, use_cache=True).logits[:, -1]
            print(arch, [type(l).__name__ for l in cache.layers], "K lens:",
                  [l.keys.shape[-2] if getattr(l, 'keys', None) is not None else None for l in cache.layers],
                  f"max|diff vs no-cache|={(out - ref).abs().max():.2e}")
        except Exception as e:
            print(arch, "ERROR", type(e).__name__, str(e)[:150])

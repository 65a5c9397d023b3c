"""Print config.layer_types and the cache layer class each gets in DynamicCache / StaticCache.
Usage: python layer_map.py"""
import torch, transformers as T
from tiny_models import ARCHS, build

for arch in ARCHS:
    model, cfg = build(arch)
    dc = T.DynamicCache(config=cfg)
    sc = T.StaticCache(config=cfg, max_cache_len=10)
    print(f"== {arch}: layer_types={getattr(cfg, 'layer_types', '<absent>')}")
    print("   sliding_window=", getattr(cfg, "sliding_window", None), " attention_chunk_size=", getattr(cfg, "attention_chunk_size", None))
    for i, (d, s) in enumerate(zip(dc.layers, sc.layers)):
        extra = ""
        if hasattr(d, "sliding_window"): extra += f" dyn.sliding_window={d.sliding_window}"
        if hasattr(s, "max_cache_len"): extra += f" static.max_cache_len={s.max_cache_len}"
        print(f"   L{i}: {type(d).__name__:28s} | {type(s).__name__:26s}{extra}")
    # what does the model build itself when past_key_values is None?
    out = model(torch.tensor([[1, 2, 3]]), use_cache=True)
    pkv = out.past_key_values
    print("   model-built cache:", type(pkv).__name__, [type(l).__name__ for l in pkv.layers])

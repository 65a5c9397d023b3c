"""Does StaticCache work for every layer kind? Compare per-step logits of a manual loop
(prefill P, then N single-token steps) with DynamicCache(config) vs StaticCache(config, max_cache_len)
and vs no cache (full recompute). Usage: python compare_static_dynamic.py [P N M]"""
import sys, torch, transformers as T
from tiny_models import build, ARCHS
torch.set_num_threads(1)
P, N, M = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (6, 8, 16)
for arch in ARCHS:
    model, cfg = build(arch)
    ids = torch.randint(3, cfg.vocab_size, (1, P + N), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits  # full recompute, no cache
        res = {}
        for name, cache in [("dynamic", T.DynamicCache(config=cfg)), ("static", T.StaticCache(config=cfg, max_cache_len=M))]:
            outs = [model(ids[:, :P], past_key_values=cache, use_cache=True).logits[:, -1]]
            for s in range(N - 1):
                outs.append(model(ids[:, P + s:P + s + 1], past_key_values=cache, use_cache=True).logits[:, -1])
            res[name] = torch.stack(outs, 1)
        want = ref[:, P - 1:P + N - 1]
        print(f"{arch:12s} max|dyn-nocache|={(res['dynamic']-want).abs().max():.2e}  "
              f"max|static-nocache|={(res['static']-want).abs().max():.2e}")

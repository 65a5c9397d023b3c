"""Trace KV/state allocations of a tiny HF model, step by step and layer by layer, with memray.

Every torch CPU tensor storage is one posix_memalign(numel*itemsize) and one free() (verified by
verify_allocator.py), so we track POSIX_MEMALIGN/FREE pairs. "Cache" allocations are those whose
Python stack contains transformers/cache_utils.py. Step/layer boundaries are marked by malloc'ing a
bytearray of a magic size from forward hooks (model.model pre/post, each decoder layer pre/post).

Usage:
  python trace_run.py ARCH [--dtype f32|bf16] [--cache dynamic|static|none] [--max-cache-len M]
                      [-P 6] [-N 12] [-B 1] [--reorder] [--generate] [--all-events STEP]

--cache none: pass no cache, model builds DynamicCache(config) itself (step 0) and we reuse it.
--generate  : run model.generate(max_new_tokens=N+1, do_sample=False) instead of a manual loop.
--reorder   : after the loop, call cache.reorder_cache(beam_idx) (B must be >= 2) as its own step.
--all-events S : also print every posix_memalign/free in step S (cache and non-cache), with source line.
"""
import argparse, linecache, os, re, sys, tempfile
import torch
import memray
import transformers as T
from tiny_models import build

torch.set_num_threads(1)
MAGIC = 3_000_000
AT = memray.AllocatorType

ap = argparse.ArgumentParser()
ap.add_argument("arch")
ap.add_argument("--dtype", default="f32")
ap.add_argument("--cache", default="dynamic", choices=["dynamic", "static", "none"])
ap.add_argument("--max-cache-len", type=int, default=24)
ap.add_argument("-P", type=int, default=6)
ap.add_argument("-N", type=int, default=12)
ap.add_argument("-B", type=int, default=1)
ap.add_argument("--reorder", action="store_true")
ap.add_argument("--generate", action="store_true")
ap.add_argument("--all-events", type=int, default=None)
ap.add_argument("--grep", default=None, help="regex filter on the source site for --all-events")
ap.add_argument("--quiet-layers", action="store_true", help="only print summary tables")
ap.add_argument("--layers", default=None, help="comma list of layer indices whose cache events are printed")
ap.add_argument("--steps", default=None, help="comma list of steps whose cache events are printed")
args = ap.parse_args()
dtype = dict(f32=torch.float32, bf16=torch.bfloat16)[args.dtype]

model, cfg = build(args.arch, dtype)
nL = cfg.num_hidden_layers
state = {"step": -1}


def marker(step, layer, kind):  # kind: 0 layer start, 1 layer end, 2 step start, 3 step end
    code = (step + 1) * 1000 + layer * 10 + kind
    b = bytearray(MAGIC + code)
    del b


def top_pre(mod, a, kw):
    state["step"] += 1
    marker(state["step"], 99, 2)


def top_post(mod, a, kw, out):
    marker(state["step"], 99, 3)


model.model.register_forward_pre_hook(top_pre, with_kwargs=True)
model.model.register_forward_hook(top_post, with_kwargs=True)
for i, layer in enumerate(model.model.layers):
    layer.register_forward_pre_hook(lambda m, a, i=i: marker(state["step"], i, 0))
    layer.register_forward_hook(lambda m, a, o, i=i: marker(state["step"], i, 1))


def tensors_of(layer):
    """(name, tensor) for every tensor a cache layer holds."""
    out = []
    for name in ("keys", "values", "cumulative_length", "_sliding_window_tensor"):
        t = getattr(layer, name, None)
        if isinstance(t, torch.Tensor):
            out.append((name, t))
    for name in ("conv_states", "recurrent_states"):
        d = getattr(layer, name, None)
        if isinstance(d, dict):
            for k, t in d.items():
                if isinstance(t, torch.Tensor):
                    out.append((f"{name}[{k}]", t))
    return out


def snapshot(cache):
    snap = []
    for li, layer in enumerate(cache.layers):
        ents = []
        for name, t in tensors_of(layer):
            st = t.untyped_storage()
            ents.append((name, tuple(t.shape), str(t.dtype).replace("torch.", ""), st.data_ptr(), st.nbytes(),
                         t.numel() * t.element_size()))
        snap.append((type(layer).__name__, ents))
    return snap


g = torch.Generator().manual_seed(1)
prompt = torch.randint(3, cfg.vocab_size, (args.B, args.P), generator=g)
dec_tokens = torch.randint(3, cfg.vocab_size, (args.B, args.N), generator=g)
snaps = []
path = os.path.join(tempfile.mkdtemp(), "trace.bin")

with torch.no_grad(), memray.Tracker(path, native_traces=False):
    marker(-1, 99, 2)  # step "-1" = cache construction
    if args.cache == "dynamic":
        cache = T.DynamicCache(config=cfg)
    elif args.cache == "static":
        cache = T.StaticCache(config=cfg, max_cache_len=args.max_cache_len)
    else:
        cache = None
    marker(-1, 99, 3)
    if args.generate:
        kw = dict(max_new_tokens=args.N + 1, min_new_tokens=args.N + 1, do_sample=False)
        if cache is not None:
            kw["past_key_values"] = cache
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), **kw)
        del out
    else:
        out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        del out
        marker(state["step"], 99, 4)
        snaps.append(snapshot(cache))
        for s in range(args.N):
            out = model(input_ids=dec_tokens[:, s:s + 1], past_key_values=cache, use_cache=True)
            del out
            marker(state["step"], 99, 4)
            snaps.append(snapshot(cache))
        if args.reorder:
            state["step"] += 1
            marker(state["step"], 99, 2)
            beam_idx = torch.arange(args.B - 1, -1, -1)
            cache.reorder_cache(beam_idx)
            del beam_idx
            marker(state["step"], 99, 3)
            marker(state["step"], 99, 4)
            snaps.append(snapshot(cache))

# ---------------------------------------------------------------- analysis
CU = "cache_utils.py"


def site(stack):
    """innermost frame inside transformers (or this script)."""
    for fn, file, line in stack:
        if "transformers" in file or file.endswith(("trace_run.py",)):
            short = file.split("transformers/")[-1]
            src = linecache.getline(file, line).strip()
            return f"{short}:{line} {fn}: {src[:70]}"
    fn, file, line = stack[0] if stack else ("?", "?", 0)
    return f"{file}:{line} {fn}"


def cache_site(stack):
    for fn, file, line in stack:
        if file.endswith(CU):
            src = linecache.getline(file, line).strip()
            return f"cu:{line} {fn}: {src[:60]}"
    return None


events = []   # (step, layer, 'alloc'|'free', size, addr, site, is_cache, alloc_ref)
live = {}     # addr -> (size, is_cache, step, layer, site)
cur = {"step": -1, "layer": None}
live_all = 0
live_cache = 0
step_stats = {}  # step -> dict(start_all, peak_all, start_cache, peak_cache, end_cache, end_all)
layer_end_cache = {}  # (step, layer) -> live cache bytes at layer end
layer_peak = {}  # (step, layer) -> [live_all at layer start, peak live_all within layer]


def st():
    return step_stats.setdefault(cur["step"], dict(start_all=live_all, peak_all=live_all, start_cache=live_cache,
                                                   peak_cache=live_cache, end_cache=None, end_all=None))


for rec in memray.FileReader(path).get_allocation_records():
    a = rec.allocator
    if a == AT.MALLOC and MAGIC <= rec.size - 1 < MAGIC + 200_000:
        code = rec.size - 1 - MAGIC
        step, rest = divmod(code, 1000)
        step -= 1
        layer, kind = divmod(rest, 10)
        cur["step"] = step
        if kind == 2:
            step_stats[step] = dict(start_all=live_all, peak_all=live_all, start_cache=live_cache,
                                    peak_cache=live_cache, end_cache=None, end_all=None)
            cur["layer"] = None
        elif kind == 3:  # end of model.model forward (lm_head/logits come after)
            s = st(); s["end_cache"] = live_cache; s["end_all"] = live_all
            cur["layer"] = "head"
        elif kind == 4:  # after `del out` in the manual loop: the true post-step state
            s = st(); s["end_cache"] = live_cache; s["end_all"] = live_all
            cur["layer"] = "post"
        elif kind == 0:
            cur["layer"] = layer
            layer_peak[(step, layer)] = [live_all, live_all]
        elif kind == 1:
            layer_end_cache[(step, layer)] = live_cache
            cur["layer"] = f"after{layer}"
        continue
    if a == AT.POSIX_MEMALIGN:
        stack = rec.stack_trace()
        cs = cache_site(stack)
        ssite = cs or site(stack)
        live[rec.address] = (rec.size, cs is not None, cur["step"], cur["layer"], ssite)
        live_all += rec.size
        if cs:
            live_cache += rec.size
        events.append((cur["step"], cur["layer"], "alloc", rec.size, rec.address, ssite, cs is not None, None))
    elif a == AT.FREE and rec.address in live:
        size, is_cache, s0, l0, ssite = live.pop(rec.address)
        live_all -= size
        if is_cache:
            live_cache -= size
        events.append((cur["step"], cur["layer"], "free", size, rec.address, ssite, is_cache, (s0, l0)))
    else:
        continue
    s = st()
    if isinstance(cur["layer"], int) and (cur["step"], cur["layer"]) in layer_peak:
        lp = layer_peak[(cur["step"], cur["layer"])]
        lp[1] = max(lp[1], live_all)
    s["peak_all"] = max(s["peak_all"], live_all)
    s["peak_cache"] = max(s["peak_cache"], live_cache)

# --------------------------------------------------------------- report
print(f"# arch={args.arch} dtype={args.dtype} cache={args.cache} P={args.P} N={args.N} B={args.B}"
      f" max_cache_len={args.max_cache_len if args.cache == 'static' else '-'} generate={args.generate}")
print(f"# layer_types={getattr(cfg, 'layer_types', None)}")
steps = sorted(step_stats)


def fmt_layer(l):
    return "init" if l is None else (f"L{l}" if isinstance(l, int) else str(l))


if not args.quiet_layers:
    print("\n## cache events (allocs/frees of storages allocated in cache_utils.py), in order")
    for s in steps:
        if args.steps and str(s) not in args.steps.split(","):
            continue
        lay = None if not args.layers else [int(x) for x in args.layers.split(",")]
        evs = [e for e in events if e[0] == s and e[6] and (lay is None or not isinstance(e[1], int) or e[1] in lay)]
        name = {-1: "cache ctor"}.get(s, "prefill" if s == 0 else ("decode" if s <= args.N else "reorder"))
        print(f"-- step {s} ({name}): live cache after = {step_stats[s]['end_cache']} B;"
              f" peak cache in step = {step_stats[s]['peak_cache']} B")
        for (es, el, kind, size, addr, ssite, _, ref) in evs:
            if kind == "alloc":
                print(f"   {fmt_layer(el):>7}  +{size:<6} {ssite}")
            else:
                print(f"   {fmt_layer(el):>7}  -{size:<6} (alloc'd step {ref[0]} {fmt_layer(ref[1])}: {ssite[:40]})")

# per-step per-layer summary from snapshots
if snaps:
    print("\n## cache contents after each step (from the cache object): layer: name shape dtype [storage bytes]")
    for s, snap in enumerate(snaps):
        if s not in (0, 1, 2, 3, 4, 5) and s < len(snaps) - 2:
            continue
        print(f"-- after step {s}")
        for li, (cls, ents) in enumerate(snap):
            parts = []
            for (n, shp, dt, ptr, sb, tb) in ents:
                if n in ("cumulative_length", "_sliding_window_tensor"):
                    continue
                view = "" if sb == tb else f" VIEW(tensor {tb}B of storage)"
                parts.append(f"{n}{list(shp)} {dt} [{sb}B{view}]")
            print(f"   L{li} {cls}: " + "; ".join(parts))
    print("\n## live storage bytes held by the cache after each step, per layer (unique storages incl. small int64 counters)")
    print("step " + " ".join(f"{'L%d' % i:>7}" for i in range(nL)) + "    total  memray_live_cache")
    for s, snap in enumerate(snaps):
        row = []
        tot = 0
        seen = set()
        for cls, ents in snap:
            b = 0
            for (n, shp, dt, ptr, sb, tb) in ents:
                if ptr not in seen and ptr != 0:
                    seen.add(ptr)
                    b += sb
            row.append(b)
            tot += b
        print(f"{s:>4} " + " ".join(f"{b:>7}" for b in row) + f" {tot:>8}  {step_stats[s]['end_cache']}")

print("\n## per step: heap (all torch storages) start/peak/end and cache-attributed live bytes start/peak/end")
print(" step   all_start  all_peak  all_end | cache_start cache_peak cache_end")
for s in steps:
    d = step_stats[s]
    print(f"{s:>5} {d['start_all']:>11} {d['peak_all']:>9} {d['end_all']!s:>8} | {d['start_cache']:>11} {d['peak_cache']:>10} {d['end_cache']!s:>9}")

print("\n## in-layer transient: peak(all live torch storages during layer i) - live at layer i start, per step")
print("step " + " ".join(f"{'L%d' % i:>7}" for i in range(nL)))
for s_ in steps:
    if s_ < 0:
        continue
    print(f"{s_:>4} " + " ".join(f"{layer_peak[(s_, i)][1] - layer_peak[(s_, i)][0]:>7}" if (s_, i) in layer_peak else f"{'-':>7}" for i in range(nL)))

if args.all_events is not None:
    print(f"\n## ALL posix_memalign/free events in step {args.all_events}")
    for (es, el, kind, size, addr, ssite, isc, ref) in events:
        if es != args.all_events:
            continue
        if args.grep and not re.search(args.grep, ssite):
            continue
        tag = "C" if isc else " "
        if kind == "alloc":
            print(f"  {fmt_layer(el):>7} {tag} +{size:<7} {ssite}")
        else:
            print(f"  {fmt_layer(el):>7} {tag} -{size:<7} (from step {ref[0]} {fmt_layer(ref[1])}) {ssite[:60]}")

print("\n## non-cache torch storages still live at the end of the run (grouped by allocation site)")
from collections import Counter
left = Counter()
for addr, (size, is_cache, s0, l0, ssite) in live.items():
    if not is_cache:
        left[(ssite, s0, str(l0))] += size
for (ssite, s0, l0), b in sorted(left.items(), key=lambda x: -x[1])[:8]:
    print(f"  {b:>9} B  step {s0} {l0}: {ssite}")

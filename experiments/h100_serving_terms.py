"""Measure on one H100 the numbers the h100-sxm preset's serving terms use (run where a CUDA GPU and torch are):

* the memory CUDA reports (``torch.cuda.get_device_properties(0).total_memory``, ``mem_get_info``): what vLLM's
  ``gpu_memory_utilization`` multiplies (``Worker.determine_available_memory``: ``requested_memory = total x util``);
* GEMM throughput per weight format at the layer shapes of the measured rows (Qwen3-32B, Llama-3.1-70B at TP 2/4/8;
  bf16 ``torch.matmul``, fp8 e4m3 W8A8 ``torch._scaled_mm`` with per-tensor scales), tokens 8 … 8192;
* prefill attention (``scaled_dot_product_attention``, causal, bf16, GQA) at 1k–8k tokens: its achieved FLOP/s;
* decode attention (one query per sequence over 1k–8k cached tokens, batches 8–64): its achieved bytes/s.

    python3 experiments/h100_serving_terms.py OUT.json             # single kernels, timed one by one
    python3 experiments/h100_serving_terms.py OUT.json --graphs    # in CUDA graphs, as a serving step runs them

CUDA events, median of 20 timed runs after 5 warm-ups; one process, nothing else on the GPU. No timing is asserted.
The results are kept in experiments/data/h100_serving_terms.json (the run that the preset cites).
"""

from __future__ import annotations

import json
import sys
import time


def _timed(fn, reps: int = 20, warm: int = 5) -> float:
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000)
    times.sort()
    return times[len(times) // 2]


#: (model, tp) → per-layer GEMMs (name, N out, K in): q/k/v fused, o, gate+up fused, down.
LAYERS = {}
for name, hidden, heads, kv, d, inter in (("qwen3-32b", 5120, 64, 8, 128, 25600), ("llama-3.1-70b", 8192, 64, 8, 128, 28672)):
    for tp in (2, 4, 8):
        LAYERS[f"{name}/tp{tp}"] = [("qkv", (heads + 2 * kv) * d // tp, hidden), ("o", hidden, heads * d // tp),
                                     ("gate_up", 2 * inter // tp, hidden), ("down", hidden, inter // tp)]


def gemms(out: dict) -> None:
    import torch

    dev = "cuda"
    rows = []
    for key, mats in LAYERS.items():
        for m in (8, 64, 256, 1024, 4096, 8192):
            for name, n, k in mats:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
                t_bf16 = _timed(lambda: torch.matmul(x, w.t()))
                x8 = x.to(torch.float8_e4m3fn)
                w8 = w.to(torch.float8_e4m3fn)
                one = torch.ones((), device=dev, dtype=torch.float32)
                t_fp8 = _timed(lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
                flops = 2.0 * m * n * k
                rows.append({"layers": key, "gemm": name, "m": m, "n": n, "k": k, "bf16_s": t_bf16, "fp8_s": t_fp8,
                             "bf16_tflops": flops / t_bf16 / 1e12, "fp8_tflops": flops / t_fp8 / 1e12,
                             "bf16_weight_gbs": n * k * 2 / t_bf16 / 1e9, "fp8_weight_gbs": n * k / t_fp8 / 1e9})
                del x, w, x8, w8
    out["gemm"] = rows


def attention(out: dict) -> None:
    import torch
    import torch.nn.functional as F

    rows = []
    for heads, kv in ((32, 4), (16, 2), (8, 1)):  # 64/8 heads at TP 2, 4, 8
        for s in (1024, 4096, 8192):
            q = torch.randn(1, heads, s, 128, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(1, kv, s, 128, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(1, kv, s, 128, device="cuda", dtype=torch.bfloat16)
            t = _timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
            pairs = s * (s + 1) / 2
            flops = 4.0 * heads * 128 * pairs
            rows.append({"kind": "prefill", "heads": heads, "kv_heads": kv, "tokens": s, "s": t,
                         "tflops": flops / t / 1e12})
    for heads, kv in ((32, 4), (8, 1)):
        for b in (8, 64):
            for ctx in (1024, 8192):
                q = torch.randn(b, heads, 1, 128, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, kv, ctx, 128, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, kv, ctx, 128, device="cuda", dtype=torch.bfloat16)
                t = _timed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
                nbytes = 2.0 * b * kv * ctx * 128 * 2
                rows.append({"kind": "decode", "heads": heads, "kv_heads": kv, "batch": b, "context": ctx, "s": t,
                             "kv_gbs": nbytes / t / 1e9})
    out["attention"] = rows


def _graphed(build, reps: int = 10) -> float:
    """Seconds of one replay of the CUDA graph ``build()`` records (median of ``reps`` after warm-ups): device time
    without the host's launch cost, as a CUDA-graph serving step runs its kernels."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        build()  # (warm-up: lazy init, autotuning outside the capture)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        build()
    return _timed(g.replay, reps=reps, warm=3)


def graphed_gemms(out: dict, copies: int = 16) -> None:
    """The layers' four GEMMs at decode-sized token counts, ``copies`` layers of distinct weights in one CUDA graph
    (no weight stays in the 50 MB L2 from one layer to the next): seconds per layer and the weights' bytes/s."""
    import torch

    rows = []
    for key in ("qwen3-32b/tp2", "qwen3-32b/tp8", "llama-3.1-70b/tp2", "llama-3.1-70b/tp4", "llama-3.1-70b/tp8"):
        mats = LAYERS[key]
        for dtype in ("bf16", "fp8"):
            ws = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _, n, k in mats] for _ in range(copies)]
            if dtype == "fp8":
                ws = [[w.to(torch.float8_e4m3fn) for w in layer] for layer in ws]
            one = torch.ones((), device="cuda", dtype=torch.float32)
            nbytes = sum(n * k for _, n, k in mats) * (2 if dtype == "bf16" else 1)
            for m in (1, 8, 32, 64, 128, 256, 512):
                xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, n, k in mats]
                x8 = [x.to(torch.float8_e4m3fn) for x in xs]

                def build():
                    for layer in ws:
                        for x, xq, w in zip(xs, x8, layer):
                            if dtype == "bf16":
                                torch.matmul(x, w.t())
                            else:
                                torch._scaled_mm(xq, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

                t = _graphed(build) / copies
                rows.append({"layers": key, "dtype": dtype, "m": m, "layer_s": t, "weight_bytes": nbytes,
                             "weight_gbs": nbytes / t / 1e9, "gemms": len(mats)})
            del ws
            torch.cuda.empty_cache()
    out["graphed_gemm"] = rows


def graphed_attention(out: dict, copies: int = 16) -> None:
    """Decode attention (one query per sequence) in a CUDA graph over ``copies`` layers of distinct caches:
    seconds per layer, and the KV bytes read per second."""
    import torch
    import torch.nn.functional as F

    rows = []
    for heads, kv in ((32, 4), (8, 1)):
        for b in (1, 8, 64):
            for ctx in (1024, 4096, 8192):
                q = torch.randn(b, heads, 1, 128, device="cuda", dtype=torch.bfloat16)
                ks = [torch.randn(b, kv, ctx, 128, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                vs = [torch.randn(b, kv, ctx, 128, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]

                def build():
                    for k, v in zip(ks, vs):
                        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

                t = _graphed(build) / copies
                nbytes = 2.0 * b * kv * ctx * 128 * 2
                rows.append({"heads": heads, "kv_heads": kv, "batch": b, "context": ctx, "layer_s": t,
                             "kv_bytes": nbytes, "kv_gbs": nbytes / t / 1e9})
                del ks, vs
                torch.cuda.empty_cache()
    out["graphed_attention"] = rows


def step_floor(out: dict) -> None:
    """A CUDA-graph step's fixed cost: replaying a graph of one tiny kernel and copying 64 sampled ids to the host
    (what a decode step does besides its kernels' work, vLLM's ``execute_model`` ... ``.tolist()``)."""
    import torch

    x = torch.zeros(64, device="cuda", dtype=torch.int64)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1)
    for _ in range(20):
        g.replay()
        x.tolist()
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        g.replay()
        x.tolist()
        times.append(time.perf_counter() - t0)
    times.sort()
    out["step_floor_s"] = times[len(times) // 2]


def main(path: str) -> None:
    import torch

    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    out = {"device": props.name, "torch": torch.__version__, "total_memory": props.total_memory,
           "mem_get_info": [free, total], "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if "--graphs" in sys.argv:
        graphed_gemms(out)
        graphed_attention(out)
        step_floor(out)
    else:
        gemms(out)
        attention(out)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k not in ("gemm", "attention")}))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(args[0] if args else "h100_serving_terms.json")

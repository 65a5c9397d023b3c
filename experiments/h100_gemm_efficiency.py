"""Measure on one H100 how the achieved fraction of peak of a GEMM depends on its token count M (and its N, K).

Why: a roofline prices an MoE expert GEMM that gets tens of tokens as if it ran at the device's large-GEMM
efficiency, but a GEMM with M rows fills only part of one output tile (vLLM's fused_moe / CUTLASS tiles are 64-128
rows) and pays its tile loop's fixed latency. This script times, on the GPU, the GEMMs the measured serving rows run:

* MoE expert GEMMs: gpt-oss-120b (hidden 2880, expert intermediate 2880) split over the MoE TP group (2/4/8), and
  MiniMax-M2.5 (hidden 3072, expert intermediate 1536) whole (expert parallel over 4: each GPU holds whole
  experts), gate+up fused (N = 2 x intermediate / tp, K = hidden) and down (N = hidden, K = intermediate / tp);
* dense layer GEMMs for comparison: Qwen3-32B (TP 1/2/4/8) and Llama-3.1-70B (TP 2/4/8) gate+up and down;
* M = 1 … 512 for the experts (tokens per expert), 1 … 8192 for the dense ones;
* bf16 ``torch.matmul`` (what gpt-oss's mxfp4 experts multiply in: weight-only Marlin / Triton, bf16 math) and fp8
  e4m3 W8A8 ``torch._scaled_mm`` with per-tensor scales (MiniMax-M2.5's fp8 experts run fp8 tensor cores; M is
  padded to a multiple of 16 there, which ``_scaled_mm`` requires: the column ``m_run`` says what ran).

Each point: ``n_mats`` GEMMs of that shape with distinct weights (so no weight stays in the 50 MB L2, as in a layer
walk over experts) captured in one CUDA graph, replayed; time per GEMM = median replay time / n_mats (CUDA events,
median of 10 replays after 3 warm-ups). Fraction of peak = 2·M·N·K / time / datasheet dense peak (bf16 989.4
TFLOP/s, fp8 1978.9 TFLOP/s). No timing is asserted.

    python3 experiments/h100_gemm_efficiency.py OUT.csv

The run the h100-sxm preset cites is kept in experiments/data/h100_gemm_efficiency.csv.
"""

from __future__ import annotations

import csv
import sys

PEAK = {"bf16": 9.894e14, "fp8": 1.9789e15}

#: (family, name, N out, K in) per shape; family "moe" gets M = 1..512, "dense" M = 1..8192.
SHAPES: list[tuple[str, str, int, int]] = []
for tp in (2, 4, 8):
    SHAPES += [("moe", f"gpt-oss-120b/tp{tp}/gate_up", 2 * 2880 // tp, 2880), ("moe", f"gpt-oss-120b/tp{tp}/down", 2880, 2880 // tp)]
SHAPES += [("moe", "minimax-m2.5/ep4/gate_up", 2 * 1536, 3072), ("moe", "minimax-m2.5/ep4/down", 3072, 1536)]
for tp in (1, 2, 4, 8):
    SHAPES += [("dense", f"qwen3-32b/tp{tp}/gate_up", 2 * 25600 // tp, 5120), ("dense", f"qwen3-32b/tp{tp}/down", 5120, 25600 // tp)]
for tp in (2, 4, 8):
    SHAPES += [("dense", f"llama-3.1-70b/tp{tp}/gate_up", 2 * 28672 // tp, 8192), ("dense", f"llama-3.1-70b/tp{tp}/down", 8192, 28672 // tp)]
SHAPES += [("dense", "square/8192", 8192, 8192)]

M_MOE = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
M_DENSE = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def _replay_time(graph, reps: int = 10, warm: int = 3) -> float:
    import torch

    for _ in range(warm):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000)
    times.sort()
    return times[len(times) // 2]


def write_rows(rows: list[dict], out_path: str) -> None:
    """The rows as a CSV with the first row's keys as its header."""
    with open(out_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _graph_time(fn) -> float:
    """Seconds of one replay of ``fn`` captured in a CUDA graph (median): its kernels run once first (autotuning,
    lazy init) outside the capture, then once on a side stream, as capture requires."""
    import torch

    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _replay_time(graph)


def _point(dtype: str, m: int, n: int, k: int, weights: list, xs: dict) -> tuple[float, int]:
    """Seconds per GEMM of ``m`` tokens against each of ``weights`` (one CUDA graph), and the M that ran."""
    import torch

    m_run = m if dtype == "bf16" else -(-m // 16) * 16
    if (m_run, k, dtype) not in xs:
        x = torch.randn(m_run, k, device="cuda", dtype=torch.bfloat16)
        xs[(m_run, k, dtype)] = x if dtype == "bf16" else x.to(torch.float8_e4m3fn)
    x = xs[(m_run, k, dtype)]
    one = torch.ones((), device="cuda", dtype=torch.float32)
    if dtype == "bf16":
        def body():
            for w in weights:
                torch.matmul(x, w.t())
    else:
        def body():
            for w in weights:
                torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return _graph_time(body) / len(weights), m_run


def main(out_path: str) -> None:
    import torch

    props = torch.cuda.get_device_properties(0)
    device = f"{props.name} ({props.multi_processor_count} SMs)"
    rows = []
    weights: dict = {}  # the current shape's distinct weight matrices (one shape at a time on the GPU)
    inputs: dict = {}  # activations by (M, K, dtype)
    for family, name, n, k in SHAPES:
        for dtype in ("bf16", "fp8"):
            ms = M_MOE if family == "moe" else M_DENSE
            for m in ms:
                # enough distinct weights that the set outgrows L2, few enough that the big GEMMs stay quick
                n_mats = 16 if m <= 512 else 4
                key = (n, k, dtype, n_mats)
                if key not in weights:
                    weights.clear()
                    torch.cuda.empty_cache()
                    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(n_mats)]
                    weights[key] = ws if dtype == "bf16" else [w.to(torch.float8_e4m3fn) for w in ws]
                try:
                    t, m_run = _point(dtype, m, n, k, weights[key], inputs)
                except Exception as exc:  # a kernel this torch lacks: the row says so
                    print(f"{name} {dtype} M={m}: {type(exc).__name__}: {exc}", flush=True)
                    continue
                flops = 2 * m * n * k
                wbytes = n * k * (2 if dtype == "bf16" else 1)
                rows.append({
                    "device": device, "torch": torch.__version__, "cuda": torch.version.cuda, "family": family,
                    "shape": name, "dtype": dtype, "m": m, "m_run": m_run, "n": n, "k": k, "n_mats": n_mats,
                    "time_us": round(t * 1e6, 3), "tflops": round(flops / t / 1e12, 2),
                    "frac_peak": round(flops / t / PEAK[dtype], 4), "weight_tbps": round(wbytes / t / 1e12, 3),
                })
                print(rows[-1]["shape"], dtype, m, rows[-1]["time_us"], rows[-1]["frac_peak"], flush=True)
    write_rows(rows, out_path)


if __name__ == "__main__":
    main(sys.argv[1])

"""Time on one H100 the expert GEMMs of one MoE layer as ONE grouped kernel (``torch._grouped_mm``: every expert's
tiles in one launch, as vLLM's fused MoE kernels run them), for T tokens routed evenly: each of the device's G
experts gets M = T·k/E rows. Shapes as experiments/h100_gemm_efficiency.py (gpt-oss-120b's experts split over TP
2/4/8, MiniMax-M2.5's 64 whole experts per device under EP 4). bf16 ``_grouped_mm``; fp8 rowwise
``_scaled_grouped_mm`` where this torch has it. CUDA graph of one call, median of 10 replays after 3 warm-ups;
fraction of peak = 2·ΣM·N·K / time / datasheet dense peak. No timing is asserted.

    python3 experiments/h100_grouped_gemm.py OUT.csv

The run cited in the docs is kept in experiments/data/h100_grouped_gemm.csv.
"""

from __future__ import annotations

import sys

from h100_gemm_efficiency import _graph_time, write_rows  # (the script's own folder is on sys.path)

PEAK = {"bf16": 9.894e14, "fp8": 1.9789e15}

#: (name, experts on the device G, N out, K in)
SHAPES = []
for tp in (2, 4, 8):
    SHAPES += [(f"gpt-oss-120b/tp{tp}/gate_up", 128, 2 * 2880 // tp, 2880), (f"gpt-oss-120b/tp{tp}/down", 128, 2880, 2880 // tp)]
SHAPES += [("minimax-m2.5/ep4/gate_up", 64, 2 * 1536, 3072), ("minimax-m2.5/ep4/down", 64, 3072, 1536)]
M_PER_EXPERT = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def main(out_path: str) -> None:
    import torch

    props = torch.cuda.get_device_properties(0)
    device = f"{props.name} ({props.multi_processor_count} SMs)"
    rows = []
    for name, g, n, k in SHAPES:
        w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
        w8 = w.to(torch.float8_e4m3fn)
        scale_b = torch.ones(g, n, device="cuda", dtype=torch.float32)
        for m in M_PER_EXPERT:
            x = torch.randn(g * m, k, device="cuda", dtype=torch.bfloat16)
            offs = torch.arange(1, g + 1, device="cuda", dtype=torch.int32) * m
            x8 = x.to(torch.float8_e4m3fn)
            scale_a = torch.ones(g * m, device="cuda", dtype=torch.float32)
            calls = {
                "bf16": lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16),
                "fp8": lambda: torch._scaled_grouped_mm(x8, w8.transpose(-2, -1), scale_a, scale_b, offs=offs,
                                                        out_dtype=torch.bfloat16),
            }
            for dtype, fn in calls.items():
                try:
                    t = _graph_time(fn)
                except Exception as exc:  # a kernel this torch or shape lacks: the log says so
                    print(f"{name} {dtype} M={m}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                    continue
                flops = 2 * g * m * n * k
                wbytes = g * n * k * (2 if dtype == "bf16" else 1)
                rows.append({"device": device, "torch": torch.__version__, "cuda": torch.version.cuda, "shape": name,
                             "dtype": dtype, "experts": g, "m_per_expert": m, "n": n, "k": k,
                             "time_us": round(t * 1e6, 3), "tflops": round(flops / t / 1e12, 2),
                             "frac_peak": round(flops / t / PEAK[dtype], 4),
                             "weight_tbps": round(wbytes / t / 1e12, 3)})
                print(name, dtype, m, rows[-1]["time_us"], rows[-1]["frac_peak"], rows[-1]["weight_tbps"], flush=True)
        del w, w8
        torch.cuda.empty_cache()
    write_rows(rows, out_path)


if __name__ == "__main__":
    main(sys.argv[1])

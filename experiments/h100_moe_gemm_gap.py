"""What the measured H100 GEMM times (experiments/data/h100_gemm_efficiency.csv, h100_grouped_gemm.csv) say about the MoE prefill steps of
the silicon rows, beside what the h100-sxm preset's roofline prices for the same expert GEMMs. Reads only that table
and the preset; no serving measurement.

For a prefill step of T tokens, each MoE layer runs, on one device, the experts its tokens touch
(``simkv.cost.expected_experts``: E·(1 − (1 − k/E)^T), of the device's share of them under expert parallelism), each
with M = T·k / touched tokens (rounded to the nearest measured M, log-interpolated), gate+up then down:

* measured: touched × (t_gate_up(M) + t_down(M)), each GEMM timed alone in a CUDA graph (one kernel per expert: an
  upper bound of a grouped kernel that runs every expert's tiles in one launch, which this table cannot time);
* grouped: one ``torch._grouped_mm`` (bf16; fp8 rowwise ``_scaled_grouped_mm`` for MiniMax) of all the device's
  experts with M rows each, gate+up then down (experiments/h100_grouped_gemm.py): one launch, as vLLM's fused MoE
  kernels run; bf16 weights, so where it is memory-bound it reads 3.8x the bytes of gpt-oss's mxfp4 experts;
* roofline: max(expert weights read / (bandwidth · η_bw), expert FLOPs / (peak · η_flops)), the preset's terms.

    python3 experiments/h100_moe_gemm_gap.py
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from simkv.cost import expected_experts, get_device

TABLE = Path(__file__).parent / "data" / "h100_gemm_efficiency.csv"
GROUPED = Path(__file__).parent / "data" / "h100_grouped_gemm.csv"

#: (label, shape prefix in the table, dtype the experts multiply in, experts E, per token k, hidden, expert
#: intermediate, TP split of the expert intermediate, EP groups, MoE layers, weight bytes per parameter as stored)
CASES = [
    ("gpt-oss-120b tp2", "gpt-oss-120b/tp2", "bf16", 128, 4, 2880, 2880, 2, 1, 36, 4.25 / 8),
    ("gpt-oss-120b tp4", "gpt-oss-120b/tp4", "bf16", 128, 4, 2880, 2880, 4, 1, 36, 4.25 / 8),
    ("gpt-oss-120b tp8", "gpt-oss-120b/tp8", "bf16", 128, 4, 2880, 2880, 8, 1, 36, 4.25 / 8),
    ("MiniMax-M2.5 ep4", "minimax-m2.5/ep4", "fp8", 256, 8, 3072, 1536, 1, 4, 62, 1.0),
]


def _times(prefix: str, dtype: str, table: Path = TABLE, m_column: str = "m") -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    with table.open() as fh:
        for row in csv.DictReader(fh):
            if row["shape"].startswith(prefix + "/") and row["dtype"] == dtype:
                out.setdefault(row["shape"].rsplit("/", 1)[1], []).append((int(row[m_column]), float(row["time_us"]) * 1e-6))
    return out


def _at(points: list[tuple[int, float]], m: float) -> float:
    """Time at M, linear in log M between the measured points (M beyond 512: the last point scaled by M)."""
    points = sorted(points)
    if m >= points[-1][0]:
        return points[-1][1] * m / points[-1][0]
    for (m0, t0), (m1, t1) in zip(points, points[1:]):
        if m0 <= m <= m1:
            f = (math.log(m) - math.log(m0)) / (math.log(m1) - math.log(m0))
            return t0 + f * (t1 - t0)
    return points[0][1]


def main() -> None:
    dev = get_device("h100-sxm")
    bw = dev.memory_bandwidth * dev.bandwidth_efficiency
    print(f"{'case':18} {'T':>5} {'touched':>7} {'M':>6} {'one-by-one ms':>13} {'grouped ms':>10} {'roofline ms':>11} {'grouped-roofline ms':>19}")
    for label, prefix, dtype, e, k, hidden, inter, tp, ep, layers, wbytes in CASES:
        times = _times(prefix, dtype)
        grouped = _times(prefix, dtype, GROUPED, "m_per_expert")
        for tokens in (1024, 4096, 8192):
            touched = float(expected_experts(e, k, tokens)) / ep
            m = tokens * k / (touched * ep)
            measured = layers * touched * (_at(times["gate_up"], m) + _at(times["down"], m))
            group = layers * (_at(grouped["gate_up"], m) + _at(grouped["down"], m))
            params = 3 * hidden * inter / tp  # gate, up and down of one expert on this device
            flops = 2 * params * tokens * k / ep
            roof = layers * max(touched * params * wbytes / bw, flops / (dev.peak(dtype if dtype == "bf16" else "f8")
                                                                       * dev.flops_efficiency))
            print(f"{label:18} {tokens:5d} {touched:7.1f} {m:6.1f} {measured * 1e3:13.1f} {group * 1e3:10.1f} "
                  f"{roof * 1e3:11.1f} {(group - roof) * 1e3:19.1f}")


if __name__ == "__main__":
    main()

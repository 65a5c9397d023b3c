"""Serving speed: the Azure conversation trace (19,366 requests, 1 h) through GenAI continuous batching on a
paged pool, llama-2-7b, every layer's pool tensors in the ledger — at 1/4, 1/2 and all of the trace.

    PYTHONPATH=. python experiments/bench_serving.py [--device h100-sxm] [--reference-slice 300]

Prints wall and CPU seconds per size and the ratios between sizes (cost should grow linearly with
requests), the steps simulated, how many were planned in runs versus taken one by one, and a check
that the planned runs equal the step-by-step reference on a slice. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from simkv.cost import get_device
from simkv.models import get_model
from simkv.precision import get_precision
from simkv.scenario import resolve_weights_memory
from simkv.serving import load_trace
from simkv.serving.engine import PagedServing
from simkv.serving.scheduler import SchedulerConfig

TRACE = "data/traces/azure_llm_2023_conv.csv"


def run(requests, device, fast=True):
    model = get_model("llama-2-7b")
    dev = get_device(device)
    eng = PagedServing(requests, model, get_precision("u8"), SchedulerConfig(), device=dev,
                       weights_bytes=resolve_weights_memory(model, None, None, dev), device_memory=dev.memory_bytes)
    wall, cpu = time.perf_counter(), time.process_time()
    groups, steps, _, _ = eng.run(fast=fast)
    return time.perf_counter() - wall, time.process_time() - cpu, eng, groups, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="h100-sxm")
    ap.add_argument("--reference-slice", type=int, default=300)
    args = ap.parse_args()
    all_requests = load_trace(TRACE)
    n = len(all_requests)
    print(f"trace {TRACE}: {n:,} requests; llama-2-7b, u8 KV, GenAI defaults (block 32, dynamic pool, "
          f"256 batched tokens); device {args.device}")
    print(f"{'requests':>9} {'wall s':>8} {'cpu s':>8} {'steps':>10} {'runs':>7} {'one by one':>11} {'sim s':>8} "
          f"{'cpu/req ms':>11}")
    rows = []
    for frac in (4, 2, 1):
        reqs = all_requests[: n // frac]
        wall, cpu, eng, groups, steps = run(reqs, args.device)
        runs = sum(1 for r in eng.rows if not isinstance(r, tuple))
        singles = sum(1 for r in eng.rows if isinstance(r, tuple))
        rows.append((len(reqs), wall, cpu))
        print(f"{len(reqs):>9,} {wall:>8.2f} {cpu:>8.2f} {len(steps):>10,} {runs:>7,} {singles:>11,} "
              f"{steps['time_s'][-1]:>8.0f} {1000 * cpu / len(reqs):>11.3f}")
    (n1, _, c1), (n2, _, c2), (n3, _, c3) = rows
    print(f"cpu ratios: 1/2 vs 1/4 = {c2 / c1:.2f} (requests x{n2 / n1:.2f}); all vs 1/2 = {c3 / c2:.2f} "
          f"(requests x{n3 / n2:.2f})")
    ref = all_requests[: args.reference_slice]
    a, b = run(ref, args.device, fast=True), run(ref, args.device, fast=False)
    same = np.array_equal(a[4], b[4]) and a[2].ledger == b[2].ledger
    print(f"planned runs = step-by-step reference on the first {len(ref)} requests: {same} "
          f"(reference {b[1]:.2f} s cpu, planned {a[1]:.2f} s)")


if __name__ == "__main__":
    main()

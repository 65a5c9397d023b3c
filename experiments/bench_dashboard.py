"""Benchmark: the dashboard's main callback on a 32-layer, 8,192-token scenario.

    python experiments/bench_dashboard.py [--repeat 50] [--policy openvino-gpu] [--prompt 1024] [--decode 7168]

Calls the registered main callback (``simkv.dashboard.callbacks.main_callback``:
checks, simulation, metrics, the decimated timeline and the per-layer heatmap,
the cards) directly, as Dash would, many times, and prints p50 / p95 / max of

* ``cold``: the result cache cleared before every call (what a changed control costs);
* ``cold, CPU``: the same calls' CPU time in this process (what other jobs on the machine do not inflate);
* ``cold + JSON``: the same plus serialising the outputs the way Dash sends them;
* ``cached``: the same scenario again (a tab, heatmap or table change).

The first call (imports, plotly's validators) is reported separately and not
counted. The target (issue #4) is p95 ≤ 150 ms for ``cold``.

``--serving``: the Serving view's callback instead
(``simkv.dashboard.serving_view.serving_callback``, result cache cleared before
every call, outputs serialised), on its default form and at its limits; CPU
seconds per call (this process's, robust to other load) and wall p50 / max.
Target (issue #11): a few hundred ms for the default, ≤ ~2 s at the limits.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
from dash._utils import to_json

from simkv.dashboard import callbacks, compute
from simkv.dashboard import state as st
from simkv.dashboard.server import create_app

TARGET_MS = 150.0


def percentiles(times: list[float]) -> str:
    ms = np.asarray(times) * 1000
    return f"p50 {np.percentile(ms, 50):7.1f} ms   p95 {np.percentile(ms, 95):7.1f} ms   max {ms.max():7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--policy", default="openvino-gpu")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--decode", type=int, default=7168)
    parser.add_argument("--serving", action="store_true", help="time the Serving view's callback instead")
    args = parser.parse_args()
    if args.serving:
        return bench_serving(min(args.repeat, 5))

    create_app()  # registers the callbacks exactly as `python app.py` does
    controls = {k: st.DEFAULTS[k] for k in callbacks.SCENARIO_KEYS + ("heat",)}
    controls.update(model=args.model, policy=args.policy, prompt=str(args.prompt), decode=str(args.decode))
    popts = [st.policy_defaults(i["policy"])[i["field"]] for i in callbacks.POPT_IDS]

    start = time.perf_counter()
    out = callbacks.main_callback(controls, popts)
    first = time.perf_counter() - start
    if not out["store"]["ok"]:
        raise SystemExit(f"scenario rejected: {out['status']}")

    cold, cold_cpu, cold_json, cached = [], [], [], []
    size = 0
    for _ in range(args.repeat):
        compute.CACHE.clear()
        start, cpu = time.perf_counter(), time.process_time()
        out = callbacks.main_callback(controls, popts)
        mid = time.perf_counter()
        cold_cpu.append(time.process_time() - cpu)
        payload = to_json(out)
        end = time.perf_counter()
        cold.append(mid - start)
        cold_json.append(end - start)
        size = len(payload)
    for _ in range(args.repeat):
        start = time.perf_counter()
        callbacks.main_callback(controls, popts)
        cached.append(time.perf_counter() - start)

    result = compute.run(st.scenario_kwargs(callbacks.state_from(controls, popts)))
    print(f"simkv dashboard main callback — {platform.processor() or platform.machine()}, "
          f"{len(__import__('os').sched_getaffinity(0))} cores, Python {platform.python_version()}")
    print(f"scenario: {result.scenario.describe()}")
    print(f"          {len(result.steps):,} steps, {len(result.ledger):,} ledger rows; response {size / 1024:,.0f} KiB JSON")
    print(f"first call (imports, warm-up): {first * 1000:.1f} ms")
    print(f"cold         x{args.repeat}: {percentiles(cold)}")
    print(f"cold, CPU    x{args.repeat}: {percentiles(cold_cpu)}   (this process: robust to other load)")
    print(f"cold + JSON  x{args.repeat}: {percentiles(cold_json)}")
    print(f"cached       x{args.repeat}: {percentiles(cached)}")
    p95 = np.percentile(np.asarray(cold) * 1000, 95)
    print(f"target p95 <= {TARGET_MS:.0f} ms (cold): {'met' if p95 <= TARGET_MS else 'NOT met'} ({p95:.1f} ms)")


#: The Serving view's default form, then forms at its limits (every other field at its default).
SERVING_CASES = {
    "default: 100 Azure requests, paged": {},
    "100 synthetic requests, paged": {"sv_workload": "synthetic"},
    "100 Azure requests, contiguous openvino-gpu": {"sv_memory": "contiguous"},
    "limit: 1,000 requests, paged": {"sv_requests": "1000"},
    "limit: 1,000 requests, paged, block size 1": {"sv_requests": "1000", "sv_block_size": "1"},
    "limit: 4,000 rounds (300 requests, 100-block pool)": {"sv_requests": "300", "sv_pool": "blocks",
                                                            "sv_pool_size": "100"},
    "limit: 8,000 rounds (contiguous sequential)": {"sv_memory": "contiguous", "sv_scheduler": "sequential"},
    "near the ledger-row limit: contiguous exact, 40 requests": {"sv_memory": "contiguous", "sv_policy": "exact",
                                                                 "sv_requests": "40"},
    "over the ledger-row limit: contiguous exact, 60 requests": {"sv_memory": "contiguous", "sv_policy": "exact",
                                                                 "sv_requests": "60"},
}


def bench_serving(repeat: int) -> None:
    from simkv.dashboard import serving_view as sv

    create_app()
    print(f"simkv dashboard Serving view callback — {platform.processor() or platform.machine()}, "
          f"{len(__import__('os').sched_getaffinity(0))} cores, Python {platform.python_version()}")
    sv.serving_callback(dict(sv.DEFAULTS), "serving")  # imports, warm-up
    for name, over in SERVING_CASES.items():
        cpu, wall = [], []
        for _ in range(repeat):
            sv.CACHE.clear()
            c, w = time.process_time(), time.perf_counter()
            out = sv.serving_callback({**sv.DEFAULTS, **over}, "serving")
            to_json(out)
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
        shown = "shown" if out["status_class"] == "status" else "refused: " + out["status"].split(";")[0][:60]
        print(f"{name:<58} cpu {np.median(cpu):6.2f} s   wall p50 {np.median(wall):6.2f} s  max {max(wall):6.2f} s"
              f"   {shown}")


if __name__ == "__main__":
    main()

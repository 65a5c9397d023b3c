"""Serving speed in every regime: the Azure conversation trace (19,366 requests, 1 h) through GenAI continuous
batching on a paged pool, llama-2-7b, u8 KV, GenAI's defaults, every layer's pool tensors in the ledger.

    PYTHONPATH=. python experiments/bench_serving.py [--base TREE] [--only h100,cpu,...] [--small-pool-requests 500]
        [--scheduler vllm]

``--scheduler vllm`` runs the same regimes under vLLM's scheduler (vLLM's defaults: block 16, the device's
``max_num_batched_tokens`` / ``max_num_seqs``, the pool from ``gpu_memory_utilization`` where none is given).

Regimes (issue #21 point 4), each in a fresh process, CPU seconds of the simulation (the trace loaded first):

* ``h100``      the whole hour on the H100 preset (dynamic pool);
* ``h100-half`` its first half: the cost ratio whole / half should be ~2 (linear in requests);
* ``cpu``       the whole hour on the default CPU preset (xeon-8480): the device is overloaded, queues grow all hour
                (since honest memory the dynamic pool runs out of memory part-way: the run ends there);
* ``cpu-pool``  the whole hour on the CPU preset with a fixed 256 GiB pool: overloaded all hour, no growth (hundreds
                of requests live per step);
* ``small-pool`` the H100 preset with a fixed 2 GiB pool (``--cache-size 2``): preemption-heavy (a preemption every
                ~10 steps) — only the first ``--small-pool-requests`` requests (default 500);
* ``small-pool-hour`` the same, the whole hour;
* ``prefix``    the whole hour on the H100 preset with prefix caching;
* ``day``       24 hours at the conversation trace's rate on the H100 preset: 464,784 requests, Poisson arrivals at
                19,366 an hour, each (prompt, output) pair drawn from the trace's (seed 0): cost linear in requests,
                memory bounded (peak RSS printed).

``--base TREE`` runs every regime against another source tree too (this script's worker, ``PYTHONPATH=TREE``)
and prints the two side by side. Then (this tree only) a check that the planned runs equal the step-by-step
reference on a slice. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TRACE = "simkv/data/traces/azure_llm_2023_conv.csv"
#: regime -> (device, requests: None = all, "half", or "small"; SchedulerConfig fields)
REGIMES = {
    "h100": ("h100-sxm", None, {}),
    "h100-half": ("h100-sxm", "half", {}),
    "cpu": ("xeon-8480", None, {}),
    "cpu-pool": ("xeon-8480", None, {"cache_size": 256}),
    "small-pool": ("h100-sxm", "small", {"cache_size": 2}),
    "small-pool-hour": ("h100-sxm", None, {"cache_size": 2}),
    "prefix": ("h100-sxm", None, {"enable_prefix_caching": True}),
    "day": ("h100-sxm", "day", {}),
}
#: The day regime: hours at the conversation trace's rate (its 19,366 requests an hour).
DAY_HOURS, HOUR_REQUESTS = 24, 19_366


def day(trace: list) -> list:
    """``DAY_HOURS`` hours of Poisson arrivals at the trace's hourly rate, each request's (prompt, output) pair
    drawn from the trace's with a fixed seed (built here: more requests than ``simkv.serving.synthetic`` takes)."""
    import numpy as np

    from simkv.serving import Request

    n = DAY_HOURS * HOUR_REQUESTS
    rng = np.random.default_rng(0)
    gaps = rng.exponential(3600 / HOUR_REQUESTS, n)
    times = np.cumsum(gaps) - gaps[0]
    pick = rng.integers(0, len(trace), n).tolist()
    return [Request(i, trace[j].prompt, trace[j].max_new_tokens, arrival_s=float(t))
            for i, (j, t) in enumerate(zip(pick, times.tolist()))]


def scheduler_fields(scheduler: str, device: str) -> dict:
    """SchedulerConfig fields of a scheduler's defaults (vLLM's as ``simkv run --scheduler vllm`` takes them)."""
    if scheduler != "vllm":
        return {}
    from simkv.cost import get_device
    from simkv.serving.sched.vllm import batch_defaults

    dev = get_device(device)
    tokens, seqs = batch_defaults(dev.name, dev.memory_bytes)
    return {"scheduler": "vllm", "block_size": 16, "max_num_batched_tokens": tokens, "max_num_seqs": seqs}


def engine(requests, device, cfg):
    from simkv.cost import get_device
    from simkv.models import get_model
    from simkv.precision import get_precision
    from simkv.scenario import resolve_weights_memory
    from simkv.serving.engine.core import PagedServing
    from simkv.serving.sched.config import SchedulerConfig

    model = get_model("llama-2-7b")
    dev = get_device(device)
    return PagedServing(requests, model, get_precision("u8"), SchedulerConfig(**cfg), device=dev,
                        # int8 weights (optimum-intel's rule, the H100 preset's default before it took the checkpoint's
                        # bf16): the same on every tree --base may name, whose resolve_weights_memory takes no device
                        weights_bytes=resolve_weights_memory(model, None, None), device_memory=dev.memory_bytes,
                        max_steps=10**9)  # (the day takes more than the default 10 million steps)


def worker(regime: str, small: int, root: Path, scheduler: str = "continuous") -> dict:
    """One regime in this process (the tree on PYTHONPATH): its timings and outcome, as JSON."""
    from simkv.serving import load_trace

    import resource

    device, size, cfg = REGIMES[regime]
    cfg = {**cfg, **scheduler_fields(scheduler, device)}
    reqs = load_trace(root / TRACE)
    reqs = (reqs[: len(reqs) // 2] if size == "half" else reqs[:small] if size == "small" else day(reqs)
            if size == "day" else reqs)
    eng = engine(reqs, device, cfg)
    wall, cpu = time.perf_counter(), time.process_time()
    groups, steps, _, _ = eng.run(fast=True)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    oom = getattr(eng, "oom", None)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {"regime": regime, "requests": len(reqs), "cpu_s": cpu, "wall_s": wall, "steps": len(steps),
            "rss_gib": rss, "outputs": outputs(groups, steps, eng.ledger),
            "one_by_one": getattr(eng, "slow_steps", None),
            "preemptions": int(steps["preemptions"].sum()) if len(steps) else 0,
            "finished": sum(1 for g in groups if g.status == "FINISHED"),
            "oom_step": oom["step"] if oom else None, "sim_s": float(steps["time_s"][-1]) if len(steps) else 0.0}


#: The request table's fields compared between trees (``--base``).
FIELDS = ("index", "status", "P", "G", "processed", "generated", "preemptions", "prefix_hit", "first_token_s",
          "finish_s", "added_s", "added_step", "first_token_step", "finish_step")


def outputs(groups, steps, ledger) -> str:
    """A digest of a run's step table, ledger and request outcomes (the same on two trees: the same results)."""
    import hashlib

    h = hashlib.sha256(steps.view("u1") if len(steps) else b"")
    h.update(ledger.rows.view("u1") if len(ledger.rows) else b"")
    h.update(repr([tuple(getattr(g, f) for f in FIELDS) for g in groups]).encode())
    return h.hexdigest()[:16]


def measure(tree: Path, regime: str, small: int, scheduler: str = "continuous") -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, __file__, "--worker", regime, "--small-pool-requests", str(small),
                          "--root", str(tree), "--scheduler", scheduler], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"{regime} on {tree} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def describe(r: dict | None) -> str:
    if r is None:
        return f"{'':>8} {'':>10} {'':>8} {'':>12} {'':>7}"
    end = f"OOM@{r['oom_step']:,}" if r["oom_step"] is not None else f"{r['finished']:,} fin"
    return f"{r['cpu_s']:>8.2f} {r['steps']:>10,} {r['preemptions']:>8,} {end:>12} {r['rss_gib']:>7.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="another source tree to measure side by side")
    ap.add_argument("--only", help="comma-separated regimes (default: all)")
    ap.add_argument("--small-pool-requests", type=int, default=500)
    ap.add_argument("--reference-slice", type=int, default=300)
    ap.add_argument("--scheduler", choices=("continuous", "vllm"), default="continuous",
                    help="the scheduler's rules (default GenAI's continuous batching)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, default=Path.cwd(), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.small_pool_requests, args.root, args.scheduler)))
        return
    here = Path(__file__).resolve().parent.parent
    regimes = args.only.split(",") if args.only else list(REGIMES)
    trees = [("this", here)] + ([("base", args.base.resolve())] if args.base else [])
    rules = ("vLLM's scheduler and defaults (block 16, the device's batch defaults)" if args.scheduler == "vllm"
             else "GenAI defaults (block 32, 256 batched tokens)")
    print(f"trace {TRACE}; llama-2-7b, u8 KV, {rules}; CPU seconds of the "
          f"simulation, each regime in a fresh process; small-pool: first {args.small_pool_requests} requests")
    head = f"{'cpu s':>8} {'steps':>10} {'preempt':>8} {'end':>12} {'RSS GiB':>7}"
    print(f"{'regime':<15} {'device':<10} {'requests':>8} | this: {head}"
          + (f" | base: {head} | base/this" if args.base else ""))
    results = {}
    for regime in regimes:
        row = {name: measure(tree, regime, args.small_pool_requests, args.scheduler) for name, tree in trees}
        results[regime] = row
        a, b = row["this"], row.get("base")
        print(f"{regime:<15} {REGIMES[regime][0]:<10} {a['requests']:>8,} |       {describe(a)}"
              + (f" |       {describe(b)} | {b['cpu_s'] / a['cpu_s']:>8.2f}x" if b else ""), flush=True)
    if args.base:
        same = [regime for regime, row in results.items() if row["this"]["outputs"] == row["base"]["outputs"]]
        print(f"the same step tables, ledgers and request outcomes as base: {', '.join(same) or 'none'}"
              + "".join(f"; {regime} DIFFERS" for regime in results if regime not in same))
    if "h100" in results and "h100-half" in results:
        for name, _ in trees:
            whole, half = results["h100"][name], results["h100-half"][name]
            print(f"{name}: whole / half of the trace = {whole['cpu_s'] / half['cpu_s']:.2f} in CPU seconds for "
                  f"{whole['requests'] / half['requests']:.2f} times the requests")
    if "h100" in results and "day" in results:
        for name, _ in trees:
            hour, whole = results["h100"][name], results["day"][name]
            print(f"{name}: day / hour = {whole['cpu_s'] / hour['cpu_s']:.2f} in CPU seconds for "
                  f"{whole['requests'] / hour['requests']:.2f} times the requests")
    if args.reference_slice:
        import numpy as np

        from simkv.serving import load_trace

        ref = load_trace(here / TRACE)[: args.reference_slice]
        same = True
        for device, cfg in (("h100-sxm", {}), ("h100-sxm", {"cache_size": 2}), ("xeon-8480", {})):
            cfg = {**cfg, **scheduler_fields(args.scheduler, device)}
            a, b = engine(ref, device, cfg), engine(ref, device, cfg)
            ra, rb = a.run(fast=True), b.run(fast=False)
            same &= np.array_equal(ra[1], rb[1]) and a.ledger == b.ledger
        print(f"planned runs = step-by-step reference on the first {len(ref)} requests (h100, h100 2 GiB, "
              f"xeon-8480): {same}")


if __name__ == "__main__":
    main()

"""Planning a deployment: llama-3.1-70b for the Azure conversation hour, ttft_p99 ≤ 2 s and tpot_p99 ≤ 50 ms.

    python -m experiments.plan_deployment [--quick] [--out out/plan_deployment]     (or: python -m experiments)

The `simkv plan` example of docs/guide/sizing.md, run twice: in two local processes, then on a Dask
``LocalCluster`` of two
worker processes, each into its own Parquet file; the two files must be byte-identical (the run fails
otherwise). Devices h100-sxm, a100-80gb and xeon-8480, at most 8 devices per deployment, tp 1/2/4/8, routers
round-robin and least-outstanding, max_num_batched_tokens 256/512/1024/2048, each device's default KV
precision, block size and pool (``simkv.serving.run.runtime_defaults``). ``--quick``: the first 1,000 requests.

Writes ``plan.parquet`` and ``plan_dask.parquet``, ``deployments.csv`` (every deployment run: outcome and
latencies), ``report.txt`` (the command's text report), ``wall_times.csv`` (nondeterministic) and the figure
``plan_front`` (cost against each SLO latency).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from simkv.lab import plan
from simkv.lab.output import main_for, save_figure, write_csv
from simkv.lab.plan_figure import plan_figure
from simkv.lab.traces import AZURE_CONV

NONDETERMINISTIC = ("wall_times.csv",)
DEVICES = ("h100-sxm", "a100-80gb", "xeon-8480")
COLUMNS = ("device", "devices", "tp", "replicas", "router", "precision", "block_size", "pool",
           "max_num_batched_tokens", "status", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s", "preemptions", "reason")


def run(out: Path, quick: bool) -> None:
    target = plan.Target({"trace": str(AZURE_CONV), "limit": 1000 if quick else None}, "llama-3.1-70b",
                         plan.parse_slo("ttft_p99=2s,tpot_p99=50ms"))
    space = plan.Space(DEVICES, max_devices=8, max_num_batched_tokens=(256, 512, 1024, 2048))
    local, dask = out / "plan.parquet", out / "plan_dask.parquet"
    for path in (local, dask):
        path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    result = plan.run_plan(target, space, out=local, workers=2)
    local_s = time.perf_counter() - t0
    from distributed import LocalCluster

    environ = dict(os.environ)  # the cluster's nanny sets MALLOC_TRIM_THRESHOLD_; later experiments validate
    t0 = time.perf_counter()
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            plan.run_plan(target, space, out=dask, scheduler=cluster.scheduler_address)
    finally:
        os.environ.clear()
        os.environ.update(environ)
    dask_s = time.perf_counter() - t0
    if local.read_bytes() != dask.read_bytes():
        raise AssertionError(f"{local} and {dask} differ: the executors disagree")
    (out / "report.txt").write_text(plan.render(result) + "\n")
    write_csv(out / "deployments.csv", result.rows, list(COLUMNS))
    write_csv(out / "wall_times.csv", [{"executor": "2 local processes", "wall_s": round(local_s, 1)},
                                       {"executor": "Dask LocalCluster, 2 workers", "wall_s": round(dask_s, 1)}])
    save_figure(plan_figure(result), out / "plan_front")
    print(plan.render(result))
    print(f"wall: {local_s:.1f} s in 2 local processes, {dask_s:.1f} s on a Dask LocalCluster; Parquet byte-identical")


if __name__ == "__main__":
    main_for(run, __doc__, "plan_deployment")

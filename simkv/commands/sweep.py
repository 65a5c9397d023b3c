"""``simkv sweep`` (issue #11): a parameter grid on top of the scenario flags, one Parquet row per point
(resumable). The substance is in simkv.lab.sweep."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simkv.flags import (ANY, EXECUTOR_MODES, add_executor_arguments, add_policy_arguments, add_scenario_arguments,
                         scenario_fields, workload_modes)

#: The modes of ``simkv sweep`` (simkv.flags): where its points run, and its sessions' workload flags.
SWEEP_MODES = (*workload_modes(lambda a: True), *EXECUTOR_MODES)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("sweep", help="run a parameter grid and store one Parquet row per point (resumable)",
                       modes=SWEEP_MODES, description=(
        "Run every combination of the --param values (policy options or scenario fields such as decode) on top of "
        "the scenario flags, and store one row per point in a Parquet file: every scenario field, policy options as "
        "policy.NAME, the metrics of `simkv run --json` (per-layer lists left out), spike_p99_bytes and "
        "mean_waste_bytes. Rerunning with the same --out skips the points already there, so an interrupted sweep "
        "resumes. Points run on local processes, or on a Dask cluster with --scheduler."))
    add_scenario_arguments(p)
    add_policy_arguments(p)
    p.add_argument("--param", action="append", required=True, metavar="KEY=START:STOP:STEP|KEY=V1,V2,...", modes=ANY,
                   help="values of one key (repeatable; STOP included when on the grid)")
    p.add_argument("--out", required=True, metavar="PATH.parquet", modes=ANY, output=(".parquet",),
                   help="rows go here (existing rows are kept)")
    add_executor_arguments(p)
    return p


def main(args: argparse.Namespace) -> int:
    from simkv.lab import sweep

    out = Path(args.out)  # checked before the command runs (simkv.flags)
    base = scenario_fields(args)
    points = [sweep.make_point(base, o) for o in sweep.grid(args.param, args.policy)]
    try:
        result = sweep.run_sweep(points, out, workers=args.workers, scheduler=args.scheduler,
                                 progress=sys.stderr.isatty())
    except KeyboardInterrupt:
        print(f"simkv sweep: interrupted; {len(sweep.read_rows(out)):,} rows kept in {out}: rerun the same command "
              "to resume", file=sys.stderr)
        return 130
    oom = sum(1 for r in result.rows if r["oom"])
    print(f"simkv sweep: {len(points):,} points ({result.computed:,} run, {result.skipped:,} already in {out})"
          f"{f', {oom:,} out of memory' if oom else ''} -> {out}")
    return 0

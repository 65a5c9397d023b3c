"""The policy frontier: peak vs reallocations vs bytes copied, every policy and a parameter grid, over Azure decode lengths.

    python -m experiments.frontier [--quick] [--out out/frontier]     (or: python -m experiments)

Workloads: decode lengths of 128 requests (``--quick``: 8) drawn with seed 0
from the Azure LLM conversation trace 2023 (simkv/data/traces/), each after the
default 1,024-token prompt, on Llama-3-8B with an f16 cache (every policy at the
same precision, so bytes compare). Each policy runs a small grid of its
parameters (``static`` reserves the sample's longest answer, the least that
never overflows); a policy's points are joined in parameter order. Every configuration is scored over all workloads — mean and
worst-case peak, mean reallocations, mean bytes copied, mean waste — through
the same sweep runner as ``simkv sweep`` (simkv.lab.sweep) and the same
aggregation as ``simkv tune`` (simkv.lab.tune.Objective).

Writes ``frontier.csv`` (one row per configuration), ``points.csv`` (one row per
configuration × workload) and the figure ``frontier`` (HTML, PNG, SVG).
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simkv.lab import sweep, traces
from simkv.lab.output import main_for, save_figure, write_csv
from simkv.lab.palette import policy_color
from simkv.lab.tune import Objective

SEED = 0
BASE = {"model": "llama-3-8b", "precision": "f16", "prompt": 1024}
GRIDS = {
    # stagger=1 would be `fixed` (the same rows); 64 = every primitive of a 32-layer model its own headroom.
    "openvino-gpu": [{"headroom_base": h, "stagger": 64} for h in (0, 32, 64, 128, 256, 512)],
    "fixed": [{"tokens": t} for t in (32, 64, 128, 256, 512)],
    "geometric": [{"ratio": r} for r in (1.1, 1.25, 1.5, 2.0)],
    "openvino-cpu": [{"growth": g} for g in (2, 3, 4)],
    "exact": [{}],
    "static": [{}],  # min_response_len set from the sample below
}
QUICK_GRIDS = {
    "openvino-gpu": [{"headroom_base": h, "stagger": 64} for h in (64, 128, 256)],
    "fixed": [{"tokens": t} for t in (64, 128)],
    "geometric": [{"ratio": 1.5}],
    "openvino-cpu": [{"growth": 2}],
    "exact": [{}],
    "static": [{}],
}
OBJECTIVES = [Objective(m, a) for m, a in (("peak", "mean"), ("peak", "max"), ("reallocs", "mean"),
                                          ("copied", "mean"), ("waste", "mean"), ("spike_p99", "mean"))]
POINT_COLUMNS = ("policy", "params", "prompt", "decode", "peak_allocated_bytes", "realloc_count", "bytes_copied",
                 "mean_waste_bytes", "spike_p99_bytes", "max_spike_bytes", "oom_step")


def label(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items()) or "defaults"


def run(out: Path, quick: bool) -> None:
    """The policy frontier over Azure decode lengths."""
    prompts, decodes = traces.sample(traces.AZURE_CONV, 8 if quick else 128, SEED)
    grids = {k: [dict(p) for p in v] for k, v in (QUICK_GRIDS if quick else GRIDS).items()}
    grids["static"] = [{"min_response_len": int(decodes.max())}]
    configs = [(policy, params) for policy, plist in grids.items() for params in plist]
    points = [sweep.make_point({**BASE, "policy": policy}, {**params, "decode": int(d)})
              for policy, params in configs for d in decodes]
    rows = sweep.run_sweep(points, workers=1 if quick else None, progress=not quick).rows
    per = len(decodes)
    summary, detail = [], []
    for i, (policy, params) in enumerate(configs):
        group = rows[i * per:(i + 1) * per]
        summary.append({"policy": policy, "params": label(params), "workloads": per,
                        "oom_workloads": sum(1 for r in group if r["oom"]),
                        **{o.name: o.of(group) for o in OBJECTIVES}})
        detail += [{"params": label(params), **r} for r in group]
    write_csv(out / "frontier.csv", summary)
    write_csv(out / "points.csv", detail, columns=list(POINT_COLUMNS))
    save_figure(figure(summary, per), out / "frontier")


def figure(summary: list[dict], workloads: int) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        "mean peak vs mean reallocations", "worst-case peak vs mean bytes copied"))
    for policy in dict.fromkeys(r["policy"] for r in summary):
        mine = [r for r in summary if r["policy"] == policy]  # in parameter order: the line is the parameter's path
        style = {"mode": "markers+lines" if len(mine) > 1 else "markers", "name": policy, "legendgroup": policy,
                 "marker": {"color": policy_color(policy), "size": 10}, "line": {"color": policy_color(policy), "width": 1},
                 "text": [r["params"] for r in mine], "hovertemplate": "%{text}<br>%{x:,.1f} MiB, %{y:,.3g}"}
        # Reallocations and copies are 0 for a policy that never grows: shown at the axis floor (log axis).
        fig.add_scatter(x=[r["peak:mean"] / 2**20 for r in mine], y=[max(r["reallocs:mean"], 0.1) for r in mine],
                        row=1, col=1, **style)
        fig.add_scatter(x=[r["peak:max"] / 2**20 for r in mine], y=[max(r["copied:mean"] / 2**30, 1e-3) for r in mine],
                        row=1, col=2, showlegend=False, **style)
    fig.update_xaxes(title_text="mean peak allocated (MiB)", row=1, col=1)
    fig.update_xaxes(title_text="worst-case peak allocated (MiB)", row=1, col=2)
    fig.update_yaxes(type="log", title_text="mean reallocations per session (log; 0 drawn at 0.1)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="mean bytes copied per session (GiB, log; 0 at 0.001)", row=1, col=2)
    fig.update_layout(template="plotly_white", width=1300, height=560, legend={"orientation": "h", "y": -0.18},
                      title=f"Policy frontier: Llama-3-8B f16, 1,024-token prompt, {workloads} Azure conversation "
                            "decode lengths (lower-left is better)")
    return fig


if __name__ == "__main__":
    main_for(run, __doc__, "frontier")

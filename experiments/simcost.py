"""Simulator cost: wall time vs generated tokens, layers and beam width, fast engine vs reference engine.

    python -m experiments.simcost [--quick] [--out out/simcost]     (or: python -m experiments)

The ``openvino-gpu`` policy on Llama-3-8B's shape (8 KV heads × 128, f16) with a
1,024-token prompt, varying one thing at a time: generated tokens (layers 32),
layers (custom shapes, 1,024 generated), and beam width (sequences in the
batch, 512 generated; fork, decode, select). Each point runs the fast engine
(events only) and — up to a size where it stays in seconds — the reference
engine (every step, every layer), checks that both produce the same ledger and
step table, and keeps the best of 3 wall times (reference: 1). ``--quick``
runs two sizes per axis, with 128 generated tokens on the layer and beam axes.

``cost.csv`` holds what is deterministic (sizes, steps, ledger rows, whether
the engines agree); ``wall_times.csv`` the measured seconds (a measurement:
listed in NONDETERMINISTIC). Figure ``simcost`` (HTML, PNG, SVG), log-log.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simkv import build_scenario, simulate
from simkv.lab.output import main_for, save_figure, write_csv

from experiments.bench_engines import best_time

NONDETERMINISTIC = ("wall_times.csv",)
SHAPE = {"model": None, "heads": 32, "kv_heads": 8, "head_dim": 128}
ENGINE_COLORS = {"fast": "#000000", "reference": "#969696"}  # engines, not policies: black and grey
#: (axis, values, values the reference engine also runs) — full and quick.
FULL = {"decode": ([256, 1024, 4096, 16384, 65536], 4096), "layers": ([8, 32, 128, 512], 128),
        "beam": ([1, 2, 4, 8, 16], 8)}
QUICK = {"decode": ([64, 256], 256), "layers": ([4, 16], 16), "beam": ([1, 4], 4)}
BASE = {"decode": 1024, "layers": 32, "beam": 1}
BEAM_DECODE = 512


def scenario(axis: str, value: int, quick: bool = False):
    values = dict(BASE, **{axis: value})
    if axis == "beam":
        values["decode"] = BEAM_DECODE
    if quick and axis != "decode":
        values["decode"] = 128
    # A device large enough that nothing here runs out of memory.
    return build_scenario(**SHAPE, layers=values["layers"], policy="openvino-gpu", prompt=1024,
                          decode=values["decode"], beam=values["beam"], device_memory="4TiB")


def run(out: Path, quick: bool) -> None:
    """Simulator cost: wall time vs tokens, layers and beam width, fast vs reference."""
    grid = QUICK if quick else FULL
    simulate(scenario("decode", 16))  # warm-up: imports
    cost, times = [], []
    for axis, (values, ref_max) in grid.items():
        for value in values:
            sc = scenario(axis, value, quick)
            fast_s, fast = best_time(lambda: simulate(sc), 3)
            row = {"axis": axis, "value": value, "layers": sc.model.layers, "workload": str(sc.workload),
                   "steps": fast.metrics.steps, "ledger_rows": len(fast.ledger), "reference_run": value <= ref_max,
                   "engines_agree": None}
            ref_s = None
            if value <= ref_max:
                ref_s, ref = best_time(lambda: simulate(sc, engine="reference"), 1)
                row["engines_agree"] = fast.ledger == ref.ledger and bool(np.array_equal(fast.steps, ref.steps))
            cost.append(row)
            times.append({"axis": axis, "value": value, "fast_s": fast_s, "reference_s": ref_s})
    write_csv(out / "cost.csv", cost)
    write_csv(out / "wall_times.csv", times)
    save_figure(figure(times), out / "simcost")


def figure(times: list[dict]) -> go.Figure:
    titles = {"decode": "generated tokens (32 layers)", "layers": "layers (1,024 generated)",
              "beam": f"beam width ({BEAM_DECODE} generated)"}
    fig = make_subplots(rows=1, cols=3, subplot_titles=tuple(titles.values()), horizontal_spacing=0.07)
    for col, axis in enumerate(titles, start=1):
        mine = [t for t in times if t["axis"] == axis]
        for engine in ("fast", "reference"):
            pts = [(t["value"], t[f"{engine}_s"]) for t in mine if t[f"{engine}_s"] is not None]
            fig.add_scatter(x=[p[0] for p in pts], y=[p[1] * 1e3 for p in pts], mode="markers+lines",
                            name=f"{engine} engine", legendgroup=engine, showlegend=col == 1,
                            marker={"color": ENGINE_COLORS[engine], "size": 9}, line={"color": ENGINE_COLORS[engine]},
                            row=1, col=col)
        fig.update_xaxes(type="log", title_text=titles[axis].split(" (")[0], row=1, col=col)
        fig.update_yaxes(type="log", title_text="wall time (ms, log)" if col == 1 else None, row=1, col=col)
    fig.update_layout(template="plotly_white", width=1300, height=480, legend={"orientation": "h", "y": -0.2},
                      title="Simulator cost (openvino-gpu, Llama-3-8B KV shape, 1,024-token prompt): fast vs reference engine")
    return fig


if __name__ == "__main__":
    main_for(run, __doc__, "simcost")

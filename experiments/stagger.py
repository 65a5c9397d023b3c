"""Experiment: what the GPU plugin's stagger buys, across real model shapes.

    python -m experiments.stagger [--quick] [--out out/stagger]     (or: python -m experiments)

The OpenVINO GPU plugin gives every kv_cache primitive its own headroom,
``128 + id % 64`` tokens, so that layers do not all reallocate on the same
step while the old buffer is still held (docs/DESIGN.md §2). This script runs
one session per model preset (f16 KV, 16 GiB device) under

* ``openvino-gpu``      — the plugin's staggered headroom;
* ``fixed`` N=128       — the same rule without the stagger (every primitive +128);
* ``fixed`` N=160       — no stagger, but the stagger's mean headroom (128 + 31.5);
* ``geometric`` 1.5     — a growth ratio instead, with the GPU plugin's mechanics;

with a 1,024-token prompt and 3,072 generated tokens (``--quick``: two models,
512 generated), and writes the table as ``stagger.csv`` and ``table.md`` (peak,
largest spike, reallocations, copies, mean waste), a bar chart of peaks and
spikes (``peaks``), and the llama-3-8b timelines of the stagger against no
stagger. Everything is simulated: same inputs, same bytes.
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from tqdm import tqdm

from simkv import build_scenario, simulate
from simkv.figures import MIB, compare
from simkv.lab.output import main_for, save_figure, write_csv
from simkv.lab.palette import policy_color

MODELS = ("tinyllama-1.1b", "qwen2.5-7b", "llama-3-8b", "phi-3.5-mini", "llama-2-7b", "llama-2-13b")  # mistral-7b = llama-3-8b shape
GPU_MECHANICS = {"free_old": "next_inference", "reset": "free", "first_touch": False, "beam_tables": 2, "headroom_limit": 0.9}
VARIANTS = {
    "stagger (openvino-gpu)": ("openvino-gpu", {}),
    "fixed +128": ("fixed", {"tokens": 128}),
    "fixed +160": ("fixed", {"tokens": 160}),
    "geometric x1.5": ("geometric", {"ratio": 1.5, **GPU_MECHANICS}),
}


QUICK_MODELS = ("tinyllama-1.1b", "llama-3-8b")
#: Bar patterns tell apart two variants of one policy (same colour).
PATTERNS = {"fixed +160": "/"}


def run_all(models, prompt: int, decode: int):
    results = {}
    for model in tqdm(models, desc="models", unit="model", disable=None):
        for label, (policy, options) in VARIANTS.items():
            # on arc-a770, the Intel GPU the GPU plugin runs on: 16 GiB, the preset's int8 weights beside it
            scenario = build_scenario(model=model, policy=policy, policy_options=options, precision="f16",
                                      prompt=prompt, decode=decode, device="arc-a770")
            results[model, label] = simulate(scenario)
    return results


def rows(results) -> list[dict]:
    out = []
    for (model, label), res in results.items():
        m, st = res.metrics, res.steps
        out.append({"model": model, "variant": label, "policy": res.scenario.policy.name,
                    "peak_allocated_bytes": m.peak_allocated_bytes, "max_spike_bytes": m.max_spike_bytes,
                    "realloc_count": m.realloc_count, "bytes_copied": m.bytes_copied,
                    "mean_waste_pct": round(100 * (1 - st["used"].sum() / st["allocated"].sum()), 6)})
    return out


def table(results) -> str:
    lines = [
        "| model | policy | peak MiB | largest spike MiB | reallocations | copied GiB | mean waste % |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (model, label), res in results.items():
        m, st = res.metrics, res.steps
        waste = 100 * (1 - st["used"].sum() / st["allocated"].sum())
        lines.append(
            f"| {model} | {label} | {m.peak_allocated_bytes / MIB:,.1f} | {m.max_spike_bytes / MIB:,.1f} | "
            f"{m.realloc_count:,} | {m.bytes_copied / 2**30:.2f} | {waste:.1f} |"
        )
    return "\n".join(lines)


def bars(results, models) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("peak allocated", "largest in-step spike"))
    for label, (policy, _) in VARIANTS.items():
        peaks = [results[m, label].metrics.peak_allocated_bytes / MIB for m in models]
        spikes = [results[m, label].metrics.max_spike_bytes / MIB for m in models]
        marker = {"color": policy_color(policy), "pattern": {"shape": PATTERNS.get(label, "")}}
        fig.add_bar(x=list(models), y=peaks, name=label, marker=marker, row=1, col=1)
        fig.add_bar(x=list(models), y=spikes, name=label, marker=marker, showlegend=False, row=1, col=2)
    fig.update_yaxes(title_text="MiB", row=1, col=1)
    fig.update_yaxes(title_text="MiB", row=1, col=2)
    fig.update_xaxes(title_text="model (f16 KV)")
    fig.update_layout(barmode="group", template="plotly_white", width=1200, height=480,
                      title="Staggered vs synchronised headroom: peak and largest spike per model",
                      legend={"orientation": "h", "y": -0.3})
    return fig


def run(out: Path, quick: bool) -> None:
    """Staggered vs synchronised headroom across model shapes (the GPU plugin's 128 + id % 64)."""
    models = QUICK_MODELS if quick else MODELS
    prompt, decode = 1024, 512 if quick else 3072
    results = run_all(models, prompt, decode)
    write_csv(out / "stagger.csv", rows(results))
    (out / "table.md").write_text(table(results) + "\n")
    save_figure(bars(results, models), out / "peaks")
    labels = ["stagger (openvino-gpu)", "fixed +128"]
    timeline = compare([results["llama-3-8b", label] for label in labels], ["openvino-gpu (stagger)", "fixed +128"])
    for i, policy in enumerate(("openvino-gpu", "fixed")):  # one colour per policy, in every figure
        for trace in fig_traces(timeline, i):
            trace.line.color = policy_color(policy)
    timeline.update_layout(width=1200, height=450, xaxis_title="step (generated token)", yaxis_title="allocated KV, MiB",
                           title=f"llama-3-8b, prompt {prompt}, decode {decode}: allocated and in-step peak")
    save_figure(timeline, out / "llama-3-8b-timeline")


def fig_traces(fig: go.Figure, run_index: int) -> list:
    """The traces :func:`simkv.figures.compare` drew for one run (allocated and its in-step peak)."""
    return list(fig.data[2 * run_index: 2 * run_index + 2])


if __name__ == "__main__":
    main_for(run, __doc__, "stagger")

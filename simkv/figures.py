"""Plotly figures of a result, shared by the CLI, the dashboard and the experiments.

Colours mean the same thing everywhere: allocated (blue), in-step peak
(light blue), used (green), resident (orange), reallocation events (red).
Figures are deterministic: the same result gives byte-identical HTML.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from simkv.ledger import ALLOC, TENSOR_CODE, TENSORS
from simkv.scenario import Result

COLORS = {
    "allocated": "#1f77b4",
    "peak": "#9ecae1",
    "used": "#2ca02c",
    "resident": "#ff7f0e",
    "event": "#d62728",
}
#: Line dash per compared run, so runs stay apart when colours mean quantities.
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
MIB = 1024 * 1024


def _layout(fig: go.Figure, title: str, y_title: str = "MiB") -> go.Figure:
    fig.update_layout(
        title=title,
        xaxis_title="step",
        yaxis_title=y_title,
        hovermode="x unified",
        template="plotly_white",
        legend={"orientation": "h", "y": -0.2},
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return fig


def event_summary(result: Result) -> dict[str, np.ndarray]:
    """Per step with allocations: how many, their bytes, and which layers/tensors."""
    rows = result.ledger.rows
    allocs = rows[rows["op"] == ALLOC]
    if not len(allocs):
        return {"step": np.empty(0, dtype=np.int64), "count": np.empty(0), "bytes": np.empty(0), "text": []}
    steps, start, count = np.unique(allocs["step"], return_index=True, return_counts=True)
    total = np.add.reduceat(allocs["bytes"], start)
    text = []
    for s, n in zip(start.tolist(), count.tolist()):
        chunk = allocs[s : s + n]
        parts = [
            f"L{layer} {TENSORS[t]} {nbytes / MIB:.2f} MiB"
            for layer, t, nbytes in zip(chunk["layer"][:6].tolist(), chunk["tensor"][:6].tolist(), chunk["bytes"][:6].tolist())
        ]
        if n > 6:
            parts.append(f"… {n - 6} more")
        text.append("<br>".join(parts))
    return {"step": steps, "count": count, "bytes": total, "text": text}


def timeline(result: Result, title: str | None = None) -> go.Figure:
    """Memory over steps: allocated, in-step peak, used, resident; reallocations marked."""
    st = result.steps
    x = st["step"]
    fig = go.Figure()
    fig.add_scatter(x=x, y=st["peak"] / MIB, name="peak in step", line={"color": COLORS["peak"], "width": 1})
    fig.add_scatter(x=x, y=st["allocated"] / MIB, name="allocated", line={"color": COLORS["allocated"]})
    fig.add_scatter(x=x, y=st["resident"] / MIB, name="resident", line={"color": COLORS["resident"]})
    fig.add_scatter(x=x, y=st["used"] / MIB, name="used", line={"color": COLORS["used"]})
    ev = event_summary(result)
    if len(ev["step"]):
        peak_at = st["peak"][np.searchsorted(x, ev["step"])]
        fig.add_scatter(
            x=ev["step"], y=peak_at / MIB, mode="markers", name="reallocation",
            marker={"color": COLORS["event"], "size": 6, "symbol": "triangle-up"},
            text=ev["text"], hovertemplate="step %{x}: %{text}<extra>allocations</extra>",
        )
    return _layout(fig, title or result.scenario.describe())


def compare(results: list[Result], labels: list[str], quantity: str = "allocated") -> go.Figure:
    """Several runs of the same workload overlaid on one axis (peak shown as a thin line)."""
    fig = go.Figure()
    for i, (res, label) in enumerate(zip(results, labels)):
        dash = DASHES[i % len(DASHES)]
        st = res.steps
        fig.add_scatter(
            x=st["step"], y=st[quantity] / MIB, name=f"{label}: {quantity}",
            line={"color": COLORS.get(quantity, COLORS["allocated"]), "dash": dash},
        )
        if quantity == "allocated":
            fig.add_scatter(
                x=st["step"], y=st["peak"] / MIB, name=f"{label}: peak in step",
                line={"color": COLORS["peak"], "dash": dash, "width": 1},
            )
    return _layout(fig, f"{quantity} — " + " vs ".join(labels))


def capacity_matrix(result: Result, max_columns: int = 1500) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Capacity (tokens) of every K/V data buffer at the end of sampled steps.

    Returns (matrix [buffers × columns], steps sampled, row labels).
    """
    rows = result.ledger.rows
    n_steps = len(result.steps)
    layers = result.scenario.model.layers
    cols = np.unique(np.linspace(0, n_steps - 1, min(max_columns, n_steps)).round().astype(np.int64))
    matrix = np.zeros((2 * layers, len(cols)), dtype=np.int64)
    labels = []
    for layer in range(layers):
        for j, name in enumerate(("k", "v")):
            sel = rows[(rows["layer"] == layer) & (rows["tensor"] == TENSOR_CODE[name]) & (rows["op"] == ALLOC)]
            labels.append(f"L{layer} {name}")
            if not len(sel):
                continue
            # Capacity at step s = capacity of the last allocation at or before s.
            idx = np.searchsorted(sel["step"], result.steps["step"][cols], side="right") - 1
            matrix[2 * layer + j] = np.where(idx >= 0, sel["capacity_tokens"][np.maximum(idx, 0)], 0)
    return matrix, result.steps["step"][cols], labels


def layer_heatmap(result: Result, value: str = "headroom", max_columns: int = 1500) -> go.Figure:
    """Per-layer capacity or headroom (capacity − tokens) over steps: the stagger at a glance."""
    matrix, steps, labels = capacity_matrix(result, max_columns)
    if value == "headroom":
        tokens = result.steps["tokens"][np.searchsorted(result.steps["step"], steps)]
        matrix = np.where(matrix > 0, matrix - tokens[None, :], 0)
    fig = go.Figure(
        go.Heatmap(
            z=matrix, x=steps, y=labels, colorscale="Viridis", colorbar={"title": "tokens"},
            hovertemplate="step %{x}<br>%{y}<br>" + value + " %{z} tokens<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"{value} per layer (tokens)", xaxis_title="step", template="plotly_white",
        yaxis={"autorange": "reversed"}, margin={"l": 70, "r": 20, "t": 50, "b": 40},
    )
    return fig


def write_html(fig: go.Figure, path: str | Path, div_id: str = "simkv-figure") -> Path:
    """Self-contained HTML (plotly.js inlined), byte-identical for the same figure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(fig.to_html(include_plotlyjs=True, full_html=True, div_id=div_id), encoding="utf-8")
    return path

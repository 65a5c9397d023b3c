"""Plotly figures of a result, shared by the CLI, the dashboard and the experiments.

Colours mean the same thing everywhere: allocated (blue), in-step peak
(light blue), used (green), resident (orange), reallocation events (red).
Figures are deterministic: the same result gives byte-identical HTML.

Long runs can be *decimated* for display (``max_points``): each line keeps, per
bucket of steps, its lowest and highest point, so a one-step reallocation
spike stays visible however long the run; reallocation markers keep the
largest event per bucket (``max_events``). Without these arguments every step
is drawn.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from simkv.ledger import ALLOC, TENSOR_CODE, TENSORS
from simkv.metrics import replacing_allocations
from simkv.scenario import Result

COLORS = {
    "allocated": "#1f77b4",
    "peak": "#9ecae1",
    "used": "#2ca02c",
    "resident": "#ff7f0e",
    "event": "#d62728",
}
#: The KV cache's own buffers (data, quantisation scales, beam tables, linear-attention states).
KV_TENSORS = tuple(t for t in TENSORS if t != "past_view")
#: Colours of the second, third … run in a comparison (none is a quantity's colour).
RUN_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
MIB = 1024 * 1024


_TEMPLATES: dict[str, go.layout.Template] = {}


def _template(fig: go.Figure, name: str = "plotly_white") -> go.Figure:
    """Set a registered template without re-validating it.

    Validation deep-copies the whole template (~14 ms a figure, most of the cost
    of a dashboard update); registered templates are valid already, and plotly
    assigns its default template the same way (``_initialize_layout_template``).
    The figure's JSON is the same as with ``update_layout(template=name)``.
    """
    if name not in _TEMPLATES:  # validated once, exactly as update_layout(template=name) would
        _TEMPLATES[name] = go.Layout(template=pio.templates[name]).template
    layout = fig.layout
    saved = layout._validate
    layout._validate = False
    try:
        layout.template = _TEMPLATES[name]
    finally:
        layout._validate = saved
    return fig


def _layout(fig: go.Figure, title: str, y_title: str = "MiB") -> go.Figure:
    _template(fig)
    fig.update_layout(
        title=title,
        xaxis_title="step",
        yaxis_title=y_title,
        hovermode="x unified",
        legend={"orientation": "h", "y": -0.2},
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return fig


def _alloc_groups(result: Result, tensors: tuple[str, ...] | None = None, reallocations: bool = False):
    """Allocation rows grouped by step: (allocs, steps, first row of each group, rows per group).
    ``reallocations``: only the K/V allocations that replace a live buffer (what the reallocation count counts)."""
    rows = result.ledger.rows
    if reallocations:
        allocs = rows[replacing_allocations(rows)]
    else:
        mask = rows["op"] == ALLOC
        if tensors is not None:
            mask &= np.isin(rows["tensor"], [TENSOR_CODE[t] for t in tensors if t in TENSOR_CODE])
        allocs = rows[mask]
    steps, start, count = np.unique(allocs["step"], return_index=True, return_counts=True)
    return allocs, steps, start, count


def _event_text(allocs: np.ndarray, start: np.ndarray, count: np.ndarray) -> list[str]:
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
    return text


def event_summary(
    result: Result, max_events: int | None = None, tensors: tuple[str, ...] | None = None,
    reallocations: bool = False,
) -> dict[str, np.ndarray]:
    """Per step with allocations: how many, their bytes, and which layers/tensors.

    With ``max_events``, steps are cut into that many equal buckets and only the
    step allocating the most bytes in each bucket is kept (``"total"`` holds how
    many steps had allocations before that). ``tensors`` limits the allocations
    counted to those tensors (e.g. :data:`KV_TENSORS`); ``reallocations`` to the
    K/V allocations that replace a live buffer (:func:`simkv.metrics.replacing_allocations`).
    """
    allocs, steps, start, count = _alloc_groups(result, tensors, reallocations)
    if not len(allocs):
        return {"step": np.empty(0, dtype=np.int64), "count": np.empty(0), "bytes": np.empty(0), "text": [], "total": 0}
    total = np.add.reduceat(allocs["bytes"], start)
    n_events = len(steps)
    if max_events is not None and n_events > max_events:
        lo, hi = int(steps[0]), int(steps[-1])
        bucket = (steps - lo) * max_events // (hi - lo + 1)
        order = np.lexsort((-total, bucket))  # by bucket, largest first
        first = order[np.r_[True, bucket[order][1:] != bucket[order][:-1]]]
        keep = np.sort(first)
        steps, start, count, total = steps[keep], start[keep], count[keep], total[keep]
    return {"step": steps, "count": count, "bytes": total, "text": _event_text(allocs, start, count), "total": n_events}


def decimate_indices(y: np.ndarray, max_points: int | None) -> np.ndarray:
    """Indices of the points of a long line worth drawing: per bucket, its minimum and maximum.

    Keeps the first and last points and at most ``max_points`` in all; spikes
    (a bucket's extreme) are never dropped. ``None`` or a short line: every index.
    """
    y = np.asarray(y)
    n = len(y)
    if max_points is None or n <= max_points:
        return np.arange(n)
    buckets = max(1, (max_points - 2) // 2)
    size = -(-n // buckets)
    buckets = -(-n // size)
    pad = buckets * size - n
    blocks = (np.concatenate([y, np.repeat(y[-1:], pad)]) if pad else y).reshape(buckets, size)
    base = np.arange(buckets) * size
    lo = np.minimum(base + blocks.argmin(axis=1), n - 1)
    hi = np.minimum(base + blocks.argmax(axis=1), n - 1)
    return np.unique(np.concatenate([[0, n - 1], lo, hi]))


def _line(x: np.ndarray, y: np.ndarray, max_points: int | None) -> tuple[np.ndarray, np.ndarray]:
    idx = decimate_indices(y, max_points)
    return (x, y) if len(idx) == len(y) else (x[idx], y[idx])


def timeline(
    result: Result, title: str | None = None, max_points: int | None = None, max_events: int | None = None,
    marker_tensors: tuple[str, ...] | None = None, reallocations: bool = False,
) -> go.Figure:
    """Memory over steps: allocated, in-step peak, used, resident; reallocations marked.

    ``max_points`` decimates each line for display (see :func:`decimate_indices`),
    ``max_events`` keeps the largest reallocation per bucket of steps,
    ``marker_tensors`` marks only allocations of those tensors (e.g.
    :data:`KV_TENSORS`: not the CPU plugin's per-step past-view block);
    ``reallocations`` marks only the steps where a K/V buffer is replaced (those
    :attr:`~simkv.metrics.Metrics.realloc_count` counts; not first allocations),
    and the legend says on how many steps.
    """
    st = result.steps
    x = st["step"]
    fig = go.Figure()
    for name, column, line in (
        ("peak in step", "peak", {"color": COLORS["peak"], "width": 1}),
        ("allocated", "allocated", {"color": COLORS["allocated"]}),
        ("resident", "resident", {"color": COLORS["resident"]}),
        ("used", "used", {"color": COLORS["used"]}),
    ):
        xs, ys = _line(x, st[column], max_points)
        fig.add_scatter(x=xs, y=ys / MIB, name=name, line=line)
    ev = event_summary(result, max_events, marker_tensors, reallocations)
    if len(ev["step"]):
        peak_at = st["peak"][np.searchsorted(x, ev["step"])]
        shown, total = len(ev["step"]), ev["total"]
        if reallocations:
            name = f"reallocations on {total:,} step{'s' if total > 1 else ''}" + (
                f" (the largest {shown:,} marked)" if shown < total else "")
        else:
            name = "reallocation" if shown == total else f"reallocation (largest {shown:,} of {total:,} steps)"
        fig.add_scatter(
            x=ev["step"], y=peak_at / MIB, mode="markers",
            name=name,
            marker={"color": COLORS["event"], "size": 6, "symbol": "triangle-up"},
            text=ev["text"], hovertemplate="step %{x}: %{text}<extra>allocations</extra>",
        )
    return _layout(fig, title or result.scenario.describe())


def compare(
    results: list[Result], labels: list[str], quantity: str = "allocated", max_points: int | None = None
) -> go.Figure:
    """Several runs of the same workload overlaid on one axis (peak shown as a thin line).

    One quantity is drawn, so colours tell the runs apart here (:data:`RUN_COLORS`);
    the first run keeps the quantity's own colour.
    """
    fig = go.Figure()
    for i, (res, label) in enumerate(zip(results, labels)):
        colour = COLORS.get(quantity, COLORS["allocated"]) if i == 0 else RUN_COLORS[(i - 1) % len(RUN_COLORS)]
        st = res.steps
        xs, ys = _line(st["step"], st[quantity], max_points)
        fig.add_scatter(x=xs, y=ys / MIB, name=f"{label}: {quantity}", line={"color": colour})
        if quantity == "allocated":
            xs, ys = _line(st["step"], st["peak"], max_points)
            fig.add_scatter(
                x=xs, y=ys / MIB, name=f"{label}: peak in step",
                line={"color": colour, "dash": "dot", "width": 1},
            )
    return _layout(fig, f"{quantity} — " + " vs ".join(labels))


#: The metrics of :func:`delta_table`: (key, label, unit). Unit "bytes" differences
#: are also given in per cent of the first run.
DELTA_METRICS = (
    ("peak_allocated_bytes", "peak allocated", "bytes"),
    ("peak_resident_bytes", "peak resident", "bytes"),
    ("mean_allocated_bytes", "mean allocated", "bytes"),
    ("waste_pct", "final waste", "%"),
    ("realloc_count", "reallocations", "count"),
    ("bytes_copied", "bytes copied", "bytes"),
    ("max_spike_bytes", "largest spike", "bytes"),
)


def delta_table(results: list[Result], labels: list[str]) -> list[dict]:
    """One row per metric: each run's value and each run's difference from the first run.

    Row keys: ``metric``, ``unit``, then per run ``label`` (the value) and, for
    every run after the first, ``"<label> − <first label>"`` (the difference) and,
    for byte metrics, ``"<label> vs <first label> %"``.
    """
    base_label = labels[0]
    metrics = [r.metrics for r in results]
    out = []
    for key, name, unit in DELTA_METRICS:
        values = [getattr(m, key) for m in metrics]
        row: dict = {"metric": name, "unit": unit}
        for label, value in zip(labels, values):
            row[label] = value
        for label, value in zip(labels[1:], values[1:]):
            row[f"{label} − {base_label}"] = value - values[0]
            if unit == "bytes":
                row[f"{label} vs {base_label} %"] = 100.0 * (value - values[0]) / values[0] if values[0] else None
        out.append(row)
    return out


def capacity_matrix(result: Result, max_columns: int = 1500) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Capacity (tokens) of every K/V data buffer at the end of sampled steps.

    Returns (matrix [buffers × columns], steps sampled, row labels).
    """
    rows = result.ledger.rows
    n_steps = len(result.steps)
    layers = result.scenario.model.layers
    cols = np.unique(np.linspace(0, n_steps - 1, min(max_columns, n_steps)).round().astype(np.int64))
    sampled = result.steps["step"][cols]
    labels = [f"L{layer} {name}" for layer in range(layers) for name in ("k", "v")]
    k, v = TENSOR_CODE["k"], TENSOR_CODE["v"]
    sel = rows[(rows["op"] == ALLOC) & ((rows["tensor"] == k) | (rows["tensor"] == v)) & (rows["layer"] < layers)]
    # Capacity of a buffer row at step s = capacity of its last allocation at or before s:
    # one search over (row, step) keys for every row and sampled step at once.
    row_of = 2 * sel["layer"].astype(np.int64) + (sel["tensor"] == v)
    span = int(max(sampled.max(initial=0), sel["step"].max(initial=0))) + 2
    keys = row_of * span + sel["step"]
    order = np.argsort(keys, kind="stable")
    keys, caps = keys[order], sel["capacity_tokens"][order]
    query = np.arange(2 * layers, dtype=np.int64)[:, None] * span + sampled[None, :]
    idx = np.searchsorted(keys, query, side="right") - 1
    found = (idx >= 0) & (keys[np.maximum(idx, 0)] // span == np.arange(2 * layers)[:, None]) if len(keys) else np.zeros(query.shape, bool)
    matrix = np.where(found, caps[np.maximum(idx, 0)] if len(keys) else 0, 0).astype(np.int64)
    return matrix, sampled, labels


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
    _template(fig)
    fig.update_layout(
        title=f"{value} per layer (tokens)", xaxis_title="step",
        yaxis={"autorange": "reversed"}, margin={"l": 70, "r": 20, "t": 50, "b": 40},
    )
    return fig


#: Lines of :func:`validation_figure`: (row, label, report key, colour key, dash).
VALIDATION_LINES = (
    (1, "measured RSS", "measured_rss_bytes", "resident", "solid"),
    (1, "predicted resident", "predicted_resident_bytes", "resident", "dash"),
    (1, "measured RSS high-water mark in step", "measured_hwm_bytes", "peak", "solid"),
    (1, "predicted peak in step", "predicted_peak_bytes", "peak", "dash"),
    (2, "measured VmSize", "measured_vmsize_bytes", "allocated", "solid"),
    (2, "predicted allocated", "predicted_allocated_bytes", "allocated", "dash"),
)
_PREDICTION_OF = {"measured_rss_bytes": "predicted_resident_bytes", "measured_hwm_bytes": "predicted_peak_bytes",
                  "measured_vmsize_bytes": "predicted_allocated_bytes"}


def validation_figure(report: dict, align: bool = False, title: str | None = None) -> go.Figure:
    """Measured vs predicted memory per step of a ``simkv validate`` report, latency below.

    Rows: RSS and its high-water mark vs predicted resident and in-step peak;
    VmSize vs predicted allocated; latency per step. Predicted lines are dashed,
    measured ones solid, in the colour of the quantity (resident orange, peak
    light blue, allocated blue); reallocation steps are marked red, missing and
    unexpected events where they happen. ``align`` shifts each measured line to
    its prediction on the first step where both exist (compare growth only,
    for predictions that leave out the process's baseline).
    """
    from plotly.subplots import make_subplots

    steps = sorted(report.get("steps") or [], key=lambda s: s["step"])
    x = [s["step"] for s in steps]

    def column(key: str) -> list[float | None]:
        return [None if s.get(key) is None else s[key] / MIB for s in steps]

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, row_heights=[0.45, 0.33, 0.22], vertical_spacing=0.05)
    for row, label, key, colour, dash in VALIDATION_LINES:
        y = column(key)
        if align and key in _PREDICTION_OF:
            ref = column(_PREDICTION_OF[key])
            both = next((i for i, (m, p) in enumerate(zip(y, ref)) if m is not None and p is not None), None)
            if both is not None:
                shift = ref[both] - y[both]
                y = [None if v is None else v + shift for v in y]
                label += f" ({shift:+,.1f} MiB)"
        fig.add_scatter(x=x, y=y, name=label, legendgroup=str(row),
                        line={"color": COLORS[colour], "dash": dash, "width": 1 if colour == "peak" else 2},
                        row=row, col=1)
    realloc = [s for s in steps if s.get("realloc")]
    if realloc:
        fig.add_scatter(
            x=[s["step"] for s in realloc], y=[s["predicted_peak_bytes"] / MIB for s in realloc], mode="markers",
            name="predicted reallocation", marker={"color": COLORS["event"], "size": 7, "symbol": "triangle-up"},
            row=1, col=1,
        )
    by_step = {s["step"]: s for s in steps}
    for status, symbol, colour in (("missing", "x", "#7f7f7f"), ("unexpected", "diamond-open", "#9467bd")):
        events = [e for e in report.get("events") or [] if e.get("status") == status]
        if not events:
            continue
        fig.add_scatter(
            x=[e["step"] for e in events],
            y=[by_step[e["step"]]["predicted_allocated_bytes"] / MIB if e["step"] in by_step else None for e in events],
            mode="markers", name=f"{status} event ({len(events):,})",
            marker={"color": colour, "size": 9, "symbol": symbol},
            text=[f"L{e['layer'] if e.get('layer') is not None else '–'} {e.get('tensor')} {e.get('op')} "
                  f"{(e.get('bytes') or 0) / MIB:.3f} MiB" for e in events],
            hovertemplate="step %{x}: %{text}<extra>" + status + "</extra>", row=2, col=1,
        )
    fig.add_scatter(x=x, y=[s.get("latency_ms") for s in steps], name="latency", line={"color": "#7f7f7f", "width": 1},
                    row=3, col=1)
    if realloc:
        fig.add_scatter(
            x=[s["step"] for s in realloc], y=[s.get("latency_ms") for s in realloc], mode="markers",
            name="latency at reallocation", marker={"color": COLORS["event"], "size": 5}, row=3, col=1,
        )
    total, matched = report.get("events_total", 0), report.get("events_matched", 0)

    def pct(key: str) -> str:
        return "–" if report.get(key) is None else f"{report[key]:+.2f} %"

    default_title = (
        f"validation: {matched:,}/{total:,} events matched, {report.get('events_missing', 0):,} missing, "
        f"{report.get('events_unexpected', 0):,} unexpected; in-step rise error {pct('rise_error_pct')}, "
        f"resident slope error {pct('resident_slope_error_pct')}"
    )
    _layout(fig, title or default_title)
    fig.update_layout(xaxis_title=None, xaxis3_title="step", yaxis_title="RSS, MiB", yaxis2_title="VmSize, MiB",
                      yaxis3_title="ms", legend={"y": -0.16, "yanchor": "top"}, margin={"b": 60})
    return fig


def write_html(fig: go.Figure, path: str | Path, div_id: str = "simkv-figure") -> Path:
    """Self-contained HTML (plotly.js inlined), byte-identical for the same figure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(fig.to_html(include_plotlyjs=True, full_html=True, div_id=div_id), encoding="utf-8")
    return path

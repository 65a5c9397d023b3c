"""Serving figures: the timeline (allocated, used and in-use memory and step time over simulated time) with
the pool and KV budget drawn, the per-request timeline and the waste breakdown."""

from __future__ import annotations

import numpy as np

#: Points per line at most (a one-hour trace has ~10^6 steps).
MAX_POINTS = 20_000
GIB = 1024**3


def serving_timeline(result, max_points: int = MAX_POINTS, webgl: bool = True):
    """``max_points`` per line at most; ``webgl=False`` draws SVG lines (a page without a GPU draws
    WebGL slowly: the dashboard's)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    s = result.steps
    trace = go.Scattergl if webgl else go.Scatter
    if len(s) > max_points:  # bounded page: per bucket of steps, the step with the highest in-step peak
        edges = np.linspace(0, len(s), max_points + 1).astype(np.int64)
        idx = np.array([a + int(np.argmax(s["peak_bytes"][a:b])) for a, b in zip(edges[:-1], edges[1:])])
        s = s[idx]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.05)
    t = s["time_s"]
    fig.add_trace(trace(x=t, y=s["peak_bytes"] / GIB, name="in-step peak", line=dict(dash="dot")), 1, 1)
    fig.add_trace(trace(x=t, y=s["allocated_bytes"] / GIB, name="allocated"), 1, 1)
    fig.add_trace(trace(x=t, y=(s["allocated_bytes"] - s["reserved_bytes"]) / GIB, name="in use"), 1, 1)
    fig.add_trace(trace(x=t, y=s["used_bytes"] / GIB, name="used (tokens)"), 1, 1)
    fig.add_trace(trace(x=t, y=s["step_s"] * 1000, name="step time (ms)"), 2, 1)
    fig.update_yaxes(title_text="GiB", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=2, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=2, col=1)
    fig.update_layout(title="simkv serving: " + result.spec.model.name, template="plotly_white")
    return fig


def with_pool(fig, result):
    """``fig`` (a :func:`serving_timeline`) with the paged pool's size over time and the KV budget
    (device memory less the weights) drawn on the memory panel."""
    import plotly.graph_objects as go

    s, sp = result.steps, result.spec
    top = float(s["peak_bytes"].max()) / GIB if len(s) else 0.0
    if sp.memory == "paged" and result.block_bytes and len(s):
        total = s["blocks_total"]
        pool = s["allocated_bytes"]  # the KV pool's blocks (and a hybrid model's state pool)
        change = np.flatnonzero(np.diff(pool)) + 1  # the pool only changes size at a few steps
        idx = np.concatenate([[0], change, [len(s) - 1]])
        fixed = not sp.paged.dynamic
        fig.add_trace(go.Scatter(x=s["time_s"][idx], y=pool[idx] / GIB, mode="lines",
                                   line=dict(shape="hv", color="black", width=1),
                                   name=f"pool ({'fixed' if fixed else 'dynamic'}, {int(total[-1]):,} blocks)"), 1, 1)
    budget = (sp.device_memory - sp.weights_bytes) / GIB
    label = f"KV budget {budget:,.2f} GiB (device {sp.device_memory / GIB:,.2f} GiB − weights)"
    if budget <= 1.25 * max(top, 1e-9):
        fig.add_hline(y=budget, line=dict(color="#d62728", dash="dash", width=1), row=1, col=1,
                      annotation_text=label, annotation_position="top left")
    else:
        fig.add_annotation(text=label + ", above the scale", xref="x domain", yref="y domain", x=0, y=1.0,
                           showarrow=False, xanchor="left", yanchor="bottom", font=dict(size=11, color="#d62728"))
    return fig


def _segments(x0, x1, ys):
    """Horizontal segments (x0→x1 at y) as one line trace's x/y, separated by gaps (None)."""
    n = len(ys)
    x = np.empty(3 * n, dtype=object)
    y = np.empty(3 * n, dtype=object)
    x[0::3], x[1::3], x[2::3] = x0, x1, None
    y[0::3], y[1::3], y[2::3] = ys, ys, None
    return x.tolist(), y.tolist()


def request_timeline(result, color: str = "#1f77b4"):
    """One row per request: waiting and prefill (arrival → first token) light, decoding (first token →
    finish) in ``color``; preempted requests marked at their finish (at their arrival if they never
    finished), ignored and rejected ones at their arrival, unfinished ones at the end of the run."""
    import plotly.graph_objects as go

    t = result.request_table
    arrival = t["arrival_s"].astype(float)
    first = arrival + t["ttft_s"].astype(float)
    finish = arrival + t["e2e_s"].astype(float)
    end = float(result.steps["time_s"][-1]) if len(result.steps) else 0.0
    status = t["status"].astype(str)
    pre = t["preemptions"].astype(np.int64)
    row = np.arange(len(arrival))
    fig = go.Figure()
    started = ~np.isnan(first)
    last = np.where(np.isnan(finish), end, finish)  # unfinished: to the end of the run
    x, y = _segments(arrival[started], first[started], row[started])
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line=dict(color=color, width=2), opacity=0.35,
                               name="arrival → first token", hoverinfo="skip"))
    x, y = _segments(first[started], last[started], row[started])
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line=dict(color=color, width=2),
                               name="first token → finish", hoverinfo="skip"))
    hover = [f"request {i}: {s}, prompt {p:,}, {g:,}/{n:,} tokens, {k} preemptions" for i, s, p, g, n, k in
             zip(t["id"], status, t["prompt"], t["generated"], t["max_new_tokens"], pre)]
    done = np.where(np.isnan(finish), arrival, finish)  # where a request's preemptions are marked
    marks = [("preempted", pre > 0, done, dict(symbol="x", color="black", size=7)),
             ("ignored / rejected", np.isin(status, ("IGNORED", "REJECTED")), arrival,
              dict(symbol="circle-open", color="#d62728", size=8)),
             ("unfinished", status == "UNFINISHED", last, dict(symbol="triangle-right", color="#9467bd", size=8))]
    for name, mask, at, marker in marks:
        if mask.any():
            fig.add_trace(go.Scatter(x=at[mask], y=row[mask], mode="markers", marker=marker,
                                       name=f"{name} ({int(mask.sum()):,})",
                                       text=[h for h, m in zip(hover, mask) if m], hoverinfo="text+x"))
    fig.add_trace(go.Scatter(x=arrival, y=row, mode="markers", marker=dict(color=color, size=3), name="arrival",
                               text=hover, hoverinfo="text+x", showlegend=False))
    fig.update_layout(template="plotly_white", title="requests: arrival, first token, finish",
                      xaxis_title="simulated time (s)", yaxis_title="request (arrival order)",
                      legend=dict(orientation="h", y=-0.2))
    fig.update_yaxes(autorange="reversed")
    return fig


#: Waste categories, bottom to top, with their bar pattern (the colour is the policy's).
WASTE_PARTS = (("used (tokens' KV)", ""), ("internal (last-block slack)", "/"),
               ("reserved, unused (free pool blocks)", "."), ("headroom (buffers beyond the tokens)", "x"),
               ("transient (in-step peak above allocated)", "-"))


def waste_breakdown(result, color: str = "#1f77b4"):
    """Time-weighted mean memory by what it holds, from ``result.metrics``: the tokens' KV, internal
    waste, free pool blocks, the rest of allocated-but-unused (contiguous buffers' headroom), and the
    transient in-step peak above allocated."""
    import plotly.graph_objects as go

    m = result.metrics
    alloc = m["mean_allocated_bytes"]
    rest = m["waste_bytes"] - m["waste_reserved_bytes"] - m["waste_internal_bytes"]
    values = (alloc - m["waste_bytes"], m["waste_internal_bytes"], m["waste_reserved_bytes"], rest,
              m["waste_transient_bytes"])
    fig = go.Figure()
    for (name, shape), v in zip(WASTE_PARTS, values):
        if abs(v) <= 1e-6 * max(alloc, 1):  # e.g. no free pool blocks with contiguous buffers, no headroom
            continue  # in a paged pool (there: the rounding of three time-weighted means, a byte or two)
        share = f"{100 * v / alloc:.1f} % of allocated" if alloc else ""
        fig.add_trace(go.Bar(x=["mean memory"], y=[v / GIB], name=name, marker=dict(color=color, pattern_shape=shape,
                             line=dict(color="white", width=1)), opacity=1.0 if not shape else 0.75,
                             hovertemplate=f"{name}: %{{y:.3f}} GiB ({share})<extra></extra>"))
    fig.update_layout(template="plotly_white", barmode="stack", title=f"waste: {m['waste_pct']:.1f} % of allocated",
                      yaxis_title="GiB (time-weighted mean)", legend=dict(traceorder="reversed", orientation="h",
                                                                          y=-0.12, yanchor="top"))
    return fig

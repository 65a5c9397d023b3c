"""The serving timeline: allocated, used and in-use memory and step time over simulated time."""

from __future__ import annotations

import numpy as np

#: Points per line at most (a one-hour trace has ~10^6 steps).
MAX_POINTS = 20_000


def serving_timeline(result):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    s = result.steps
    if len(s) > MAX_POINTS:  # bounded page: per bucket of steps, the step with the highest in-step peak
        edges = np.linspace(0, len(s), MAX_POINTS + 1).astype(np.int64)
        idx = np.array([a + int(np.argmax(s["peak_bytes"][a:b])) for a, b in zip(edges[:-1], edges[1:])])
        s = s[idx]
    gib = 1024**3
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.05)
    t = s["time_s"]
    fig.add_trace(go.Scattergl(x=t, y=s["peak_bytes"] / gib, name="in-step peak", line=dict(dash="dot")), 1, 1)
    fig.add_trace(go.Scattergl(x=t, y=s["allocated_bytes"] / gib, name="allocated"), 1, 1)
    fig.add_trace(go.Scattergl(x=t, y=(s["allocated_bytes"] - s["reserved_bytes"]) / gib, name="in use"), 1, 1)
    fig.add_trace(go.Scattergl(x=t, y=s["used_bytes"] / gib, name="used (tokens)"), 1, 1)
    fig.add_trace(go.Scattergl(x=t, y=s["step_s"] * 1000, name="step time (ms)"), 2, 1)
    fig.update_yaxes(title_text="GiB", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=2, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=2, col=1)
    fig.update_layout(title="simkv serving: " + result.spec.model.name, template="plotly_white")
    return fig

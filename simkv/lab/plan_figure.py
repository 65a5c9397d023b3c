"""The figure of a plan (``simkv plan --figure``, the dashboard's Plan view): cost against each SLO latency,
one panel per SLO — every deployment that served every request, by device kind, the Pareto front as a line,
the limit as a dashed line, the recommendation ringed."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

#: One colour per device kind, in the plan's --devices order (plotly's default qualitative sequence).
DEVICE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def plan_figure(result) -> go.Figure:
    slo = result.target.slo
    fig = make_subplots(rows=1, cols=len(slo), subplot_titles=[str(s) for s in slo], horizontal_spacing=0.12)
    rec = result.recommended
    devices = list(result.space.devices)
    for col, s in enumerate(slo, start=1):
        key = s.name + "_s"
        served = [r for r in result.rows if r["status"] in ("ok", "slo") and r[key] is not None]
        for k, device in enumerate(devices):
            pts = [r for r in served if r["device"] == device]
            if not pts:
                continue
            fig.add_trace(go.Scatter(
                x=[result.cost(r) for r in pts], y=[r[key] * 1000 for r in pts], mode="markers",
                name=device, legendgroup=device, showlegend=col == 1,
                marker={"color": DEVICE_COLORS[k % len(DEVICE_COLORS)], "size": 9, "symbol": ["circle" if r["meets_slo"] else "x" for r in pts]},
                hovertext=[_hover(r, result) for r in pts], hoverinfo="text"), row=1, col=col)
        front = result.fronts.get(s.name, [])
        if front:
            fig.add_trace(go.Scatter(x=[result.cost(r) for r in front], y=[r[key] * 1000 for r in front],
                                     mode="lines", line={"shape": "hv", "color": "#555", "width": 1},
                                     name="Pareto front", legendgroup="front", showlegend=col == 1,
                                     hoverinfo="skip"), row=1, col=col)
        fig.add_hline(y=s.limit_s * 1000, line_dash="dash", line_color="#c0392b", row=1, col=col)
        if rec is not None:
            fig.add_trace(go.Scatter(x=[result.cost(rec)], y=[rec[key] * 1000], mode="markers",
                                     marker={"size": 18, "symbol": "circle-open", "color": "#111", "line": {"width": 2}},
                                     name="recommended", legendgroup="rec", showlegend=col == 1,
                                     hoverinfo="skip"), row=1, col=col)
        # (a log axis labels 1, 2 and 5 of each decade in full, with separators: 2,000 ms, not "2" after 1,000)
        fig.update_yaxes(title_text=f"{s.name} (ms)", type="log", tickformat=",~f", dtick="D2", row=1, col=col)
        fig.update_xaxes(title_text=f"cost ({result.unit})", row=1, col=col)
    fig.update_layout(template="plotly_white", height=420, separators=".,", margin={"t": 60, "l": 60, "r": 20, "b": 50},
                      title=f"simkv plan: {result.target.model} — cost vs latency (x: misses the SLO)")
    return fig


def _hover(row: dict, result) -> str:
    from simkv.lab.plan import describe

    lat = ", ".join(f"{s.name} {row[s.name + '_s'] * 1000:.1f} ms" for s in result.target.slo)
    return f"{describe(row)}<br>{lat}<br>{'meets the SLO' if row['meets_slo'] else row['reason']}"

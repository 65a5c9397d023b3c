"""Figures and a self-contained HTML report of a ``simkv validate`` result.

Every function takes the JSON dict that ``simkv validate --json`` prints (or
``--out`` writes), so the dashboard and the experiments draw the same figures from a
saved file. Plotly only; no OpenVINO. Measured quantities are solid lines,
predicted ones dashed, in the colours of :mod:`simkv.figures` (resident orange,
allocated blue, in-step peak light blue, reallocation steps red).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["memory_figure", "rise_figure", "latency_figure", "events_figure", "figures", "write_report", "emit", "DIV_IDS"]

MIB = 1024 * 1024
COLORS = {"resident": "#ff7f0e", "allocated": "#1f77b4", "peak": "#6baed6", "event": "#d62728", "latency": "#555555"}
#: Deterministic div ids of the report's figures (the dashboard may reuse them).
DIV_IDS = {
    "memory": "simkv-validate-memory",
    "rise": "simkv-validate-rise",
    "latency": "simkv-validate-latency",
    "events": "simkv-validate-events",
}


def _col(data: dict, key: str) -> np.ndarray:
    return np.array([np.nan if s.get(key) is None else s[key] for s in data["steps"]], dtype=np.float64)


def _layout(fig: go.Figure, title: str) -> go.Figure:
    fig.update_layout(template="plotly_white", title=title, hovermode="x unified",
                      legend={"orientation": "h", "y": -0.15}, margin={"l": 60, "r": 20, "t": 60, "b": 60})
    return fig


def _realloc_steps(data: dict) -> np.ndarray:
    return np.array([s["step"] for s in data["steps"] if s.get("realloc")], dtype=np.int64)


def memory_figure(data: dict) -> go.Figure:
    """Three panels sharing the step axis (MiB): RSS vs predicted resident, with the
    in-step peaks (VmHWM vs predicted) at the reallocation steps; measured minus
    predicted resident (what the simulator does not model: allocator retention,
    non-KV growth); VmSize vs predicted allocated."""
    x = _col(data, "step")
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07, row_heights=[0.45, 0.2, 0.35],
                        subplot_titles=("RSS (resident)", "RSS minus predicted resident", "VmSize (address space)"))
    traces = (
        (1, "measured RSS", "measured_rss_bytes", COLORS["resident"], "solid"),
        (1, "predicted resident (baseline + KV)", "predicted_resident_bytes", COLORS["resident"], "dash"),
        (3, "measured VmSize", "measured_vmsize_bytes", COLORS["allocated"], "solid"),
        (3, "predicted allocated (baseline + KV)", "predicted_allocated_bytes", COLORS["allocated"], "dash"),
    )
    for row, name, key, color, dash in traces:
        y = _col(data, key)
        if np.all(np.isnan(y)):
            continue
        fig.add_scatter(x=x, y=y / MIB, name=name, line={"color": color, "dash": dash, "width": 1.5}, row=row, col=1)
    diff = _col(data, "measured_rss_bytes") - _col(data, "predicted_resident_bytes")
    if not np.all(np.isnan(diff)):
        fig.add_scatter(x=x, y=diff / MIB, name="RSS - predicted resident", line={"color": "#7f7f7f", "width": 1},
                        row=2, col=1)
    rs = _realloc_steps(data)
    if len(rs):
        hwm = _col(data, "measured_hwm_bytes")[rs]
        if not np.all(np.isnan(hwm)):
            fig.add_scatter(x=rs, y=hwm / MIB, mode="markers", name="measured VmHWM in reallocation step",
                            marker={"color": COLORS["peak"], "symbol": "circle-open", "size": 9}, row=1, col=1)
        fig.add_scatter(x=rs, y=_col(data, "predicted_peak_bytes")[rs] / MIB, mode="markers",
                        name="predicted in-step peak (reallocation step)",
                        marker={"color": COLORS["event"], "symbol": "triangle-up", "size": 7}, row=1, col=1)
    for row in (1, 2, 3):
        fig.update_yaxes(title_text="MiB", row=row, col=1)
    fig.update_xaxes(title_text="step", row=3, col=1)
    fig.update_layout(height=850)
    return _layout(fig, "Memory: measured (solid) vs predicted (dashed)")


def rise_figure(data: dict) -> go.Figure:
    """Increase of RSS inside every reallocation step: measured (VmHWM of the step minus
    RSS before it) vs predicted (``resident_peak`` minus ``resident`` before it); steps
    whose small KV buffers lie in the glibc heap are greyed out and carry no error."""
    rises = data.get("rises") or []
    fig = go.Figure()
    if rises:
        steps = [str(r["step"]) for r in rises]
        fig.add_bar(x=steps, y=[r["measured_rise_bytes"] / MIB for r in rises], name="measured rise",
                    marker_color=[COLORS["peak"] if r["comparable"] else "#cccccc" for r in rises])
        fig.add_bar(x=steps, y=[r["predicted_rise_bytes"] / MIB for r in rises], name="predicted rise",
                    marker_color=COLORS["allocated"],
                    text=[(f"{r['error_pct']:+.1f} %" if r["error_pct"] is not None else "not comparable")
                          for r in rises], textposition="outside")
    fig.update_layout(barmode="group", xaxis_title="reallocation step", yaxis_title="MiB")
    return _layout(fig, "RSS increase inside each reallocation step")


def latency_figure(data: dict) -> go.Figure:
    """Latency per step (clean run), reallocation steps marked."""
    x = _col(data, "step")
    y = _col(data, "latency_ms")
    fig = go.Figure()
    fig.add_scatter(x=x, y=y, mode="lines", name="latency", line={"color": COLORS["latency"], "width": 1})
    rs = _realloc_steps(data)
    if len(rs) and not np.all(np.isnan(y)):
        fig.add_scatter(x=rs, y=y[rs], mode="markers", name="KV (re)allocation step",
                        marker={"color": COLORS["event"], "symbol": "triangle-up", "size": 8})
    fig.update_layout(xaxis_title="step", yaxis_title="ms", yaxis_type="log")
    return _layout(fig, "Latency per step (clean run)")


def events_figure(data: dict) -> go.Figure:
    """Event table: per tensor kind and op, matched / missing / unexpected counts."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for e in data["events"]:
        c = counts.setdefault((e["tensor"], e["op"]), {"matched": 0, "missing": 0, "unexpected": 0})
        c[e["status"]] += 1
    keys = sorted(counts)
    cols = [[k[0] for k in keys] + ["all"], [k[1] for k in keys] + [""]]
    for s in ("matched", "missing", "unexpected"):
        cols.append([counts[k][s] for k in keys] + [sum(counts[k][s] for k in keys)])
    fig = go.Figure(go.Table(
        header={"values": ["tensor", "op", "matched", "missing", "unexpected"], "align": "left"},
        cells={"values": cols, "align": "left"},
    ))
    fig.update_layout(height=120 + 28 * (len(keys) + 1))
    return _layout(fig, f"KV events: {data['events_matched']:,} of {data['events_total']:,} matched")


def figures(data: dict) -> dict[str, go.Figure]:
    return {"memory": memory_figure(data), "rise": rise_figure(data), "latency": latency_figure(data),
            "events": events_figure(data)}


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:+.2f} %"
    return str(v)


def _rise(data: dict) -> str:
    r = data.get("rise")
    if not r:
        return "n/a"
    if not r["comparable_steps"]:
        return f"not comparable (0 of {r['steps']} steps: prompt steps, or KV buffers in the glibc heap)"
    return (f"{_fmt(r['worst_error_pct'])} ({_fmt(r['median_error_pct'])}) over {r['comparable_steps']} of "
            f"{r['steps']} reallocation steps")


def _table(rows: list[tuple[str, object]]) -> str:
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def write_report(data: dict, path: str | Path) -> Path:
    """A self-contained HTML page: summary, figures (plotly.js inlined once,
    deterministic div ids), mismatching events, versions. Byte-identical for the
    same dict."""
    from plotly.offline import get_plotlyjs

    from .compare import summary_lines

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sc, v = data.get("scenario", {}), data.get("versions", {})
    ok = data["events_missing"] == 0 and data["events_unexpected"] == 0
    summary = _table([
        ("result", "PASS: every KV event matched" if ok else "FAIL: KV events differ"),
        ("events matched / total", f"{data['events_matched']:,} / {data['events_total']:,}"),
        ("missing / unexpected", f"{data['events_missing']:,} / {data['events_unexpected']:,}"),
        ("effective KV precision", data.get("effective_kv_precision")),
        ("fused stateful SDPA", data.get("fused")),
        ("in-step rise error, worst (median)", _rise(data)),
        ("resident slope error", _fmt(data.get("resident_slope_error_pct"))
         + (f" (not comparable: {(data.get('resident_slope') or {}).get('not_comparable')})"
            if (data.get("resident_slope") or {}).get("not_comparable") else "")),
        ("final RSS vs baseline + KV", _fmt(data.get("rss_error_pct"))
         + ("" if data.get("rss_error_pct") is not None or not data.get("rss")
            else f" (not comparable: {data['rss']['final']['not_comparable']})")),
        ("baseline", (data.get("baseline") or {}).get("how", "n/a")),
    ])
    scenario = _table([(k, json.dumps(val) if isinstance(val, (dict, list)) else val) for k, val in sc.items()])
    flags = v.get("cpu_flags") or {}
    versions = _table([(k, val) for k, val in v.items() if k != "cpu_flags"]
                      + [("cpu flags", ", ".join(f"{k}={'yes' if on else 'no'}" for k, on in flags.items()))])
    bad = [e for e in data["events"] if e["status"] != "matched"][:200]
    mism = ("<p>None: every observed KV event was predicted, in order, with its size.</p>" if not bad else
            "<table><tr><th>step</th><th>status</th><th>op</th><th>tensor</th><th>layer</th><th>bytes</th></tr>"
            + "".join(f"<tr><td>{e['step']}</td><td>{e['status']}</td><td>{e['op']}</td><td>{e['tensor']}</td>"
                      f"<td>{e['layer']}</td><td>{e['bytes']:,}</td></tr>" for e in bad) + "</table>")
    divs = "\n".join(
        fig.to_html(full_html=False, include_plotlyjs=False, div_id=DIV_IDS[name])
        for name, fig in figures(data).items()
    )
    reproduce = ("simkv validate " + " ".join(
        f"--{k.replace('_', '-')} {val}" for k, val in (
            ("layers", sc.get("layers")), ("heads", sc.get("heads")), ("kv_heads", sc.get("kv_heads")),
            ("head_dim", sc.get("head_dim")), ("ops", sc.get("workload")),
            ("precision", sc.get("requested_kv_precision")),
            ("inference_precision", sc.get("requested_inference_precision"))) if val is not None))
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>simkv validate</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;margin:1em 0}}
th,td{{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:90%}}pre{{background:#f6f6f6;padding:1em}}</style>
<script type="text/javascript">{get_plotlyjs()}</script></head><body>
<h1>simkv validate: OpenVINO CPU plugin vs the <code>openvino-cpu</code> policy</h1>
{summary}
<pre>{html.escape(chr(10).join(summary_lines(data)))}</pre>
<p>Events come from a memray-tracked run (every allocation and free of the plugin's KV buffers, in order);
RSS, VmSize, VmHWM and latency from a second, untracked run started with
<code>MALLOC_MMAP_THRESHOLD_={html.escape(str(v.get('MALLOC_MMAP_THRESHOLD_')))}</code>.
Predicted absolute memory = baseline + predicted KV; {html.escape((data.get('baseline') or {}).get('how', ''))}.</p>
{divs}
<h2>Events that differ</h2>{mism}
<h2>Scenario</h2>{scenario}
<h2>Versions (to reproduce)</h2>{versions}
<pre>{html.escape(reproduce)}</pre>
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path


def events_ok(data: dict) -> bool:
    """The event validators' verdict: no KV event missing or unexpected."""
    return data["events_missing"] == 0 and data["events_unexpected"] == 0


def emit(args, data: dict, *, summary_lines=None, report=None, ok=events_ok) -> int:
    """Write and print a validation result as the command line asked (``--out``, ``--report``,
    ``--json``, else the summary lines); the exit code is 0 only if ``ok(data)``, else 1.
    ``summary_lines``/``report`` default to the event validators' (:mod:`simkv.validate.compare`, :func:`write_report`)."""
    import sys

    if args.out:  # its folder exists: the command line was checked before the run (simkv.flags)
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    if args.report:
        (report or write_report)(data, args.report)
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        if summary_lines is None:
            from simkv.validate.compare import summary_lines
        print("\n".join(summary_lines(data)))
        for what, path in (("json", args.out), ("report", args.report)):
            if path:
                print(f"  {what:<22}{path}")
    return 0 if ok(data) else 1

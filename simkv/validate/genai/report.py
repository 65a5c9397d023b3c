"""A ``simkv validate --paged`` result as the command shows it: verdict and summary lines, figure and
self-contained HTML report (plotly only, no OpenVINO).

Takes the JSON dict ``simkv validate --paged --json`` prints; reuses the table and layout helpers of
:mod:`simkv.validate.report` (the event validators' report).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["ok", "verdict", "summary_lines", "steps_figure", "write_report"]


def ok(data: dict) -> bool:
    a = data["allocations"]
    return not data["workload_errors"] and data["steps_mismatched"] == 0 and a["events_missing"] == 0 and a["events_unexpected"] == 0


def verdict(data: dict) -> str:
    a = data["allocations"]
    if ok(data):
        return "PASS: every step matched" + (" and every pool allocation" if a["compared"] else "")
    why = [f"{len(data['workload_errors'])} workload(s) failed"] if data["workload_errors"] else []
    if data["steps_mismatched"]:
        why.append(f"{data['steps_mismatched']:,} step(s) differ")
    if a["events_missing"] or a["events_unexpected"]:
        why.append("pool allocations differ")
    return "FAIL: " + ", ".join(why)


def summary_lines(data: dict) -> list[str]:
    a = data["allocations"]
    lines = [
        "simkv validate --paged: OpenVINO GenAI ContinuousBatchingPipeline (CPU) vs simkv's paged model",
        f"  {'result':<24}{verdict(data)}",
        f"  {'workloads':<24}{data['workloads_matched']:,} of {data['workloads_total']:,} matched"
        + (f" ({len(data['workloads_excluded'])} left out: the pipeline crashes on them without cache eviction too)"
           if data.get("workloads_excluded") else ""),
        f"  {'steps matched / total':<24}{data['steps_matched']:,} / {data['steps_total']:,}"
        + (f" ({data['bounded_steps']:,} with beam search: blocks within bounds)" if data["bounded_steps"] else ""),
        f"  {'KV precision':<24}{data['kv_precision']} ({data['block_bytes']:,} B per block, all layers, K+V)",
    ]
    if a["compared"]:
        lines.append(f"  {'pool allocations':<24}{a['events_matched']:,} / {a['events_total']:,} matched "
                     f"({a['events_missing']} missing, {a['events_unexpected']} unexpected)")
    else:
        lines.append(f"  {'pool allocations':<24}{a['real_events']:,} observed (not compared)")
    stops, evicted = data.get("stops"), data.get("evicted_blocks")
    if evicted or stops and stops["total"]:
        lines.append(f"  {'cache eviction':<24}{evicted or 0:,} blocks dropped; step() threw in "
                     f"{stops['total']} workload(s), {stops['matched']} at the step and check simkv predicts")
    for e in data["workload_errors"][:5]:
        lines.append(f"  {'workload failed':<24}workload {e['workload']}: {e['error']}")
    for m in data["first_mismatches"][:5]:
        fields = ", ".join(f"{k} real {v['real']} sim {v['simulated']}" for k, v in list(m["fields"].items())[:4])
        lines.append(f"  {'mismatch':<24}workload {m['workload']} step {m['step']}: {fields}")
    lines.append(f"  {'time':<24}{data['elapsed_s']:.1f} s")
    return lines


def steps_figure(data: dict):
    """Blocks in use and pool size per step, real (solid) vs simulated (dashed), for a single workload."""
    import plotly.graph_objects as go

    from ..report import COLORS, _layout

    steps = (data["workloads"][0].get("steps") or []) if data["workloads"] else []
    fig = go.Figure()
    for key, color in (("blocks_used", COLORS["resident"]), ("blocks_total", COLORS["allocated"]),
                       ("scheduled_requests", COLORS["latency"])):
        for side, dash in (("real", "solid"), ("simulated", "dash")):
            xs = [s["step"] for s in steps if s[side] is not None]
            ys = [s[side][key] for s in steps if s[side] is not None]
            fig.add_scatter(x=xs, y=ys, name=f"{side} {key}", line={"color": color, "dash": dash, "width": 1.5})
    bad = [m["step"] for m in data["first_mismatches"] if m["workload"] == 0]
    if bad:
        fig.add_scatter(x=bad, y=[0] * len(bad), mode="markers", name="mismatching step",
                        marker={"color": COLORS["event"], "symbol": "x", "size": 9})
    fig.update_layout(xaxis_title="step", yaxis_title="blocks / requests")
    return _layout(fig, "Per step: real (solid) vs simulated (dashed)")


def write_report(data: dict, path: str | Path) -> Path:
    """A self-contained HTML page: summary, the per-step figure (one workload), mismatches, workloads,
    versions. Byte-identical for the same dict."""
    import html

    from plotly.offline import get_plotlyjs

    from ..report import _table

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    a = data["allocations"]
    summary = _table([
        ("result", verdict(data)),
        ("steps matched / total", f"{data['steps_matched']:,} / {data['steps_total']:,}"),
        ("workloads matched / total", f"{data['workloads_matched']:,} / {data['workloads_total']:,}"),
        ("beam-search steps (blocks within bounds)", data["bounded_steps"]),
        ("KV precision, block bytes", f"{data['kv_precision']}, {data['block_bytes']:,} B"),
        ("pool allocations matched / total", f"{a['events_matched']:,} / {a['events_total']:,}" if a["compared"]
         else f"{a['real_events']:,} observed, not compared"),
        ("plugin transients (same size, freed in the step)", a["plugin_transients"]),
    ])
    rows = "".join(
        f"<tr><td>{m['workload']}</td><td>{m['step']}</td><td>{html.escape(json.dumps(m['fields']))}</td></tr>"
        for m in data["first_mismatches"])
    mism = ("<p>None.</p>" if not rows else
            f"<table><tr><th>workload</th><th>step</th><th>fields (real vs simulated)</th></tr>{rows}</table>")
    wl = "".join(
        f"<tr><td>{w['index']}</td><td>{w['comparison']['steps_matched']:,} / {w['comparison']['steps_total']:,}</td>"
        f"<td>{html.escape(json.dumps(w['scheduler']))}</td><td>{len(w['requests'])}</td>"
        f"<td>{w['real_s']:.2f}</td></tr>" for w in data["workloads"][:500])
    fig = ""
    if len(data["workloads"]) == 1 and data["workloads"][0].get("steps"):
        fig = steps_figure(data).to_html(full_html=False, include_plotlyjs=False, div_id="simkv-paged-steps")
    versions = _table([(k, v) for k, v in data["versions"].items() if k != "cpu_flags"])
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>simkv validate --paged</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;margin:1em 0}}
th,td{{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:90%}}pre{{background:#f6f6f6;padding:1em}}</style>
<script type="text/javascript">{get_plotlyjs()}</script></head><body>
<h1>simkv validate --paged: OpenVINO GenAI continuous batching vs simkv's paged model</h1>
{summary}
<pre>{html.escape(chr(10).join(summary_lines(data)))}</pre>
{fig}
<h2>First mismatching steps</h2>{mism}
<h2>Workloads</h2><table><tr><th>#</th><th>steps matched</th><th>scheduler</th><th>requests</th><th>real s</th></tr>{wl}</table>
<h2>Versions</h2>{versions}
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path

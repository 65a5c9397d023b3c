"""Reading a ``simkv validate`` JSON report (upload or path) for the validation tab.

The report's shape (written by :mod:`simkv.validate`)::

    {"events_total", "events_matched", "events_missing", "events_unexpected": int,
     "effective_kv_precision": str, "fused": bool,
     "rise_error_pct", "resident_slope_error_pct": float (null: not comparable),
     "scenario": {...}, "versions": {...},
     "steps": [{"step", "phase", "measured_rss_bytes", "measured_vmsize_bytes",
                "measured_hwm_bytes" (int or null), "predicted_resident_bytes",
                "predicted_allocated_bytes", "predicted_peak_bytes", "latency_ms",
                "realloc": bool}],
     "events": [{"step", "layer" (int or null), "tensor", "op", "bytes",
                 "status": "matched" | "missing" | "unexpected"}]}
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path

from simkv.errors import SimkvError
from simkv.units import format_bytes

MAX_REPORT_BYTES = 64 * 1024 * 1024
#: Events sent to the browser's table at most (the figure marks all mismatches).
MAX_EVENT_ROWS = 5000

SUMMARY_KEYS = {
    "events_total": int, "events_matched": int, "events_missing": int, "events_unexpected": int,
    "effective_kv_precision": str, "fused": bool, "rise_error_pct": (int, float),
    "resident_slope_error_pct": (int, float),
}
#: Summary values a run without measurements leaves empty (``null``).
NULLABLE = {"rise_error_pct", "resident_slope_error_pct", "effective_kv_precision"}
STEP_KEYS = ("step", "phase", "measured_rss_bytes", "measured_vmsize_bytes", "measured_hwm_bytes",
             "predicted_resident_bytes", "predicted_allocated_bytes", "predicted_peak_bytes", "latency_ms", "realloc")
EVENT_KEYS = ("step", "layer", "tensor", "op", "bytes", "status")
STATUSES = ("matched", "missing", "unexpected")


class ReportError(SimkvError):
    """A file that is not a readable ``simkv validate`` report."""


def check_report(report: object) -> dict:
    """The report if it has the expected shape, else :class:`ReportError` naming the first problem."""
    if not isinstance(report, dict):
        raise ReportError("not a simkv validate report: the JSON is not an object")
    for key, kind in SUMMARY_KEYS.items():
        if key not in report:
            raise ReportError(f"not a simkv validate report: missing {key!r}")
        if report[key] is None and key in NULLABLE:
            continue
        if not isinstance(report[key], kind) or (kind is int and isinstance(report[key], bool)):
            raise ReportError(f"{key!r} has the wrong type ({type(report[key]).__name__})")
    for name, keys in (("steps", STEP_KEYS), ("events", EVENT_KEYS)):
        items = report.get(name)
        if not isinstance(items, list):
            raise ReportError(f"not a simkv validate report: {name!r} must be a list")
        for i, item in enumerate(items):
            missing = [k for k in keys if not isinstance(item, dict) or k not in item]
            if missing:
                raise ReportError(f"{name}[{i}] lacks {', '.join(missing)}")
    for i, step in enumerate(report["steps"]):
        for key in STEP_KEYS[2:9]:
            if step[key] is not None and not isinstance(step[key], (int, float)):
                raise ReportError(f"steps[{i}].{key} is not a number")
    for i, event in enumerate(report["events"]):
        if event["status"] not in STATUSES:
            raise ReportError(f"events[{i}].status must be matched, missing or unexpected, got {event['status']!r}")
    return report


def parse_report(text: str | bytes) -> dict:
    try:
        return check_report(json.loads(text))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ReportError(f"not JSON: {err}") from None


def load_upload(contents: str) -> dict:
    """A report from a ``dcc.Upload`` ``contents`` string (``data:…;base64,…``)."""
    _, _, data = (contents or "").partition(",")
    try:
        raw = base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        raise ReportError("the upload could not be decoded") from None
    if len(raw) > MAX_REPORT_BYTES:
        raise ReportError(f"file larger than {format_bytes(MAX_REPORT_BYTES)}")
    return parse_report(raw)


def load_path(path: str) -> dict:
    """A report from a path on the machine running the dashboard (``.json`` files only)."""
    p = Path(path.strip()).expanduser()
    if p.suffix.lower() != ".json":
        raise ReportError(f"{path.strip()!r}: expected a .json file")
    try:
        if p.stat().st_size > MAX_REPORT_BYTES:
            raise ReportError(f"{path.strip()!r} is larger than {format_bytes(MAX_REPORT_BYTES)}")
        return parse_report(p.read_bytes())
    except OSError as err:
        raise ReportError(f"cannot read {path.strip()!r}: {err.strerror or err}") from None


def _pct(value) -> str:
    return "–" if value is None else f"{value:+.2f} %"


def summary_cards(report: dict) -> list[dict]:
    total = report["events_total"]
    return [
        {"key": "v_matched", "label": "events matched", "value": f"{report['events_matched']:,} / {total:,}",
         "detail": f"{100 * report['events_matched'] / total:.1f} %" if total else "no events"},
        {"key": "v_missing", "label": "missing", "value": f"{report['events_missing']:,}", "detail": "predicted, not seen"},
        {"key": "v_unexpected", "label": "unexpected", "value": f"{report['events_unexpected']:,}", "detail": "seen, not predicted"},
        {"key": "v_peak", "label": "in-step rise error", "value": _pct(report["rise_error_pct"]),
         "detail": "worst reallocation step, measured vs predicted"},
        {"key": "v_slope", "label": "resident slope error", "value": _pct(report["resident_slope_error_pct"]),
         "detail": "bytes per token"},
        {"key": "v_precision", "label": "effective KV precision", "value": report["effective_kv_precision"] or "–",
         "detail": "fused SDPA" if report["fused"] else "NOT fused: plain Concat"},
    ]


def event_rows(report: dict, limit: int = MAX_EVENT_ROWS) -> tuple[list[dict], str]:
    """Events for the table, mismatches first, at most ``limit``, and a note on what was left out."""
    events = report["events"]
    order = sorted(range(len(events)), key=lambda i: (events[i]["status"] == "matched", events[i]["step"]))
    rows = [{k: events[i][k] for k in EVENT_KEYS} for i in order[:limit]]
    note = f"{len(events):,} events" + (
        f"; the first {limit:,} shown (mismatches first)" if len(events) > limit else ""
    )
    return rows, note

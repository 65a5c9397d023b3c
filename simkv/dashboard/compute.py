"""Everything the dashboard computes, without Dash: scenario checks, cached runs, views as data.

All simulation goes through :func:`simkv.build_scenario` and :func:`simkv.simulate`
and all figures through :mod:`simkv.figures`, so the dashboard shows exactly what
the CLI and the experiments compute.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from policies import get_policy
from simkv import figures
from simkv.errors import PolicyError, SimkvError
from simkv.ledger import COLUMNS, OPS, PHASES, TENSORS
from simkv.metrics import replacing_allocations
from simkv.hfconfig import resolve_model
from simkv.precision import get_precision
from simkv.scenario import Result, Scenario, build_scenario, simulate
from simkv.units import format_bytes
from simkv.workload import Decode, Fork, Prefill, Reset, Select, chat_session, parse_ops

from simkv.dashboard import state as st

#: A run whose ledger would exceed this many rows is refused (the `exact` policy
#: on a 32-layer model passes it at ~10,000 tokens); `simkv run` has no such limit.
MAX_LEDGER_ROWS = 2_000_000
#: Display resolution: points per line, reallocation markers, heatmap columns.
TIMELINE_POINTS = 2000
MAX_EVENTS = 600
HEAT_COLUMNS = 600
PAGE_SIZE = 50


# -- building a scenario, with the control to blame -----------------------------------

def _mentions(message: str, names) -> list[str]:
    return [n for n in names if re.search(rf"\b{re.escape(n)}\b", message)]


def _workload_key(message: str, kwargs: dict) -> str:
    """The workload control a message is about."""
    if kwargs.get("ops"):
        return "ops"
    for key, words in (
        ("turn_tokens", ("turn tokens", "turn_tokens")), ("turn_decode", ("turn decode", "turn_decode")),
        ("turns", ("turns",)), ("beam", ("beam",)), ("prompt", ("prompt",)),
    ):
        if any(w in message for w in words):
            return key
    return "decode"


def _policy_keys(message: str, kwargs: dict) -> list[str]:
    """Policy parameters a message names: those the user changed first, else all named."""
    names = [f.name for f in st.policy_fields(kwargs["policy"])]
    named = _mentions(message, names)
    changed = [n for n in named if n in kwargs.get("policy_options", {})]
    return [st.popt_key(kwargs["policy"], n) for n in (changed or named)]


def longest_history(workload) -> int:
    """Most tokens the session stores at once, from the operations (no per-step expansion)."""
    stored = longest = 0
    for op in workload.ops:
        if isinstance(op, Reset):
            stored = 0
        elif isinstance(op, Prefill):
            stored += op.tokens
        elif isinstance(op, Decode):
            stored += op.steps
        else:
            stored += 1
        longest = max(longest, stored)
    return longest


def estimate_ledger_rows(scenario: Scenario, limit: int = MAX_LEDGER_ROWS) -> int:
    """Rough, high ledger size of a scenario, without running it; stops counting past ``limit``.

    Follows one unit's chain of capacities (the policy's own rule, primitive 0:
    the least headroom) through each stretch of growth between resets, plus one
    rebuild per batch change, times units × buffers per unit × (alloc, copy, free);
    plus an alloc and a free per step for a policy that grows a ``past_view``
    block every step. Where the headroom limits apply (``max_alloc_bytes``, or
    ``headroom_limit`` of the device filled) buffers get no headroom: one
    reallocation per token. Growth stops where the device is full.
    """
    from simkv.layout import Layout

    policy, model, precision = scenario.policy, scenario.model, scenario.precision
    try:
        lay = Layout.build(model, precision, policy)
        units, slots = lay.unit_slots.shape
        unit_row = int(lay.unit_row_bytes.max())
    except Exception:  # noqa: BLE001 - a layout change elsewhere must not break the guard
        units, slots = 2 * model.layers, 3
        unit_row = precision.kv_bytes_per_token(model) // max(1, units)
    per_event = max(1, units * slots * 3)
    budget = limit // per_event + 1
    prim = np.zeros(1, dtype=np.int64)
    widest = max([op.width for op in scenario.workload.ops if isinstance(op, Fork)] + [1])
    per_token = max(1, precision.kv_bytes_per_token(model))
    fits = scenario.device_memory // per_token + 1
    no_headroom_from = policy.headroom_limit * scenario.device_memory / per_token if policy.headroom_limit else math.inf

    def size(needed: int) -> int:
        cap = max(int(np.asarray(policy.capacity(np.array([needed]), prim))[0]), needed)
        if needed >= no_headroom_from or (policy.max_alloc_bytes and cap * unit_row * widest > policy.max_alloc_bytes):
            return needed
        return cap

    def chain(first: int, longest: int) -> int:
        longest = min(longest, fits)
        cap, n = size(first), 1
        while cap < longest and n <= budget:
            cap, n = size(cap + 1), n + 1
        return n

    events, stored, first, longest = 0, 0, None, 0
    resets = sum(isinstance(op, Reset) for op in scenario.workload.ops)
    for op in scenario.workload.ops:
        if isinstance(op, Reset):
            if first is not None:
                events += chain(first, longest)
            stored, first, longest = 0, None, 0
            continue
        if isinstance(op, (Fork, Select)):
            events += 1
        grow = op.tokens if isinstance(op, Prefill) else op.steps if isinstance(op, Decode) else 1
        if first is None:
            first = max(grow, 1)
        stored += grow
        longest = max(longest, stored)
        if events > budget:
            break
    if first is not None and events <= budget:
        events += chain(first, longest)
    per_step = 2 * min(scenario.workload.steps, fits * (1 + resets)) if getattr(policy, "past_view", False) else 0
    return events * per_event + per_step


def build(kwargs: dict) -> Scenario:
    """The scenario of checked control values, or :class:`state.Invalid` naming the control at fault.

    Each part goes through the library function that owns it (so its one-line
    message is shown), then the whole through :func:`simkv.build_scenario`.
    """
    try:
        spec = resolve_model(kwargs["model"], **{d: kwargs[d] for d in st.DIMS})
    except SimkvError as err:
        msg = str(err)
        key = "model"
        if "kv_heads" in msg:
            key = "kv_heads" if kwargs.get("kv_heads") is not None else "heads"
        elif "custom model needs" in msg:
            key = "layers"
        elif msg.startswith("--"):  # a dimension that would reshape a model given layer by layer: the first one
            key = msg.split()[0][2:].replace("-", "_")
        raise st.Invalid({key: msg}) from None
    try:
        policy = get_policy(kwargs["policy"], kwargs["policy_options"])
    except SimkvError as err:
        keys = _policy_keys(str(err), kwargs) or ["policy"]
        raise st.Invalid({k: str(err) for k in keys}) from None
    try:
        get_precision(kwargs["precision"] or policy.default_precision).check(spec)
    except SimkvError as err:
        raise st.Invalid({"precision": str(err)}) from None
    try:
        if kwargs.get("ops"):
            workload = parse_ops(kwargs["ops"])
        else:
            workload = chat_session(
                kwargs["prompt"], kwargs["decode"], turns=kwargs["turns"], turn_tokens=kwargs["turn_tokens"],
                turn_decode=kwargs["turn_decode"], beam=kwargs["beam"],
            )
    except SimkvError as err:
        raise st.Invalid({_workload_key(str(err), kwargs): str(err)}) from None
    key = "ops" if kwargs.get("ops") else ("turns" if kwargs.get("turns") else "decode")
    if workload.steps > st.MAX_STEPS:
        raise st.Invalid({key: f"{workload.steps:,} steps: at most {st.MAX_STEPS:,} in the dashboard (use `simkv run`)"})
    if longest_history(workload) > st.MAX_TOKENS:
        raise st.Invalid({key: f"the session reaches {longest_history(workload):,} tokens: at most {st.MAX_TOKENS:,} in the dashboard"})
    try:
        scenario = build_scenario(**kwargs)
    except PolicyError as err:
        msg = str(err)
        errors = {_workload_key(msg, kwargs) if "prompt" in msg or "beam" in msg else key: msg}
        errors.update({k: msg for k in _policy_keys(msg, kwargs)})
        raise st.Invalid(errors) from None
    except SimkvError as err:
        # the library refusing a model whose weights do not fit the device: its message (with the fix) in full
        msg = str(err)
        on_device = "device memory" in msg or "weights" in msg
        raise st.Invalid({"device_memory" if on_device else key: msg}, notice=msg if "weights" in msg else "") from None
    rows = estimate_ledger_rows(scenario)
    if rows > MAX_LEDGER_ROWS:
        raise st.Invalid({key: (
            f"this run could write up to ~{rows:,} ledger rows, over the dashboard's limit of {MAX_LEDGER_ROWS:,}; "
            f"shorten it or use `simkv run`"
        )})
    return scenario


# -- cached runs ------------------------------------------------------------------------

class ResultCache:
    """The last few results, by scenario; bounded by count and by ledger rows held."""

    def __init__(self, max_items: int = 8, max_rows: int = 2 * MAX_LEDGER_ROWS) -> None:
        self.max_items, self.max_rows = max_items, max_rows
        self._items: OrderedDict[str, Result] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(kwargs: dict) -> str:
        return json.dumps(kwargs, sort_keys=True)

    def get(self, key: str) -> Result | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return None

    def put(self, key: str, result: Result) -> None:
        with self._lock:
            self._items[key] = result
            self._items.move_to_end(key)
            while len(self._items) > 1 and (
                len(self._items) > self.max_items or sum(len(r.ledger) for r in self._items.values()) > self.max_rows
            ):
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


CACHE = ResultCache()


def run(kwargs: dict) -> Result:
    """The result of checked control values (cached); :class:`state.Invalid` if they do not make a scenario."""
    key = CACHE.key(kwargs)
    result = CACHE.get(key)
    if result is None:
        result = simulate(build(kwargs))
        CACHE.put(key, result)
    return result


# -- the main view ----------------------------------------------------------------------

@dataclass
class MainView:
    ok: bool
    errors: dict[str, str] = field(default_factory=dict)
    result: Result | None = None
    kwargs: dict | None = None
    timeline: object = None
    heatmap: object = None
    cards: list[dict] = field(default_factory=list)
    status: str = ""
    warning: str | None = None
    #: Why there is no result, in full, with the fix (shown in place of the figures): see :class:`state.Invalid`.
    notice: str = ""
    cli: str = ""
    elapsed_ms: float = 0.0


def placeholder_figure(message: str, error: bool = True) -> dict:
    """An empty figure saying why there is nothing to show (a plain dict: no validation cost)."""
    return {
        "data": [],
        "layout": {
            "title": {"text": "no result" if error else ""},
            "xaxis": {"visible": False}, "yaxis": {"visible": False},
            "annotations": [{
                "text": message, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                "font": {"size": 15, "color": "#b00020" if error else "#57606a"},
            }],
            "template": "none", "paper_bgcolor": "#fafafa", "plot_bgcolor": "#fafafa",
        },
    }


def cards(result: Result) -> list[dict]:
    """The summary cards: key, label, value, detail."""
    m, s = result.metrics, result.scenario
    device = s.device_memory
    spike_at = f"at step {m.max_spike_step:,}" if m.max_spike_step is not None else "no spike"
    return [
        {"key": "peak_allocated", "label": "peak allocated", "value": format_bytes(m.peak_allocated_bytes),
         "detail": f"{100 * m.peak_allocated_bytes / device:.1f} % of {format_bytes(device)}"},
        {"key": "peak_resident", "label": "peak resident", "value": format_bytes(m.peak_resident_bytes),
         "detail": "first touch" if s.policy.first_touch else "= allocated (device)"},
        {"key": "mean_allocated", "label": "mean allocated", "value": format_bytes(m.mean_allocated_bytes),
         "detail": "time-weighted"},
        {"key": "waste", "label": "final waste", "value": f"{m.waste_pct:.1f} %",
         "detail": f"{format_bytes(m.waste_bytes)} unused"},
        {"key": "reallocations", "label": "reallocations", "value": f"{m.realloc_count:,}",
         "detail": f"K/V buffers replaced, on {_count(realloc_steps(result), 'step')}"},
        {"key": "bytes_copied", "label": "bytes copied", "value": format_bytes(m.bytes_copied),
         "detail": "by reallocations"},
        {"key": "largest_spike", "label": "largest spike", "value": format_bytes(m.max_spike_bytes), "detail": spike_at},
    ]


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def realloc_steps(result: Result) -> int:
    """Steps on which at least one K/V buffer is replaced (the reallocation markers of the timeline, before
    thinning): the reallocation card says how many, so the card and the legend count the same thing."""
    rows = result.ledger.rows
    return len(np.unique(rows["step"][replacing_allocations(rows)]))


def display_figures(result: Result, heat: str = "headroom") -> tuple:
    """The timeline and per-layer heatmap as the dashboard draws them (decimated for display)."""
    tl = figures.timeline(result, max_points=TIMELINE_POINTS, max_events=MAX_EVENTS, reallocations=True)
    tl.update_traces(marker={"size": 5, "opacity": 0.75}, selector={"mode": "markers"})
    hm = figures.layer_heatmap(result, value=heat if heat in st.HEAT_VALUES else "headroom", max_columns=HEAT_COLUMNS)
    keep = {"uirevision": str(result.scenario.workload)}  # zoom and legend clicks survive a changed control
    return style(tl, keep), style(hm, {**keep, "yaxis": {"title": {"text": "layer and tensor"}}})


#: Every axis: full numbers with thousands separators, log axes included (2,000, not "2" after 1,000).
TICKS = ",~f"


def style(fig, layout: dict | None = None):
    """The dashboard's look for a plotly figure, the same in every workspace: axis numbers with thousands
    separators (and in full on log axes), the legend in one row under the plot, the figure as wide as its box
    (never a fixed width), the title small. Returns the figure (changed in place); a plain-dict figure (a
    placeholder) is returned as it is. ``layout``: more of the layout to set in the same update (plotly validates
    each update: a few ms apiece)."""
    if isinstance(fig, dict):
        return fig
    extra = layout or {}
    layout = {"separators": ".,", "width": None, "height": None, "autosize": True,
              "title": {"font": {"size": 14}, "x": 0.01, "xanchor": "left"},
              "margin": {"t": 48, "l": 64, "r": 16, "b": 40},
              "legend": {"orientation": "h", "x": 0, "xanchor": "left", "yref": "container", "y": 0,
                         "yanchor": "bottom", "title": {"text": None}}}
    for name, axis in fig.layout.to_plotly_json().items():
        if name.startswith(("xaxis", "yaxis")):
            # on a log axis plotly labels 1, 2 and 5 of each decade when given them: 100, 200, 500, 1,000
            layout[name] = {"tickformat": TICKS, "automargin": True, **({"dtick": "D2"} if axis.get("type") == "log"
                                                                        else {})}
    layout.setdefault("xaxis", {"tickformat": TICKS, "automargin": True})
    layout.setdefault("yaxis", {"tickformat": TICKS, "automargin": True})
    for key, value in extra.items():
        layout[key] = {**layout[key], **value} if isinstance(value, dict) and key in layout else value
    fig.update_layout(layout)
    if any(t.type == "heatmap" for t in fig.data):
        fig.update_traces(colorbar_tickformat=TICKS, selector={"type": "heatmap"})
    return fig


def at_least(n: float) -> str:
    """A size as :func:`format_bytes` writes it, but rounded up: a device memory given as this holds ``n``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{math.ceil(n * 100 / size) / 100:.2f} {unit}"
    return f"{math.ceil(n)} B"


def no_room_notice(result: Result, kwargs: dict) -> str:
    """Why a run that ran out of memory at its first step has nothing to draw, and the fix, in one line; ``""``
    for any other run (a later out-of-memory keeps its partial run, with a warning).

    The fix is a device memory on which the whole session runs as it would with no limit: its weights plus the
    peak the session allocates when memory does not limit it (the session run again on the dashboard's largest
    device: cached, and within the same limits), over the policy's ``headroom_limit`` where it has one. On
    that much no allocation comes near the limit, so the policy sizes every buffer as on the unlimited device
    (simkv/engine/oom.py: headroom ends once weights + allocated + the new buffer reach headroom_limit x device
    memory), and the peak fits. Less may do (near the limit the policy gives less headroom, which may or may not
    fit), so it is named as what runs the session, not as the least that does."""
    if result.oom is None or result.oom.step != 0:
        return ""
    s = result.scenario
    if s.weights_memory >= s.device_memory:
        why = (f"{s.model.name}'s weights ({format_bytes(s.weights_memory)}) do not fit the device memory "
               f"({format_bytes(s.device_memory)})")
    else:
        why = f"the first step does not fit: {result.oom}"
    other = "a smaller model, prompt or KV precision"
    try:
        unlimited = run({**kwargs, "device_memory": str(st.MAX_DEVICE_BYTES)})
    except st.Invalid:  # over the dashboard's limits once memory no longer stops it
        return f"Nothing to show: {why}. Fix: more device memory, or {other}."
    peak, limit = unlimited.metrics.peak_allocated_bytes, s.policy.headroom_limit
    need = (s.weights_memory + peak) / (limit or 1)
    under = f" stay under the policy's headroom limit, {100 * limit:g} % of the memory" if limit else ""
    return (f"Nothing to show: {why}. Fix: {at_least(need)} of device memory runs the whole session (its weights and "
            f"its KV cache's peak of {format_bytes(peak)}{under}), or {other}.")


#: What the status line and the device memory's error line say when the run has no room (the notice says why).
NO_ROOM_STATUS = "Nothing to show: no room on the device (why, and the fix, below)."
NO_ROOM_INLINE = "too small for this run: see the message on the right"


def no_room(notice: str, start: float) -> MainView:
    """The view of a run with no room on its device: the notice in full once, pointers to it elsewhere."""
    return MainView(ok=False, errors={"device_memory": NO_ROOM_INLINE}, status=NO_ROOM_STATUS, notice=notice,
                    elapsed_ms=1000 * (time.perf_counter() - start))


def main_view(state: dict) -> MainView:
    """What the main panel shows for a state: figures, cards and status, or per-control errors."""
    start = time.perf_counter()
    try:
        kwargs = st.scenario_kwargs(state)
        result = run(kwargs)
    except st.Invalid as err:
        if err.notice:
            return no_room(err.notice, start)
        return MainView(ok=False, errors=err.errors, status=st.invalid_status(err.errors),
                        elapsed_ms=1000 * (time.perf_counter() - start))
    notice = no_room_notice(result, kwargs)
    if notice:
        return no_room(notice, start)
    tl, hm = display_figures(result, state.get("heat", "headroom"))
    m = result.metrics
    status = (
        f"{result.scenario.describe()} · {m.steps:,} steps · {len(result.ledger):,} ledger rows · "
        f"computed in {1000 * (time.perf_counter() - start):.0f} ms"
    )
    warning = f"Out of memory: {result.oom} — the run stops there." if result.oom else None
    return MainView(
        ok=True, result=result, kwargs=kwargs, timeline=tl, heatmap=hm, cards=cards(result), status=status,
        warning=warning, cli=st.cli_command(kwargs), elapsed_ms=1000 * (time.perf_counter() - start),
    )


# -- compare ----------------------------------------------------------------------------

@dataclass
class CompareView:
    ok: bool
    errors: dict[str, str] = field(default_factory=dict)
    figure: object = None
    labels: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    message: str = ""


def compare_view(kwargs: dict | None, state: dict, quantity: str = "allocated") -> CompareView:
    """Run A (``kwargs``: the main controls, checked) and the compare tab's runs of ``state``, overlaid."""
    try:
        if kwargs is None:
            raise st.Invalid({})
        base = run(kwargs)
    except st.Invalid:
        return CompareView(ok=False, message="No run A: fix the inputs marked in red on the left.")
    try:
        extra = st.compare_runs(state)
    except st.Invalid as err:
        return CompareView(ok=False, errors=err.errors, message="Fix the compare runs marked in red.")
    results, errors = [base], {}
    labels = [f"A: {base.scenario.policy.describe()} {base.scenario.precision.name}"]
    for letter, (key, spec) in zip(st.RUN_NAMES[1:], extra):
        precision = spec["precision"]
        if precision == st.SAME:
            precision = base.scenario.precision.name
        elif precision == st.DEFAULT:
            precision = None
        run_kwargs = {**kwargs, "policy": spec["policy"], "policy_options": spec["options"], "precision": precision}
        try:
            result = run(run_kwargs)
        except st.Invalid as err:
            errors[f"{key}_opts"] = "; ".join(dict.fromkeys(err.errors.values()))
            continue
        results.append(result)
        labels.append(f"{letter}: {result.scenario.policy.describe()} {result.scenario.precision.name}")
    if len(results) < 2:
        message = "" if errors else "Choose a policy for run B to compare it with run A (the main controls)."
        return CompareView(ok=False, errors=errors, message=message)
    quantity = quantity if quantity in st.QUANTITIES else "allocated"
    fig = style(figures.compare(results, labels, quantity=quantity, max_points=TIMELINE_POINTS),
                {"uirevision": str(base.scenario.workload)})
    return CompareView(ok=True, errors=errors, figure=fig, labels=labels, rows=figures.delta_table(results, labels))


def format_delta_rows(rows: list[dict], labels: list[str]) -> tuple[list[str], list[list[str]]]:
    """The delta table as text: header, then per metric each run's value and its difference from A."""
    def fmt(value, unit, signed=False):
        if value is None:
            return "–"
        if unit == "bytes":
            text = format_bytes(value)
            return ("+" + text if signed and value > 0 else text)
        if unit == "%":
            return f"{value:+.1f} pp" if signed else f"{value:.1f} %"
        return f"{value:+,}" if signed else f"{value:,}"

    header = ["metric", labels[0]]
    for label in labels[1:]:
        header += [label, f"{label.split(':')[0]} − A"]
    body = []
    for row in rows:
        line = [row["metric"], fmt(row[labels[0]], row["unit"])]
        for label in labels[1:]:
            diff = row[f"{label} − {labels[0]}"]
            text = fmt(diff, row["unit"], signed=True)
            pct = row.get(f"{label} vs {labels[0]} %")
            if pct is not None:
                text += f" ({pct:+.1f} %)"
            line += [fmt(row[label], row["unit"]), text]
        body.append(line)
    return header, body


# -- the ledger table (server-side paging, sorting, filtering) ---------------------------

LABELLED = {"phase": PHASES, "tensor": TENSORS, "op": OPS}
_FILTER = re.compile(
    r"^\s*\{(?P<col>[^}]+)\}\s*(?P<op>[is]?(?:>=|<=|!=|<|>|=|eq|ne|lt|le|gt|ge|contains|datestartswith))\s*(?P<val>.*?)\s*$"
)
_OPS = {"eq": "=", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_KNOWN = {*_OPS, *_OPS.values(), "contains", "datestartswith"}


def _filter_mask(rows: np.ndarray, query: str) -> np.ndarray:
    """Rows matching a DataTable ``filter_query`` (``{col} op value`` joined by ``&&``)."""
    mask = np.ones(len(rows), dtype=bool)
    for part in filter(None, (p.strip() for p in (query or "").split("&&"))):
        m = _FILTER.match(part)
        if not m or m.group("col") not in COLUMNS:
            raise ValueError(f"cannot filter on {part!r}")
        col, op, val = m.group("col"), m.group("op"), m.group("val")
        if op[:1] in ("i", "s") and len(op) > 1 and op[1:] in _KNOWN:
            op = op[1:]  # case-(in)sensitive variants: labels are lower case anyway
        op = _OPS.get(op, op)
        if len(val) >= 2 and val[0] == val[-1] and val[0] in "'\"`":
            val = val[1:-1]
        data = rows[col]
        if col in LABELLED:
            labels = np.asarray(LABELLED[col])
            if op in ("contains", "datestartswith"):
                ok = np.array([val.lower() in lab for lab in labels] if op == "contains" else [lab.startswith(val.lower()) for lab in labels])
            elif op in ("=", "!="):
                ok = labels == val.lower()
                ok = ok if op == "=" else ~ok
            else:
                raise ValueError(f"{col} is text: use = or contains")
            mask &= ok[data]
            continue
        try:
            number = float(val)
        except ValueError:
            raise ValueError(f"{col}: {val!r} is not a number") from None
        if op in ("contains", "datestartswith"):
            op = "="
        mask &= {"=": data == number, "!=": data != number, "<": data < number, "<=": data <= number,
                 ">": data > number, ">=": data >= number}[op]
    return mask


def ledger_page(result: Result, page: int = 0, size: int = PAGE_SIZE, sort_by=None, query: str = "") -> dict:
    """One page of the ledger, filtered and sorted on the server: records, page count, totals."""
    rows = result.ledger.rows
    size = max(1, min(int(size or PAGE_SIZE), 500))
    error = None
    try:
        idx = np.flatnonzero(_filter_mask(rows, query))
    except ValueError as err:
        idx, error = np.arange(len(rows)), str(err)
    keys = []
    for spec in reversed(sort_by or []):
        col = spec.get("column_id")
        if col not in COLUMNS:
            continue
        data = rows[col][idx]
        if col in LABELLED:  # sort by name, not by code
            rank = np.argsort(np.argsort(np.asarray(LABELLED[col])))
            data = rank[data]
        keys.append(-data.astype(np.int64) if spec.get("direction") == "desc" else data)
    if keys:
        idx = idx[np.lexsort(keys)]
    pages = max(1, -(-len(idx) // size))
    page = min(max(0, int(page or 0)), pages - 1)
    chunk = rows[idx[page * size : (page + 1) * size]]
    records = [
        {name: (LABELLED[name][value] if name in LABELLED else value) for name, value in zip(COLUMNS, row)}
        for row in zip(*(chunk[name].tolist() for name in COLUMNS))
    ]
    return {"records": records, "page": page, "pages": pages, "matched": len(idx), "total": len(rows), "error": error}

"""The dashboard's Plan view: ``simkv plan`` on the page (simkv.lab.plan; issue #21).

In: the traffic (the first N requests of a bundled Azure trace, or N synthetic requests at a rate), the model,
the SLO (``ttft_p99=2s,tpot_p99=50ms``), the devices to choose from, the most devices a deployment may use,
and optionally a price per device-hour. The form's values become the same :class:`~simkv.lab.plan.Target`,
:class:`~simkv.lab.plan.Space` and prices ``simkv plan`` builds from its flags, and the ``simkv plan`` line
with those flags is shown (tests/test_dashboard_plan.py parses it with the CLI's own parser and checks it
builds the same search). Out: the recommended deployment (its cost, its latencies, the ``simkv plan`` line
that finds it and the ``simkv run`` line that serves it), the Pareto fronts of cost against each SLO latency
(:func:`simkv.lab.plan_figure.plan_figure`), every deployment with its status and why it was rejected or
pruned, and the recommended deployment served again (:func:`simkv.lab.plan.spec_of`, ``serve``) with each
replica's memory over simulated time.

A search runs only when "Run" is pressed, in the server process (``workers=1``: no process pool), bounded
before it starts: at most :data:`MAX_REQUESTS` requests, :data:`MAX_DEVICES` devices a deployment, and
:data:`MAX_WORK` requests served in all — the deployments of the search space (before pruning, so the bound
holds whatever is pruned) × the requests. A serving run costs about 0.3 ms (GPU presets) to 0.7 ms (CPU
presets) per request on a loaded 2-core machine: the worst searches within the limit (nothing meets a TPOT-only
SLO, so nothing is pruned or stopped early) took 7-8 s; a run's own work is bounded by
``spec_of``'s preemption limit (as many as requests). Past a limit the page says which, with the ``simkv
plan`` line to run it in full. Bad input is one line on the page, never a traceback.

The ``simkv plan`` line under the form follows the form as it is typed (and says at once what is wrong with
it); the last :data:`CACHE_ITEMS` results are kept by that line, so Run again shows them without searching.
"""

from __future__ import annotations

import math
import shlex
import threading
from collections import OrderedDict
from dataclasses import dataclass

from dash import Input, Output, State, html

from simkv.errors import SimkvError
from simkv.hfconfig import preset_names

from simkv.dashboard import compute
from simkv.dashboard import state as st
from simkv.dashboard.components import (Field, busy, data_table, defaults, errors_out, form_fields, graph, internal_error,
                                        progress, register_shown)

#: The bundled traces: form value → (path as the command line names it, from the repository root; label).
TRACES = {
    "conv": ("azure-conv", "Azure conversation trace"),  # shipped traces by name (simkv.shipped.TRACES)
    "code": ("azure-code", "Azure code trace"),
}
SYNTHETIC = "synthetic"
#: ``simkv plan``'s synthetic defaults (simkv/commands/plan.py): the dashboard asks only requests and rate.
SYNTHETIC_DEFAULTS = {"arrivals": "poisson", "prompt_dist": "lognormal:1024:1.0", "output_dist": "lognormal:200:1.0",
                      "seed": 0}
DEFAULT_SLO = "ttft_p99=2s,tpot_p99=50ms"
MAX_REQUESTS = 500
MAX_RATE = 1000.0
MAX_DEVICES = 8
#: Requests served in all, at most: deployments searched (before pruning) × requests.
MAX_WORK = 12_000
#: Points per line of the memory figure (SVG: drawn fast without a GPU).
MEMORY_POINTS = 2000
GIB = 1024**3



def _devices():
    from simkv.cost import DEVICES

    return tuple(DEVICES)


#: The Plan workspace's form, in page order. To add a control: one Field here (its URL key, label, default,
#: choices, when it applies) and, in :func:`inputs`, what it sets in the search and the ``simkv plan`` flag.
FIELDS = (
    Field("pl_traffic", "traffic", "conv", lambda: [(key, f"{label} (first N)") for key, (_, label) in TRACES.items()]
          + [(SYNTHETIC, "synthetic (Poisson)")], hint="bundled trace, or Poisson arrivals", section="Traffic"),
    Field("pl_requests", "requests", "100", hint=f"≤ {MAX_REQUESTS:,}", numeric=True),
    Field("pl_rate", "rate (requests/s)", "5", hint="lengths lognormal 1024 / 200",
          shown=lambda v: v.get("pl_traffic") == SYNTHETIC),
    Field("pl_model", "model", "llama-3.1-8b", preset_names, section="Model and target"),
    Field("pl_slo", "SLO", DEFAULT_SLO, hint="METRIC_pQ=LIMIT, … of ttft, tpot, e2e at p50/90/95/99"),
    Field("pl_devices", "devices", ("h100-sxm", "a100-80gb"), _devices, multi=True, section="Deployments"),
    Field("pl_max_devices", "max devices", "4", hint=f"per deployment, ≤ {MAX_DEVICES}", numeric=True),
    Field("pl_prices", "prices ($/h)", "", hint="DEVICE=$/h for every device", placeholder="empty: cost in device-hours"),
)
KEYS = tuple(f.key for f in FIELDS)
DEFAULTS = defaults(FIELDS)
#: The default form (as the browser sends it).
DEFAULT_FORM = DEFAULTS
LABELS = {f.key: f.label for f in FIELDS}
#: What makes a deployment (the columns of a plan row that say which deployment it is).
DEPLOYMENT = ("device", "scheduler", "devices", "tp", "replicas", "router", "precision", "block_size", "pool",
              "max_num_batched_tokens", "policy")


@dataclass
class Inputs:
    """The checked form: what ``simkv plan`` would build from the shown line (its arguments after ``plan``)."""

    target: object  # simkv.lab.plan.Target
    space: object  # simkv.lab.plan.Space
    prices: dict[str, float] | None
    argv: list[str]
    requests: int

    @property
    def line(self) -> str:
        return "simkv plan " + shlex.join(self.argv)


# -- the form → a search and its command line ------------------------------------------------------------

def _whole(value, lo: int, hi: int) -> int:
    text = str(value if value is not None else "").strip().replace("_", "").replace(",", "")
    if not text:
        raise ValueError("enter a whole number")
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(number) or number != int(number):
        raise ValueError(f"{text!r} is not a whole number")
    if number < lo:
        raise ValueError(f"must be at least {lo:,}")
    if number > hi:
        raise ValueError(f"at most {hi:,} in the dashboard (run the simkv plan line for more)")
    return int(number)


def _rate(value) -> float:
    text = str(value if value is not None else "").strip()
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number" if text else "enter a number") from None
    if not math.isfinite(number) or not number > 0:
        raise ValueError("must be a finite number above 0")
    if number > MAX_RATE:
        raise ValueError(f"at most {MAX_RATE:g} in the dashboard")
    return number


def _number_text(x: float) -> str:
    """A number as the command line should carry it: short, and read back exactly."""
    text = f"{x:g}"
    return text if float(text) == x else repr(x)


def _flag_message(err: Exception, flag: str) -> str:
    """The library's message without the command-line flag it starts with (the form's label says it)."""
    text = str(err)
    if text.startswith(flag):
        text = text[len(flag):].lstrip(" :")
    return text


def inputs(form: dict) -> Inputs:
    """The search of the form's values; :class:`state.Invalid` names every bad field."""
    from simkv.cost import DEVICES
    from simkv.hfconfig import preset_names
    from simkv.lab import plan

    v = {**DEFAULT_FORM, **{k: form.get(k) for k in KEYS if form.get(k) is not None}}
    errors: dict[str, str] = {}
    got: dict = {}

    def check(key, fn, *args):
        try:
            got[key] = fn(*args)
        except (ValueError, SimkvError) as err:
            errors[key] = str(err)

    traffic = v["pl_traffic"]
    if traffic not in (*TRACES, SYNTHETIC):
        errors["pl_traffic"] = f"choose one of {', '.join((*TRACES, SYNTHETIC))}"
    check("pl_requests", _whole, v["pl_requests"], 1, MAX_REQUESTS)
    if traffic == SYNTHETIC:
        check("pl_rate", _rate, v["pl_rate"])
    if v["pl_model"] not in preset_names():
        errors["pl_model"] = "choose a preset model"
    slo_text = ",".join(p.strip() for p in str(v["pl_slo"] or "").split(",") if p.strip())
    try:
        slo = plan.parse_slo(slo_text)
    except SimkvError as err:
        errors["pl_slo"] = _flag_message(err, "--slo")
    devices = v["pl_devices"] if isinstance(v["pl_devices"], (list, tuple)) else [v["pl_devices"]]
    devices = list(dict.fromkeys(d for d in devices if d))
    unknown = [d for d in devices if d not in DEVICES]
    if not devices:
        errors["pl_devices"] = "choose at least one device"
    elif unknown:
        errors["pl_devices"] = f"unknown device {unknown[0]!r}; choose {', '.join(DEVICES)}"
    check("pl_max_devices", _whole, v["pl_max_devices"], 1, MAX_DEVICES)
    price_text = ",".join(p.strip() for p in str(v["pl_prices"] or "").split(",") if p.strip())
    prices = None
    if price_text and "pl_devices" not in errors:
        try:
            prices = plan.parse_prices([price_text], devices)
        except SimkvError as err:
            errors["pl_prices"] = _flag_message(err, "--price")
    if errors:
        raise st.Invalid(errors)
    n = got["pl_requests"]
    if traffic == SYNTHETIC:
        workload = {"requests": n, "rate": got["pl_rate"], **SYNTHETIC_DEFAULTS}
        argv = ["--synthetic", "--requests", str(n), "--rate", _number_text(got["pl_rate"])]
    else:
        path = TRACES[traffic][0]
        workload = {"trace": path, "limit": n}
        argv = ["--trace", path, "--limit", str(n)]
    argv += ["--model", v["pl_model"], "--slo", slo_text, "--devices", ",".join(devices),
             "--max-devices", str(got["pl_max_devices"])]
    if prices:
        argv += ["--price", ",".join(f"{d}={_number_text(prices[d])}" for d in devices)]
    target = plan.Target(workload, v["pl_model"], slo)
    space = plan.Space(tuple(devices), got["pl_max_devices"])
    return Inputs(target, space, prices, argv, n)


def check_work(i: Inputs) -> int:
    """The deployments of the search space (before pruning); :class:`state.Invalid` past :data:`MAX_WORK`."""
    from simkv.hfconfig import resolve_model
    from simkv.lab import plan

    deployments, _ = plan.candidates(i.space, resolve_model(i.target.model))
    work = len(deployments) * i.requests
    if work > MAX_WORK:
        raise st.Invalid({"pl_requests": f"{len(deployments):,} deployments to search × {i.requests:,} requests = "
                                         f"{work:,} requests to serve: at most {MAX_WORK:,} in the dashboard; "
                                         "fewer requests, devices or max devices"})
    return len(deployments)


# -- the view as data -------------------------------------------------------------------------------------

def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds * 1000:,.1f} ms" if seconds < 10 else f"{seconds:,.2f} s"


def _limit(seconds: float) -> str:
    """An SLO limit as one writes it (2 s, 50 ms)."""
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def _cost(result, row: dict) -> str:
    c = result.cost(row)
    return f"${c:,.2f}/h" if result.prices else f"{c:g} device-hour{'s' if c != 1 else ''} per hour"


def _key(d: dict) -> tuple:
    return tuple(d[k] for k in DEPLOYMENT)


#: Columns of the plan table: row key → header (the SLO latencies and the reason follow).
TABLE_COLUMNS = {"note": "", "status": "status", "devices": "devices", "device": "device", "scheduler": "scheduler",
                 "tp": "tp",
                 "replicas": "replicas", "router": "router", "KV": "KV", "block": "block", "pool": "pool",
                 "batched tokens": "batched", "cost": "cost"}
TEXT_COLUMNS = {"note", "status", "device", "scheduler", "router", "KV", "pool", "reason"}
RECOMMENDED = "★"


def table(result) -> tuple[list[dict], list[dict], str]:
    """Every deployment of the search, run or pruned, in the order the search visits them: (columns, rows, what
    every row shares). The cost column is in :attr:`~simkv.lab.plan.PlanResult.unit` ($/h with prices, else
    devices). A column every row has the same value in is left out of the columns (the rows keep it) and said once
    in the third item ("every deployment: bf16 KV, block 16, pool 0.9"), so the table fits the page and its reason
    column is read in full."""
    rec = result.recommended
    slo = result.target.slo
    found = [(_key(r), r, r["status"], r["reason"]) for r in result.rows]
    # a pruned deployment's reason ends with the deployment that met the SLO, in words: the table has it above
    found += [(_key(d), d, "pruned", why.removeprefix("pruned: ").split(" (")[0]) for d, why in result.pruned]
    order = {d: i for i, d in enumerate(_candidate_keys(result))}
    found.sort(key=lambda t: order.get(t[0], len(order)))
    rows = []
    for _, r, status, reason in found:
        row = {"note": RECOMMENDED if rec is not None and r is rec else "", "status": status, "devices": r["devices"],
               "device": r["device"], "scheduler": r.get("scheduler", ""), "tp": r["tp"], "replicas": r["replicas"], "router": r["router"],
               "KV": r["precision"], "block": r["block_size"], "pool": r["pool"],
               "batched tokens": r["max_num_batched_tokens"], "cost": round(result.cost(r), 4)}
        for s in slo:
            value = r.get(s.name + "_s")
            row[f"{s.name} (ms)"] = None if value is None else round(value * 1000, 1)
        row["reason"] = reason
        rows.append(row)
    headers = {**TABLE_COLUMNS, "cost": "$/h" if result.prices else "cost (devices)",
               **{f"{s.name} (ms)": f"{s.name} (ms)" for s in slo}, "reason": "reason"}
    constant = {k: rows[0][k] for k in ("device", "scheduler", "router", "KV", "block", "pool", "batched tokens")
                if rows and all(r[k] == rows[0][k] for r in rows)}
    shared = ", ".join(f"{headers[k]} {v}" for k, v in constant.items() if v != "-")  # "-": no router (one replica)
    columns = [{"name": name, "id": k, "type": "text" if k in TEXT_COLUMNS else "numeric",
                **({"format": {"specifier": ",~f"}} if k not in TEXT_COLUMNS else {})}
               for k, name in headers.items() if k not in constant and rows]
    return columns, rows, f"every deployment: {shared}" if shared else ""


def _candidate_keys(result) -> list[tuple]:
    from simkv.hfconfig import resolve_model
    from simkv.lab import plan

    deployments, _ = plan.candidates(result.space, resolve_model(result.target.model))
    return [_key(d) for d in deployments]


def _thin(t, y, n: int = MEMORY_POINTS):
    """At most ``n`` points of a line: per bucket of steps, the step with the highest value."""
    import numpy as np

    if len(y) <= n:
        return t, y
    edges = np.linspace(0, len(y), n + 1).astype(np.int64)
    idx = np.array([a + int(np.argmax(y[a:b])) for a, b in zip(edges[:-1], edges[1:])])
    return t[idx], y[idx]


def replica_memory_figure(served, row: dict):
    """Each replica's memory over simulated time: the pool allocated (above) and the blocks in use (below)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from simkv.lab.plan_figure import DEVICE_COLORS

    reps = served.replicas if served.spec.replicas > 1 else [served]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.4, 0.6], vertical_spacing=0.1,
                        subplot_titles=("allocated (the KV pool)", "in use (blocks holding requests' KV)"))
    for k, rep in enumerate(reps):
        s = rep.steps
        color = DEVICE_COLORS[k % len(DEVICE_COLORS)]
        name = f"replica {k}" + (f" ({len(rep.spec.requests):,} requests)" if len(reps) > 1 else "")
        t = s["time_s"]
        for panel, values in ((1, s["allocated_bytes"]), (2, s["allocated_bytes"] - s["reserved_bytes"])):
            x, y = _thin(t, values / GIB)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, legendgroup=name, showlegend=panel == 1,
                                     line={"color": color, "width": 1.5}), row=panel, col=1)
    for panel in (1, 2):
        fig.update_yaxes(title_text="GiB", rangemode="tozero", row=panel, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=2, col=1)
    n = row["replicas"]
    fig.update_layout(template="plotly_white", margin={"t": 60, "l": 60, "r": 20, "b": 40},
                      title=f"recommended deployment served again: memory over time, {n} replica{'s' if n > 1 else ''}"
                            f" ({row['devices']} x {row['device']}, tp {row['tp']})")
    return fig


def recommendation(result, line: str) -> dict:
    """The recommended deployment in words (or why there is none) and the command lines."""
    from simkv.lab import plan

    rec = result.recommended
    if rec is None:
        return {"text": "No deployment searched meets the SLO: add devices, raise max devices, or relax the SLO.",
                "detail": "", "plan": line, "run": ""}
    got = "; ".join(f"{s.name} {_ms(rec[s.name + '_s'])} (limit {_limit(s.limit_s)})" for s in result.target.slo)
    return {"text": f"Recommended: {plan.describe(rec)}", "detail": f"cost {_cost(result, rec)}; {got}",
            "plan": line, "run": plan.command(rec)}


def summary(result) -> str:
    ok = sum(r["meets_slo"] for r in result.rows)
    most = result.space.max_devices
    return (f"searched {len(result.rows) + len(result.pruned):,} deployments of {', '.join(result.space.devices)} "
            f"(at most {most} device{'s' if most > 1 else ''} each): {len(result.rows):,} run, {ok:,} meet the SLO, "
            f"{len(result.pruned):,} pruned; cost in {result.unit}")


#: The last few views by command line (pressing Run again, or going back to the same inputs, does not re-run).
_CACHE: OrderedDict[str, dict] = OrderedDict()
_CACHE_LOCK = threading.Lock()
CACHE_ITEMS = 4


def plan_view(form: dict) -> dict:
    """The whole view for the form's values (plain data and plotly figures; no Dash).

    ``{"ok", "status", "cli", "errors": {key: message}, "recommended", "figure", "memory", "columns", "rows",
    "shared", "notes"}``; an invalid form or a search that cannot run is ``ok: False`` with a one-line ``status``
    (a bad field's message is in ``errors``, shown next to it; the status names the field).
    """
    from simkv.lab import plan
    from simkv.lab.plan_figure import plan_figure
    from simkv.serving import serve

    try:
        i = inputs(form)
    except st.Invalid as err:
        return {"ok": False, "errors": err.errors, "cli": "", "status": st.invalid_status(err.errors, LABELS)}
    line = i.line
    with _CACHE_LOCK:
        if line in _CACHE:
            _CACHE.move_to_end(line)
            return _CACHE[line]
    try:
        check_work(i)
        result = plan.run_plan(i.target, i.space, i.prices, workers=1)
        rec = result.recommended
        served = serve(plan.spec_of(rec)) if rec is not None else None
    except st.Invalid as err:
        return {"ok": False, "errors": err.errors, "cli": line,
                "status": st.invalid_status(err.errors, LABELS, "Over the dashboard's limits") + f" Run it with: {line}"}
    except SimkvError as err:
        return {"ok": False, "errors": {}, "cli": line, "status": f"Cannot plan this: {err}"}
    figure = plan_figure(result)
    memory = replica_memory_figure(served, rec) if served is not None else None
    columns, rows, shared = table(result)
    view = {"ok": True, "errors": {}, "cli": line, "status": summary(result),
            "recommended": recommendation(result, line), "figure": figure, "memory": memory,
            "columns": columns, "rows": rows, "shared": shared,
            "notes": [f"not searched: {s}" for s in result.skipped]}
    with _CACHE_LOCK:
        _CACHE[line] = view
        while len(_CACHE) > CACHE_ITEMS:
            _CACHE.popitem(last=False)
    return view


def live(form: dict) -> dict:
    """What the form says as it is typed, before Run: the ``simkv plan`` line (empty while a field is wrong), each
    bad field's message, and how much work Run will be (the progress line while it runs)."""
    try:
        i = inputs(form)
    except st.Invalid as err:
        return {"cli": "", "errors": err.errors, "work": ""}
    except Exception as err:  # noqa: BLE001 - never a traceback in the browser
        return {"cli": "", "errors": {"pl_slo": internal_error(err)}, "work": ""}
    try:
        n = check_work(i)
    except st.Invalid as err:
        return {"cli": i.line, "errors": err.errors, "work": ""}
    return {"cli": i.line, "errors": {},
            "work": f"Searching {n:,} deployments × {i.requests:,} requests (fewer once one meets the SLO)…"}


# -- Dash ------------------------------------------------------------------------------------------------

QUESTION = "Which deployment is the cheapest that meets a latency SLO for this traffic?"


def workspace(values: dict) -> list:
    """The Plan workspace: its form and Run on the left (:data:`FIELDS`), its results on the right."""
    return [
        html.Div(className="sidebar", id="pl-sidebar", children=[
            html.H2("Plan"), html.Div(QUESTION, className="hint question"),
            *form_fields(FIELDS, values, "pl-err"),
            html.Div(className="run-row", children=[
                html.Button("Run", id="pl-run", className="btn run"),
                html.Div(f"≤ {MAX_WORK:,} requests served in all (deployments × requests)", className="hint"),
            ]),
        ]),
        html.Div(className="main", children=[
            html.Div(className="cli", children=["same search: ", html.Code(id="pl-cli")]),
            html.Div("Set the traffic, the model, the SLO and the devices to choose from on the left, then Run.",
                     id="pl-status", className="status", role="status"),
            progress("pl-progress", "Searching…"),
            html.Div(id="pl-results", className="results", children=[
                html.Div(id="pl-recommended", className="pl-rec"),
                graph("pl-graph", "simkv-plan"),
                graph("pl-memory-graph", "simkv-plan-memory"),
                html.Div(id="pl-shared", className="note"),
                data_table(id="pl-table", columns=[], data=[], page_size=12, sort_action="native",
                           filter_action="native", style_table={"overflowX": "auto"},
                           style_cell={"fontFamily": "ui-monospace, monospace", "fontSize": 11, "padding": "2px 5px",
                                       "whiteSpace": "normal", "height": "auto"},
                           style_cell_conditional=[
                               {"if": {"column_id": "reason"}, "minWidth": 220, "textAlign": "left"},
                               {"if": {"column_id": "note"}, "width": 16, "color": "#9a6700"},
                               *({"if": {"column_id": c}, "whiteSpace": "nowrap"} for c in ("device", "status")),
                               *({"if": {"column_id": c}, "textAlign": "left"} for c in TEXT_COLUMNS)],
                           style_header={"fontWeight": "600", "backgroundColor": "#f1f3f5", "whiteSpace": "normal"},
                           style_data_conditional=[
                               {"if": {"filter_query": '{status} = "ok"', "column_id": "status"}, "color": "#1a7f37"},
                               {"if": {"filter_query": f'{{note}} = "{RECOMMENDED}"'}, "fontWeight": "700",
                                "backgroundColor": "#dafbe1"},
                           ]),
                html.Div(id="pl-notes", className="hint"),
            ]),
        ]),
    ]


def _recommended_block(rec: dict) -> list:
    lines = [html.Div(rec["text"], id="pl-rec-text", className="pl-rec-head")]
    if rec["detail"]:
        lines.append(html.Div(rec["detail"], id="pl-rec-detail"))
    lines.append(html.Div(["this search: ", html.Code(rec["plan"], id="pl-rec-plan")]))
    if rec["run"]:
        lines.append(html.Div(["this deployment: ", html.Code(rec["run"], id="pl-rec-run")]))
    return lines


def plan_callback(_clicks, form: dict) -> dict:
    """The Run button's outputs: the view, or one line saying why there is none (and placeholders)."""
    try:
        view = plan_view(form)
    except Exception as err:  # noqa: BLE001 - never a traceback in the browser
        view = {"ok": False, "errors": {}, "cli": "", "status": internal_error(err)}
    if not view["ok"]:
        blank = compute.placeholder_figure("No plan: see the message above.")
        return {"status": view["status"], "status_class": "status invalid", "recommended": [], "figure": blank,
                "memory": blank, "columns": [], "rows": [], "shared": "", "notes": ""}
    memory = view["memory"] or compute.placeholder_figure("No deployment meets the SLO: nothing to serve again.",
                                                          error=False)
    return {"status": view["status"], "status_class": "status", "recommended": _recommended_block(view["recommended"]),
            "figure": compute.style(view["figure"]), "memory": compute.style(memory), "columns": view["columns"],
            "rows": view["rows"], "shared": view["shared"], "notes": "; ".join(view["notes"])}


def live_callback(form: dict) -> dict:
    out = live(form)
    return {"cli": out["cli"], "errors": [out["errors"].get(k, "") for k in KEYS],
            "work": out["work"] or "Searching…"}


#: The Run callback's outputs: key -> (component id, property).
OUTPUTS = {"status": ("pl-status", "children"), "status_class": ("pl-status", "className"),
           "recommended": ("pl-recommended", "children"), "figure": ("pl-graph", "figure"),
           "memory": ("pl-memory-graph", "figure"), "columns": ("pl-table", "columns"), "rows": ("pl-table", "data"),
           "shared": ("pl-shared", "children"), "notes": ("pl-notes", "children")}


def register(app) -> None:
    app.callback(
        output={k: Output(*where) for k, where in OUTPUTS.items()},
        inputs={"_clicks": Input("pl-run", "n_clicks"), "form": {k: State(k, "value") for k in KEYS}},
        running=busy("pl-progress", "pl-results", button="pl-run"),
        prevent_initial_call=True,
    )(plan_callback)
    app.callback(
        output={"cli": Output("pl-cli", "children"), "errors": errors_out("pl-err"),
                "work": Output("pl-progress-text", "children")},
        inputs={"form": {k: Input(k, "value") for k in KEYS}},
    )(live_callback)
    register_shown(app, FIELDS)


__all__ = ["workspace", "plan_view", "plan_callback", "live", "register", "inputs", "check_work",
           "replica_memory_figure", "table", "MAX_REQUESTS", "MAX_WORK", "MAX_DEVICES"]

"""The dashboard's Tune view: the same search as ``simkv tune`` (simkv.lab.tune), on the sidebar's scenario.

In: parameter ranges (empty = the policy's tunable defaults), objectives,
constraints, the workload distribution (Azure conversation decode lengths, or
the sidebar's one workload), search, budget and seed; the device is the
sidebar's, as for every Session view. Out: the ``simkv tune ... --device D``
line of the same search (:func:`tune_command`), the Pareto front figure and
table, the recommendation against the defaults. Clicking a point
sets the sidebar's policy parameters to it and opens the what-if view.

A search runs only when "Run" is pressed (it takes seconds), in the server
process (no worker pool), bounded by :data:`MAX_SIMULATIONS` so a request
cannot take minutes.
"""

from __future__ import annotations

import json

from dash import ALL, Input, Output, State, dcc, html, no_update

from simkv.errors import SimkvError

from simkv.dashboard import state as st
from simkv.dashboard.components import busy, data_table, dropdown, graph, internal_error, popt_ids, progress, text_input
from simkv.dashboard.compute import placeholder_figure, style

#: Simulations (configurations × workloads) one dashboard search may run.
MAX_SIMULATIONS = 6_000
DEFAULT_FORM = {"tune_params": "", "tune_objectives": ["peak:max", "reallocs:mean"], "tune_constraints": "",
                "tune_workloads": "trace", "tune_samples": 64, "tune_search": "optuna", "tune_budget": 40, "tune_seed": 0}
TABLE_STYLE = {"fontFamily": "ui-monospace, monospace", "fontSize": 12, "padding": "2px 6px"}


def tune_tab() -> html.Div:
    from simkv.lab.tune import AGGREGATES, METRICS, SEARCHES

    objectives = [{"label": f"{m}:{a}", "value": f"{m}:{a}"} for m in METRICS for a in AGGREGATES]
    d = DEFAULT_FORM
    return html.Div(className="tab-body", children=[
        html.Div(className="row", children=[
            html.Div(className="field grow", children=[
                html.Label("parameters (KEY=START:STOP:STEP or KEY=V1,V2; separated by ;)", htmlFor="tune_params"),
                text_input("tune_params", d["tune_params"]),
            ]),
            html.Div(className="field grow", children=[
                html.Label("constraints (METRIC[:mean|max]<=VALUE; …)", htmlFor="tune_constraints"),
                text_input("tune_constraints", d["tune_constraints"], placeholder="e.g. spike:max<=64MiB"),
            ]),
        ]),
        html.Div(className="row", children=[
            html.Div(className="field grow", children=[
                html.Label("objectives (minimised; the first decides the recommendation)", htmlFor="tune_objectives"),
                dcc.Dropdown(id="tune_objectives", options=objectives, value=d["tune_objectives"], multi=True,
                             clearable=False, className="dd"),
            ]),
            html.Div(className="field", children=[
                html.Label("workloads", htmlFor="tune_workloads"),
                dropdown("tune_workloads", [{"label": "Azure conversation decode lengths", "value": "trace"},
                                            {"label": "the scenario's one workload", "value": "scenario"}],
                         d["tune_workloads"]),
            ]),
            html.Div(className="field", children=[
                html.Label("samples", htmlFor="tune_samples"),
                dcc.Input(id="tune_samples", type="number", value=d["tune_samples"], min=1, className="text"),
            ]),
            html.Div(className="field", children=[
                html.Label("search", htmlFor="tune_search"),
                dropdown("tune_search", [{"label": s, "value": s} for s in SEARCHES], d["tune_search"]),
            ]),
            html.Div(className="field", children=[
                html.Label("budget", htmlFor="tune_budget"),
                dcc.Input(id="tune_budget", type="number", value=d["tune_budget"], min=1, className="text"),
            ]),
            html.Div(className="field", children=[
                html.Label("seed", htmlFor="tune_seed"),
                dcc.Input(id="tune_seed", type="number", value=d["tune_seed"], min=0, className="text"),
            ]),
            html.Button("Run", id="tune-run", className="btn run"),
        ]),
        html.Details(className="cli", children=[html.Summary("the same search from the command line"),
                                                html.Code(id="tune-cli")]),
        html.Div(id="tune-status", className="note", role="status"),
        progress("tune-progress", "Searching…"),
        html.Div(id="tune-results", className="results", children=[
            graph("tune-graph", "simkv-tune"),
            html.Div("Click a point to open it in Memory over steps.", className="hint"),
            data_table(id="tune-table", columns=[], data=[], page_size=12, sort_action="native",
                       style_cell=TABLE_STYLE, style_header={"fontWeight": "600", "backgroundColor": "#f1f3f5"}),
        ]),
    ])


def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(";") if part.strip()]


def _int(value, name: str, lo: int, hi: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise SimkvError(f"{name} must be a whole number") from None
    if not lo <= number <= hi:
        raise SimkvError(f"{name} must be in {lo:,}..{hi:,}")
    return number


def tune_spec(kwargs: dict | None, form: dict):
    """The search of the sidebar's scenario (``kwargs`` of build_scenario) and the form's values, and how many
    simulations it runs; :class:`SimkvError` says what is wrong (or over :data:`MAX_SIMULATIONS`)."""
    from simkv.lab import traces, tune

    if not kwargs:
        raise SimkvError("fix the scenario on the left first")
    if kwargs.get("ops"):
        raise SimkvError("tuning draws prompt and decode lengths: clear the explicit operations (ops) first")
    base = {k: v for k, v in kwargs.items()}
    policy = base["policy"]
    samples = _int(form.get("tune_samples"), "samples", 1, traces.MAX_SAMPLES)
    budget = _int(form.get("tune_budget"), "budget", 1, tune.MAX_BUDGET)
    seed = _int(form.get("tune_seed"), "seed", 0, 2**32 - 1)
    if form.get("tune_workloads") == "trace":
        _, decodes = traces.sample(traces.AZURE_CONV, samples, seed)
        workloads = [(base["prompt"], int(d)) for d in decodes]
    else:
        workloads = [(base["prompt"], base["decode"])]
    spec = tune.TuneSpec(
        base=base, params=[tune.Param.parse(p, policy) for p in (_split(form.get("tune_params")) or tune.TUNABLE.get(policy, ()))],
        workloads=workloads, objectives=[tune.Objective.parse(o) for o in form.get("tune_objectives") or ()],
        constraints=[tune.Constraint.parse(c) for c in _split(form.get("tune_constraints"))],
        search=form.get("tune_search") or "optuna", budget=budget, seed=seed)
    configs = spec.grid_size if spec.search == "grid" else budget
    simulations = (configs + 1) * len(workloads)
    if simulations > MAX_SIMULATIONS:
        raise SimkvError(f"{simulations:,} simulations; the dashboard runs at most "
                         f"{MAX_SIMULATIONS:,}: lower the budget or the samples (or use `simkv tune`)")
    return spec, configs, simulations


def tune_command(kwargs: dict | None, form: dict) -> str:
    """The ``simkv tune`` command line of the search Run starts: the sidebar's scenario on its device (``--device``
    always, as the search runs on it: its memory, its runtime's weights) and the form's search; "" while the
    scenario is invalid. The Azure conversation workloads are ``--trace azure-conv --samples N`` (the same draw,
    simkv.lab.traces.split)."""
    import shlex

    if not kwargs:
        return ""
    trace = form.get("tune_workloads") == "trace"
    parts = ["simkv", "tune", *st.scenario_argv(kwargs, lengths=not trace), "--device", kwargs["device"]]
    if kwargs.get("device_memory") is not None:
        parts += ["--device-memory", kwargs["device_memory"]]
    if trace:
        parts += ["--trace", "azure-conv", "--samples", str(form.get("tune_samples"))]
    for param in _split(form.get("tune_params")):
        parts += ["--param", param]
    for objective in form.get("tune_objectives") or ():
        parts += ["--objective", objective]
    for constraint in _split(form.get("tune_constraints")):
        parts += ["--constraint", constraint]
    parts += ["--search", str(form.get("tune_search") or "optuna"), "--budget", str(form.get("tune_budget")),
              "--seed", str(form.get("tune_seed"))]
    return shlex.join(parts)


def work_text(kwargs: dict | None, form: dict) -> str:
    """The progress line of a search: how much work Run starts."""
    try:
        spec, configs, simulations = tune_spec(kwargs, form)
    except Exception:  # noqa: BLE001 - Run says what is wrong
        return "Searching…"
    return (f"Searching {configs:,} configurations and the defaults × {len(spec.workloads):,} workload"
            f"{'s' if len(spec.workloads) > 1 else ''} = {simulations:,} simulations…")


#: Points of the figure that decide its axes: an axis spanning more than FOCUS_RATIO × theirs is cut to theirs.
FOCUS = ("Pareto front", "defaults", "recommendation")
FOCUS_RATIO = 3.0


def focus_axes(fig) -> int:
    """Keep the front readable: an axis that a few far configurations stretch to over :data:`FOCUS_RATIO` times
    the span of the front, the defaults and the recommendation is cut to that span (plus half of it), and a
    note says how many configurations lie beyond (a double-click shows them: plotly resets to all). Returns how
    many are beyond."""
    import numpy as np

    beyond = np.zeros(0, dtype=bool)
    pts = {"x": [], "y": []}
    focus = {"x": [], "y": []}
    for trace in fig.data:
        for axis in ("x", "y"):
            values = [v for v in (getattr(trace, axis) or ()) if v is not None]
            pts[axis] += values
            if trace.name in FOCUS:
                focus[axis] += values
    if not focus["x"] or not pts["x"]:
        return 0
    ranges = {}
    for axis in ("x", "y"):
        lo, hi = min(focus[axis]), max(focus[axis])
        span = max(hi - lo, abs(hi) * 0.05, 1e-9)
        if max(pts[axis]) - min(pts[axis]) > FOCUS_RATIO * span:
            low = lo - span / 2 if min(pts[axis]) < 0 else max(lo - span / 2, -span / 20)  # counts stay at 0
            ranges[axis] = (low, hi + span / 2)
    if not ranges:
        return 0
    x, y = np.asarray(pts["x"], dtype=float), np.asarray(pts["y"], dtype=float)
    beyond = np.zeros(len(x), dtype=bool)
    for axis, values in (("x", x), ("y", y)):
        if axis in ranges:
            beyond |= (values < ranges[axis][0]) | (values > ranges[axis][1])
    for axis, (lo, hi) in ranges.items():
        getattr(fig, f"update_{axis}axes")(range=[lo, hi])
    n = int(beyond.sum())
    if n:
        fig.add_annotation(text=f"{n:,} configuration{'s' if n > 1 else ''} beyond these axes: double-click to see all",
                           xref="paper", yref="paper", x=1, y=1, xanchor="right", yanchor="bottom", showarrow=False,
                           font={"size": 11, "color": "#57606a"})
    return n


def tune_view(kwargs: dict | None, form: dict) -> dict:
    """The Tune view for the sidebar's scenario (``kwargs`` of build_scenario) and the form's values."""
    from simkv.lab import sweep, tune

    spec, _, _ = tune_spec(kwargs, form)
    workloads = spec.workloads
    result = tune.run_tune(spec, workers=1)
    keys = [p.key for p in spec.params]
    defaults = sweep.scenario_of(spec.base).policy
    rows = []
    for c in result.pareto + [result.baseline]:
        params = {k: c.params.get(k, getattr(defaults, k, "")) for k in keys}
        tag = "defaults" if c is result.baseline else ("recommended" if c is result.recommendation else "")
        rows.append({**params, **{o.name: o.show(c.objectives[o.name]) for o in spec.objectives}, "note": tag})
    if result.improved:
        o = spec.objectives[0]
        b, r = result.baseline.objectives[o.name], result.recommendation.objectives[o.name]
        status = (f"{len(result.evaluated)} configurations × {len(workloads)} workloads; recommended "
                  f"{', '.join(f'{k}={v}' for k, v in result.recommendation.params.items())}: {o.name} {o.show(r)} "
                  f"vs {o.show(b)} with the defaults, no worse on the other objectives")
    else:
        status = f"{len(result.evaluated)} configurations × {len(workloads)} workloads: nothing beats the defaults"
    figure = style(tune.figure(result))
    focus_axes(figure)
    return {"figure": figure, "rows": rows, "columns": [{"name": k, "id": k} for k in rows[0]], "status": status}


def tune_callback(_clicks, store: dict | None, form: dict) -> dict:
    try:
        view = tune_view((store or {}).get("kwargs") if (store or {}).get("ok") else None, form)
    except SimkvError as err:
        return {"figure": placeholder_figure("No search: see the message above."), "rows": [], "columns": [],
                "status": f"Cannot tune: {err}"}
    except Exception as err:  # noqa: BLE001 - never a traceback in the browser
        return {"figure": placeholder_figure("No search: see the message above."), "rows": [], "columns": [],
                "status": internal_error(err)}
    return view


def open_point(click: dict | None, policy: str, popt_ids: list[dict]) -> dict:
    """A clicked point's parameters into the sidebar's policy inputs, and the what-if tab."""
    try:
        params = json.loads(click["points"][0]["customdata"])
    except (TypeError, KeyError, IndexError, ValueError):
        return {"popts": [no_update] * len(popt_ids), "tab": no_update}
    defaults = st.policy_defaults(policy)
    values = []
    for i in popt_ids:
        if i["policy"] != policy:
            values.append(no_update)
        else:
            values.append(str(params[i["field"]]) if i["field"] in params else defaults[i["field"]])
    return {"popts": values, "tab": "memory"}


def register(app) -> None:
    from simkv.lab.tune import TUNABLE

    form = {k: State(k, "value") for k in DEFAULT_FORM}
    app.callback(
        output={"figure": Output("tune-graph", "figure"), "rows": Output("tune-table", "data"),
                "columns": Output("tune-table", "columns"), "status": Output("tune-status", "children")},
        inputs={"_clicks": Input("tune-run", "n_clicks"), "store": State("run-store", "data"), "form": form},
        running=busy("tune-progress", "tune-results", button="tune-run"),
        prevent_initial_call=True,
    )(tune_callback)

    @app.callback(output={"work": Output("tune-progress-text", "children"), "cli": Output("tune-cli", "children")},
                  inputs={"store": Input("run-store", "data"), "tab": Input("tab", "value"),
                          "form_values": {k: Input(k, "value") for k in DEFAULT_FORM}})
    def work(store, tab, form_values):
        if tab != "tune":  # only the open Tab's Run can start a search
            return {"work": no_update, "cli": no_update}
        kwargs = (store or {}).get("kwargs") if (store or {}).get("ok") else None
        return {"work": work_text(kwargs, form_values), "cli": tune_command(kwargs, form_values)}

    @app.callback(Output("tune_params", "placeholder"), Input("policy", "value"))
    def params_hint(policy):
        return "; ".join(TUNABLE.get(policy, ())) or "this policy has no tunable defaults: give KEY=…"

    ids = popt_ids()

    @app.callback(
        output={"popts": Output({"type": "popt", "policy": ALL, "field": ALL}, "value", allow_duplicate=True),
                "tab": Output("tab", "value", allow_duplicate=True)},
        inputs={"click": Input("tune-graph", "clickData")},
        state={"policy": State("policy", "value")},
        prevent_initial_call=True,
    )
    def clicked(click, policy):
        return open_point(click, policy, ids)


__all__ = ["tune_tab", "tune_view", "tune_callback", "tune_command", "open_point", "register", "MAX_SIMULATIONS"]

"""The dashboard's callbacks: thin wrappers from control values to :mod:`simkv.dashboard.compute`.

Every callback catches what can go wrong: a :class:`simkv.errors.SimkvError` is
shown as its one-line message next to the control at fault, anything else as a
one-line "internal error" status (logged with its traceback on the server,
never shown in the browser). Invalid input clears the figures and cards, so
nothing stale is shown as current.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from dash import ALL, Input, Output, State, dcc, html, no_update

from policies import REGISTRY
from simkv import figures

from simkv.dashboard import compute, layout as lay, state as st, url
from simkv.dashboard.components import busy, internal_error, popt_ids, render_cards
from simkv.dashboard.validation import ReportError, event_rows, load_path, load_upload, summary_cards

SCENARIO_KEYS = ("model", *st.DIMS, "precision", "policy", *st.WORKLOAD_FIELDS, "ops", "device", "device_memory")
#: Pattern-matching ids in layout order: the order Dash lists ALL inputs and outputs in.
POPT_IDS = popt_ids()
ERR_KEYS = lay.err_keys()
#: Ledger rows above which the CSV is not sent through the browser.
MAX_CSV_ROWS = 1_000_000


def state_from(controls: dict, popt_values: list) -> dict:
    """The state dict of the controls' values and the policy parameter inputs (in :data:`POPT_IDS` order)."""
    state = {**st.DEFAULTS, **{k: v for k, v in controls.items()}}
    policy = state.get("policy")
    state["popts"] = {
        i["field"]: ("" if v is None else str(v))
        for i, v in zip(POPT_IDS, popt_values or [])
        if i["policy"] == policy
    }
    return state


# -- main -----------------------------------------------------------------------------

def _inline(key: str, message: str) -> str:
    """A message shown next to its control: without the control's label in front."""
    label = st.label_of(key)
    return message[len(label) + 2:] if message.startswith(label + ": ") else message


def main_callback(controls: dict, popt_values: list) -> dict:
    """The main view: timeline, heatmap, cards, status, inline errors and the run's store."""
    state = state_from(controls, popt_values)
    try:
        view = compute.main_view(state)
    except Exception as err:  # noqa: BLE001 - never a traceback in the browser
        view = compute.MainView(ok=False, status=internal_error(err))
    if not view.ok:
        blank = compute.placeholder_figure("No result: " + (
            "see the message above." if view.notice else "fix the input marked in red." if view.errors
            else "the simulation failed."))
        return {
            "timeline": blank, "heatmap": blank, "cards": render_cards(None),
            "status": view.status, "status_class": "status invalid", "warning": "", "notice": view.notice,
            "cli": "", "errors": [_inline(k, view.errors.get(k, "")) for k in ERR_KEYS],
            "store": {"ok": False},
        }
    return {
        "timeline": view.timeline, "heatmap": view.heatmap, "cards": render_cards(view.cards),
        "status": view.status, "status_class": "status", "warning": view.warning or "", "notice": "",
        "cli": view.cli, "errors": [""] * len(ERR_KEYS),
        "store": {"ok": True, "kwargs": view.kwargs},
    }


# -- URL ------------------------------------------------------------------------------------

def restore_callback(search: str | None, current: dict, current_popts: list) -> dict:
    """Every control as the link says; controls already right are left alone (``no_update``),
    since each changed control costs the browser a round of dependent callbacks."""
    state, ignored = url.decode(search)
    wanted = [
        state["popts"].get(i["field"]) if i["policy"] == state["policy"] else st.policy_defaults(i["policy"])[i["field"]]
        for i in POPT_IDS
    ]
    current_popts = list(current_popts or [None] * len(POPT_IDS))
    note = f"link: ignored {', '.join(ignored)}" if ignored else ""
    return {
        "controls": {k: (no_update if current.get(k) == state[k] else state[k]) for k in current},
        "popts": [no_update if have == want else want for have, want in zip(current_popts, wanted)],
        "note": note,
    }


# -- compare ----------------------------------------------------------------------------

def delta_table_component(labels: list[str], rows: list[dict]) -> html.Table:
    """The compare table: a column per run, its value and, under it, its difference from run A (green: lower,
    red: higher; lower is better for every metric). Four runs fit a 1280 px wide page; the labels wrap."""
    _, body = compute.format_delta_rows(rows, labels)
    cells = []
    for raw, line in zip(rows, body):
        tds = [html.Td(line[0]), html.Td(line[1])]
        for j, label in enumerate(labels[1:]):
            value, diff_text = line[2 + 2 * j], line[3 + 2 * j]
            diff = raw[f"{label} − {labels[0]}"]
            cls = "better" if diff is not None and diff < 0 else "worse" if diff else None
            tds.append(html.Td([value, html.Div(diff_text, className="diff " + (cls or ""))]))
        cells.append(html.Tr(tds))
    heads = [html.Th("metric"), html.Th(labels[0])] + [html.Th([label, html.Div(f"{label.split(':')[0]} − A",
                                                                               className="diff")])
                                                     for label in labels[1:]]
    return html.Table(id="delta", children=[html.Thead(html.Tr(heads)), html.Tbody(cells)])


def compare_callback(store: dict | None, cmp_values: dict, quantity: str, tab: str) -> dict:
    keys = [f"cmp{i}" for i in range(1, st.N_COMPARE + 1)]
    if tab != "compare":
        return {"figure": no_update, "table": no_update, "message": no_update, "errors": [no_update] * len(keys)}
    state = {**st.DEFAULTS, **cmp_values}
    try:
        if not (store or {}).get("ok"):
            view = compute.CompareView(ok=False, message="No run A: fix the inputs marked in red on the left.")
        else:
            view = compute.compare_view(store["kwargs"], state, quantity)
    except Exception as err:  # noqa: BLE001
        view = compute.CompareView(ok=False, message=internal_error(err))
    errors = [
        "; ".join(v for k, v in view.errors.items() if k.startswith(key + "_")) for key in keys
    ]
    if not view.ok:
        return {"figure": compute.placeholder_figure(view.message or "No comparison: fix the run marked in red."),
                "table": "", "message": view.message, "errors": errors}
    return {"figure": view.figure, "table": delta_table_component(view.labels, view.rows),
            "message": "", "errors": errors}


# -- events ------------------------------------------------------------------------------

def table_callback(store, page, size, sort_by, query) -> tuple:
    if not (store or {}).get("ok"):
        return [], 1, "No result: nothing to list."
    try:
        result = compute.run(store["kwargs"])
        out = compute.ledger_page(result, page, size, sort_by, query)
    except st.Invalid:
        return [], 1, "No result: nothing to list."
    except Exception as err:  # noqa: BLE001
        return [], 1, internal_error(err)
    note = f"{out['total']:,} ledger rows"
    if out["matched"] != out["total"]:
        note += f", {out['matched']:,} match the filter"
    note += f"; page {out['page'] + 1:,} of {out['pages']:,} (rows are paged on the server)"
    if out["error"]:
        note += f" — filter ignored: {out['error']}"
    return out["records"], out["pages"], note


# -- downloads ---------------------------------------------------------------------------

def ledger_csv(store) -> tuple:
    if not (store or {}).get("ok"):
        return no_update, "No result to download."
    try:
        result = compute.run(store["kwargs"])
        if len(result.ledger) > MAX_CSV_ROWS:
            return no_update, (f"{len(result.ledger):,} rows: too many for the browser; "
                               f"use: {st.cli_command(store['kwargs'])} --ledger ledger.csv")
        with tempfile.TemporaryDirectory() as tmp:
            path = result.ledger.write(Path(tmp) / "simkv-ledger.csv")
            data = dcc.send_file(str(path), filename="simkv-ledger.csv", type="text/csv")
        return data, f"ledger: {len(result.ledger):,} rows"
    except Exception as err:  # noqa: BLE001
        return no_update, internal_error(err)


def figures_html(store, heat: str) -> tuple:
    if not (store or {}).get("ok"):
        return no_update, "No result to download."
    try:
        result = compute.run(store["kwargs"])
        tl, hm = compute.display_figures(result, heat)
        body = tl.to_html(include_plotlyjs=True, full_html=False, div_id="timeline")
        body += hm.to_html(include_plotlyjs=False, full_html=False, div_id="layers")
        title = result.scenario.describe()
        page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>simkv: {title}</title></head>"
                f"<body><h3>{title}</h3><p><code>{st.cli_command(store['kwargs'])}</code></p>{body}</body></html>")
        return dict(content=page, filename="simkv-figures.html", type="text/html"), "figures: HTML"
    except Exception as err:  # noqa: BLE001
        return no_update, internal_error(err)


# -- validation ---------------------------------------------------------------------------

def validation_callback(contents, path, filename, trigger: str | None = None) -> dict:
    """The validation tab for an upload (``contents``) or a server path; ``trigger`` says which changed last."""
    empty = {"figure": compute.placeholder_figure("Load a simkv validate report (upload or path).", error=False),
             "cards": [], "rows": [], "note": "", "message": ""}
    try:
        if trigger == "v-upload" and contents:
            report, source = load_upload(contents), filename or "upload"
        elif path and path.strip():
            report, source = load_path(path), path.strip()
        elif contents:
            report, source = load_upload(contents), filename or "upload"
        else:
            return empty
    except ReportError as err:
        return {**empty, "figure": compute.placeholder_figure("No report: see the message above."), "message": str(err)}
    except Exception as err:  # noqa: BLE001
        return {**empty, "message": internal_error(err)}
    try:
        fig = compute.style(figures.validation_figure(report))
        rows, note = event_rows(report)
        scenario = report.get("scenario") or {}
        versions = report.get("versions") or {}
        note = f"{source}: {note}" + (f"; scenario {json.dumps(scenario)}" if scenario else "") + (
            f"; versions {json.dumps(versions)}" if versions else "")
        return {"figure": fig, "cards": render_cards(summary_cards(report)), "rows": rows, "note": note, "message": ""}
    except Exception as err:  # noqa: BLE001
        return {**empty, "message": internal_error(err)}


# -- registration -------------------------------------------------------------------------

def register(app) -> None:
    global POPT_IDS, ERR_KEYS
    POPT_IDS, ERR_KEYS = popt_ids(), lay.err_keys()  # policies registered since import appear too
    popt_in = Input({"type": "popt", "policy": ALL, "field": ALL}, "value")
    controls_in = {k: Input(k, "value") for k in SCENARIO_KEYS + ("heat",)}

    app.callback(
        output={
            "timeline": Output("timeline-graph", "figure"),
            "heatmap": Output("heatmap-graph", "figure"),
            "cards": Output("cards", "children"),
            "status": Output("status", "children"),
            "status_class": Output("status", "className"),
            "warning": Output("warning", "children"),
            "notice": Output("notice", "children"),
            "cli": Output("cli", "children"),
            "errors": Output({"type": "err", "key": ALL}, "children"),
            "store": Output("run-store", "data"),
        },
        inputs={"controls": controls_in, "popt_values": popt_in},
        running=busy("progress", "results"),
    )(main_callback)

    # Only the open workspace is on the page.
    app.clientside_callback(
        """function(ws) {
            return ["session", "serving", "plan"].map(name => name === ws ? {} : {display: "none"});
        }""",
        [Output(f"ws-{name}", "style") for name in url.WORKSPACES],
        Input("ws", "value"),
        prevent_initial_call=True,
    )

    # URL. A page load is served with the link's values (layout.serve_layout); from then on
    # the controls are pushed to the address bar as they change, and back/forward (or a
    # Referer that lost the query) restores them. Restoring is rare: it touches many controls.
    app.clientside_callback(
        """function(served) {
            if (!window._simkvNav) {
                window._simkvNav = true;
                window.addEventListener('popstate', function() {
                    window.dash_clientside.set_props('nav', {data: {search: window.location.search, at: Date.now()}});
                });
            }
            return window.location.search === (served || '') ? window.dash_clientside.no_update
                : {search: window.location.search, at: Date.now()};
        }""",
        Output("nav", "data"),
        Input("served-search", "data"),
    )
    app.clientside_callback(
        """function(search) {
            search = search || '';
            if (search !== window.location.search) {
                window.history.pushState({}, '', window.location.pathname + search + window.location.hash);
            }
            return search;
        }""",
        Output("url-pushed", "data"),
        Input("url-search", "data"),
        prevent_initial_call=True,
    )
    restore_out = {k: Output(k, "value") for k in url.CONTROLS}

    @app.callback(
        output={"controls": restore_out, "popts": Output({"type": "popt", "policy": ALL, "field": ALL}, "value"),
                "note": Output("url-note", "children")},
        inputs={"nav": Input("nav", "data")},
        state={"current": {k: State(k, "value") for k in restore_out},
               "current_popts": State({"type": "popt", "policy": ALL, "field": ALL}, "value")},
        prevent_initial_call=True,
    )
    def restore(nav, current, current_popts):
        return restore_callback((nav or {}).get("search", ""), current, current_popts)

    @app.callback(
        Output("url-search", "data"),
        inputs={"controls": {k: Input(k, "value") for k in url.CONTROLS}, "popt_values": popt_in},
        prevent_initial_call=True,
    )
    def sync_url(controls, popt_values):
        return url.encode(state_from(controls, popt_values))

    app.clientside_callback(
        "function(n) { return window.location.href; }",
        Output("copy-link", "content"),
        Input("copy-link", "n_clicks"),
        prevent_initial_call=True,
    )

    # Controls that follow other controls.
    @app.callback(
        Output({"type": "popt-block", "policy": ALL}, "style"),
        Output("policy-summary", "children"),
        Output("precision", "options"),
        Input("policy", "value"),
    )
    def policy_changed(policy):
        styles = [{} if name == policy else {"display": "none"} for name in REGISTRY]
        summary = REGISTRY[policy].summary if policy in REGISTRY else ""
        return styles, summary, lay.precision_options(policy)

    @app.callback(
        [Output(d, "placeholder") for d in st.DIMS] + [Output("dims-hint", "children")],
        Input("model", "value"),
    )
    def model_changed(model):
        from simkv.hfconfig import all_presets

        preset = all_presets().get(model)
        if preset is None:
            return ["required", "heads or KV heads", "heads or KV heads", "required",
                    "Custom model: enter layers, head size and heads (KV heads)"]
        hint = (f"Dimensions: {preset.name}'s layers differ; leave these empty" if preset.layer_kv
                else f"Dimensions (empty = {preset.name}'s)")
        return [str(getattr(preset, d)) for d in st.DIMS] + [hint]

    @app.callback(
        [Output(k, "disabled") for k in st.WORKLOAD_FIELDS] + [Output("ops-note", "children"), Output("ops-details", "open")],
        Input("ops", "value"),
    )
    def ops_changed(ops):
        active = bool((ops or "").strip())
        note = "The explicit operations below replace these fields." if active else ""
        return [active] * len(st.WORKLOAD_FIELDS) + [note, active or no_update]

    for i in range(1, st.N_COMPARE + 1):
        @app.callback(Output(f"cmp{i}_opts", "placeholder"), Input(f"cmp{i}_policy", "value"))
        def cmp_hint(policy):
            if policy not in REGISTRY:
                return ""
            own = [f"{f.name}={st.as_text(f.default)}" for f in st.policy_fields(policy) if f.name not in st.mechanics_names()]
            return ("defaults: " + ", ".join(own)) if own else "mechanics only, e.g. free_old=immediate"

    cmp_keys = [k for k in st.COMPARE_KEYS]
    app.callback(
        output={
            "figure": Output("compare-graph", "figure"),
            "table": Output("delta-table", "children"),
            "message": Output("cmp-message", "children"),
            "errors": Output({"type": "cmp-err", "key": ALL}, "children"),
        },
        inputs={
            "store": Input("run-store", "data"),
            "cmp_values": {k: Input(k, "value") for k in cmp_keys},
            "quantity": Input("cmp_quantity", "value"),
            "tab": Input("tab", "value"),
        },
        running=busy("progress", "results"),
    )(compare_callback)

    app.callback(
        Output("ledger-table", "data"), Output("ledger-table", "page_count"), Output("events-note", "children"),
        Input("run-store", "data"), Input("ledger-table", "page_current"), Input("ledger-table", "page_size"),
        Input("ledger-table", "sort_by"), Input("ledger-table", "filter_query"),
    )(table_callback)

    for button, target in (("dl-ledger-btn", "dl-ledger-note"), ("dl-csv-btn", "dl-note")):
        @app.callback(
            Output("download-csv", "data", allow_duplicate=True), Output(target, "children", allow_duplicate=True),
            Input(button, "n_clicks"), State("run-store", "data"), prevent_initial_call=True,
        )
        def download_csv(_n, store):
            return ledger_csv(store)

    @app.callback(
        Output("download-html", "data"), Output("dl-note", "children", allow_duplicate=True),
        Input("dl-html-btn", "n_clicks"), State("run-store", "data"), State("heat", "value"),
        prevent_initial_call=True,
    )
    def download_html(_n, store, heat):
        return figures_html(store, heat)

    @app.callback(
        output={
            "figure": Output("v-graph", "figure"),
            "cards": Output("v-cards", "children"),
            "rows": Output("v-table", "data"),
            "note": Output("v-note", "children"),
            "message": Output("v-message", "children"),
        },
        inputs=[Input("v-upload", "contents"), Input("vpath", "value"), Input("v-load", "n_clicks")],
        state=[State("v-upload", "filename")],
    )
    def validation(contents, path, _clicks, filename):
        from dash import ctx

        return validation_callback(contents, path, filename, ctx.triggered_id)


__all__ = ["register", "main_callback", "compare_callback", "table_callback", "restore_callback", "state_from"]

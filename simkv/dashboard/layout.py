"""The dashboard's page: controls on the left (generated from the policy registry), views on the right.

Sized for a 1280×800 screen: a 310 px control column that scrolls on its own,
figures that take the rest of the height. The Tune, Serving and Plan tabs are their
views' own (simkv.dashboard.tune_view, serving_view, plan_view); the pieces every tab is built from are
in simkv.dashboard.components.
"""

from __future__ import annotations

from dash import dcc, html

from policies import REGISTRY
from simkv.figures import COLORS
from simkv.ledger import COLUMNS
from simkv.hfconfig import all_presets
from simkv.precision import PRECISIONS

from simkv.dashboard import state as st
from simkv.dashboard.components import (DIMMED, data_table, dropdown, graph, popt_id, popt_ids, render_cards,
                                        text_input)
from simkv.dashboard.plan_view import plan_tab
from simkv.dashboard.serving_view import serving_tab
from simkv.dashboard.tune_view import tune_tab

def _err(key: str) -> html.Div:
    return html.Div(id={"type": "err", "key": key}, className="err", role="alert")


def field(key: str, control, label: str | None = None, hint: str | None = None, err_id=None) -> html.Div:
    """A labelled control with its inline error line (``{"type": "err", "key": key}``)."""
    return html.Div(
        className="field",
        children=[
            html.Label(label or st.LABELS.get(key, key), htmlFor=key if isinstance(key, str) else None, title=hint),
            control,
            html.Div(hint, className="hint") if hint else None,
            _err(key) if err_id is None else html.Div(id=err_id, className="err", role="alert"),
        ],
    )


def model_options() -> list[dict]:
    """Every preset (simkv.hfconfig.all_presets), a model whose layers differ labelled by its groups, then custom."""
    def label(m) -> str:
        if not m.layer_kv:
            return f"{m.name}  ({m.layers} L, {m.heads}/{m.kv_heads} heads × {m.head_dim})"
        kinds = ", ".join(f"{len(ids)} {spec.kind}" + (f" {spec.window}" if spec.window else "")
                          + (" MLA" if spec.latent else "") for spec, ids in m.groups)
        return f"{m.name}  ({m.layers} L: {kinds})"

    opts = [{"label": label(m), "value": m.name} for m in all_presets().values()]
    return opts + [{"label": "custom (enter all dimensions)", "value": st.CUSTOM}]


def precision_options(policy: str) -> list[dict]:
    default = REGISTRY[policy].default_precision if policy in REGISTRY else "?"
    return [{"label": f"policy default ({default})", "value": st.DEFAULT}] + [
        {"label": f"{p.name} ({p.bits} bit)", "value": p.name} for p in PRECISIONS.values()
    ]


def compare_precision_options() -> list[dict]:
    return [{"label": "same as A", "value": st.SAME}, {"label": "policy default", "value": st.DEFAULT}] + [
        {"label": p.name, "value": p.name} for p in PRECISIONS.values()
    ]


def err_keys() -> list[str]:
    """Keys of every inline error line, in layout order."""
    keys = ["model", *st.DIMS, "precision", "policy"]
    keys += [st.popt_key(i["policy"], i["field"]) for i in popt_ids()]
    keys += ["prompt", "decode", "turns", "turn_tokens", "turn_decode", "beam", "ops", "device_memory"]
    return keys


def _param(policy: str, f, value: str | None = None) -> html.Div:
    choices = st.field_choices(f)
    default = st.as_text(f.default)
    value = default if value is None else value
    help_text = f.metadata.get("help", "")
    if choices:
        control = dropdown(popt_id(policy, f.name), [{"label": c, "value": c} for c in choices], value)
    else:
        control = text_input(popt_id(policy, f.name), value, placeholder=f"default {default}")
    return html.Div(
        className="field",
        children=[
            html.Label(f.name, title=help_text),
            control,
            html.Div(help_text, className="hint"),
            _err(st.popt_key(policy, f.name)),
        ],
    )


def policy_block(name: str, visible: bool, values: dict | None = None) -> html.Div:
    values = values or {}
    mech = st.mechanics_names()
    fields = st.policy_fields(name)
    own = [f for f in fields if f.name not in mech]
    shared = [f for f in fields if f.name in mech]
    return html.Div(
        id={"type": "popt-block", "policy": name},
        style={} if visible else {"display": "none"},
        children=[
            *(_param(name, f, values.get(f.name)) for f in own),
            html.Div("no parameters of its own", className="hint") if not own else None,
            html.Details(
                className="mechanics",
                children=[html.Summary(f"runtime mechanics ({len(shared)})"), *(_param(name, f, values.get(f.name)) for f in shared)],
            ),
        ],
    )


def sidebar(d: dict) -> html.Div:
    preset = all_presets().get(d["model"])
    dims = html.Div(className="grid2", children=[
        field(k, text_input(k, d[k], placeholder=str(getattr(preset, k)) if preset else "required", inputMode="numeric"))
        for k in st.DIMS
    ])
    workload = html.Div(className="grid2", children=[
        field("prompt", text_input("prompt", d["prompt"], inputMode="numeric")),
        field("decode", text_input("decode", d["decode"], inputMode="numeric")),
        field("turns", text_input("turns", d["turns"], inputMode="numeric"), hint="further chat turns"),
        field("turn_tokens", text_input("turn_tokens", d["turn_tokens"], inputMode="numeric"), hint="user tokens per turn"),
        field("turn_decode", text_input("turn_decode", d["turn_decode"], placeholder="= decode", inputMode="numeric"),
              hint="generated per turn"),
        field("beam", text_input("beam", d["beam"], inputMode="numeric"), hint="fork, decode, select"),
    ])
    return html.Div(id="sidebar", className="sidebar", children=[
        html.H3("Model"),
        field("model", dropdown("model", model_options(), d["model"])),
        html.Div("Dimensions (empty = the preset's)", className="hint", id="dims-hint"),
        dims,
        field("precision", dropdown("precision", precision_options(d["policy"]), d["precision"])),
        html.H3("Policy"),
        field("policy", dropdown("policy", [{"label": n, "value": n} for n in REGISTRY], d["policy"])),
        html.Div(REGISTRY[d["policy"]].summary if d["policy"] in REGISTRY else "", id="policy-summary",
                 className="hint summary"),
        *(policy_block(name, name == d["policy"], d["popts"] if name == d["policy"] else None) for name in REGISTRY),
        html.H3("Workload"),
        workload,
        html.Div(id="ops-note", className="hint"),
        html.Details(id="ops-details", className="advanced", children=[
            html.Summary("Advanced: explicit operations"),
            field("ops", text_input("ops", d["ops"], placeholder="prefill:32,decode:100,fork:4,decode:50,select:0,reset"),
                  hint="prefill:N, decode:N, fork:W, reorder, select:I, reset, trim:N — replaces the fields above"),
        ]),
        html.H3("Device"),
        field("device_memory", text_input("device_memory", d["device_memory"]), hint="e.g. 16GiB, 512MiB, 8000000000"),
        html.Div(f"Limits: ≤ {st.MAX_TOKENS:,} tokens and steps per run; see README.", className="hint"),
    ])


def compare_tab(d: dict) -> html.Div:
    policies = [{"label": "— none —", "value": ""}] + [{"label": n, "value": n} for n in REGISTRY]
    rows = [html.Div(className="cmp-row cmp-head", children=[
        html.Div(""), html.Label("policy"), html.Label("parameters (key=value, …; empty = defaults)"),
        html.Label("KV precision"),
    ])]
    for i in range(1, st.N_COMPARE + 1):
        rows.append(html.Div(className="cmp-row field", children=[
            html.Div(st.RUN_NAMES[i], className="cmp-letter"),
            dropdown(f"cmp{i}_policy", policies, d[f"cmp{i}_policy"]),
            text_input(f"cmp{i}_opts", d[f"cmp{i}_opts"]),
            dropdown(f"cmp{i}_precision", compare_precision_options(), d[f"cmp{i}_precision"]),
            html.Div(id={"type": "cmp-err", "key": f"cmp{i}"}, className="err cmp-err", role="alert"),
        ]))
    return html.Div(className="tab-body", children=[
        *rows,
        html.Div(className="row", children=[
            html.Div("Run A is the scenario on the left; B–D run the same workload, model and device.", className="hint"),
            html.Label("quantity", className="inline-label"),
            dcc.RadioItems(id="cmp_quantity", options=list(st.QUANTITIES), value=d["cmp_quantity"],
                           inline=True, className="radio"),
            html.Div(id="cmp-message", className="note"),
        ]),
        dcc.Loading(type="dot", delay_show=80, overlay_style=DIMMED,
                    children=html.Div(id="delta-table", className="delta")),
        graph("compare-graph", "simkv-compare"),
    ])


def events_tab() -> html.Div:
    return html.Div(className="tab-body", children=[
        html.Div(className="row", children=[
            html.Div(id="events-note", className="note"),
            html.Button("Download ledger (CSV)", id="dl-ledger-btn", className="btn"),
            html.Div(id="dl-ledger-note", className="note"),
        ]),
        data_table(
            id="ledger-table",
            columns=[{"name": c, "id": c, "type": "text" if c in ("phase", "tensor", "op") else "numeric"} for c in COLUMNS],
            data=[], page_current=0, page_size=25, page_action="custom", sort_action="custom", sort_mode="multi",
            filter_action="custom", filter_query="", sort_by=[],
            style_table={"overflowX": "auto"},
            style_cell={"fontFamily": "ui-monospace, monospace", "fontSize": 12, "padding": "2px 6px"},
            style_header={"fontWeight": "600", "backgroundColor": "#f1f3f5"},
            style_data_conditional=[
                {"if": {"filter_query": '{op} = "alloc"', "column_id": "op"}, "color": COLORS["allocated"]},
                {"if": {"filter_query": '{op} = "free"', "column_id": "op"}, "color": COLORS["event"]},
            ],
        ),
    ])


def validation_tab(d: dict) -> html.Div:
    return html.Div(className="tab-body", children=[
        html.Div(className="row", children=[
            dcc.Upload(id="v-upload", accept=".json,application/json", className="upload",
                       children=html.Div(["Drop a ", html.Code("simkv validate"), " JSON here or ", html.A("choose a file")])),
            html.Div(className="field grow", children=[
                html.Label("… or a path on this machine", htmlFor="vpath"),
                text_input("vpath", d["vpath"], placeholder="out/validate.json"),
            ]),
            html.Button("Load", id="v-load", className="btn"),
        ]),
        html.Div(id="v-message", className="err", role="alert"),
        html.Div(id="v-cards", className="cards"),
        graph("v-graph", "simkv-validation"),
        html.Div(id="v-note", className="note"),
        data_table(
            id="v-table", columns=[{"name": c, "id": c} for c in ("step", "layer", "tensor", "op", "bytes", "status")],
            data=[], page_size=15, sort_action="native", filter_action="native", page_action="native",
            style_cell={"fontFamily": "ui-monospace, monospace", "fontSize": 12, "padding": "2px 6px"},
            style_header={"fontWeight": "600", "backgroundColor": "#f1f3f5"},
            style_data_conditional=[
                {"if": {"filter_query": '{status} = "missing"'}, "backgroundColor": "#fde2e1"},
                {"if": {"filter_query": '{status} = "unexpected"'}, "backgroundColor": "#ece3f7"},
            ],
        ),
    ])


def main_panel(d: dict) -> html.Div:
    return html.Div(className="main", children=[
        dcc.Loading(type="dot", delay_show=80, overlay_style=DIMMED, children=[
            html.Div(id="status", className="status"),
            html.Div(id="warning", className="warning"),
            html.Div(id="cards", className="cards", children=render_cards(None)),
        ]),
        dcc.Tabs(id="tab", value=d["tab"], className="tabs", children=[
            dcc.Tab(label="Memory over steps", value="memory", children=html.Div(className="tab-body", children=[
                graph("timeline-graph", "simkv-timeline"),
            ])),
            dcc.Tab(label="Per layer", value="layers", children=html.Div(className="tab-body", children=[
                html.Div(className="row", children=[
                    html.Label("show", className="inline-label"),
                    dcc.RadioItems(id="heat", options=[
                        {"label": "headroom (capacity − tokens)", "value": "headroom"},
                        {"label": "capacity", "value": "capacity"},
                    ], value=d["heat"], inline=True, className="radio"),
                ]),
                graph("heatmap-graph", "simkv-layers"),
            ])),
            dcc.Tab(label="Compare", value="compare", children=compare_tab(d)),
            dcc.Tab(label="Events (ledger)", value="events", children=events_tab()),
            dcc.Tab(label="Validation", value="validation", children=validation_tab(d)),
            dcc.Tab(label="Tune", value="tune", children=tune_tab()),
            dcc.Tab(label="Serving", value="serving", children=serving_tab(d)),
            dcc.Tab(label="Plan", value="plan", children=plan_tab()),
        ]),
    ])


def header(note: str = "") -> html.Div:
    return html.Div(className="header", children=[
        html.Div([html.B("simkv"), " KV-cache what-if"], className="brand"),
        html.Details(className="cli", children=[html.Summary("CLI"), html.Code(id="cli")]),
        html.Div(className="actions", children=[
            html.Span(note, id="url-note", className="note light"),
            dcc.Clipboard(id="copy-link", title="copy a link to this what-if", className="clip"),
            html.Span("copy link", className="light"),
            html.Button("Figures (HTML)", id="dl-html-btn", className="btn light-btn"),
            html.Button("Ledger (CSV)", id="dl-csv-btn", className="btn light-btn"),
            html.Span(id="dl-note", className="note light"),
        ]),
    ])


def layout(state: dict | None = None, search: str | None = None, note: str = "") -> html.Div:
    """The page with every control set from ``state`` (default: the defaults).

    ``search`` is the query string the state came from (``?a=b…``): if the browser's
    address differs (the Referer did not carry it), the page restores the address's.
    """
    d = state or st.default_state()
    return html.Div(className="app", children=[
        # URL state: the page is served with the link's values; `served-search` is the query
        # string it was built from, `url-search` the one the controls make now (pushed to the
        # address bar), `nav` the one back/forward (or a lost Referer) asks to restore.
        dcc.Store(id="served-search", data=search or ""),
        dcc.Store(id="url-search"),
        dcc.Store(id="url-pushed"),
        dcc.Store(id="nav"),
        dcc.Store(id="run-store"),
        dcc.Download(id="download-csv"),
        dcc.Download(id="download-html"),
        header(note),
        html.Div(className="body", children=[sidebar(d), main_panel(d)]),
    ])


def serve_layout() -> html.Div:
    """The page for the link being opened: its query string arrives as the layout request's Referer.

    (The page sends a same-origin Referer, ``<meta name="referrer" content="same-origin">``.)
    Outside a request (Dash validating the layout) it is the default page.
    """
    import flask
    from urllib.parse import urlsplit

    if not flask.has_request_context():
        return layout()
    query = urlsplit(flask.request.referrer or "").query
    state, ignored = st.decode(query)
    note = f"link: ignored {', '.join(ignored)}" if ignored else ""
    return layout(state, search="?" + query if query else "", note=note)


CSS = """
* { box-sizing: border-box; }
body { margin: 0; font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; font-size: 13px; color: #1f2328; }
.app { display: flex; flex-direction: column; height: 100vh; }
.header { display: flex; align-items: center; gap: 16px; padding: 6px 14px; background: #1f2937; color: #f9fafb; min-height: 40px; }
.header .brand { font-size: 15px; white-space: nowrap; }
.header .cli { flex: 1; min-width: 0; color: #d1d5db; }
.header .cli summary { cursor: pointer; }
.header .cli code { display: block; white-space: pre-wrap; word-break: break-all; font-size: 11px; color: #e5e7eb; }
.header .actions { display: flex; align-items: center; gap: 8px; }
.light { color: #d1d5db; }
.clip { cursor: pointer; color: #f9fafb; }
.btn { padding: 4px 10px; border: 1px solid #9ca3af; background: #fff; border-radius: 4px; cursor: pointer; font-size: 12px; }
.light-btn { background: #374151; color: #f9fafb; border-color: #6b7280; }
.body { display: flex; flex: 1; min-height: 0; }
.sidebar { width: 310px; flex: none; overflow-y: auto; padding: 6px 12px 20px; background: #f6f7f9; border-right: 1px solid #e1e4e8; }
.sidebar h3 { margin: 10px 0 4px; font-size: 12px; text-transform: uppercase; letter-spacing: .05em; color: #57606a; }
.field { margin-bottom: 6px; }
.field label { display: block; font-size: 12px; font-weight: 600; margin-bottom: 2px; }
:root { --Dash-Fill-Interactive-Strong: #1f6feb; }
.field .dash-input-container { height: 28px; }
.field .dash-input-element { padding: 2px 6px; }
.field .dash-dropdown-trigger { min-height: 26px; padding: 0 8px; }
.field .dash-dropdown { height: 28px; }
.field:has(.err:not(:empty)) .dash-input-container, .field:has(.err:not(:empty)) .dash-dropdown { border: 1px solid #d1242f; background: #fff5f5; }
#tab .tab { padding: 6px 12px; }
#tab { margin-top: 2px; }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; column-gap: 8px; }
.hint { font-size: 11px; color: #6e7781; margin-top: 1px; }
.summary { margin: -2px 0 6px; }
.err { color: #d1242f; font-size: 12px; }
.err:empty { display: none; }
details.mechanics, details.advanced { margin: 4px 0 8px; }
details summary { cursor: pointer; font-size: 12px; color: #0969da; }
.main { flex: 1; min-width: 0; display: flex; flex-direction: column; padding: 6px 12px; overflow-y: auto; }
.status { font-size: 11.5px; color: #57606a; min-height: 16px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.status.invalid { white-space: normal; }
.status.invalid { color: #d1242f; font-weight: 600; }
.warning:empty { display: none; }
.warning { color: #9a6700; background: #fff8c5; border: 1px solid #d4a72c; padding: 2px 8px; border-radius: 4px; margin-top: 2px; }
.cards { display: grid; grid-template-columns: repeat(7, minmax(0, 1fr)); gap: 6px; margin: 6px 0; }
#v-cards { grid-template-columns: repeat(6, minmax(0, 1fr)); }
#v-cards:empty { display: none; }
.card { background: #fff; border: 1px solid #e1e4e8; border-radius: 6px; padding: 4px 8px; }
.card-label { font-size: 11px; color: #57606a; }
.card-value { font-size: 16px; font-weight: 600; }
.card-detail { font-size: 10.5px; color: #6e7781; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.tab-body { padding: 6px 0; }
.graph { height: calc(100vh - 200px); min-height: 340px; }
#heatmap-graph { height: calc(100vh - 228px); }
#compare-graph { height: calc(100vh - 455px); min-height: 300px; }
#v-graph { height: 560px; }
.row { display: flex; align-items: center; gap: 10px; flex-wrap: wrap; margin: 2px 0; }
.inline-label { font-size: 12px; font-weight: 600; }
.radio label { margin-right: 10px; font-size: 12px; }
.note { font-size: 12px; color: #57606a; }
.cmp-row { display: grid; grid-template-columns: 18px 170px 1fr 150px; column-gap: 8px; align-items: center; margin-bottom: 3px; }
.cmp-head label { font-size: 12px; font-weight: 600; }
.cmp-row .cmp-err { grid-column: 2 / 5; }
.cmp-letter { font-weight: 700; }
.delta table { border-collapse: collapse; font-size: 12px; margin: 4px 0; }
.delta th, .delta td { border: 1px solid #e1e4e8; padding: 1px 8px; text-align: right; white-space: nowrap; }
.delta th:first-child, .delta td:first-child { text-align: left; }
.delta th { background: #f1f3f5; }
.delta td.better { color: #1a7f37; } .delta td.worse { color: #d1242f; }
.upload { border: 1px dashed #8c959f; border-radius: 6px; padding: 10px 14px; cursor: pointer; }
.grow { flex: 1; min-width: 200px; }
.sv-form { display: grid; grid-template-columns: repeat(6, minmax(0, 1fr)); column-gap: 10px; }
.sv-cli summary { font-size: 11.5px; }
.sv-cli code { font-size: 11px; word-break: break-all; }
#sv-cards .card-value { font-size: 14px; }
#sv-memory-graph { height: 420px; min-height: 0; }
.sv-pair { display: grid; grid-template-columns: 3fr 2fr; gap: 8px; }
#sv-requests-graph, #sv-waste-graph { height: 420px; min-height: 0; }
.pl-form { display: grid; grid-template-columns: repeat(6, minmax(0, 1fr)); column-gap: 10px; align-items: start; }
.pl-form .pl-wide { grid-column: span 2; }
.pl-form .pl-run { align-self: center; }
.pl-cli, .pl-rec { font-size: 12px; margin: 2px 0; }
.pl-cli code, .pl-rec code { font-size: 11px; word-break: break-all; }
.pl-rec-head { font-weight: 600; font-size: 13px; }
#pl-graph, #pl-memory-graph { height: 430px; min-height: 0; }
"""


INDEX = """<!DOCTYPE html>
<html>
  <head>
    {%metas%}
    <meta name="referrer" content="same-origin">
    <title>simkv what-if</title>
    {%favicon%}
    {%css%}
    <style>""" + CSS + """</style>
  </head>
  <body>
    {%app_entry%}
    <footer>{%config%}{%scripts%}{%renderer%}</footer>
  </body>
</html>"""

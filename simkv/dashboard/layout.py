"""The dashboard's page: three workspaces, one per question, each with its own controls and results.

* **Session** — one session's KV memory under a runtime's allocation policy: the controls on the left
  (generated from the policy registry), the cards and the tabs (memory over steps, per layer, compare,
  events, validation, tune) on the right;
* **Serving** — a stream of requests on one device (simkv.dashboard.serving_view);
* **Plan** — the cheapest deployment that meets an SLO (simkv.dashboard.plan_view).

The header switches between them (``ws`` in the URL); only the open workspace is on the page (the others are
hidden, controls included). Each workspace is a 310 px control column that scrolls on its own and a results
column that takes the rest; sized for 1280–1920 px wide screens with no horizontal scrolling. The pieces every
workspace is built from are in simkv.dashboard.components.
"""

from __future__ import annotations

from dash import dcc, html

from policies import REGISTRY
from simkv.cost import PRESET_NAMES
from simkv.figures import COLORS
from simkv.ledger import COLUMNS
from simkv.hfconfig import all_presets
from simkv.precision import PRECISIONS

from simkv.dashboard import plan_view, serving_view, url
from simkv.dashboard import state as st
from simkv.dashboard.components import (HIDDEN, data_table, dropdown, graph, popt_id, popt_ids, progress,
                                        render_cards, text_input)
from simkv.dashboard.tune_view import tune_tab

#: The workspaces: value (``ws`` in the URL) → the label of its switch.
WORKSPACES = dict(zip(url.WORKSPACES, ("Session", "Serving", "Plan")))
QUESTION = "How does one session's KV cache grow under a runtime's allocation policy?"

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
    keys += ["prompt", "decode", "turns", "turn_tokens", "turn_decode", "beam", "ops", "device", "device_memory"]
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
        html.H2("Session"), html.Div(QUESTION, className="hint question"),
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
        field("device", dropdown("device", [{"label": n, "value": n} for n in PRESET_NAMES], d["device"]),
              hint="its memory and the precision its runtime loads the weights in"),
        field("device_memory", text_input("device_memory", d["device_memory"], placeholder="the device's"),
              hint="empty: the device's; e.g. 16GiB, 512MiB, 8000000000"),
        html.Div(f"Limits: ≤ {st.MAX_TOKENS:,} tokens and steps per run; beyond them, simkv run.", className="hint"),
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
        html.Div(id="delta-table", className="delta"),
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


def session_main(d: dict) -> html.Div:
    """The Session workspace's results: status, what to download, cards, then a tab per view."""
    return html.Div(className="main", children=[
        html.Div(className="toolbar", children=[
            html.Div(id="status", className="status", role="status"),
            html.Div(className="actions", children=[
                html.Button("Figures (HTML)", id="dl-html-btn", className="btn"),
                html.Button("Ledger (CSV)", id="dl-csv-btn", className="btn"),
                html.Span(id="dl-note", className="note"),
            ]),
        ]),
        progress("progress", "Simulating…"),
        html.Div(id="notice", className="notice", role="alert"),
        html.Div(id="warning", className="warning"),
        html.Div(id="results", className="results", children=[
            html.Details(className="cli", children=[html.Summary("the same run from the command line"),
                                                    html.Code(id="cli")]),
            html.Div(id="cards", className="cards", children=render_cards(None)),
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
            ]),
        ]),
    ])


def header(ws: str, note: str = "") -> html.Div:
    """The brand, the workspace switch and the link to what is on screen (every workspace's controls)."""
    return html.Div(className="header", children=[
        html.Div([html.B("simkv"), " KV-cache what-if"], className="brand"),
        dcc.Tabs(id="ws", value=ws, className="ws-tabs", parent_className="ws-tabs-parent", children=[
            dcc.Tab(label=label, value=value, className="ws-tab", selected_className="ws-tab--selected")
            for value, label in WORKSPACES.items()
        ]),
        html.Div(className="actions", children=[
            html.Span(note, id="url-note", className="note light"),
            dcc.Clipboard(id="copy-link", title="copy a link to this what-if", className="clip"),
            html.Span("copy link", className="light"),
        ]),
    ])


def workspace(name: str, ws: str, children: list) -> html.Div:
    """A workspace's controls and results, on the page only while it is the open one."""
    return html.Div(id=f"ws-{name}", className="workspace", style={} if name == ws else HIDDEN, children=children)


def layout(state: dict | None = None, search: str | None = None, note: str = "") -> html.Div:
    """The page with every control set from ``state`` (default: the defaults; see :mod:`simkv.dashboard.url`).

    ``search`` is the query string the state came from (``?a=b…``): if the browser's
    address differs (the Referer did not carry it), the page restores the address's.
    """
    d = state or url.default_state()
    ws = d["ws"] if d.get("ws") in WORKSPACES else "session"
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
        header(ws, note),
        workspace("session", ws, [sidebar(d), session_main(d)]),
        workspace("serving", ws, serving_view.workspace(d)),
        workspace("plan", ws, plan_view.workspace(d)),
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
    state, ignored = url.decode(query)
    note = f"link: ignored {', '.join(ignored)}" if ignored else ""
    return layout(state, search="?" + query if query else "", note=note)


CSS = """
* { box-sizing: border-box; }
body { margin: 0; font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; font-size: 13px; color: #1f2328; }
.app { display: flex; flex-direction: column; height: 100vh; overflow: hidden; }
.header { display: flex; align-items: center; gap: 18px; padding: 0 14px; background: #1f2937; color: #f9fafb; min-height: 42px; flex: none; }
.header .brand { font-size: 15px; white-space: nowrap; }
.header .actions { display: flex; align-items: center; gap: 8px; margin-left: auto; }
.ws-tabs-parent { flex: none; }
.ws-tabs { display: flex; gap: 2px; border: 0; background: transparent; }
.header .ws-tab { background: transparent !important; color: #d1d5db !important; border: 0 !important; border-bottom: 3px solid transparent !important;
  padding: 10px 16px 8px !important; font-size: 14px; cursor: pointer; }
.header .ws-tab:hover { color: #fff !important; }
.header .ws-tab--selected { color: #fff !important; font-weight: 600; border-bottom: 3px solid #58a6ff !important; }
.light { color: #d1d5db; }
.clip { cursor: pointer; color: #f9fafb; }
.btn { padding: 4px 10px; border: 1px solid #9ca3af; background: #fff; border-radius: 4px; cursor: pointer; font-size: 12px; }
.btn.run { background: #1f6feb; border-color: #1f6feb; color: #fff; font-weight: 600; padding: 5px 18px; font-size: 13px; }
.btn:disabled { background: #e5e7eb; border-color: #d1d5db; color: #8c959f; cursor: not-allowed; }
.workspace { display: flex; flex: 1; min-height: 0; }
.sidebar { width: 310px; flex: none; overflow-y: auto; overflow-x: hidden; padding: 6px 12px 20px; background: #f6f7f9; border-right: 1px solid #e1e4e8; }
.sidebar h2 { margin: 6px 0 0; font-size: 15px; }
.sidebar .question { margin: 0 0 4px; }
.sidebar h3 { margin: 10px 0 4px; font-size: 12px; text-transform: uppercase; letter-spacing: .05em; color: #57606a; }
.run-row { position: sticky; bottom: -20px; background: #f6f7f9; padding: 8px 0 12px; display: flex; align-items: center; gap: 10px; border-top: 1px solid #e1e4e8; }
.field { margin-bottom: 6px; }
.field label { display: block; font-size: 12px; font-weight: 600; margin-bottom: 2px; }
:root { --Dash-Fill-Interactive-Strong: #1f6feb; }
.field .dash-input-container { height: 28px; }
.field .dash-input-element { padding: 2px 6px; }
.field .dash-dropdown-trigger { min-height: 26px; padding: 0 8px; }
.field .dash-dropdown { min-height: 28px; }
.field:has(.err:not(:empty)) .dash-input-container, .field:has(.err:not(:empty)) .dash-dropdown { border: 1px solid #d1242f; background: #fff5f5; }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; column-gap: 8px; }
.hint { font-size: 11px; color: #6e7781; margin-top: 1px; }
.summary { margin: -2px 0 6px; }
.err { color: #d1242f; font-size: 12px; }
.err:empty { display: none; }
details.mechanics, details.advanced { margin: 4px 0 8px; }
details summary { cursor: pointer; font-size: 12px; color: #0969da; }
.main { flex: 1; min-width: 0; display: flex; flex-direction: column; padding: 6px 12px 16px; overflow-y: auto; overflow-x: hidden; }
.toolbar { display: flex; align-items: center; gap: 10px; min-height: 26px; }
.toolbar .status { flex: 1; min-width: 0; }
.toolbar .actions { display: flex; align-items: center; gap: 6px; flex: none; }
.status { font-size: 11.5px; color: #57606a; min-height: 16px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.status.invalid { white-space: normal; color: #d1242f; font-weight: 600; }
.cli { font-size: 12px; margin: 2px 0; color: #57606a; }
.cli summary { font-size: 11.5px; }
.cli code { font-size: 11px; word-break: break-all; white-space: pre-wrap; color: #1f2328; }
details.cli code { display: block; }
.warning:empty, .notice:empty { display: none; }
.warning { color: #9a6700; background: #fff8c5; border: 1px solid #d4a72c; padding: 2px 8px; border-radius: 4px; margin-top: 2px; }
.notice { color: #82071e; background: #ffebe9; border: 1px solid #ff8182; padding: 10px 14px; border-radius: 6px; margin: 6px 0; font-size: 14px; }
.progress { display: flex; align-items: center; gap: 10px; margin: 4px 0; animation: appear 0.25s step-end; }
@keyframes appear { from { visibility: hidden; } }
.progress-track { position: relative; flex: 0 0 220px; height: 6px; background: #dbe4f0; border-radius: 3px; overflow: hidden; }
.progress-bar { position: absolute; top: 0; width: 35%; height: 100%; background: #1f6feb; border-radius: 3px; animation: slide 1.1s ease-in-out infinite; }
@keyframes slide { from { left: -35%; } to { left: 100%; } }
.progress-text { font-size: 12px; font-weight: 600; color: #1f2328; }
.results { transition: opacity .15s; }
.results.busy { opacity: .35; filter: grayscale(1); transition: opacity .15s .25s; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(118px, 1fr)); gap: 6px; margin: 6px 0; }
.cards:empty { display: none; }
.card { background: #fff; border: 1px solid #e1e4e8; border-radius: 6px; padding: 4px 8px; min-width: 0; }
.card-label { font-size: 11px; color: #57606a; }
.card-value { font-size: 16px; font-weight: 600; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.card-detail { font-size: 10.5px; color: #6e7781; }
#sv-cards .card-value { font-size: 14px; }
#tab .tab { padding: 6px 12px; }
.tab-body { padding: 6px 0; }
.graph { height: calc(100vh - 250px); min-height: 380px; }
#heatmap-graph { height: calc(100vh - 280px); }
#compare-graph { height: 440px; }
#v-graph { height: 560px; }
#tune-graph { height: 480px; }
#sv-memory-graph { height: 440px; min-height: 0; }
.pair { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 8px; }
#sv-requests-graph, #sv-waste-graph { height: 420px; min-height: 0; }
#pl-graph { height: 440px; min-height: 0; }
#pl-memory-graph { height: 400px; min-height: 0; }
.row { display: flex; align-items: center; gap: 10px; flex-wrap: wrap; margin: 2px 0; }
.inline-label { font-size: 12px; font-weight: 600; }
.radio label { margin-right: 10px; font-size: 12px; }
.note { font-size: 12px; color: #57606a; }
.cmp-row { display: grid; grid-template-columns: 18px minmax(120px, 170px) minmax(0, 1fr) minmax(110px, 150px); column-gap: 8px; align-items: center; margin-bottom: 3px; }
.cmp-head label { font-size: 12px; font-weight: 600; }
.cmp-row .cmp-err { grid-column: 2 / 5; }
.cmp-letter { font-weight: 700; }
.delta { max-width: 100%; overflow-x: auto; }
.delta table { border-collapse: collapse; font-size: 12px; margin: 4px 0; }
.delta th, .delta td { border: 1px solid #e1e4e8; padding: 2px 8px; text-align: right; vertical-align: top; }
.delta td { white-space: nowrap; }
.delta th { background: #f1f3f5; font-weight: 600; max-width: 220px; overflow-wrap: anywhere; }
.delta th:first-child, .delta td:first-child { text-align: left; }
.delta .diff { font-size: 11px; font-weight: normal; color: #6e7781; }
.delta .diff.better { color: #1a7f37; } .delta .diff.worse { color: #d1242f; }
.upload { border: 1px dashed #8c959f; border-radius: 6px; padding: 10px 14px; cursor: pointer; }
.grow { flex: 1; min-width: 200px; }
.pl-rec { font-size: 12px; margin: 2px 0; }
.pl-rec code { font-size: 11px; word-break: break-all; }
.pl-rec-head { font-weight: 600; font-size: 14px; }
.dash-spreadsheet-container .dash-spreadsheet-inner td, .dash-spreadsheet-container .dash-spreadsheet-inner th { max-width: none; }
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

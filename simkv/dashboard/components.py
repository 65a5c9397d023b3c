"""The pieces every part of the dashboard's page is built from: text inputs, dropdowns, graphs, tables and
cards; the ids of the policy parameter controls; and the one line an unexpected error becomes.

Below the page (simkv.dashboard.layout) and the views it shows (tune_view, serving_view), which all use them.
"""

from __future__ import annotations

import logging

from dash import dash_table, dcc, html

from policies import REGISTRY

from simkv.dashboard import state as st

log = logging.getLogger("simkv.dashboard")

GRAPH_CONFIG = {
    "displaylogo": False,
    "toImageButtonOptions": {"format": "png", "scale": 2},
}


def text_input(id, value: str, placeholder: str = "", **kw) -> dcc.Input:
    return dcc.Input(id=id, type="text", value=value, placeholder=placeholder, debounce=True, autoComplete="off",
                     className="text", **kw)


def dropdown(id, options, value, **kw) -> dcc.Dropdown:
    return dcc.Dropdown(id=id, options=options, value=value, clearable=False, searchable=False, className="dd", **kw)


def popt_id(policy: str, name: str) -> dict:
    return {"type": "popt", "policy": policy, "field": name}


def popt_ids() -> list[dict]:
    """Every policy parameter control, in layout order (the order pattern-matching callbacks see)."""
    mech = st.mechanics_names()
    ids = []
    for name in REGISTRY:
        fields = st.policy_fields(name)
        ids += [popt_id(name, f.name) for f in fields if f.name not in mech]
        ids += [popt_id(name, f.name) for f in fields if f.name in mech]
    return ids


def _card(key: str, label: str, value: str = "—", detail: str = "") -> html.Div:
    return html.Div(className="card", id=f"card-{key}", children=[
        html.Div(label, className="card-label"),
        html.Div(value, className="card-value", id=f"card-{key}-value"),
        html.Div(detail, className="card-detail"),
    ])


def render_cards(cards: list[dict] | None, keys_labels=None) -> list:
    if cards:
        return [_card(c["key"], c["label"], c["value"], c["detail"]) for c in cards]
    return [_card(k, lab, "—", "no result") for k, lab in (keys_labels or CARD_LABELS)]


CARD_LABELS = [
    ("peak_allocated", "peak allocated"), ("peak_resident", "peak resident"), ("mean_allocated", "mean allocated"),
    ("waste", "final waste"), ("reallocations", "reallocations"), ("bytes_copied", "bytes copied"),
    ("largest_spike", "largest spike"),
]


#: While a callback runs, what it will replace stays visible but dimmed (never shown as current).
DIMMED = {"visibility": "visible", "opacity": 0.3, "filter": "grayscale(1)"}


def graph(id: str, filename: str) -> dcc.Loading:
    config = {**GRAPH_CONFIG, "toImageButtonOptions": {**GRAPH_CONFIG["toImageButtonOptions"], "filename": filename}}
    return dcc.Loading(
        type="circle", delay_show=80, overlay_style=DIMMED,
        children=dcc.Graph(id=id, config=config, className="graph",
                           figure={"data": [], "layout": {"template": "none", "xaxis": {"visible": False},
                                                          "yaxis": {"visible": False}}}),
    )


def data_table(**kw) -> dash_table.DataTable:
    """``dash_table.DataTable`` (Dash 4 warns it will move out of Dash one day; it is what we use today)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(?s).*DataTable will be removed", category=DeprecationWarning)
        return dash_table.DataTable(**kw)


def internal_error(err: Exception) -> str:
    """What a callback shows for an exception it did not expect: one line (the traceback goes to the server log)."""
    log.exception("dashboard callback failed")
    return f"Internal error ({type(err).__name__}); the server log has the details."

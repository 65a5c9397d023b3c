"""The pieces every part of the dashboard's page is built from: text inputs, dropdowns, graphs, tables and
cards; a workspace's form declared as :class:`Field` s; the progress bar shown while a callback computes; the
ids of the policy parameter controls; and the one line an unexpected error becomes.

Below the page (simkv.dashboard.layout) and the views it shows (tune_view, serving_view, plan_view), which all
use them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dash import ALL, Input, Output, dash_table, dcc, html

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


#: An empty figure (before anything is computed): no axes.
EMPTY_FIGURE = {"data": [], "layout": {"template": "none", "xaxis": {"visible": False}, "yaxis": {"visible": False}}}


def graph(id: str, filename: str) -> dcc.Graph:
    """A figure; its PNG export (toolbar) is named ``filename``. While it is being recomputed the workspace's
    results are dimmed and its progress bar shows (:func:`busy`), so it needs no spinner of its own."""
    config = {**GRAPH_CONFIG, "toImageButtonOptions": {**GRAPH_CONFIG["toImageButtonOptions"], "filename": filename}}
    return dcc.Graph(id=id, config=config, className="graph", figure=EMPTY_FIGURE)


# -- computing: a progress bar, the Run button disabled, the results dimmed ----------------------------------

HIDDEN = {"display": "none"}


def progress(id: str, text: str = "Computing…") -> html.Div:
    """A progress bar with a line saying what is being computed, hidden until a callback runs (:func:`busy`).

    The work has no fraction done to report (a search runs in one callback), so the bar moves without end; the
    line says how much work it is (the view keeps ``{id}-text`` up to date as the form changes)."""
    return html.Div(id=id, className="progress", role="progressbar", style=HIDDEN, children=[
        html.Div(className="progress-track", children=html.Div(className="progress-bar")),
        html.Span(text, id=f"{id}-text", className="progress-text"),
    ])


def busy(progress_id: str, results_id: str | None = None, button: str | None = None) -> list[tuple]:
    """A callback's ``running=`` argument: while it runs, the progress bar shows, the results are dimmed (shown,
    never as current) and the Run button is disabled (so a search cannot be started twice)."""
    running = [(Output(progress_id, "style"), {}, HIDDEN)]
    if results_id:
        running.append((Output(results_id, "className"), "results busy", "results"))
    if button:
        running.append((Output(button, "disabled"), True, False))
    return running


# -- a workspace's form, declared --------------------------------------------------------------------------

@dataclass(frozen=True)
class Field:
    """One control of a workspace's form (the Serving and Plan workspaces declare theirs as a tuple ``FIELDS``).

    The page, the URL, the inline error line and when the control is shown all follow from this; what the value
    means (the command-line flag it becomes) is the view's ``command``/``inputs``. ``choices``: ``None`` for a
    text box, else the option values or (value, label) pairs, or a function returning them (read when the page
    is built, so a registry's late additions appear). ``shown``: given the form's values, whether the control
    applies (hidden otherwise). ``section``: the heading this control starts.
    """

    key: str
    label: str
    default: str | tuple[str, ...] = ""
    choices: Sequence | Callable[[], Sequence] | None = None
    multi: bool = False
    hint: str = ""
    placeholder: str = ""
    numeric: bool = False
    section: str = ""
    shown: Callable[[dict], bool] | None = None

    def options(self) -> list[dict]:
        items = self.choices() if callable(self.choices) else self.choices
        return [{"label": c[1], "value": c[0]} if isinstance(c, tuple) else {"label": c, "value": c} for c in items]

    def control(self, value):
        if self.choices is None:
            return text_input(self.key, value, placeholder=self.placeholder,
                              **({"inputMode": "numeric"} if self.numeric else {}))
        if self.multi:
            return dcc.Dropdown(id=self.key, options=self.options(), value=list(value), multi=True, searchable=False,
                                clearable=False, className="dd")
        return dropdown(self.key, self.options(), value)


def err_id(kind: str, key: str) -> dict:
    """The inline error line of a form's control: ``{"type": kind, "key": key}`` (kind: ``sv-err``, ``pl-err``)."""
    return {"type": kind, "key": key}


def form_fields(fields: Sequence[Field], values: dict, err_kind: str) -> list:
    """The controls of ``fields`` with ``values`` (default: each one's own), under their section headings."""
    out = []
    for f in fields:
        if f.section:
            out.append(html.H3(f.section))
        value = values.get(f.key, f.default)
        out.append(html.Div(className="field", id=f"{f.key}-field",
                            style=HIDDEN if f.shown and not f.shown({**defaults(fields), **values}) else {},
                            children=[
            html.Label(f.label, htmlFor=f.key),
            f.control(value),
            html.Div(f.hint, className="hint") if f.hint else None,
            html.Div(id=err_id(err_kind, f.key), className="err", role="alert"),
        ]))
    return out


def defaults(fields: Sequence[Field]) -> dict:
    """Each control's default value: key → text (a list for a multiple choice)."""
    return {f.key: list(f.default) if f.multi else f.default for f in fields}


def register_shown(app, fields: Sequence[Field]) -> None:
    """Show each control that has a ``shown`` rule only while the form's values make it apply."""
    ruled = [f for f in fields if f.shown]
    if not ruled:
        return

    @app.callback([Output(f"{f.key}-field", "style") for f in ruled], [Input(f.key, "value") for f in fields])
    def shown(*values):
        form_values = dict(zip((f.key for f in fields), values))
        return [{} if f.shown(form_values) else HIDDEN for f in ruled]


def errors_out(err_kind: str) -> Output:
    """Every inline error line of a form, in the order of its fields."""
    return Output({"type": err_kind, "key": ALL}, "children")


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

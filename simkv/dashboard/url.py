"""The page's address: which workspace is open and every control of every workspace, as a query string.

Only values that differ from the defaults are written (``?ws=plan&pl_requests=30``), so a link is short and
reads as what was changed. The keys are the controls' ids: the Session workspace's
(:data:`simkv.dashboard.state.DEFAULTS`, and ``p.<field>`` for the chosen policy's parameters), the Serving
and Plan workspaces' (their ``FIELDS``), and ``ws``. A multiple choice (the Plan's devices) is written
comma-separated. A link from before the workspaces (``?tab=serving``) opens that workspace.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

from simkv.dashboard import plan_view, serving_view
from simkv.dashboard import state as st

#: The workspaces, in the order the header shows them; the first is the default.
WORKSPACES = ("session", "serving", "plan")
#: Every control in the URL: key → default (text; a list for a multiple choice). Order = URL order.
DEFAULTS: dict[str, str | list[str]] = {"ws": WORKSPACES[0], **st.DEFAULTS, **serving_view.DEFAULTS,
                                        **plan_view.DEFAULTS}
CONTROLS = tuple(DEFAULTS)
LISTS = frozenset(k for k, v in DEFAULTS.items() if isinstance(v, list))


def default_state() -> dict:
    state = {k: list(v) if k in LISTS else v for k, v in DEFAULTS.items()}
    state["popts"] = st.policy_defaults(state["policy"])
    return state


def _text(key: str, value) -> str:
    if key in LISTS:
        return ",".join(value or [])
    return value or ""


def encode(state: dict) -> str:
    """The query string (``?a=b&…``, or ``""``) holding what differs from the defaults."""
    pairs = []
    for k in CONTROLS:
        text = _text(k, state.get(k, DEFAULTS[k]))
        if text != _text(k, DEFAULTS[k]):
            pairs.append((k, text))
    defaults = st.policy_defaults(state.get("policy", ""))
    popts = state.get("popts") or {}
    pairs += [(f"p.{name}", popts[name]) for name in defaults if name in popts and popts[name] != defaults[name]]
    return "?" + urlencode(pairs, safe=":,=/.*") if pairs else ""


def decode(search: str | None) -> tuple[dict, list[str]]:
    """The state a query string describes (defaults for what it omits) and what it could not use."""
    state = default_state()
    ignored: list[str] = []
    popts: dict[str, str] = {}
    for key, value in parse_qsl((search or "").lstrip("?"), keep_blank_values=True):
        if key in LISTS:
            state[key] = [v for v in value.split(",") if v]
        elif key in DEFAULTS:
            state[key] = value
        elif key.startswith("p."):
            popts[key[2:]] = value
        else:
            ignored.append(key)
    defaults = st.policy_defaults(state["policy"])
    state["popts"] = dict(defaults)
    for name, value in popts.items():
        if name in defaults:
            state["popts"][name] = value
        else:
            ignored.append(f"p.{name}")
    if state["tab"] in WORKSPACES[1:]:  # a link from before the workspaces: ?tab=serving
        state["ws"], state["tab"] = state["tab"], DEFAULTS["tab"]
    if state["tab"] not in st.TABS:
        ignored.append("tab")
        state["tab"] = DEFAULTS["tab"]
    if state["ws"] not in WORKSPACES:
        ignored.append("ws")
        state["ws"] = DEFAULTS["ws"]
    return state, ignored


__all__ = ["WORKSPACES", "DEFAULTS", "CONTROLS", "default_state", "encode", "decode"]

"""What the Session workspace's controls hold, as plain text, and what it means.

The *state* is a flat dict of every control's value as the browser holds it
(text; dropdowns hold their option value), plus ``popts``: the selected
policy's parameters (``{field: text}``). The same dict is

* restored from and written to the page's query string by
  :mod:`simkv.dashboard.url` (with the Serving and Plan workspaces' forms), so a
  what-if can be shared by link — invalid values included, so a link reproduces
  an error too;
* turned into keyword arguments of :func:`simkv.build_scenario` by
  :func:`scenario_kwargs`, which checks every field first and reports what is
  wrong *per control* (an error key is the control's key, or
  ``popt.<policy>.<field>`` for a policy parameter).

Dashboard limits (documented in the README): tokens per field and steps per
run ≤ :data:`MAX_TOKENS`; model dimensions ≤ :data:`MAX_DIM`; beam width ≤
:data:`MAX_BEAM`; device memory ≤ 1 PiB. Bigger scenarios belong to ``simkv run``.
"""

from __future__ import annotations

import dataclasses
import math
import re

from policies import REGISTRY
from policies.base import Policy
from simkv.errors import SimkvError
from simkv.hfconfig import preset_names
from simkv.precision import PRECISIONS
from simkv.cost import DEFAULT_DEVICE, PRESET_NAMES
from simkv.scenario import DEFAULT_DECODE, DEFAULT_MODEL, DEFAULT_POLICY, DEFAULT_PROMPT
from simkv.units import parse_bytes

MAX_TOKENS = 1_000_000
MAX_STEPS = 1_000_000
MAX_DIM = 1024
MAX_BEAM = 256
MAX_TURNS = 10_000
MAX_DEVICE_BYTES = 1 << 50
#: Integer policy parameters beyond this are refused (they would overflow byte counts).
MAX_OPTION = 10**12
#: Extra runs on the compare tab (B, C, D).
N_COMPARE = 3
RUN_NAMES = "ABCD"
CUSTOM = "custom"
#: Precision value meaning "the policy's own default".
DEFAULT = "default"
SAME = "same"
#: The Session workspace's tabs.
TABS = ("memory", "layers", "compare", "events", "validation", "tune")
HEAT_VALUES = ("headroom", "capacity")
QUANTITIES = ("allocated", "resident", "used", "peak")

DIMS = ("layers", "heads", "kv_heads", "head_dim")
WORKLOAD_FIELDS = ("prompt", "decode", "turns", "turn_tokens", "turn_decode", "beam")

#: Every fixed control of the Session workspace: key → default text. Order = URL order.
DEFAULTS: dict[str, str] = {
    "model": DEFAULT_MODEL,
    "layers": "", "heads": "", "kv_heads": "", "head_dim": "",
    "precision": DEFAULT,
    "policy": DEFAULT_POLICY,
    "prompt": str(DEFAULT_PROMPT), "decode": str(DEFAULT_DECODE), "turns": "0", "turn_tokens": "64",
    "turn_decode": "", "beam": "1",
    "ops": "",
    # the session's device (simkv run --device: its memory, the precision its runtime loads the weights in);
    # device memory empty: the device's own
    "device": DEFAULT_DEVICE,
    "device_memory": "",
    **{
        f"cmp{i}_{part}": (("fixed" if i == 1 else "") if part == "policy" else (SAME if part == "precision" else ""))
        for i in range(1, N_COMPARE + 1)
        for part in ("policy", "opts", "precision")
    },
    "cmp_quantity": "allocated",
    "heat": "headroom",
    "tab": "memory",
    "vpath": "",
}
CONTROLS = tuple(DEFAULTS)
COMPARE_KEYS = tuple(k for k in CONTROLS if k.startswith("cmp") and k != "cmp_quantity")

#: Labels with units, used by the layout and in messages.
LABELS = {
    "model": "model", "layers": "layers", "heads": "query heads", "kv_heads": "KV heads", "head_dim": "head size",
    "precision": "KV precision", "policy": "policy",
    "prompt": "prompt (tokens)", "decode": "decode (tokens)", "turns": "chat turns", "turn_tokens": "turn (tokens)",
    "turn_decode": "turn decode (tokens)", "beam": "beam width", "ops": "ops", "device": "device",
    "device_memory": "device memory",
}

#: (lowest, highest, required) of the integer fields.
INT_FIELDS = {
    "layers": (1, MAX_DIM), "heads": (1, MAX_DIM), "kv_heads": (1, MAX_DIM), "head_dim": (1, MAX_DIM),
    "prompt": (1, MAX_TOKENS), "decode": (1, MAX_TOKENS), "turns": (0, MAX_TURNS), "turn_tokens": (1, MAX_TOKENS),
    "turn_decode": (1, MAX_TOKENS), "beam": (1, MAX_BEAM),
}
_OPTIONAL = {"layers", "heads", "kv_heads", "head_dim", "turn_decode"}
_CHOICES = re.compile(r":\s*(\w+(?:\s*\|\s*\w+)+)\s*$")


# -- policy parameters ---------------------------------------------------------------

def policy_fields(name: str) -> list[dataclasses.Field]:
    return list(REGISTRY[name].options()) if name in REGISTRY else []


def mechanics_names() -> set[str]:
    """Parameters every policy carries (the runtime mechanics), as opposed to its own rule's."""
    return {f.name for f in dataclasses.fields(Policy)}


def field_choices(f: dataclasses.Field) -> list[str] | None:
    """Allowed values of a parameter: true/false for a flag, or ``a | b | c`` read from its help."""
    if isinstance(f.default, bool):
        return ["true", "false"]
    if isinstance(f.default, str):
        match = _CHOICES.search(f.metadata.get("help", ""))
        if match:
            return [c.strip() for c in match.group(1).split("|")]
    return None


def as_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def policy_defaults(name: str) -> dict[str, str]:
    return {f.name: as_text(f.default) for f in policy_fields(name)}


def popt_key(policy: str, field: str) -> str:
    return f"popt.{policy}.{field}"


def default_state() -> dict:
    state = dict(DEFAULTS)
    state["popts"] = policy_defaults(state["policy"])
    return state


# -- checking values --------------------------------------------------------------------

def parse_int(text: object, label: str, lo: int, hi: int, required: bool = True) -> int | None:
    """An integer control's value, or a one-line :class:`ValueError` naming what is wrong."""
    raw = "" if text is None else str(text).strip().replace("_", "").replace(",", "")
    if not raw:
        if required:
            raise ValueError(f"{label}: enter a whole number")
        return None
    try:
        value = int(raw)
    except ValueError:
        try:
            number = float(raw)
        except ValueError:
            raise ValueError(f"{label}: {str(text).strip()!r} is not a number") from None
        if not math.isfinite(number) or number != int(number):
            raise ValueError(f"{label}: {str(text).strip()!r} is not a whole number") from None
        value = int(number)
    if value < lo:
        raise ValueError(f"{label}: must be at least {lo:,}, got {value:,}")
    if value > hi:
        raise ValueError(f"{label}: at most {hi:,} in the dashboard (use `simkv run` for more), got {value:,}")
    return value


def check_option(f: dataclasses.Field, text: str) -> str:
    """Reject option values that would only overflow: non-finite or beyond :data:`MAX_OPTION`."""
    if isinstance(f.default, (int, float)) and not isinstance(f.default, bool):
        try:
            number = float(str(text).strip())
        except ValueError:
            return text  # the policy's own parser names the problem
        if not math.isfinite(number):
            raise ValueError(f"{f.name}: {text!r} is not a finite number")
        if abs(number) > MAX_OPTION:
            raise ValueError(f"{f.name}: at most {MAX_OPTION:,} in the dashboard, got {text}")
    return str(text).strip()


class Invalid(Exception):
    """Some controls hold unusable values: ``errors`` maps control keys to one-line messages.

    ``notice``: a message the results area shows in full besides (the library refusing the model on the device,
    with the fix), where the control it concerns may be out of sight."""

    def __init__(self, errors: dict[str, str], notice: str = "") -> None:
        super().__init__("; ".join(errors.values()))
        self.errors = errors
        self.notice = notice


def label_of(key: str) -> str:
    """A control's label as messages name it (a policy parameter by its field name)."""
    return LABELS.get(key, key.rsplit(".", 1)[-1])


def invalid_status(errors: dict[str, str], labels=None, prefix: str = "Invalid input") -> str:
    """The status line of a form with bad fields: it names them; each one's message is shown next to it, once."""
    names = list(dict.fromkeys((labels or {}).get(k) or label_of(k) for k in errors))
    return f"{prefix}: {', '.join(names)} — see the message{'s' if len(names) > 1 else ''} in red on the left."


def scenario_kwargs(state: dict) -> dict:
    """Keyword arguments of :func:`simkv.build_scenario` for a state; :class:`Invalid` if a control is wrong.

    Only checks each control on its own (types, ranges, limits); what needs the
    library (a policy that refuses a workload, an unknown op) is checked by
    :func:`simkv.dashboard.compute.build`.
    """
    errors: dict[str, str] = {}
    values: dict[str, int | None] = {}
    ops = (state.get("ops") or "").strip()
    model = state.get("model") or ""
    for key, (lo, hi) in INT_FIELDS.items():
        if ops and key in WORKLOAD_FIELDS:
            continue  # replaced by the ops
        required = key not in _OPTIONAL or (model == CUSTOM and key in ("layers", "head_dim"))
        try:
            values[key] = parse_int(state.get(key), LABELS[key], lo, hi, required)
        except ValueError as err:
            errors[key] = str(err)
    if model == CUSTOM and not errors.get("heads") and not errors.get("kv_heads"):
        if values.get("heads") is None and values.get("kv_heads") is None:
            errors["kv_heads"] = "KV heads: a custom model needs query heads or KV heads"
    if not model:
        errors["model"] = "model: choose a preset or custom"
    elif model != CUSTOM and model not in preset_names():
        errors["model"] = f"model: unknown preset {model!r}"
    device = state.get("device") or ""
    if device not in PRESET_NAMES:
        errors["device"] = f"device: unknown preset {device!r}; choose one of {', '.join(PRESET_NAMES)}"
    memory = (state.get("device_memory") or "").strip()  # empty: the device's
    try:
        if memory and parse_bytes(memory) > MAX_DEVICE_BYTES:
            raise ValueError(f"at most 1 PiB, got {memory}")
    except (SimkvError, ValueError) as err:
        errors["device_memory"] = f"device memory: {err}"
    policy = state.get("policy") or ""
    options: dict[str, str] = {}
    if policy not in REGISTRY:
        errors["policy"] = f"policy: unknown policy {policy!r}; choose one of {', '.join(REGISTRY)}" if policy else "policy: choose one"
    else:
        popts = state.get("popts") or {}
        defaults = policy_defaults(policy)
        for f in policy_fields(policy):
            text = popts.get(f.name, defaults[f.name])
            if text is None or str(text).strip() == "":
                errors[popt_key(policy, f.name)] = f"{f.name}: enter a value (default {defaults[f.name]})"
                continue
            try:
                text = check_option(f, text)
            except ValueError as err:
                errors[popt_key(policy, f.name)] = str(err)
                continue
            if text != defaults[f.name]:
                options[f.name] = text
    precision = state.get("precision") or DEFAULT
    if precision != DEFAULT and precision not in PRECISIONS:
        errors["precision"] = f"KV precision: unknown {precision!r}; choose one of {', '.join(PRECISIONS)}"
    if errors:
        raise Invalid(errors)
    kwargs = {
        "model": None if model == CUSTOM else model,
        **{d: values.get(d) for d in DIMS},
        "precision": None if precision == DEFAULT else precision,
        "policy": policy,
        "policy_options": options,
        "device": device,
        "device_memory": memory or None,
    }
    if ops:
        kwargs["ops"] = ops
    else:
        kwargs.update({k: values[k] for k in WORKLOAD_FIELDS})
    return kwargs


def compare_runs(state: dict) -> list[tuple[str, dict]]:
    """The compare tab's extra runs as (key of the row, ``{policy, options, precision}``) pairs.

    Rows with no policy are skipped. Raises :class:`Invalid` (keys ``cmp<i>_opts``,
    ``cmp<i>_policy``) for an unknown policy or a malformed ``key=value`` list.
    """
    from policies import parse_policy_opts

    runs, errors = [], {}
    for i in range(1, N_COMPARE + 1):
        policy = (state.get(f"cmp{i}_policy") or "").strip()
        if not policy:
            continue
        if policy not in REGISTRY:
            errors[f"cmp{i}_policy"] = f"unknown policy {policy!r}"
            continue
        text = state.get(f"cmp{i}_opts") or ""
        items = [item.strip() for item in re.split(r"[,\s]+", text) if item.strip()]
        try:
            options = parse_policy_opts(items)
            fields = {f.name: f for f in policy_fields(policy)}
            for key, value in options.items():
                if key in fields:
                    check_option(fields[key], value)
        except (SimkvError, ValueError) as err:
            errors[f"cmp{i}_opts"] = str(err).replace("--policy-opt expects", "expected")
            continue
        precision = state.get(f"cmp{i}_precision") or SAME
        runs.append((f"cmp{i}", {"policy": policy, "options": options, "precision": precision}))
    if errors:
        raise Invalid(errors)
    return runs


def cli_command(kwargs: dict) -> str:
    """The ``simkv run`` command line of a scenario (to reproduce it outside the dashboard)."""
    import shlex

    parts = ["simkv", "run", *scenario_argv(kwargs)]
    if kwargs.get("device", DEFAULT_DEVICE) != DEFAULT_DEVICE:
        parts += ["--device", kwargs["device"]]
    if kwargs.get("device_memory") is not None:
        parts += ["--device-memory", kwargs["device_memory"]]
    return " ".join(shlex.quote(p) for p in parts)


def scenario_argv(kwargs: dict, lengths: bool = True) -> list[str]:
    """A scenario's model, policy and workload flags as ``simkv run`` and ``simkv tune`` take them (not the
    device's: each command line says its own); ``lengths=False`` leaves out ``--decode`` (``simkv tune --trace``
    draws it)."""
    parts = ["--model", kwargs["model"] or CUSTOM]
    for d in DIMS:
        if kwargs.get(d) is not None:
            parts += [f"--{d.replace('_', '-')}", str(kwargs[d])]
    if kwargs.get("precision"):
        parts += ["--precision", kwargs["precision"]]
    parts += ["--policy", kwargs["policy"]]
    for key, value in kwargs.get("policy_options", {}).items():
        parts += ["--policy-opt", f"{key}={value}"]
    if kwargs.get("ops"):
        parts += ["--ops", kwargs["ops"]]
    else:
        parts += ["--prompt", str(kwargs["prompt"])] + (["--decode", str(kwargs["decode"])] if lengths else [])
        if kwargs["turns"]:
            parts += ["--turns", str(kwargs["turns"]), "--turn-tokens", str(kwargs["turn_tokens"])]
            if kwargs.get("turn_decode") is not None:
                parts += ["--turn-decode", str(kwargs["turn_decode"])]
        if kwargs["beam"] != 1:
            parts += ["--beam", str(kwargs["beam"])]
    return parts

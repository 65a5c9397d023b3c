"""The command-line flags, declared once, and the contract every ``simkv`` command's parser enforces.

**The contract** (docs/guide/cli.md), checked by :class:`Parser` as it parses — the one place, before a command
does any work, for every command and for the dashboard, which parses its ``simkv run`` lines with the same parser:

* *Every flag is used by the mode it is given in, or refused.* A command with modes (``simkv run``: a single
  session or serving; serving a trace or synthetic requests, on paged or contiguous memory …) lists them as
  :class:`Mode` values, and every flag declares the modes that use it where it is declared
  (``add_argument(..., modes=...)``; :data:`ANY` for every mode). A flag given in a mode that does not use it is
  one line, exit code 2, naming the mode it belongs to. A flag of such a command that declares no mode fails the
  parse (a programming error, :class:`TypeError`): a new flag cannot forget it.
* *Every output path is checked before the command runs:* an existing, writable directory (none is created)
  and a file name ending in a format the flag writes (``add_argument(..., output=(".csv", ".parquet"))``;
  :func:`simkv.limits.check_output`); two outputs may not name the same file.

The flags that describe a scenario are declared here too (``run``, ``validate``, ``sweep``, ``tune``; ``cost``
takes the model flags), with the executor flags of ``sweep``/``tune``/``plan``; ``simkv run``'s whole
declaration is :func:`simkv.serving.cli.add_run_arguments`. Below both the CLI and the dashboard, so a line
means the same to each, and neither imports the other.
"""

from __future__ import annotations

import argparse
from typing import Callable, NamedTuple

from simkv import scenario as sc
from simkv.cost import DEFAULT_DEVICE
from simkv.errors import ConfigError
from simkv.models import WEIGHT_PRECISIONS

#: A flag every mode of its command uses.
ANY = "any"



class Mode(NamedTuple):
    """One way a command runs, as its flags select it. ``says`` completes "applies to …" and "not …" in the
    refusal of a flag of another mode; ``axis`` groups the modes that exclude each other (a refusal names the
    mode on the flag's own axis that is active, else the first mode's axis: the command's main choice);
    ``example`` is a command line that selects the mode (the contract test walks them)."""

    name: str
    says: str
    active: Callable[[argparse.Namespace], bool]
    axis: str
    example: tuple[str, ...] = ()
    #: What to give instead of a flag this mode refuses (flag → words), where there is such a flag.
    hints: dict = {}


#: Why a closed loop refuses the synthetic arrival flags (the synthetic mode's hints).
CLOSED_LOOP_HINTS = {option: "a closed loop (--concurrency) sends each request when a client's previous one ended"
                     for option in ("--rate", "--arrivals")}

#: Where a serving command's requests come from (``simkv run``'s serving and ``simkv plan``): a trace, or synthetic
#: requests, which arrive at ``--rate`` unless a closed loop (``--concurrency``) sends them.
REQUEST_MODES = (
    Mode("trace", "a trace (--trace)", lambda a: bool(a.trace), "requests", ("--trace", "azure-code")),
    Mode("synthetic", "synthetic requests (--synthetic)", lambda a: bool(a.synthetic), "requests", ("--synthetic",),
         hints=CLOSED_LOOP_HINTS),
    Mode("synthetic-arrivals", "synthetic requests at their arrival times (--synthetic, no --concurrency)",
         lambda a: bool(a.synthetic) and a.concurrency is None, "requests"),
    Mode("closed-loop", "a closed loop of clients (--concurrency)",
         lambda a: bool(a.trace or a.synthetic) and a.concurrency is not None, "load",
         ("--synthetic", "--concurrency", "2")),
)


class _Declared:
    """An argparse action that knows the modes its flag is used in (a mode name, a tuple of them, :data:`ANY`, or
    a function of one given value returning those: ``--requests N|PATH``), and for an output path the file
    formats it writes (suffixes; ``""``: a stem, several files) and which given values are paths (``path_if``)."""

    def __init__(self, *args, modes=None, output: tuple[str, ...] | None = None,
                 path_if: Callable[[str], bool] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.modes, self.output, self.path_if = modes, output, path_if

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        if isinstance(parser, Parser):
            parser.given.setdefault(self, []).append((option_string, values))


#: argparse's action kinds, each with a declaring subclass (:meth:`Parser.__init__` registers them).
_DECLARED = {kind: type("Declared" + base.__name__.lstrip("_"), (_Declared, base), {}) for kind, base in (
    (None, argparse._StoreAction), ("store", argparse._StoreAction), ("store_const", argparse._StoreConstAction),
    ("store_true", argparse._StoreTrueAction), ("store_false", argparse._StoreFalseAction),
    ("append", argparse._AppendAction), ("append_const", argparse._AppendConstAction),
    ("count", argparse._CountAction), ("extend", argparse._ExtendAction))}


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (still exit code 2) and the contract above enforced on every
    parse. ``modes``: the command's :class:`Mode` values, most general first (none: every flag is used)."""

    def __init__(self, *args, modes: tuple[Mode, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        for kind, cls in _DECLARED.items():
            self.register("action", kind, cls)
        self.modes = tuple(modes)
        #: The flags given in the parse under way: action → [(option string, value), ...].
        self.given: dict = {}

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        self.given = {}
        namespace, extras = super().parse_known_args(args, namespace)
        try:
            check_contract(self, namespace)
        except ConfigError as err:
            self.error(str(err))
        return namespace, extras

    def flags(self) -> list[argparse.Action]:
        """The optional flags of this command (``--help`` and ``--version`` aside)."""
        return [a for a in self._actions if a.option_strings
                and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


def flag_modes(action, value=None) -> tuple[str, ...]:
    """The modes a flag (with one given value) is used in: a tuple of mode names, or ``(ANY,)``."""
    modes = action.modes(value) if callable(action.modes) else action.modes
    return (modes,) if isinstance(modes, str) else tuple(modes)


def check_declarations(parser: Parser) -> None:
    """Every flag of a command with modes names the modes it is used in, each one of the command's."""
    if not parser.modes:
        return
    names = {m.name for m in parser.modes} | {ANY}
    for action in parser.flags():
        if getattr(action, "modes", None) is None:
            raise TypeError(f"{parser.prog}: {action.option_strings[0]} declares no mode: add_argument(..., "
                            f"modes=...) with one or more of {', '.join(sorted(names))}")
        if not callable(action.modes) and not set(flag_modes(action)) <= names:
            raise TypeError(f"{parser.prog}: {action.option_strings[0]}: unknown mode in {action.modes!r}")


def _values(value) -> list:
    """The values one use of a flag gave (a switch gives none: ``[None]``)."""
    if isinstance(value, list):
        return value or [None]
    return [value]


def check_contract(parser: Parser, args: argparse.Namespace) -> None:
    """The contract (module docstring) for the flags ``parser`` was just given: every flag used by an active mode,
    every output path writable in a format its flag writes. :class:`ConfigError` (one line) otherwise."""
    from simkv.limits import check_output

    check_declarations(parser)
    by_name = {m.name: m for m in parser.modes}
    active = [m for m in parser.modes if m.active(args)]
    for action, uses in parser.given.items():
        for option, value in uses:
            for one in _values(value):
                wanted = flag_modes(action, one) if parser.modes and action.modes is not None else (ANY,)
                if ANY in wanted or any(by_name[w] in active for w in wanted):
                    continue
                axes = {by_name[w].axis for w in wanted}
                now = ([m for m in active if m.axis in axes] or [m for m in active if m.axis == parser.modes[0].axis])
                says = " or ".join(by_name[w].says for w in wanted)
                if not now:
                    raise ConfigError(f"{option} applies to {says}, which this command line does not select")
                hint = now[-1].hints.get(option)
                raise ConfigError(f"{option} applies to {says}, not {now[-1].says}" + (f": {hint}" if hint else ""))
    written = {}
    for action, uses in parser.given.items():
        if not getattr(action, "output", None):
            continue
        for option, value in uses:
            for one in _values(value):
                if one is None or (action.path_if is not None and not action.path_if(one)):
                    continue
                path = check_output(one, option, action.output).resolve()
                if path in written:
                    raise ConfigError(f"{written[path]} and {option} both write {one}")
                written[path] = option


def workload_modes(session: Callable[[argparse.Namespace], bool]) -> tuple[Mode, Mode, Mode]:
    """The modes of a session's workload flags, for a command whose sessions are ``session``: its lengths
    (``--prompt``, ``--decode``, ``--turns``, ``--beam``), or its operations (``--ops``, which replaces them), and its
    chat turns (``--turn-tokens``, ``--turn-decode``, ``--turn-divergence``: with ``--turns`` above 0)."""
    return (Mode("lengths", "a single session described by its lengths (no --ops)", lambda a: session(a) and not a.ops,
                 "workload"),
            Mode("ops", "a single session given as operations (--ops)", lambda a: session(a) and bool(a.ops), "workload",
                 ("--ops", "prefill:8,decode:4")),
            Mode("chat", "chat turns (--turns above 0, no --ops)", lambda a: session(a) and not a.ops and a.turns > 0,
                 "turns", ("--turns", "1")))


def add_scenario_arguments(p: argparse.ArgumentParser, *, model=ANY, workload=ANY, lengths="lengths", chat="chat",
                           **modes) -> None:
    """The flags that describe a scenario, shared by ``run``, ``validate``, ``sweep`` and ``tune``: the model flags
    (in the modes ``model``), the workload of one session: ``--ops`` in the modes ``workload``, the lengths it
    replaces in ``lengths``, the chat turns' in ``chat`` (:func:`workload_modes`); ``modes`` gives a flag its own, by
    its dest (e.g. ``decode="flags"``)."""
    add_model_arguments(p, modes=model, **{k: v for k, v in modes.items() if k in _MODEL_DESTS})
    w = p.add_argument_group("workload (one stateful session)")
    defaults = {"prompt": lengths, "decode": lengths, "turns": lengths, "beam": lengths, "turn_tokens": chat,
                "turn_decode": chat, "turn_divergence": chat, "ops": workload}

    def mode(dest):
        return modes.get(dest, defaults[dest])

    w.add_argument("--prompt", type=int, default=sc.DEFAULT_PROMPT, modes=mode("prompt"),
                   help=f"prompt tokens (default {sc.DEFAULT_PROMPT})")
    w.add_argument("--decode", type=int, default=sc.DEFAULT_DECODE, modes=mode("decode"),
                   help=f"generated tokens (default {sc.DEFAULT_DECODE})")
    w.add_argument("--turns", type=int, default=0, modes=mode("turns"),
                   help="further chat turns after the first answer (default 0)")
    w.add_argument("--turn-tokens", type=int, default=64, modes=mode("turn_tokens"),
                   help="user tokens appended per chat turn (default 64)")
    w.add_argument("--turn-decode", type=int, modes=mode("turn_decode"),
                   help="tokens generated per chat turn (default: --decode)")
    w.add_argument("--beam", type=int, default=1, modes=mode("beam"),
                   help="beam width for every answer: fork, decode, select (default 1)")
    w.add_argument("--turn-divergence", type=int, default=0, metavar="D", modes=mode("turn_divergence"),
                   help="per chat turn, the last D stored tokens differ from the re-tokenized history: each turn "
                   "trims them (trim:D) and prefills them again (default 0)")
    w.add_argument("--ops", modes=mode("ops"),
                   help="explicit operations instead of the above, e.g. prefill:32,decode:100,fork:4,decode:50,"
                   "reorder,select:0,trim:20,prefill:36,decode:10,reset")


_MODEL_DESTS = ("model", "layers", "heads", "kv_heads", "head_dim", "sliding_window", "precision")


def add_model_arguments(p: argparse.ArgumentParser, *, modes=ANY, **only) -> None:
    """The model flags (a preset, optionally with dimensions overridden) and the KV precision, in the modes
    ``modes`` (``only``: a flag's own, by its dest)."""
    def mode(dest):
        return only.get(dest, modes)

    m = p.add_argument_group("model (a preset or a config.json; the dimension flags reshape a uniform one)")
    m.add_argument("--model", metavar="NAME|PATH", default=sc.DEFAULT_MODEL, modes=mode("model"),
                   help=f"preset name, a Hugging Face config.json or its folder, or 'custom' (default {sc.DEFAULT_MODEL}; "
                   "see `simkv models`)")
    m.add_argument("--layers", type=int, modes=mode("layers"), help="attention layers")
    m.add_argument("--heads", type=int, modes=mode("heads"), help="query heads")
    m.add_argument("--kv-heads", type=int, modes=mode("kv_heads"), help="key/value heads (fewer than heads: GQA)")
    m.add_argument("--head-dim", type=int, modes=mode("head_dim"), help="head size")
    m.add_argument("--sliding-window", type=int, metavar="N", modes=mode("sliding_window"),
                   help="attention window in tokens (0: none; default: the preset's, e.g. mistral-7b 4096); "
                   "policies that model windows free what leaves it (hf-dynamic)")
    m.add_argument("--precision", modes=mode("precision"),
                   help="KV precision: f32 f16 bf16 u8 u4 i8 fp8 (default: the runtime's, see simkv policies)")


def add_policy_arguments(p: argparse.ArgumentParser, *, policy=ANY, memory=ANY) -> None:
    """The allocation policy and its options (in the modes ``policy``), and the device memory beside the weights
    (``memory``)."""
    g = p.add_argument_group("allocation policy and device memory")
    g.add_argument("--policy", default=sc.DEFAULT_POLICY, modes=policy,
                   help=f"policy name (default {sc.DEFAULT_POLICY}; see `simkv policies`)")
    g.add_argument("--policy-opt", action="append", metavar="KEY=VALUE", modes=policy,
                   help="override a policy parameter (repeatable)")
    g.add_argument("--device-memory", modes=memory, help="device memory, e.g. 16GiB (default: the device's, "
                   f"--device; {DEFAULT_DEVICE} has {sc.DEFAULT_DEVICE_MEMORY})")
    g.add_argument("--weights-memory", metavar="BYTES", modes=memory, help="device memory taken besides the KV "
                   "cache (weights, other models), e.g. 8GiB or 0; counts toward the headroom limit and out of memory "
                   "(default: the preset's weights at --weights-precision; 0 for a custom shape)")
    g.add_argument("--weights-precision", choices=list(WEIGHT_PRECISIONS), modes=memory, help="precision of the "
                   "weights for the default --weights-memory (default: what the device's usual runtime loads: on "
                   "h100-sxm and a100-80gb the checkpoint as stored, as vLLM does: its quantized formats "
                   "('checkpoint') or its 2-byte dtype; on the OpenVINO presets an optimum-intel export's int8 from 1e9 "
                   "parameters, else f16)")


def add_latency_arguments(p: argparse.ArgumentParser, default: str | None = None, *, modes=ANY, help: str = "") -> None:
    """``--device``: the device preset (its memory, its runtime's precisions) and the cost model's step times."""
    g = p.add_argument_group("device (the cost model, see `simkv devices`)")
    g.add_argument("--device", metavar="NAME|host|PATH", default=default, modes=modes, help=help or (
        "device: a preset, host (after `simkv calibrate`) or a preset file; its memory and the precisions its runtime "
        "loads, and, given here, the predicted step times in the report")
        + f" (default {default or DEFAULT_DEVICE})")


def scenario_fields(args: argparse.Namespace) -> dict:
    """The scenario and policy flags as :func:`~simkv.scenario.build_scenario`'s keywords: a sweep point
    (simkv.lab.sweep) as ``simkv sweep`` and ``simkv tune`` take it, and the one session of ``simkv run``.

    ``--device`` (``run``, ``tune``; ``sweep`` has none) decides the session's device here for each of them: its
    memory unless ``--device-memory``, the precision its runtime loads the weights in, and the refusal of weights
    that leave no room (:func:`~simkv.scenario.build_scenario`). It and ``--sliding-window`` enter only when given,
    so the points of a sweep or tune without them keep their ids (no ``--device``: the default device,
    :data:`~simkv.cost.DEFAULT_DEVICE`)."""
    from policies import parse_policy_opts

    fields = {
        "model": None if args.model == "custom" else args.model, "layers": args.layers, "heads": args.heads,
        "kv_heads": args.kv_heads, "head_dim": args.head_dim, "precision": args.precision,
        "policy": args.policy, "policy_options": parse_policy_opts(args.policy_opt),
        "prompt": args.prompt, "decode": args.decode, "turns": args.turns, "turn_tokens": args.turn_tokens,
        "turn_decode": args.turn_decode, "beam": args.beam, "ops": args.ops, "device_memory": args.device_memory,
        "weights_memory": args.weights_memory, "weights_precision": args.weights_precision,
        # only when asked for: a sweep point's id hashes its keys
        **({"turn_divergence": args.turn_divergence} if getattr(args, "turn_divergence", 0) else {}),
    }
    if args.sliding_window is not None:
        fields["sliding_window"] = args.sliding_window
    if getattr(args, "device", None) is not None:
        fields["device"] = args.device
    return fields


def scenario_from_args(args: argparse.Namespace):
    """The :class:`~simkv.scenario.Scenario` of a single session's flags (``simkv run``; ``simkv tune``'s base
    scenario is the same fields, :func:`scenario_fields`), on ``--device`` (default
    :data:`~simkv.cost.DEFAULT_DEVICE`)."""
    return sc.build_scenario(**scenario_fields(args))


#: Where the points of ``sweep``, ``tune`` and ``plan`` run (:func:`add_executor_arguments`).
EXECUTOR_MODES = (
    Mode("local", "local processes (no --scheduler)", lambda a: not a.scheduler, "executor"),
    Mode("dask", "a Dask cluster (--scheduler)", lambda a: bool(a.scheduler), "executor",
         ("--scheduler", "tcp://127.0.0.1:1")),
)


def add_executor_arguments(p: argparse.ArgumentParser) -> None:
    """Where points run: local processes or a Dask cluster (``simkv sweep``, ``tune`` and ``plan``; their modes
    include :data:`EXECUTOR_MODES`)."""
    g = p.add_argument_group("where points run")
    g.add_argument("--workers", type=int, modes="local",
                   help="local processes (default: one per core; 1 = in this process)")
    g.add_argument("--scheduler", metavar="tcp://HOST:PORT", modes=ANY,
                   help="run on this Dask cluster (dask.distributed) instead")

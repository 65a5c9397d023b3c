"""The dashboard's Serving view: ``simkv run --trace/--synthetic`` on the page.

The form's values become a ``simkv run`` command line (shown on the page), which
is parsed with the command's own flag declaration and run by the command's own calls
(:func:`simkv.serving.cli.run_parser`, :func:`simkv.serving.cli.spec_from_args`,
:func:`simkv.serving.run.serve`), so the view shows what ``simkv run … --json``
prints for the same line. Figures:
:mod:`simkv.serving.figures` (memory over time with the pool and the KV budget,
the per-request timeline, the waste breakdown), in the memory policy's colour
(:mod:`simkv.lab.palette`: ``paged``, or the contiguous buffers' policy).

Workloads: the first N requests of the shipped Azure conversation trace, or N
synthetic requests (Poisson arrivals at a rate, lengths from ``fixed:N``,
``uniform:LO:HI`` or ``lognormal:MEAN:SIGMA``, a seed). No server paths: the
CLI's ``trace:PATH`` lengths are refused here.

Limits, so a callback stays within ~2 s on a loaded 2-core machine (measured,
README "Dashboard"): at most :data:`MAX_REQUESTS` requests and
:data:`MAX_TOKENS` prompt + output tokens in all; contiguous memory at most
:data:`MAX_CONTIGUOUS_ROWS` ledger rows (estimated per request before running,
:func:`simkv.dashboard.compute.estimate_ledger_rows`); and at most
:data:`MAX_ROUNDS` scheduler rounds (counted while running, through ``serve``'s
progress callback; a paged round cost 0.4-1.5 ms here, a contiguous one, a step, ~0.15 ms):
a pool too small for the load preempts requests again and again, which only
shows while it runs. Past a limit the page says which and gives the ``simkv run``
line to run it in full. Nothing depends on the clock: same form, same page.
"""

from __future__ import annotations

import math
import shlex
import threading

import numpy as np
from dash import Input, Output, html

from simkv.cost import DEFAULT_DEVICE
from simkv.errors import SimkvError
from simkv.hfconfig import preset_names
from simkv.precision import PRECISIONS
from simkv.scenario import DEFAULT_MODEL, DEFAULT_POLICY

from simkv.dashboard import state as st
from simkv.dashboard.components import (Field, busy, defaults, errors_out, form_fields, graph, internal_error, progress,
                                        register_shown, render_cards)
from simkv.dashboard.compute import ResultCache

#: The shipped trace, as the command line names it (run from the repository root) and where it is.
TRACE = "azure-conv"  # the shipped trace by name (simkv.shipped.TRACES)
MAX_REQUESTS = 1000
MAX_TOKENS = 2_000_000
MAX_RATE = 1000.0
MAX_LENGTH = 32_768
MAX_SIGMA = 2.0
MAX_SEED = 2**32 - 1
MAX_BLOCK_SIZE = 1024
MAX_POOL_BLOCKS = 10_000_000
MAX_POOL_GIB = 1024.0
MAX_SEQS = 4096
MAX_BATCHED_TOKENS = 1_000_000
MAX_STATIC_BATCH = 1024
MAX_CONTIGUOUS_ROWS = 1_000_000
MAX_ROUNDS = {"paged": 4_000, "contiguous": 8_000}
PERCENTILES = (50, 90, 99)
#: Points per line of the memory figure (as the single-session timeline: SVG, drawn fast without a GPU).
TIMELINE_POINTS = 2000


def _paged(v: dict) -> bool:
    return v.get("sv_memory") == "paged"


def _synthetic(v: dict) -> bool:
    return v.get("sv_workload") == "synthetic"


def _batches(v: dict) -> bool:
    """Whether requests run side by side, up to max_num_seqs: paged memory, or continuous contiguous buffers."""
    return _paged(v) or v.get("sv_scheduler") == "continuous"


def _devices():
    from simkv.cost import DEVICES

    return tuple(DEVICES)


def _policies():
    from policies import REGISTRY

    return tuple(REGISTRY)


def _serving(name: str):
    """The library's own list of ``name`` (``SCHEDULERS``, ``MEMORIES``): one it gains shows up here."""
    from simkv.serving import run

    return tuple(getattr(run, name))


#: The Serving workspace's form, in page order. To add a control: one Field here (its URL key, label, default,
#: choices, when it applies) and, in :func:`command`, the ``simkv run`` flag it becomes.
FIELDS = (
    Field("sv_workload", "workload", "trace", (("trace", "Azure trace"), ("synthetic", "synthetic")),
          hint="Azure conversation trace (first N), or Poisson arrivals", section="Workload"),
    Field("sv_requests", "requests", "100", hint=f"≤ {MAX_REQUESTS:,}", numeric=True),
    Field("sv_rate", "rate (requests/s)", "4", shown=_synthetic),
    Field("sv_prompt_dist", "prompt lengths", "lognormal:1024:1.0", hint="fixed:N, uniform:LO:HI, lognormal:MEAN:SIGMA",
          shown=_synthetic),
    Field("sv_output_dist", "output lengths", "lognormal:200:1.0", hint="same forms", shown=_synthetic),
    Field("sv_seed", "seed", "0", numeric=True, shown=_synthetic),
    Field("sv_model", "model", DEFAULT_MODEL, preset_names, section="Model and device"),
    Field("sv_precision", "KV precision", st.DEFAULT, lambda: ((st.DEFAULT, "default"), *PRECISIONS),
          hint="default: the runtime's for the device (paged) or the policy's"),
    Field("sv_device", "device", DEFAULT_DEVICE, _devices),  # every command's default device (simkv.cost)
    Field("sv_memory", "memory", "paged", lambda: _serving("MEMORIES"),
          hint="a block pool (GenAI's or vLLM's), or per-request buffers", section="Memory"),
    Field("sv_policy", "buffer policy", DEFAULT_POLICY, _policies, shown=lambda v: not _paged(v)),
    Field("sv_policy_opts", "policy options", "", hint="key=value, … e.g. max_prompt_len=4096",
          placeholder="the policy's defaults", shown=lambda v: not _paged(v)),
    Field("sv_block_size", "block size (tokens)", "", placeholder="the scheduler's: 32, vLLM 16", numeric=True,
          shown=_paged),
    Field("sv_pool", "pool", "dynamic", (("dynamic", "the scheduler's"), ("blocks", "num_kv_blocks"),
                                         ("gib", "cache size")),
          hint="GenAI's grows with the load; vLLM's is its share of the device less the weights", shown=_paged),
    Field("sv_pool_size", "pool size", "", hint="blocks, or GiB",
          shown=lambda v: _paged(v) and v.get("sv_pool") != "dynamic"),
    Field("sv_scheduler", "scheduler", "continuous", lambda: _serving("SCHEDULERS"), section="Scheduler"),
    Field("sv_static_batch", "static batch", "8", numeric=True,
          shown=lambda v: not _paged(v) and v.get("sv_scheduler") == "static"),
    Field("sv_max_num_seqs", "max_num_seqs", "", hint="requests running at once", numeric=True,
          placeholder="the scheduler's: 256, vLLM the device's", shown=_batches),
    Field("sv_max_num_batched_tokens", "batched tokens", "", hint="max_num_batched_tokens per step", numeric=True,
          placeholder="the scheduler's: 256, vLLM the device's", shown=_paged),
    Field("sv_cache_eviction", "cache eviction", "", hint="GenAI's: start=N,recent=N,max=N[,kvcrush=B] tokens, or on",
          placeholder="off", shown=lambda v: _paged(v) and v.get("sv_scheduler") == "continuous"),
)
KEYS = tuple(f.key for f in FIELDS)
DEFAULTS = defaults(FIELDS)
LABELS = {f.key: f.label for f in FIELDS}


class WorkLimit(SimkvError):
    """The run went past :data:`MAX_ROUNDS` scheduler rounds."""


# -- the form → a `simkv run` command line ------------------------------------------------------------

def _number(values: dict, key: str, lo: int, hi: float, whole: bool = True):
    """A whole number in lo..hi, or (``whole=False``) a number above 0 and at most hi."""
    text = str(values.get(key) or "").strip().replace("_", "").replace(",", "")
    if not text:
        raise ValueError("enter a number")
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not np.isfinite(number) or (whole and number != int(number)):
        raise ValueError(f"{text!r} is not a whole number" if whole else f"{text!r} is not a finite number")
    if not (lo <= number if whole else number > 0):
        raise ValueError(f"must be at least {lo:,}" if whole else "must be above 0")
    if number > hi:
        raise ValueError(f"at most {hi:,g} in the dashboard (use `simkv run` for more)")
    return int(number) if whole else number


def _optional(values: dict, key: str, lo: int, hi: float):
    """:func:`_number`, or None for an empty field (the command's own default)."""
    return _number(values, key, lo, hi) if str(values.get(key) or "").strip() else None


def _lengths(text: str) -> str:
    """A synthetic length distribution the dashboard accepts (the library parses it again)."""
    kind, _, rest = str(text or "").strip().partition(":")
    args = rest.split(":") if rest else []
    try:
        numbers = [float(a) for a in args]
    except ValueError:
        numbers = None
    forms = {"fixed": 1, "uniform": 2, "lognormal": 2}
    if kind not in forms or numbers is None or len(numbers) != forms[kind] or not all(map(np.isfinite, numbers)):
        raise ValueError("use fixed:N, uniform:LO:HI or lognormal:MEAN:SIGMA")
    lengths = numbers[:1] if kind == "lognormal" else numbers
    if kind != "lognormal" and any(n != int(n) for n in lengths):
        raise ValueError("lengths are whole numbers of tokens")
    if not all(1 <= n <= MAX_LENGTH for n in lengths):
        raise ValueError(f"lengths must be in 1..{MAX_LENGTH:,} in the dashboard")
    if kind == "lognormal" and not 0 <= numbers[1] <= MAX_SIGMA:
        raise ValueError(f"sigma must be in 0..{MAX_SIGMA:g} in the dashboard")
    return f"{kind}:{rest}"


def _policy_opts(policy: str, text: str) -> dict[str, str]:
    """``key=value, …`` for the contiguous buffers' policy, checked as the compare tab checks its rows."""
    from policies import parse_policy_opts

    items = [item.strip() for item in str(text or "").replace(",", " ").split() if item.strip()]
    try:
        options = parse_policy_opts(items)
    except SimkvError as err:
        raise ValueError(str(err).replace("--policy-opt expects", "expected")) from None
    fields = {f.name: f for f in st.policy_fields(policy)}
    for key, value in options.items():
        if key not in fields:
            raise ValueError(f"{key!r} is not an option of {policy}; it has {', '.join(fields)}")
        options[key] = st.check_option(fields[key], value)
    return options


def _eviction(text: str, block_size: int) -> str | None:
    """``--cache-eviction``'s value in the flag's form (None: off), checked as GenAI checks it against the block size;
    a bad one is a ValueError (ConfigError)."""
    from simkv.serving.sched.eviction import parse_cache_eviction

    eviction = parse_cache_eviction(text)
    if eviction is None:
        return None
    eviction.check(block_size)
    return eviction.label()


def command(values: dict) -> list[str]:
    """The ``simkv run`` arguments (after ``run``) of the form's values; :class:`st.Invalid` names the bad fields."""
    from policies import REGISTRY

    v = {**DEFAULTS, **{k: values.get(k) for k in KEYS if values.get(k) is not None}}
    errors: dict[str, str] = {}
    got: dict = {}

    def check(key, fn, *args):
        try:
            got[key] = fn(*args)
        except ValueError as err:
            errors[key] = str(err)

    for f in FIELDS:
        allowed = [o["value"] for o in f.options()] if f.choices is not None else None
        if allowed is not None and v[f.key] not in allowed:
            errors[f.key] = f"choose one of {', '.join(allowed)}"
    synthetic = v["sv_workload"] == "synthetic"
    paged = v["sv_memory"] == "paged"
    check("sv_requests", _number, v, "sv_requests", 1, MAX_REQUESTS)
    if synthetic:
        check("sv_rate", _number, v, "sv_rate", 0, MAX_RATE, False)
        check("sv_prompt_dist", _lengths, v["sv_prompt_dist"])
        check("sv_output_dist", _lengths, v["sv_output_dist"])
        check("sv_seed", _number, v, "sv_seed", 0, MAX_SEED)
    if _batches(v):
        check("sv_max_num_seqs", _optional, v, "sv_max_num_seqs", 1, MAX_SEQS)
    if paged:
        check("sv_max_num_batched_tokens", _optional, v, "sv_max_num_batched_tokens", 1, MAX_BATCHED_TOKENS)
        check("sv_block_size", _optional, v, "sv_block_size", 1, MAX_BLOCK_SIZE)
        if v["sv_scheduler"] not in ("continuous", "vllm") and "sv_scheduler" not in errors:
            errors["sv_scheduler"] = ("paged memory runs under continuous batching, GenAI's or vLLM's: choose "
                                      "continuous or vllm, or contiguous memory")
        if v["sv_scheduler"] == "continuous" and (v["sv_cache_eviction"] or "").strip():
            check("sv_cache_eviction", _eviction, v["sv_cache_eviction"], got.get("sv_block_size") or 32)
        if v["sv_pool"] == "blocks":
            check("sv_pool_size", _number, v, "sv_pool_size", 1, MAX_POOL_BLOCKS)
        elif v["sv_pool"] == "gib":
            check("sv_pool_size", _number, v, "sv_pool_size", 0, MAX_POOL_GIB, False)
    else:
        if v["sv_scheduler"] == "static":
            check("sv_static_batch", _number, v, "sv_static_batch", 1, MAX_STATIC_BATCH)
        if v["sv_policy"] in REGISTRY:
            check("sv_policy_opts", _policy_opts, v["sv_policy"], v["sv_policy_opts"])
    if errors:
        raise st.Invalid(errors)
    n = str(got["sv_requests"])
    if synthetic:
        argv = ["--synthetic", "--requests", n, "--rate", f"{got['sv_rate']:g}", "--prompt-dist", got["sv_prompt_dist"],
                "--output-dist", got["sv_output_dist"], "--seed", str(got["sv_seed"])]
    else:
        argv = ["--trace", TRACE, "--limit", n]
    argv += ["--model", v["sv_model"]]
    if v["sv_precision"] != st.DEFAULT:
        argv += ["--precision", v["sv_precision"]]
    argv += ["--memory", v["sv_memory"], "--scheduler", v["sv_scheduler"]]
    if paged:
        if got["sv_block_size"]:
            argv += ["--block-size", str(got["sv_block_size"])]
        if v["sv_pool"] == "blocks":
            argv += ["--num-kv-blocks", str(got["sv_pool_size"])]
        elif v["sv_pool"] == "gib":
            argv += ["--cache-size", f"{got['sv_pool_size']:g}"]
        if got.get("sv_cache_eviction"):
            argv += ["--cache-eviction", got["sv_cache_eviction"]]
    else:
        argv += ["--policy", v["sv_policy"]]
        for key, value in got["sv_policy_opts"].items():
            argv += ["--policy-opt", f"{key}={value}"]
        if v["sv_scheduler"] == "static":
            argv += ["--static-batch", str(got["sv_static_batch"])]
    # only the flags the run uses, and those set (empty: the scheduler's own default)
    if got.get("sv_max_num_seqs"):
        argv += ["--max-num-seqs", str(got["sv_max_num_seqs"])]
    if got.get("sv_max_num_batched_tokens"):
        argv += ["--max-num-batched-tokens", str(got["sv_max_num_batched_tokens"])]
    argv += ["--device", v["sv_device"]]
    return argv


def cli_line(argv: list[str]) -> str:
    return "simkv run " + shlex.join(argv) + " --json"


_PARSER = None
_PARSER_LOCK = threading.Lock()


def spec_of(argv: list[str]):
    """The :class:`~simkv.serving.ServingSpec` ``simkv run`` builds from these arguments (same parser, same call)."""
    global _PARSER
    from simkv.serving.cli import run_parser, spec_from_args

    with _PARSER_LOCK:
        if _PARSER is None:
            _PARSER = run_parser()
        args = _PARSER.parse_args(argv)
    spec = spec_from_args(args)
    if spec.replicas > 1:
        raise SimkvError("the Serving view shows one device: run --replicas with simkv run")
    return spec


def check_work(spec) -> None:
    """Refuse, before running, what exceeds the token and (contiguous) ledger-row limits."""
    from simkv.dashboard.compute import estimate_ledger_rows
    from simkv.serving.contiguous import request_scenario
    from simkv.serving.engine.core import session_prompts

    prompts = session_prompts(spec.requests)
    tokens = sum(prompts) + sum(r.max_new_tokens for r in spec.requests)
    if tokens > MAX_TOKENS:
        raise st.Invalid({"sv_requests": f"{tokens:,} prompt and output tokens in all: at most {MAX_TOKENS:,} in "
                                         "the dashboard; fewer requests or shorter lengths"})
    if spec.memory != "contiguous":
        return
    from policies import get_policy

    policy = spec.policy if not isinstance(spec.policy, str) else get_policy(spec.policy, spec.policy_options)
    from simkv.cost import get_device

    memory = spec.device_memory if spec.device_memory is not None else get_device(spec.device).memory_bytes
    budget = memory - spec.weights_bytes  # as serve() takes it
    rows, seen = 0, {}
    for p, r in zip(prompts, spec.requests):
        key = (p, r.max_new_tokens)
        if key not in seen:  # the engine runs each distinct request shape once, then copies its rows
            scenario = request_scenario(spec.model, spec.precision, policy, p, r.max_new_tokens, budget)
            seen[key] = estimate_ledger_rows(scenario, limit=MAX_CONTIGUOUS_ROWS)
        rows += seen[key]
        if rows > MAX_CONTIGUOUS_ROWS:
            raise st.Invalid({"sv_policy": f"over {MAX_CONTIGUOUS_ROWS:,} ledger rows (estimated) with these "
                                           "buffers: the dashboard's limit; fewer requests, another policy or paged"})


class _Rounds:
    """``serve``'s progress callback: counts scheduler rounds and stops the run past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit, self.n = limit, 0

    def __call__(self, _added: int) -> None:
        self.n += 1
        if self.n > self.limit:
            raise WorkLimit(f"stopped after {self.limit:,} scheduler rounds (the dashboard's limit)")


#: The last few results by command line (switching tabs or back does not re-run): the single-session
#: view's cache, bounded by count only (each run is bounded by the limits above).
CACHE = ResultCache(max_items=4, max_rows=math.inf)


def run(argv: list[str]):
    """The :class:`~simkv.serving.ServingResult` of a command line (cached), within the dashboard's limits."""
    from simkv.serving.run import serve

    key = tuple(argv)
    result = CACHE.get(key)
    if result is None:
        spec = spec_of(argv)
        check_work(spec)
        result = serve(spec, progress=_Rounds(MAX_ROUNDS[spec.memory]))
        CACHE.put(key, result)
    return result


# -- the view as data -----------------------------------------------------------------------------------

def percentiles(values: np.ndarray, qs=PERCENTILES) -> list[float | None]:
    """Percentiles of the defined values (NaN: the request has none), as ``ServingResult.metrics`` takes them."""
    from simkv.serving.run import percentile

    v = np.asarray(values, dtype=float)
    return [percentile(v, q) for q in qs]


def latency(result) -> dict[str, list[float | None]]:
    t = result.request_table
    return {"TTFT": percentiles(t["ttft_s"]), "TPOT": percentiles(t["tpot_s"]), "e2e": percentiles(t["e2e_s"])}


def policy_name(spec) -> str:
    return "paged" if spec.memory == "paged" else (spec.policy if isinstance(spec.policy, str) else spec.policy.name)


def describe(spec, argv: list[str]) -> str:
    n = len(spec.requests)
    work = f"first {n:,} requests of the Azure conversation trace" if "--trace" in argv else f"{n:,} synthetic requests"
    if spec.memory == "paged":
        c = spec.paged
        pool = (f"{c.num_kv_blocks:,} blocks" if c.num_kv_blocks else f"{c.cache_size:g} GiB" if c.cache_size
                else "dynamic pool")
        mem = f"paged, block {c.block_size}, {pool}"
    else:
        mem = f"contiguous, policy {policy_name(spec)}"
    return f"{work}; {spec.model.name}, {spec.precision.name} KV; {mem}; {spec.scheduler} scheduler; {spec.device}"


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1000:,.1f} ms" if v < 10 else f"{v:,.2f} s"


def cards(result) -> list[dict]:
    from simkv.units import format_bytes

    m = result.metrics
    return [
        {"key": "sv_finished", "label": "finished", "value": f"{m['requests_finished']:,} / {m['requests_total']:,}",
         "detail": f"{m['requests_ignored']:,} ignored, {m['requests_rejected']:,} rejected, "
                   f"{m['requests_unfinished']:,} unfinished"},
        {"key": "sv_preemptions", "label": "preemptions", "value": f"{m['preemptions']:,}", "detail": "by recompute"},
        {"key": "sv_peak", "label": "peak allocated", "value": format_bytes(m["peak_allocated_bytes"]),
         "detail": "in-step peak"},
        {"key": "sv_mean", "label": "mean allocated", "value": format_bytes(m["mean_allocated_bytes"]),
         "detail": "time-weighted"},
        {"key": "sv_waste", "label": "waste", "value": f"{m['waste_pct']:.1f} %", "detail": "of mean allocated"},
        {"key": "sv_throughput", "label": "throughput", "value": f"{m['throughput_tokens_per_s']:,.0f} tok/s",
         "detail": "generated tokens"},
        {"key": "sv_time", "label": "simulated", "value": f"{m['sim_time_s']:,.1f} s", "detail": f"{m['steps']:,} steps"},
    ]


def serving_view(values: dict) -> dict:
    """The whole view for the form's values (plain data and plotly figures; no Dash).

    ``{"ok", "status", "cli", "errors": {key: message}, "cards", "latency", "memory", "requests", "waste"}``.
    """
    from simkv.lab.palette import policy_color
    from simkv.serving import figures

    try:
        argv = command(values)
    except st.Invalid as err:
        return {"ok": False, "errors": err.errors, "cli": "", "status": st.invalid_status(err.errors, LABELS)}
    line = cli_line(argv)
    try:
        result = run(argv)
    except st.Invalid as err:
        return {"ok": False, "errors": err.errors, "cli": line,
                "status": st.invalid_status(err.errors, LABELS, "Over the dashboard's limits") + f" Run it with: {line}"}
    except WorkLimit as err:
        why = ("requests keep waiting for memory or being preempted: fewer requests or a bigger pool"
               if "--num-kv-blocks" in argv or "--cache-size" in argv else "fewer requests")
        return {"ok": False, "errors": {}, "cli": line, "status": f"Not shown: {err}; {why}, or run it with: {line}"}
    except SimkvError as err:
        return {"ok": False, "errors": {}, "cli": line, "status": f"Cannot serve this: {err}"}
    spec = result.spec
    color = policy_color(policy_name(spec))
    memory = figures.with_pool(figures.serving_timeline(result, max_points=TIMELINE_POINTS, webgl=False), result)
    memory.update_layout(title=f"memory over time: {policy_name(spec)}, {len(spec.requests):,} requests",
                         margin=dict(t=50, b=40, l=60, r=20))
    for fig in (requests := figures.request_timeline(result, color), waste := figures.waste_breakdown(result, color)):
        fig.update_layout(margin=dict(t=40, b=40, l=60, r=20))
    status = describe(spec, argv) + (f". {result.stopped}" if result.stopped else "")
    return {"ok": True, "errors": {}, "cli": line, "status": status, "cards": cards(result),
            "latency": latency(result), "memory": memory, "requests": requests, "waste": waste}


# -- Dash ------------------------------------------------------------------------------------------------

QUESTION = "How does a runtime's KV memory serve a stream of requests on one device?"


def workspace(values: dict) -> list:
    """The Serving workspace: its form on the left (:data:`FIELDS`), its results on the right."""
    return [
        html.Div(className="sidebar", id="sv-sidebar", children=[
            html.H2("Serving"), html.Div(QUESTION, className="hint question"),
            *form_fields(FIELDS, values, "sv-err"),
            html.Div(f"Limits: ≤ {MAX_REQUESTS:,} requests, ≤ {MAX_TOKENS:,} tokens in all; beyond them the page "
                     "gives the simkv run line.", className="hint"),
        ]),
        html.Div(className="main", children=[
            html.Div(id="sv-status", className="status", role="status"),
            progress("sv-progress", "Serving the requests…"),
            html.Div(id="sv-results", className="results", children=[
                html.Details(className="cli", children=[html.Summary("the same run from the command line"),
                                                        html.Code(id="sv-cli")]),
                html.Div(id="sv-cards", className="cards"),
                html.Div(id="sv-latency", className="delta"),
                graph("sv-memory-graph", "simkv-serving-memory"),
                html.Div(className="pair", children=[graph("sv-requests-graph", "simkv-serving-requests"),
                                                     graph("sv-waste-graph", "simkv-serving-waste")]),
            ]),
        ]),
    ]


def latency_table(rows: dict[str, list[float | None]]) -> html.Table:
    head = html.Tr([html.Th("latency")] + [html.Th(f"p{q}") for q in PERCENTILES])
    body = [html.Tr([html.Td(name)] + [html.Td(_ms(v)) for v in values]) for name, values in rows.items()]
    return html.Table(id="sv-latency-table", children=[html.Thead(head), html.Tbody(body)])


def serving_callback(values: dict, ws: str) -> dict:
    """The Serving workspace's outputs (nothing is computed while another workspace is open)."""
    from dash import no_update

    from simkv.dashboard import compute

    if ws != "serving":
        return {k: no_update for k in OUTPUTS} | {"errors": [no_update] * len(KEYS)}
    try:
        view = serving_view(values)
    except Exception as err:  # noqa: BLE001 - never a traceback in the browser
        view = {"ok": False, "errors": {}, "cli": "", "status": internal_error(err)}
    errors = [view["errors"].get(k, "") for k in KEYS]
    if not view["ok"]:
        blank = compute.placeholder_figure("No result: " + ("fix the input marked in red." if view["errors"]
                                                            else "see the message above."))
        return {"memory": blank, "requests": blank, "waste": blank, "cards": [], "latency": "",
                "status": view["status"], "status_class": "status invalid", "cli": view["cli"], "errors": errors}
    return {"memory": compute.style(view["memory"]), "requests": compute.style(view["requests"]),
            "waste": compute.style(view["waste"]), "cards": render_cards(view["cards"]),
            "latency": latency_table(view["latency"]), "status": view["status"], "status_class": "status",
            "cli": view["cli"], "errors": errors}


#: The callback's outputs (besides the per-field errors): key -> (component id, property).
OUTPUTS = {"memory": ("sv-memory-graph", "figure"), "requests": ("sv-requests-graph", "figure"),
           "waste": ("sv-waste-graph", "figure"), "cards": ("sv-cards", "children"), "latency": ("sv-latency", "children"),
           "status": ("sv-status", "children"), "status_class": ("sv-status", "className"), "cli": ("sv-cli", "children")}


def register(app) -> None:
    app.callback(
        output={k: Output(*where) for k, where in OUTPUTS.items()} | {"errors": errors_out("sv-err")},
        inputs={"values": {k: Input(k, "value") for k in KEYS}, "ws": Input("ws", "value")},
        running=busy("sv-progress", "sv-results"),
    )(serving_callback)
    register_shown(app, FIELDS)


__all__ = ["workspace", "serving_view", "serving_callback", "register", "command", "run", "latency", "percentiles"]

"""Tune a policy's parameters over a workload distribution: Pareto front and a recommendation.

One peak measured on one decode length misleads: the peak depends on where
the last synchronised reallocation falls for that exact length. So every
configuration runs on every workload of a distribution (decode lengths, and
optionally prompts, drawn from a trace) and each objective is a metric
aggregated over them — ``mean`` or ``max`` (the worst case).

* Search: ``grid`` (every combination), ``random`` (``budget`` draws) or
  ``optuna`` (Optuna's multi-objective TPE sampler, constraints passed to it).
  Parameters are grids (``KEY=START:STOP:STEP`` or ``KEY=V1,V2``, as in
  ``simkv sweep``); Optuna picks an index into a range (ordered) or a value
  of a list (categorical). Same seed, same configurations, same result.
* Constraints: no workload runs out of memory; the worst peak fits next to the
  weights (``peak:max <= device memory − weights``); and any ``--constraint``.
* Pareto front: the feasible configurations no other one beats on every
  objective. Recommendation: the feasible configuration that is no worse than
  the baseline (the policy's defaults) on every objective and best on the first;
  ``improved`` is false (and the recommendation is the baseline) if none is.
* Serving (``TuneSpec.serving``, :mod:`simkv.lab.tune_serving`): the candidates are GenAI scheduler
  settings and the workload is a trace served with its arrival times; same search, front and
  recommendation, with the serving metrics (p99 TPOT, pool bytes, preemptions …).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simkv.errors import ConfigError
from simkv.lab import sweep
from simkv.units import format_bytes, parse_bytes

#: Objective metric names → sweep row columns (a session tune).
METRICS = {
    "peak": "peak_allocated_bytes",
    "spike_p99": "spike_p99_bytes",
    "spike": "max_spike_bytes",
    "reallocs": "realloc_count",
    "copied": "bytes_copied",
    "waste": "mean_waste_bytes",
}
#: The same for a serving tune (rows of simkv.lab.tune_serving.serve_row).
SERVING_METRICS = {
    "peak": "peak_allocated_bytes",
    "pool": "pool_bytes",
    "tpot_p99": "tpot_p99_s",
    "ttft_p99": "ttft_p99_s",
    "preemptions": "preemptions",
    "copied": "bytes_copied",
    "waste": "mean_waste_bytes",
    "time": "sim_time_s",
}
COLUMNS = {**METRICS, **SERVING_METRICS}
LABELS = {
    "peak": "peak allocated", "spike_p99": "p99 in-step spike", "spike": "largest in-step spike",
    "reallocs": "reallocations per session", "copied": "bytes copied", "waste": "mean waste (allocated − used)",
    "pool": "pool (largest allocation)", "tpot_p99": "p99 TPOT", "ttft_p99": "p99 TTFT",
    "preemptions": "preemptions", "time": "simulated time to serve the trace",
}
SECONDS = ("tpot_p99", "ttft_p99", "time")
COUNTS = ("reallocs", "preemptions")
AGGREGATES = ("mean", "max")
SEARCHES = ("optuna", "random", "grid")
DEFAULT_OBJECTIVES = ("peak:max", "reallocs:mean")  # memory to budget for, time spent copying
#: What to search when no --param is given (policy → param specs).
TUNABLE = {
    "openvino-gpu": ("headroom_base=0:512:8", "stagger=1:256:1"),
    "fixed": ("tokens=0:1024:8",),
    "geometric": ("ratio=1.05:3:0.05",),
    "openvino-cpu": ("growth=2:8:1",),
    "static": ("min_response_len=0:2048:32",),
}
MAX_BUDGET = 5_000


@dataclass(frozen=True)
class Objective:
    metric: str
    agg: str = "mean"

    @classmethod
    def parse(cls, text: str) -> "Objective":
        metric, _, agg = text.strip().partition(":")
        agg = agg or "mean"
        if metric not in COLUMNS or agg not in AGGREGATES:
            raise ConfigError(f"objective {text!r}: expected METRIC[:mean|max] with METRIC one of {', '.join(COLUMNS)}")
        return cls(metric, agg)

    @property
    def name(self) -> str:
        return f"{self.metric}:{self.agg}"

    @property
    def is_bytes(self) -> bool:
        return self.metric not in COUNTS + SECONDS

    @property
    def is_seconds(self) -> bool:
        return self.metric in SECONDS

    @property
    def scale(self) -> float:
        """Figure units: MiB, ms or plain counts."""
        return 1 / 2**20 if self.is_bytes else 1e3 if self.is_seconds else 1.0

    def label(self) -> str:
        unit = " (MiB)" if self.is_bytes else " (ms)" if self.is_seconds else ""
        return f"{'mean' if self.agg == 'mean' else 'worst'} {LABELS[self.metric]}{unit}"

    def of(self, rows: list[dict]) -> float:
        values = np.array([r[COLUMNS[self.metric]] for r in rows], dtype=np.float64)
        return float(values.mean() if self.agg == "mean" else values.max())

    def show(self, value: float) -> str:
        if not np.isfinite(value):
            return "-"
        if self.is_seconds:
            return f"{value * 1e3:,.3f} ms"
        return format_bytes(int(round(value))) if self.is_bytes else f"{value:,.2f}"


@dataclass(frozen=True)
class Constraint:
    objective: Objective
    limit: float

    @classmethod
    def parse(cls, text: str) -> "Constraint":
        m = re.fullmatch(r"\s*([a-z_0-9]+(?::[a-z]+)?)\s*<=\s*(\S+)\s*", text)
        if not m:
            raise ConfigError(f"constraint {text!r}: expected METRIC[:mean|max]<=VALUE, e.g. peak:max<=2GiB")
        obj = Objective.parse(m.group(1))
        text = m.group(2)
        try:
            if obj.is_seconds:  # seconds, or a number with ms / s
                limit = float(text[:-2]) / 1e3 if text.endswith("ms") else float(text.removesuffix("s"))
            else:
                limit = float(parse_bytes(text)) if obj.is_bytes else float(text)
        except (ConfigError, ValueError):
            raise ConfigError(f"constraint {text!r}: {m.group(2)!r} is not a number") from None
        return cls(obj, limit)

    @property
    def name(self) -> str:
        shown = (self.objective.show(self.limit) if self.objective.is_bytes or self.objective.is_seconds
                 else f"{self.limit:g}")
        return f"{self.objective.name}<={shown}"


@dataclass(frozen=True)
class Param:
    key: str
    values: tuple
    ordered: bool  # a START:STOP:STEP range (Optuna searches an index) rather than a list

    @classmethod
    def parse(cls, spec: str, policy: str, kinds: dict[str, type] | None = None) -> "Param":
        key, values = sweep.parse_param(spec, policy, kinds)
        return cls(key, tuple(values), ":" in spec.partition("=")[2])


@dataclass
class Candidate:
    params: dict
    objectives: dict
    violations: list[str]
    rows: list[dict] = field(repr=False, default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.violations

    def to_json(self) -> dict:
        return {"params": self.params, "objectives": self.objectives, "feasible": self.feasible,
                "violations": self.violations}


@dataclass
class TuneSpec:
    base: dict  # a sweep point: scenario values, policy, policy_options
    params: list[Param]
    workloads: list[tuple[int, int]]  # (prompt, decode) per workload
    objectives: list[Objective] = field(default_factory=lambda: [Objective.parse(o) for o in DEFAULT_OBJECTIVES])
    constraints: list[Constraint] = field(default_factory=list)
    search: str = "optuna"
    budget: int = 60
    seed: int = 0
    #: Workloads the search never sees; the baseline and the recommendation are re-scored on them.
    holdout: list[tuple[int, int]] = field(default_factory=list)
    #: Tune serving settings instead (a :class:`simkv.lab.tune_serving.ServingTarget`, whose ``evaluator`` scores
    #: the candidates; ``workloads`` unused).
    serving: object | None = None

    def __post_init__(self) -> None:
        if self.search not in SEARCHES:
            raise ConfigError(f"--search must be one of {', '.join(SEARCHES)}, got {self.search!r}")
        if not 1 <= self.budget <= MAX_BUDGET:
            raise ConfigError(f"--budget must be in 1..{MAX_BUDGET:,}, got {self.budget}")
        if not self.params:
            raise ConfigError(f"policy {self.base['policy']} has nothing to tune: give --param")
        if not self.objectives:
            raise ConfigError("give at least one --objective")
        if len({o.name for o in self.objectives}) != len(self.objectives):
            raise ConfigError("an objective is given twice")
        allowed = SERVING_METRICS if self.serving else METRICS
        for o in self.objectives + [c.objective for c in self.constraints]:
            if o.metric not in allowed:
                raise ConfigError(f"metric {o.metric!r} is not measured by a {'serving' if self.serving else 'session'} "
                                  f"tune; choose one of {', '.join(allowed)}")
        if self.serving and self.holdout:
            raise ConfigError("--holdout is for session workloads; a serving tune runs one trace slice (--limit)")
        if self.search == "grid" and self.grid_size > self.budget:
            raise ConfigError(f"the grid has {self.grid_size:,} configurations, more than --budget {self.budget}: "
                              "raise --budget, narrow --param or use --search optuna")

    @property
    def grid_size(self) -> int:
        return int(np.prod([len(p.values) for p in self.params], dtype=float))

    @property
    def free_bytes(self) -> int:
        """Device memory left for the KV cache next to the weights (``--weights-memory``)."""
        if self.serving:
            return self.serving.free_bytes
        sc = sweep.scenario_of(self.base)
        return sc.device_memory - sc.weights_memory

    @property
    def weights_bytes(self) -> int:
        return self.serving.weights_bytes if self.serving else sweep.scenario_of(self.base).weights_memory

    def defaults(self) -> dict:
        """The baseline's value of every searched parameter."""
        if self.serving:
            values = self.serving.defaults()
        else:
            policy = sweep.scenario_of(self.base).policy
            values = {p.key: getattr(policy, p.key, self.base.get(p.key)) for p in self.params}
        return {p.key: values.get(p.key) for p in self.params}


@dataclass
class TuneResult:
    spec: TuneSpec
    baseline: Candidate
    recommendation: Candidate
    improved: bool
    pareto: list[Candidate]
    evaluated: list[Candidate]
    #: (baseline, recommendation) scored on the held-out workloads, if any.
    holdout: tuple[Candidate, Candidate] | None = None

    def to_json(self, command: str, tune_command: str, workloads_source: str, reproduces: bool = True) -> dict:
        s = self.spec
        if s.serving:
            workloads = s.serving.describe()
        else:
            workloads = {"source": workloads_source, "count": len(s.workloads),
                         "prompt": _stats([p for p, _ in s.workloads]), "decode": _stats([d for _, d in s.workloads])}
        return {
            "policy": s.base["policy"],
            "search": s.search, "budget": s.budget, "seed": s.seed,
            "workloads": workloads,
            "params": {p.key: list(p.values) if not p.ordered else [p.values[0], p.values[-1]] for p in s.params},
            "objectives": [o.name for o in s.objectives],
            "constraints": ["every request FINISHED" if s.serving else "no OOM", f"peak:max<={s.free_bytes}"]
            + [c.name for c in s.constraints],
            "weights_memory_bytes": s.weights_bytes,
            "baseline": self.baseline.to_json(),
            "recommendation": self.recommendation.to_json(),
            "improved": self.improved,
            "pareto": [c.to_json() for c in self.pareto],
            "evaluated": len(self.evaluated),
            "holdout": None if not self.holdout else {
                "count": len(s.holdout), "decode": _stats([d for _, d in s.holdout]),
                "baseline": self.holdout[0].to_json(), "recommendation": self.holdout[1].to_json()},
            "command": command,
            #: whether ``command`` runs what the numbers above scored (false: a table over several workloads)
            "command_reproduces": reproduces,
            "tune_command": tune_command,
        }


def _stats(values: list[int]) -> dict:
    a = np.asarray(values)
    return {"min": int(a.min()), "mean": round(float(a.mean()), 3), "max": int(a.max())}


# --- evaluation ----------------------------------------------------------------------------------


class Evaluator:
    """Runs a configuration on every workload (cached by parameters) and scores it."""

    def __init__(self, spec: TuneSpec, pool: sweep.Executor, out: str | Path | None):
        self.spec, self.pool, self.out = spec, pool, out
        self.cache: dict[tuple, Candidate] = {}
        self.free = spec.free_bytes

    def points(self, params: dict) -> list[dict]:
        return [sweep.make_point(self.spec.base, {**params, "prompt": p, "decode": d}) for p, d in self.workloads]

    @property
    def workloads(self) -> list[tuple[int, int]]:
        return self.spec.workloads

    def __call__(self, params: dict) -> Candidate:
        key = params_key(params)
        if key not in self.cache:
            rows = sweep.run_sweep(self.points(params), self.out, pool=self.pool, progress=False).rows
            self.cache[key] = self.score(params, rows)
        return self.cache[key]

    def score(self, params: dict, rows: list[dict]) -> Candidate:
        objectives = {o.name: o.of(rows) for o in self.spec.objectives}
        violations = []
        oom = sum(1 for r in rows if r["oom"])
        if oom:
            violations.append(f"out of memory on {oom} of {len(rows)} workloads")
        worst = max(r["peak_allocated_bytes"] for r in rows)
        if worst > self.free:
            violations.append(f"worst peak {format_bytes(worst)} > {format_bytes(self.free)} free next to the weights")
        return Candidate(dict(params), objectives, violations + constraint_violations(self.spec, rows), rows)


def params_key(params: dict) -> tuple:
    """A configuration as a cache key."""
    return tuple(sorted(params.items()))


def constraint_violations(spec, rows: list[dict]) -> list[str]:
    """The user's constraints (``--constraint``) that ``rows`` break, one message each."""
    out = []
    for c in spec.constraints:
        value = c.objective.of(rows)
        if value > c.limit:
            out.append(f"{c.objective.name} = {c.objective.show(value)} > {c.objective.show(c.limit)}")
    return out


# --- search --------------------------------------------------------------------------------------


def _grid_configs(spec: TuneSpec) -> list[dict]:
    import itertools

    keys = [p.key for p in spec.params]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(p.values for p in spec.params))]


def _random_configs(spec: TuneSpec) -> list[dict]:
    rng = np.random.default_rng(spec.seed)
    configs = []
    for _ in range(spec.budget):
        configs.append({p.key: p.values[int(rng.integers(len(p.values)))] for p in spec.params})
    return list({tuple(c.items()): c for c in configs}.values())


def _optuna_search(spec: TuneSpec, evaluate: Evaluator, bar) -> list[Candidate]:
    try:
        import optuna
    except ImportError:
        raise ConfigError("--search optuna needs optuna: pip install optuna (or use --search random)") from None
    import warnings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "constraints_func is experimental"
        sampler = optuna.samplers.TPESampler(seed=spec.seed, constraints_func=lambda t: t.user_attrs["violation"])
    study = optuna.create_study(directions=["minimize"] * len(spec.objectives), sampler=sampler)
    defaults = spec.defaults()
    start = {}
    for p in spec.params:  # try the defaults first when they are on the grid
        value = defaults[p.key]
        if value in p.values:
            start[p.key] = p.values.index(value) if p.ordered else value
    if len(start) == len(spec.params):
        study.enqueue_trial(start)
    found = []
    for _ in range(spec.budget):
        trial = study.ask()
        params = {}
        for p in spec.params:
            if p.ordered:
                params[p.key] = p.values[trial.suggest_int(p.key, 0, len(p.values) - 1)]
            else:
                params[p.key] = trial.suggest_categorical(p.key, list(p.values))
        cand = evaluate(params)
        # Optuna's convention: a constraint value <= 0 is satisfied.
        trial.set_user_attr("violation", [float(len(cand.violations))])
        study.tell(trial, [cand.objectives[o.name] for o in spec.objectives])
        found.append(cand)
        bar.update()
    return found


def _dominates(a: Candidate, b: Candidate, names: list[str]) -> bool:
    return all(a.objectives[n] <= b.objectives[n] for n in names) and any(
        a.objectives[n] < b.objectives[n] for n in names)


def pareto_front(cands: list[Candidate], names: list[str]) -> list[Candidate]:
    """Feasible candidates no other feasible one dominates; of equal objective values, one (the first by params)."""
    feasible = [c for c in cands if c.feasible]
    front = [c for c in feasible if not any(_dominates(o, c, names) for o in feasible)]
    front.sort(key=lambda c: ([c.objectives[n] for n in names], sorted(c.params.items())))
    return list({tuple(c.objectives[n] for n in names): c for c in reversed(front)}.values())[::-1]


def run_tune(spec: TuneSpec, *, workers: int | None = None, scheduler: str | None = None,
             out: str | Path | None = None, progress: bool = False) -> TuneResult:
    """Search, then return the baseline, the front and the recommendation."""
    from tqdm import tqdm

    names = [o.name for o in spec.objectives]
    if spec.serving and out:
        raise ConfigError("--out stores session sweep points; a serving tune has none")
    with sweep.executor(workers, scheduler) as pool:
        # a serving target brings its own evaluator: tune_serving builds on this module, not the reverse
        evaluate = spec.serving.evaluator(spec, pool) if spec.serving else Evaluator(spec, pool, out)
        baseline = evaluate({})
        with tqdm(total=spec.budget if spec.search == "optuna" else None, desc="tune", unit="config",
                  disable=not progress) as bar:
            if spec.search == "optuna":
                found = _optuna_search(spec, evaluate, bar)
            else:
                configs = _grid_configs(spec) if spec.search == "grid" else _random_configs(spec)
                if hasattr(evaluate, "prefetch"):  # one run per configuration: run them side by side
                    evaluate.prefetch(configs)
                bar.reset(total=len(configs))
                found = []
                for params in configs:
                    found.append(evaluate(params))
                    bar.update()
        unique = list({tuple(sorted(c.params.items())): c for c in found}.values())
        front = pareto_front(unique, names)
        better = [c for c in unique if c.feasible and all(c.objectives[n] <= baseline.objectives[n] for n in names)
                  and c.objectives[names[0]] < baseline.objectives[names[0]]]
        best = min(better, key=lambda c: ([c.objectives[n] for n in names], sorted(c.params.items()))) \
            if better else baseline
        held = None
        if spec.holdout:
            check = HoldoutEvaluator(spec, pool, out)
            held = (check({}), check(best.params))
    return TuneResult(spec, baseline, best, bool(better), front, unique, held)


class HoldoutEvaluator(Evaluator):
    """Scores configurations on the held-out workloads instead of the searched ones."""

    @property
    def workloads(self) -> list[tuple[int, int]]:
        return self.spec.holdout


# --- presentation --------------------------------------------------------------------------------


def run_command(base: dict, params: dict) -> str:
    """A ``simkv run`` line for the base scenario with ``params`` applied."""
    import inspect

    from simkv.scenario import build_scenario

    defaults = {k: v.default for k, v in inspect.signature(build_scenario).parameters.items()}
    point = sweep.make_point(base, params)
    words = ["simkv", "run"]
    for key in sweep.SCENARIO_FIELDS:
        value = point.get(key)
        if value is not None and value != defaults.get(key):
            words += [f"--{key.replace('_', '-')}", str(value)]
    words += ["--policy", point["policy"]]
    for key, value in point["policy_options"].items():
        words += ["--policy-opt", f"{key}={value}"]
    return shlex.join(words)


def session_command(spec: TuneSpec, params: dict) -> tuple[str, bool]:
    """The ``simkv run`` line of a session tune's configuration ``params``, and whether it reproduces the table's
    numbers: it does when the tune ran one workload (the line carries its prompt and decode, as the tune ran it:
    :meth:`Evaluator.points`); over several, a run can show only one of them, so the line is the policy to apply."""
    if len(spec.workloads) == 1:
        (prompt, decode), = spec.workloads
        return run_command(spec.base, {**params, "prompt": prompt, "decode": decode}), True
    return run_command(spec.base, params), False


def command_label(spec: TuneSpec, reproduces: bool) -> str:
    """What the summary's last line calls the command: ``reproduce`` where it runs what the table scored, else
    ``apply`` with the reason (a table over several workloads)."""
    return ("reproduce" if reproduces else
            f"apply (the numbers above are over {len(spec.workloads):,} workloads; a simkv run runs one)")


def front_table(result: TuneResult) -> str:
    spec = result.spec
    keys = [p.key for p in spec.params]
    head = keys + [o.name for o in spec.objectives]
    rows = []

    defaults = spec.defaults()

    def line(tag: str, c: Candidate) -> list[str]:
        params = {**defaults, **c.params}
        return [str(params[k]) for k in keys] + [o.show(c.objectives[o.name]) for o in spec.objectives] + [tag]

    for c in result.pareto:
        tag = "recommended" if c is result.recommendation else ""
        rows.append(line(tag, c))
    rows.append(line("baseline (defaults)" + ("" if result.baseline.feasible else ": " + "; ".join(result.baseline.violations)),
                     result.baseline))
    widths = [max(len(x) for x in col) for col in zip(head + [""], *rows)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths[:-1]) + "  {}"
    return "\n".join([fmt.format(*head, ""), *(fmt.format(*r) for r in rows)])


def summary_lines(result: TuneResult, command: str, label: str = "reproduce") -> list[str]:
    spec, base, rec = result.spec, result.baseline, result.recommendation
    lines = [f"Pareto front ({len(result.pareto)} of {len(result.evaluated)} configurations evaluated):",
             front_table(result), ""]
    if result.improved:
        lines.append(f"recommendation: {', '.join(f'{k}={v}' for k, v in rec.params.items())}")
        for o in spec.objectives:
            b, r = base.objectives[o.name], rec.objectives[o.name]
            change = f"{100 * (r - b) / b:+.1f} %" if b else "n/a"
            lines.append(f"  {o.name:<16}{o.show(r):>14}  vs defaults {o.show(b):>14}  ({change})")
    else:
        lines.append("no configuration beats the defaults on every objective; keep the defaults")
    if result.holdout:
        held_base, held_rec = result.holdout
        lines.append(f"held out ({len(spec.holdout)} other workloads, never searched):")
        for o in spec.objectives:
            b, r = held_base.objectives[o.name], held_rec.objectives[o.name]
            change = f"{100 * (r - b) / b:+.1f} %" if b else "n/a"
            lines.append(f"  {o.name:<16}{o.show(r):>14}  vs defaults {o.show(b):>14}  ({change})")
        if held_rec.violations:
            lines.append(f"  violates: {'; '.join(held_rec.violations)}")
    lines.append(f"{label}: {command}")
    return lines


def figure(result: TuneResult):
    """The evaluated configurations on the first two objectives (or objective vs first parameter)."""
    import plotly.graph_objects as go

    from simkv.lab.palette import BASELINE_COLOR, OTHER_COLOR, policy_color

    spec = result.spec
    obj = spec.objectives
    scale = [o.scale for o in obj]

    def xy(c: Candidate):
        if len(obj) >= 2:
            return c.objectives[obj[0].name] * scale[0], c.objectives[obj[1].name] * scale[1]
        key = spec.params[0].key
        return c.params.get(key, spec.defaults()[key]), c.objectives[obj[0].name] * scale[0]

    def text(c: Candidate) -> str:
        return ", ".join(f"{k}={v}" for k, v in c.params.items()) or "defaults"

    fig = go.Figure()
    groups = (("other feasible", [c for c in result.evaluated if c.feasible and c not in result.pareto], OTHER_COLOR, "circle", 7),
              ("infeasible", [c for c in result.evaluated if not c.feasible
                              and all(np.isfinite(v) for v in c.objectives.values())], OTHER_COLOR, "x", 7),
              ("Pareto front", result.pareto, policy_color(spec.base["policy"]), "circle", 10),
              ("defaults", [result.baseline], BASELINE_COLOR, "diamond", 13))
    if result.improved:
        groups += (("recommendation", [result.recommendation], "#ffbf00", "star", 18),)
    for name, cands, colour, symbol, size in groups:
        if not cands:
            continue
        pts = [xy(c) for c in cands]
        fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers", name=name,
                        text=[text(c) for c in cands], customdata=[json.dumps(c.params, sort_keys=True) for c in cands],
                        hovertemplate="%{text}<br>%{x:,.2f}, %{y:,.2f}<extra>" + name + "</extra>",
                        marker={"color": colour, "symbol": symbol, "size": size,
                                "line": {"width": 1, "color": "#333"}})
    x_title = obj[0].label() if len(obj) >= 2 else spec.params[0].key
    y_title = obj[1].label() if len(obj) >= 2 else obj[0].label()
    fig.update_layout(template="plotly_white", width=900, height=560,
                      title=(f"simkv tune --serving: GenAI scheduler settings over {len(spec.serving.template.requests):,} "
                             f"requests of {spec.serving.trace}" if spec.serving else
                             f"simkv tune: {spec.base['policy']} over {len(spec.workloads)} workloads"),
                      xaxis_title=x_title, yaxis_title=y_title, legend={"orientation": "h", "y": -0.18})
    return fig


__all__ = ["Constraint", "Objective", "Param", "TuneSpec", "TuneResult", "Candidate", "run_tune", "pareto_front",
           "figure", "front_table", "summary_lines", "run_command", "COLUMNS", "METRICS", "SERVING_METRICS",
           "TUNABLE", "DEFAULT_OBJECTIVES"]

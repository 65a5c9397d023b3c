"""``simkv tune --serving``: search a serving scheduler's settings (GenAI's, or vLLM's) for a serving trace.

With ``scheduler="vllm"`` (``--serving-scheduler vllm``) the candidates are vLLM's settings instead
(:data:`VLLM_PARAMS`: ``block_size``, ``gpu_memory_utilization`` — the pool, vLLM's ``num_gpu_blocks`` —,
``max_num_batched_tokens``, ``max_num_seqs``, ``long_prefill_token_threshold``, ``prefix_caching``), served
under ``--scheduler vllm``; the baseline is vLLM's server defaults for the device (``batch_defaults``: block 16,
0.9 of the device, 8192 / 1024 on an H100), as ``simkv run --scheduler vllm`` takes them.

The candidate is a paged serving configuration (OpenVINO GenAI ``SchedulerConfig``: ``block_size``,
the pool — ``num_kv_blocks`` or ``cache_size`` GiB, both 0 = the dynamic pool —,
``max_num_batched_tokens``, ``max_num_seqs``, ``dynamic_split_fuse``, ``prefix_caching``, and
``cache_eviction_max``: GenAI's cache eviction with that ``max_cache_size``, 0 off); the workload
is the first ``limit`` requests of a trace, served by :func:`simkv.serving.serve` with their arrival
times. Objectives are the run's metrics (peak or pool bytes, p99 TPOT/TTFT, preemptions, bytes copied,
mean waste, simulated time). The baseline is GenAI's defaults (:class:`simkv.serving.SchedulerConfig`:
block 32, dynamic pool, 256 batched tokens, 256 sequences, split-fuse on). Feasible means every request
FINISHED (none IGNORED, REJECTED or left unfinished) and the peak fits next to the weights.

Bounded: at most :data:`MAX_REQUESTS` requests, and a run stops (infeasible) after more preemptions
than ``max_preemptions`` (default: one per request) — recomputing requests takes the engine's slow
path, so a pool far too small would otherwise take minutes per candidate.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

from simkv.errors import ConfigError

#: Tunable keys (named as the ``simkv run`` flags) → (SchedulerConfig field, type).
PARAMS: dict[str, tuple[str, type]] = {
    "block_size": ("block_size", int), "num_kv_blocks": ("num_kv_blocks", int), "cache_size": ("cache_size", float),
    "max_num_batched_tokens": ("max_num_batched_tokens", int), "max_num_seqs": ("max_num_seqs", int),
    "dynamic_split_fuse": ("dynamic_split_fuse", bool), "prefix_caching": ("enable_prefix_caching", bool),
    # GenAI's cache eviction (simkv.serving.sched.eviction): its max_cache_size in tokens, 0 = off; start and recent
    # as the target's (GenAI's defaults, 32 and 128, unless the baseline sets them)
    "cache_eviction_max": ("cache_eviction", int),
}
#: What to search when no --param is given.
TUNABLE = ("block_size=16,32,64", "cache_size=0,2,4,8,16", "max_num_batched_tokens=128,256,512,1024,2048")
#: vLLM's tunable settings (``--scheduler vllm``) → (SchedulerConfig field, type).
VLLM_PARAMS: dict[str, tuple[str, type]] = {
    "block_size": ("block_size", int), "gpu_memory_utilization": ("gpu_memory_utilization", float),
    "max_num_batched_tokens": ("max_num_batched_tokens", int), "max_num_seqs": ("max_num_seqs", int),
    "long_prefill_token_threshold": ("long_prefill_token_threshold", int),
    "prefix_caching": ("enable_prefix_caching", bool),
}
#: What to search under vLLM's scheduler when no --param is given.
VLLM_TUNABLE = ("block_size=16,32", "gpu_memory_utilization=0.8,0.9,0.95",
                "max_num_batched_tokens=2048,4096,8192,16384", "max_num_seqs=256,1024")
#: The schedulers ``tune --serving`` searches the settings of.
SCHEDULERS = ("continuous", "vllm")
DEFAULT_OBJECTIVES = ("peak:max", "tpot_p99:max", "ttft_p99:max")
#: Requests one candidate serves at most.
MAX_REQUESTS = 100_000
DEFAULT_LIMIT = 1000


def params_of(scheduler: str = "continuous") -> dict[str, tuple[str, type]]:
    """The tunable settings of a scheduler."""
    return VLLM_PARAMS if scheduler == "vllm" else PARAMS


def tunable(scheduler: str = "continuous") -> tuple[str, ...]:
    return VLLM_TUNABLE if scheduler == "vllm" else TUNABLE


def kinds(scheduler: str = "continuous") -> dict[str, type]:
    return {k: t for k, (_, t) in params_of(scheduler).items()}


def serve_row(spec) -> dict:
    """Serve one configuration; its metrics as a tuner row (module-level: worker processes run it)."""
    from simkv.serving import serve

    try:
        result = serve(spec)
    except ConfigError as err:  # e.g. a pool larger than the device: infeasible, not an error of the search
        return {"error": str(err)}
    m = result.metrics
    steps = result.steps
    return {
        "peak_allocated_bytes": m["peak_allocated_bytes"],
        "pool_bytes": int(steps["allocated_bytes"].max()) if len(steps) else 0,
        "bytes_copied": m["bytes_copied"], "mean_waste_bytes": m["waste_bytes"],
        # no request with two tokens (or none finished): no TPOT; the constraints flag such runs
        "tpot_p99_s": m["tpot_p99_s"] or 0.0, "ttft_p99_s": m["ttft_p99_s"] or 0.0,
        "preemptions": m["preemptions"], "sim_time_s": m["sim_time_s"],
        "requests_total": m["requests_total"], "requests_finished": m["requests_finished"],
        "requests_ignored": m["requests_ignored"], "requests_rejected": m["requests_rejected"],
        "requests_unfinished": m["requests_unfinished"], "stopped": result.stopped,
    }


@dataclass
class ServingTarget:
    """The fixed part of every candidate: requests, model, precision, device; and how to run one."""

    template: object  # a ServingSpec (paged, continuous); its ``paged`` is the baseline
    trace: str
    limit: int
    #: Flags of the reproducing ``simkv run`` line besides the searched ones (model, device, …).
    flags: list[str] = field(default_factory=list)

    @property
    def free_bytes(self) -> int:
        return self.template.device_memory - self.template.weights_bytes

    @property
    def weights_bytes(self) -> int:
        return self.template.weights_bytes

    @property
    def params(self) -> dict[str, tuple[str, type]]:
        return params_of(self.template.scheduler)

    def defaults(self) -> dict:
        return {key: _value(self.template.paged, key) for key in self.params}

    def spec(self, params: dict):
        known = self.params
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ConfigError(f"--param {unknown[0]}: not a {self.template.scheduler} serving parameter "
                              f"({', '.join(known)})")
        base = self.template.paged
        fields = {known[k][0]: v for k, v in params.items() if k != "cache_eviction_max"}
        if "cache_eviction_max" in params:
            fields["cache_eviction"] = _eviction(base.cache_eviction, params["cache_eviction_max"])
        return dataclasses.replace(self.template, paged=dataclasses.replace(base, **fields))

    def command(self, params: dict) -> str:
        """A ``simkv run --trace`` line serving the same requests with ``params``."""
        cfg = self.spec(params).paged
        base = self.template.paged
        vllm = self.template.scheduler == "vllm"
        words = ["simkv", "run", "--trace", self.trace, "--limit", str(self.limit), *self.flags]
        for key, (name, kind) in self.params.items():
            value = getattr(cfg, name)
            # GenAI's: what differs from simkv run's defaults; vLLM's run defaults depend on the device: all of them
            if value == getattr(base.__class__(), name) and not (vllm and kind is not bool):
                continue
            if key == "cache_eviction_max":
                words += ["--cache-eviction", value.label()]
            elif key == "dynamic_split_fuse":
                words.append("--no-dynamic-split-fuse")
            elif key == "prefix_caching":
                words.append("--prefix-caching")
            else:
                words += [f"--{key.replace('_', '-')}", f"{value:g}" if kind is float else str(value)]
        return shlex.join(words)

    def evaluator(self, spec, pool) -> "ServingEvaluator":
        """What :func:`simkv.lab.tune.run_tune` scores this target's candidates with."""
        return ServingEvaluator(spec, pool)

    def describe(self) -> dict:
        t = self.template
        return {"source": self.trace, "requests": len(t.requests), "model": t.model.name,
                "precision": t.precision.name, "device": t.device, "device_memory_bytes": t.device_memory,
                "max_preemptions": t.max_preemptions}


def build_target(*, trace: str, limit: int | None, model: str | None, layers=None, heads=None, kv_heads=None,
                 head_dim=None, precision: str | None, device: str | None, device_memory, weights_memory,
                 weights_precision, max_context: int | None, max_preemptions: int | None,
                 scheduler: str = "continuous") -> ServingTarget:
    """A target from the flag values of ``simkv tune --serving`` (the same meaning as ``simkv run --trace``)."""
    from simkv.hfconfig import resolve_model
    from simkv.models import vllm_kv_precision
    from simkv.precision import get_precision
    from simkv.cost import DEFAULT_DEVICE, get_device
    from simkv.scenario import resolve_weights_memory
    from simkv.serving import SchedulerConfig, ServingSpec, load_trace
    from simkv.serving.run import check_spec, context_of, runtime_defaults
    from simkv.units import parse_bytes

    limit = DEFAULT_LIMIT if limit is None else limit
    if not 1 <= limit <= MAX_REQUESTS:
        raise ConfigError(f"--limit must be in 1..{MAX_REQUESTS:,}, got {limit}")
    if max_preemptions is not None and max_preemptions < 0:
        raise ConfigError(f"--max-preemptions must be >= 0, got {max_preemptions}")
    if scheduler not in SCHEDULERS:
        raise ConfigError(f"--serving-scheduler: unknown {scheduler!r}; choose {', '.join(SCHEDULERS)}")
    vllm = scheduler == "vllm"
    spec_model = resolve_model(model, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    device = device or DEFAULT_DEVICE
    # the paged cache's precision, as simkv run serves it: vLLM's scheduler the model's dtype, GenAI's what the
    # device's runtime keeps (u8 on a CPU)
    prec = get_precision(precision or (vllm_kv_precision(spec_model) if vllm else
                                       runtime_defaults(get_device(device), spec_model)["precision"]))
    prec.check(spec_model)
    requests = load_trace(trace, limit=limit)
    memory = None if device_memory is None else parse_bytes(device_memory)
    weights = resolve_weights_memory(spec_model, weights_memory, weights_precision, get_device(device))
    context = max_context if max_context is not None else context_of(spec_model)
    cap = len(requests) if max_preemptions is None else max_preemptions
    config = SchedulerConfig()
    if vllm:  # vLLM's server defaults for the device (simkv run --scheduler vllm)
        from simkv.serving.sched.vllm import batch_defaults

        preset = get_device(device)
        tokens, seqs = batch_defaults(preset.name, preset.memory_bytes)
        config = SchedulerConfig(block_size=16, max_num_batched_tokens=tokens, max_num_seqs=seqs, scheduler="vllm")
    template = ServingSpec(requests, spec_model, prec, scheduler, "paged", config, device=device,
                           device_memory=memory, weights_bytes=weights, max_context=context, max_preemptions=cap,
                           strict_context=True, weights_precision=weights_precision,
                           weights_given=weights_memory is not None)
    # serve()'s own checks, once now rather than once per candidate (a prompt beyond the context: a candidate could
    # never serve every request; weights that fill the device); it also fills in the preset's device memory
    preset = check_spec(template)
    flags = ["--model", model or "custom"] + (["--scheduler", "vllm"] if vllm else [])
    for flag, value in (("--layers", layers), ("--heads", heads), ("--kv-heads", kv_heads), ("--head-dim", head_dim),
                        ("--precision", precision), ("--device", device), ("--device-memory", device_memory
                        if template.device_memory != preset.memory_bytes else None), ("--weights-memory", weights_memory),
                        ("--weights-precision", weights_precision), ("--max-context", max_context)):
        if value is not None:
            flags += [flag, str(value)]
    return ServingTarget(template, str(trace), len(requests), flags)


def _value(cfg, key: str):
    """A tunable key's value in a scheduler configuration (``cache_eviction_max``: 0 when eviction is off)."""
    if key == "cache_eviction_max":
        return cfg.cache_eviction.max if cfg.cache_eviction is not None else 0
    return getattr(cfg, {**PARAMS, **VLLM_PARAMS}[key][0])


def _eviction(base, max_tokens: int):
    """The cache eviction a ``cache_eviction_max`` value stands for: off at 0, else ``base`` (GenAI's defaults when
    None) with that ``max_cache_size``."""
    from simkv.serving.sched.eviction import CacheEviction

    if max_tokens <= 0:
        return None
    return dataclasses.replace(base or CacheEviction(), max=max_tokens)


class ServingEvaluator:
    """Serves a configuration (cached by parameters) and scores it as :class:`simkv.lab.tune.Evaluator` does."""

    def __init__(self, spec, pool):
        self.spec, self.pool = spec, pool
        self.target: ServingTarget = spec.serving
        self.cache: dict = {}

    @staticmethod
    def _key(params: dict) -> tuple:
        from simkv.lab.tune import params_key  # lazily: workers import this module for serve_row alone

        return params_key(params)

    def prefetch(self, configs: list[dict]) -> None:
        """Serve every configuration not yet cached, on the executor's workers (grid and random search)."""
        todo = list({self._key(c): c for c in configs if self._key(c) not in self.cache}.values())
        for i, row in self.pool.map_unordered(serve_row, [self.target.spec(p) for p in todo]):
            self.cache[self._key(todo[i])] = self.score(todo[i], row)

    def __call__(self, params: dict):
        key = self._key(params)
        if key not in self.cache:
            self.cache[key] = self.score(params, serve_row(self.target.spec(params)))
        return self.cache[key]

    def score(self, params: dict, row: dict):
        from simkv.lab.tune import Candidate, constraint_violations
        from simkv.units import format_bytes

        if "error" in row:
            return Candidate(dict(params), {o.name: float("inf") for o in self.spec.objectives}, [row["error"]], [row])
        objectives = {o.name: o.of([row]) for o in self.spec.objectives}
        violations = []
        failed = row["requests_ignored"] + row["requests_rejected"] + row["requests_unfinished"]
        if failed:
            parts = [f"{row[f'requests_{s}']:,} {s.upper()}" for s in ("ignored", "rejected", "unfinished")
                     if row[f"requests_{s}"]]
            violations.append(f"{failed:,} of {row['requests_total']:,} requests not served ({', '.join(parts)})"
                              + (f"; {row['stopped']}" if row["stopped"] else ""))
        if row["peak_allocated_bytes"] > self.target.free_bytes:
            violations.append(f"peak {format_bytes(row['peak_allocated_bytes'])} > "
                              f"{format_bytes(self.target.free_bytes)} free next to the weights")
        return Candidate(dict(params), objectives, violations + constraint_violations(self.spec, [row]), [row])


__all__ = ["DEFAULT_OBJECTIVES", "PARAMS", "SCHEDULERS", "TUNABLE", "VLLM_PARAMS", "VLLM_TUNABLE", "kinds",
           "params_of", "tunable", "ServingEvaluator", "ServingTarget", "build_target",
           "serve_row"]

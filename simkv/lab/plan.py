"""``simkv plan``: the cheapest deployment that serves a trace within latency targets (issue #21).

A *deployment* is a device preset × tensor parallelism ``tp`` × ``replicas`` (``tp · replicas`` devices) × a
router × the paged KV cache's precision, block size and pool × ``max_num_batched_tokens`` (and, for contiguous
serving, the memory policy). Each one is served with :func:`simkv.serving.serve` — the same engine as
``simkv run --trace … --replicas N --tp T`` — on the whole trace at its own arrival times, and judged against
the SLOs (``--slo ttft_p99=2s,tpot_p99=50ms``: a percentile of TTFT, TPOT or end-to-end latency over every
request, as ``simkv run`` reports them). It *meets the SLO* when every request finished, nothing ran out of
memory, and every percentile is at or under its limit.

The search (docs/research/plan-facts.md §6.5; Vidur's configuration search is an exhaustive grid with no
pruning, ``vidur/config_optimizer/config_explorer``): candidates are visited in *waves* of one device count,
1, 2, … ``--max-devices``; within a wave they run in parallel (local processes or a Dask cluster, the sweep
machinery of :mod:`simkv.lab.sweep`). **Pruning rule:** once a device kind has a deployment that meets the
SLO with ``d`` devices, its deployments with more than ``d`` devices are not run — they cost more and are
never the answer (they are listed as pruned). Deployments of ``d`` devices are all run, so the front has the
latency choices at that cost.

**The SLO guard** stops a run that can no longer meet a TTFT or end-to-end percentile (an overloaded
deployment would otherwise simulate a queue that grows all hour): with every request finishing, ``N``
values, the ``q``-th percentile (numpy's linear interpolation) is above ``L`` as soon as ``N − ⌊q/100·(N−1)⌋``
values are; a request that has waited more than ``L`` since it arrived and has no first token (finished, for
end-to-end) will have one above ``L``. The guard counts such requests in every replica after each scheduler
round (a lower bound of the requests above ``L``) and stops the run once there are that many. A stopped run
is rejected as surely as the whole run would have been (tests/test_plan.py checks it against whole runs).

Rows (``--out PATH.parquet``, resumable as ``simkv sweep``): one per deployment run, in candidate order, with
the fixed inputs, the deployment, the outcome and the latencies. Cost is not stored (prices are an input of
the report): cost per hour = devices × ``--price`` (``$/h``), else devices (device-hours per hour).
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simkv.errors import ConfigError

#: Latencies an SLO may name (the request table's columns) and the percentiles it may take.
SLO_METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}
QUANTILES = (50, 90, 95, 99)
#: Units of an SLO limit.
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "min": 60.0}
#: Tensor-parallel sizes tried by default (those a device and the model take).
DEFAULT_TP = (1, 2, 4, 8)
DEFAULT_ROUTERS = ("round-robin", "least-outstanding")
DEFAULT_MNBT = (256, 2048)
MAX_DEVICES = 64
#: Candidates one plan may have.
MAX_CANDIDATES = 20_000
#: Simulated seconds between two checks of the SLO guard in one replica.
GUARD_INTERVAL_S = 1.0


# --- inputs --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slo:
    """One target: the ``quantile``-th percentile of ``metric`` (ttft, tpot, e2e) at most ``limit_s``."""

    metric: str
    quantile: int
    limit_s: float

    @property
    def name(self) -> str:
        return f"{self.metric}_p{self.quantile}"

    def allowed_over(self, n: int) -> int:
        """How many of ``n`` values may exceed the limit with the percentile still within it."""
        return n - math.floor(self.quantile / 100 * (n - 1)) - 1

    def __str__(self) -> str:
        return f"{self.name} <= {_duration(self.limit_s)}"


def _duration(seconds: float) -> str:
    """A limit as given (2 s, 50 ms)."""
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def _latency(seconds: float | None) -> str:
    """A measured latency (0.1 ms below a second)."""
    if seconds is None:
        return "n/a"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s" if seconds < 100 else f"{seconds:,.0f} s"


def parse_slo(text: str) -> tuple[Slo, ...]:
    """``ttft_p99=2s,tpot_p99=50ms`` (metrics ttft, tpot, e2e; percentiles p50/p90/p95/p99; units s, ms, us,
    min) → the SLOs, in the order given."""
    out: dict[str, Slo] = {}
    for part in (p.strip() for p in (text or "").split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        m = re.fullmatch(r"(ttft|tpot|e2e)_p(\d+)", key.strip().lower())
        if not sep or not m:
            raise ConfigError(f"--slo: {part!r} is not METRIC_pQ=LIMIT (METRIC: ttft, tpot or e2e; "
                              f"Q: {', '.join(map(str, QUANTILES))}; e.g. ttft_p99=2s)")
        q = int(m.group(2))
        if q not in QUANTILES:
            raise ConfigError(f"--slo {key}: percentile {q} is not one of {', '.join(map(str, QUANTILES))}")
        v = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(s|ms|us|min)\s*", value.lower())
        if not v:
            raise ConfigError(f"--slo {key}: {value!r} is not a duration with a unit (e.g. 2s, 50ms)")
        limit = float(v.group(1)) * _UNITS[v.group(2)]
        if not limit > 0:
            raise ConfigError(f"--slo {key}: the limit must be positive")
        slo = Slo(m.group(1), q, limit)
        if slo.name in out:
            raise ConfigError(f"--slo names {slo.name} twice")
        out[slo.name] = slo
    if not out:
        raise ConfigError("--slo needs at least one target, e.g. ttft_p99=2s,tpot_p99=50ms")
    return tuple(out.values())


def parse_prices(items: list[str] | None, devices: list[str]) -> dict[str, float] | None:
    """``DEVICE=$/h`` for every device of the plan, or None (cost in device-hours)."""
    if not items:
        return None
    prices: dict[str, float] = {}
    for item in (p.strip() for text in items for p in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        try:
            price = float(value.strip().lstrip("$"))
        except ValueError:
            price = -1.0
        if not sep or price <= 0 or not math.isfinite(price):
            raise ConfigError(f"--price expects DEVICE=DOLLARS_PER_HOUR (a positive number), got {item!r}")
        if name.strip() not in devices:
            raise ConfigError(f"--price {name.strip()}: not one of the plan's devices ({', '.join(devices)})")
        prices[name.strip()] = price
    missing = [d for d in devices if d not in prices]
    if missing:
        raise ConfigError(f"--price gives no price for {', '.join(missing)}: price every device or none "
                          "(then cost is in device-hours)")
    return prices


def _int_list(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag} expects whole numbers separated by commas, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ConfigError(f"{flag} expects positive whole numbers, got {text!r}")
    return tuple(dict.fromkeys(values))


def _str_list(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    return values or None


@dataclass
class Target:
    """What every deployment serves and how it is judged: the fixed part of each point (plain values)."""

    workload: dict  # trace + limit, or the synthetic options (simkv.serving.requests.synthetic)
    model: str | None
    slo: tuple[Slo, ...]
    kv_manager: str = "genai"
    prefix_caching: bool = False
    max_num_seqs: int = 256
    memory: str = "paged"
    max_context: int | None = None
    dynamic_split_fuse: bool = True
    scheduler: str = "auto"  # auto: each device's runtime's (device_defaults); continuous (GenAI's) or vllm for all
    #: GenAI's cache eviction in every GenAI-scheduled deployment (``--cache-eviction``'s form,
    #: simkv.serving.sched.eviction), or None.
    cache_eviction: str | None = None

    def key(self) -> dict:
        """The fixed inputs as stored with every row (and hashed into its point id; the cache eviction only when
        set, so the points of plans without it keep their ids)."""
        out = {"workload": json.dumps(self.workload, sort_keys=True), "model": self.model or "custom",
               "slo": ",".join(f"{s.name}={s.limit_s!r}" for s in self.slo), "kv_manager": self.kv_manager,
               "prefix_caching": self.prefix_caching, "max_num_seqs": self.max_num_seqs, "memory": self.memory,
               "max_context": self.max_context, "dynamic_split_fuse": self.dynamic_split_fuse,
               "scheduler": self.scheduler}
        if self.cache_eviction is not None:
            out["cache_eviction"] = self.cache_eviction
        return out


@dataclass
class Space:
    """The values searched (None: each device's default, :func:`simkv.serving.run.runtime_defaults`)."""

    devices: tuple[str, ...]
    max_devices: int = 8
    tp: tuple[int, ...] = DEFAULT_TP
    routers: tuple[str, ...] = DEFAULT_ROUTERS
    precisions: tuple[str, ...] | None = None
    block_sizes: tuple[int, ...] | None = None
    max_num_batched_tokens: tuple[int, ...] = DEFAULT_MNBT
    pools: tuple[str, ...] | None = None
    policies: tuple[str, ...] = ("openvino-cpu",)


#: ``simkv plan --serving-scheduler``: each device's runtime's scheduler, or one for every device.
PLAN_SCHEDULERS = ("auto", "continuous", "vllm")


# --- candidates ----------------------------------------------------------------------------------


def candidates(space: Space, model, memory: str = "paged", scheduler: str = "auto") -> tuple[list[dict], list[str]]:
    """Every deployment of the space, in the order the search visits them (device count, then device, tp,
    replicas, router, precision, block size, pool, batched tokens, policy), and a line for each device × tp
    left out (a runtime without tensor parallelism, a model ``tp`` does not split). Contiguous memory has no
    blocks or pool: one value each (``block_size`` 0, ``pool`` "-"), and GenAI's scheduler. Each deployment
    names its scheduler: ``scheduler`` for every device, or (``auto``) the device's runtime's; vLLM's has no
    dynamic pool, so a ``dynamic`` pool under it is left out with a line."""
    from simkv.cost import get_device
    from simkv.models import tp_shard
    from simkv.serving.router import ROUTERS
    from simkv.serving.run import runtime_defaults

    if scheduler not in PLAN_SCHEDULERS:
        raise ConfigError(f"--serving-scheduler: unknown {scheduler!r}; choose {', '.join(PLAN_SCHEDULERS)}")
    if not 1 <= space.max_devices <= MAX_DEVICES:
        raise ConfigError(f"--max-devices must be in 1..{MAX_DEVICES}, got {space.max_devices}")
    for r in space.routers:
        if r not in ROUTERS:
            raise ConfigError(f"--routers: unknown router {r!r}; choose {', '.join(ROUTERS)}")
    for name in space.precisions or ():  # an unknown or refused precision: one line, before any run
        from simkv.precision import get_precision

        get_precision(name).check(model)
    for pool in space.pools or ():
        _pool_fraction(pool)
    skipped: list[str] = []
    kinds = []
    for name in space.devices:
        device = get_device(name)
        tps = []
        for tp in space.tp:
            if tp > space.max_devices:
                continue
            try:
                device.check_tp(tp)
                tp_shard(model, tp)
            except ConfigError as err:
                if tp > 1:
                    skipped.append(f"{name} tp {tp}: {err}")
                continue
            tps.append(tp)
        default = runtime_defaults(device, model)
        if scheduler != "auto":
            default["scheduler"] = scheduler
        if memory == "contiguous":
            default.update(block_size=0, pool="-", scheduler="continuous")
        kinds.append((name, device, tps, default))
    out: list[dict] = []
    for count in range(1, space.max_devices + 1):
        for name, device, tps, default in kinds:
            for tp in tps:
                if count % tp:
                    continue
                replicas = count // tp
                for router in (space.routers if replicas > 1 else ("-",)):
                    for precision in space.precisions or (default["precision"],):
                        for block in (space.block_sizes if memory == "paged" else None) or (default["block_size"],):
                            for pool in (space.pools if memory == "paged" else None) or (default["pool"],):
                                if pool == "dynamic" and default["scheduler"] == "vllm":
                                    line = f"{name} pool dynamic: vLLM's pool is fixed (gpu_memory_utilization)"
                                    if line not in skipped:
                                        skipped.append(line)
                                    continue
                                for mnbt in space.max_num_batched_tokens:
                                    for policy in space.policies:
                                        out.append({"device": name, "devices": count, "tp": tp, "replicas": replicas,
                                                    "router": router, "precision": precision, "block_size": block,
                                                    "pool": pool, "max_num_batched_tokens": mnbt, "policy": policy,
                                                    "scheduler": default["scheduler"]})
                                        if len(out) > MAX_CANDIDATES:
                                            raise ConfigError(f"more than {MAX_CANDIDATES:,} deployments to search: "
                                                              "narrow the lists or --max-devices")
    return out, skipped


def _pool_fraction(pool: str) -> float | None:
    """"dynamic" → None; a fraction of the device (vLLM's gpu_memory_utilization) → that number."""
    if pool == "dynamic":
        return None
    try:
        value = float(pool)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise ConfigError(f"--pools: {pool!r} is neither dynamic nor a fraction of the device in (0, 1]")
    return value


# --- one deployment ------------------------------------------------------------------------------


def _slo_of_key(text: str) -> tuple[Slo, ...]:
    """The SLOs as :meth:`Target.key` stores them (``ttft_p99=2.0,tpot_p99=0.05``: limits in seconds)."""
    out = []
    for part in text.split(","):
        name, _, limit = part.partition("=")
        metric, _, q = name.rpartition("_p")
        out.append(Slo(metric, int(q), float(limit)))
    return tuple(out)


class SloMissed(Exception):
    """Raised by the guard inside a run: the SLO can no longer be met."""


class Guard:
    """The SLO guard (module docstring), watching every replica of one run."""

    def __init__(self, slo: tuple[Slo, ...], total: int) -> None:
        self.checks = [(s, s.allowed_over(total)) for s in slo if s.metric in ("ttft", "e2e")]
        self.late: dict[tuple[int, str], int] = {}
        self.next: dict[int, float] = {}

    def __call__(self, replica: int, eng) -> None:
        t = eng.t
        if not self.checks or t < self.next.get(replica, 0.0):
            return
        self.next[replica] = t + GUARD_INTERVAL_S
        live = getattr(eng, "live", None)
        if live is None:  # contiguous serving: its queue, then the running requests
            live = list(eng.waiting) + list(eng.running)
        for slo, allowed in self.checks:
            since = t - slo.limit_s
            ttft = slo.metric == "ttft"
            late = 0
            for g in live:  # in arrival order: stop at the first that has not waited long enough
                if g.added_s >= since:
                    break
                if not ttft or g.first_token_s is None:
                    late += 1
            key = (replica, slo.name)
            if late > self.late.get(key, 0):
                self.late[key] = late
                total = sum(v for (_, name), v in self.late.items() if name == slo.name)
                if total > allowed:
                    what = "a first token" if ttft else "the end"
                    raise SloMissed(f"{slo.name} > {_duration(slo.limit_s)}: {total:,} requests waited longer for "
                                    f"{what} (stopped at {t:,.0f} s simulated; at most {allowed:,} may)")


@functools.lru_cache(maxsize=4)
def _requests(workload_json: str, model_name: str, max_context):
    from simkv.hfconfig import resolve_model
    from simkv.serving.requests import load_trace, synthetic
    from simkv.serving.run import context_of

    w = json.loads(workload_json)
    if "trace" in w:
        reqs = tuple(load_trace(w["trace"], limit=w.get("limit")))
    else:
        model = resolve_model(model_name)
        context = max_context if max_context is not None else context_of(model)
        reqs = tuple(synthetic(w["requests"], w["rate"], w["prompt_dist"], w["output_dist"], arrivals=w["arrivals"],
                               seed=w["seed"], max_prompt=context - 1 if context else None))
    if w.get("steady") is not None:
        reqs = steady(reqs, w["steady"])
    return reqs


#: The window of the busiest stretch of a trace (:func:`traffic`): a minute holds a burst and the queue it builds,
#: and is short against the hour a trace covers.
PEAK_WINDOW_S = 60.0


def traffic(requests) -> dict | None:
    """The arrival rates of a trace: the mean (requests over the span from the first arrival to the last) and the
    peak (the most requests that arrive in any window of :data:`PEAK_WINDOW_S` seconds, per second: each window
    starts at an arrival). None for arrivals in steps or fewer than two requests."""
    times = np.array([r.arrival_s for r in requests if r.arrival_s is not None], dtype=float)
    if len(times) < 2 or len(times) != len(requests):
        return None
    times.sort()
    span = float(times[-1] - times[0])
    if span <= 0:
        return None
    window = min(PEAK_WINDOW_S, span)
    counts = np.searchsorted(times, times + window, side="left") - np.arange(len(times))
    at = int(counts.argmax())
    return {"requests": len(times), "span_s": span, "mean_rate": (len(times) - 1) / span, "window_s": window,
            "peak_rate": int(counts[at]) / window, "peak_at_s": float(times[at])}


def steady(requests, rate: float) -> tuple:
    """The same requests (lengths, order) arriving one every ``1 / rate`` seconds: the traffic a steady-state
    sizing assumes (AIConfigurator sizes a deployment for a request rate, not for a trace's bursts)."""
    from dataclasses import replace

    return tuple(replace(r, arrival_s=i / rate, arrival_step=None) for i, r in enumerate(requests))


def _device_share(point: dict):
    """A point's model, device, weights bytes per device and KV pool in GiB (0: the dynamic pool)."""
    from simkv.cost import GIB, get_device
    from simkv.hfconfig import resolve_model
    from simkv.models import tp_shard
    from simkv.scenario import resolve_weights_memory

    model = resolve_model(point["model"])
    device = get_device(point["device"])
    weights = resolve_weights_memory(tp_shard(model, point["tp"]), None, None, device)
    fraction = _pool_fraction(point["pool"]) if point["memory"] == "paged" else None
    cache = 0.0
    if fraction is not None:
        room = fraction * device.memory_bytes - weights
        if room <= 0:
            raise ConfigError(f"no room for the KV cache: {fraction:g} of the device is "
                              f"{fraction * device.memory_bytes / GIB:.2f} GiB, the weights alone {weights / GIB:.2f} GiB")
        cache = room / GIB
    return model, device, weights, cache


def spec_of(point: dict):
    """The :class:`~simkv.serving.ServingSpec` of a point (its fixed inputs and its deployment)."""
    from policies import get_policy
    from simkv.precision import get_precision
    from simkv.serving import SchedulerConfig, ServingSpec
    from simkv.serving.sched.eviction import parse_cache_eviction

    model, _, weights, cache = _device_share(point)
    precision = get_precision(point["precision"])
    precision.check(model)
    if point["scheduler"] == "vllm":  # vLLM sizes its pool itself (num_gpu_blocks); no GenAI-only options
        cfg = SchedulerConfig(block_size=point["block_size"], max_num_batched_tokens=point["max_num_batched_tokens"],
                              max_num_seqs=point["max_num_seqs"], enable_prefix_caching=point["prefix_caching"],
                              scheduler="vllm", gpu_memory_utilization=_pool_fraction(point["pool"]))
    else:
        cfg = SchedulerConfig(block_size=point["block_size"] or SchedulerConfig.block_size, cache_size=cache,
                              max_num_batched_tokens=point["max_num_batched_tokens"],
                              max_num_seqs=point["max_num_seqs"], enable_prefix_caching=point["prefix_caching"],
                              kv_manager=point["kv_manager"], dynamic_split_fuse=point["dynamic_split_fuse"],
                              cache_eviction=parse_cache_eviction(point.get("cache_eviction")))
    requests = list(_requests(point["workload"], point["model"], point["max_context"]))
    policy = get_policy(point["policy"]) if point["memory"] == "contiguous" else "openvino-cpu"
    return ServingSpec(requests, model, precision, point["scheduler"], point["memory"], cfg, device=point["device"],
                       weights_bytes=weights, policy=policy, max_context=point["max_context"], strict_context=True,
                       tp=point["tp"],
                       replicas=point["replicas"], router=point["router"] if point["replicas"] > 1 else "round-robin",
                       max_preemptions=len(requests), concurrency=json.loads(point["workload"]).get("concurrency"))


def run_point(point: dict) -> dict:
    """Serve one deployment and judge it; its row (module-level: worker processes and Dask run it)."""
    from simkv.lab.sweep import point_id
    from simkv.serving import serve

    slo = _slo_of_key(point["slo"])
    row = {"point_id": point_id(point), **point}
    try:
        spec = spec_of(point)
        result = serve(spec, watch=Guard(slo, len(spec.requests)))
    except SloMissed as err:
        return _row(row, "slo-guard", str(err))
    except ConfigError as err:  # weights that fill the device, a pool with no room: this deployment cannot run
        return _row(row, "oom" if "fill" in str(err) or "room" in str(err) or "fit" in str(err) else "error", str(err))
    m = result.metrics
    table = result.request_table
    row["requests_total"], row["requests_finished"] = m["requests_total"], m["requests_finished"]
    row["preemptions"], row["steps"], row["sim_time_s"] = m["preemptions"], m["steps"], m["sim_time_s"]
    reps = result.replicas if spec.replicas > 1 else [result]
    row["peak_pool_bytes"] = max(r.metrics["peak_pool_bytes"] for r in reps)
    row["weights_bytes"], row["device_memory_bytes"] = spec.weights_bytes, spec.device_memory
    for metric, column in SLO_METRICS.items():
        values = table[column].astype(float)
        values = values[~np.isnan(values)]
        for q in QUANTILES:
            row[f"{metric}_p{q}_s"] = float(np.percentile(values, q)) if len(values) else None
    oom = next((r for r in reps if r.oom), None)
    if oom is not None:
        return _row(row, "oom", oom.stopped)
    if m["requests_finished"] < m["requests_total"]:
        failed = m["requests_total"] - m["requests_finished"]
        return _row(row, "unfinished", f"{failed:,} of {m['requests_total']:,} requests not served"
                    + (f" ({result.stopped})" if result.stopped else ""))
    missed = [f"{s.name} {_latency(row[s.name + '_s'])} > {_duration(s.limit_s)}" for s in slo
              if row[s.name + "_s"] is None or row[s.name + "_s"] > s.limit_s]
    return _row(row, "slo" if missed else "ok", "; ".join(missed))


#: What a run adds to its point, in this order (None where a run stopped before it could say).
OUTCOME = ("requests_total", "requests_finished", "preemptions", "steps", "sim_time_s", "peak_pool_bytes",
           "weights_bytes", "device_memory_bytes", *(f"{m}_p{q}_s" for m in SLO_METRICS for q in QUANTILES),
           "status", "meets_slo", "reason")


def _row(row: dict, status: str, reason: str) -> dict:
    """The stored row: the point, then every :data:`OUTCOME` column (a fixed schema, whatever the outcome)."""
    row["status"], row["meets_slo"], row["reason"] = status, status == "ok", reason or ""
    return {**{k: v for k, v in row.items() if k not in OUTCOME}, **{k: row.get(k) for k in OUTCOME}}


# --- the search ----------------------------------------------------------------------------------


@dataclass
class PlanResult:
    target: Target
    space: Space
    prices: dict[str, float] | None
    rows: list[dict]  # every deployment run, in candidate order
    pruned: list[tuple[dict, str]]  # (deployment, why it was not run)
    skipped: list[str]  # device × tp left out
    computed: int = 0
    stored: int = 0
    fronts: dict[str, list[dict]] = field(default_factory=dict)
    #: The trace's arrival rates (:func:`traffic`; None for a closed loop or arrivals in steps) and, with
    #: ``simkv plan --traffic-report``, the cheapest deployment meeting the SLO under steady traffic at the mean and
    #: at the peak rate ("steady_mean", "steady_peak": a recommended row or None).
    traffic: dict | None = None

    def cost(self, row: dict) -> float:
        return row["devices"] * (self.prices[row["device"]] if self.prices else 1.0)

    @property
    def unit(self) -> str:
        return "$/h" if self.prices else "device-hours per hour"

    @property
    def recommended(self) -> dict | None:
        ok = [r for r in self.rows if r["meets_slo"]]
        if not ok:
            return None
        slo = self.target.slo
        return min(ok, key=lambda r: (self.cost(r), max(r[s.name + "_s"] / s.limit_s for s in slo)))

    def front(self, metric: str) -> list[dict]:
        """The Pareto front of cost against ``metric`` (e.g. ttft_p99) over the deployments that served every
        request (met the SLO or missed it by latency): none is both cheaper and faster than a point on it."""
        done = sorted((r for r in self.rows if r["status"] in ("ok", "slo") and r[metric + "_s"] is not None),
                      key=lambda r: (self.cost(r), r[metric + "_s"]))
        out, best = [], math.inf
        for r in done:
            if r[metric + "_s"] < best:
                out.append(r)
                best = r[metric + "_s"]
        return out


def run_plan(target: Target, space: Space, prices: dict[str, float] | None = None, *, out: str | Path | None = None,
             workers: int | None = None, scheduler: str | None = None, progress: bool = False) -> PlanResult:
    """Search ``space`` for ``target`` (module docstring): waves of one device count, pruned per device kind."""
    from simkv.hfconfig import resolve_model
    from simkv.lab.sweep import executor, point_id, read_rows, write_rows

    model = resolve_model(target.model)
    deployments, skipped = candidates(space, model, target.memory, target.scheduler)
    if target.workload.get("concurrency") is not None:  # a closed loop's clients drive one engine (closed_loop.py)
        many = sorted({(d["device"], d["replicas"]) for d in deployments if d["replicas"] > 1})
        deployments = [d for d in deployments if d["replicas"] == 1]
        if many:
            skipped.append(f"{many[0][0]} tp 1: {len(many)} replica counts over 1: a closed loop of clients drives "
                           "one engine (--concurrency)")
    if not deployments:
        raise ConfigError("no deployment to search: " + ("; ".join(skipped) if skipped else "no device given"))
    fixed = target.key()
    points = [dict(fixed, **d) for d in deployments]
    ids = [point_id(p) for p in points]
    # a bad input fails before any work: the requests, a prompt at or above the context among them (every
    # deployment would refuse it: simkv run's --strict-context), precisions and routers (candidates)
    from simkv.serving.requests import check_workload
    from simkv.serving.run import context_of

    check_workload(list(_requests(fixed["workload"], fixed["model"], fixed["max_context"])),
                   fixed["max_context"] if fixed["max_context"] is not None else context_of(model))
    stored_rows = read_rows(out) if out else []
    known = set(ids)
    stored = {r["point_id"]: r for r in stored_rows if r.get("point_id") in known}
    others = [r for r in stored_rows if r.get("point_id") not in known]
    done: dict[int, dict] = {}
    pruned: list[tuple[dict, str]] = []
    best: dict[str, dict] = {}  # device -> the first deployment of it that met the SLO (fewest devices)
    computed = reused = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(points), desc="plan", unit="deployment", disable=None)

    def save():
        if out:
            write_rows(out, others + [done[i] for i in sorted(done)])

    try:
        with executor(workers, scheduler) as ex:
            for count in range(1, space.max_devices + 1):
                wave = [i for i, p in enumerate(points) if p["devices"] == count]
                todo = []
                for i in wave:
                    kind = points[i]["device"]
                    if kind in best:
                        b = best[kind]
                        pruned.append((deployments[i], f"pruned: {kind} meets the SLO with {b['devices']} "
                                                       f"device{'s' if b['devices'] > 1 else ''} ({describe(b)})"))
                    elif ids[i] in stored:
                        done[i] = stored[ids[i]]
                        reused += 1
                    else:
                        todo.append(i)
                if bar:
                    bar.update(len(wave) - len(todo))
                for j, row in ex.map_unordered(run_point, [points[i] for i in todo]):
                    done[todo[j]] = row
                    computed += 1
                    if bar:
                        bar.update()
                save()
                for i in wave:
                    if i in done and done[i]["meets_slo"] and points[i]["device"] not in best:
                        best[points[i]["device"]] = done[i]
    finally:
        if bar:
            bar.close()
    result = PlanResult(target, space, prices, [done[i] for i in sorted(done)], pruned, skipped, computed, reused)
    result.fronts = {s.name: result.front(s.name) for s in target.slo}
    if target.workload.get("concurrency") is None and target.workload.get("steady") is None:
        result.traffic = traffic(_requests(fixed["workload"], fixed["model"], fixed["max_context"]))
    return result


def traffic_report(result: PlanResult, *, workers: int | None = None, scheduler: str | None = None) -> None:
    """Size the same search for steady traffic at the trace's mean and at its peak rate (the same requests, evenly
    spaced: :func:`steady`), and keep each's cheapest deployment that meets the SLO in ``result.traffic``: what a
    steady-state sizing picks beside what the trace's bursts need."""
    from dataclasses import replace

    if result.traffic is None:
        raise ConfigError("the traffic report needs a trace with arrivals in seconds (not a closed loop)")
    for key, rate in (("steady_mean", result.traffic["mean_rate"]), ("steady_peak", result.traffic["peak_rate"])):
        target = replace(result.target, workload={**result.target.workload, "steady": rate})
        result.traffic[key] = run_plan(target, result.space, result.prices, workers=workers,
                                       scheduler=scheduler).recommended


# --- reporting -----------------------------------------------------------------------------------


def describe(row: dict) -> str:
    """A deployment in a few words."""
    parts = [f"{row['devices']} x {row['device']}", SCHEDULER_WORDS[row.get("scheduler", "continuous")],
             f"tp {row['tp']}",
             f"{row['replicas']} replica{'s' if row['replicas'] > 1 else ''}"]
    if row["replicas"] > 1:
        parts.append(row["router"])
    parts.append(f"{row['precision']} KV")
    if row.get("memory") == "contiguous":
        parts.append(f"contiguous, policy {row['policy']}")
    else:
        parts += [f"block {row['block_size']}",
                  "dynamic pool" if row["pool"] == "dynamic" else f"pool {row['pool']} of memory",
                  f"{row['max_num_batched_tokens']:,} batched tokens"]
    return ", ".join(parts)


#: How a deployment's scheduler reads in the report.
SCHEDULER_WORDS = {"continuous": "GenAI scheduler", "vllm": "vLLM scheduler"}


def command(row: dict) -> str:
    """The ``simkv run`` line serving this deployment's requests (the same run the plan made)."""
    import shlex

    w = json.loads(row["workload"])
    words = ["simkv", "run"]
    if "trace" in w:
        words += ["--trace", w["trace"]] + (["--limit", str(w["limit"])] if w.get("limit") else [])
    else:
        words += ["--synthetic", "--requests", str(w["requests"]), "--rate", repr(float(w["rate"])), "--arrivals",
                  w["arrivals"], "--prompt-dist", w["prompt_dist"], "--output-dist", w["output_dist"], "--seed",
                  str(w["seed"])]
    if w.get("concurrency") is not None:
        words += ["--concurrency", str(w["concurrency"])]
    vllm = row.get("scheduler") == "vllm"
    words += ["--model", row["model"], "--device", row["device"], "--precision", row["precision"]]
    if vllm:
        words += ["--scheduler", "vllm"]
    if row["memory"] == "paged":
        words += ["--block-size", str(row["block_size"])]
    if row["memory"] == "paged":  # contiguous memory takes each prompt whole
        words += ["--max-num-batched-tokens", str(row["max_num_batched_tokens"])]
    if vllm:
        words += ["--gpu-memory-utilization", row["pool"]]
    elif row["memory"] == "paged" and row["pool"] != "dynamic":
        words += ["--cache-size", _cache_gib(row)]
    if row["tp"] > 1:
        words += ["--tp", str(row["tp"])]
    if row["replicas"] > 1:
        words += ["--replicas", str(row["replicas"]), "--router", row["router"]]
    if row["max_num_seqs"] != 256 or vllm:  # simkv run's vLLM default is the device's, not 256
        words += ["--max-num-seqs", str(row["max_num_seqs"])]
    if not row["dynamic_split_fuse"] and not vllm:
        words.append("--no-dynamic-split-fuse")
    if row["prefix_caching"]:
        words.append("--prefix-caching")
    if row["kv_manager"] != "genai" and not vllm:
        words += ["--kv-manager", row["kv_manager"]]
    if row.get("cache_eviction") and not vllm:
        words += ["--cache-eviction", row["cache_eviction"]]
    if row["memory"] != "paged":
        words += ["--memory", row["memory"], "--policy", row["policy"]]
    if row["max_context"] is not None:
        words += ["--max-context", str(row["max_context"])]
    return shlex.join(words)


def _cache_gib(row: dict) -> str:
    """The deployment's pool as ``--cache-size`` GiB: the fewest decimals that give the pool the plan ran (the same
    blocks, and linear-attention state blocks, as GenAI sizes them from the exact fraction of the device)."""
    from dataclasses import replace

    from simkv.precision import get_precision
    from simkv.serving import SchedulerConfig
    from simkv.serving.engine.core import PagedServing
    from simkv.serving.kv.groups import paged_kv

    model, device, weights, exact = _device_share(row)
    kv = paged_kv(model, get_precision(row["precision"]), row["block_size"] or SchedulerConfig.block_size,
                  row["kv_manager"], prefix_caching=row["prefix_caching"])
    cfg = SchedulerConfig(cache_size=exact, max_num_seqs=row["max_num_seqs"], enable_prefix_caching=row["prefix_caching"])
    budget = device.memory_bytes - weights
    pool = PagedServing._pool_sizes(cfg, kv, budget)
    for digits in range(1, 17):
        text = f"{exact:.{digits}f}"
        try:
            if PagedServing._pool_sizes(replace(cfg, cache_size=float(text)), kv, budget) == pool:
                return text
        except ConfigError:  # rounded up past the device: more decimals
            continue
    return repr(exact)


def summary(result: PlanResult) -> dict:
    """``simkv plan --json``: the recommendation, the fronts, every deployment run and every one pruned."""
    def brief(row):
        keys = ("device", "devices", "tp", "replicas", "router", "precision", "block_size", "pool",
                "max_num_batched_tokens")
        out = {k: row[k] for k in keys}
        out["scheduler"] = row.get("scheduler", "continuous")
        if row.get("memory") == "contiguous":
            out["policy"] = row["policy"]
        return out

    def full(row):
        out = brief(row)
        out["cost_per_hour"] = result.cost(row)
        out["status"], out["meets_slo"], out["reason"] = row["status"], row["meets_slo"], row["reason"]
        for s in result.target.slo:
            out[s.name + "_s"] = row.get(s.name + "_s")
        return out

    rec = result.recommended
    return {
        "slo": {s.name: s.limit_s for s in result.target.slo},
        "cost_unit": result.unit,
        "recommended": dict(full(rec), command=command(rec)) if rec else None,
        "fronts": {name: [full(r) for r in rows] for name, rows in result.fronts.items()},
        "deployments": [full(r) for r in result.rows],
        "pruned": [dict(brief(d), reason=why) for d, why in result.pruned],
        "skipped": result.skipped,
        "run": result.computed, "from_out": result.stored,
        "traffic": _traffic_json(result, full),
    }


def _traffic_json(result: PlanResult, full) -> dict | None:
    if result.traffic is None:
        return None
    out = {k: v for k, v in result.traffic.items() if not k.startswith("steady_")}
    for key in ("steady_mean", "steady_peak"):
        if key in result.traffic:
            row = result.traffic[key]
            out[key] = full(row) if row else None
    return out


def render(result: PlanResult, max_rejected: int = 12) -> str:
    """The text report: the recommendation, the fronts, why deployments were rejected."""
    t = result.target
    w = json.loads(t.key()["workload"])
    if w.get("concurrency") is not None:
        source = (w["trace"] if "trace" in w else f"{w['requests']:,} synthetic requests") + \
            f", a closed loop of {w['concurrency']} clients"
    else:
        source = w["trace"] if "trace" in w else f"{w['requests']:,} synthetic requests at {w['rate']:g}/s"
    lines = [f"simkv plan: {t.model or 'custom'} on {source}; SLO {', '.join(map(str, t.slo))}; "
             f"cost in {result.unit}",
             f"  {'searched':<14}{len(result.rows) + len(result.pruned):,} deployments of {', '.join(result.space.devices)} "
             f"(at most {result.space.max_devices} device{'s' if result.space.max_devices > 1 else ''}): {len(result.rows):,} served "
             f"({result.computed:,} run now, {result.stored:,} from the output file), {len(result.pruned):,} pruned"]
    by_scheduler: dict[str, list[str]] = {}
    for d in [r for r in result.rows] + [d for d, _ in result.pruned]:
        names = by_scheduler.setdefault(SCHEDULER_WORDS[d.get("scheduler", "continuous")], [])
        if d["device"] not in names:
            names.append(d["device"])
    lines.append(f"  {'schedulers':<14}" + "; ".join(f"{w} on {', '.join(names)}" for w, names in by_scheduler.items()))
    tr = result.traffic
    if tr is not None:
        lines.append(f"  {'traffic':<14}{tr['requests']:,} requests over {_duration(tr['span_s'])}: mean "
                     f"{tr['mean_rate']:.3g}/s, peak {tr['peak_rate']:.3g}/s (the busiest {_duration(tr['window_s'])}, "
                     f"from {_duration(tr['peak_at_s'])}), {tr['peak_rate'] / tr['mean_rate']:.2f} x the mean")
        for key, what in (("steady_mean", "steady at the mean rate"), ("steady_peak", "steady at the peak rate")):
            if key in tr:
                row = tr[key]
                lines.append(f"  {'':<14}{what}: " + (f"{describe(row)}, cost {_money(result.cost(row), result.prices)}"
                                                       if row else "no deployment searched meets the SLO"))
    rec = result.recommended
    if rec is None:
        lines.append(f"  {'RECOMMENDED':<14}none: no deployment searched meets the SLO (widen --devices or "
                     "--max-devices, or relax --slo)")
    else:
        got = ", ".join(f"{s.name} {_latency(rec[s.name + '_s'])}" for s in t.slo)
        lines += [f"  {'RECOMMENDED':<14}{describe(rec)}",
                  f"  {'':<14}cost {_money(result.cost(rec), result.prices)}; {got}",
                  f"  {'reproduce':<14}{command(rec)}"]
    for name, rows in result.fronts.items():
        lines.append(f"  Pareto front, cost vs {name} (deployments that served every request):")
        for r in rows:
            mark = "meets SLO" if r["meets_slo"] else "misses: " + r["reason"]
            lines.append(f"    {_money(result.cost(r), result.prices):>10}  {_latency(r[name + '_s']):>10}  "
                         f"{describe(r)}  [{mark}]")
    rejected = [r for r in result.rows if not r["meets_slo"]]
    if rejected:
        lines.append(f"  Rejected ({len(rejected):,}; each with its reason in --json and --out):")
        slo = result.target.slo
        near = sorted((r for r in rejected if r["status"] == "slo"),
                      key=lambda r: (result.cost(r), max(r[s.name + "_s"] / s.limit_s for s in slo)))
        for r in near[:max_rejected]:
            lines.append(f"    {describe(r)}: {_clip(r['reason'])}")
        if len(near) > max_rejected:
            lines.append(f"    ... {len(near) - max_rejected:,} more served every request but missed the SLO")
        for status, what in STATUS_WORDS.items():
            some = [r for r in rejected if r["status"] == status]
            if some:
                lines.append(f"    {len(some):,} {what}, e.g. {describe(some[0])}: {_clip(some[0]['reason'], 200)}")
    by_device: dict[str, list[str]] = {}
    for line in result.skipped:
        if " tp " not in line:  # a pool the scheduler cannot have
            lines.append(f"  not searched: {_clip(line, 200)}")
            continue
        device, _, rest = line.partition(" tp ")
        by_device.setdefault(device, []).append(rest)
    for device, items in by_device.items():
        tps = ", ".join(i.split(":")[0] for i in items)
        why = items[0].split(": ", 1)[1] if ": " in items[0] else items[0]
        lines.append(f"  not searched: {device} at tp {tps}: {_clip(why.split(': ', 1)[-1], 200)}")
    return "\n".join(lines)


#: Rejection outcomes other than a latency miss, as the report counts them.
STATUS_WORDS = {"slo-guard": "stopped by the SLO guard (too many requests already late)",
                "oom": "out of memory (the weights, or the pool next to them, do not fit)",
                "unfinished": "left requests unserved", "error": "could not run"}


def _money(cost: float, prices) -> str:
    return f"${cost:,.2f}/h" if prices else f"{cost:g} dev"


def _clip(text: str, width: int = 160) -> str:
    """``text`` in at most ``width`` characters, cut between words (the reasons in full are in --json and --out)."""
    if len(text) <= width:
        return text
    return text[: width - 1].rsplit(" ", 1)[0].rstrip(",;:(") + " …"


def write_json(result: PlanResult, stream=None) -> None:
    json.dump(summary(result), stream or sys.stdout, indent=2)
    (stream or sys.stdout).write("\n")


__all__ = ["Guard", "PlanResult", "Slo", "Space", "Target", "candidates", "command", "describe", "parse_prices",
           "parse_slo", "render", "run_plan", "run_point", "summary"]

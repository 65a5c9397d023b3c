"""One library call serves the CLI, the dashboard, the experiments and ``simkv validate --paged``:
:func:`serve` (a :class:`ServingSpec` → a :class:`ServingResult`)."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from simkv.cost import DEFAULT_DEVICE  # noqa: F401 (re-exported: serving's default device is every command's)
from simkv.errors import ConfigError
from simkv.ledger import Ledger
from simkv.scenario import check_weights_fit
from simkv.serving.kv.groups import KV_MANAGERS
from simkv.serving.requests import Request, check_workload, over_context
from simkv.serving.sched.config import SchedulerConfig
from simkv.serving.sched.group import FINISHED, IGNORED, REJECTED, UNFINISHED, Group

SCHEDULERS = ("sequential", "static", "continuous", "vllm")
MEMORIES = ("contiguous", "paged")
ON_OOM = ("wait", "preempt", "reject")

#: Request table columns (``--requests``), as the issue's contract names them.
REQUEST_COLUMNS = ("id", "arrival_s", "prompt", "max_new_tokens", "generated", "status", "ttft_s", "tpot_s", "e2e_s",
                   "preemptions", "prefix_hit_tokens")

#: Context lengths (max_position_embeddings of each preset's config.json).
CONTEXT = {"gpt2": 1024, "tinyllama-1.1b": 2048, "qwen2.5-0.5b": 32768, "phi-3.5-mini": 131072, "llama-2-7b": 4096,
           "llama-2-13b": 4096, "llama-3-8b": 8192, "mistral-7b": 32768, "qwen2.5-7b": 32768, "llama-3-70b": 8192}


def context_of(model) -> int | None:
    """The context a model takes by default: :data:`CONTEXT` for the built-in presets, else the
    ``max_position_embeddings`` of its config (simkv.hfconfig); None: no limit (a custom shape)."""
    return CONTEXT.get(model.name) or model.context or None


#: vLLM's ``gpu_memory_utilization`` default (``CacheConfig``, 0.9; plan-facts §2.1): the fixed pool of a vLLM device.
VLLM_UTILIZATION = 0.9


def runtime_defaults(device, model) -> dict:
    """What a device's usual runtime uses when nothing is named (``Device.runtime``): the KV precision for ``simkv
    run``'s paged serving, ``simkv cost`` and every deployment ``simkv plan`` searches alike, and for ``plan`` the
    rest: vLLM (h100-sxm, a100-80gb) schedules with vLLM V1's scheduler (``--scheduler vllm``), keeps KV in the
    model's dtype (``kv_cache_dtype="auto"``: :func:`simkv.models.vllm_kv_precision`, the checkpoint's fp8 KV where it
    has one), blocks of 16 (``DEFAULT_BLOCK_SIZE``) in a fixed pool
    sized from ``gpu_memory_utilization`` 0.9 (plan-facts §2.1); OpenVINO GenAI's continuous-batching scheduler, u8 KV
    on CPU (f16 on a GPU: the plugin's inference precision), blocks of 32 on CPU and 16 on GPU, and its dynamic pool
    (``SchedulerConfig`` defaults, DESIGN §4b)."""
    from simkv.models import vllm_kv_precision
    from simkv.serving.engine.core import memory_path

    if device.runtime == "vllm":
        return {"precision": vllm_kv_precision(model), "block_size": 16, "pool": str(VLLM_UTILIZATION), "scheduler": "vllm"}
    gpu = memory_path(device) == "gpu"
    return {"precision": "f16" if gpu else "u8", "block_size": 16 if gpu else 32, "pool": "dynamic",
            "scheduler": "continuous"}


@dataclass
class ServingSpec:
    """Everything a serving run needs (plain values; see :func:`serve`)."""

    requests: list[Request]
    model: object  # ModelSpec
    precision: object  # Precision
    scheduler: str = "continuous"
    memory: str = "paged"
    paged: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = DEFAULT_DEVICE
    device_memory: int | None = None  # default: the device preset's memory
    weights_bytes: int = 0
    block_bytes: int | None = None  # override of the bytes per block (all layers, K+V)
    tensor_block_bytes: tuple[int, int] | None = None  # override: (K, V) bytes per block per layer
    policy: object = "openvino-cpu"  # contiguous memory: the per-request buffer policy (name or Policy)
    policy_options: dict | None = None
    static_batch: int = 8
    max_context: int | None = None
    #: A prompt at or above the context refuses the whole run (a ConfigError, one line); by default such a request
    #: is rejected on arrival and the rest are served (:func:`serve`).
    strict_context: bool = False
    trace_requests: bool = False
    #: Stop after this many steps (the requests still running are UNFINISHED).
    max_steps: int = 10_000_000
    #: Paged: stop once more than this many preemptions happened (the rest UNFINISHED; None: no limit).
    max_preemptions: int | None = None
    #: "fast" plans quiet runs of steps at once; "reference" takes every step one by one (paged memory).
    engine: str = "fast"
    #: Replicas of the engine, each on a device of its own, and the router that sends each request to one
    #: (simkv.serving.router: round-robin, least-outstanding, least-kv, session). 1: today's single run.
    replicas: int = 1
    router: str = "round-robin"
    #: Replicas whose router reads no state (round-robin) may run in this many local processes (1: here).
    workers: int = 1
    #: Tensor parallelism: devices the model is split across (simkv.models.tp_shard). The run simulates one of
    #: them — its share of the weights (``weights_bytes`` is per device), of the KV heads, of the FLOPs — and each
    #: step adds its all-reduces (simkv.cost.allreduce_s); ``device_memory`` is each device's.
    tp: int = 1
    #: How the weights were given, for a refusal that names the fix (simkv.scenario.check_weights_fit): the
    #: precision asked for (None: the device runtime's), and whether ``weights_bytes`` came from --weights-memory.
    weights_precision: str | None = None
    weights_given: bool = False
    #: Closed-loop load (simkv.serving.closed_loop): this many clients send the requests in order, each its next
    #: when its previous ended (the requests' arrival times are not used); None: each request at its arrival.
    concurrency: int | None = None
    #: A closed loop's drained warm-up (simkv.serving.closed_loop, aiperf's ``--warmup-request-count``): its first
    #: this many requests run, and all end, before the others are sent; 0: none. Their rows are in the result.
    warmup: int = 0
    #: vLLM's ``--async-scheduling``: a closed loop's next request waits for two steps in flight, not one
    #: (simkv.serving.closed_loop).
    async_scheduling: bool = False
    #: The layers' weight matmuls as (peak, parameters per token) pairs (simkv.cost.step_cost ``gemm_mix``: a
    #: quantized checkpoint's parts at their kernels' peaks, simkv.cost.step.gemm_mix); None: the compute precision.
    gemm_mix: tuple | None = None

    @property
    def device_model(self):
        """The model as one device holds it (the model itself when ``tp`` is 1)."""
        from simkv.models import tp_shard

        return tp_shard(self.model, self.tp)



def percentile(values: np.ndarray, q: float) -> float | None:
    """The ``q``-th percentile of the defined values (NaN: a request that has none); None if none is."""
    v = values[~np.isnan(values)]
    return float(np.percentile(v, q)) if len(v) else None

@dataclass(eq=False)
class ServingResult:
    spec: ServingSpec
    groups: list
    #: One row per engine step (:data:`simkv.serving.engine.STEP_TABLE`).
    steps: np.ndarray
    #: One row per live request per step (only with ``trace_requests``).
    progress: np.ndarray
    ledger: Ledger
    device_name: str = ""
    #: Why the simulation stopped with requests still running (None: every request ended).
    stopped: str | None = None
    #: Paged: blocks ever handed out (resident on a CPU: the free list is FIFO).
    resident_blocks: int = 0
    block_bytes: int = 0
    #: Paged: the step whose pool allocation did not fit the device ({"step", "reason", ...}; the run ended there).
    oom: dict | None = None
    #: Paged: the pools' largest in-step bytes without the CPU plugin's scratch buffers (which are never touched).
    pool_peak: int = 0
    #: Paged: the step at which one of GenAI's checks throws out of ``step()`` ({"step", "check", "reason"}: cache
    #: eviction, simkv.serving.sched.eviction; the run ended there).
    runtime_stop: dict | None = None
    #: Paged, with cache eviction: the blocks sequences dropped (every layer's count; the same in each).
    evicted_blocks: int = 0
    #: Requests rejected on arrival, by reason (:func:`_front_end`): reason → count.
    rejected_reasons: dict = field(default_factory=dict)

    def _block_bytes(self) -> int:
        return self.block_bytes

    # -- tables --------------------------------------------------------------------------------

    def request_rows(self) -> list[tuple]:
        return _rows_of_groups(self.groups)

    @cached_property
    def request_table(self) -> dict[str, np.ndarray]:
        rows = self.request_rows()
        cols = list(zip(*rows)) if rows else [[] for _ in REQUEST_COLUMNS]
        return {name: np.asarray(col) for name, col in zip(REQUEST_COLUMNS, cols)}

    def write_steps(self, path: str | Path) -> Path:
        from simkv.serving.engine.core import STEP_COLUMNS

        return _write_table(path, STEP_COLUMNS, list(zip(*(self.steps[c].tolist() for c in STEP_COLUMNS))))

    def write_requests(self, path: str | Path) -> Path:
        return _write_table(path, REQUEST_COLUMNS, self.request_rows())

    # -- metrics --------------------------------------------------------------------------------

    @cached_property
    def metrics(self) -> dict:
        s = self.steps
        t = self.request_table
        status = t["status"]
        dt = s["step_s"]
        span = float(dt.sum())
        w = dt if span > 0 else np.ones(len(s))
        wsum = float(w.sum()) or 1.0

        def tmean(col):
            return int(round(float((s[col] * w).sum() / wsum))) if len(s) else 0

        ttft, tpot = t["ttft_s"].astype(float), t["tpot_s"].astype(float)
        in_use = s["allocated_bytes"] - s["reserved_bytes"]
        tokens = int(t["generated"].sum() * 1)
        rows = self.ledger.rows
        from simkv.ledger import COPY

        copy_rows = int(rows["bytes"][rows["op"] == COPY].sum()) if len(rows) else 0
        hit = t["prefix_hit_tokens"].astype(np.int64)
        prompts = t["prompt"].astype(np.int64)
        final = s[-1] if len(s) else None
        return {
            # the keys of `simkv run --json`, with their serving meaning
            "peak_allocated_bytes": int(s["peak_bytes"].max()) if len(s) else 0,
            # what must fit the device beside the weights: paged, the pools' in-step peak without the CPU plugin's
            # scratch buffers (virtual, never touched); contiguous, the peak allocation
            "peak_pool_bytes": (max(self.pool_peak, int(s["allocated_bytes"].max()) if len(s) else 0)
                                if self.spec.memory == "paged" else int(s["peak_bytes"].max()) if len(s) else 0),
            # paged: blocks ever handed out (FIFO free list: written pages stay resident), DESIGN §4b;
            # contiguous: the allocation (no first-touch model across requests)
            "peak_resident_bytes": (self.resident_blocks * self._block_bytes() if self.spec.memory == "paged"
                                    else int(s["peak_bytes"].max()) if len(s) else 0),
            "final_allocated_bytes": int(final["allocated_bytes"]) if final is not None else 0,
            "mean_allocated_bytes": tmean("allocated_bytes"),
            "used_bytes": int(final["used_bytes"]) if final is not None else 0,
            "peak_used_bytes": int(s["used_bytes"].max()) if len(s) else 0,
            "waste_bytes": tmean("allocated_bytes") - tmean("used_bytes"),
            "waste_reserved_bytes": tmean("reserved_bytes"),
            "waste_transient_bytes": tmean("peak_bytes") - tmean("allocated_bytes"),
            # K/V tensors replaced: paged, each pool tensor moved to a bigger one (its copy row; the CPU
            # plugin's scratch buffers are not replacements); contiguous, every allocation after a tensor's first
            "realloc_count": (int(((rows["op"] == COPY) & (rows["tensor"] <= 1)).sum()) if self.spec.memory == "paged"
                              else _replaced_buffers(rows, self.spec.model.layers)) if len(rows) else 0,
            "bytes_copied": int(s["copy_bytes"].sum()),
            "pool_bytes_copied": copy_rows,
            "steps": len(s),
            "oom_step": self.oom["step"] if self.oom else None,
            "waste_pct": round(100.0 * (tmean("allocated_bytes") - tmean("used_bytes")) / tmean("allocated_bytes"), 3)
            if len(s) and tmean("allocated_bytes") else 0.0,
            "max_spike_bytes": int((s["peak_bytes"] - s["allocated_bytes"]).max()) if len(s) else 0,
            "max_spike_step": (int(s["step"][np.argmax(s["peak_bytes"] - s["allocated_bytes"])])
                               if len(s) and (s["peak_bytes"] - s["allocated_bytes"]).max() > 0 else None),
            # serving
            "requests_total": len(status),
            "requests_finished": int((status == FINISHED).sum()),
            "requests_ignored": int((status == IGNORED).sum()),
            "requests_rejected": int((status == REJECTED).sum()),
            "requests_unfinished": int((status == UNFINISHED).sum()),
            "preemptions": int(s["preemptions"].sum()),
            "prefix_hit_rate": float(hit.sum() / prompts.sum()) if prompts.sum() else 0.0,
            "waste_internal_bytes": tmean("internal_bytes"),
            "mean_in_use_bytes": int(round(float((in_use * w).sum() / wsum))) if len(s) else 0,
            "waste_internal_pct_of_in_use": 100.0 * float((s["internal_bytes"] * w).sum()) / float((in_use * w).sum())
            if len(s) and (in_use * w).sum() else 0.0,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
            "throughput_tokens_per_s": tokens / float(s["time_s"][-1]) if len(s) and s["time_s"][-1] > 0 else 0.0,
            "sim_time_s": float(s["time_s"][-1]) if len(s) else 0.0,
        }

    def summary(self) -> dict:
        sp = self.spec
        out = dict(self.metrics)
        out["scenario"] = {
            "model": sp.model.name, "layers": sp.model.layers, "heads": sp.model.heads, "kv_heads": sp.model.kv_heads,
            "head_dim": sp.model.head_dim, "precision": sp.precision.name, "scheduler": sp.scheduler,
            "memory": sp.memory, "device": self.device_name, "device_memory_bytes": sp.device_memory,
            "weights_memory_bytes": sp.weights_bytes,
            "kv_bytes_per_token": sp.precision.kv_bytes_per_token(sp.device_model),
            "paged": sp.paged.summary() if sp.memory == "paged" else None,
            "policy": (sp.policy if isinstance(sp.policy, str) else sp.policy.name) if sp.memory == "contiguous" else None,
        }
        if sp.tp > 1:  # per device: weights, KV bytes per token, device memory
            out["scenario"]["tp"] = sp.tp
        out["oom"] = self.oom["reason"] if self.oom else None
        out["stopped"] = self.stopped
        out["rejected_reasons"] = dict(self.rejected_reasons)
        if sp.memory == "paged" and sp.paged.cache_eviction is not None:
            out["evicted_blocks"] = self.evicted_blocks
            out["runtime_stop"] = self.runtime_stop
        out["per_layer"] = self.per_layer()
        return out

    def per_layer(self, max_steps: int = 1000) -> list[dict]:
        """Per layer and K/V tensor, as ``simkv run --json``: the steps where it was (re)allocated and the
        capacities — the pool's tensors (paged) or every request's buffers (contiguous; lists capped at
        ``max_steps`` entries, ``allocations`` counts them all)."""
        from simkv.metrics import per_layer

        out = per_layer(self.ledger, self.spec.model.layers)
        for entry in out:
            entry["allocations"] = len(entry["alloc_steps"])
            entry["alloc_steps"] = entry["alloc_steps"][:max_steps]
            entry["capacities"] = entry["capacities"][:max_steps]
        return out


def _rows_of_groups(groups) -> list[tuple]:
    """The request table's rows (:data:`REQUEST_COLUMNS`) of these requests, in trace order."""
    out = []
    for g in sorted(groups, key=lambda g: g.index):
        r = g.req
        ttft = g.first_token_s - g.added_s if g.first_token_s is not None else float("nan")
        e2e = g.finish_s - g.added_s if g.status == FINISHED else float("nan")
        tpot = ((g.finish_s - g.first_token_s) / (g.generated - 1)
                if g.status == FINISHED and g.generated > 1 else float("nan"))
        out.append((r.id, float(g.added_s), g.P, g.G, g.generated, g.status, float(ttft), float(tpot), float(e2e),
                    g.preemptions, g.prefix_hit))
    return out


def _replaced_buffers(rows, layers: int) -> int:
    """K/V tensors allocated to replace a live one (every allocation after each tensor's first)."""
    from simkv.ledger import ALLOC, TENSOR_CODE

    kv = np.isin(rows["tensor"], [TENSOR_CODE["k"], TENSOR_CODE["v"]]) & (rows["op"] == ALLOC)
    first = len(np.unique(rows["request"][kv].astype(np.int64) * (1 << 40) + rows["layer"][kv] * 8 + rows["tensor"][kv]))
    return int(kv.sum()) - first


def _write_table(path, columns, rows) -> Path:
    """A table (the step or request table) as CSV, or as Parquet when ``path`` ends in ``.parquet`` (the same
    columns; a missing value is empty in CSV, NaN in Parquet). The directory must exist (the CLI checks it first)."""
    path = Path(path)
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError("writing Parquet needs pyarrow: pip install 'simkv[parquet]'") from None
        cols = list(zip(*rows)) if rows else [[] for _ in columns]
        pq.write_table(pa.table({name: list(col) for name, col in zip(columns, cols)}), path)
        return path
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(columns)
        for row in rows:
            w.writerow(["" if isinstance(v, float) and np.isnan(v) else (repr(v) if isinstance(v, float) else v)
                        for v in row])
    return path


def check_spec(spec: ServingSpec):
    """Check a serving spec before anything runs (:class:`~simkv.errors.ConfigError`, one line) and fill in
    its device memory from the device preset when it has none; returns the device."""
    from simkv.cost import get_device

    if spec.scheduler not in SCHEDULERS:
        raise ConfigError(f"unknown scheduler {spec.scheduler!r}; choose {', '.join(SCHEDULERS)}")
    if spec.memory not in MEMORIES:
        raise ConfigError(f"unknown memory {spec.memory!r}; choose {', '.join(MEMORIES)}")
    if spec.paged.on_oom not in ON_OOM:
        raise ConfigError(f"unknown --on-oom {spec.paged.on_oom!r}; choose {', '.join(ON_OOM)}")
    if spec.paged.kv_manager not in KV_MANAGERS:
        raise ConfigError(f"unknown --kv-manager {spec.paged.kv_manager!r}; choose {', '.join(KV_MANAGERS)}")
    cfg = spec.paged
    for name in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name} must be positive")
    if cfg.num_kv_blocks < 0 or cfg.cache_size < 0:
        raise ConfigError("num_kv_blocks and cache_size must be >= 0")
    if cfg.num_kv_blocks and cfg.cache_size:
        raise ConfigError("give num_kv_blocks or cache_size, not both")
    if cfg.cache_eviction is not None and (spec.memory != "paged" or spec.scheduler != "continuous"):
        raise ConfigError("--cache-eviction is GenAI's paged pool's: use --memory paged --scheduler continuous")
    check_workload(spec.requests, context_limit(spec) if spec.strict_context else None)
    if spec.async_scheduling and spec.concurrency is None:
        raise ConfigError("--async-scheduling changes when a closed loop's next request is scheduled: give --concurrency")
    if spec.warmup and spec.concurrency is None:
        raise ConfigError("a warm-up phase is a closed loop's (its first requests drain before the rest are sent): "
                          "give --concurrency")
    device = get_device(spec.device)
    device.check_tp(spec.tp)
    spec.device_model  # refuses a --tp that does not split the model, one line
    memory_given = spec.device_memory is not None
    if spec.device_memory is None:
        spec.device_memory = device.memory_bytes
    # vLLM's scheduler fills only gpu_memory_utilization of the device (its pool is that less weights and activations)
    usable = spec.paged.gpu_memory_utilization if spec.scheduler == "vllm" and spec.memory == "paged" else 1.0
    check_weights_fit(spec.device_model, spec.weights_bytes, spec.device_memory, device, tp=spec.tp,
                      weights_precision=spec.weights_precision, memory_given=memory_given,
                      weights_given=spec.weights_given, usable=usable)
    # paged memory is a paged-attention engine: the device's paged terms where it has them (the host preset)
    return device.paged_kernel() if spec.memory == "paged" else device


def context_limit(spec: ServingSpec) -> int | None:
    """The context a request's prompt must stay below: ``--max-context``, else the model's (None or 0: none)."""
    return spec.max_context if spec.max_context is not None else context_of(spec.model)


def _front_end(spec: ServingSpec) -> tuple[ServingSpec, list[Group]]:
    """Reject, on arrival, each request whose prompt is at or above the context, and serve the rest: what a
    serving engine's front end does — vLLM checks a prompt's length against ``max_model_len`` before it makes an
    engine request (vllm/v1/engine/processor.py, ``Processor._validate_model_input``: a ValueError, an error
    response for that request alone) — so no scheduler sees it, and with replicas it takes no replica's turn.
    Returns the spec of the requests served and the rejected requests (status REJECTED, finished at their arrival,
    by their position in the trace)."""
    from dataclasses import replace

    out = set(over_context(spec.requests, context_limit(spec)))
    if not out:
        return spec, []
    if len(out) == len(spec.requests):  # nothing to serve: the first one's refusal
        check_workload(spec.requests, context_limit(spec))
    rejected = []
    for i in sorted(out):
        r = spec.requests[i]
        g = Group(r, i, r.prompt)
        g.status = REJECTED
        g.added_s = g.finish_s = r.arrival_s if r.arrival_s is not None else 0.0
        g.added_step = g.finish_step = 0
        rejected.append(g)
    return replace(spec, requests=[r for i, r in enumerate(spec.requests) if i not in out]), rejected


def _with_rejected(result, spec: ServingSpec, served: ServingSpec, rejected: list[Group]):
    """``result`` (of ``served``, the requests :func:`_front_end` let through) as the result of ``spec``: every
    request in trace order, the rejected ones among them. A single engine's groups are numbered by their position in
    the trace again (the progress table names requests by id: unchanged)."""
    if not rejected:
        return result
    result.spec = spec
    result.rejected_reasons = {f"prompt at or above the context of {context_limit(spec):,} tokens": len(rejected)}
    if isinstance(result, ReplicasResult):
        result.rejected = rejected
        return result
    out = {g.index for g in rejected}
    kept = np.asarray([i for i in range(len(spec.requests)) if i not in out], dtype=np.int64)
    for g in result.groups:
        g.index = int(kept[g.index])
    result.groups = result.groups + rejected
    return result


def serve(spec: ServingSpec, progress=False, watch=None):
    """Run a serving workload. Raises :class:`~simkv.errors.ConfigError` for a bad spec. With
    ``spec.replicas > 1`` the requests are routed to that many engines (a :class:`ReplicasResult`).

    ``progress``: True draws a bar on stderr (after a second); a callable is called with the number of
    requests added so far after every scheduler round (an exception it raises stops the run: the
    dashboard's work limit). ``watch(replica, engine)`` is called after every scheduler round of every
    engine (replica index, the engine itself); an exception it raises stops the run (``simkv plan``'s SLO
    guard, simkv.lab.plan). Replicas then run in this process, whatever ``spec.workers`` says."""
    from simkv.serving.router import check_router

    whole = spec
    device = check_spec(spec)
    check_router(spec.replicas, spec.router, spec.requests, spec.workers)
    spec, rejected = _front_end(spec)
    if spec.concurrency is not None:
        return _with_rejected(_serve_closed_loop(spec, device, progress, watch), whole, spec, rejected)
    bar = None
    if callable(progress):
        bar = _Callback(progress)
    elif progress:
        bar = _progress_bar(len(spec.requests))
    try:
        if spec.replicas > 1:
            return _with_rejected(_serve_replicas(spec, device, bar, watch), whole, spec, rejected)
        eng = _engine(spec, device, spec.requests, _watched(bar.update_to if bar else None, watch, 0))
        eng.start(spec.engine == "fast") if spec.memory == "paged" else eng.start()
        eng.advance()
    finally:
        if bar:
            bar.close()
    return _with_rejected(_result(spec, eng, device), whole, spec, rejected)


def _serve_closed_loop(spec: ServingSpec, device, progress=False, watch=None) -> ServingResult:
    """``spec.concurrency`` clients send ``spec.requests`` in order, each its next when its previous ended
    (:class:`simkv.serving.closed_loop.ClosedLoop`), to one engine with paged memory."""
    from simkv.serving.closed_loop import ClosedLoop
    from simkv.serving.engine.core import prompt_token_ids

    if spec.replicas > 1:
        raise ConfigError("--concurrency drives one engine; with --replicas the clients would need a router's "
                          "placement per request (give --replicas 1, or replay arrivals with --rate)")
    if spec.memory != "paged" or spec.scheduler not in ("continuous", "vllm"):
        raise ConfigError("--concurrency needs --memory paged and --scheduler continuous or vllm (the serving engine "
                          "whose steps let a completed request send the next)")
    reqs = spec.requests
    if reqs and reqs[0].arrival_s is None:
        raise ConfigError("--concurrency sends requests by completions, in seconds: the trace counts arrivals in "
                          "steps (arrival_step)")
    tokens = prompt_token_ids(reqs) if spec.paged.enable_prefix_caching else None
    loop = ClosedLoop(reqs, spec.concurrency, tokens, lag=2 if spec.async_scheduling else 1, warmup=spec.warmup)
    bar = _Callback(progress) if callable(progress) else _progress_bar(len(reqs)) if progress else None
    try:
        first = loop.first()
        eng = _engine(spec, device, first, _watched(bar.update_to if bar else None, watch, 0), client=loop)
        eng.start(spec.engine == "fast", prompts=[r.prompt for r in first],
                  tokens=tokens[: len(first)] if tokens is not None else None,
                  longest=max((r.prompt + r.max_new_tokens for r in reqs), default=0))
        eng.advance()
    finally:
        if bar:
            bar.close()
    return _result(spec, eng, device)


def _watched(progress, watch, replica: int):
    """The engine's per-round callback: ``progress`` and ``watch`` (:func:`serve`); the engine is bound once
    it exists (``callback.engine``)."""
    if watch is None:
        return progress

    def callback(n):
        if progress is not None:
            progress(n)
        watch(replica, callback.engine)

    callback.engine = None
    return callback


def _engine(spec: ServingSpec, device, requests: list[Request], progress, client=None):
    """The engine that serves ``requests`` as ``spec`` says (not yet run); ``client``: a closed loop's clients."""
    cfg = spec.paged
    if spec.scheduler in ("continuous", "vllm") and spec.memory == "paged":
        if (spec.scheduler == "vllm") != (cfg.scheduler == "vllm"):  # the one switch: GenAI's rules or vLLM's
            cfg = spec.paged = replace(cfg, scheduler="vllm" if spec.scheduler == "vllm" else "genai")
        from simkv.serving.engine.core import PagedServing

        eng = PagedServing(requests, spec.device_model, spec.precision, cfg, device=device,
                           weights_bytes=spec.weights_bytes, device_memory=spec.device_memory,
                           block_bytes=spec.block_bytes, tensor_block_bytes=spec.tensor_block_bytes,
                           trace_requests=spec.trace_requests, max_steps=spec.max_steps,
                           max_preemptions=spec.max_preemptions, progress=progress, client=client,
                           gemm_mix=spec.gemm_mix)
        if spec.engine not in ("fast", "reference"):
            raise ConfigError(f"unknown engine {spec.engine!r}; choose fast or reference")
        return _bind(eng, progress)
    if spec.memory == "contiguous":
        from policies import get_policy
        from simkv.serving.contiguous import ContiguousServing

        policy = spec.policy if not isinstance(spec.policy, str) else get_policy(spec.policy, spec.policy_options)
        return _bind(ContiguousServing(requests, spec.device_model, spec.precision, policy, cfg,
                                       scheduler=spec.scheduler, static_batch=spec.static_batch, device=device,
                                       weights_bytes=spec.weights_bytes, device_memory=spec.device_memory,
                                       trace_requests=spec.trace_requests, progress=progress), progress)
    raise ConfigError(f"--memory paged models OpenVINO GenAI continuous batching: use --scheduler continuous "
                      f"(got {spec.scheduler})")


def _bind(eng, progress):
    if hasattr(progress, "engine"):
        progress.engine = eng
    return eng


def _result(spec: ServingSpec, eng, device) -> ServingResult:
    """The result of an engine that ran to its end."""
    out = eng.finish()
    groups, steps, prog = out[0], out[1], out[2]
    if spec.memory == "paged":
        return ServingResult(spec, groups, steps, prog, eng.ledger, device.name, eng.stopped, eng.pool.touched,
                             eng.block_bytes, eng.oom, eng.resident_peak, eng.runtime_stop,
                             getattr(eng.sched, "evicted_blocks", 0))
    return ServingResult(spec, groups, steps, prog, eng.ledger, device.name, None, 0, 0, None, 0)


def _serve_replicas(spec: ServingSpec, device, bar, watch=None) -> ReplicasResult:
    """``spec.replicas`` engines, each on a device like ``device``, fed by ``spec.router``
    (:func:`simkv.serving.router.route`); each replica's result is a :class:`ServingResult` of its share."""
    from dataclasses import replace

    from simkv.serving.engine.core import prompt_token_ids, session_prompts
    from simkv.serving.router import STATEFUL, route

    reqs = spec.requests
    # a session's turn carries its history wherever it runs (the client sends it): prompts from the whole trace
    prompts = session_prompts(reqs)
    paged = spec.memory == "paged"
    tokens = prompt_token_ids(reqs) if paged and spec.paged.enable_prefix_caching else None
    longest = max(p + r.max_new_tokens for p, r in zip(prompts, reqs))
    if spec.router not in STATEFUL and spec.workers > 1 and watch is None:  # the replicas need nothing of each other: processes
        from concurrent.futures import ProcessPoolExecutor

        where = [k % spec.replicas for k in range(len(reqs))]  # round-robin
        shares = [[i for i, w in enumerate(where) if w == k] for k in range(spec.replicas)]
        with ProcessPoolExecutor(min(spec.workers, spec.replicas)) as ex:
            results = list(ex.map(_serve_share, [spec] * spec.replicas, [device] * spec.replicas,
                                  [[reqs[i] for i in s] for s in shares], [[prompts[i] for i in s] for s in shares],
                                  [[tokens[i] for i in s] if tokens is not None else None for s in shares],
                                  [longest] * spec.replicas))
        return ReplicasResult(spec, results, np.asarray(where, dtype=np.int64))
    engines = [_engine(spec, device, [], _watched(None, watch, k)) for k in range(spec.replicas)]
    for eng in engines:
        _start(spec, eng, [], [] if tokens is not None else None, longest)
    where = route(engines, reqs, prompts, tokens, spec.router, paged, bar.update_to if bar else None)
    results = [_result(replace(spec, requests=list(eng.requests), replicas=1), eng, device) for eng in engines]
    return ReplicasResult(spec, results, np.asarray(where, dtype=np.int64))


def _start(spec: ServingSpec, eng, prompts, tokens, longest) -> None:
    if spec.memory == "paged":
        eng.start(spec.engine == "fast", prompts=prompts, tokens=tokens, longest=longest)
    else:
        eng.start(prompts=prompts)


def _serve_share(spec: ServingSpec, device, share: list[Request], prompts, tokens, longest) -> ServingResult:
    """One replica's share of the requests, alone (in a worker process): its prompts as the whole trace gives
    them."""
    from dataclasses import replace

    eng = _engine(spec, device, list(share), None)
    _start(spec, eng, prompts, tokens, longest)
    eng.advance()
    return _result(replace(spec, requests=list(share), replicas=1), eng, device)


@dataclass(eq=False)
class ReplicasResult:
    """Replicas behind a router: each replica's :class:`ServingResult` (its share of the requests, its own
    device) and the replica of each request in trace order. Totals add requests, steps, preemptions and
    copies over the replicas; latency percentiles are over every request; memory keys are the largest
    replica's (each replica is a device of its own)."""

    spec: ServingSpec
    replicas: list
    assignment: np.ndarray
    #: Requests rejected on arrival, before routing (:func:`_front_end`), and their reasons (reason → count).
    rejected: list = field(default_factory=list)
    rejected_reasons: dict = field(default_factory=dict)

    @property
    def device_name(self) -> str:
        return self.replicas[0].device_name

    @property
    def stopped(self) -> str | None:
        return next((f"replica {i}: {r.stopped}" for i, r in enumerate(self.replicas) if r.stopped), None)

    def request_rows(self) -> list[tuple]:
        """The request table of every replica with the replica last, in trace order."""
        order = {r.id: i for i, r in enumerate(self.spec.requests)}
        rows = [row + (k,) for k, res in enumerate(self.replicas) for row in res.request_rows()]
        rows += [row + (-1,) for row in _rows_of_groups(self.rejected)]  # rejected before routing: no replica
        return sorted(rows, key=lambda row: order[row[0]])

    @cached_property
    def request_table(self) -> dict[str, np.ndarray]:
        rows = self.request_rows()
        names = REQUEST_COLUMNS + ("replica",)
        cols = list(zip(*rows)) if rows else [[] for _ in names]
        return {name: np.asarray(col) for name, col in zip(names, cols)}

    def write_requests(self, path: str | Path) -> Path:
        return _write_table(path, REQUEST_COLUMNS + ("replica",), self.request_rows())

    def write_steps(self, path: str | Path) -> Path:
        """Every replica's step table in one file, replica by replica, with the replica last."""
        from simkv.serving.engine.core import STEP_COLUMNS

        rows = [row + (k,) for k, res in enumerate(self.replicas)
                for row in zip(*(res.steps[c].tolist() for c in STEP_COLUMNS))]
        return _write_table(path, STEP_COLUMNS + ("replica",), rows)

    @cached_property
    def metrics(self) -> dict:
        per = [r.metrics for r in self.replicas]
        t = self.request_table
        status = t["status"]
        ttft, tpot = t["ttft_s"].astype(float), t["tpot_s"].astype(float)
        prompts, hit = t["prompt"].astype(np.int64), t["prefix_hit_tokens"].astype(np.int64)
        sim = max(m["sim_time_s"] for m in per)
        out = {
            "requests_total": len(status),
            "requests_finished": int((status == FINISHED).sum()),
            "requests_ignored": int((status == IGNORED).sum()),
            "requests_rejected": int((status == REJECTED).sum()),
            "requests_unfinished": int((status == UNFINISHED).sum()),
            "preemptions": sum(m["preemptions"] for m in per),
            "steps": sum(m["steps"] for m in per),
            "realloc_count": sum(m["realloc_count"] for m in per),
            "bytes_copied": sum(m["bytes_copied"] for m in per),
            "prefix_hit_rate": float(hit.sum() / prompts.sum()) if prompts.sum() else 0.0,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
            "throughput_tokens_per_s": int(t["generated"].sum()) / sim if sim > 0 else 0.0,
            "sim_time_s": sim,
        }
        for key in ("peak_allocated_bytes", "peak_resident_bytes", "mean_allocated_bytes", "peak_used_bytes"):
            out[key] = max(m[key] for m in per)
        return out

    def summary(self) -> dict:
        out = dict(self.metrics)
        scenario = self.replicas[0].summary()["scenario"]
        out["scenario"] = dict(scenario, replicas=len(self.replicas), router=self.spec.router)
        out["stopped"] = self.stopped
        out["rejected_reasons"] = dict(self.rejected_reasons)
        if self.spec.paged.cache_eviction is not None:  # (every replica's drops; each replica's own are in its row)
            out["evicted_blocks"] = sum(res.evicted_blocks for res in self.replicas)
        out["replicas"] = [dict(replica=k, **res.metrics, stopped=res.stopped,
                                **({"evicted_blocks": res.evicted_blocks} if self.spec.paged.cache_eviction else {}))
                           for k, res in enumerate(self.replicas)]
        return out

class _Callback:
    def __init__(self, fn) -> None:
        self.update_to = fn

    def close(self) -> None:
        pass


def _progress_bar(total: int):
    import sys
    import time

    from tqdm import tqdm

    class Bar:
        def __init__(self):
            self.t0 = time.monotonic()
            self.bar = None
            self.n = 0

        def update_to(self, n):
            if self.bar is None:
                if time.monotonic() - self.t0 < 1.0 or not sys.stderr.isatty():
                    self.n = n
                    return
                self.bar = tqdm(total=total, unit="req", desc="serving", leave=False)
            self.bar.update(n - self.bar.n)

        def close(self):
            if self.bar is not None:
                self.bar.close()

    return Bar()


def simulate_paged(requests: list[Request], config: SchedulerConfig | None = None, *, model, precision,
                   block_bytes: int | None = None, tensor_block_bytes: tuple[int, int] | None = None,
                   device: str = DEFAULT_DEVICE, device_memory: int | None = None, weights_bytes: int = 0,
                   max_context: int | None = 0, max_steps: int = 10_000_000) -> ServingResult:
    """GenAI continuous batching on a paged pool (``config``: GenAI's defaults when None), with per-step
    per-request progress (``result.progress``) — the call ``simkv validate --paged`` compares with the real
    pipeline."""
    spec = ServingSpec(list(requests), model, precision, "continuous", "paged", config or SchedulerConfig(),
                       device=device, device_memory=device_memory, weights_bytes=weights_bytes, block_bytes=block_bytes,
                       tensor_block_bytes=tensor_block_bytes, max_context=max_context, trace_requests=True,
                       max_steps=max_steps)
    return serve(spec)

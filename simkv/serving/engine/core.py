"""The serving step loop: requests arrive, the scheduler picks work, the memory model holds the KV,
the cost model times the step.

One iteration is one GenAI ``ContinuousBatchingImpl::step()``: pull the requests that
have arrived (``arrival_step`` ≤ this step, or ``arrival`` seconds ≤ the time the step
starts), schedule, read the metrics (blocks in use after scheduling, before finished
requests are freed), run the forward pass (its time from :mod:`simkv.cost`), sample,
free what finished. A step that schedules nothing marks every present request IGNORED.
With arrivals in seconds, an idle engine jumps to the next arrival; with
``arrival_step`` it takes idle steps, as a program calling ``step()`` in a loop does.

:class:`PagedServing` conducts the loop and holds its state; one step the reference way is
:mod:`.slow_path`, the pool's tensors in the ledger :mod:`..kv.pool_tensors`, quiet runs of steps
planned at once :mod:`.planned_run`, and arrivals joining them :mod:`.joins`.
"""

from __future__ import annotations

import functools
import math
import gc
from bisect import bisect_left
from dataclasses import replace
from collections import Counter
from itertools import repeat
from operator import attrgetter

import numpy as np

from simkv.errors import ConfigError
from simkv.serving.engine import planned_run, squeezed, vllm_run
from simkv.serving.engine.costing import Work
from simkv.serving.engine.joins import join
from simkv.serving.kv.groups import overridden, paged_kv
from simkv.serving.kv.block_pool import BlockPool
from simkv.serving.kv.pool_tensors import PoolTensors
from simkv.serving.requests import Request
from simkv.serving.sched.config import SchedulerConfig
from simkv.serving.sched.eviction import check_eviction, check_request
from simkv.serving.sched.genai import ContinuousScheduler, GpuCheck
from simkv.serving.sched.vllm import (UNBOUNDED_MODEL_LEN, EngineVllm, VllmSettings, num_gpu_blocks,
                                      profile_peak_bytes)
from simkv.serving.sched.group import FINISHED, RUNNING, UNFINISHED, Group
from simkv.serving.engine.slow_path import ignore_all, internal_slack, sample, step_work, used_bytes

GIB = 1024**3
_index = attrgetter("index")
#: Device presets whose dynamic pool follows GenAI's GPU path (a growth check, then preemption or waiting); every
#: other device (xeon-8480, host, a custom one) follows its CPU path: no check, and an allocation that does not fit
#: is out of memory. NVIDIA presets have no OpenVINO plugin; they take the GPU path, a device's own memory.
GPU_DEVICES = frozenset({"h100-sxm", "a100-80gb", "h200-sxm", "b200", "b300", "arc-a770", "core-ultra-155h-igpu"})


#: The scheduling rules the engine serves with (``SchedulerConfig.scheduler``).
SCHEDULER_RULES = ("genai", "vllm")


def takes_fast_paths(sched) -> bool:
    """Whether the engine may plan quiet runs for this scheduler: GenAI's (:mod:`.planned_run`, and squeezed runs,
    :mod:`.squeezed`), or vLLM's over full-attention and MLA groups, prefix caching on or off (:mod:`.vllm_run`);
    every other case takes the step-by-step reference path, fast or not. The one place this is decided."""
    return isinstance(sched, ContinuousScheduler) or isinstance(sched, EngineVllm) and sched.v.plannable


def memory_path(device) -> str:
    """"gpu" or "cpu": which of GenAI's paths a device's dynamic pool follows (``_try_increase_cache``,
    scheduler.hpp:769, ``device.find("GPU")``)."""
    return "gpu" if device.name in GPU_DEVICES else "cpu"

#: A run stops when no token has been generated for this many steps (or 4x the longest request):
#: requests that keep preempting each other (a sample group larger than the pool) never finish.
STALL_STEPS = 10_000
#: The most steps taken the reference way, after failed plans, before planning again (PagedServing.run).
PLAN_BACKOFF = 32

#: Steps after which the rows taken so far become one block of the step table (:meth:`PagedServing._solidify`;
#: a block of 2^18 rows, 36 MB, is its own mapping: freed to the system once copied into the table).
SOLID_STEPS = 1 << 18

#: The step table (``--steps``): the issue's contract columns, then extras.
STEP_COLUMNS = ("step", "time_s", "requests", "scheduled_requests", "blocks_used", "blocks_total",
                "allocated_bytes", "used_bytes")
STEP_TABLE = np.dtype([
    ("step", np.int64), ("time_s", np.float64), ("requests", np.int64), ("scheduled_requests", np.int64),
    ("blocks_used", np.int64), ("blocks_total", np.int64), ("allocated_bytes", np.int64), ("used_bytes", np.int64),
    # extras (library only)
    ("step_s", np.float64), ("scheduled_tokens", np.int64), ("peak_bytes", np.int64), ("reserved_bytes", np.int64),
    ("internal_bytes", np.int64), ("copy_bytes", np.int64), ("preemptions", np.int64),
    # GenAI's linear-attention pool (hybrid models): its blocks in use and in all (bytes are in the columns above)
    ("state_blocks_used", np.int64), ("state_blocks_total", np.int64),
])
#: :meth:`PagedServing._run_of_steps` held its run for a router (:meth:`PagedServing.advance`).
HELD = -1
#: Per-request progress (``trace_requests=True``): one row per live request per step.
PROGRESS = np.dtype([("step", np.int64), ("request", np.int64), ("generated", np.int64), ("processed", np.int64),
                     ("status", "U8")])


def _rows_of(columns: dict) -> np.ndarray:
    """A planned run's step-table rows from its columns (arrays, or one value for every step): filled while they
    are small (a block of the table is then one copy of such rows, :meth:`PagedServing._solidify`)."""
    rows = np.empty(columns["_n"], dtype=STEP_TABLE)
    for name in STEP_TABLE.names:
        rows[name] = columns[name]
    return rows


def without_cycle_collection(method):
    """Run ``method`` with Python's cyclic garbage collector paused. The loop allocates millions of small objects
    that form no reference cycles (groups, block tables, token ids, step tuples) and keeps many of them, so the
    collector's full passes, each walking every object kept so far, cost seconds over an hour's trace (prefix
    caching: 11.5 -> 6.1 s; the H100 hour 3.0 -> 2.2 s); reference counting frees them as before."""

    @functools.wraps(method)
    def paused(*args, **kwargs):
        if not gc.isenabled():
            return method(*args, **kwargs)
        gc.disable()
        try:
            return method(*args, **kwargs)
        finally:
            gc.enable()

    return paused


def session_prompts(requests: list[Request]) -> list[int]:
    """Effective prompt of each request: a session's turn carries the history before its new tokens
    (every turn is assumed to generate its ``max_new_tokens``)."""
    history: dict[str, int] = {}
    out = []
    for r in requests:
        p = r.prompt + (history.get(r.session, 0) if r.session else 0)
        if r.session:
            history[r.session] = p + r.max_new_tokens
        out.append(p)
    return out


def prompt_token_ids(requests: list[Request]) -> list[list]:
    """Token ids each request's prompt is made of: explicit ids, else the shared prefix's ids (shared by
    ``prefix_id``), the session's history and ids unique to the request. Generated tokens are
    ``(3, request, sequence, i)``: unique, so only a later turn of the session can match them."""
    prefix_index: dict[str, int] = {}
    history: dict[str, list] = {}
    out = []
    for r in requests:
        if r.token_ids is not None:
            own = list(r.token_ids)
        else:
            shared = []
            if r.prefix_id:
                k = prefix_index.setdefault(r.prefix_id, len(prefix_index))
                shared = [(2, k, i) for i in range(r.prefix_tokens)]
            own = list(zip(repeat(1), repeat(r.id), range(r.prompt - len(shared))))  # (1, id, i), built in C
            if shared:
                own = shared + own
        if r.session:
            toks = history.get(r.session, []) + own
            history[r.session] = toks + [(3, r.id, 0, i) for i in range(r.max_new_tokens)]
        else:
            toks = own  # (a list of its own)
        out.append(toks)
    return out


class PagedServing:
    """Continuous batching over a paged pool, step by step (GenAI's rules; see :mod:`..sched.genai`)."""

    def __init__(self, requests: list[Request], model, precision, config: SchedulerConfig, *, device,
                 weights_bytes: int, device_memory: int, block_bytes: int | None = None, tensor_block_bytes=None,
                 max_steps: int = 10_000_000,
                 trace_requests: bool = False, progress=None, observe=None, stall_steps: int = STALL_STEPS,
                 max_preemptions: int | None = None, client=None, gemm_mix: tuple | None = None) -> None:
        self.requests = requests
        #: A closed loop's clients (simkv.serving.closed_loop.ClosedLoop; None: the requests' own arrivals): every
        #: request that ends sends the next one (:meth:`_completions`), so no run of steps goes past a step in which
        #: one ends (planned_run.plan, joins.join; squeezed runs are not taken).
        self.client = client
        #: A closed loop whose requests wait for steps in flight (``client.lag`` > 1): [steps still to end, time
        #: sent, request, token ids] of each request sent and not yet arrived (:meth:`_due`).
        self.deferred: list[list] = []
        self.model, self.cfg = model, config
        if config.block_size <= 0:
            raise ConfigError("block size and block bytes must be positive")
        if config.scheduler not in SCHEDULER_RULES:
            raise ConfigError(f"unknown scheduler rules {config.scheduler!r}; choose {', '.join(SCHEDULER_RULES)}")
        vllm = config.scheduler == "vllm"
        kv = paged_kv(model, precision, config.block_size, "vllm" if vllm else config.kv_manager,
                      prefix_caching=config.enable_prefix_caching)
        if vllm and (block_bytes or tensor_block_bytes is not None):
            raise ConfigError("bytes per block given by hand are not modelled under --scheduler vllm")
        if config.kv_manager == "vllm" and config.enable_prefix_caching and not vllm:
            raise ConfigError("prefix caching under --kv-manager vllm is not modelled (vLLM's hit rules per group: "
                              "sliding windows scanned from the right, Mamba states at block boundaries); use the "
                              "GenAI manager or drop --prefix-caching")
        if block_bytes or tensor_block_bytes is not None:
            if not kv.plain or kv.manager != "genai":
                raise ConfigError("bytes per block given by hand need a model whose attention layers are all alike "
                                  "under the GenAI manager")
            kv = overridden(kv, block_bytes, tensor_block_bytes)
        #: The paged memory's layout (simkv.serving.kv.groups): groups, block bytes, tensors.
        self.kv = kv
        self.bs = kv.block_size
        self.block_bytes = kv.block_bytes
        self.state_bytes = kv.state_bytes
        if self.bs <= 0 or self.block_bytes <= 0:
            raise ConfigError("block size and block bytes must be positive")
        budget = device_memory - weights_bytes
        if budget < self.block_bytes + self.state_bytes:
            raise ConfigError(f"no room for even one KV block: {device_memory:,} B device memory, "
                              f"{weights_bytes:,} B weights")
        self.max_blocks = budget // self.block_bytes
        self.device_memory, self.weights_bytes = device_memory, weights_bytes
        #: GenAI's path for a dynamic pool on this device (:func:`memory_path`); the largest single allocation is
        #: taken as the whole device (GenAI reads ``device_max_alloc_mem_size``; no preset has a figure for it).
        self.memory_path = memory_path(device)
        #: The scheduler: what the loop asks of it is :class:`ContinuousScheduler`'s and :class:`EngineVllm`'s
        #: common interface (add_group, schedule, update, free_group; pool, copies).
        self.sched = self._vllm_scheduler(model, config, kv, budget) if vllm else self._genai_scheduler(config, kv,
                                                                                                         budget)
        self.pool = self.sched.pool
        self.state_pool = getattr(self.sched, "state_pool", None)
        self.vllm = vllm
        self.side_pools = [self.sched.pools[grp.pool] for grp in kv.side]
        if config.cache_eviction is not None:
            check_eviction(config.cache_eviction, self.bs, prefix_caching=config.enable_prefix_caching,
                           plain=not vllm and self.sched.simple and kv.manager == "genai")
            for req in requests:
                check_request(req)
        #: What each step computes, for the cost model (per layer kind; a uniform model as ever).
        self.work = Work(kv.token_classes, model.layers, kv.seq_state_bytes)
        self.kv_token = self.work.kv_token
        self.timer = self.work.timer(model, device, weights_bytes, gemm_mix, config.cudagraph_capture_sizes)
        #: Blocks leave windows (vLLM's manager): freed after each step, and no planned runs over them.
        self.window_blocks = self.sched.windowed
        #: Steps the next planned run may take (a layout of several groups; planned_run._horizon).
        self.horizon = planned_run.KMAX
        self.max_steps = max_steps
        self.stall_steps = stall_steps
        #: Stop once more preemptions than this happened (a bound for searches: such runs take the slow path).
        self.max_preemptions = max_preemptions
        self.trace_requests = trace_requests
        self.progress = progress
        #: ``observe(step, engine, live)`` after each reference step's sampling, before finished
        #: requests are freed (tests; the planned runs skip it: use ``run(fast=False)``).
        self.observe = observe
        self.tensors = PoolTensors(kv.tensors, self.block_bytes, self.bs,
                                   config.transient_buffers and kv.transient, kv.state_tensors,
                                   by_layer=kv.manager == "genai")
        self.ledger = self.tensors.ledger

    def _genai_scheduler(self, config: SchedulerConfig, kv, budget: int) -> ContinuousScheduler:
        fixed, state_fixed = self._pool_sizes(config, kv, budget)
        pool = BlockPool(fixed, config.enable_prefix_caching)
        state_pool = BlockPool(state_fixed, config.enable_prefix_caching) if kv.state_bytes else None
        gpu = (GpuCheck(self.device_memory, self.weights_bytes, self.device_memory,
                        len(kv.tensors) + len(kv.state_tensors)) if self.memory_path == "gpu" else None)
        return ContinuousScheduler(config, pool, dynamic=config.dynamic, max_blocks=self.max_blocks, kv=kv,
                                   state_pool=state_pool, budget=budget, gpu=gpu)

    def _vllm_scheduler(self, model, config: SchedulerConfig, kv, budget: int) -> EngineVllm:
        """vLLM's scheduler over a pool of ``--num-kv-blocks`` blocks, else ``--cache-size`` GiB, else vLLM's
        ``num_gpu_blocks`` (:func:`~simkv.serving.sched.vllm.num_gpu_blocks`: ``gpu_memory_utilization`` of the
        device less the weights and the profile run's activation peak)."""
        if config.on_oom != "preempt":
            raise ConfigError("--scheduler vllm preempts by recompute (vLLM's rule): drop --on-oom")
        if config.num_kv_blocks or config.cache_size:
            blocks, _ = self._pool_sizes(config, kv, budget)
        else:
            peak = profile_peak_bytes(model, config.max_num_batched_tokens, config.max_num_seqs)
            blocks = num_gpu_blocks(kv.block_bytes, self.device_memory, self.weights_bytes, peak,
                                    config.gpu_memory_utilization)
        if blocks < 2:
            raise ConfigError("--scheduler vllm needs a pool of at least 2 blocks (block 0 is vLLM's null block)")
        settings = VllmSettings(num_blocks=blocks, block_size=kv.block_size,
                                max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
                                max_model_len=UNBOUNDED_MODEL_LEN,
                                long_prefill_token_threshold=config.long_prefill_token_threshold,
                                policy=config.scheduling_policy, enable_prefix_caching=config.enable_prefix_caching)
        return EngineVllm(kv, settings)

    @staticmethod
    def _pool_sizes(config: SchedulerConfig, kv, budget: int) -> tuple[int, int]:
        """Blocks of the KV pool and of the state pool when they are fixed (``num_kv_blocks`` or
        ``cache_size``), GenAI's ``CacheOrchestrator::normalize_block_counts``: without prefix caching the
        state pool has ``max_num_seqs`` blocks, reserved first out of ``cache_size``; with it, one checkpoint
        per interval of the KV pool's tokens (``num_kv_blocks``), or the largest token target whose KV blocks and
        checkpoints fit ``cache_size`` (binary search). (0, 0): a dynamic pool."""
        state_group = kv.side[-1] if kv.state_bytes else None
        bb, sb = kv.block_bytes, kv.state_bytes
        state = 0
        if config.num_kv_blocks:
            fixed = config.num_kv_blocks
            if state_group is not None:
                state = (config.max_num_seqs if state_group.kind == "state"
                         else -(-fixed * kv.block_size // state_group.block_size))
        elif config.cache_size:
            cache = int(config.cache_size * GIB)
            if state_group is None:
                fixed = cache // bb
            elif state_group.kind == "state":
                state = config.max_num_seqs
                if state * sb > cache:
                    raise ConfigError(f"{state} linear-attention state blocks of {sb:,} B (max_num_seqs) exceed the "
                                      f"{config.cache_size} GiB cache size (GenAI: \"Requested linear attention cache "
                                      "allocation exceeds the configured cache size.\")")
                fixed = (cache - state * sb) // bb
            else:
                interval, bs = state_group.block_size, kv.block_size
                lo, hi = 0, cache // bb * bs
                while lo < hi:
                    mid = lo + (hi - lo + 1) // 2
                    if -(-mid // bs) * bb + -(-mid // interval) * sb <= cache:
                        lo = mid
                    else:
                        hi = mid - 1
                fixed, state = -(-lo // bs), -(-lo // interval)
            if fixed <= 0:
                raise ConfigError(f"cache size {config.cache_size} GiB holds no {bb:,}-byte block")
        else:
            return 0, 0
        if fixed * bb + state * sb > budget:
            raise ConfigError(f"a pool of {fixed:,} blocks ({(fixed * bb + state * sb) / GIB:.2f} GiB) does not fit "
                              f"the {budget / GIB:.2f} GiB the device has besides the weights")
        return fixed, state

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, fast: bool = True):
        """Simulate every step. ``fast`` plans quiet runs of steps at once (:meth:`_run_of_steps`);
        ``fast=False`` is the step-by-step reference, and the two give identical results."""
        self.start(fast)
        self.advance()
        return self.finish()

    # -- the loop in parts: a router (simkv.serving.router) adds requests while the engine runs ----

    @without_cycle_collection
    def start(self, fast: bool = True, *, prompts: list[int] | None = None, tokens: list | None = None,
              longest: int | None = None) -> None:
        """Set up a run over ``self.requests``. A router starts with no requests and gives each one with
        :meth:`add`, with the prompt and token ids the whole trace gives it (``prompts``/``tokens`` for
        the requests given here; default: computed from them) and the trace's longest request (the stall
        bound; default: these requests')."""
        reqs = self.requests
        self.fast = fast and takes_fast_paths(self.sched)
        if self.vllm:  # vLLM's step-by-step path in arithmetic where the rules reduce to it (--engine fast)
            self.sched.lean = fast
        # arrivals in steps (arrival_step), else in seconds (arrival_s): also the planned runs and joins
        self.by_step = bool(reqs) and reqs[0].arrival_step is not None
        self.prompts = session_prompts(reqs) if prompts is None else list(prompts)
        self.tokens = ((prompt_token_ids(reqs) if tokens is None else list(tokens))
                       if self.cfg.enable_prefix_caching else None)
        #: Prefix caching: each request's first prompt token (its *family*: two blocks can only have the same hash
        #: if their requests have the same first token) and how many requests each family has.
        self.family = [t[0] for t in self.tokens] if self.tokens is not None else None
        self.families = Counter(self.family) if self.tokens is not None else None
        self.groups: list[Group] = []
        self.live: list[Group] = []
        self.pending = 0
        self.t = 0.0
        self.step = 0
        #: The step table so far: blocks of it (:meth:`_solidify`), then single-step tuples and planned runs' columns.
        self.rows: list = []
        self.solid = self.loose = 0  # rows[:solid] are blocks; steps in the rows after them
        self.official: list = []  # each block's step_cost seconds
        self.slow_steps = 0  # steps taken the reference way (the bench counts them)
        self.progress_rows: list[tuple] = []
        self.est: list = []
        self.stopped = None
        #: Out of memory: {"step", "reason", ...} of the step whose pool allocation did not fit (the run ends there).
        self.oom = None
        #: One of GenAI's checks threw out of ``step()`` (cache eviction, simkv.serving.sched.eviction):
        #: {"step", "check", "reason"} of that step (the run ends there).
        self.runtime_stop = None
        #: The largest bytes the pools held inside a (re)allocating step, the CPU plugin's scratch left out.
        self.resident_peak = 0
        self.sampled = 0  # tokens generated so far, all requests (progress, for the stall check)
        self.preempted_total = 0
        if longest is None:
            longest = max(p + r.max_new_tokens for p, r in zip(self.prompts, reqs))
        self.stall_limit = max(self.stall_steps, 4 * longest)
        self.progress_mark, self.progress_step = -1, 0
        #: Steps starting at or after this time are not taken (:meth:`advance`).
        self.limit = float("inf")
        #: A planned run with steps starting at or after ``limit`` and the arrivals that joined it, not yet carried
        #: out (a router reads it: simkv.serving.router).
        self.held = None
        self.plan_from, self.fails = 0, 0  # planned runs: the next step to try one at, failed tries in a row
        self.squeezing = False  # the last planned run was a squeezed one (:mod:`.squeezed`): try that first
        #: Every present request from this request index on is untouched: nothing scheduled, restored or freed yet
        #: (an overloaded pool's queue; planned runs carry such a tail without a row each: planned_run._present).
        self.cold = 0

    def add(self, req: Request, prompt: int, tokens=None) -> None:
        """A request routed here (arrivals in seconds, not before those given so far): it joins at the first
        step that starts at or after its arrival, as if it had been in ``requests`` from the start."""
        if self.cfg.cache_eviction is not None:
            check_request(req)
        self.requests.append(req)
        self.prompts.append(prompt)
        if self.tokens is not None:
            self.tokens.append(tokens)
            self.family.append(tokens[0])
            self.families[tokens[0]] += 1

    def _completions(self, live: list[Group]) -> None:
        """A closed loop: each request of ``live`` that ended in the steps just taken (in request order) sends the
        next request, at the time it ended (simkv.serving.closed_loop; a run of steps ends at the step in which the
        first one ends, so every request ended here ended at ``self.t``, but a FINISHED one's own time is used). With
        ``client.lag`` L > 1 it reaches the engine only after L − 1 more steps have ended (:meth:`_due`)."""
        for g in sorted((g for g in live if g.status != RUNNING), key=_index):
            t = g.finish_s if g.status == FINISHED else self.t
            for req, tokens in self.client.completed(t):
                if self.client.lag > 1:
                    self.deferred.append([self.client.lag - 1, t, req, tokens])
                else:
                    self.add(req, req.prompt, tokens)

    def steps_until_sent_arrive(self) -> int:
        """Steps until the first request a closed loop sent with a lag reaches the engine (:meth:`_due`): a planned
        run of steps ends there. :data:`planned_run.KMAX` when none is on its way."""
        return min((entry[0] for entry in self.deferred), default=planned_run.KMAX)

    def _due(self, steps: int | None) -> None:
        """A closed loop with a lag: ``steps`` more steps ended (None: the engine is idle, nothing is in flight);
        each sent request whose steps in flight have all ended now arrives (just after ``self.t``; its latencies count
        from when it was sent)."""
        due = []
        for entry in self.deferred:
            entry[0] = 0 if steps is None else entry[0] - steps
            if entry[0] <= 0:
                due.append(entry)
        if due:
            self.deferred = [e for e in self.deferred if e[0] > 0]
            arrival = math.nextafter(self.t, math.inf)
            for _, t, req, tokens in due:
                self.add(replace(req, arrival_s=max(arrival, req.arrival_s), sent_s=t), req.prompt, tokens)

    def solo(self, index: int) -> bool:
        """Prefix caching: ``requests[index]`` is the only request of its family (no other request's blocks can
        have the hash of one of its blocks: its prompt cannot be restored from them, nor theirs from its own)."""
        return self.families[self.family[index]] == 1

    @without_cycle_collection
    def advance(self, limit: float = float("inf")) -> None:
        """Take every step that starts before ``limit`` seconds (all of them: the run to its end). The last
        step taken may end after ``limit``; a step starting at ``limit`` waits for the requests that arrive
        then. Idempotent: called again with the same limit and no new request, it takes no step."""
        reqs = self.requests
        by_step = self.by_step
        bar = self.progress
        live = self.live
        self.limit = limit
        while (self.pending < len(reqs) or live or self.deferred) and self.stopped is None and self.oom is None:
            if self.deferred and not live and (self.pending >= len(reqs) or reqs[self.pending].arrival_s
                                               > math.nextafter(self.t, math.inf)):
                self._due(None)  # nothing in flight, nothing about to start: the sent requests arrive at once
            tokens_out = self.sampled + self.pending
            if tokens_out != self.progress_mark:
                self.progress_mark, self.progress_step = tokens_out, self.step
            too_many = self.max_preemptions is not None and self.preempted_total > self.max_preemptions
            if self.step >= self.max_steps or too_many or (live and self.step - self.progress_step > self.stall_limit):
                self.stopped = (f"stopped after {self.step:,} steps: {len(live)} requests never finish "
                                + ("(the step limit)" if self.step >= self.max_steps else
                                   f"(more than {self.max_preemptions:,} preemptions: the limit)" if too_many else
                                   f"(no token generated for {self.step - self.progress_step:,} steps: they keep "
                                   "preempting each other, as the real pipeline does)"))
                for g in live:
                    g.status = UNFINISHED
                break
            pending = self.pending
            if by_step:
                while pending < len(reqs) and reqs[pending].arrival_step <= self.step:
                    live.append(self._add(reqs[pending], pending))
                    pending += 1
            else:
                start = reqs[pending].arrival_s if not live and reqs[pending].arrival_s > self.t else self.t
                if start >= limit:
                    break
                self.t = start
                while pending < len(reqs) and reqs[pending].arrival_s <= self.t:
                    live.append(self._add(reqs[pending], pending))
                    pending += 1
            self.pending = pending
            joined = None
            steps_before = self.step
            if self.fast and live and self.step >= self.plan_from:
                # A full fixed pool keeps preempting: once a squeezed run (:mod:`.squeezed`) was planned where a
                # planned run was not, squeezed runs only (their states include a planned run's: the same pools)
                if self.vllm:
                    joined = self._vllm_run(live, pending)
                elif self.squeezing:
                    joined = self._squeezed_run(live, pending)
                else:
                    joined = self._run_of_steps(live, pending)
                    if joined is None:
                        joined = self._squeezed_run(live, pending)
                        self.squeezing = joined is not None
                # A failed plan costs more than the step it would have saved (a pool that keeps preempting: every
                # step the reference way). After f failures in a row, take min(2^(f-1), PLAN_BACKOFF) steps the
                # reference way before planning again: the same steps (the reference is the reference), cheaper.
                if joined != HELD:
                    self.fails = 0 if joined is not None else self.fails + 1
                    if self.fails:
                        self.plan_from = self.step + min(1 << min(self.fails - 1, 16), PLAN_BACKOFF)
            if joined is None:
                self._slow_step(live)
                if self.oom is not None:
                    self._stop_out_of_memory(live, self.pending)
                    break
                if self.runtime_stop is not None:
                    left = self._leave_unfinished(live, self.pending)
                    self.stopped = f"{self.runtime_stop['reason']}; {left:,} requests left unfinished"
                    break
                if self.client is not None:
                    self._due(1)
                    self._completions(live)
                live[:] = [g for g in live if g.status == RUNNING]
            elif joined == HELD:
                break
            else:
                self.pending += joined
                pos = self.cold_pos(live)  # (an untouched request is running: only the others can have ended)
                if self.client is not None:
                    self._due(self.step - steps_before)
                    self._completions(live[:pos])
                live[:pos] = [g for g in live[:pos] if g.status == RUNNING]
            if bar is not None and not by_step:
                bar(self.pending)

    @without_cycle_collection
    def finish(self):
        """The run's results after :meth:`advance` to its end: the requests, the step table, their
        progress (``trace_requests``), and each step's seconds as :func:`simkv.cost.step_cost` gives them
        (0 for a step without a forward pass; every step's were checked against the loop's own)."""
        self._check_costs()
        if not self.solid:  # (a run shorter than a block keeps its rows as they were taken)
            steps = self._step_table(self.rows) if self.rows else np.zeros(0, dtype=STEP_TABLE)
        else:
            if self.loose:
                self._solidify()
            blocks = self.rows
            if len(blocks) == 1:
                steps = blocks[0]
            else:  # block by block, each freed once copied: the table is held about once
                steps = np.empty(sum(len(b) for b in blocks), dtype=STEP_TABLE)
                at = 0
                for i, b in enumerate(blocks):
                    steps[at : at + len(b)] = b
                    at += len(b)
                    blocks[i] = None
                self.rows = [steps]
                self.solid = 1
        seconds = np.concatenate(self.official) if len(self.official) > 1 else (
            self.official[0] if self.official else np.zeros(0))
        self.official = [seconds]
        prog = np.array(self.progress_rows, dtype=PROGRESS) if self.progress_rows else np.zeros(0, dtype=PROGRESS)
        return self.groups, steps, prog, seconds

    def _rows_added(self, steps: int) -> None:
        self.loose += steps
        if self.loose >= SOLID_STEPS:
            self._solidify()

    def _solidify(self) -> None:
        """The rows taken since the last block become one block of the step table (:attr:`rows`; a block reads
        like a planned run's columns), and their costs are checked: what a long run keeps per step is its row."""
        block = self._step_table(self.rows[self.solid :])
        self.rows[self.solid :] = [block]
        self.solid = len(self.rows)
        self.loose = 0
        self._check_costs()

    def _check_costs(self) -> None:
        """:func:`simkv.cost.step_cost` on the steps recorded since the last check, compared with the loop's own
        seconds (:meth:`StepTimer.official`, which checks every step it holds: it then holds none)."""
        if not self.est:
            return
        estimated = np.concatenate([np.atleast_1d(np.asarray(e, dtype=np.float64)) for e in self.est])
        self.est = []
        seconds, _ = self.timer.official(estimated)
        self.timer.chunks = []
        self.official.append(seconds)

    @staticmethod
    def _step_table(loose: list) -> np.ndarray:
        """A block of the step table from single-step tuples and planned runs, column by column: a column that is
        constant over a run is one value per run (repeated once at the end), others are arrays."""
        names = STEP_TABLE.names
        rows, singles = [], []
        for r in loose:  # consecutive single steps become one array (numpy converts the tuples at once)
            if isinstance(r, tuple):
                singles.append(r)
                continue
            if singles:
                rows.append(np.array(singles, dtype=STEP_TABLE))
                singles = []
            rows.append(r)
        if singles:
            rows.append(np.array(singles, dtype=STEP_TABLE))
        lens = [len(r) if isinstance(r, np.ndarray) else r["_n"] for r in rows]
        table = np.zeros(sum(lens), dtype=STEP_TABLE)
        for name in names:
            vals = [r[name] for r in rows]
            if not any(isinstance(v, np.ndarray) for v in vals):
                table[name] = np.repeat(np.array(vals, dtype=table.dtype[name]), lens)
            else:
                table[name] = np.concatenate([v if isinstance(v, np.ndarray) else np.full(n, v)
                                              for v, n in zip(vals, lens)])
        return table

    def cold_pos(self, live: list[Group]) -> int:
        """Where the untouched tail of ``live`` (request order) starts (:attr:`cold`)."""
        if not live or live[-1].index < self.cold:
            return len(live)
        return bisect_left(live, self.cold, key=_index)

    def _reached(self, live: list[Group]) -> list[Group]:
        """The requests a step can schedule (the fast path; the reference schedules ``live``): the untouched tail of
        a fixed pool's queue beyond the prompt tokens of one step's budget gets nothing — prompts are served in
        request order, an untouched one takes all it asks for unless the budget or the free blocks run out (then
        no later one gets any: ``_slots`` of an empty table is the free blocks' room) — and holds no block, is
        no victim and is not waiting. (A dynamic pool reserves for every prompt present.)"""
        cfg = self.cfg
        if self.sched.dynamic or not cfg.dynamic_split_fuse or not self.sched.simple:
            return live
        tail = self.cold_pos(live)
        reach = cfg.max_num_batched_tokens
        while tail < len(live) and reach > 0:
            reach -= live[tail].P
            tail += 1
        return live if tail == len(live) else live[:tail]

    # -- one step, the reference way ----------------------------------------------------------------

    def _slow_step(self, live: list[Group]) -> None:
        """One step the reference way (:mod:`.slow_path`): schedule, (re)allocate the pool's tensors,
        run the forward pass (its time from :mod:`simkv.cost`), sample, free what finished."""
        step, t = self.step, self.t
        part = self._reached(live) if self.fast else live
        before_pre = sum(g.preemptions for g in part)
        total, scheduled = self.sched.schedule(part) if live else (0, [])
        if scheduled:
            self.cold = max(self.cold, max(g.index for g in scheduled) + 1)
        preempted = sum(g.preemptions for g in part) - before_pre
        self.preempted_total += preempted
        state = self.state_pool
        new_state = state.total if state is not None else 0
        if self.pool.total != self.tensors.total or new_state != self.tensors.state_total:
            held = self.tensors.resident_peak(self.pool.total, new_state)
            if self.weights_bytes + held > self.device_memory:
                self.oom = {"step": step, "pool_blocks": self.pool.total, "held_bytes": held}
                return
            self.resident_peak = max(self.resident_peak, held)
        copied, peak = 0, self.tensors.total * self.block_bytes
        if self.pool.total != self.tensors.total:
            copied, peak = self.tensors.resize(step, self.pool.total, inference=total > 0)
        copied += self.sched.copies * self.block_bytes
        if state is not None:
            state_before = self.tensors.state_total * self.state_bytes
            peak += state_before
            if state.total != self.tensors.state_total:
                moved, state_peak = self.tensors.resize_state(step, state.total)
                copied += moved
                peak = max(peak, self.pool.total * self.block_bytes + state_peak)
            copied += self.sched.state_copies * self.state_bytes
        blocks_used = self.pool.used()
        state_used = state.used() if state is not None else 0
        if self.vllm:
            used_b = self.sched.data_bytes(part)
        elif self.sched.simple:
            internal = internal_slack(part, self.pool, self.bs)
            used_b = (blocks_used * self.bs - internal) * self.block_bytes // self.bs
        else:
            used0, used1 = used_bytes(part, self.sched)
            used_b = used0 + used1
        n_live = len(live)
        if total == 0:
            self.sampled += 1  # an outcome: progress
            ignore_all(live, self.sched, t, step)
            dt = 0.0
            self.timer.record_idle()
        else:
            new, pairs, kv_read, logits, decode_pairs = step_work(scheduled, self.work)
            if self.cfg.cache_eviction is not None:  # after the forward, before sampling (GenAI's order)
                stop = self.sched.evict(scheduled)
                if stop is not None:  # GenAI's step() throws here: the run ends without this step's row
                    check, where = stop
                    self.runtime_stop = {"step": step, "check": check,
                                         "reason": f"GenAI's step() throws at step {step:,} (cache eviction): "
                                                   f"\"{check}\" in {where}"}
                    return
            dt = self.timer.step(new, pairs, kv_read, copied, logits, decode_pairs)
        t += dt
        self.est.append(dt)
        finished, sampled = sample(scheduled, self.pool, t, step, self.side_pools)
        self.sampled += sampled
        if self.trace_requests:
            for g in live:
                self.progress_rows.append((step, g.req.id, g.generated, g.processed, g.status))
        self.sched.update(scheduled, finished)
        if self.observe is not None:
            self.observe(step, self, live)
        for g in finished:
            self.sched.free_group(g)
        allocated = self.pool.total * self.block_bytes
        in_use = blocks_used * self.block_bytes
        state_total = 0
        if state is not None:
            state_total = state.total
            allocated += state_total * self.state_bytes
            in_use += state_used * self.state_bytes
        self.rows.append((step, t, n_live, len(scheduled), blocks_used, self.pool.total, allocated, used_b, dt, total,
                          peak, allocated - in_use, in_use - used_b, copied, preempted, state_used, state_total))
        self.slow_steps += 1
        self._rows_added(1)
        self.t = t
        self.step = step + 1

    # -- a quiet run of steps at once --------------------------------------------------------------

    def _run_of_steps(self, live: list[Group], pending: int) -> int | None:
        """Plan the steps in which nothing but arithmetic happens, all at once (:mod:`.planned_run`),
        let arrivals join at the step the reference adds them (:mod:`.joins`), and carry the run out.
        Returns how many joined (they are appended to ``live``), or None when the present state does
        not allow a run of at least two steps."""
        if self.held is not None:  # a run held for the router: the requests routed here since join it
            run, joined = self.held
            self.held = None
            joined = joined + join(self, run, live, pending + len(joined), joined)
        else:
            run = planned_run.plan(self, live, pending)
            if not self.sched.simple:  # the next plan's horizon follows this one's length
                self.horizon = min(planned_run.KMAX, max(64, 2 * (run.K if run is not None else 0)))
            if run is None:
                return None
            joined = join(self, run, live, pending)
        if self.client is not None and run.fin and min(run.fin) + 1 < run.K:
            run.cut(min(run.fin) + 1)  # a closed loop: the run ends with the step in which a request ends
        if run.K < 2:
            return None
        if (run.times[:-1] >= self.limit).any():
            # Steps start at or after a router's next arrival, which may be routed here: the run is held, not
            # carried out, until the router has routed up to the start of its last step (a request routed
            # here joins it or cuts it, as an arrival known from the start would).
            self.held = (run, joined)
            return HELD
        self.groups.extend(joined)
        live.extend(joined)
        table, sampled = planned_run.commit(run, run.rows + joined, self.pool, self.sched.free_group, self.timer, self.block_bytes,
                                            self.bs, self.step, self)
        if run.moved is not None:  # requests the run scheduled are no longer untouched
            self.cold = max(self.cold, run.moved + 1)
        self._carried(table, sampled)
        return len(joined)

    def _vllm_run(self, live: list[Group], pending: int) -> int | None:
        """A quiet run of steps under vLLM's rules (:mod:`.vllm_run`), the arrivals inside it joining it or waiting
        through it, carried out; returns how many arrived (appended to ``live``), or None."""
        planned = vllm_run.plan(self, live, pending)
        if planned is None:
            return None
        run, joiners, admits = planned
        table, sampled = vllm_run.commit(self, run, joiners, admits, self.step)
        joined = [j.g for j in joiners]
        self.groups.extend(joined)
        live.extend(joined)
        if admits:  # requests the run scheduled are no longer untouched
            self.cold = max(self.cold, max(g.index for _, g, _ in admits) + 1)
        self._carried(table, sampled)
        return len(joined)

    def _carried(self, table: dict, sampled: int) -> None:
        """A run's steps taken: its step-table columns and costs recorded, the clock and the step moved on."""
        self.sampled += sampled
        self.rows.append(_rows_of(table))
        self.est.append(table["step_s"])
        self.t = float(table["time_s"][-1])
        self.step += table["_n"]
        self._rows_added(table["_n"])

    def _squeezed_run(self, live: list[Group], pending: int) -> int | None:
        """A full fixed pool's steps, decoders preempting the tail request (:mod:`.squeezed`), carried out;
        returns how many arrivals joined (appended to ``live``), or None."""
        out = squeezed.run(self, live, pending)
        if out is None:
            return None
        table, sampled, joined = out
        self.groups.extend(joined)
        live.extend(joined)
        self._carried(table, sampled)
        return len(joined)

    def _stop_out_of_memory(self, live: list[Group], pending: int) -> None:
        """The step ``self.oom`` names could not allocate its pool: GenAI's ``allocate_cache_if_needed`` throws out
        of ``step()`` (measured on the CPU path: ``std::bad_alloc``, the requests left RUNNING;
        experiments/genai_layer_kinds/README.md §1.3). The run ends before that step: every request present or still
        to come is UNFINISHED, and the step and the reason are reported (``simkv run``, ``--json``: ``oom``)."""
        from simkv.units import format_bytes

        left = self._leave_unfinished(live, pending)
        o = self.oom
        why = ("GenAI's CPU path grows a dynamic pool with no memory check (scheduler.hpp _try_increase_cache:769, "
               "_reserve_dynamic_capacity_for_active_sequences)" if self.memory_path == "cpu" else
               "GenAI reserves for arriving prompts with no memory check (scheduler.hpp "
               "_reserve_dynamic_capacity_for_active_sequences) and its GPU check bounds only the 256-token growth "
               "(utils.cpp get_available_gpu_memory, which wraps once 1.1 x used exceeds the total)")
        o["reason"] = (f"out of memory at step {o['step']:,}: reallocating the pool to {o['pool_blocks']:,} blocks holds "
                       f"{format_bytes(o['held_bytes'])} (the new tensors beside the old ones not yet freed) beside "
                       f"{format_bytes(self.weights_bytes)} of weights, more than the device's "
                       f"{format_bytes(self.device_memory)}; {why}, and the allocation throws out of step() "
                       f"(std::bad_alloc on Linux); {left:,} requests left unfinished")
        self.stopped = o["reason"]

    def _leave_unfinished(self, live: list[Group], pending: int) -> int:
        """The run ends here: every request present or still to come is UNFINISHED (those to come get their
        groups). Returns how many."""
        for g in live:
            g.status = UNFINISHED
        for index in range(pending, len(self.requests)):
            req = self.requests[index]
            g = Group(req, index, self.prompts[index])
            g.added_s = req.sent if req.arrival_s is not None else self.t
            g.added_step = req.arrival_step if req.arrival_step is not None else self.step
            g.status = UNFINISHED
            self.groups.append(g)
        return len(live) + len(self.requests) - pending

    def _add(self, req, index) -> Group:
        g = Group(req, index, self.prompts[index])
        g.added_s, g.added_step = (req.sent if req.arrival_s is not None else self.t), self.step
        self.sched.add_group(g, self.tokens[index] if self.tokens is not None else None)
        if g.tables[0]:  # restored blocks: not untouched
            self.cold = max(self.cold, index + 1)
        self.groups.append(g)
        return g

"""The serving step loop: requests arrive, the scheduler picks work, the memory model holds the KV,
the cost model times the step.

One iteration is one GenAI ``ContinuousBatchingImpl::step()``: pull the requests that
have arrived (``arrival_step`` ≤ this step, or ``arrival`` seconds ≤ the time the step
starts), schedule, read the metrics (blocks in use after scheduling, before finished
requests are freed), run the forward pass (its time from :mod:`simkv.cost`), sample,
free what finished. A step that schedules nothing marks every present request IGNORED.
With arrivals in seconds, an idle engine jumps to the next arrival; with
``arrival_step`` it takes idle steps, as a program calling ``step()`` in a loop does.
"""

from __future__ import annotations

import numpy as np

from simkv.errors import ConfigError
from simkv.ledger import ALLOC, COPY, FREE, PHASE_CODE, ROW, TENSOR_CODE, Ledger
from simkv.serving.costing import StepTimer, attended_pairs
from simkv.serving.paged import BlockPool
from simkv.serving.requests import Request
from simkv.serving.scheduler import (FINISHED, IGNORED, RUNNING, ContinuousScheduler, Group, PagedConfig,
                                     fork_samples, prepare_tokens)

GIB = 1024**3

#: The step table (``--steps``): the issue's contract columns, then extras.
STEP_COLUMNS = ("step", "time_s", "requests", "scheduled_requests", "blocks_used", "blocks_total",
                "allocated_bytes", "used_bytes")
STEP_TABLE = np.dtype([
    ("step", np.int64), ("time_s", np.float64), ("requests", np.int64), ("scheduled_requests", np.int64),
    ("blocks_used", np.int64), ("blocks_total", np.int64), ("allocated_bytes", np.int64), ("used_bytes", np.int64),
    # extras (library only)
    ("step_s", np.float64), ("scheduled_tokens", np.int64), ("peak_bytes", np.int64), ("reserved_bytes", np.int64),
    ("internal_bytes", np.int64), ("copy_bytes", np.int64), ("preemptions", np.int64),
])
#: Per-request progress (``trace_requests=True``): one row per live request per step.
PROGRESS = np.dtype([("step", np.int64), ("request", np.int64), ("generated", np.int64), ("processed", np.int64),
                     ("status", "U8")])


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
            own = shared + [(1, r.id, i) for i in range(r.prompt - len(shared))]
        toks = (history.get(r.session, []) if r.session else []) + own
        if r.session:
            history[r.session] = toks + [(3, r.id, 0, i) for i in range(r.max_new_tokens)]
        out.append(toks)
    return out


class PagedServing:
    """Continuous batching over a paged pool, step by step (GenAI's rules; see :mod:`.scheduler`)."""

    def __init__(self, requests: list[Request], model, precision, config: PagedConfig, *, device, weights_bytes: int,
                 device_memory: int, block_bytes: int | None = None, max_steps: int = 10_000_000,
                 trace_requests: bool = False, progress=None) -> None:
        self.requests = requests
        self.model, self.cfg = model, config
        self.bs = config.block_size
        self.kv_token = precision.kv_bytes_per_token(model)
        self.block_bytes = int(block_bytes) if block_bytes else self.kv_token * self.bs
        if self.bs <= 0 or self.block_bytes <= 0:
            raise ConfigError("block size and block bytes must be positive")
        budget = device_memory - weights_bytes
        if budget < self.block_bytes:
            raise ConfigError(f"no room for even one KV block: {device_memory:,} B device memory, "
                              f"{weights_bytes:,} B weights")
        self.max_blocks = budget // self.block_bytes
        if config.num_kv_blocks:
            fixed = config.num_kv_blocks
        elif config.cache_size_gib:
            fixed = int(config.cache_size_gib * GIB // self.block_bytes)
            if fixed <= 0:
                raise ConfigError(f"cache size {config.cache_size_gib} GiB holds no {self.block_bytes:,}-byte block")
        else:
            fixed = 0
        if fixed > self.max_blocks:
            raise ConfigError(f"a pool of {fixed:,} blocks ({fixed * self.block_bytes / GIB:.2f} GiB) does not fit "
                              f"the {budget / GIB:.2f} GiB the device has besides the weights")
        self.pool = BlockPool(fixed, config.enable_prefix_caching)
        self.sched = ContinuousScheduler(config, self.pool, dynamic=fixed == 0, max_blocks=self.max_blocks)
        self.timer = StepTimer(model, device, weights_bytes)
        self.window = model.sliding_window
        self.max_steps = max_steps
        self.trace_requests = trace_requests
        self.progress = progress
        self.ledger = Ledger()
        self.pool_total = 0  # blocks the pool tensors hold (ledger)
        self.pool_ids = (-1, -1)
        self.next_buffer = 0

    # -- pool tensors in the ledger ---------------------------------------------------------------

    def _pool_rows(self, step: int, new_total: int) -> tuple[int, int]:
        """Allocate the pool's 2·L tensors at ``new_total`` blocks; copy and free the old ones, layer by
        layer (K then V). Returns (bytes copied, peak bytes inside the step)."""
        L = self.model.layers
        per_k = self.block_bytes // (2 * L)
        per_v = self.block_bytes // L - per_k
        old = self.pool_total
        rows = np.zeros(L * 2 * (3 if old else 1), dtype=ROW)
        rows["step"], rows["phase"], rows["request"] = step, PHASE_CODE["decode"], -1
        i = 0
        for layer in range(L):
            for t, per in (("k", per_k), ("v", per_v + (self.block_bytes - L * (per_k + per_v)) * (layer == L - 1))):
                ops = [(ALLOC, new_total), (COPY, old), (FREE, old)] if old else [(ALLOC, new_total)]
                for op, blocks in ops:
                    r = rows[i]
                    r["layer"], r["tensor"], r["op"] = layer, TENSOR_CODE[t], op
                    r["bytes"] = blocks * per
                    r["capacity_tokens"] = (new_total if op != FREE else old) * self.bs
                    r["buffer"] = self.next_buffer if op != FREE else self.next_buffer - 2 * L
                    i += 1
                self.next_buffer += 1
        self.ledger.append(rows)
        self.pool_total = new_total
        copied = old * self.block_bytes
        peak = new_total * self.block_bytes + (old * max(per_k, per_v) if old else 0)
        return copied, peak

    # -- the loop ----------------------------------------------------------------------------------

    def run(self):
        reqs = self.requests
        by_step = reqs[0].arrival_step is not None
        prompts = session_prompts(reqs)
        tokens = prompt_token_ids(reqs) if self.cfg.enable_prefix_caching else None
        groups: list[Group] = []
        live: list[Group] = []
        pending = 0
        t = 0.0
        step = 0
        rows: list[tuple] = []
        progress_rows: list[tuple] = []
        est: list[float] = []
        preempt_total = 0
        bar = self.progress
        while pending < len(reqs) or live:
            if step >= self.max_steps:
                raise ConfigError(f"stopped after {self.max_steps:,} steps (raise max_steps)")
            if by_step:
                while pending < len(reqs) and reqs[pending].arrival_step <= step:
                    live.append(self._add(reqs[pending], pending, prompts, tokens, t, step, groups))
                    pending += 1
            else:
                if not live and reqs[pending].arrival_s > t:
                    t = reqs[pending].arrival_s
                while pending < len(reqs) and reqs[pending].arrival_s <= t:
                    live.append(self._add(reqs[pending], pending, prompts, tokens, t, step, groups))
                    pending += 1
            before_pre = sum(g.preemptions for g in live)
            total, scheduled = self.sched.schedule(live) if live else (0, [])
            preempted = sum(g.preemptions for g in live) - before_pre
            preempt_total += preempted
            copied, peak = 0, self.pool_total * self.block_bytes
            if self.pool.total != self.pool_total:
                copied, peak = self._pool_rows(step, self.pool.total)
            copied += self.sched.copies * self.block_bytes
            blocks_used = self.pool.used()
            internal = self._internal_slack(live)
            n_live = len(live)
            if total == 0:
                for g in live:  # nothing fits: GenAI marks every request out of memory
                    if g.status == RUNNING:
                        self.sched.free_group(g)
                        g.status = IGNORED
                        g.finish_s, g.finish_step = t, step
                dt = 0.0
                self.timer.step(0, 0, 0, 0, copied, 0)
            else:
                new = pairs = kv_read = kv_write = logits = 0
                for g in scheduled:
                    n, s, p = len(g.tables), g.scheduled, g.processed
                    new += n * s
                    pairs += n * attended_pairs(p, s, self.window)
                    ctx = p + s if self.window is None else min(p + s, self.window)
                    kv_read += n * ctx * self.kv_token
                    kv_write += n * s * self.kv_token
                    if p + s >= g.P and p + s > g.maxc:
                        logits += n
                dt = self.timer.step(new, pairs, kv_read, kv_write, copied, logits)
            t += dt
            est.append(dt)
            used_tokens = blocks_used * self.bs - internal
            finished = []
            for g in scheduled:
                ctx = g.processed + g.scheduled
                sample = ctx >= g.P and ctx > g.maxc
                g.processed = ctx
                g.maxc = max(g.maxc, ctx)
                g.scheduled = 0
                if sample:
                    if g.generated == 0:
                        g.first_token_s, g.first_token_step = t, step
                        fork_samples(self.pool, g)
                    if g.seq_tokens is not None:
                        for s, toks in enumerate(g.seq_tokens):
                            toks.append((3, g.req.id, s, g.generated))
                    g.generated += 1
                    if g.generated >= g.G:
                        g.status = FINISHED
                        g.finish_s, g.finish_step = t, step
                        finished.append(g)
            if self.trace_requests:
                for g in live:
                    progress_rows.append((step, g.req.id, g.generated, g.processed, g.status))
            for g in finished:
                self.sched.free_group(g)
            rows.append((step, t, n_live, len(scheduled), blocks_used, self.pool.total,
                         self.pool.total * self.block_bytes, used_tokens * self.block_bytes // self.bs,
                         dt, total, peak, (self.pool.total - blocks_used) * self.block_bytes,
                         internal * self.block_bytes // self.bs, copied, preempted))
            live = [g for g in live if g.status == RUNNING]
            step += 1
            if bar is not None and not by_step:
                bar(pending)
        steps = np.array(rows, dtype=STEP_TABLE) if rows else np.zeros(0, dtype=STEP_TABLE)
        estimated = np.asarray(est)
        seconds, cost = self.timer.official(estimated)
        prog = np.array(progress_rows, dtype=PROGRESS) if progress_rows else np.zeros(0, dtype=PROGRESS)
        return groups, steps, prog, cost

    def _add(self, req, index, prompts, tokens, t, step, groups) -> Group:
        g = Group(req, index, prompts[index])
        g.added_s, g.added_step = (req.arrival_s if req.arrival_s is not None else t), step
        if tokens is not None:
            prepare_tokens(g, tokens[index], self.bs)
            self.sched.restore(g)
        groups.append(g)
        return g

    def _internal_slack(self, live) -> int:
        """Unfilled slots of the blocks in use: only a sequence's last block can be partial
        (a block shared by several sequences counts once)."""
        slack = 0
        seen = set()
        bs = self.bs
        for g in live:
            if g.status != RUNNING:
                continue
            ctx = g.processed + g.scheduled
            tables = g.tables
            if len(tables) == 1:
                table = tables[0]
                if table:
                    if len(tables) == 1 and self.pool.ref[table[-1]] == 1:
                        slack += len(table) * bs - ctx
                    elif table[-1] not in seen:
                        seen.add(table[-1])
                        slack += len(table) * bs - ctx
                continue
            for table in tables:
                if table and table[-1] not in seen:
                    seen.add(table[-1])
                    slack += len(table) * bs - ctx
        return slack

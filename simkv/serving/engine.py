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
#: Longest run of steps planned at once (bounds the arrays of a plan).
KMAX = 512

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


def genai_block_bytes(model, precision, block_size: int) -> tuple[int, int]:
    """Bytes of one block in one layer's key and value cache tensors.

    u8 on the CPU plugin (shapes of the compiled paged model's ``key_cache.N`` / ``value_cache.N``
    inputs, read by ``simkv validate --paged``): keys are quantised by channel —
    ``[blocks, H_kv, block + 8, S]`` (an f32 scale and zero point per channel and block) — values
    by token — ``[blocks, H_kv, block, S + 8]``. Other precisions: ``block`` tokens of K or V data
    (and metadata per token, if the precision has any).
    """
    if precision.name == "u8":
        h, s = model.kv_heads, model.head_dim
        return h * (block_size + 8) * s, h * block_size * (s + 8)
    per_token = precision.data_bytes_per_token(model) + precision.meta_bytes_per_token(model)
    return block_size * per_token, block_size * per_token


class PagedServing:
    """Continuous batching over a paged pool, step by step (GenAI's rules; see :mod:`.scheduler`)."""

    def __init__(self, requests: list[Request], model, precision, config: PagedConfig, *, device, weights_bytes: int,
                 device_memory: int, block_bytes: int | None = None, tensor_block_bytes=None,
                 max_steps: int = 10_000_000,
                 trace_requests: bool = False, progress=None, observe=None) -> None:
        self.requests = requests
        self.model, self.cfg = model, config
        self.bs = config.block_size
        self.kv_token = precision.kv_bytes_per_token(model)
        if tensor_block_bytes is None and block_bytes:
            per = int(block_bytes) // (2 * model.layers)
            tensor_block_bytes = (per, int(block_bytes) // model.layers - per)
        self.k_block, self.v_block = tensor_block_bytes or genai_block_bytes(model, precision, self.bs)
        self.block_bytes = int(block_bytes) if block_bytes else model.layers * (self.k_block + self.v_block)
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
        #: ``observe(step, engine, live)`` after each reference step's sampling, before finished
        #: requests are freed (tests; the planned runs skip it: use ``run(fast=False)``).
        self.observe = observe
        self.ledger = Ledger()
        self.pool_total = 0  # blocks the pool tensors hold (ledger)
        self.pool_ids: dict = {}
        self.next_buffer = 0

    # -- pool tensors in the ledger ---------------------------------------------------------------

    def _pool_rows(self, step: int, new_total: int) -> tuple[int, int]:
        """(Re)allocate the pool's 2·L tensors at ``new_total`` blocks. Returns (bytes copied, in-step peak).

        Order measured on the real pipeline (memray, ``KVCacheManager::allocate_cache_if_needed``;
        notes/paged-mismatches.md): per layer ``+K_new +V_new (copy K, V) -K_old -V_old``; then
        (``PagedConfig.transient_buffers``, the CPU plugin) 2·L more buffers of the new tensors'
        sizes, allocated and freed in the same step — at the first allocation too — so the
        in-step peak is twice the new pool.
        """
        L = self.model.layers
        per_k, per_v = self.k_block, self.v_block
        last_v = per_v + self.block_bytes - L * (per_k + per_v)  # any remainder on the last V
        old = self.pool_total
        out = []

        def row(layer, tensor, op, nbytes, blocks, buffer):
            out.append((step, PHASE_CODE["decode"], -1, layer, TENSOR_CODE[tensor], op, nbytes, blocks * self.bs,
                        0, buffer))

        new_ids = {}
        for layer in range(L):
            sizes = (("k", per_k), ("v", last_v if layer == L - 1 else per_v))
            for t, per in sizes:
                new_ids[layer, t] = self.next_buffer
                row(layer, t, ALLOC, new_total * per, new_total, self.next_buffer)
                self.next_buffer += 1
            if old:
                for t, per in sizes:
                    row(layer, t, COPY, old * per, old, new_ids[layer, t])
                for t, per in sizes:
                    row(layer, t, FREE, old * per, old, self.pool_ids[layer, t])
        transient = []
        if self.cfg.transient_buffers:
            for layer in range(L):
                for t, per in (("k", per_k), ("v", last_v if layer == L - 1 else per_v)):
                    transient.append((layer, t, per, self.next_buffer))
                    row(layer, t, ALLOC, new_total * per, new_total, self.next_buffer)
                    self.next_buffer += 1
            for layer, t, per, buf in transient:
                row(layer, t, FREE, new_total * per, new_total, buf)
        self.ledger.append(np.array(out, dtype=ROW))
        self.pool_ids = new_ids
        self.pool_total = new_total
        new_bytes = new_total * self.block_bytes
        peak = new_bytes + old * (per_k + max(per_v, last_v))
        if transient:
            peak = max(peak, 2 * new_bytes)
        return old * self.block_bytes, peak

    # -- the loop ----------------------------------------------------------------------------------

    def run(self, fast: bool = True):
        """Simulate every step. ``fast`` plans quiet runs of steps at once (:meth:`_run_of_steps`);
        ``fast=False`` is the step-by-step reference, and the two give identical results."""
        reqs = self.requests
        by_step = reqs[0].arrival_step is not None
        self.prompts = session_prompts(reqs)
        self.tokens = prompt_token_ids(reqs) if self.cfg.enable_prefix_caching else None
        self.groups: list[Group] = []
        live: list[Group] = []
        pending = 0
        self.t = 0.0
        self.step = 0
        self.rows: list = []
        self.progress_rows: list[tuple] = []
        self.est: list = []
        bar = self.progress
        while pending < len(reqs) or live:
            if self.step >= self.max_steps:
                raise ConfigError(f"stopped after {self.max_steps:,} steps (raise max_steps)")
            if by_step:
                while pending < len(reqs) and reqs[pending].arrival_step <= self.step:
                    live.append(self._add(reqs[pending], pending))
                    pending += 1
                nxt = (reqs[pending].arrival_step, None) if pending < len(reqs) else (None, None)
            else:
                if not live and reqs[pending].arrival_s > self.t:
                    self.t = reqs[pending].arrival_s
                while pending < len(reqs) and reqs[pending].arrival_s <= self.t:
                    live.append(self._add(reqs[pending], pending))
                    pending += 1
                nxt = (None, reqs[pending].arrival_s) if pending < len(reqs) else (None, None)
            if not (fast and live and self._run_of_steps(live, *nxt)):
                self._slow_step(live)
            live = [g for g in live if g.status == RUNNING]
            if bar is not None and not by_step:
                bar(pending)
        steps = np.concatenate([np.asarray(r, dtype=STEP_TABLE).reshape(-1) if isinstance(r, tuple) else r
                                for r in self._row_blocks()]) if self.rows else np.zeros(0, dtype=STEP_TABLE)
        estimated = np.concatenate([np.atleast_1d(np.asarray(e, dtype=np.float64)) for e in self.est])
        _, cost = self.timer.official(estimated)
        prog = np.array(self.progress_rows, dtype=PROGRESS) if self.progress_rows else np.zeros(0, dtype=PROGRESS)
        return self.groups, steps, prog, cost

    def _row_blocks(self):
        """Step rows: consecutive single-step tuples packed together, then the planned blocks."""
        singles = []
        for r in self.rows:
            if isinstance(r, tuple):
                singles.append(r)
                continue
            if singles:
                yield np.array(singles, dtype=STEP_TABLE)
                singles = []
            yield r
        if singles:
            yield np.array(singles, dtype=STEP_TABLE)

    # -- one step, the reference way ----------------------------------------------------------------

    def _slow_step(self, live: list[Group]) -> None:
        step, t = self.step, self.t
        before_pre = sum(g.preemptions for g in live)
        total, scheduled = self.sched.schedule(live) if live else (0, [])
        preempted = sum(g.preemptions for g in live) - before_pre
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
            self.timer.record_idle()
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
        self.est.append(dt)
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
                self.progress_rows.append((step, g.req.id, g.generated, g.processed, g.status))
        if self.observe is not None:
            self.observe(step, self, live)
        for g in finished:
            self.sched.free_group(g)
        self.rows.append((step, t, n_live, len(scheduled), blocks_used, self.pool.total,
                          self.pool.total * self.block_bytes, used_tokens * self.block_bytes // self.bs,
                          dt, total, peak, (self.pool.total - blocks_used) * self.block_bytes,
                          blocks_used * self.block_bytes - used_tokens * self.block_bytes // self.bs, copied, preempted))
        self.t = t
        self.step = step + 1

    # -- a quiet run of steps at once --------------------------------------------------------------

    def _run_of_steps(self, live: list[Group], next_step: int | None, next_s: float | None) -> bool:
        """Plan the steps in which nothing but arithmetic happens, all at once.

        Such a run: every generating sequence decodes one token per step, the first
        request in its prompt phase takes the rest of the token budget as a chunk, and
        every block needed is free. It ends with the step in which a request finishes or
        the prompt completes, before the step an arrival joins, before a step that would
        need more blocks than are free (that step goes the reference way: growth,
        preemption). Block ids are handed out in the reference order (per step: the
        generating requests in order, then the prompt chunk). False when the present
        state does not allow a run of at least two steps.
        """
        cfg = self.cfg
        if cfg.enable_prefix_caching or self.trace_requests or self.observe is not None:
            return False
        if not self.sched.initialized or self.pool.total != self.pool_total:
            return False  # the pool's tensors are (re)allocated in this step
        dec: list[Group] = []
        prm = None
        n_prompt = 0
        others_ctx = 0
        for g in live:
            if len(g.tables) != 1:
                return False
            if g.maxc >= g.P:
                if g.maxc != g.processed:
                    return False
                dec.append(g)
            else:
                n_prompt += 1
                if prm is None:
                    prm = g
                else:
                    others_ctx += g.processed
        nd = len(dec)
        budget = cfg.max_num_batched_tokens
        if nd > budget or (prm is not None and not cfg.dynamic_split_fuse):
            return False
        if self.sched.dynamic and prm is not None and self.sched._target_blocks(live) > self.pool.total:
            return False
        bs = self.bs
        r = budget - nd if prm is not None else 0
        K = min((g.G - g.generated for g in dec), default=KMAX)
        if prm is not None and r > 0:
            left = prm.P - prm.processed
            kc = -(-left // r)
            # the completing step stays out when its leftover budget goes to the next prompt
            # or the request forks into samples there
            K = min(K, kc - 1 if (n_prompt > 1 and left % r) or prm.n > 1 else kc)
        K = min(K, KMAX)
        if next_step is not None:
            K = min(K, next_step - self.step)
        if K < 2:
            return False
        ks = np.arange(K, dtype=np.int64)
        c = np.fromiter((g.processed for g in dec), dtype=np.int64, count=nd)
        nb = np.fromiter((len(g.tables[0]) for g in dec), dtype=np.int64, count=nd)
        ctx = c[:, None] + ks[None, :] + 1  # (nd, K) context after each step
        held = np.maximum(-(-ctx // bs), nb[:, None])
        dec_blocks = held.sum(axis=0)
        if prm is not None:
            p0, nbp = prm.processed, len(prm.tables[0])
            ctx_p = np.minimum(prm.P, p0 + (ks + 1) * r)
            s_p = np.diff(np.r_[p0, ctx_p])
            held_p = np.maximum(-(-ctx_p // bs), nbp)
        else:
            p0 = nbp = 0
            ctx_p = s_p = held_p = np.zeros(K, dtype=np.int64)
        base = self.pool.used() - int(nb.sum()) - nbp
        used = base + dec_blocks + held_p
        over = np.flatnonzero(used > self.pool.total)
        if len(over):
            K = int(over[0])
            if K < 2:
                return False
        # time of each step, then the cut at the next arrival
        win = self.window
        dctx = ctx[:, :K] if win is None else np.minimum(ctx[:, :K], win)
        ctx_sum = dctx.sum(axis=0)
        s_p, ctx_p, held_p, used = s_p[:K], ctx_p[:K], held_p[:K], used[:K]
        prev_p = ctx_p - s_p
        if win is None:
            pairs = ctx_sum + s_p * prev_p + s_p * (s_p + 1) // 2
            kvr = ctx_sum + ctx_p
        else:
            pairs = ctx_sum + np.array([attended_pairs(int(a), int(b), win) for a, b in zip(prev_p, s_p)], dtype=np.int64)
            kvr = ctx_sum + np.minimum(ctx_p, win)
        completes = (prm is not None) & (ctx_p >= (prm.P if prm is not None else 0)) & (prev_p < (prm.P if prm else 0))
        new = nd + s_p
        logits = nd + completes.astype(np.int64)
        sec = self.timer_preview(new, pairs, kvr * self.kv_token, new * self.kv_token, logits)
        times = np.cumsum(np.r_[self.t, sec])[1:]
        if next_s is not None:
            starts = np.r_[self.t, times[:-1]]
            late = np.flatnonzero(starts >= next_s)
            if len(late):
                K = int(late[0])
                if K < 2:
                    return False
        self._commit_run(live, dec, prm, K, held[:, :K], nb, held_p[:K], nbp, s_p[:K], ctx_p[:K], used[:K],
                         sec[:K], times[:K], new[:K], pairs[:K], kvr[:K], logits[:K], others_ctx, c)
        return True

    def timer_preview(self, new, pairs, kvr_bytes, kvw_bytes, logits):
        """Step seconds without recording them (a plan may be cut)."""
        x = tuple(np.asarray(v, dtype=np.float64) for v in (new, pairs, kvr_bytes, kvw_bytes, np.zeros(len(new)), logits))
        return self.timer._eval(x)

    def _commit_run(self, live, dec, prm, K, held, nb, held_p, nbp, s_p, ctx_p, used, sec, times, new, pairs, kvr,
                    logits, others_ctx, c) -> None:
        pool, bs, step0 = self.pool, self.bs, self.step
        # blocks, in the reference order: per step the generating requests in order, then the prompt
        inc = np.diff(np.concatenate([nb[:, None], held], axis=1), axis=1)  # (nd, K)
        kk, ii = np.nonzero(inc.T)
        inc_p = np.diff(np.r_[nbp, held_p])
        if prm is not None and inc_p.any():
            pk = np.flatnonzero(inc_p)
            order = np.argsort(np.r_[kk * 2, pk * 2 + 1], kind="stable")
            who = np.r_[ii, np.full(len(pk), -1)][order]
            cnt = np.r_[inc.T[kk, ii], inc_p[pk]][order]
        else:
            who, cnt = ii, inc.T[kk, ii]
        tables = [g.tables[0] for g in dec]
        ptable = prm.tables[0] if prm is not None else None
        alloc = pool.allocate
        for w, n in zip(who.tolist(), cnt.tolist()):
            table = ptable if w < 0 else tables[w]
            for _ in range(n):
                table.append(alloc(None))
        # state after the run
        for i, g in enumerate(dec):
            g.processed = g.maxc = int(c[i]) + K
            g.generated += K
        finished = [g for g in dec if g.generated >= g.G]
        for g in finished:
            g.status = FINISHED
            g.finish_s, g.finish_step = float(times[-1]), step0 + K - 1
        if prm is not None:
            prm.processed = int(ctx_p[-1])
            prm.maxc = max(prm.maxc, prm.processed)
            if prm.processed >= prm.P and prm.generated == 0:
                prm.generated = 1
                prm.first_token_s, prm.first_token_step = float(times[-1]), step0 + K - 1
                if prm.generated >= prm.G:
                    prm.status = FINISHED
                    prm.finish_s, prm.finish_step = float(times[-1]), step0 + K - 1
                    finished.append(prm)
        # the step table
        ctx_total = (np.sum(c) + (np.arange(K) + 1) * len(dec)) + ctx_p + others_ctx
        internal = used * bs - ctx_total
        block = np.zeros(K, dtype=STEP_TABLE)
        block["step"] = step0 + np.arange(K)
        block["time_s"] = times
        block["requests"] = len(live)
        block["scheduled_requests"] = len(dec) + (s_p > 0)
        block["blocks_used"] = used
        block["blocks_total"] = pool.total
        block["allocated_bytes"] = block["peak_bytes"] = pool.total * self.block_bytes
        block["used_bytes"] = (used * bs - internal) * self.block_bytes // bs
        block["step_s"] = sec
        block["scheduled_tokens"] = new
        block["reserved_bytes"] = (pool.total - used) * self.block_bytes
        block["internal_bytes"] = used * self.block_bytes - block["used_bytes"]
        self.rows.append(block)
        self.timer.steps(new, pairs, kvr * self.kv_token, new * self.kv_token, np.zeros(K), logits)
        self.est.append(sec)
        for g in finished:
            self.sched.free_group(g)
        self.t = float(times[-1])
        self.step = step0 + K

    def _add(self, req, index) -> Group:
        g = Group(req, index, self.prompts[index])
        g.added_s, g.added_step = (req.arrival_s if req.arrival_s is not None else self.t), self.step
        if self.tokens is not None:
            prepare_tokens(g, self.tokens[index], self.bs)
            self.sched.restore(g)
        self.groups.append(g)
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

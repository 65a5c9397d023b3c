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

from dataclasses import dataclass

import numpy as np

from simkv.errors import ConfigError
from simkv.serving.costing import StepTimer, attended_pairs
from simkv.serving.paged import BlockPool
from simkv.serving.pool_tensors import PoolTensors
from simkv.serving.requests import Request
from simkv.serving.scheduler import (FINISHED, IGNORED, RUNNING, UNFINISHED, ContinuousScheduler, Group, PagedConfig,
                                     fork_samples, prepare_tokens)

GIB = 1024**3
#: Longest run of steps planned at once (bounds the arrays of a plan).
KMAX = 512
#: Arrivals that may join one planned run.
JOINS_PER_RUN = 32


def _prompt_share(room: np.ndarray, left: int, G: int) -> tuple[np.ndarray, tuple[int, int] | None]:
    """A prompt's tokens per step, taking the budget left in each step (``room``) until ``left`` are
    scheduled, and the steps of its first decode and last token (None while it is still in its prompt)."""
    cum = np.cumsum(room)
    got = np.diff(np.concatenate(([0], np.minimum(cum, left))))
    if cum[-1] < left:
        return got, None
    kc = int(np.argmax(cum >= left))
    return got, (kc + 1, kc + G - 1)  # first token at kc, G - 1 more


@dataclass
class _Run:
    """A planned run of ``K`` steps: per-request rows (lists, one entry per request) and per-step sums."""

    K: int
    tok: list  # tokens scheduled (matrices of rows x steps, then one row per newcomer)
    ctx: list  # tokens processed after each step
    held: list  # blocks held
    alive: list  # present and holding blocks
    sampled: list  # a token sampled
    nb: list  # blocks held at the start
    fin: list  # step of the last token (>= K: not in this run)
    start: list  # first decode step
    dec: list  # generating at the start
    nd: np.ndarray  # decoders per step
    taken: np.ndarray  # prompt tokens per step
    used: np.ndarray  # blocks in use per step
    new: np.ndarray
    pairs: np.ndarray
    kvr: np.ndarray
    logits: np.ndarray
    decode_pairs: np.ndarray | None
    sec: np.ndarray | None = None
    times: np.ndarray | None = None

    def cut(self, k: int) -> None:
        """Keep the first ``k`` steps (or fewer): the per-step arrays now, the rows when committed."""
        if k >= self.K:
            return
        self.K = k
        for name in ("nd", "taken", "used", "new", "pairs", "kvr", "logits", "decode_pairs", "sec", "times"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[:k])

    def add_row(self, tok, ctx, held, alive, sampled, fin: int, start: int) -> None:
        for rows, row in ((self.tok, tok), (self.ctx, ctx), (self.held, held), (self.alive, alive), (self.sampled, sampled)):
            rows.append(row[None, :])
        self.nb.append(0)
        self.fin.append(fin)
        self.start.append(start)
        self.dec.append(False)
#: A run stops when no token has been generated for this many steps (or 4x the longest request):
#: requests that keep preempting each other (a sample group larger than the pool) never finish.
STALL_STEPS = 10_000

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
                 trace_requests: bool = False, progress=None, observe=None, stall_steps: int = STALL_STEPS,
                 max_preemptions: int | None = None) -> None:
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
        self.timer = StepTimer(model, device, weights_bytes, self.kv_token)
        self.window = model.sliding_window
        #: Sliding-window models keep only the blocks of their window (PagedConfig.window_blocks).
        self.window_blocks = self.window is not None and config.window_blocks
        self.max_steps = max_steps
        self.stall_steps = stall_steps
        #: Stop once more preemptions than this happened (a bound for searches: such runs take the slow path).
        self.max_preemptions = max_preemptions
        self.trace_requests = trace_requests
        self.progress = progress
        #: ``observe(step, engine, live)`` after each reference step's sampling, before finished
        #: requests are freed (tests; the planned runs skip it: use ``run(fast=False)``).
        self.observe = observe
        self.tensors = PoolTensors(model.layers, self.k_block, self.v_block, self.block_bytes, self.bs,
                                   config.transient_buffers)
        self.ledger = self.tensors.ledger

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
        self.stopped = None
        self.sampled = 0  # tokens generated so far, all requests (progress, for the stall check)
        self.preempted_total = 0
        longest = max(p + r.max_new_tokens for p, r in zip(self.prompts, reqs))
        stall_limit = max(self.stall_steps, 4 * longest)
        progress_mark, progress_step = -1, 0
        while pending < len(reqs) or live:
            tokens_out = self.sampled + pending
            if tokens_out != progress_mark:
                progress_mark, progress_step = tokens_out, self.step
            too_many = self.max_preemptions is not None and self.preempted_total > self.max_preemptions
            if self.step >= self.max_steps or too_many or (live and self.step - progress_step > stall_limit):
                self.stopped = (f"stopped after {self.step:,} steps: {len(live)} requests never finish "
                                + ("(the step limit)" if self.step >= self.max_steps else
                                   f"(more than {self.max_preemptions:,} preemptions: the limit)" if too_many else
                                   f"(no token generated for {self.step - progress_step:,} steps: they keep "
                                   "preempting each other, as the real pipeline does)"))
                for g in live:
                    g.status = UNFINISHED
                break
            if by_step:
                while pending < len(reqs) and reqs[pending].arrival_step <= self.step:
                    live.append(self._add(reqs[pending], pending))
                    pending += 1
            else:
                if not live and reqs[pending].arrival_s > self.t:
                    self.t = reqs[pending].arrival_s
                while pending < len(reqs) and reqs[pending].arrival_s <= self.t:
                    live.append(self._add(reqs[pending], pending))
                    pending += 1
            joined = self._run_of_steps(live, pending) if fast and live else None
            if joined is None:
                self._slow_step(live)
            else:
                pending += joined
            live = [g for g in live if g.status == RUNNING]
            if bar is not None and not by_step:
                bar(pending)
        steps = self._step_table() if self.rows else np.zeros(0, dtype=STEP_TABLE)
        estimated = np.concatenate([np.atleast_1d(np.asarray(e, dtype=np.float64)) for e in self.est])
        _, cost = self.timer.official(estimated)
        prog = np.array(self.progress_rows, dtype=PROGRESS) if self.progress_rows else np.zeros(0, dtype=PROGRESS)
        return self.groups, steps, prog, cost

    def _step_table(self) -> np.ndarray:
        """The step table from single-step tuples and planned runs, column by column: a column that is
        constant over a run is one value per run (repeated once at the end), others are arrays."""
        names = STEP_TABLE.names
        lens = [1 if isinstance(r, tuple) else r["_n"] for r in self.rows]
        table = np.zeros(sum(lens), dtype=STEP_TABLE)
        for i, name in enumerate(names):
            vals = [r[i] if isinstance(r, tuple) else r[name] for r in self.rows]
            if not any(isinstance(v, np.ndarray) for v in vals):
                table[name] = np.repeat(np.array(vals, dtype=table.dtype[name]), lens)
            else:
                table[name] = np.concatenate([v if isinstance(v, np.ndarray) else np.full(n, v)
                                              for v, n in zip(vals, lens)])
        return table

    # -- one step, the reference way ----------------------------------------------------------------

    def _slow_step(self, live: list[Group]) -> None:
        step, t = self.step, self.t
        before_pre = sum(g.preemptions for g in live)
        total, scheduled = self.sched.schedule(live) if live else (0, [])
        preempted = sum(g.preemptions for g in live) - before_pre
        self.preempted_total += preempted
        copied, peak = 0, self.tensors.total * self.block_bytes
        if self.pool.total != self.tensors.total:
            copied, peak = self.tensors.resize(step, self.pool.total, inference=total > 0)
        copied += self.sched.copies * self.block_bytes
        blocks_used = self.pool.used()
        internal = self._internal_slack(live)
        n_live = len(live)
        if total == 0:
            self.sampled += 1  # an outcome: progress
            for g in live:  # nothing fits: GenAI marks every request out of memory
                if g.status == RUNNING:
                    self.sched.free_group(g)
                    g.status = IGNORED
                    g.finish_s, g.finish_step = t, step
            dt = 0.0
            self.timer.record_idle()
        else:
            new = pairs = kv_read = logits = decode_pairs = 0
            for g in scheduled:
                n, s, p = len(g.tables), g.scheduled, g.processed
                new += n * s
                attended = n * attended_pairs(p, s, self.window)
                pairs += attended
                if s == 1:  # a one-token query (simkv.cost: decode_pairs)
                    decode_pairs += attended
                kv_read += n * (p + s if self.window is None else min(p + s, self.window))  # tokens read
                if p + s >= g.P and p + s > g.maxc:
                    logits += n
            dt = self.timer.step(new, pairs, kv_read, copied, logits, decode_pairs)
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
                self.sampled += 1
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
        if self.window_blocks:
            for g in scheduled:
                if g.status == RUNNING:
                    self.sched.drop_outside_window(g, self.window)
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

    def _run_of_steps(self, live: list[Group], pending: int) -> int | None:
        """Plan the steps in which nothing but arithmetic happens, all at once.

        In such a run every generating sequence decodes one token per step and the requests
        in their prompt phase share the rest of the token budget in request order (a prompt
        that completes starts decoding the next step; one that finishes leaves, its blocks
        freed), and every block needed is free. The run ends before a step that would need
        more blocks than are free or more decode tokens than the budget (that step goes the
        reference way: growth, preemption). Block ids are handed out and freed in the
        reference order.

        Arrivals join the run at the step the reference adds them (:meth:`_join`). Returns how
        many did (they are appended to ``live``), or None when the present state does not
        allow a run of at least two steps.
        """
        cfg, sched, pool = self.cfg, self.sched, self.pool
        if cfg.enable_prefix_caching or self.trace_requests or self.observe is not None or not cfg.dynamic_split_fuse:
            return None
        if not sched.initialized or pool.total != self.tensors.total:
            return None  # the pool's tensors are (re)allocated in this step
        if self.window_blocks and any(g.P + g.G > self.window for g in live):
            return None  # blocks leave the window: step by step
        n = len(live)
        proc = np.empty(n, dtype=np.int64)
        P = np.empty(n, dtype=np.int64)
        G = np.empty(n, dtype=np.int64)
        gen = np.empty(n, dtype=np.int64)
        nb = np.empty(n, dtype=np.int64)
        prompt_phase = False
        for j, g in enumerate(live):
            if len(g.tables) != 1:
                return None
            if g.maxc >= g.P:
                if g.maxc != g.processed:
                    return None
            else:
                if g.n > 1:
                    return None  # forks at the end of its prompt
                prompt_phase = True
            proc[j], P[j], G[j], gen[j], nb[j] = g.processed, g.P, g.G, g.generated, len(g.tables[0])
        if sched.dynamic and prompt_phase and min(sched._target_blocks(live), sched.max_blocks) > pool.total:
            return None  # the reference step raises the dynamic pool first
        budget, bs = cfg.max_num_batched_tokens, self.bs
        reqs, by_step = self.requests, self.requests[0].arrival_step is not None
        K = KMAX
        ahead = pending + JOINS_PER_RUN  # the run ends before this arrival at the latest
        if ahead < len(reqs):
            if by_step:
                K = min(K, reqs[ahead].arrival_step - self.step)
            elif self.timer.min_seconds > 0:  # no step is shorter than the weights' streaming
                K = min(K, int((reqs[ahead].arrival_s - self.t) / self.timer.min_seconds) + 2)
        if K < 2:
            return None
        ks = np.arange(K, dtype=np.int64)
        dec = proc >= P  # generating at the start (all prompts of decoders are processed)
        # step of each request's last token (decoders: G - generated more steps); prompts: found below
        fin = np.where(dec, G - gen - 1, K)
        start = np.where(dec, 0, K)  # first decode step
        tok = np.zeros((n, K), dtype=np.int64)  # tokens scheduled per request and step
        active_dec = (ks[None, :] >= start[:, None]) & (ks[None, :] <= fin[:, None])
        q_idx = np.flatnonzero(~dec)
        taken = np.zeros(K, dtype=np.int64)  # prompt tokens given to earlier requests in the queue
        nd = active_dec.sum(axis=0)  # decoders per step
        for q in q_idx.tolist():  # in request order: a completed prompt decodes from the next step on
            room = budget - nd - taken
            if (room < 0).any():
                K = int(np.argmax(room < 0))
                if K < 2:
                    return None
                break
            got, decodes = _prompt_share(room, P[q] - proc[q], G[q])
            tok[q] = got
            taken += got
            if decodes is None:
                break  # it takes all the budget left (or there is none): nobody after it gets tokens
            start[q], fin[q] = decodes
            active_dec[q] = (ks >= start[q]) & (ks <= fin[q])
            nd = nd + active_dec[q]
        K = min(K, int(fin.max()) + 1)  # nothing left to run after the last request finishes
        over = nd > budget
        if over.any():
            K = min(K, int(over.argmax()))
        if K < 2:
            return None
        tok += active_dec
        tok, active_dec, ks = tok[:, :K], active_dec[:, :K], ks[:K]
        ctx = proc[:, None] + np.cumsum(tok, axis=1)  # tokens processed after each step
        alive = ks[None, :] <= fin[:, None]  # holds blocks at the step (freed after its last)
        held = np.maximum((ctx + (bs - 1)) // bs, nb[:, None]) * alive
        base = pool.used() - int(nb.sum())
        used = base + held.sum(axis=0)
        bad = used > pool.total
        if bad.any():
            K = int(bad.argmax())
            if K < 2:
                return None
        pairs_m, seen = self._pairs_and_reads(tok, ctx)
        sampled = (tok > 0) & (ctx >= P[:, None])  # a token is sampled (ctx passes maxc: see eligibility)
        run = _Run(K=K, tok=[tok[:, :K]], ctx=[ctx[:, :K]], held=[held[:, :K]], alive=[alive[:, :K]], sampled=[sampled[:, :K]],
                   nb=nb.tolist(), fin=fin.tolist(), start=start.tolist(), dec=dec.tolist(), nd=nd[:K], taken=taken[:K],
                   used=used[:K], new=tok.sum(axis=0)[:K], pairs=pairs_m.sum(axis=0)[:K], kvr=seen.sum(axis=0)[:K],
                   logits=sampled.sum(axis=0)[:K],
                   decode_pairs=(np.add.reduce(np.where(tok == 1, pairs_m, 0), axis=0)[:K]
                                 if self.timer.decode_rate_differs else None))
        self._time(run)
        joined = self._join(run, live, pending, by_step, ahead)
        if run.K < 2:
            return None
        self.groups.extend(joined)
        live.extend(joined)
        self._commit_run(live, run)
        return len(joined)

    def _pairs_and_reads(self, tok: np.ndarray, ctx: np.ndarray):
        """Attended pairs and KV tokens read of each entry of ``tok`` (tokens scheduled, window-capped)."""
        prev = ctx - tok
        win = self.window
        if win is None:
            return tok * prev + tok * (tok + 1) // 2, np.where(tok > 0, ctx, 0)
        first = np.maximum(0, win - prev)
        fit = np.minimum(first, tok)
        over_w = tok - fit
        st_ = prev + fit + 1 - win
        pairs = tok * prev + tok * (tok + 1) // 2 - np.where(over_w > 0, over_w * st_ + over_w * (over_w - 1) // 2, 0)
        return pairs, np.where(tok > 0, np.minimum(ctx, win), 0)

    def _time(self, run: _Run) -> None:
        """Each step's seconds and the time at its end (``t`` plus the seconds, added one by one as the
        reference adds them)."""
        run.sec = self.timer.steps(run.new, run.pairs, run.kvr, run.logits,
                                   0 if run.decode_pairs is None else run.decode_pairs)
        times = np.empty(len(run.sec) + 1)
        times[0] = self.t
        times[1:] = run.sec
        run.times = np.cumsum(times, out=times)[1:]

    def _join(self, run: _Run, live: list[Group], pending: int, by_step: bool, ahead: int) -> list[Group]:
        """Let arrivals join ``run`` at the step the reference adds them, or end it there.

        A newcomer is last in the queue: it takes only the budget the others leave and changes
        nobody's tokens (prompts complete in request order, so it never decodes ahead of an
        earlier prompt); its row is planned like any prompt's, from its step on. The run ends
        at an arrival the reference treats otherwise: dynamic pool growth, forked samples, a
        sliding window, no one else present (a jump in time), or a run that must end there."""
        reqs, sched, pool = self.requests, self.sched, self.pool
        budget, bs, total = self.cfg.max_num_batched_tokens, self.bs, pool.total
        joined: list[Group] = []
        for index in range(pending, len(reqs)):
            req = reqs[index]
            if by_step:
                k = req.arrival_step - self.step
            else:  # step k starts at times[k - 1]: the first step starting at or after the arrival
                late = run.times[:-1] >= req.arrival_s
                k = int(late.argmax()) + 1 if late.any() else run.K
            if k >= run.K:
                break  # arrives after the run
            g = Group(req, index, self.prompts[index])
            here = [h for h, f in zip(live + joined, run.fin) if f >= k]  # present at step k
            if (index >= ahead or g.n > 1 or not here or (self.window_blocks and g.P + g.G > self.window)
                    or (sched.dynamic and min(sched._target_blocks(here + [g]), sched.max_blocks) > total)):
                run.cut(k)
                break
            K = run.K
            ks = np.arange(K, dtype=np.int64)
            room = budget - run.nd - run.taken
            neg = room < 0
            if neg.any():
                K = int(neg.argmax())
            got, decodes = _prompt_share(np.where(ks >= k, np.maximum(room, 0), 0), g.P, g.G)  # nothing before it arrives
            start, fin = decodes or (KMAX, KMAX)  # else still in its prompt when the run ends
            decoding = (ks >= start) & (ks <= fin)
            nd = run.nd + decoding
            over = nd > budget
            if over.any():
                K = min(K, int(over.argmax()))
            tok = got + decoding
            ctx = np.cumsum(tok)
            alive = (ks >= k) & (ks <= fin)
            held = (ctx + (bs - 1)) // bs * alive
            used = run.used + held
            bad = used > total
            if bad.any():
                K = min(K, int(bad.argmax()))
            if K <= k:
                run.cut(k)
                break
            pairs, seen = self._pairs_and_reads(tok, ctx)
            sampled = (tok > 0) & (ctx >= g.P)
            run.add_row(tok, ctx, held, alive, sampled, fin, start)
            run.nd, run.taken, run.used = nd, run.taken + got, used
            run.new, run.pairs, run.kvr, run.logits = run.new + tok, run.pairs + pairs, run.kvr + seen, run.logits + sampled
            if run.decode_pairs is not None:
                run.decode_pairs = run.decode_pairs + np.where(tok == 1, pairs, 0)
            self._time(run)
            run.cut(K)
            g.added_s = req.arrival_s if req.arrival_s is not None else float(run.times[k - 1])
            g.added_step = self.step + k
            joined.append(g)
        return joined

    def _commit_run(self, live: list[Group], run: _Run) -> None:
        K, nb, fin, start = run.K, np.array(run.nb, dtype=np.int64), np.array(run.fin), run.start
        tok, ctx, held, alive, sampled = (np.vstack([part[:, :K] for part in rows])
                                          for rows in (run.tok, run.ctx, run.held, run.alive, run.sampled))
        used, sec, times, dec = run.used[:K], run.sec[:K], run.times[:K], np.array(run.dec)
        new, pairs, kvr, logits = run.new[:K], run.pairs[:K], run.kvr[:K], run.logits[:K]
        decode_pairs = 0 if run.decode_pairs is None else run.decode_pairs[:K]
        pool, bs, step0 = self.pool, self.bs, self.step
        # block events in the reference order: per step, decoders (request order), then prompt chunks,
        # then the frees of the requests that finished in that step
        inc = held.copy()
        inc[:, 1:] -= held[:, :-1]
        inc[:, 0] -= nb
        kk, jj = np.nonzero((inc > 0).T)  # (a drop is a free after the last step, handled below)
        counts = inc[jj, kk].tolist()
        st, fin_l = start, run.fin
        # sort key: step, kind (0 decode allocs, 1 prompt allocs, 2 frees), phase at that step
        # (0 decoding, 1 prompt chunk: a prompt finishing at its last chunk frees after the decoders), request
        events = [(k, 0 if k >= st[j] else 1, 0, j, c) for k, j, c in zip(kk.tolist(), jj.tolist(), counts)]
        events += [(f, 2, 0 if f >= st[j] else 1, j, -1) for j, f in enumerate(fin_l) if f < K]
        events.sort()
        alloc_many, free_group = pool.allocate_many, self.sched.free_group
        for _, _, _, j, c in events:
            g = live[j]
            if c < 0:
                free_group(g)
            else:
                g.tables[0].extend(alloc_many(c))
        # requests after the run
        ctx_end = ctx[:, -1].tolist()
        # A prompt's first token is the first one the run samples for it (with its last chunk); derived
        # from the samples themselves, so a prompt the run cuts short has none.
        firsts = sampled.argmax(axis=1).tolist()
        has_first = ((~dec) & sampled.any(axis=1)).tolist()
        gen_add = sampled.sum(axis=1).tolist()
        self.sampled += sum(gen_add)
        for j, g in enumerate(live):
            g.processed = ctx_end[j]
            g.maxc = max(g.maxc, g.processed)
            g.generated += gen_add[j]
            if has_first[j]:
                g.first_token_s, g.first_token_step = float(times[firsts[j]]), step0 + firsts[j]
            if fin[j] < K:
                g.status = FINISHED
                g.finish_s, g.finish_step = float(times[fin[j]]), step0 + int(fin[j])
        # the step table
        ctx_total = np.where(alive, ctx, 0).sum(axis=0)
        ks = np.arange(K)
        used_b = ctx_total * self.block_bytes // bs
        alloc_b = pool.total * self.block_bytes
        self.rows.append({
            "step": step0 + ks, "time_s": times, "requests": alive.sum(axis=0),
            "scheduled_requests": (tok > 0).sum(axis=0), "blocks_used": used, "blocks_total": pool.total,
            "allocated_bytes": alloc_b, "used_bytes": used_b, "step_s": sec, "scheduled_tokens": new,
            "peak_bytes": alloc_b, "reserved_bytes": (pool.total - used) * self.block_bytes,
            "internal_bytes": used * self.block_bytes - used_b, "copy_bytes": 0, "preemptions": 0, "_n": K,
        })
        self.timer.record(new, pairs, kvr, logits, decode_pairs)
        self.est.append(sec)
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

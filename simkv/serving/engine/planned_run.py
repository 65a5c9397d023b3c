"""A quiet run of serving steps, planned at once: the steps in which nothing but arithmetic happens.

In such a run every generating sequence decodes one token per step and the requests in
their prompt phase share the rest of the token budget in request order (a prompt that
completes starts decoding the next step; one that finishes leaves, its blocks freed), and
every block needed is free. The run ends before a step that would need more blocks than are
free or more decode tokens than the budget (that step goes the reference way: growth,
preemption). A run's per-request token, context and block matrices, its step costs (the
cost model's affine terms, vectorised) and its step table are array arithmetic; block ids
are then handed out and freed in the reference order (:func:`commit`). Arrivals join a run
at the step the reference adds them (:mod:`.joins`).

:func:`plan` reads the engine and changes nothing; the engine commits the :class:`Run`
(:meth:`simkv.serving.engine.PagedServing._run_of_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simkv.serving.engine import planned_eviction
from simkv.serving.sched.group import FINISHED

#: Longest run of steps planned at once (bounds the arrays of a plan).
KMAX = 512
#: Arrivals that may join one planned run.
JOINS_PER_RUN = 32


def prompt_share(room: np.ndarray, left: int, G: int) -> tuple[np.ndarray, tuple[int, int] | None]:
    """A prompt's tokens per step, taking the budget left in each step (``room``, never negative) until ``left``
    are scheduled, and the steps of its first decode and last token (None while it is still in its prompt)."""
    cum = np.add.accumulate(room)  # (np.cumsum's ufunc, without its dispatch)
    if cum[-1] < left:
        return room.copy(), None
    kc = int(cum.searchsorted(left))  # the first step by which it has them all
    got = np.zeros_like(room)
    got[:kc] = room[:kc]
    got[kc] = left - (cum[kc - 1] if kc else 0)
    return got, (kc + 1, kc + G - 1)  # first token at kc, G - 1 more


@dataclass
class Run:
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
    ahead: int  # the run ends before the arrival of requests[ahead] at the latest
    sec: np.ndarray | None = None
    times: np.ndarray | None = None
    #: A layout of several groups (simkv.serving.kv.groups): the state pool's blocks in use per step, and per
    #: group the present requests' table lengths at the start (newcomers start empty).
    used1: np.ndarray | None = None
    nbg: list | None = None
    #: The present requests with a row (in order; the newcomers' rows follow), and how many present requests after
    #: them have none: the untouched tail of a queue that no step of the run reaches (no token, no block).
    rows: list = None
    passive: int = 0
    #: After the commit: the largest request index the run scheduled a token for (None: none).
    moved: int | None = None
    #: GenAI's cache eviction (:mod:`.planned_eviction`): per row the tokens its blocks hold at each step's forward,
    #: and the blocks it drops after it (rows like ``tok``'s); None without eviction.
    kv: list | None = None
    drop: list | None = None

    def cut(self, k: int) -> None:
        """Keep the first ``k`` steps (or fewer): the per-step arrays now, the rows when committed."""
        if k >= self.K:
            return
        self.K = k
        for name in ("nd", "taken", "used", "new", "pairs", "kvr", "logits", "decode_pairs", "sec", "times", "used1"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[:k])

    def add_row(self, k: int, tok, ctx, held, alive, sampled, fin: int, start: int, kv=None, drop=None) -> None:
        """A newcomer's row from step ``k`` on (nothing before it: zeros when the matrices are built)."""
        for rows, row in ((self.tok, tok), (self.ctx, ctx), (self.held, held), (self.alive, alive), (self.sampled, sampled),
                          (self.kv, kv), (self.drop, drop)):
            if rows is not None:
                rows.append((k, row))
        self.nb.append(0)
        self.fin.append(fin)
        self.start.append(start)
        self.dec.append(False)

    def time(self, timer, t: float) -> None:
        """Each step's seconds and the time at its end (``t`` plus the seconds, added one by one as the
        reference adds them)."""
        self.sec = timer.steps(self.new, self.pairs, self.kvr, self.logits,
                               0 if self.decode_pairs is None else self.decode_pairs)
        times = np.empty(len(self.sec) + 1)
        times[0] = t
        times[1:] = self.sec
        self.times = np.cumsum(times, out=times)[1:]
        self.t0 = t

    def retime(self, timer, k: int) -> None:
        """:meth:`time` again from step ``k`` on (the steps before it are unchanged: the seconds of a step are its
        own inputs', the times are added in the same order)."""
        dp = self.decode_pairs
        sec = timer.steps(self.new[k:], self.pairs[k:], self.kvr[k:], self.logits[k:], 0 if dp is None else dp[k:])
        self.sec[k:] = sec
        if k:  # (in place: the time before step k, then its seconds, added one by one)
            times = self.times[k - 1:]
            times[1:] = sec
            np.add.accumulate(times, out=times)  # (np.cumsum's ufunc: the same additions)
            return
        times = np.empty(len(sec) + 1)
        times[0] = self.t0
        times[1:] = sec
        self.times[k:] = np.cumsum(times, out=times)[1:]


def plan(eng, live: list, pending: int) -> Run | None:
    """The run the present requests ``live`` make, up to the arrival of ``requests[pending +
    JOINS_PER_RUN]`` at the latest (joins not yet added), or None when the present state does
    not allow a run of at least two steps."""
    ahead = pending + JOINS_PER_RUN
    horizon = _horizon(eng, ahead)
    budget = eng.cfg.max_num_batched_tokens
    present = _present(eng, live, budget * horizon)
    if present is None:
        return None
    proc, P, G, gen, nb, rows, passive = present
    if eng.client is not None and (proc >= P).any():  # a closed loop: no step after the first decoder's last
        horizon = min(horizon, int((G - gen)[proc >= P].min()))
    horizon = min(horizon, eng.steps_until_sent_arrive())  # (a closed loop's sent requests: the run ends there)
    scheduled = _schedule(proc, P, G, gen, budget, horizon)
    if scheduled is None:
        return None
    tok, dec, start, fin, nd, taken, K = scheduled
    bs, pool = eng.bs, eng.pool
    ks = np.arange(K, dtype=np.int64)
    ctx = proc[:, None] + np.cumsum(tok, axis=1)  # tokens processed after each step
    alive = ks[None, :] <= fin[:, None]  # holds blocks at the step (freed after its last)
    used1 = nbg = None
    kv = drop = None
    if eng.cfg.cache_eviction is not None:  # (one plain table: planned_eviction)
        ev0 = np.array([g.evicted for g in rows], dtype=np.int64)
        kv, drop = planned_eviction.drops(eng.cfg.cache_eviction, bs, ctx, start, fin, ev0)
        held = ((kv + (bs - 1)) // bs) * alive
        used = pool.used() - int(nb.sum()) + held.sum(axis=0)
        bad = used > pool.total
    elif eng.sched.simple:
        held = np.maximum((ctx + (bs - 1)) // bs, nb[:, None]) * alive
        base = pool.used() - int(nb.sum())
        used = base + held.sum(axis=0)
        bad = used > pool.total
    else:  # every group's blocks: the KV pool's and the state pool's in use per step
        nbg, start_held = _tables_at_start(eng, rows)  # (the passive tail has no row and holds no block)
        per_pool = blocks(eng, ctx, _before(ctx, proc), alive, nbg)[0]
        used = pool.used() - start_held[0] + per_pool[0]
        bad = used > pool.total
        if eng.state_pool is not None:
            used1 = eng.state_pool.used() - start_held[1] + per_pool[1]
            bad |= used1 > eng.state_pool.total
        held = np.zeros_like(ctx)  # (per request only for one group: the groups are counted again at the commit)
    if bad.any():
        K = int(bad.argmax())
        if K < 2:
            return None
    if eng.client is not None and len(fin):
        # a closed loop: the run ends with the step in which the first request ends (it sends the next request)
        K = min(K, int(fin.min()) + 1)
        if K < 2:
            return None
    pairs_m, seen = eng.work.arrays(tok, ctx if kv is None else kv)
    sampled = (tok > 0) & (ctx >= P[:, None])  # a token is sampled (ctx passes maxc: see eligibility)
    run = Run(K=K, tok=[tok[:, :K]], ctx=[ctx[:, :K]], held=[held[:, :K]], alive=[alive[:, :K]], sampled=[sampled[:, :K]],
              nb=nb.tolist(), fin=fin.tolist(), start=start.tolist(), dec=dec.tolist(), nd=nd[:K], taken=taken[:K],
              used=used[:K], new=tok.sum(axis=0)[:K], pairs=pairs_m.sum(axis=0)[:K], kvr=seen.sum(axis=0)[:K],
              logits=sampled.sum(axis=0)[:K],
              decode_pairs=(np.add.reduce(np.where(tok == 1, pairs_m, 0), axis=0)[:K]
                            if eng.timer.decode_rate_differs else None), ahead=ahead,
              used1=None if used1 is None else used1[:K], nbg=nbg, rows=rows, passive=passive,
              kv=None if kv is None else [kv[:, :K]], drop=None if drop is None else [drop[:, :K]])
    run.time(eng.timer, eng.t)
    return run


def _before(ctx: np.ndarray, proc) -> np.ndarray:
    """Tokens processed before each step (``proc`` before the first)."""
    prev = np.empty_like(ctx)
    prev[:, 0] = proc
    prev[:, 1:] = ctx[:, :-1]
    return prev


def _tables_at_start(eng, live: list):
    """Per group, each given request's table length; and per pool, the blocks they hold. Given the requests with a
    row (:func:`_present`'s ``rows``), not every present one: the untouched tail of a fixed pool's queue holds no
    block and has no row in the run's matrices (all present ones gave 787 lengths against 777 rows: a crash)."""
    groups = eng.kv.groups
    nbg, held = [], [0, 0]
    for gi, grp in enumerate(groups):
        if gi == 0:
            lens = [len(g.tables[0]) for g in live]
            lead = [g.dropped for g in live]
        else:
            lens = [len(g.side[gi - 1][0]) for g in live]
            lead = [min(grp.skipped(g.processed), n) for g, n in zip(live, lens)]
        nbg.append(np.array(lens, dtype=np.int64))
        held[grp.pool] += sum(lens) - sum(lead)
    return nbg, held


def _skipped(grp, tokens: np.ndarray) -> np.ndarray:
    """:meth:`BlockGroup.skipped` of every entry."""
    if grp.kind == "sliding":
        return np.maximum(0, tokens - grp.window + 1) // grp.block_size
    return tokens // grp.window * grp.window // grp.block_size


def blocks(eng, ctx: np.ndarray, prev: np.ndarray, alive: np.ndarray, nbg: list):
    """A layout of several groups over planned steps (``ctx``/``prev``: tokens processed after/before each step;
    ``nbg``: per group the table lengths at the start). Returns per pool the blocks held per step, per group the
    table entries per request and step, where a window drops blocks at the end of a step, and the bytes of data
    the blocks hold per step (:func:`simkv.serving.engine.slow_path.used_bytes`)."""
    n, K = ctx.shape
    per_pool = [np.zeros(K, dtype=np.int64), np.zeros(K, dtype=np.int64)]
    entries, used_b = [], np.zeros(K, dtype=np.int64)
    drops = np.zeros((n, K), dtype=bool)
    for grp, nb in zip(eng.kv.groups, nbg):
        if grp.block_size == 0:  # a state: one block once the sequence started
            e = ((ctx > 0) | (nb[:, None] > 0)).astype(np.int64)
        else:
            e = np.maximum((ctx + (grp.block_size - 1)) // grp.block_size, nb[:, None])
        lead = 0
        if grp.kind in ("sliding", "chunked"):
            lead = _skipped(grp, prev)
            drops |= _skipped(grp, ctx) > lead
        held = (e - lead) * alive
        per_pool[grp.pool] += held.sum(axis=0)
        if grp.block_size and grp.kind != "checkpoint":
            tokens = np.where(alive & (e > 0), ctx - lead * grp.block_size, 0).sum(axis=0)
            used_b += tokens * grp.real_bytes // grp.block_size
        else:
            used_b += held.sum(axis=0) * grp.real_bytes
        entries.append(e)
    return per_pool, entries, drops, used_b


def _present(eng, live: list, reach: int):
    """The present requests as arrays (tokens processed, prompt, tokens to generate, generated,
    blocks held), the requests they are (``rows``) and how many present requests follow them without a row, or
    None where the reference must take the step (prefix caching, tracing, observers, no split-fuse, pool growth,
    a window's blocks leaving, forks).

    Untouched requests at the end of the queue (:attr:`PagedServing.cold`) get a row only while the prompt tokens
    before them stay under ``reach`` (the run's budget of tokens): later ones get no token in the run — prompts
    are served in request order, and each takes every token left until it completes —, hold no block and sample
    nothing, so they only count as present. (A fixed pool: a dynamic one reserves for every prompt present.)"""
    cfg, sched, pool = eng.cfg, eng.sched, eng.pool
    if eng.trace_requests or eng.observe is not None or not cfg.dynamic_split_fuse:
        return None
    ev = cfg.cache_eviction
    prefix = cfg.enable_prefix_caching
    if prefix and not sched.simple:
        return None
    if not sched.initialized or pool.total != eng.tensors.total or (
            eng.state_pool is not None and eng.state_pool.total != eng.tensors.state_total):
        return None  # the pool's tensors are (re)allocated in this step
    tail = len(live)
    if not sched.dynamic:
        tail = eng.cold_pos(live)
        while tail < len(live) and reach > 0:
            reach -= live[tail].P
            tail += 1
    rows = live[:tail]  # (a copy: the engine appends newcomers to live)
    n = len(rows)
    proc = np.empty(n, dtype=np.int64)
    P = np.empty(n, dtype=np.int64)
    G = np.empty(n, dtype=np.int64)
    gen = np.empty(n, dtype=np.int64)
    nb = np.empty(n, dtype=np.int64)
    prompt_phase = False
    for j, g in enumerate(rows):
        if len(g.tables) != 1 or prefix and (g.preemptions or not eng.solo(g.index)):
            return None  # (prefix caching: see _hand_out_prefix)
        if ev is not None and not planned_eviction.plannable(g, ev):
            return None  # (its next registration or eviction is the reference's)
        if g.maxc >= g.P:
            if g.maxc != g.processed:
                return None
        else:
            if g.n > 1:
                return None  # forks at the end of its prompt
            prompt_phase = True
        proc[j], P[j], G[j], gen[j], nb[j] = g.processed, g.P, g.G, g.generated, len(g.tables[0])
    if sched.dynamic and prompt_phase and reserves(sched, live):
        return None  # the reference step raises the dynamic pool first
    return proc, P, G, gen, nb, rows, len(live) - n


def reserves(sched, groups) -> bool:
    """Whether a step with a prompt among ``groups`` grows a dynamic pool first (``_reserve``)."""
    if sched.simple:
        return sched._target_blocks(groups) > sched.pool.total
    kv, state = sched._targets(groups)
    if kv > sched.pool.total:
        return True
    return sched.state_pool is not None and not sched.state_fixed and state > sched.state_pool.total


def _horizon(eng, ahead: int) -> int:
    """Steps a run may take: at most KMAX (a layout of several groups: twice the last run's, at least 64, as its
    matrices have a row per request and group), ending before the arrival of ``requests[ahead]`` and at the step
    limit."""
    reqs = eng.requests
    # (the reference stops at the step limit, and no earlier than stall_limit steps after the last token)
    K = min(KMAX if eng.sched.simple else eng.horizon, eng.max_steps - eng.step,
            eng.progress_step + eng.stall_limit + 1 - eng.step)
    if ahead < len(reqs):
        if eng.by_step:
            K = min(K, reqs[ahead].arrival_step - eng.step)
        elif eng.timer.min_seconds > 0:  # no step is shorter than the weights' streaming
            K = min(K, int((reqs[ahead].arrival_s - eng.t) / eng.timer.min_seconds) + 2)
    return K


def _schedule(proc, P, G, gen, budget: int, K: int):
    """Tokens scheduled per request and step over up to ``K`` steps: every decoder one per step
    until its last token, the prompts the rest of the ``budget`` in request order. Returns the
    tokens (requests × steps), who was generating at the start, each request's first decode and
    last token steps, decoders and prompt tokens per step, and the steps the run may take (or
    None if fewer than two)."""
    if K < 2:
        return None
    n = len(proc)
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
        got, decodes = prompt_share(room, P[q] - proc[q], G[q])
        tok[q] = got
        taken += got
        if decodes is None:
            break  # it takes all the budget left (or there is none): nobody after it gets tokens
        start[q], fin[q] = decodes
        active_dec[q] = (ks >= start[q]) & (ks <= fin[q])
        nd = nd + active_dec[q]
    # (after the last request finishes only newcomers run: joins.join ends the run after the last one's last step)
    over = nd > budget
    if over.any():
        K = min(K, int(over.argmax()))
    if K < 2:
        return None
    tok += active_dec
    return tok[:, :K], dec, start, fin, nd, taken, K


def commit(run: Run, live: list, pool, free_group, timer, block_bytes: int, bs: int, step0: int, eng=None):
    """Carry out the run from step ``step0`` on: hand out and free blocks in the reference order,
    advance the requests ``live`` (the run's rows, joiners last), record the steps' work with the
    ``timer``. Returns the run's step-table columns (``_n``: its steps) and the tokens it sampled."""
    K, nb = run.K, np.array(run.nb, dtype=np.int64)
    tok, ctx, held, alive, sampled = (_matrix(rows, K)
                                      for rows in (run.tok, run.ctx, run.held, run.alive, run.sampled))
    used, sec, times = run.used[:K], run.sec[:K], run.times[:K]
    new, pairs, kvr, logits = run.new[:K], run.pairs[:K], run.kvr[:K], run.logits[:K]
    alloc_b = pool.total * block_bytes
    in_use = used * block_bytes
    state_used = state_total = 0
    evicting = eng is not None and run.kv is not None
    if evicting:  # GenAI's cache eviction (one plain table, no prefix caching)
        kv, drop = _matrix(run.kv, K), _matrix(run.drop, K)
        proc0 = (ctx[:, 0] - tok[:, 0]).tolist()
        _hand_out_evicting(held, drop, nb, run.start, run.fin, K, live, pool, free_group,
                           eng.cfg.cache_eviction.start // bs)
        used_b = np.where(alive, kv, 0).sum(axis=0) * block_bytes // bs
    elif eng is not None and eng.tokens is not None:
        _hand_out_prefix(eng, ctx, held, nb, sampled, run.start, run.fin, K, live)
        ctx_total = np.where(alive, ctx, 0).sum(axis=0)
        used_b = ctx_total * block_bytes // bs
    elif eng is None or eng.sched.simple:
        _hand_out_blocks(held, nb, run.start, run.fin, K, live, pool, free_group)
        ctx_total = np.where(alive, ctx, 0).sum(axis=0)
        used_b = ctx_total * block_bytes // bs
    else:
        used_b = _hand_out_groups(eng, run, ctx, alive, K, live)
        if eng.state_pool is not None:
            state_used, state_total = run.used1[:K], eng.state_pool.total
            alloc_b = alloc_b + state_total * eng.state_bytes
            in_use = in_use + state_used * eng.state_bytes
    n_sampled = _advance(live, ctx, sampled, np.array(run.dec), np.array(run.fin), times, K, step0)
    if evicting:
        ev = eng.cfg.cache_eviction
        for j, g in enumerate(live):
            planned_eviction.state_after(g, ev, bs, tok[j], kv[j], drop[j], proc0[j])
        eng.sched.evicted_blocks += int(drop.sum())
    moved = np.flatnonzero(tok.any(axis=1))
    run.moved = live[int(moved[-1])].index if moved.size else None
    requests = alive.sum(axis=0)
    if run.passive:
        requests += run.passive
    table = {
        "step": step0 + np.arange(K), "time_s": times, "requests": requests,
        "scheduled_requests": (tok > 0).sum(axis=0), "blocks_used": used, "blocks_total": pool.total,
        "allocated_bytes": alloc_b, "used_bytes": used_b, "step_s": sec, "scheduled_tokens": new,
        "peak_bytes": alloc_b, "reserved_bytes": alloc_b - in_use,
        "internal_bytes": in_use - used_b, "copy_bytes": 0, "preemptions": 0,
        "state_blocks_used": state_used, "state_blocks_total": state_total, "_n": K,
    }
    timer.record(new, pairs, kvr, logits, 0 if run.decode_pairs is None else run.decode_pairs[:K])
    return table, n_sampled


def _matrix(parts: list, K: int) -> np.ndarray:
    """The present requests' matrix (its first ``K`` steps) and the newcomers' rows, each (from step k, values)."""
    first = parts[0]
    if len(parts) == 1:
        return first[:, :K]
    out = np.zeros((len(first) + len(parts) - 1, K), dtype=first.dtype)
    out[: len(first)] = first[:, :K]
    for i, (k, row) in enumerate(parts[1:], len(first)):
        out[i, k:] = row[: K - k]
    return out


def _hand_out_blocks(held, nb, start, fin, K: int, live: list, pool, free_group) -> None:
    """Block events in the reference order: per step, decoders (request order), then prompt chunks,
    then the frees of the requests that finished in that step. (Without prefix caching a block comes off the free
    list's front as :meth:`BlockPool.allocate_many` takes it; the blocks ever handed out are counted at the end:
    nothing in between reads them.)"""
    if pool.prefix_caching:
        return _hand_out_events(held, nb, start, fin, K, live, pool, free_group)
    inc = held.copy()
    inc[:, 1:] -= held[:, :-1]
    inc[:, 0] -= nb
    kk, jj = np.nonzero((inc > 0).T)  # (a drop is a free after the last step, handled below)
    c = inc[jj, kk]
    start_a = np.asarray(start, dtype=np.int64)
    fin_a = np.asarray(fin, dtype=np.int64)
    fj = np.flatnonzero(fin_a < K)
    ff = fin_a[fj]
    # sort key: step, kind (0 decode allocs, 1 prompt allocs, 2 frees), phase at that step
    # (0 decoding, 1 prompt chunk: a prompt finishing at its last chunk frees after the decoders), request
    key_k = np.concatenate((kk, ff))
    key_kind = np.concatenate(((kk < start_a[jj]).astype(np.int64), np.full(len(fj), 2, dtype=np.int64)))
    key_phase = np.concatenate((np.zeros(len(kk), dtype=np.int64), (ff < start_a[fj]).astype(np.int64)))
    key_j = np.concatenate((jj, fj))
    order = np.lexsort((key_j, key_phase, key_kind, key_k))
    counts = np.concatenate((c, np.full(len(fj), -1, dtype=np.int64)))[order].tolist()
    free, ref, alloc_many = pool.free, pool.ref, pool.allocate_many
    popleft = free.popleft
    tables = [g.tables[0] for g in live]
    top = -1
    for j, n in zip(key_j[order].tolist(), counts):
        if n == 1 and free:
            b = popleft()
            ref[b] = 1
            if b > top:
                top = b
            tables[j].append(b)
        elif n < 0:
            free_group(live[j])
        else:
            tables[j].extend(alloc_many(n))
    if top >= 0 and pool.touched <= top:
        pool.touched = top + 1


def _hand_out_evicting(held, drop, nb, start, fin, K: int, live: list, pool, free_group, first: int) -> None:
    """:func:`_hand_out_events` with GenAI's cache eviction: per step the allocations (decoders, then prompt
    chunks), then the blocks each row drops after the forward (the ``drop`` blocks from logical block ``first``, as
    :meth:`~simkv.serving.sched.genai.ContinuousScheduler.evict` drops them), then the frees of the requests that
    finished."""
    kept = held.copy()  # blocks held once the step's drops are gone
    kept -= drop
    inc = held.copy()
    inc[:, 1:] -= kept[:, :-1]
    inc[:, 0] -= nb
    alive = np.arange(K)[None, :] <= np.asarray(fin, dtype=np.int64)[:, None]
    kk, jj = np.nonzero(((inc > 0) & alive).T)
    counts = inc[jj, kk].tolist()
    events = [(k, 0 if k >= start[j] else 1, 0, j, c) for k, j, c in zip(kk.tolist(), jj.tolist(), counts)]
    dk, dj = np.nonzero(drop.T)
    events += [(k, 2, 0, j, -c) for k, j, c in zip(dk.tolist(), dj.tolist(), drop[dj, dk].tolist())]
    events += [(f, 3, 0 if f >= start[j] else 1, j, 0) for j, f in enumerate(fin) if f < K]
    events.sort()
    # (no prefix caching with eviction: a block off the free list's front, as allocate_many takes it; a dropped one
    # to its back, as release puts it; the blocks ever handed out counted at the end)
    free, ref, alloc_many, release_many = pool.free, pool.ref, pool.allocate_many, pool.release_many
    popleft = free.popleft
    top = -1
    for _, kind, _, j, c in events:
        g = live[j]
        if kind == 3:
            free_group(g)
        elif kind == 2:
            table = g.tables[0]
            release_many(table[first : first - c])
            del table[first : first - c]
        elif c == 1 and free:
            b = popleft()
            ref[b] = 1
            if b > top:
                top = b
            g.tables[0].append(b)
        else:
            g.tables[0].extend(alloc_many(c))
    if top >= 0 and pool.touched <= top:
        pool.touched = top + 1


def _hand_out_events(held, nb, start, fin, K: int, live: list, pool, free_group) -> None:
    """:func:`_hand_out_blocks` event by event."""
    inc = held.copy()
    inc[:, 1:] -= held[:, :-1]
    inc[:, 0] -= nb
    kk, jj = np.nonzero((inc > 0).T)  # (a drop is a free after the last step, handled below)
    counts = inc[jj, kk].tolist()
    # sort key: step, kind (0 decode allocs, 1 prompt allocs, 2 frees), phase at that step
    # (0 decoding, 1 prompt chunk: a prompt finishing at its last chunk frees after the decoders), request
    events = [(k, 0 if k >= start[j] else 1, 0, j, c) for k, j, c in zip(kk.tolist(), jj.tolist(), counts)]
    events += [(f, 2, 0 if f >= start[j] else 1, j, -1) for j, f in enumerate(fin) if f < K]
    events.sort()
    alloc_many = pool.allocate_many
    for _, _, _, j, c in events:
        g = live[j]
        if c < 0:
            free_group(g)
        else:
            g.tables[0].extend(alloc_many(c))


def _hand_out_prefix(eng, ctx, held, nb, sampled, start, fin, K: int, live: list) -> None:
    """:func:`_hand_out_blocks` with prefix caching: each block allocated with the hash the reference gives it
    (``ContinuousScheduler.append_slots``: the tokens known at that step), the last block re-hashed before new
    ones, and each request's generated tokens appended to its tokens.

    The reference also re-hashes a decoding sequence's last block at every step, by the context after the step;
    here only its last such hash is given (before the block is freed, before a new block follows it, at the end of
    the run). The hashes in between are seen by no one: every request here is alone in its family and was never
    preempted (:func:`_present`; newcomers: :func:`simkv.serving.engine.joins.join`), so no other block has, had or
    will get one of them (a hash chain starts with the prompt's first tokens), and nothing is restored during
    the run. Allocations and frees are the reference's, in its order, so the clock, the free list, the
    overwritable store and its evictions are too."""
    pool, sched, bs, free_group = eng.pool, eng.sched, eng.bs, eng.sched.free_group
    gen = sampled.sum(axis=1).tolist()
    for j, g in enumerate(live):
        if gen[j]:
            rid, first = g.req.id, g.generated
            g.seq_tokens[0].extend([(3, rid, 0, i) for i in range(first, first + gen[j])])
    inc = held.copy()
    inc[:, 1:] -= held[:, :-1]
    inc[:, 0] -= nb
    kk, jj = np.nonzero((inc > 0).T)
    counts = inc[jj, kk].tolist()
    events = [(k, 0 if k >= start[j] else 1, 0, j, c) for k, j, c in zip(kk.tolist(), jj.tolist(), counts)]
    events += [(f, 2, 0 if f >= start[j] else 1, j, -1) for j, f in enumerate(fin) if f < K]
    events.sort()
    rehash, allocate, hashed = pool.rehash, pool.allocate, sched._hash
    for k, kind, phase, j, c in events:
        g = live[j]
        table = g.tables[0]
        if c < 0:
            if phase == 0 and table:  # it decoded in its last step: its last block ends the context
                rehash(table[-1], hashed(g, 0, int(ctx[j, k])))
            free_group(g)
            continue
        known = int(ctx[j, k]) if kind == 0 else g.P  # prompt + generated at that step (a decoder: its context)
        if table:
            rehash(table[-1], hashed(g, 0, min(len(table) * bs, known)))
        for i in range(len(table), len(table) + c):
            table.append(allocate(hashed(g, 0, min((i + 1) * bs, known))))
    for j, g in enumerate(live):  # decoded in the run and still running: its last block ends its context
        if fin[j] >= K and start[j] < K and g.tables[0]:
            rehash(g.tables[0][-1], hashed(g, 0, int(ctx[j, K - 1])))


def _hand_out_groups(eng, run: Run, ctx, alive, K: int, live: list) -> np.ndarray:
    """:func:`_hand_out_blocks` for a layout of several groups: per step, each decoder's blocks (group by group),
    then each prompt chunk's, then the blocks windows leave at the end of the step (decoders, then prompts),
    then the frees of the requests that finished. Returns the bytes of data held per step."""
    n = ctx.shape[0]
    nbg = [np.concatenate([nb, np.zeros(n - len(nb), dtype=np.int64)]) for nb in run.nbg]
    proc = np.array([g.processed for g in live], dtype=np.int64)
    _, entries, drops, used_b = blocks(eng, ctx, _before(ctx, proc), alive, nbg)
    start, fin = run.start, run.fin
    fin_a = np.array(fin, dtype=np.int64)
    incs = []
    for e, nb in zip(entries, nbg):
        inc = e.copy()
        inc[:, 1:] -= e[:, :-1]
        inc[:, 0] -= nb
        incs.append(inc)
    any_inc = np.zeros_like(alive)
    for inc in incs:
        any_inc |= inc > 0
    kk, jj = np.nonzero(any_inc.T)
    events = [(k, 0 if k >= start[j] else 1, 0, j, 0) for k, j in zip(kk.tolist(), jj.tolist())]
    dk, dj = np.nonzero((drops & alive & (np.arange(K)[None, :] < fin_a[:, None])).T)
    events += [(k, 2, 0 if k >= start[j] else 1, j, 1) for k, j in zip(dk.tolist(), dj.tolist())]
    events += [(f, 3, 0 if f >= start[j] else 1, j, 2) for j, f in enumerate(fin) if f < K]
    events.sort()
    sched = eng.sched
    groups = eng.kv.groups
    pools = [sched.pools[grp.pool] for grp in groups]
    for k, _, _, j, what in events:
        g = live[j]
        if what == 0:
            for gi, inc in enumerate(incs):
                c = int(inc[j, k])
                if c > 0:
                    table = g.tables[0] if gi == 0 else g.side[gi - 1][0]
                    table.extend(pools[gi].allocate_many(c))
        elif what == 1:
            sched.drop_skipped(g, int(ctx[j, k]))
        else:
            sched.free_group(g)
    return used_b


def _advance(live: list, ctx, sampled, dec, fin, times, K: int, step0: int) -> int:
    """The requests after the run: tokens processed and generated, first token, finish. Returns the
    tokens sampled."""
    ctx_end = ctx[:, -1].tolist()
    # A prompt's first token is the first one the run samples for it (with its last chunk); derived
    # from the samples themselves, so a prompt the run cuts short has none.
    firsts = sampled.argmax(axis=1).tolist()
    has_first = ((~dec) & sampled.any(axis=1)).tolist()
    gen_add = sampled.sum(axis=1).tolist()
    for j, g in enumerate(live):
        g.processed = ctx_end[j]
        g.maxc = max(g.maxc, g.processed)
        g.generated += gen_add[j]
        if has_first[j]:
            g.first_token_s, g.first_token_step = float(times[firsts[j]]), step0 + firsts[j]
        if fin[j] < K:
            g.status = FINISHED
            g.finish_s, g.finish_step = float(times[fin[j]]), step0 + int(fin[j])
    return sum(gen_add)

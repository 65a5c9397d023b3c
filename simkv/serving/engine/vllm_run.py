"""A quiet run of steps under vLLM's rules (``--scheduler vllm``), planned at once: GenAI's planned runs
(:mod:`.planned_run`) where vLLM's scheduler agrees with them, and block ids handed out and freed in vLLM's order.

In such a run (``Scheduler.schedule`` / ``update_from_output``, ``vllm/v1/core/sched/scheduler.py``, vLLM 0.33.0;
rules S1–S9 and K1–K3 of docs/research/vllm-scheduler.md) every running request decodes one token per step, the
requests still in their prompt take the rest of the token budget in running order, nothing is preempted, and
only arrivals that vLLM admits at their own step are admitted (below); a request that samples its
``max_tokens``-th token finishes and frees its blocks at the end of that step. Planned with numpy: per request the
tokens, context and blocks per step (:func:`planned_run._schedule`, the same arithmetic as GenAI's quiet runs), the
step costs through the one vectorised cost model (:meth:`planned_run.Run.time`), then carried out (:func:`commit`):
the blocks are taken and freed through vLLM's own pool and group tables (:mod:`simkv.serving.kv.vllm_pool`), event
by event in vLLM's order, so every later step and the ledger are the reference's.

Where vLLM's rules differ from GenAI's, and what that asks of a run:

* Order: vLLM serves ``self.running`` in its order (admission order), not decoders first. A prompt that takes the
  budget it is left starves whoever follows it (``while ... and token_budget > 0``), so a run needs every prompt
  still being prefilled *after* every decoder in ``running``; then decoders-then-prompts is vLLM's order too (a
  prompt that completes decodes at its place, one token, whatever that place is).
* Blocks per request: ``allocate_slots`` of full-attention and MLA groups (:attr:`VllmScheduler.plannable`) is
  ``cdiv(computed + n, block_size) − len(table)`` new blocks per group; nothing leaves a window. Sliding, chunked
  and Mamba groups are left to the step-by-step path.
* Prefix caching (``enable_prefix_caching``): a request's block hashes are chained over its full blocks of known
  tokens (``Request.update_block_hashes``; :meth:`VllmScheduler._rehash`), and ``allocate_slots`` ends with
  ``cache_blocks`` (``BlockPool.cache_full_blocks``): the blocks that became full that step get their hashes. Freed
  blocks with a hash go to the free queue's tail, the rest to its front (``free_blocks``); a new block off the
  front evicts its hash (``_maybe_evict_cached_block``). None of it changes how many blocks are free (a cached free
  block is free), so the run's arithmetic is the same; the replay (:func:`_replay`) makes each step's allocations,
  its caching and its frees through vLLM's pool in vLLM's order. What a run does not plan: a prefix hit. The
  waiting loop's first try of a head whose lookup (``get_computed_blocks``) could find a block — a request not
  alone in its family (:meth:`PagedServing.solo`) with a whole block to look up, or one preempted before (its own
  blocks may still be cached) — ends the run there (:func:`_misses`), whether its whole prompt fits or not: a hit
  block is not allocated, so the hit may admit a prompt whose blocks do not fit without it; a run
  does not start while a hit's block is held by two tables (a finish would free fewer blocks than its table).
* Pool: vLLM allocates all of a step's blocks in ``schedule()`` and frees the finished requests' in
  ``update_from_output`` after it, so a step fits when the blocks held after its allocations fit the pool (the
  free queue only shrinks inside ``schedule()``); the step that does not is a preemption and ends the run.
  Freed blocks go to the free queue's front (``free_blocks`` → ``prepend_n``), table reversed, in scheduled order;
  new ones come off its front (``popleft_n``): replayed on vLLM's pool in that order (:func:`_replay`).
* Waiting requests (S2, S4): a step with no preemption (``if not preempted_reqs``), budget left and fewer than
  ``max_num_seqs`` running (``max_num_active_reqs``) tries the queue's head in ``schedule()``'s waiting loop, and
  admits it where its whole sequence fits the free blocks after the running
  requests' allocations of that step (``kv_cache_manager.allocate_slots(..., full_sequence_must_fit=True)`` under
  ``scheduler_reserve_full_isl``: ``get_num_blocks_to_allocate(num_tokens=full_num_tokens)`` against the free
  blocks);
  a failed try ``break``s the loop and changes nothing; an admission makes the next request the head, tried in the
  same step. A request waiting when the run starts is admitted inside the run by that rule (:func:`_join`), as an
  arrival is: it joins ``running`` last (``self.running.append(request)``) and takes ``min(prompt, budget left)``
  tokens, then the budget the requests before it leave (vLLM's order and the planned arithmetic's agree: every
  prompt ahead of it completes before it gets a token). A request preempted before (its recompute) ends the run
  where it would be admitted.
* Arrivals (:func:`_join`; ``add_request`` before the step's ``schedule()``, S7: ``FCFSRequestQueue`` appends): one
  arriving to an empty queue is that step's head, tried as above; one arriving behind a waiting request waits
  behind it. Under the priority policy (S7: a heap ordered by ``Request.__lt__``) an arrival that would share the
  queue with another waiting request ends the run. The cut is made at the first step with a preemption (an
  admitted request's blocks included), a decode token past the budget, or nobody scheduled; arrivals at or after
  it arrive the step-by-step way.
* ``long_prefill_token_threshold`` > 0 caps every chunk (when more than one request is eligible): no run.
* No request reaches ``max_model_len`` (the engine's is unbounded: it stops at ``max_new_tokens``).
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from simkv.serving.engine.planned_run import JOINS_PER_RUN, KMAX, Run, _advance, _matrix, _schedule, prompt_share
from simkv.serving.sched.vllm import FINISHED as V_FINISHED
from simkv.serving.sched.vllm import RUNNING as V_RUNNING
from simkv.serving.sched.group import Group


def plan(eng, live: list, pending: int) -> tuple[Run, list] | None:
    """The run the present requests make, with the arrivals from ``requests[pending]`` on joining it or waiting
    through it (:func:`_join`), or None when the present state allows no run of at least two steps. Returns the run
    and its joiners (:class:`Joiner`, in arrival order). Reads the engine; changes nothing."""
    sched = eng.sched
    v = sched.v
    s = v.s
    if (not v.plannable or s.long_prefill_token_threshold or eng.trace_requests or eng.observe is not None
            or not v.running or eng.tensors.total != eng.pool.total):
        return None
    if v.pool.caching and any(gt.shared for gt in v.groups):
        return None  # a prefix hit's block held by two tables: a finish frees fewer blocks than its table
    K = _horizon(eng)
    if K < 2:
        return None
    by_id = sched.by_id
    rows = [by_id[r.id] for r in v.running]
    n = len(rows)
    proc = np.empty(n, dtype=np.int64)
    P = np.empty(n, dtype=np.int64)
    G = np.empty(n, dtype=np.int64)
    gen = np.empty(n, dtype=np.int64)
    prompting = False
    longest = 0
    for j, (r, g) in enumerate(zip(v.running, rows)):
        if r.computed != g.processed or g.maxc > g.processed and r.outputs:
            return None
        if r.outputs:  # a decoder: one token to compute
            if prompting or r.num_tokens - r.computed != 1:
                return None  # a prompt before a decoder in running order, or a resumed request recomputing
        else:
            if g.maxc >= g.P or g.n != 1:
                return None
            prompting = True
        proc[j], P[j], G[j], gen[j] = r.computed, r.prompt, r.max_tokens, r.outputs
        longest = max(longest, r.prompt + r.max_tokens)
    if longest + 1 >= s.max_model_len:
        return None
    budget = s.max_num_batched_tokens
    scheduled = _schedule(proc, P, G, gen, budget, K)
    if scheduled is None:
        return None
    tok, dec, start, fin, nd, taken, K = scheduled
    ks = np.arange(K, dtype=np.int64)
    ctx = proc[:, None] + np.cumsum(tok, axis=1)
    alive = ks[None, :] <= fin[:, None]
    sizes = [gt.block_size for gt in v.groups]
    nb = np.array([sum(len(gt.tables.get(r.id, ())) for gt in v.groups) for r in v.running], dtype=np.int64)
    held = np.zeros_like(ctx)
    for bs in sizes:
        held += (ctx + (bs - 1)) // bs
    held = np.maximum(held, nb[:, None]) * alive
    used = v.pool.used() - int(nb.sum()) + held.sum(axis=0)  # after each step's allocations, before its frees
    new = tok.sum(axis=0)
    K = _first_bad(v, used, new)
    if K < 2:
        return None
    pairs_m, seen = eng.work.arrays(tok, ctx)
    sampled = (tok > 0) & (ctx >= P[:, None])
    run = Run(K=K, tok=[tok[:, :K]], ctx=[ctx[:, :K]], held=[held[:, :K]], alive=[alive[:, :K]],
              sampled=[sampled[:, :K]], nb=nb.tolist(), fin=fin.tolist(), start=start.tolist(), dec=dec.tolist(),
              nd=nd[:K].copy(), taken=taken[:K].copy(), used=used[:K].copy(), new=new[:K].copy(),
              pairs=pairs_m.sum(axis=0)[:K], kvr=seen.sum(axis=0)[:K], logits=sampled.sum(axis=0)[:K],
              decode_pairs=(np.add.reduce(np.where(tok == 1, pairs_m, 0), axis=0)[:K]
                            if eng.timer.decode_rate_differs else None), ahead=pending, rows=rows,
              passive=len(v.waiting))
    run.time(eng.timer, eng.t)
    if not eng.by_step:  # a step starting at or after a router's limit is not the run's
        k = int(np.searchsorted(run.times[:-1], eng.limit)) + 1  # step k starts at times[k - 1]
        run.cut(k)
        if run.K < 2:
            return None
    joiners, admits = _join(eng, run, pending, alive.sum(axis=0)[:run.K].copy(), sizes)
    # the next plan's length follows this run's (any cut is exact: only the work wasted on steps never taken
    # changes — an overloaded queue admits requests nearly every step and cuts runs short)
    sched.run_horizon = min(KMAX, max(MIN_HORIZON, 2 * run.K))
    if run.K < 2:
        return None
    return run, joiners, admits


def _whole(tokens: int, sizes: list) -> int:
    """The blocks of a whole sequence of ``tokens`` in every group (``full_sequence_must_fit``)."""
    return sum(-(-tokens // bs) for bs in sizes)


def _first_bad(v, used, new) -> int:
    """The first step a run cannot take (its length where every step can): a preemption (the blocks held after the
    step's allocations pass the pool's) or a step scheduling nobody. (Admissions from the waiting queue are
    :func:`_join`'s.)"""
    room = v.pool.num_blocks - 1
    bad = (used > room) | (new == 0)
    return int(bad.argmax()) if bad.any() else len(used)


class Joiner:
    """An arrival inside a run: its engine group, the run step it arrives at, and its row when vLLM admits it
    (None: it waits through the run)."""

    __slots__ = ("g", "k", "row")

    def __init__(self, g, k: int, row: int | None) -> None:
        self.g, self.k, self.row = g, k, row


def _join(eng, run: Run, pending: int, running, sizes: list) -> list:
    """The waiting queue through the run, step by step as ``schedule()`` walks it: the arrivals from
    ``requests[pending]`` on added at their step (``Scheduler.add_request``, before that step's ``schedule()``; S7:
    ``FCFSRequestQueue`` appends), and the queue's head tried at every step of the run in ``schedule()``'s waiting
    loop (S2, S4). The head is admitted (a row of the run from that step on, last in ``running``:
    :func:`_add_row`) where the loop admits it — no preemption in the step (``if not preempted_reqs``: the run has
    none), budget left after the running requests and those admitted before it in the step, fewer than
    ``max_num_seqs`` running (``max_num_active_reqs``), and its whole prompt's blocks fit the free blocks after the
    step's allocations (``allocate_slots(..., full_sequence_must_fit=True)`` under ``scheduler_reserve_full_isl``);
    then the next request is the head, tried in the same step. A failed try ``break``s the loop: the head and
    everyone behind it wait. The same rule for a request that was waiting when the run started and for an arrival
    (one arriving to an empty queue is the head at its step; one arriving behind another waits behind it).

    The run is cut (the step-by-step path takes over) at an admission the arithmetic does not model — a request
    preempted before (its recompute), or a parallel sample —, at the first try (budget and ``max_num_seqs`` allow
    it, whether its blocks fit or not) of a head whose prefix lookup may hit (its hit blocks are not allocated),
    after :data:`JOINS_PER_RUN` arrivals or admissions, and under the priority policy where an arrival would share
    the queue with another waiting request (the heap's order, not the arrival's, picks the head); an admission whose
    blocks pass the pool at a later step cuts the run there (a preemption). Returns the joiners (the arrivals,
    admitted or not) and the requests admitted from the queue, each in order."""
    v = eng.sched.v
    s = v.s
    reqs = eng.requests
    budget = s.max_num_batched_tokens
    room = v.pool.num_blocks - 1
    by_id = eng.sched.by_id
    queue = deque(v.waiting_order())  # (VRequest, or the Joiner of an arrival), head first
    joiners: list[Joiner] = []
    admits: list = []  # (step, engine group, its Joiner or None), in row order
    index = pending
    k = 0  # the step whose waiting loop comes next
    while run.K >= 2:
        while queue:  # the head's tries at steps k .. before the next arrival's
            ka = _step_of(eng, run, reqs[index]) if index < len(reqs) else KMAX + 1
            top = queue[0]
            g = top.g if isinstance(top, Joiner) else by_id[top.id]
            end = min(ka, run.K)
            if k >= end:
                break
            resumed = not isinstance(top, Joiner) and bool(top.preemptions or top.computed or top.outputs or g.maxc)
            # a lookup that may hit lowers the blocks the admission needs (a hit block is not allocated): where it
            # is tried at all (budget, max_num_seqs) it may be admitted, so the run ends at its first try
            may_hit = v.pool.caching and (resumed or not _misses(eng, g, sizes))
            fits = (budget - run.new[k:end] > 0) & (running[k:end] < s.max_num_seqs)
            if not may_hit:
                whole = _whole(g.P if isinstance(top, Joiner) else top.num_tokens, sizes)
                fits &= whole <= room - run.used[k:end]
            if not fits.any():
                k = end
                break
            k += int(fits.argmax())
            if len(joiners) + len(admits) >= JOINS_PER_RUN or resumed or may_hit:
                run.cut(k)
                break
            queue.popleft()
            _add_row(eng, run, g, k, running, sizes)
            if run.K > k:
                over = run.used[k:run.K] > room  # (its blocks at a later step: a preemption there)
                if over.any():
                    run.cut(k + int(over.argmax()))
            joiner = top if isinstance(top, Joiner) else None
            if joiner is not None:
                joiner.row = len(run.fin) - 1
            admits.append((k, g, joiner))
        if index >= len(reqs):
            break
        ka = _step_of(eng, run, reqs[index])
        if ka >= run.K:
            break
        k = max(k, ka)
        req = reqs[index]
        if len(joiners) + len(admits) >= JOINS_PER_RUN or (s.policy == "priority" and (queue or (
                index + 1 < len(reqs) and _step_of(eng, run, reqs[index + 1]) == ka))):
            run.cut(ka)
            break
        g = Group(req, index, eng.prompts[index])
        if g.n != 1:
            run.cut(ka)
            break
        g.added_s = req.sent if req.arrival_s is not None else float(run.times[ka - 1])
        g.added_step = eng.step + ka
        j = Joiner(g, ka, None)
        joiners.append(j)
        queue.append(j)
        index += 1
    K = min(run.K, _first_bad(v, run.used[:run.K], run.new[:run.K]))
    if eng.client is not None and run.fin:  # a closed loop: the run ends with the step in which a request ends
        K = min(K, min(run.fin) + 1)  # (its client sends the next request then: engine.core)
    if not eng.by_step and K >= 2:  # (the joiners' work lengthened the steps after theirs: a router's limit again)
        K = min(K, int(np.searchsorted(run.times[:K - 1], eng.limit)) + 1)
    run.cut(K)
    while admits and admits[-1][0] >= run.K:  # (the run was cut at or before their admission)
        _, _, j = admits.pop()
        for rows in (run.tok, run.ctx, run.held, run.alive, run.sampled):
            rows.pop()
        for col in (run.nb, run.fin, run.start, run.dec):
            col.pop()
        if j is not None:
            j.row = None
    while joiners and joiners[-1].k >= run.K:  # (arrived at or after the cut)
        joiners.pop()
    return joiners, admits


def _misses(eng, g, sizes: list) -> bool:
    """Prefix caching: the admitted request's lookup (``get_computed_blocks`` → ``find_longest_cache_hit``, at most
    ``num_tokens − 1`` tokens in whole blocks) surely finds nothing: its prompt has no whole block to look up, or it
    is alone in its family (no other request's first token is its own: no block anywhere can carry its first
    block's chained hash, so the hit stops at block 0). Any other admission may hit and ends the run there."""
    return g.P - 1 < min(sizes) or eng.solo(g.index)


def _step_of(eng, run: Run, req) -> int:
    """The run step a request arrives at."""
    if eng.by_step:
        return req.arrival_step - eng.step
    return int(np.searchsorted(run.times[:-1], req.arrival_s)) + 1


def _add_row(eng, run: Run, g, k: int, running, sizes: list) -> None:
    """An admitted arrival's row from step ``k`` on, added to the run's sums (``running``: requests in vLLM's
    ``running`` per step). It is last in ``running``: its tokens are the budget the others leave, until its prompt is
    scheduled (:func:`planned_run.prompt_share`), then one per step until its ``max_tokens``-th sample. The run is
    cut at the first step where its decode token passes the budget (the decoders before it take theirs first);
    preemptions are the caller's (:func:`_first_bad`)."""
    budget = eng.sched.v.s.max_num_batched_tokens
    K = run.K
    n = K - k
    got, decodes = prompt_share(np.maximum(budget - run.new[k:K], 0), g.P, g.G)
    tok = got.copy()
    alive = np.ones(n, dtype=bool)
    sampled = np.zeros(n, dtype=bool)
    if decodes:  # it samples from the step its prompt completes, decodes in steps s .. f after k
        s, f = decodes
        start, fin = k + s, k + f
        tok[s:f + 1] += 1
        alive[f + 1:] = False
        sampled[s - 1:f + 1] = True
        run.nd[k + s:k + f + 1] += 1
    else:  # still in its prompt
        start = fin = KMAX
    ctx = np.add.accumulate(tok)
    held = np.zeros_like(ctx)
    for bs in sizes:
        held += (ctx + (bs - 1)) // bs
    held *= alive
    pairs, seen = eng.work.arrays(tok, ctx)
    run.add_row(k, tok, ctx, held, alive, sampled, fin, start)
    run.taken[k:K] += got
    run.used[k:K] += held
    run.new[k:K] += tok
    running[k:K] += alive
    run.pairs[k:K] += pairs
    run.kvr[k:K] += seen
    run.logits[k:K] += sampled
    if run.decode_pairs is not None:
        run.decode_pairs[k:K] += np.where(tok == 1, pairs, 0)
    run.retime(eng.timer, k)
    over = run.new[k:K] > budget
    if over.any():
        run.cut(k + int(over.argmax()))


#: The shortest horizon a run is planned for after short runs.
MIN_HORIZON = 32


def _horizon(eng) -> int:
    """Steps a run may take: at most KMAX — twice the last run's length, at least :data:`MIN_HORIZON` —, the step
    limit and the stall bound (arrivals join it: :func:`_join`), and a closed loop's sent requests' arrival (once
    the steps in flight end: engine.core ``_due``)."""
    return min(eng.sched.run_horizon or KMAX, eng.max_steps - eng.step,
               eng.progress_step + eng.stall_limit + 1 - eng.step, eng.steps_until_sent_arrive())


def _replay(v, running: list, slots: list, kinds: list, js: list) -> None:
    """The run's block events in vLLM's order (``kinds``/``js``/``slots``: 0 = allocate / 1 = free, the row, its
    tokens after the step), through
    vLLM's pool and group tables: an allocation takes ``cdiv(ctx, block_size) − len(table)`` blocks per group, group
    by group (``allocate_slots`` → ``get_new_blocks``: ``popleft_n``); a free gives each group's table back, reversed
    (``SingleTypeKVCacheManager.free`` → ``free_blocks``: ``prepend_n``). Without prefix caching (every group plain,
    no hash, no null block in a table) the same, slice by slice on the free queue's stack
    (:class:`~simkv.serving.kv.vllm_pool.FrontStack`): refs 0 → 1 → 0, nothing cached. With prefix caching, each
    allocation is followed by ``cache_blocks`` (the blocks full at ``slot`` tokens get their hashes: ``r.hashes``
    holds them all, computed from the run's sampled tokens first), through the pool's own calls."""
    pool = v.pool
    groups = v.groups
    if pool.caching:  # the pool's own calls, block by block: evictions, hashes, cached blocks to the tail
        for slot, kind, j in zip(slots, kinds, js):
            r = running[j]
            if kind:
                v._free(r)
            else:
                for gt in groups:
                    gt.allocate(r.id, slot)
                for gt in groups:
                    gt.cache_blocks(r.id, r.hashes, slot)
        return
    st = pool.free_queue.stack
    ref = pool.ref
    top = pool.touched
    per_group = [(gt.tables, gt.block_size, gt.num_cached, gt.nulls) for gt in groups]
    for slot, kind, j in zip(slots, kinds, js):
        rid = running[j].id
        if kind:
            for tables, _, num_cached, nulls in per_group:
                table = tables.pop(rid, [])
                num_cached.pop(rid, None)
                nulls.pop(rid, None)
                for b in table:
                    ref[b] = 0
                st.extend(table)  # prepend_n(reversed(table)): its last block at the front
            continue
        for tables, bs, _, _ in per_group:
            table = tables.get(rid)
            if table is None:
                table = tables[rid] = []
            n = -(-slot // bs) - len(table)
            if n > 0:
                if n > len(st):
                    raise ValueError(f"cannot get {n} free blocks from the pool")
                cut = len(st) - n
                out = st[cut:]
                del st[cut:]
                out.reverse()
                for b in out:
                    ref[b] = 1
                m = max(out) + 1
                if m > top:
                    top = m
                table.extend(out)
    pool.touched = top


def commit(eng, run: Run, joiners: list, admits: list, step0: int):
    """Carry the run out from step ``step0``: the joiners added to vLLM's waiting queue (``add_request``) and to the
    engine; the admitted ones (``admits``: arrivals and requests waiting before the run, in admission order) moved
    from the waiting queue to ``running``, last; blocks taken and freed through vLLM's pool in its order (per step
    each scheduled request's new blocks in running order, group by group; then the finished requests' tables freed
    in scheduled order); vLLM's requests and the engine's advanced. Returns the step-table columns and the tokens
    sampled."""
    sched = eng.sched
    v = sched.v
    K = run.K
    tok, ctx, held, alive, sampled = (_matrix(m, K) for m in (run.tok, run.ctx, run.held, run.alive, run.sampled))
    fin = np.array(run.fin, dtype=np.int64)
    running = list(v.running)
    waits = np.zeros(K, dtype=np.int64)  # requests waiting, per step, besides those waiting all through the run
    for j in joiners:
        sched.add_group(j.g, eng.tokens[j.g.index] if eng.tokens is not None else None)
        waits[j.k:] += 1
    gone = set()
    for k, g, j in admits:
        r = v.requests[str(g.index)]
        gone.add(r.id)
        r.status = V_RUNNING
        running.append(r)
        waits[k:] -= 1
    if gone and v.s.policy == "priority":
        v.waiting[:] = [r for r in v.waiting if r.id not in gone]
        heapq.heapify(v.waiting)
    elif gone:  # FCFS: the admitted are the queue's first, in its order (joiners appended behind the waiting)
        del v.waiting[:len(gone)]
    held_start = np.array(run.nb, dtype=np.int64)
    inc = held.copy()
    inc[:, 1:] -= held[:, :-1]
    inc[:, 0] -= held_start
    event = inc > 0
    if v.pool.caching:  # and the steps a block becomes full (cache_full_blocks gives it its hash then)
        filled = np.zeros_like(ctx)
        for gt in v.groups:
            filled += ctx // gt.block_size
        grew = filled.copy()
        grew[:, 1:] -= filled[:, :-1]
        grew[:, 0] -= sum((ctx[:, 0] - tok[:, 0]) // gt.block_size for gt in v.groups)
        event |= grew > 0
        for _, g, _ in admits:  # the admission's lookup found nothing (_misses): add_hit([]) registered it
            rid = str(g.index)
            for gt in v.groups:
                gt.tables.setdefault(rid, [])
                gt.num_cached[rid] = 0
    kk, jj = np.nonzero(event.T)  # allocations (and caching), step by step, running order
    fj = np.flatnonzero(fin < K)
    key_k = np.concatenate((kk, fin[fj]))
    key_kind = np.concatenate((np.zeros(len(kk), dtype=np.int64), np.ones(len(fj), dtype=np.int64)))
    key_j = np.concatenate((jj, fj))
    order = np.lexsort((key_j, key_kind, key_k))
    groups = v.groups
    key_j, key_k = key_j[order], key_k[order]
    ctx_end = ctx[:, -1].tolist()
    outs = sampled.sum(axis=1).tolist()
    for j, r in enumerate(running):  # sampled ids and their block hashes first (the replay caches blocks by them)
        if outs[j]:
            r.sample(outs[j])
            v._rehash(r)
    _replay(v, running, ctx[key_j, key_k].tolist(), key_kind[order].tolist(), key_j.tolist())
    for j, r in enumerate(running):  # vLLM's requests: computed tokens, the finished gone
        r.computed = ctx_end[j]
        if fin[j] < K:
            r.status = V_FINISHED
            del v.requests[r.id]
            del sched.by_id[r.id]
    done = set(fj.tolist())
    v.running[:] = [r for j, r in enumerate(running) if j not in done]
    rows = run.rows + [g for _, g, _ in admits]
    n_sampled = _advance(rows, ctx, sampled, np.array(run.dec), fin, run.times[:K], K, step0)
    used = run.used[:K]
    alloc_b = eng.pool.total * eng.block_bytes
    in_use = used * eng.block_bytes
    used_b = np.zeros(K, dtype=np.int64)  # GroupTables.data_blocks, per table: its full blocks and its last one's part
    for gt, real in zip(groups, sched._real):
        bs = gt.block_size
        used_b += np.where(alive, ctx // bs * real + ctx % bs * real // bs, 0).sum(axis=0)
    table = {
        "step": step0 + np.arange(K), "time_s": run.times[:K], "requests": alive.sum(axis=0) + run.passive + waits,
        "scheduled_requests": (tok > 0).sum(axis=0), "blocks_used": used, "blocks_total": eng.pool.total,
        "allocated_bytes": alloc_b, "used_bytes": used_b, "step_s": run.sec[:K], "scheduled_tokens": run.new[:K],
        "peak_bytes": alloc_b, "reserved_bytes": alloc_b - in_use, "internal_bytes": in_use - used_b,
        "copy_bytes": 0, "preemptions": 0, "state_blocks_used": 0, "state_blocks_total": 0, "_n": K,
    }
    eng.timer.record(run.new[:K], run.pairs[:K], run.kvr[:K], run.logits[:K],
                     0 if run.decode_pairs is None else run.decode_pairs[:K])
    return table, n_sampled

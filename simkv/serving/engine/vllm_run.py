"""A quiet run of steps under vLLM's rules (``--scheduler vllm``), planned at once: GenAI's planned runs
(:mod:`.planned_run`) where vLLM's scheduler agrees with them, and block ids handed out and freed in vLLM's order.

In such a run (``Scheduler.schedule`` / ``update_from_output``, ``vllm/v1/core/sched/scheduler.py``, vLLM 0.33.0;
rules S1–S9 and K1–K3 of docs/research/vllm-scheduler.md) every running request decodes one token per step, the
requests still in their prompt take the rest of the token budget in running order, nothing is preempted and
nothing is admitted; a request that samples its ``max_tokens``-th token finishes and frees its blocks at the end
of that step. Planned with numpy: per request the tokens, context and blocks per step (:func:`planned_run._schedule`,
the same arithmetic as GenAI's quiet runs), the step costs through the one vectorised cost model
(:meth:`planned_run.Run.time`), then carried out (:func:`commit`): the blocks are taken and freed through vLLM's own
pool and group tables (:mod:`simkv.serving.kv.vllm_pool`), event by event in vLLM's order, so every later step
and the ledger are the reference's.

Where vLLM's rules differ from GenAI's, and what that asks of a run:

* Order: vLLM serves ``self.running`` in its order (admission order), not decoders first. A prompt that takes the
  budget it is left starves whoever follows it (``while ... and token_budget > 0``), so a run needs every prompt
  still being prefilled *after* every decoder in ``running``; then decoders-then-prompts is vLLM's order too (a
  prompt that completes decodes at its place, one token, whatever that place is).
* Blocks per request: ``allocate_slots`` of full-attention and MLA groups without prefix caching
  (:attr:`VllmScheduler.plain`) is ``cdiv(computed + n, block_size) − len(table)`` new blocks per group; nothing
  leaves a window. Sliding, chunked and Mamba groups and prefix caching are left to the step-by-step path.
* Pool: vLLM allocates all of a step's blocks in ``schedule()`` and frees the finished requests' in
  ``update_from_output`` after it, so a step fits when the blocks held after its allocations fit the pool (the
  free queue only shrinks inside ``schedule()``); the step that does not is a preemption and ends the run.
  Freed blocks go to the free queue's front (``free_blocks`` → ``prepend_n``), table reversed, in scheduled order;
  new ones come off its front (``popleft_n``): replayed through :class:`VllmBlockPool` itself.
* Waiting requests stay waiting (no admission in a run): a step with budget left and fewer than ``max_num_seqs``
  running tries the queue's head, and that try must fail — its whole sequence does not fit the free blocks
  (``full_sequence_must_fit``, ``scheduler_reserve_full_isl``): a failed try changes nothing. The step where it
  would fit ends the run. Arrivals end the run too (the step they arrive at goes the step-by-step way: GenAI's
  joins, :mod:`.joins`, are not reused).
* ``long_prefill_token_threshold`` > 0 caps every chunk (when more than one request is eligible): no run.
* No request reaches ``max_model_len`` (the engine's is unbounded: it stops at ``max_new_tokens``).
"""

from __future__ import annotations

import numpy as np

from simkv.serving.engine.planned_run import KMAX, Run, _advance, _schedule
from simkv.serving.sched.vllm import FINISHED as V_FINISHED
from simkv.serving.sched.vllm import GENERATED_ID


def plan(eng, live: list, pending: int) -> Run | None:
    """The run the present requests make before the next arrival (``requests[pending]``), or None when the present
    state allows no run of at least two steps. Reads the engine; changes nothing."""
    sched = eng.sched
    v = sched.v
    s = v.s
    if (not v.plain or s.long_prefill_token_threshold or eng.trace_requests or eng.observe is not None
            or not v.running or eng.tensors.total != eng.pool.total):
        return None
    K = _horizon(eng, pending)
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
    room = v.pool.num_blocks - 1
    bad = used > room  # a preemption
    new = tok.sum(axis=0)
    bad |= new == 0  # (every step schedules someone: the run ends after the last request's last step)
    if v.waiting:  # the head's try must fail wherever it is made
        head = v._peek()
        whole = sum(-(-head.num_tokens // bs) for bs in sizes)
        running = alive.sum(axis=0)  # (the finished leave running in update_from_output, after the step)
        tried = (budget - new > 0) & (running < s.max_num_seqs)
        bad |= tried & (whole <= room - used)
    if bad.any():
        K = int(bad.argmax())
        if K < 2:
            return None
    pairs_m, seen = eng.work.arrays(tok, ctx)
    sampled = (tok > 0) & (ctx >= P[:, None])
    run = Run(K=K, tok=[tok[:, :K]], ctx=[ctx[:, :K]], held=[held[:, :K]], alive=[alive[:, :K]],
              sampled=[sampled[:, :K]], nb=nb.tolist(), fin=fin.tolist(), start=start.tolist(), dec=dec.tolist(),
              nd=nd[:K], taken=taken[:K], used=used[:K], new=new[:K], pairs=pairs_m.sum(axis=0)[:K],
              kvr=seen.sum(axis=0)[:K], logits=sampled.sum(axis=0)[:K],
              decode_pairs=(np.add.reduce(np.where(tok == 1, pairs_m, 0), axis=0)[:K]
                            if eng.timer.decode_rate_differs else None), ahead=pending, rows=rows,
              passive=len(v.waiting))
    run.time(eng.timer, eng.t)
    if not eng.by_step:  # a step starting at or after the next arrival (or a router's limit) is not the run's
        stop = eng.limit
        if pending < len(eng.requests):
            stop = min(stop, eng.requests[pending].arrival_s)
        k = int(np.searchsorted(run.times[:-1], stop)) + 1  # step k starts at times[k - 1]
        run.cut(k)
        if run.K < 2:
            return None
    return run


def _horizon(eng, pending: int) -> int:
    """Steps a run may take: at most KMAX, before the next arrival (in steps), the step limit and the stall bound."""
    K = min(KMAX, eng.max_steps - eng.step, eng.progress_step + eng.stall_limit + 1 - eng.step)
    if eng.by_step and pending < len(eng.requests):
        K = min(K, eng.requests[pending].arrival_step - eng.step)
    return K


def commit(eng, run: Run, step0: int):
    """Carry the run out from step ``step0``: blocks taken and freed through vLLM's pool in its order (per step each
    scheduled request's new blocks in running order, group by group; then the finished requests' tables freed in
    scheduled order), vLLM's requests and the engine's advanced. Returns the step-table columns and the tokens
    sampled."""
    sched = eng.sched
    v = sched.v
    K = run.K
    tok, ctx, held, alive, sampled = (m[0][:, :K] for m in (run.tok, run.ctx, run.held, run.alive, run.sampled))
    fin = np.array(run.fin, dtype=np.int64)
    running = list(v.running)
    inc = held.copy()
    inc[:, 1:] -= held[:, :-1]
    inc[:, 0] -= np.array(run.nb, dtype=np.int64)
    kk, jj = np.nonzero((inc > 0).T)  # allocations, step by step, running order
    fj = np.flatnonzero(fin < K)
    key_k = np.concatenate((kk, fin[fj]))
    key_kind = np.concatenate((np.zeros(len(kk), dtype=np.int64), np.ones(len(fj), dtype=np.int64)))
    key_j = np.concatenate((jj, fj))
    order = np.lexsort((key_j, key_kind, key_k))
    groups = v.groups
    for k, kind, j in zip(key_k[order].tolist(), key_kind[order].tolist(), key_j[order].tolist()):
        r = running[j]
        if kind:
            v._free(r)
        else:
            slot = int(ctx[j, k])
            for gt in groups:
                gt.allocate(r.id, slot)
    ctx_end = ctx[:, -1].tolist()
    outs = sampled.sum(axis=1).tolist()
    for j, r in enumerate(running):  # vLLM's requests: computed tokens, sampled ids, the finished gone
        r.computed = ctx_end[j]
        if outs[j]:
            r.tokens.extend([GENERATED_ID + r.index] * outs[j])
        if fin[j] < K:
            r.status = V_FINISHED
            del v.requests[r.id]
            del sched.by_id[r.id]
    if len(fj):
        gone = set(fj.tolist())
        v.running[:] = [r for j, r in enumerate(running) if j not in gone]
    n_sampled = _advance(run.rows, ctx, sampled, np.array(run.dec), fin, run.times[:K], K, step0)
    used = run.used[:K]
    alloc_b = eng.pool.total * eng.block_bytes
    in_use = used * eng.block_bytes
    used_b = np.zeros(K, dtype=np.int64)  # GroupTables.data_blocks, per table: its full blocks and its last one's part
    for gt, real in zip(groups, sched._real):
        bs = gt.block_size
        used_b += np.where(alive, ctx // bs * real + ctx % bs * real // bs, 0).sum(axis=0)
    table = {
        "step": step0 + np.arange(K), "time_s": run.times[:K], "requests": alive.sum(axis=0) + run.passive,
        "scheduled_requests": (tok > 0).sum(axis=0), "blocks_used": used, "blocks_total": eng.pool.total,
        "allocated_bytes": alloc_b, "used_bytes": used_b, "step_s": run.sec[:K], "scheduled_tokens": run.new[:K],
        "peak_bytes": alloc_b, "reserved_bytes": alloc_b - in_use, "internal_bytes": in_use - used_b,
        "copy_bytes": 0, "preemptions": 0, "state_blocks_used": 0, "state_blocks_total": 0, "_n": K,
    }
    eng.timer.record(run.new[:K], run.pairs[:K], run.kvr[:K], run.logits[:K],
                     0 if run.decode_pairs is None else run.decode_pairs[:K])
    return table, n_sampled

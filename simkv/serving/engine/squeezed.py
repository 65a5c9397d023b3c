"""Squeezed runs: planned steps of a full fixed pool, where decoders take their blocks from the request at the
tail of the queue (GenAI's preemption by recompute, partial) and that request refills what is freed.

A small pool serving more than it holds spends most steps like this (llama-2-7b with a 2 GiB pool on the
conversation trace: a preemption every ~10 steps, three in four of them the tail prompt losing one block to a
decoder that crosses a block boundary). A planned run (:mod:`.planned_run`) ends at each such step; here the
steps are taken one by one with a handful of integers each, while every scheduling rule of the reference
(:meth:`simkv.serving.sched.genai.ContinuousScheduler.schedule`) gives the same outcome as these:

* the present requests, in request order, are decoders (every one generating: processed == maxc >= prompt),
  then at most one *tail* request holding processed tokens (a prompt in progress, or a preempted request
  recomputing), then untouched ones (nothing scheduled yet; a fixed pool, so nobody reserves for them);
* every decoder gets its token (no more decoders than the budget); one crossing into a new block takes a free
  block, else the tail's last block (it is the last request holding processed tokens, after the decoder, and
  holds more than one block: a partial preemption rewinding it to a block boundary; it waits that step);
* a recomputing tail asks in the generate phase for all its remaining tokens the budget allows, and gets them
  only if their blocks are free (else it would be its own victim: nothing); a prompt tail takes in the prompt
  phase what fits its last block and the free blocks (``available_token_slots``); once the tail completes, the
  untouched requests after it take the rest in order (one that does not complete is the new tail);
* finished requests free their blocks at the end of the step.

Anything else ends the run before that step (a decoder with no victim, a full preemption, two requests
holding processed tokens behind the decoders, a step that schedules nothing, more decoders than the budget);
arrivals join at the step the reference adds them (last in the queue, they get nothing unless the queue
before them runs dry: then the run ends there). Block ids are handed out and freed in the reference order
(the victim's block goes to the back of the FIFO free list, and is the one a decoder gets when no other is
free). Requires no prefix caching, one sequence per request, dynamic split-fuse and ``on_oom="preempt"``.
"""

from __future__ import annotations

import numpy as np

from simkv.errors import SimkvError
from simkv.serving.engine.planned_run import JOINS_PER_RUN, _horizon
from simkv.serving.sched.group import FINISHED, RUNNING, Group


class _Tail:
    """A request that is no decoder at the run's start and gets tokens in it: the tail, or an untouched request
    the queue reaches. Its steps as the tail are recorded one by one; once its prompt (or recomputation)
    completes it decodes one token per step from ``dec_from`` to ``fin``."""

    __slots__ = ("g", "recompute", "proc", "maxc", "h", "pre", "steps", "dec_from", "fin", "base")

    def __init__(self, g: Group, recompute: bool, proc: int, maxc: int, h: int) -> None:
        self.g, self.recompute, self.proc, self.maxc, self.h = g, recompute, proc, maxc, h
        self.pre = 0
        #: (step, tokens, tokens processed after it, blocks allocated in it, a token sampled)
        self.steps: list[tuple[int, int, int, int, bool]] = []
        self.dec_from = self.fin = None  # decoding from step dec_from to its last token at fin
        self.base = 0  # tokens processed before dec_from


def run(eng, live: list[Group], pending: int):
    """Plan a squeezed run from the present requests ``live``, let arrivals join and carry it out. Returns
    (step-table columns, tokens sampled, newcomers) or None where the present state is not one (or the run
    would take fewer than two steps). Changes nothing unless it returns a run."""
    cfg, sched, pool = eng.cfg, eng.sched, eng.pool
    if (sched.dynamic or not sched.simple or eng.tokens is not None or not cfg.dynamic_split_fuse
            or cfg.on_oom != "preempt" or eng.trace_requests or eng.observe is not None or eng.client is not None
            or cfg.cache_eviction is not None  # (a victim that evicted is recomputed whole: the reference's)
            or not sched.initialized or pool.total != eng.tensors.total):
        return None
    budget, bs = cfg.max_num_batched_tokens, eng.bs
    ahead = pending + JOINS_PER_RUN
    K = _horizon(eng, ahead)
    if K < 2:
        return None
    decs, tail, queue = [], None, []
    cut = eng.cold_pos(live)
    for g in live[:cut]:
        table = g.tables
        if len(table) != 1:
            return None
        p = g.processed
        if g.maxc >= g.P and g.maxc == p:
            if tail is not None or queue or len(table[0]) != -(-p // bs):
                return None
            decs.append(g)
        elif table[0] and p > 0 or g.maxc >= g.P:  # (a request preempted whole recomputes from nothing)
            if tail is not None or queue or (g.n > 1 and g.maxc < g.P) or len(table[0]) != -(-p // bs):
                return None
            tail = _Tail(g, g.maxc >= g.P, p, g.maxc, len(table[0]))
        elif not table[0]:
            queue.append(g)  # a prompt with nothing processed: untouched, or preempted whole
        else:
            return None
    reach = budget * K
    for g in queue:
        reach -= g.P
    tail_end = cut
    while tail_end < len(live) and reach > 0:
        reach -= live[tail_end].P
        tail_end += 1
    queue += live[cut:tail_end]
    passive = len(live) - tail_end
    if not decs and tail is None and not queue:
        return None
    out = _steps(eng, decs, tail, queue, K, budget, bs)
    if out is None:
        return None
    K, tails, used, pre, victims, starved, c_rows, queue = out
    rows, tok, ctx, present, sampled, nb0 = _matrices(decs, tails, K, bs)
    pairs_m, seen = eng.work.arrays(tok, ctx)
    new, pairs, kvr, logits = tok.sum(axis=0), pairs_m.sum(axis=0), seen.sum(axis=0), sampled.sum(axis=0)
    decode_pairs = (np.add.reduce(np.where(tok == 1, pairs_m, 0), axis=0)
                    if eng.timer.decode_rate_differs else None)
    sec = eng.timer.steps(new, pairs, kvr, logits, 0 if decode_pairs is None else decode_pairs)
    times = np.cumsum(np.concatenate(([eng.t], sec)))[1:]
    # arrivals join at the step the reference adds them (the first starting at or after it), last in the queue
    reqs, joined, join_at = eng.requests, [], []
    for index in range(pending, len(reqs)):
        req = reqs[index]
        if eng.by_step:
            k = req.arrival_step - eng.step
        else:
            late = times[: K - 1] >= req.arrival_s
            k = int(late.argmax()) + 1 if late.any() else K
        if k >= K:
            break
        if index >= ahead or req.sequences > 1 or starved >= k:
            K = k
            break
        joined.append(index)
        join_at.append(k)
    if eng.limit != float("inf"):  # a router's next arrival: take only the steps starting before it
        K = min(K, 1 + int((times[: K - 1] < eng.limit).sum()))
    if eng.max_preemptions is not None:  # the reference stops after the step that passes the bound
        over = np.flatnonzero(eng.preempted_total + np.cumsum(pre[:K]) > eng.max_preemptions)
        if over.size:
            K = min(K, int(over[0]) + 1)
    if K < 2:
        return None
    # -- carry it out -----------------------------------------------------------------------------------
    tok, ctx, present, sampled = tok[:, :K], ctx[:, :K], present[:, :K], sampled[:, :K]
    times, sec, used, pre = times[:K], sec[:K], used[:K], pre[:K]
    fin = np.array([g.G - g.generated - 1 for g in decs] + [t.fin if t.fin is not None else K for t in tails],
                   dtype=np.int64)
    _hand_out(eng, rows, tails, len(decs), nb0, ctx, c_rows, victims, fin, K, bs)
    step0 = eng.step
    n_sampled = int(sampled.sum())
    gen_add = sampled.sum(axis=1).tolist()
    firsts = sampled.argmax(axis=1).tolist()
    ctx_end = ctx[:, -1].tolist()
    ctx_max = ctx.max(axis=1).tolist()
    moved = -1
    for j, g in enumerate(rows):
        if gen_add[j] and g.generated == 0:
            g.first_token_s, g.first_token_step = float(times[firsts[j]]), step0 + firsts[j]
        g.processed = ctx_end[j]
        g.maxc = max(g.maxc, ctx_max[j])
        g.generated += gen_add[j]
        if fin[j] < K:
            g.status = FINISHED
            g.finish_s, g.finish_step = float(times[fin[j]]), step0 + int(fin[j])
        if tok[j].any():
            moved = max(moved, g.index)
    for t in tails:
        t.g.preemptions += sum(1 for v in victims.get(t.g.index, ()) if v < K)
    groups = []
    for index, k in zip(joined, join_at):
        if k >= K:
            break
        req = reqs[index]
        g = Group(req, index, eng.prompts[index])
        sched.init_side(g)
        g.added_s = req.arrival_s if req.arrival_s is not None else float(times[k - 1])
        g.added_step = step0 + k
        groups.append(g)
    with_row = {t.g.index for t in tails}
    requests = present.sum(axis=0) + sum(1 for g in queue if g.index not in with_row) + passive
    if groups:
        requests += np.searchsorted(np.array([g.added_step - step0 for g in groups]), np.arange(K), "right")
    alloc_b = pool.total * eng.block_bytes
    in_use = used * eng.block_bytes
    used_b = np.where(present, ctx, 0).sum(axis=0) * eng.block_bytes // bs
    table = {
        "step": step0 + np.arange(K), "time_s": times, "requests": requests,
        "scheduled_requests": (tok > 0).sum(axis=0), "blocks_used": used, "blocks_total": pool.total,
        "allocated_bytes": alloc_b, "used_bytes": used_b, "step_s": sec, "scheduled_tokens": new[:K],
        "peak_bytes": alloc_b, "reserved_bytes": alloc_b - in_use, "internal_bytes": in_use - used_b,
        "copy_bytes": 0, "preemptions": pre, "state_blocks_used": 0, "state_blocks_total": 0, "_n": K,
    }
    eng.timer.record(new[:K], pairs[:K], kvr[:K], logits[:K], 0 if decode_pairs is None else decode_pairs[:K])
    eng.preempted_total += int(pre.sum())
    if moved >= 0:
        eng.cold = max(eng.cold, moved + 1)
    return table, n_sampled, groups


def _steps(eng, decs, tail, queue, K: int, budget: int, bs: int):
    """The steps one by one, in integers: the decoders as counts per step (tokens, block crossings, blocks
    freed), the tail and the queue request by request. Returns the steps taken and what happened in them, or
    None if fewer than two."""
    n = len(decs)
    ks = np.arange(K + 1, dtype=np.int64)
    nd_diff = [0] * (K + 2)
    cross = [0] * (K + 1)
    freed = [0] * (K + 1)
    #: per step, the rows (request order) whose block crossings fall there: decoders, then tails as decoders
    c_rows: dict[int, list] = {}
    if n:
        proc = np.array([g.processed for g in decs], dtype=np.int64)
        fin = np.array([g.G - g.generated - 1 for g in decs], dtype=np.int64)
        upto = np.minimum(fin, K - 1)
        hit = ((proc[:, None] + ks[None, :K]) % bs == 0) & (ks[None, :K] <= upto[:, None])
        cross = np.concatenate((hit.sum(axis=0), [0])).tolist()
        kk, jj = np.nonzero(hit.T)
        for k, j in zip(kk.tolist(), jj.tolist()):
            c_rows.setdefault(k, []).append(j)
        nd_diff[0] = n
        for f in upto.tolist():
            nd_diff[f + 1] -= 1
        done = fin < K
        blocks_freed = np.zeros(K + 1, dtype=np.int64)
        np.add.at(blocks_freed, fin[done], -(-(proc[done] + fin[done] + 1) // bs))
        freed = blocks_freed.tolist()
    free = eng.pool.num_free()
    total_blocks = eng.pool.total
    tails = []
    known = {}  # request index -> its row's record (a tail preempted whole joins the queue again)
    queue = list(queue)
    cur = tail
    if cur is not None:
        tails.append(cur)
        known[cur.g.index] = cur
    qi = 0
    nd = 0
    used = []
    pre = []
    victims: dict[int, list] = {}
    starved = -1

    def decode(t: _Tail, k: int, base: int, left: int) -> None:
        """Tail ``t`` completed at step ``k`` with ``base`` tokens processed: it decodes ``left`` more tokens,
        one per step from k + 1 (none left: it finished at k)."""
        row = n + tails.index(t)
        if left == 0:
            t.fin = k
            if k < K:
                freed[k] += t.h
            return
        t.dec_from, t.fin, t.base = k + 1, k + left, base
        nd_diff[k + 1] += 1
        last = min(t.fin, K - 1)
        nd_diff[last + 1] -= 1
        for m in range(k + 1 + (-base) % bs, last + 1, bs):  # steps whose token starts a new block
            cross[m] += 1
            c_rows.setdefault(m, []).append(row)
        if t.fin < K:
            freed[t.fin] += -(-(base + left) // bs)

    for k in range(K):
        nd += nd_diff[k]
        if nd > budget:
            K = k
            break
        c = cross[k]
        waiting = False
        n_pre = 0
        if c > free:
            # each decoder short of a block preempts the tail: partially while it holds more than one block,
            # then whole (after which no one behind the decoders holds processed tokens: no more victims)
            short = c - free
            if cur is None or cur.proc == 0 or cur.h < short:
                K = k
                break
            cur.h -= short
            cur.proc = cur.h * bs
            cur.pre += short
            n_pre = short
            victims.setdefault(cur.g.index, []).extend([k] * short)
            waiting = True
            free = 0
            cur.steps.append((k, 0, cur.proc, 0, False))
            if cur.h == 0 and not cur.recompute:  # a prompt preempted whole: first in the queue again
                queue.insert(qi, cur.g)
                cur = None
        else:
            free -= c
        total = nd
        if cur is not None and cur.recompute and not waiting and budget > total:
            s = min(budget - total, cur.maxc - cur.proc)
            need = -(-(cur.proc + s) // bs) - cur.h
            if need <= free:
                free -= need
                cur.h += need
                cur.proc += s
                total += s
                cur.steps.append((k, s, cur.proc, need, False))
                if cur.proc == cur.maxc:
                    decode(cur, k, cur.maxc, cur.g.G - cur.g.generated)
                    cur = None
            elif free and total < budget and qi < len(queue):
                K = k  # the first untouched request would take tokens behind a waiting tail
                break
        if cur is not None and not cur.recompute and not waiting:
            want = min(budget - total, cur.g.P - cur.proc)
            got = min(want, (cur.h + free) * bs - cur.proc)
            if got > 0:
                need = -(-(cur.proc + got) // bs) - cur.h
                free -= need
                cur.h += need
                cur.proc += got
                cur.maxc = max(cur.maxc, cur.proc)
                total += got
                done = cur.proc == cur.g.P
                cur.steps.append((k, got, cur.proc, need, done))
                if done:
                    decode(cur, k, cur.proc, cur.g.G - 1)
                    cur = None
        if cur is None:
            while total < budget and free and qi < len(queue):
                g = queue[qi]
                if g.n > 1:  # it would fork at the end of its prompt
                    break
                qi += 1
                got = min(budget - total, g.P, free * bs)
                t = known.get(g.index)
                if t is None:
                    t = known[g.index] = _Tail(g, False, got, max(g.maxc, got), -(-got // bs))
                    tails.append(t)
                else:
                    t.proc, t.maxc, t.h = got, max(t.maxc, got), -(-got // bs)
                free -= t.h
                total += got
                done = got == g.P
                t.steps.append((k, got, got, t.h, done))
                if done:
                    decode(t, k, got, g.G - 1)
                else:
                    cur = t
                    break
            if cur is None and total < budget and free and qi < len(queue):
                K = k  # (a request with samples would take tokens)
                break
        if total < budget and free and qi == len(queue):
            starved = k  # the queue ran dry: an arrival would take tokens here
        if total == 0:
            K = k  # nothing scheduled: the reference ignores everyone
            break
        used.append(total_blocks - free)
        pre.append(n_pre)
        free += freed[k]
    if K < 2:
        return None
    return (K, tails, np.array(used[:K], dtype=np.int64), np.array(pre[:K], dtype=np.int64), victims, starved,
            c_rows, queue)


def _matrices(decs, tails, K: int, bs: int):
    """Per row (the decoders, then the tails) and step: tokens, tokens processed after it, present (until its
    last token), a token sampled; and each row's blocks at the start."""
    n, m = len(decs), len(tails)
    ks = np.arange(K, dtype=np.int64)
    tok = np.zeros((n + m, K), dtype=np.int64)
    ctx = np.zeros((n + m, K), dtype=np.int64)
    present = np.ones((n + m, K), dtype=bool)
    if n:
        proc = np.array([g.processed for g in decs], dtype=np.int64)
        fin = np.array([g.G - g.generated - 1 for g in decs], dtype=np.int64)
        live = ks[None, :] <= fin[:, None]
        tok[:n] = live
        ctx[:n] = proc[:, None] + np.minimum(ks[None, :], fin[:, None]) + 1
        present[:n] = live
    for i, t in enumerate(tails):
        r = n + i
        ctx[r] = t.g.processed
        for k, got, after, _, _ in t.steps:
            if k < K:
                tok[r, k] = got
                ctx[r, k:] = after
        if t.dec_from is not None and t.dec_from < K:
            span = ks[t.dec_from : min(t.fin, K - 1) + 1]
            tok[r, span] = 1
            ctx[r, t.dec_from :] = t.base + np.minimum(ks[t.dec_from :], t.fin) - t.dec_from + 1
        if t.fin is not None and t.fin < K - 1:
            present[r, t.fin + 1 :] = False
    sampled = np.zeros((n + m, K), dtype=bool)
    sampled[:n] = tok[:n] > 0
    for i, t in enumerate(tails):
        r = n + i
        for k, _, _, _, done in t.steps:
            if done and k < K:
                sampled[r, k] = True
        if t.dec_from is not None and t.dec_from < K:
            sampled[r, t.dec_from : min(t.fin, K - 1) + 1] = True
    rows = decs + [t.g for t in tails]
    nb0 = [len(g.tables[0]) for g in rows]
    return rows, tok, ctx, present, sampled, nb0


def _hand_out(eng, rows, tails, n: int, nb0, ctx, c_rows, victims, fin, K: int, bs: int) -> None:
    """Block events in the reference order, per step: each decoder's new block in request order (from the free
    list, or the tail's last block when none is free), the tail's recomputation blocks (generate phase), the
    prompt chunks' blocks in request order, then the frees of the requests that finished."""
    pool, free_group = eng.pool, eng.sched.free_group
    events = []
    for k, js in c_rows.items():
        if k < K:
            events += [(k, 0, j, 0) for j in js]
    for i, t in enumerate(tails):
        for k, got, _, need, _ in t.steps:
            if k < K and need:
                events.append((k, 1 if t.recompute else 2, n + i, need))
    events += [(f, 3, j, 0) for j, f in enumerate(fin.tolist()) if f < K]
    events.sort()
    victim_at = {}
    for index, ks in victims.items():
        for k in ks:
            victim_at[k] = index
    by_index = {g.index: g for g in rows}
    released = 0
    free_list = pool.free
    for k, kind, j, count in events:
        g = rows[j]
        if kind == 0:
            if not free_list:  # no free block: the tail's last block (GenAI's partial preemption)
                victim = by_index[victim_at[k]]
                pool.release(victim.tables[0].pop())
                released += 1
            g.tables[0].extend(pool.allocate_many(1))
        elif kind == 3:
            free_group(g)
        else:
            g.tables[0].extend(pool.allocate_many(count))
    if released != sum(sum(1 for k in ks if k < K) for ks in victims.values()):
        raise SimkvError("internal error: a squeezed run's preemptions differ from its plan")

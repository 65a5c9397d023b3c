"""Arrivals joining a planned run (:mod:`.planned_run`) at the step the reference adds them.

A newcomer is last in the queue: it takes only the budget the others leave and changes
nobody's tokens (prompts complete in request order, so it never decodes ahead of an
earlier prompt); its row is planned like any prompt's, from its step on, and added to the
run's per-step sums. The run ends at an arrival the reference treats otherwise: dynamic
pool growth, forked samples, no one else present (a jump in time), or a
run that must end there.
"""

from __future__ import annotations

import numpy as np

from simkv.serving.engine import planned_eviction
from simkv.serving.engine.planned_run import KMAX, Run, blocks, prompt_share, reserves
from simkv.serving.sched.genai import prepare_tokens
from simkv.serving.sched.group import Group


def join(eng, run: Run, live: list[Group], pending: int, prior: list[Group] = ()) -> list[Group]:
    """Let the arrivals from ``requests[pending]`` on join ``run``, or end it at the first that cannot.
    Returns the newcomers (their groups, not yet added to the engine). Reads the engine; changes the run.
    ``prior``: newcomers that joined the run before (a run held for a router, engine.advance)."""
    reqs, sched = eng.requests, eng.sched
    by_step, ahead = eng.by_step, run.ahead
    total = eng.pool.total
    joined: list[Group] = []
    # the latest last step of anyone in the run (rows are only appended; requests without a row stay to its end)
    last = KMAX if run.passive else max(run.fin, default=-1)
    # a dynamic pool with one plain table: each row's part of the reservation (_target_blocks), in row order
    targets = ([sched.target_of(h) for h in run.rows + list(prior)] if sched.dynamic and sched.simple else None)
    for index in range(pending, len(reqs)):
        req = reqs[index]
        if by_step:
            k = req.arrival_step - eng.step
        else:  # step k starts at times[k - 1]: the first step starting at or after the arrival
            k = int(np.searchsorted(run.times[:-1], req.arrival_s)) + 1  # (the times never decrease)
        if k >= run.K:
            break  # arrives after the run
        if eng.client is not None and k > min(run.fin, default=KMAX):
            run.cut(k)  # a closed loop: the run ends where a request ends (engine.core cuts it there)
            break
        g = Group(req, index, eng.prompts[index])
        sched.init_side(g)
        # nobody present at step k, or (a dynamic pool) the ones present at step k and g would raise it; with
        # prefix caching, a request whose blocks could be restored (another of its family: PagedServing.solo)
        if targets is not None:
            grows = sum(t for t, f in zip(targets, run.fin) if f >= k) + sched.target_of(g) > total
        else:
            grows = sched.dynamic and reserves(sched, [h for h, f in zip(run.rows + list(prior) + joined, run.fin)
                                                      if f >= k] + [g])
        if index >= ahead or g.n > 1 or last < k or (eng.tokens is not None and not eng.solo(index)) or grows or (
                eng.cfg.cache_eviction is not None and not planned_eviction.plannable(g, eng.cfg.cache_eviction)):
            run.cut(k)
            break
        if eng.tokens is not None:  # (its restore finds nothing: no block of its family exists)
            prepare_tokens(g, eng.tokens[index], eng.bs)
        if not _add_newcomer(eng, run, g, k):
            run.cut(k)
            break
        g.added_s = req.sent if req.arrival_s is not None else float(run.times[k - 1])
        g.added_step = eng.step + k
        joined.append(g)
        if targets is not None:
            targets.append(sched.target_of(g))
        last = max(last, run.fin[-1])
    if last + 1 < run.K:
        run.cut(last + 1)  # nobody is left after that step: the reference jumps to the next arrival
    return joined


def _add_newcomer(eng, run: Run, g: Group, k: int) -> bool:
    """Plan the newcomer's row from step ``k`` on and add it to the run, cut where the budget or the
    pool no longer suffices; False (the run unchanged) if that leaves no step from ``k`` on. (Before ``k``
    nothing changes, and the run's decoders and blocks fit there: only steps from ``k`` on are computed.)"""
    budget, bs, total = eng.cfg.max_num_batched_tokens, eng.bs, eng.pool.total
    K0 = K = run.K
    room = budget - run.nd - run.taken
    neg = room < 0
    if neg.any():
        K = int(neg.argmax())
    got, decodes = prompt_share(np.maximum(room[k:], 0), g.P, g.G)  # nothing before it arrives
    n = K0 - k
    tok = got.copy()
    if decodes:  # it decodes in steps s .. f after k (a slice: cut at the run's end)
        s, f = decodes
        start, fin = k + s, k + f
        tok[s:f + 1] += 1
        nd = run.nd[k:].copy()
        nd[s:f + 1] += 1
        # (only its decode steps can pass the budget: elsewhere the room above is negative first)
        over = nd[s:f + 1] > budget
        if over.any():
            K = min(K, start + int(over.argmax()))
        alive = np.zeros(n, dtype=bool)
        alive[:f + 1] = True
    else:  # still in its prompt
        start = fin = KMAX
        nd = run.nd[k:]
        alive = np.ones(n, dtype=bool)
    ctx = np.add.accumulate(tok)
    used1 = kv = drop = None
    if eng.cfg.cache_eviction is not None:  # its drops once past its prompt (planned_eviction)
        first_decode, last = (s, f) if decodes else (n, n)
        kv, drop = planned_eviction.drops(eng.cfg.cache_eviction, bs, ctx[None, :], np.array([first_decode]),
                                          np.array([last]), np.zeros(1, dtype=np.int64))
        kv, drop = kv[0], drop[0]
        held = (kv + (bs - 1)) // bs
        if decodes:
            held[f + 1:] = 0
        used = run.used[k:] + held
        bad = used > total
    elif eng.sched.simple:
        held = (ctx + (bs - 1)) // bs
        if decodes:
            held[f + 1:] = 0
        used = run.used[k:] + held
        bad = used > total
    else:  # the newcomer's blocks in every group (its tables start empty)
        per_pool = blocks(eng, ctx[None, :], (ctx - tok)[None, :], alive[None, :],
                          [np.zeros(1, dtype=np.int64)] * len(eng.kv.groups))[0]
        held = np.zeros_like(ctx)
        used = run.used[k:] + per_pool[0]
        bad = used > total
        if run.used1 is not None:
            used1 = run.used1[k:] + per_pool[1]
            bad |= used1 > eng.state_pool.total
    if bad.any():
        K = min(K, k + int(bad.argmax()))
    if K <= k:
        return False
    pairs, seen = eng.work.arrays(tok, ctx if kv is None else kv)
    if g.P > 0:  # its samples: from the step its prompt completes (a token there) to its last
        sampled = np.zeros(n, dtype=bool)
        if decodes:
            sampled[s - 1:f + 1] = True
    else:
        sampled = (tok > 0) & (ctx >= g.P)
    run.add_row(k, tok, ctx, held, alive, sampled, fin, start, kv, drop)
    if decodes:
        run.nd[k:] = nd
    run.taken[k:] += got
    run.used[k:] = used
    if used1 is not None:
        run.used1[k:] = used1
    run.new[k:] += tok
    run.pairs[k:] += pairs
    run.kvr[k:] += seen
    run.logits[k:] += sampled
    if run.decode_pairs is not None:
        run.decode_pairs[k:] += np.where(tok == 1, pairs, 0)
    run.retime(eng.timer, k)
    run.cut(K)
    return True

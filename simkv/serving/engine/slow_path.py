"""One serving step the reference way: the parts of GenAI's ``step()`` that walk the requests.

The step itself is conducted by :meth:`simkv.serving.engine.PagedServing._slow_step`
(schedule, the pool's tensors, the forward pass, sampling, freeing), for the steps a
planned run cannot take (pool growth, preemption, forks, prefix caching, ...) and for every
step with ``run(fast=False)``, the reference the planned runs are tested against.
"""

from __future__ import annotations

from simkv.serving.sched.genai import fork_samples

from simkv.serving.sched.group import FINISHED, IGNORED, RUNNING


def internal_slack(live, pool, bs: int) -> int:
    """Unfilled slots of the blocks in use: only a sequence's last block can be partial
    (a block shared by several sequences counts once)."""
    slack = 0
    seen = set()
    ref = pool.ref
    for g in live:
        if g.status != RUNNING:
            continue
        ctx = g.processed + g.scheduled - g.evicted  # (the tokens its blocks hold)
        for table in g.tables:
            if not table:
                continue
            last = table[-1]
            if ref[last] == 1:  # this sequence's own block: no other counts it
                slack += len(table) * bs - ctx
            elif last not in seen:
                seen.add(last)
                slack += len(table) * bs - ctx
    return slack


def used_bytes(live, sched) -> tuple[int, int]:
    """Bytes of data the blocks in use hold, in the KV pool and in the state pool, for a layout of several
    groups (:mod:`simkv.serving.kv.groups`): per token group the held blocks' slots less the last blocks'
    unfilled ones, at the group's bytes per slot; per state group its blocks whole. A block shared by several
    sequences counts once."""
    kv = sched.kv
    out = [0, 0]
    for k, grp in enumerate(kv.groups):
        held = slack = 0
        for g in live:
            if g.status != RUNNING:
                continue
            ctx = g.processed + g.scheduled
            tables = g.tables if k == 0 else g.side[k - 1]
            lead = g.dropped if k == 0 else min(grp.skipped(g.processed), len(tables[0]))
            if len(tables) > 1:  # forked samples share blocks: count each once
                ids = {b for t in tables for b in t if b is not None}
                held += len(ids)
                if grp.block_size:
                    slack += sum(len(t) * grp.block_size - ctx for t in {t[-1]: t for t in tables if t}.values())
                continue
            table = tables[0]
            if table:
                held += len(table) - lead
                if grp.block_size:
                    slack += len(table) * grp.block_size - ctx
        if grp.block_size and grp.kind != "checkpoint":
            out[grp.pool] += (held * grp.block_size - slack) * grp.real_bytes // grp.block_size
        else:
            out[grp.pool] += held * grp.real_bytes
    return out[0], out[1]


def ignore_all(live, sched, t: float, step: int) -> None:
    """Nothing fits: GenAI marks every request out of memory (IGNORED) and frees its blocks."""
    for g in live:
        if g.status == RUNNING:
            sched.free_group(g)
            g.status = IGNORED
            g.finish_s, g.finish_step = t, step


def step_work(scheduled, work):
    """What the forward pass of the ``scheduled`` groups computes: new tokens, attended pairs,
    KV read (:class:`simkv.serving.engine.costing.Work`: tokens, or bytes), logits, and the pairs of one-token queries
    (:mod:`simkv.cost`: decode_pairs). A sequence that evicted attends to the tokens its blocks still hold."""
    new = pairs = kv_read = logits = decode_pairs = 0
    for g in scheduled:
        n, s, p = len(g.tables), g.scheduled, g.processed
        new += n * s
        attended, read = work.seq(p - g.evicted, s)
        attended *= n
        pairs += attended
        if s == 1:  # a one-token query (simkv.cost: decode_pairs)
            decode_pairs += attended
        kv_read += n * read
        if p + s >= g.P and p + s > g.maxc:
            logits += n
    return new, pairs, kv_read, logits, decode_pairs


def sample(scheduled, pool, t: float, step: int, side_pools=()):
    """The scheduled tokens processed and, past the prompt, a token sampled per group (the first
    forks its samples); a group that has all its tokens finishes. Returns the groups that finished
    (their blocks still held) and the tokens sampled."""
    finished = []
    sampled = 0
    for g in scheduled:
        ctx = g.processed + g.scheduled
        emits = ctx >= g.P and ctx > g.maxc  # past the prompt, and past what was processed before
        g.processed = ctx
        g.maxc = max(g.maxc, ctx)
        g.scheduled = 0
        if emits:
            if g.generated == 0:
                g.first_token_s, g.first_token_step = t, step
                fork_samples(pool, g, side_pools)
            sampled += 1
            if g.seq_tokens is not None:
                for s, toks in enumerate(g.seq_tokens):
                    toks.append((3, g.req.id, s, g.generated))
            g.generated += 1
            if g.generated >= g.G:
                g.status = FINISHED
                g.finish_s, g.finish_step = t, step
                finished.append(g)
    return finished, sampled

"""GenAI's cache eviction inside a planned run (:mod:`.planned_run`, :mod:`.joins`): every row's drops in closed form.

The rule is :meth:`simkv.serving.sched.eviction.CacheEviction.blocks_to_drop`, applied after the forward of each
step by the reference (:meth:`simkv.serving.sched.genai.ContinuousScheduler.evict`). In a planned run a row that
can generate (from its first decode step ``s0`` on) gains one token per step, so with ``x`` the tokens its blocks
hold at the forward of ``s0``:

* it first drops at the first step whose ``x + t`` gives a level ``n = floor((x + t) / B) - max / B`` that drops
  something: ``n >= 1`` and, with a KVCrush budget ``b``, ``n != b`` (``n = b`` keeps all ``b``); it drops
  ``n - b`` if ``n > b > 0``, else ``n`` (``d1`` blocks, leaving ``x + t - d1·B`` tokens, ``r = (x + t) mod B``
  into a block);
* then one block each time its tokens reach the next block boundary: ``B - r`` steps later, then every ``B``
  steps (after the first drop its level is 0, or ``b`` with KVCrush, and the next boundary gives ``n = 1``, or
  ``b + 1``: one block).

Before ``s0`` (a prompt, and the step that completes it) nothing is dropped. The planner leaves the steps whose
registration could stop GenAI's ``step()`` to the reference (:func:`plannable`), so here the scores GenAI reads are
the tokens held: no stale length after a preemption (rows are never recomputing), no prompt between ``start`` and
``start + snapkv`` still to register.
"""

from __future__ import annotations

import numpy as np

from simkv.serving.sched.eviction import CacheEviction, snapkv_scores


def plannable(g, ev: CacheEviction) -> bool:
    """Whether the reference's eviction steps for ``g`` are the closed form's: its scores span exactly the tokens it
    holds (or none while it holds no more than ``start``), and no registration ahead of it can trip one of GenAI's
    checks (a first registration of a prompt of ``start + 1 .. start + snapkv - 1`` tokens; with a window longer
    than ``start``, a sequence past ``start`` whose window is not full yet)."""
    held = g.processed - g.evicted
    if ev.snapkv > ev.start and g.snap < ev.snapkv:
        return False  # (a short sequence past start with its window not yet full: _adjust_norm_sum_counters)
    if g.maxc < g.P:  # in its prompt: no scores yet, or as many as it holds (not stale after a preemption)
        if g.scores == 0:
            return not (ev.snapkv and ev.start < g.P < ev.start + ev.snapkv)
        return g.scores == held
    return g.scores == (held if held > ev.start else 0)


def drops(ev: CacheEviction, bs: int, ctx: np.ndarray, start: np.ndarray, fin: np.ndarray,
          ev0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row and step: the tokens its blocks hold at the forward (``ctx`` less the tokens evicted before the step)
    and the blocks it drops after it. ``ctx``: tokens processed after each step (rows × steps); ``start``: each
    row's first step past its prompt (``>= K``: none in the run); ``fin``: its last step; ``ev0``: tokens evicted
    before the run."""
    n, K = ctx.shape
    D = np.zeros((n, K), dtype=np.int64)
    s0 = np.asarray(start, dtype=np.int64)
    last = np.minimum(np.asarray(fin, dtype=np.int64), K - 1)
    rows = np.flatnonzero((s0 < K) & (s0 <= last))
    if rows.size:
        s = s0[rows]
        mb, b = ev.max // bs, ev.kvcrush
        y0 = ctx[rows, s] - ev0[rows]  # tokens held at the forward of s0
        level = np.maximum(y0 // bs - mb, 1)
        if b:
            level = np.where(level == b, b + 1, level)
        j1 = s + np.maximum(0, (mb + level) * bs - y0)  # the first step that drops
        x1 = y0 + (j1 - s)
        n1 = x1 // bs - mb
        d1 = np.where((n1 > b) & (b > 0), n1 - b, n1)
        lim = last[rows]
        hit = j1 <= lim
        D[rows[hit], j1[hit]] = d1[hit]
        after = j1 + bs - x1 % bs  # the next drop (one block), then every bs steps up to the row's last step
        count = np.where(after <= lim, (lim - after) // bs + 1, 0)
        total = int(count.sum())
        if total:
            first = np.cumsum(count) - count
            at = np.repeat(after, count) + bs * (np.arange(total) - np.repeat(first, count))
            D[np.repeat(rows, count), at] += 1
    before = np.zeros_like(D)
    np.cumsum(D[:, :-1], axis=1, out=before[:, 1:])
    return ctx - ev0[:, None] - before * bs, D


def state_after(g, ev: CacheEviction, bs: int, tok_row: np.ndarray, kv_row: np.ndarray, drop_row: np.ndarray,
                proc0: int) -> None:
    """``g``'s eviction state after a committed run (``tok_row``, ``kv_row``, ``drop_row``: its row of the run's
    tokens, tokens held and drops; ``proc0``: its tokens processed before the run): the tokens evicted, the span of
    its scores (registered at its last scheduled step if past ``start`` and, the first time, with SnapKV scores in
    the chunk; less that step's drop) and the SnapKV scores aggregated (this run's positions inside the prompt's
    window, up to the window)."""
    dropped = int(drop_row.sum())
    g.evicted += dropped * bs
    steps = np.flatnonzero(tok_row)
    if not steps.size:
        return
    j = int(steps[-1])
    T = int(kv_row[j])
    ctx_last = proc0 + int(tok_row[: j + 1].sum())
    if ev.snapkv and g.snap < ev.snapkv:
        first = 0 if ev.snapkv > g.P else g.P - ev.snapkv
        g.snap = min(ev.snapkv, g.snap + max(0, ctx_last - max(first, proc0)))
    if T > ev.start and (g.scores > 0 or ev.snapkv == 0
                          or snapkv_scores(g.P, int(tok_row[j]), ctx_last - int(tok_row[j]), ev.snapkv) > 0):
        g.scores = T - int(drop_row[j]) * bs

"""Step time from :mod:`simkv.cost`, evaluated once per step inside the serving loop.

The loop needs each step's time before it schedules the next (arrivals in seconds
decide who is present), and one scalar :func:`simkv.cost.step_cost` call costs
~50 µs — seconds over a trace of 10⁵ steps. The cost model's terms are affine in
its inputs (``memory_s`` in the bytes, ``compute_s`` in tokens and attended
pairs, ``copy_s`` in the copied bytes), so :class:`StepTimer` reads their
coefficients from one vectorised call on probe inputs and evaluates the roofline
with them per step. :meth:`StepTimer.official` then evaluates ``step_cost`` on
every recorded step at once, and the run stops with an error if the two differ —
the reported times are always ``step_cost``'s own.
"""

from __future__ import annotations

import numpy as np

from simkv.cost import step_cost
from simkv.errors import SimkvError

_ARGS = ("weights_bytes", "new_tokens", "attended_pairs", "kv_read_bytes", "kv_write_bytes", "copy_bytes", "logit_tokens")


def attended_pairs(context: int, new: int, window: int | None) -> int:
    """Σ over ``new`` tokens after ``context`` of the positions each attends to, capped by a window
    (the same sum as :func:`simkv.cost.attended_pairs`, in integers)."""
    total = new * context + new * (new + 1) // 2
    if window is not None:
        first = max(0, window - context)
        fit = min(first, new)
        over = new - fit
        if over > 0:
            start = context + fit + 1 - window
            total -= over * start + over * (over - 1) // 2
    return total


class StepTimer:
    def __init__(self, model, device, weights_bytes: int) -> None:
        self.model, self.device, self.weights = model, device, weights_bytes
        k = len(_ARGS)
        probe = np.zeros((k + 1, k))
        probe[1:] = np.eye(k) * 1e6
        c = step_cost(model, device, **{a: probe[:, i] for i, a in enumerate(_ARGS)})
        self._mem = (float(c.memory_s[0]), (np.asarray(c.memory_s[1:]) - c.memory_s[0]) / 1e6)
        self._cmp = (float(c.compute_s[0]), (np.asarray(c.compute_s[1:]) - c.compute_s[0]) / 1e6)
        self._copy = (float(c.copy_s[0]), (np.asarray(c.copy_s[1:]) - c.copy_s[0]) / 1e6)
        self._ovh = float(c.overhead_s[0])
        m, cm, cp = self._mem[1], self._cmp[1], self._copy[1]
        # coefficients per argument (weights fixed per run)
        self.m0 = self._mem[0] + m[0] * weights_bytes
        self.c0 = self._cmp[0] + cm[0] * weights_bytes
        self.mc = m[1:]
        self.cc = cm[1:]
        self.pc = self._copy[0] + cp[0] * weights_bytes, cp[1:]
        self.rows: list[tuple] = []

    def step(self, new_tokens, pairs, kv_read, kv_write, copy_bytes, logit_tokens) -> float:
        """Seconds of one step; the inputs are recorded for :meth:`official`."""
        self.rows.append((new_tokens, pairs, kv_read, kv_write, copy_bytes, logit_tokens))
        x = (new_tokens, pairs, kv_read, kv_write, copy_bytes, logit_tokens)
        mem = self.m0 + sum(c * v for c, v in zip(self.mc, x) if c)
        cmp_ = self.c0 + sum(c * v for c, v in zip(self.cc, x) if c)
        cp = self.pc[0] + sum(c * v for c, v in zip(self.pc[1], x) if c)
        return max(mem, cmp_) + cp + self._ovh

    def official(self, estimated: np.ndarray):
        """``step_cost`` on every recorded step (a step that ran no forward pass costs nothing)."""
        if not self.rows:
            return np.zeros(0), None
        a = np.asarray(self.rows, dtype=np.float64)
        c = step_cost(self.model, self.device, weights_bytes=self.weights, new_tokens=a[:, 0], attended_pairs=a[:, 1],
                      kv_read_bytes=a[:, 2], kv_write_bytes=a[:, 3], copy_bytes=a[:, 4], logit_tokens=a[:, 5])
        seconds = np.asarray(c.seconds, dtype=np.float64)
        ran = estimated > 0
        if not np.allclose(seconds[ran], estimated[ran], rtol=1e-9, atol=1e-15):
            raise SimkvError("the cost model is not affine in its inputs; serving time needs an update of "
                             "simkv/serving/costing.py")
        return np.where(ran, seconds, 0.0), c

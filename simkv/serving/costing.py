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
    def __init__(self, model, device, weights_bytes: int, kv_token_bytes: int) -> None:
        self.model, self.device, self.weights = model, device, weights_bytes
        self.kv_token = kv_token_bytes
        k = len(_ARGS)
        probe = np.zeros((k + 1, k))
        probe[1:] = np.eye(k) * 1e6
        c = step_cost(model, device, **{a: probe[:, i] for i, a in enumerate(_ARGS)})
        mem0, cmp0, cp0 = float(c.memory_s[0]), float(c.compute_s[0]), float(c.copy_s[0])
        coef = lambda a, a0: [float(v) for v in (np.asarray(a[1:]) - a0) / 1e6]  # noqa: E731
        m, cm, cp = coef(c.memory_s, mem0), coef(c.compute_s, cmp0), coef(c.copy_s, cp0)
        self._ovh = float(c.overhead_s[0])
        # the weights are fixed for a run: fold them into the constants
        self.m0, self.c0, self.p0 = mem0 + m[0] * weights_bytes, cmp0 + cm[0] * weights_bytes, cp0 + cp[0] * weights_bytes
        # per-step inputs of the loop: new tokens, attended pairs, KV tokens read, bytes copied, logit tokens
        # (KV bytes written = new tokens x bytes per token; read = tokens read x bytes per token)
        kvt = float(kv_token_bytes)

        def fold(c):  # step_cost's (new, pairs, kv_read, kv_write, copy, logits) -> the loop's inputs
            return [c[1] + c[4] * kvt, c[2], c[3] * kvt, c[5], c[6]]

        self.mc, self.cc, self.pc = fold(m), fold(cm), fold(cp)
        #: A lower bound of any step's time (every coefficient is non-negative).
        self.min_seconds = max(self.m0, self.c0) + self.p0 + self._ovh
        if min(self.mc + self.cc + self.pc) < 0 or self.min_seconds < 0:
            raise SimkvError("the cost model has a negative term")
        self.chunks: list = []
        self.pending: list[tuple] = []

    def _eval(self, x):
        """The roofline with the probed coefficients; scalars or arrays, the same operations in the same order."""
        mem = cmp_ = cp = 0
        for cm_, cc_, cp_, v in zip(self.mc, self.cc, self.pc, x):
            if cm_:
                mem = mem + cm_ * v
            if cc_:
                cmp_ = cmp_ + cc_ * v
            if cp_:
                cp = cp + cp_ * v
        return np.maximum(self.m0 + mem, self.c0 + cmp_) + (self.p0 + cp) + self._ovh

    def step(self, new_tokens, pairs, kv_read_tokens, copy_bytes, logit_tokens) -> float:
        """Seconds of one step; the inputs are recorded for :meth:`official`."""
        x = (new_tokens, pairs, kv_read_tokens, copy_bytes, logit_tokens)
        self.pending.append(x)
        return float(self._eval(x))

    def steps(self, new_tokens, pairs, kv_read_tokens, logit_tokens) -> np.ndarray:
        """Seconds of many steps without copies (arrays), bit-identical to :meth:`step` on each.
        Not recorded: a plan may be cut; :meth:`record` what is kept."""
        return self._eval((new_tokens, pairs, kv_read_tokens, 0, logit_tokens))

    def record(self, new_tokens, pairs, kv_read_tokens, logit_tokens) -> None:
        self._flush()
        z = np.zeros(len(new_tokens))
        self.chunks.append((new_tokens, pairs, kv_read_tokens, z, logit_tokens))

    def record_idle(self) -> None:
        self.pending.append((0, 0, 0, 0, 0))

    def _flush(self) -> None:
        if self.pending:
            a = np.asarray(self.pending, dtype=np.float64).reshape(-1, 5)
            self.chunks.append(tuple(a.T))
            self.pending = []

    def official(self, estimated: np.ndarray):
        """``step_cost`` on every recorded step (a step that ran no forward pass costs nothing)."""
        self._flush()
        if not self.chunks:
            return np.zeros(0), None
        a = np.stack([np.concatenate([np.asarray(c[i], dtype=np.float64) for c in self.chunks]) for i in range(5)], axis=1)
        c = step_cost(self.model, self.device, weights_bytes=self.weights, new_tokens=a[:, 0], attended_pairs=a[:, 1],
                      kv_read_bytes=a[:, 2] * self.kv_token, kv_write_bytes=a[:, 0] * self.kv_token,
                      copy_bytes=a[:, 3], logit_tokens=a[:, 4])
        seconds = np.asarray(c.seconds, dtype=np.float64)
        ran = estimated > 0
        if not np.allclose(seconds[ran], estimated[ran], rtol=1e-9, atol=1e-15):
            raise SimkvError("the cost model is not affine in its inputs; serving time needs an update of "
                             "simkv/serving/costing.py")
        return np.where(ran, seconds, 0.0), c

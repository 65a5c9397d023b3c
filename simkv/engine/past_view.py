"""The CPU plugin's model-wide past block (``policy.past_view``; policies/openvino_cpu.py).

Before an inference the block is grown to hold the history of every beam the inference
reads (``batch_in × stored`` rows, f32): a new block is allocated and the old one freed,
never shrunk. One step grows it at most once (:meth:`PastView.grow`); a decode run's
growths are planned at once (:meth:`PastView.plan`), one per step whose history passes it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simkv.engine.events import NO_BYTES, NO_ROWS
from simkv.kvspec import widest_row
from simkv.layout import PAST_VIEW_BYTES
from simkv.ledger import ALLOC, FREE, PHASE_CODE, ROW, TENSOR_CODE


class ViewPlan(NamedTuple):
    """The block's growths over a decode run."""

    rows: np.ndarray  # per growth: the alloc, and the free of the block it replaces
    k: np.ndarray  # each row's step in the run (1..n)
    growth: np.ndarray  # each growth in bytes
    after: tuple | None  # the block's (bytes, tokens) after the run; None if it does not grow


class PastView:
    """The block's size, buffer id and tokens (``bytes`` 0: none yet)."""

    def __init__(self, model, request: int, enabled: bool, mla_form: str = "latent") -> None:
        self.enabled = enabled
        self.request = request
        self.row_bytes = widest_row(model.kv_layers, mla_form) * PAST_VIEW_BYTES
        self.bytes, self.id, self.tokens = 0, -1, 0

    def grow(self, step: int, phase: int, rows_needed: int, tokens: int, new_id: int) -> np.ndarray:
        """Rows growing the block to ``rows_needed`` rows, if it must grow (then it is the new block);
        none where the policy keeps no block."""
        if not self.enabled:
            return NO_ROWS
        nbytes = rows_needed * self.row_bytes
        if nbytes <= self.bytes:
            return NO_ROWS
        out = np.zeros(2 if self.bytes else 1, dtype=ROW)
        out["step"], out["phase"], out["request"], out["layer"] = step, phase, self.request, -1
        out["tensor"] = TENSOR_CODE["past_view"]
        out[0]["op"], out[0]["bytes"], out[0]["capacity_tokens"], out[0]["buffer"] = ALLOC, nbytes, tokens, new_id
        if len(out) == 2:
            out[1]["op"], out[1]["bytes"], out[1]["buffer"] = FREE, self.bytes, self.id
            out[1]["capacity_tokens"] = self.tokens
        self.commit(nbytes, tokens, new_id)
        return out

    def commit(self, nbytes: int, tokens: int, buffer_id: int) -> None:
        """The block is now ``nbytes`` sized for ``tokens`` tokens, buffer ``buffer_id`` (after a growth or a decode run)."""
        self.bytes, self.tokens, self.id = nbytes, tokens, buffer_id

    def plan(self, first_step: int, n: int, L0: int, B: int, first_id: int) -> ViewPlan:
        """The block's growths over a decode run: step k sizes it for the L0 + k - 1 tokens
        stored before it; ids from ``first_id`` on. Changes nothing: the caller commits the block
        after the run with the last alloc's final id."""
        if not self.enabled:
            return ViewPlan(NO_ROWS, NO_BYTES, NO_BYTES, None)
        tokens = L0 + np.arange(n, dtype=np.int64)
        need = B * tokens * self.row_bytes
        grow_k = np.flatnonzero(need > self.bytes) + 1  # need grows with k: a suffix of the run
        if not len(grow_k):
            return ViewPlan(NO_ROWS, NO_BYTES, NO_BYTES, None)
        sizes = need[grow_k - 1]
        old_sizes = np.r_[self.bytes, sizes[:-1]]
        ids = first_id + np.arange(len(grow_k))
        rows = np.zeros((len(grow_k), 2), dtype=ROW)
        rows["step"], rows["phase"], rows["request"], rows["layer"] = first_step, PHASE_CODE["decode"], self.request, -1
        rows["tensor"] = TENSOR_CODE["past_view"]
        alloc, free = rows[:, 0], rows[:, 1]
        alloc["op"], alloc["bytes"], alloc["buffer"] = ALLOC, sizes, ids
        alloc["capacity_tokens"] = tokens[grow_k - 1]
        free["op"], free["bytes"], free["buffer"] = FREE, old_sizes, np.r_[self.id, ids[:-1]]
        free["capacity_tokens"] = np.r_[self.tokens, tokens[grow_k[:-1] - 1]]
        keep = np.ones((len(grow_k), 2), dtype=bool)
        keep[0, 1] = self.bytes > 0
        after = (int(sizes[-1]), int(tokens[grow_k[-1] - 1]))
        return ViewPlan(rows[keep], np.repeat(grow_k, 2)[keep.ravel()], sizes - old_sizes, after)

"""Double-buffered linear-attention states (``policy.double_buffered_states``: the OpenVINO CPU plugin's
``VariableStateDoubleBuffer``; the rule and its sources in :class:`policies.openvino_cpu.OpenVINOCPU`).

Each state *place* (a linear layer's conv or recurrent state: a state unit's slot that is not absent) has
two buffers of whole rows (one row per sequence, capacity 1): *R*, read by the inference, and *W*, written
by it (columns 0 and 1). They live outside the layout's units, like the GPU kernels' beam tables
(:mod:`.beam_tables`). One inference at batch ``B`` after one at ``p`` rows (0: none yet, or all freed):

* read phase (:meth:`StateBuffers.read`), before the past block and any unit, places in slot order: W grows
  to ``p`` rows, then, when the state has no history (first inference, first after a reset), R to ``B``;
* write phase (:meth:`StateBuffers.write`): W grows to ``B`` rows where ``policy.state_writes`` puts the
  place's tensor — ``unit``: at its unit, among the units' rows; ``end``: after the last unit, places in
  descending order;
* end (:meth:`StateBuffers.end`): W holds the state of ``B`` rows (first touch: ``B`` rows written, and R's
  too on a fresh state), R and W swap, ``p = B``.

A buffer grows by a new one of exactly the rows needed, then the old freed at once (never shrunk, whatever
``free_old`` says). A reset keeps them (nothing held: ``used`` 0) or, under ``reset="free"`` without
``reset_keeps_states``, frees both (:meth:`StateBuffers.free_all`) and the next inference starts afresh.
The reference engine (:mod:`simkv.reference`) does the same one buffer at a time.
"""

from __future__ import annotations

import numpy as np

from simkv.engine.events import NO_BYTES, NO_ROWS
from simkv.ledger import ALLOC, FREE, ROW, TENSORS

READ, WRITE = 0, 1


class StateBuffers:
    """Per state place, the [R, W] buffers' rows (0 = none), ids, first-touch marks (rows written) and
    whether each holds a state (``used``, 0 or 1)."""

    def __init__(self, layout, policy, request: int, first_touch: bool) -> None:
        self.request, self.first_touch = request, first_touch
        self.enabled = bool(policy.double_buffered_states and layout.has_states)
        per_slot = np.repeat(layout.unit_state, layout.unit_slots.shape[1])
        self.slots = np.flatnonzero(per_slot & (layout.row_bytes > 0)) if self.enabled else np.empty(0, np.int64)
        n = len(self.slots)
        unit_of = self.slots // layout.unit_slots.shape[1]
        self.layer = layout.layer[self.slots].astype(np.int64)
        self.tensor = layout.tensor[self.slots].astype(np.int64)
        self.row_bytes = layout.row_bytes[self.slots].astype(np.int64)
        late = np.asarray([policy.state_writes.get(TENSORS[t], "unit") == "end" for t in self.tensor], dtype=bool)
        # Sort keys of the write phase among a step's unit rows (2 x unit; beam tables 2 x unit + 1): at the
        # place's unit, or after every unit in descending order.
        self.write_key = np.where(late, 2 * layout.units + n - np.arange(n), 2 * unit_of).astype(np.int64)
        self.rows = np.zeros((n, 2), dtype=np.int64)
        self.ids = np.full((n, 2), -1, dtype=np.int64)
        self.written = np.zeros((n, 2), dtype=np.int64)
        self.used = np.zeros((n, 2), dtype=np.int64)
        self.last = 0  # rows of the previous inference (the size the write buffer's edge was last given)
        self.min_write = 0  # the fewest rows a write buffer has
        self.fresh = False  # this inference starts from no history (read buffers sized from the batch)

    def live(self) -> bool:
        return bool(self.rows.any())

    def bytes(self) -> int:
        return int((self.rows.sum(axis=1) * self.row_bytes).sum())

    def read(self, step: int, phase: int, batch: int, fresh: bool, next_id: int):
        """The read phase of an inference at ``batch`` beams (``fresh``: no history). Returns its rows (ids
        from ``next_id`` on, in order), their changes of resident memory and the next free id."""
        self.fresh = fresh
        if not fresh and self.min_write >= self.last:  # nothing to grow: the common case, every decode step
            return NO_ROWS, NO_BYTES, next_id
        need = np.zeros_like(self.rows)
        need[:, WRITE] = self.last
        if fresh:
            need[:, READ] = batch
        rows, resident, _, next_id = self._grow(step, phase, need, (WRITE, READ), next_id)
        return rows, resident, next_id

    def write(self, step: int, phase: int, batch: int, next_id: int):
        """The write phase: W grows to ``batch`` rows. Returns the rows (ids from ``next_id`` on, numbered
        in place order: the caller renumbers them once merged), their sort keys among the units' rows
        (:attr:`write_key`), their changes of resident memory and the next free id."""
        if self.min_write >= batch:
            return NO_ROWS, NO_BYTES, NO_BYTES, next_id
        need = np.zeros_like(self.rows)
        need[:, WRITE] = batch
        rows, resident, place, next_id = self._grow(step, phase, need, (WRITE,), next_id)
        return rows, self.write_key[place], resident, next_id

    def _grow(self, step: int, phase: int, need: np.ndarray, columns: tuple, next_id: int):
        """Each place's buffers, in ``columns`` order, with fewer rows than ``need`` are replaced by ones of
        exactly ``need`` rows: an alloc, then the free of the old one. Returns the rows, their changes of
        resident memory, each row's place and the next free id."""
        grow = need > self.rows
        if not grow.any():
            return NO_ROWS, NO_BYTES, NO_BYTES, next_id
        out, resident, place = [], [], []
        for i, col in zip(*np.nonzero(grow[:, list(columns)])):
            col = columns[col]
            head = (step, phase, self.request, int(self.layer[i]), int(self.tensor[i]))
            nbytes = int(need[i, col] * self.row_bytes[i])
            out.append(head + (ALLOC, nbytes, 1, 1, next_id))
            resident.append(0 if self.first_touch else nbytes)
            place.append(i)
            if self.rows[i, col]:
                old = int(self.rows[i, col] * self.row_bytes[i])
                out.append(head + (FREE, old, 1, int(self.used[i, col]), int(self.ids[i, col])))
                resident.append(-int(self.written[i, col] * self.row_bytes[i]) if self.first_touch else -old)
                place.append(i)
            self.rows[i, col], self.ids[i, col] = need[i, col], next_id
            self.written[i, col] = self.used[i, col] = 0
            next_id += 1
        self.min_write = int(self.rows[:, WRITE].min())
        return (np.array(out, dtype=ROW), np.asarray(resident, dtype=np.int64), np.asarray(place, dtype=np.int64),
                next_id)

    def end(self, batch: int) -> int:
        """After the inference: W written at ``batch`` rows (and R, on a fresh state), both hold a state,
        then they swap. Returns the bytes that became resident (first touch)."""
        grown = 0
        for col in (WRITE, READ) if self.fresh else (WRITE,):
            marks = self.written[:, col]
            below = marks < batch
            if below.any():
                grown += int(((batch - marks[below]) * self.row_bytes[below]).sum())
                marks[below] = batch
        self.used[:] = 1
        for a in (self.rows, self.ids, self.written, self.used):
            a[:, [READ, WRITE]] = a[:, [WRITE, READ]]
        self.last, self.fresh = batch, False
        self.min_write = int(self.rows[:, WRITE].min()) if len(self.rows) else 0
        return grown if self.first_touch else 0

    def reset(self) -> None:
        """``reset_state()``: the buffers are kept, holding nothing; the next inference is fresh."""
        self.used[:] = 0

    def free_all(self, step: int, phase: int):
        """Free every buffer (a reset that frees: per place R, then W). Returns the rows and their changes
        of resident memory; the next inference starts as the first."""
        out, resident = [], []
        for i in range(len(self.slots)):
            for col in (READ, WRITE):
                if not self.rows[i, col]:
                    continue
                nbytes = int(self.rows[i, col] * self.row_bytes[i])
                out.append((step, phase, self.request, int(self.layer[i]), int(self.tensor[i]), FREE, nbytes, 1,
                            int(self.used[i, col]), int(self.ids[i, col])))
                resident.append(-int(self.written[i, col] * self.row_bytes[i]) if self.first_touch else -nbytes)
        self.rows[:] = 0
        self.ids[:] = -1
        self.written[:] = 0
        self.used[:] = 0
        self.last = self.min_write = 0
        return (np.array(out, dtype=ROW) if out else NO_ROWS), np.asarray(resident, dtype=np.int64)

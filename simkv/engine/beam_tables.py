"""The beam tables a GPU kernel keeps per unit (``policy.kernel_beam_tables``; policies/mechanics.py).

Each unit's kernel holds a pair of tables, *new* and *prev* (columns 0 and 1), of
``capacity × batch`` elements. They are updated only when a step holds more than one beam
or starts from an empty cache: swap the pair; if the new one holds fewer elements than
``batch × needed``, allocate it at ``policy.capacity(needed)`` tokens × batch (and prev
alike the first time) and free the table it replaces at once. :meth:`BeamTables.step` does
this for one inference, :meth:`BeamTables.plan` for a whole decode run.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simkv.engine.events import NO_BYTES, NO_ROWS
from simkv.layout import BEAM_TABLE_BYTES
from simkv.ledger import ALLOC, FREE, PHASE_CODE, ROW


def _swapped(rows, batch, ids):
    """The pair with new and prev swapped (copies)."""
    return rows[:, ::-1].copy(), batch[:, ::-1].copy(), ids[:, ::-1].copy()


class TablePlan(NamedTuple):
    """The tables' growths over a decode run."""

    rows: np.ndarray  # per growth: the alloc, and the free of the table it replaces
    k: np.ndarray  # each row's step in the run (1..n)
    unit: np.ndarray  # each row's unit
    growth: np.ndarray  # each alloc's growth in bytes
    state: tuple | None  # the pair's (rows, batch, ids) after the run; None if nothing changes


class BeamTables:
    """Per unit, the [new, prev] tables' token rows (elements; 0 = none), batch and buffer id."""

    def __init__(self, layout, policy, request: int) -> None:
        self.layout, self.policy, self.request = layout, policy, request
        self.enabled = bool(policy.kernel_beam_tables and policy.beam_tables)
        self.rows = np.zeros((layout.units, 2), dtype=np.int64)
        self.batch = np.ones((layout.units, 2), dtype=np.int64)
        self.ids = np.full((layout.units, 2), -1, dtype=np.int64)
        # Only attention kernels keep beam tables: a linear-attention state unit has none.
        self.kept = ~layout.unit_state

    def commit(self, rows: np.ndarray, batch: np.ndarray, ids: np.ndarray) -> None:
        """The pairs' token rows, batch and buffer ids after a decode run (:attr:`TablePlan.state`)."""
        self.rows, self.batch, self.ids = rows, batch, ids

    def bytes(self) -> int:
        return int(self.rows.sum()) * BEAM_TABLE_BYTES

    def step(self, step: int, phase: int, needed: int, batch: int, stored: int, next_id: int):
        """The tables for one inference. Returns the rows (ids from ``next_id`` on), each row's
        unit, each unit's net change of allocated bytes, and the next free id. Commits the new state."""
        lay, policy = self.layout, self.policy
        none = np.zeros(lay.units, dtype=np.int64)
        if not self.enabled or not (batch > 1 or stored == 0):
            return NO_ROWS, NO_BYTES, none, next_id
        self.rows, self.batch, self.ids = _swapped(self.rows, self.batch, self.ids)
        grow = np.flatnonzero((self.rows[:, 0] < batch * needed) & self.kept)
        caps = np.asarray(policy.capacity(np.full(len(grow), needed, dtype=np.int64), lay.unit_prim[grow]), dtype=np.int64)
        out, unit_of, delta = [], [], none.copy()
        for u, cap in zip(grow.tolist(), caps.tolist()):
            nbytes = cap * batch * BEAM_TABLE_BYTES
            row = (step, phase, self.request, int(lay.unit_layer[u]), int(lay.unit_table_tensor[u]))
            out.append(row + (ALLOC, nbytes, cap, needed, next_id))
            dropped = (self.rows[u, 0], self.batch[u, 0], self.ids[u, 0])
            self.rows[u, 0], self.batch[u, 0], self.ids[u, 0] = cap * batch, batch, next_id
            next_id += 1
            delta[u] += nbytes
            if not self.rows[u, 1]:
                out.append(row + (ALLOC, nbytes, cap, needed, next_id))
                self.rows[u, 1], self.batch[u, 1], self.ids[u, 1] = cap * batch, batch, next_id
                next_id += 1
                delta[u] += nbytes
            elif dropped[0]:
                out.append(row + (FREE, int(dropped[0]) * BEAM_TABLE_BYTES, int(dropped[0] // dropped[1]), 0, int(dropped[2])))
                delta[u] -= int(dropped[0]) * BEAM_TABLE_BYTES
            unit_of += [u] * (len(out) - len(unit_of))
        return (np.array(out, dtype=ROW) if out else NO_ROWS), np.asarray(unit_of, dtype=np.int64), delta, next_id

    def plan(self, first_step: int, n: int, L0: int, B: int, next_id: int) -> TablePlan | None:
        """The tables over a decode run of ``n`` steps at ``B`` beams: nothing at one beam; else
        every step swaps the pair, so the table that was *prev* at the start is checked on odd
        steps, the other on even ones, and each grows to ``capacity(L) × B`` the first of its
        steps where ``B × L`` exceeds it. Provisional ids from ``next_id`` on; ``None`` if the
        planner cannot (a pair not yet allocated). Changes nothing."""
        lay, policy = self.layout, self.policy
        if not self.enabled or B == 1:
            return TablePlan(NO_ROWS, NO_BYTES, NO_BYTES, NO_BYTES, None)
        if not self.rows.all():
            return None
        rows, batch, ids = self.rows.copy(), self.batch.copy(), self.ids.copy()
        events = []  # (k, unit, column, cap, old rows, old batch, old id)
        for col, first in ((1, 1), (0, 2)):  # column 1 (prev at the start) is checked on steps 1, 3, 5, …
            active = np.arange(lay.units)
            k = np.maximum(rows[:, col] // B + 1 - L0, first)
            k += (k - first) % 2
            while len(active := active[k[active] <= n]):
                kk = k[active]
                caps = np.asarray(policy.capacity(L0 + kk, lay.unit_prim[active]), dtype=np.int64)
                events.append((kk, active, np.full(len(active), col), caps, rows[active, col].copy(),
                               batch[active, col].copy(), ids[active, col].copy()))
                rows[active, col], batch[active, col] = caps * B, B
                ids[active, col] = -1 - np.arange(len(active))  # replaced below by provisional ids
                nk = np.maximum(caps + 1 - L0, kk + 1)
                k[active] = nk + (nk - first) % 2
        if not events:  # no growth, but every step still swapped the pair
            return TablePlan(NO_ROWS, NO_BYTES, NO_BYTES, NO_BYTES, _swapped(self.rows, self.batch, self.ids) if n % 2 else None)
        k, unit, col, cap, old_rows, old_batch, old_id = (np.concatenate(e) for e in zip(*events))
        order = np.lexsort((unit, k))
        k, unit, col, cap, old_rows, old_batch, old_id = k[order], unit[order], col[order], cap[order], old_rows[order], old_batch[order], old_id[order]
        new_id = next_id + np.arange(len(k))
        # An event replacing a table allocated earlier in the run frees that event's id.
        rows, batch, ids = self.rows.copy(), self.batch.copy(), self.ids.copy()
        for e in range(len(k)):
            old_id[e] = ids[unit[e], col[e]]
            rows[unit[e], col[e]], batch[unit[e], col[e]], ids[unit[e], col[e]] = cap[e] * B, B, new_id[e]
        if n % 2:
            rows, batch, ids = _swapped(rows, batch, ids)
        out = np.zeros((len(k), 2), dtype=ROW)
        out["step"], out["phase"], out["request"] = (first_step + k - 1)[:, None], PHASE_CODE["decode"], self.request
        out["layer"] = lay.unit_layer[unit][:, None]
        out["tensor"] = lay.unit_table_tensor[unit][:, None]
        alloc, free = out[:, 0], out[:, 1]
        alloc["op"], alloc["bytes"], alloc["capacity_tokens"], alloc["used_tokens"], alloc["buffer"] = (
            ALLOC, cap * B * BEAM_TABLE_BYTES, cap, L0 + k, new_id)
        free["op"], free["bytes"], free["capacity_tokens"], free["buffer"] = (
            FREE, old_rows * BEAM_TABLE_BYTES, old_rows // old_batch, old_id)
        growth = (cap * B - old_rows) * BEAM_TABLE_BYTES
        return TablePlan(out.ravel(), np.repeat(k, 2), np.repeat(unit, 2), growth, (rows, batch, ids))

"""(Re)allocation events of units and the ledger rows they write.

An event gives a unit new buffers, one per slot (K, V, scales): per slot an alloc, a
copy of what the old buffer holds and a free of the old buffer, in the runtime's order
(``Policy.orders``). One step's reallocations (:meth:`simkv.engine.session.FastEngine._step`)
and a whole decode run's chains (:mod:`simkv.engine.decode_run`) are events alike.
"""

from __future__ import annotations

import numpy as np

from simkv.ledger import ALLOC, COPY, FREE, ROW, pick

NO_ROWS = np.empty(0, dtype=ROW)
NO_BYTES = np.empty(0, dtype=np.int64)


def alloc_delta(rows: np.ndarray) -> np.ndarray:
    """Change of allocated bytes each ledger row causes."""
    op = rows["op"]
    return np.where(op == ALLOC, rows["bytes"], np.where(op == FREE, -rows["bytes"], 0))


def alloc_slots(order: np.ndarray, k: int) -> np.ndarray:
    """A unit's ``k`` slots in the order the row ``order`` allocates them (per unit for a 2-D order)."""
    if order.ndim == 2:
        return (order[order // k == ALLOC] % k).reshape(len(order), k)
    return order[order // k == ALLOC] % k


def fresh_ids(next_id: int, n: int, order: np.ndarray, k: int) -> np.ndarray:
    """Fresh buffer ids from ``next_id`` on for ``n`` units' ``k`` slots each, ``(n, k)``, numbered
    in the order the row ``order`` (one for all, or one per unit) allocates them: a slot's offset
    within its unit is its rank among the unit's allocations."""
    rank = np.argsort(alloc_slots(order, k), axis=-1)
    return next_id + k * np.arange(n, dtype=np.int64)[:, None] + (rank if order.ndim == 2 else rank[None, :])


class Events:
    """(Re)allocations of units, one per entry, with what their rows need."""

    def __init__(self, *, unit, step, needed, copied, new_cap, batch, old_rows, old_batch, old_ids, old_resident, ids):
        # old_rows: per event (a unit's slots all alike), or per event and slot (after a trim)
        self.unit, self.step, self.needed, self.copied = unit, step, needed, copied
        self.new_cap, self.batch = new_cap, batch
        self.old_rows, self.old_batch, self.old_ids, self.old_resident = old_rows, old_batch, old_ids, old_resident
        self.ids = ids


def _col(a):
    """A per-event value as a column that broadcasts over a unit's slots."""
    return np.asarray(a)[:, None] if np.ndim(a) else a


def event_rows(layout, ev: Events, phase: int, order: np.ndarray, request: int, first_touch: bool):
    """Per event, a unit's (alloc, copy, free) rows for each slot in runtime order (``order``: one
    for all events, or one per event), which of them happen, and the change of resident memory each
    causes. An absent slot (0 bytes: a state unit's scale or beam-table place) never happens."""
    slots = layout.unit_slots[ev.unit]  # (events, slots per unit)
    n, k = slots.shape
    row_bytes = layout.row_bytes[slots]
    block = np.zeros((n, 3, k), dtype=ROW)
    block["step"] = _col(ev.step)[..., None] if np.ndim(ev.step) else ev.step
    block["phase"], block["request"] = phase, request
    block["layer"] = layout.layer[slots][:, None, :]
    block["tensor"] = layout.tensor[slots][:, None, :]
    block["op"] = np.array([ALLOC, COPY, FREE], dtype=np.int8)[None, :, None]
    alloc, copy, free = block[:, 0], block[:, 1], block[:, 2]
    alloc["bytes"] = _col(ev.new_cap) * ev.batch * row_bytes
    alloc["capacity_tokens"] = copy["capacity_tokens"] = _col(ev.new_cap)
    alloc["used_tokens"] = _col(ev.needed)
    alloc["buffer"] = copy["buffer"] = ev.ids
    copy["bytes"] = _col(ev.copied) * ev.batch * row_bytes
    copy["used_tokens"] = _col(ev.copied)
    old_rows = ev.old_rows if np.ndim(ev.old_rows) == 2 else _col(ev.old_rows)  # per slot after a trim
    free["bytes"] = old_rows * row_bytes
    free["capacity_tokens"] = old_rows // ev.old_batch
    free["used_tokens"] = _col(ev.copied)
    free["buffer"] = ev.old_ids

    had = np.broadcast_to(old_rows > 0, (n, k))
    present = row_bytes > 0
    happens = np.zeros((n, 3, k), dtype=bool)
    happens[:, 0] = present
    happens[:, 1] = had & (_col(ev.copied) > 0) & present
    happens[:, 2] = had & present
    zeros = np.zeros((n, k), dtype=np.int64)
    if first_touch:
        resident = np.stack([zeros, copy["bytes"], -np.broadcast_to(ev.old_resident, (n, k))], axis=1)
    else:
        resident = np.stack([alloc["bytes"], zeros, -free["bytes"]], axis=1)
    if order.ndim == 2:
        index = (np.arange(n)[:, None], order)
    else:
        index = (slice(None), order)
    flat = lambda a: a.reshape(n, 3 * k)[index]  # noqa: E731
    return pick(block.reshape(n, 3 * k), index), flat(happens), flat(resident)

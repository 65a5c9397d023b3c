"""A run of decode steps of a stateless policy (``policy.stateless``), planned at once.

Such a policy keeps nothing between steps: each step allocates every slot for the whole
history (no copy: the history is recomputed into the fresh buffers), writes it, and frees
every buffer at the step's end. So every step of the run has the same shape, one size
larger than the last. Planning reads the engine's state and changes nothing; the engine
commits the :class:`~simkv.engine.decode_run.Run`.
"""

from __future__ import annotations

import numpy as np

from simkv.engine.decode_run import NoPlan, Run
from simkv.engine.events import alloc_slots, fresh_ids
from simkv.engine.oom import over_device, too_large
from simkv.ledger import ALLOC, FREE, PHASE_CODE, ROW
from simkv.steps import STEP


def plan(eng, first_step: int, n: int) -> Run | NoPlan:
    """Plan ``n`` decode steps from ``first_step`` on; :class:`NoPlan` where the plain per-step path
    must decide (past view, rows still pending, live buffers, padded sizes, memory limits)."""
    lay, policy = eng.layout, eng.policy
    L0, B = eng.stored, eng.width
    U, K = lay.unit_slots.shape
    k = np.arange(1, n + 1, dtype=np.int64)
    needed = L0 + k
    caps = np.asarray(policy.capacity(np.repeat(needed, U), np.tile(lay.unit_prim, n)), dtype=np.int64)
    if policy.past_view or len(eng.pending) or eng.budget.any() or (caps != np.repeat(needed, U)).any():
        return NoPlan()
    if len(over_device(eng.allocated + int(needed[-1]) * B * eng.row_total, eng.scenario)):
        return NoPlan()
    # a buffer larger than the device's largest allocation ends the run (the per-step path says so)
    big = too_large(policy, needed * B * int(lay.row_bytes.max()))
    if np.any(big):
        return NoPlan(int(np.argmax(big)) + 1)
    order = eng.orders["grow"]
    ids = fresh_ids(eng.next_id, n * U, order, K).reshape(n, U, K)
    slots = lay.unit_slots  # (U, K)

    def rows_of(op, slot_index):
        out = np.zeros((n, U, K), dtype=ROW)
        s = np.take_along_axis(slots, slot_index, axis=1) if slot_index is not None else slots
        out["step"] = (first_step + k - 1)[:, None, None]
        out["phase"], out["request"], out["op"] = PHASE_CODE["decode"], eng.request, op
        out["layer"], out["tensor"] = lay.layer[s][None], lay.tensor[s][None]
        out["bytes"] = needed[:, None, None] * B * lay.row_bytes[s][None]
        out["capacity_tokens"] = out["used_tokens"] = needed[:, None, None]
        sid = ids if slot_index is None else np.take_along_axis(ids, np.broadcast_to(slot_index, (n, U, K)), axis=2)
        out["buffer"] = sid
        return out

    allocs = rows_of(ALLOC, np.broadcast_to(alloc_slots(order, K), (U, K)).copy())
    frees = rows_of(FREE, None)
    rows = np.concatenate([allocs.reshape(n, -1), frees.reshape(n, -1)], axis=1).ravel()
    steps = np.zeros(n, dtype=STEP)
    steps["step"], steps["phase"] = first_step + k - 1, PHASE_CODE["decode"]
    steps["tokens"], steps["batch"] = needed, B
    steps["allocated"] = eng.allocated
    steps["peak"] = eng.allocated + needed * B * eng.row_total
    steps["steady"], steps["used"] = eng.steady(), 0
    base = eng.resident if eng.first_touch else eng.allocated
    steps["resident"] = base
    steps["resident_peak"] = base + needed * B * eng.row_total if eng.first_touch else steps["peak"]
    return Run(rows, steps, eng.next_id + n * U * K, L0 + n, B, held=None)

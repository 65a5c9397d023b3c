"""The fast engine: only allocation events are events.

A session is a SimPy process whose clock counts steps (one per inference).
Single operations (prefill, chat turn, fork, select, reset) are processed as
one step, all units at once with array operations. A run of decode steps is
planned as a whole: every unit's chain of reallocations follows from its
capacity (the unit overflows when the history passes it, and the policy sizes
the next buffer), so the engine computes all chains together, one *wave* per
reallocation, builds every ledger row of the run at once, orders them as the
runtime would, and derives each step's memory from running sums. In-place
appends cost no event; the SimPy clock jumps over the whole run.

Near a device-memory limit the plan is discarded and the run is processed
step by step, where the limit rules apply sequentially. :mod:`simkv.reference`
does all of this the slow way, and the tests require identical output.
"""

from __future__ import annotations

import numpy as np
import simpy

from simkv.errors import SimkvError
from simkv.layout import Layout
from simkv.ledger import ALLOC, COPY, FREE, PHASE_CODE, ROW, Ledger
from simkv.memory import OutOfMemory
from simkv.steps import STEP, StepRecorder
from simkv.workload import Decode, Inference, inference_of

_NO_ROWS = np.empty(0, dtype=ROW)
_NO_BYTES = np.empty(0, dtype=np.int64)
# Order of rows inside a step: frees deferred from the previous inference, then
# each unit's (alloc, copy, free) rows, then the step's token writes, then frees
# deferred to the end of the step.
_PENDING, _UNITS, _WRITES, _END = range(4)


def alloc_delta(rows: np.ndarray) -> np.ndarray:
    """Change of allocated bytes each ledger row causes."""
    op = rows["op"]
    return np.where(op == ALLOC, rows["bytes"], np.where(op == FREE, -rows["bytes"], 0))


def limit_headroom(policy, needed, caps, unit_bytes, running_before, device_memory):
    """Apply the headroom limits (``headroom_limit``, ``max_alloc_bytes``) to one step's units.

    ``unit_bytes(i, cap)`` gives unit i's bytes at a capacity; ``running_before(i, bytes)``
    the allocated bytes just before unit i allocates, given the bytes chosen so far.
    Units are decided in order, as the runtime allocates them.
    """
    if not policy.headroom_limit and not policy.max_alloc_bytes:
        return caps
    caps = np.array(caps)
    limit = policy.headroom_limit * device_memory
    chosen = []
    for i in range(len(caps)):
        nbytes = unit_bytes(i, caps[i])
        over_limit = policy.headroom_limit and running_before(i, chosen) + nbytes >= limit
        if over_limit or (policy.max_alloc_bytes and nbytes > policy.max_alloc_bytes):
            caps[i] = needed
            nbytes = unit_bytes(i, caps[i])
        chosen.append(nbytes)
    return caps


class _Events:
    """(Re)allocations of units, one per entry, with everything needed to write their rows."""

    def __init__(self, unit, step, needed, copied, new_cap, old_cap, old_ids, old_resident, batch, old_batch):
        self.unit, self.step, self.needed, self.copied = unit, step, needed, copied
        self.new_cap, self.old_cap, self.old_ids, self.old_resident = new_cap, old_cap, old_ids, old_resident
        self.batch, self.old_batch = batch, old_batch


class FastEngine:
    def __init__(self, scenario, request: int = 0) -> None:
        self.scenario = scenario
        self.policy = scenario.policy
        self.first_touch = scenario.policy.first_touch
        lay = self.layout = Layout.build(scenario.model, scenario.precision, scenario.policy)
        self.request = request
        self.ledger = Ledger()
        self.steps = StepRecorder()
        self.oom: OutOfMemory | None = None
        # Live state, as arrays over units and slots.
        self.cap = np.zeros(lay.units, dtype=np.int64)  # capacity per unit; 0 = no buffers
        self.buf = np.full(len(lay.layer), -1, dtype=np.int64)  # live buffer id per slot
        self.written = np.zeros(len(lay.layer), dtype=np.int64)  # first-touch high-water mark per slot
        self.batch = 1  # beams of the live buffers
        self.width = 1  # beams of the session (after a reset: 1, whatever the kept buffers hold)
        self.stored = 0  # tokens per beam
        self.allocated = 0
        self.resident = 0
        self.next_id = 0
        # Frees due at the start of the next inference: rows and resident bytes they release.
        self.pending, self.pending_resident = _NO_ROWS, _NO_BYTES
        self.row_total = int(lay.row_bytes.sum())
        self.unit_row = lay.unit_row_bytes

    # -- the SimPy process ---------------------------------------------------

    def run(self) -> None:
        env = simpy.Environment()
        env.process(self._session(env))
        env.run()

    def _session(self, env: simpy.Environment):
        for op in self.scenario.workload.ops:
            if self.oom is not None:
                return
            if not isinstance(op, Decode):
                self._step(int(env.now), inference_of(op, self.width, self.stored))
                yield env.timeout(1)
                continue
            remaining, plan = op.steps, True
            while remaining and self.oom is None:
                reclaim = self._reclaims_next()
                if plan and not reclaim and self._decode_run(int(env.now), remaining):
                    done = remaining
                else:
                    # One step at a time: a reclaim is due (then plan again), or the plan
                    # met a memory limit, where the limit rules must apply step by step.
                    plan = plan and reclaim
                    self._step(int(env.now), Inference("decode", 1, self.width, self.width))
                    done = 1
                remaining -= done
                yield env.timeout(done)

    def _reclaims_next(self) -> bool:
        needed = np.full(self.layout.units, self.stored + 1, dtype=np.int64)
        fits = needed <= self.cap
        return bool((fits & self.policy.reclaim(needed, self.layout.unit_prim, self.cap)).any())

    # -- rows of (re)allocations ---------------------------------------------

    def _event_rows(self, ev: _Events, phase: int):
        """Per event: one (alloc, copy, free) row triple per slot, the rows that happen,
        and the change of resident memory each row causes."""
        lay = self.layout
        slots = lay.unit_slots[ev.unit]  # (events, slots per unit)
        n, k = slots.shape
        ids = self.next_id + np.arange(n * k, dtype=np.int64).reshape(n, k)
        self.next_id += n * k
        row_bytes = lay.row_bytes[slots]
        col = lambda a: np.asarray(a)[:, None] if np.ndim(a) else a  # noqa: E731

        block = np.zeros((n, 3, k), dtype=ROW)
        block["step"] = col(ev.step)[:, None] if np.ndim(ev.step) else ev.step
        block["phase"], block["request"] = phase, self.request
        block["layer"] = lay.layer[slots][:, None, :]
        block["tensor"] = lay.tensor[slots][:, None, :]
        block["op"] = np.array([ALLOC, COPY, FREE], dtype=np.int8)[None, :, None]
        alloc, copy, free = block[:, 0], block[:, 1], block[:, 2]
        alloc["bytes"] = col(ev.new_cap) * ev.batch * row_bytes
        alloc["capacity_tokens"] = copy["capacity_tokens"] = col(ev.new_cap)
        alloc["used_tokens"] = col(ev.needed)
        alloc["buffer"] = copy["buffer"] = ids
        copy["bytes"] = col(ev.copied) * ev.batch * row_bytes
        copy["used_tokens"] = col(ev.copied)
        free["bytes"] = col(ev.old_cap) * ev.old_batch * row_bytes
        free["capacity_tokens"] = col(ev.old_cap)
        free["used_tokens"] = col(ev.copied)
        free["buffer"] = ev.old_ids

        had = np.broadcast_to(col(ev.old_cap) > 0, (n, k))
        happens = np.zeros((n, 3, k), dtype=bool)
        happens[:, 0] = True
        happens[:, 1] = had & (col(ev.copied) > 0)
        happens[:, 2] = had
        if self.first_touch:
            resident = np.stack([np.zeros((n, k), dtype=np.int64), copy["bytes"], -ev.old_resident], axis=1)
        else:
            resident = np.stack([alloc["bytes"], np.zeros((n, k), dtype=np.int64), -free["bytes"]], axis=1)
        return block, happens, resident, ids

    # -- one step ------------------------------------------------------------

    def _step(self, step: int, inf: Inference) -> None:
        lay, policy = self.layout, self.policy
        phase = PHASE_CODE[inf.phase]
        before = (self.stored, self.batch, self._used())
        self.width = inf.batch
        rows = [self.pending.copy()]
        rows[0]["step"], rows[0]["phase"] = step, phase
        resident_delta = [-self.pending_resident if self.first_touch else -self.pending["bytes"]]
        self.pending, self.pending_resident = _NO_ROWS, _NO_BYTES
        deferred, deferred_resident = _NO_ROWS, _NO_BYTES
        needed = 0
        if inf.phase == "reset":
            if policy.reset == "free" and self.cap.any():
                slots = lay.unit_slots[np.flatnonzero(self.cap)].ravel()
                free = self._live_rows(slots, step, phase)
                rows.append(free)
                resident_delta.append(-self._live_resident(slots) if self.first_touch else -free["bytes"])
                self.cap[:], self.buf[:], self.written[:], self.batch = 0, -1, 0, 1
        else:
            needed = self.stored + inf.tokens
            fits = (self.cap > 0) & (inf.batch == self.batch) & (needed <= self.cap)
            needed_all = np.full(lay.units, needed, dtype=np.int64)
            fits &= ~policy.reclaim(needed_all, lay.unit_prim, self.cap)
            units = np.flatnonzero(~fits)
            if len(units):
                block, happens, resident, ids = self._reallocate(units, needed, inf.batch, step, phase, rows)
                deferred_mask = happens.copy()
                deferred_mask[:, :2] = False
                if policy.free_old != "immediate":
                    happens[:, 2] = False
                rows.append(block[happens])
                resident_delta.append(resident[happens])
                deferred, deferred_resident = block[deferred_mask], -resident[deferred_mask]
                if not self.first_touch:
                    deferred_resident = deferred["bytes"]

        rows, resident_delta = np.concatenate(rows), np.concatenate(resident_delta)
        allocated = self.allocated + np.cumsum(alloc_delta(rows))
        over = np.flatnonzero(allocated > self.scenario.device_memory)
        if len(over):
            return self._out_of_memory(step, phase, before, rows, resident_delta, int(over[0]))
        resident = self.resident + np.cumsum(resident_delta)
        peak = int(allocated.max(initial=self.allocated))
        resident_peak = int(resident.max(initial=self.resident))
        self.ledger.append(rows)
        if len(rows):
            self.allocated, self.resident = int(allocated[-1]), int(resident[-1])

        if inf.phase == "reset":
            self.stored = 0
        else:
            self.stored = needed
            if self.first_touch:
                growth = np.maximum(needed - self.written, 0)
                self.resident += int((growth * lay.row_bytes).sum()) * self.batch
                np.maximum(self.written, needed, out=self.written)
        resident_peak = max(resident_peak, self.resident)

        if policy.free_old == "next_inference":
            self.pending, self.pending_resident = deferred, deferred_resident
        elif policy.free_old == "end_of_step" and len(deferred):
            self.ledger.append(deferred)
            self.allocated -= int(deferred["bytes"].sum())
            self.resident -= int(deferred_resident.sum())
        self._record(step, phase, peak, resident_peak)

    def _reallocate(self, units, needed, batch, step, phase, rows_so_far):
        lay, policy = self.layout, self.policy
        caps = np.asarray(policy.capacity(np.full(len(units), needed, dtype=np.int64), lay.unit_prim[units]), dtype=np.int64)
        if caps.shape != units.shape or (caps < needed).any():
            raise SimkvError(f"policy {policy.name} returned a capacity below the {needed} tokens needed")
        old_cap = self.cap[units]
        old_unit_bytes = old_cap * self.unit_row[units] * self.batch
        start = self.allocated + sum(int(alloc_delta(r).sum()) for r in rows_so_far)
        immediate = policy.free_old == "immediate"
        caps = limit_headroom(
            policy, needed, caps,
            unit_bytes=lambda i, cap: int(cap) * int(self.unit_row[units[i]]) * batch,
            running_before=lambda i, chosen: start + sum(chosen) - (int(old_unit_bytes[:i].sum()) if immediate else 0),
            device_memory=self.scenario.device_memory,
        )
        slots = lay.unit_slots[units]
        ev = _Events(
            unit=units, step=step, needed=needed, copied=self.stored, new_cap=caps, old_cap=old_cap,
            old_ids=self.buf[slots], old_resident=self._live_resident(slots),
            batch=batch, old_batch=self.batch,
        )
        block, happens, resident, ids = self._event_rows(ev, phase)
        self.cap[units] = caps
        self.buf[slots] = ids
        had = (old_cap > 0)[:, None]
        self.written[slots] = np.where(had, self.stored, 0)
        self.batch = batch
        return block, happens, resident, ids

    def _live_rows(self, slots: np.ndarray, step: int, phase: int) -> np.ndarray:
        lay = self.layout
        cap = self.cap[slots // lay.unit_slots.shape[1]]
        rows = np.zeros(len(slots), dtype=ROW)
        rows["step"], rows["phase"], rows["request"], rows["op"] = step, phase, self.request, FREE
        rows["layer"] = lay.layer[slots]
        rows["tensor"] = lay.tensor[slots]
        rows["bytes"] = cap * self.batch * lay.row_bytes[slots]
        rows["capacity_tokens"] = cap
        rows["used_tokens"] = self.stored
        rows["buffer"] = self.buf[slots]
        return rows

    def _live_resident(self, slots: np.ndarray) -> np.ndarray:
        return self.written[slots] * self.batch * self.layout.row_bytes[slots]

    # -- a run of decode steps -----------------------------------------------

    def _decode_run(self, first_step: int, n: int) -> bool:
        """Plan ``n`` one-token decode steps at once; False (nothing changed) if a limit intervenes."""
        lay, policy = self.layout, self.policy
        L0, B = self.stored, self.batch
        U, K = lay.unit_slots.shape
        first_id = self.next_id  # restored if the plan is discarded

        # 1. Each unit's chain of reallocations, one wave per link.
        cap = self.cap.copy()
        chains = []  # (unit, k, old cap, new cap) per wave; k = 1..n is the step within the run
        k_next = cap + 1 - L0
        active = np.flatnonzero(k_next <= n)
        while len(active):
            k = k_next[active]
            new = np.asarray(policy.capacity(L0 + k, lay.unit_prim[active]), dtype=np.int64)
            if (new < L0 + k).any():
                raise SimkvError(f"policy {policy.name} returned a capacity below the tokens needed")
            chains.append((active, k, cap[active].copy(), new))
            cap[active] = new
            k_next[active] = new + 1 - L0
            active = active[k_next[active] <= n]
        if chains:
            unit, k, old_cap, new_cap = (np.concatenate(c) for c in zip(*chains))
        else:
            unit = k = old_cap = new_cap = _NO_BYTES
        if policy.max_alloc_bytes and (new_cap * self.unit_row[unit] * B > policy.max_alloc_bytes).any():
            return False

        # 2. Old buffers: the live one for a unit's first link, the previous link's otherwise.
        order = np.lexsort((unit, k))  # runtime order: by step, then unit
        unit, k, old_cap, new_cap = unit[order], k[order], old_cap[order], new_cap[order]
        E = len(unit)
        by_unit = np.lexsort((k, unit))
        new_ids = self.next_id + np.arange(E * K, dtype=np.int64).reshape(E, K)
        first_link = np.ones(E, dtype=bool)
        prev = np.full(E, -1, dtype=np.int64)
        su = unit[by_unit]
        same = np.zeros(E, dtype=bool)
        same[1:] = su[1:] == su[:-1]
        first_link[by_unit] = ~same
        prev[by_unit[same]] = by_unit[np.flatnonzero(same) - 1]
        slots = lay.unit_slots[unit]
        old_ids = np.where(first_link[:, None], self.buf[slots], new_ids[np.maximum(prev, 0)])
        held = (L0 + k - 1)[:, None]  # tokens written in the old buffer when it is replaced
        old_written = np.where(first_link[:, None], np.maximum(self.written[slots], held), held)
        ev = _Events(
            unit=unit, step=first_step + k - 1, needed=L0 + k, copied=L0 + k - 1, new_cap=new_cap,
            old_cap=old_cap, old_ids=old_ids, old_resident=old_written * B * lay.row_bytes[slots],
            batch=B, old_batch=B,
        )
        block, happens, resident, ids = self._event_rows(ev, PHASE_CODE["decode"])
        assert (ids == new_ids).all()

        # 3. One stream of rows with sort keys; pseudo-rows carry each step's token writes.
        def key(step_k, section, u, op, slot):
            return (((step_k * 4 + section) * U + u) * 3 + op) * K + slot

        op_idx = np.broadcast_to(np.arange(3)[None, :, None], block.shape)
        slot_idx = np.broadcast_to(np.arange(K)[None, None, :], block.shape)
        kk = np.broadcast_to(k[:, None, None], block.shape)
        uu = np.broadcast_to(unit[:, None, None], block.shape)
        immediate = policy.free_old == "immediate"
        section = np.full(block.shape, _UNITS)
        if not immediate:
            late = policy.free_old == "next_inference"
            section[:, 2] = _PENDING if late else _END
            kk = kk.copy()
            kk[:, 2] += late
        keys = key(kk, section, uu, op_idx, slot_idx)[happens]
        rows = block[happens]

        steps_k = np.arange(1, n + 1, dtype=np.int64)
        writes = np.full(n, B * self.row_total, dtype=np.int64)
        if self.first_touch:
            writes -= self._rows_not_written(L0, n, unit, k) * B
        pseudo = np.zeros(n, dtype=ROW)
        pseudo["op"] = -1
        pre = len(self.pending)
        pending_rows = self.pending.copy()
        pending_rows["step"], pending_rows["phase"] = first_step, PHASE_CODE["decode"]
        all_rows = np.concatenate([pending_rows, rows, pseudo])
        all_keys = np.concatenate([np.full(pre, key(1, _PENDING, 0, 0, 0)), keys, key(steps_k, _WRITES, 0, 0, 0)])
        all_res = np.concatenate([-self.pending_resident, resident[happens], writes])
        sort = np.argsort(all_keys, kind="stable")
        all_rows, all_keys, all_res = all_rows[sort], all_keys[sort], all_res[sort]
        row_k = all_keys // (4 * U * 3 * K)
        inside = row_k <= n
        all_rows["step"] = first_step + row_k - 1  # frees deferred to the next inference move on
        carried = all_rows[~inside]
        carried_res = -all_res[~inside]
        all_rows, row_k, all_res = all_rows[inside], row_k[inside], all_res[inside]

        # 4. Memory along the stream, then per step.
        real = all_rows["op"] >= 0
        delta = np.where(real, alloc_delta(all_rows), 0)
        running = self.allocated + np.cumsum(delta)
        if (running > self.scenario.device_memory).any():
            self.next_id = first_id
            return False
        if policy.headroom_limit and len(rows):
            # The limit looks at what is allocated just before an event's first
            # alloc row plus all the event's bytes (its K alloc rows are contiguous).
            allocs = np.flatnonzero(all_rows["op"] == ALLOC)
            before = running[allocs[::K]] - delta[allocs[::K]]
            event_bytes = np.add.reduceat(all_rows["bytes"][allocs], np.arange(0, len(allocs), K))
            if (before + event_bytes >= policy.headroom_limit * self.scenario.device_memory).any():
                self.next_id = first_id
                return False
        if self.first_touch:
            resident_run = self.resident + np.cumsum(all_res)
        else:
            resident_run = running
        starts = np.searchsorted(row_k, steps_k)
        ends = np.r_[starts[1:], len(row_k)] - 1
        end_alloc, end_res = running[ends], resident_run[ends]
        prev_alloc = np.r_[self.allocated, end_alloc[:-1]]
        prev_res = np.r_[self.resident if self.first_touch else self.allocated, end_res[:-1]]
        peak = np.maximum(np.maximum.reduceat(running, starts), prev_alloc)
        res_peak = np.maximum(np.maximum.reduceat(resident_run, starts), prev_res)
        steady_change = np.zeros(n + 1, dtype=np.int64)
        np.add.at(steady_change, k, (new_cap - old_cap) * self.unit_row[unit] * B)
        steady = self._steady() + np.cumsum(steady_change[1:])

        block_steps = np.zeros(n, dtype=STEP)
        block_steps["step"] = first_step + steps_k - 1
        block_steps["phase"] = PHASE_CODE["decode"]
        block_steps["tokens"] = L0 + steps_k
        block_steps["batch"] = B
        block_steps["allocated"], block_steps["peak"] = end_alloc, peak
        block_steps["steady"] = steady
        block_steps["used"] = (L0 + steps_k) * B * self.row_total
        block_steps["resident"], block_steps["resident_peak"] = end_res, res_peak

        # 5. Commit.
        self.ledger.append(all_rows[real])
        self.steps.add_block(block_steps)
        self.pending, self.pending_resident = carried, carried_res if self.first_touch else carried["bytes"]
        self.allocated = int(end_alloc[-1])
        self.resident = int(end_res[-1]) if self.first_touch else self.allocated
        if E:
            last = np.ones(E, dtype=bool)
            last[by_unit[:-1]] = su[1:] != su[:-1]
            self.buf[slots[last]] = new_ids[last]
            self.written[slots[last]] = 0
        self.cap = cap
        self.stored = L0 + n
        np.maximum(self.written, self.stored, out=self.written)
        return True

    def _rows_not_written(self, L0: int, n: int, unit: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Per step, row bytes of slots whose new token lands below their high-water mark.

        Only slots written past the history (kept across a reset) qualify, and only
        until they are reallocated (a new buffer is written from its copy on).
        """
        lay = self.layout
        out = np.zeros(n + 2, dtype=np.int64)
        high = np.flatnonzero(self.written > L0)
        if not len(high):
            return out[1 : n + 1]
        first_event = np.full(lay.units, n + 1, dtype=np.int64)
        np.minimum.at(first_event, unit, k)
        slot_unit = np.repeat(np.arange(lay.units), lay.unit_slots.shape[1])[high]
        until = np.minimum(first_event[slot_unit] - 1, self.written[high] - L0)
        np.add.at(out, np.ones_like(high), lay.row_bytes[high])
        np.add.at(out, np.minimum(until, n) + 1, -lay.row_bytes[high])
        return np.cumsum(out)[1 : n + 1]

    # -- bookkeeping -----------------------------------------------------------

    def _steady(self) -> int:
        return int((self.cap * self.unit_row).sum()) * self.batch

    def _used(self) -> int:
        return self.stored * self.batch * self.row_total if self.cap.any() else 0

    def _record(self, step, phase, peak, resident_peak, tokens=None, batch=None, steady=None, used=None) -> None:
        self.steps.add(
            step, phase,
            self.stored if tokens is None else tokens,
            self.batch if batch is None else batch,
            self.allocated, peak,
            self._steady() if steady is None else steady,
            self._used() if used is None else used,
            self.resident if self.first_touch else self.allocated,
            resident_peak if self.first_touch else peak,
        )

    def _out_of_memory(self, step, phase, before, rows, resident_delta, failing) -> None:
        """Keep the rows before the allocation that does not fit, record the partial step, stop.

        The step's row shows the state before the step (tokens, batch, used), what
        was allocated when the allocation failed, and ``steady`` = that allocation.
        """
        done = rows[:failing]
        allocated = self.allocated + np.cumsum(alloc_delta(done))
        resident = self.resident + np.cumsum(resident_delta[:failing])
        peak = int(allocated.max(initial=self.allocated))
        resident_peak = int(resident.max(initial=self.resident))
        self.ledger.append(done)
        if failing:
            self.allocated, self.resident = int(allocated[-1]), int(resident[-1])
        self.oom = OutOfMemory(
            step, int(rows[failing]["layer"]), int(rows[failing]["bytes"]), self.allocated, self.scenario.device_memory
        )
        tokens, batch, used = before
        self._record(step, phase, peak, resident_peak, tokens=tokens, batch=batch, steady=self.allocated, used=used)

"""The fast engine: only allocation events are events.

A session is a SimPy process whose clock counts steps (one per operation).
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

Buffers are sized in *rows* (token positions × beams), as in
:class:`simkv.memory.Buffer`: ``budget`` holds each unit's rows, ``written``
each slot's first-touch high-water mark in rows.
"""

from __future__ import annotations

import numpy as np
import simpy

from simkv.errors import SimkvError
from simkv.layout import PAST_VIEW_BYTES, Layout
from simkv.ledger import ALLOC, COPY, FREE, PHASE_CODE, ROW, TENSOR_CODE, Ledger
from simkv.memory import OutOfMemory
from simkv.steps import STEP, StepRecorder
from simkv.workload import Decode, Inference, inference_of

_NO_ROWS = np.empty(0, dtype=ROW)
_NO_BYTES = np.empty(0, dtype=np.int64)
# Order of rows inside a step: frees deferred from the previous inference, the
# past-view block, each unit's rows, the step's token writes, frees deferred to
# the end of the step.
_PENDING, _VIEW, _UNITS, _WRITES, _END = range(5)
_SECTIONS = 5


def alloc_delta(rows: np.ndarray) -> np.ndarray:
    """Change of allocated bytes each ledger row causes."""
    op = rows["op"]
    return np.where(op == ALLOC, rows["bytes"], np.where(op == FREE, -rows["bytes"], 0))


def limit_headroom(policy, needed, caps, unit_bytes, running_before, device_memory, weights=0):
    """Apply the headroom limits (``headroom_limit``, ``max_alloc_bytes``) to one step's units.

    ``unit_bytes(i, cap)`` gives unit i's bytes at a capacity; ``running_before(i, chosen)``
    the allocated bytes just before unit i allocates, given the bytes chosen so far.
    Units are decided in order, as the runtime allocates them. ``weights``: device
    memory in use besides the KV cache, counted toward the limit.
    """
    if not policy.headroom_limit and not policy.max_alloc_bytes:
        return caps
    caps = np.array(caps)
    limit = policy.headroom_limit * device_memory - weights
    chosen: list[int] = []
    for i in range(len(caps)):
        nbytes = unit_bytes(i, caps[i])
        over_limit = policy.headroom_limit and running_before(i, chosen) + nbytes >= limit
        if over_limit or (policy.max_alloc_bytes and nbytes > policy.max_alloc_bytes):
            caps[i] = needed
            nbytes = unit_bytes(i, caps[i])
        chosen.append(nbytes)
    return caps


class _Events:
    """(Re)allocations of units, one per entry, with what their rows need."""

    def __init__(self, *, unit, step, needed, copied, new_cap, batch, old_rows, old_batch, old_ids, old_resident, ids):
        self.unit, self.step, self.needed, self.copied = unit, step, needed, copied
        self.new_cap, self.batch = new_cap, batch
        self.old_rows, self.old_batch, self.old_ids, self.old_resident = old_rows, old_batch, old_ids, old_resident
        self.ids = ids


def _col(a):
    """A per-event value as a column that broadcasts over a unit's slots."""
    return np.asarray(a)[:, None] if np.ndim(a) else a


class FastEngine:
    def __init__(self, scenario, request: int = 0) -> None:
        self.scenario = scenario
        self.policy = policy = scenario.policy
        self.first_touch = policy.first_touch
        lay = self.layout = Layout.build(scenario.model, scenario.precision, policy)
        self.request = request
        self.ledger = Ledger()
        self.steps = StepRecorder()
        self.oom: OutOfMemory | None = None
        self.orders = {kind: lay.row_order((policy.row_orders or {}).get(kind)) for kind in ("grow", "grow_empty", "rebatch")}
        # Live state, as arrays over units and slots.
        self.budget = np.zeros(lay.units, dtype=np.int64)  # rows per unit; 0 = no buffers
        self.buf = np.full(len(lay.layer), -1, dtype=np.int64)  # live buffer id per slot
        self.written = np.zeros(len(lay.layer), dtype=np.int64)  # first-touch high-water mark (rows)
        self.batch = 1  # beams the live buffers hold
        self.width = 1  # beams of the session (after a reset: 1, whatever the kept buffers hold)
        self.stored = 0  # tokens per beam
        self.after_reset = False
        self.allocated = 0
        self.resident = 0
        self.next_id = 0
        # Frees due at the start of the next inference: rows and the resident bytes they release.
        self.pending, self.pending_resident = _NO_ROWS, _NO_BYTES
        # The CPU plugin's model-wide past block (policy.past_view).
        self.view_row_bytes = scenario.model.kv_heads * scenario.model.head_dim * PAST_VIEW_BYTES
        self.view = {"bytes": 0, "id": -1, "tokens": 0}
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
        fits = self.batch * needed <= self.budget
        return bool((fits & self.policy.reclaim(needed, self.layout.unit_prim, self.budget // self.batch)).any())

    # -- rows ------------------------------------------------------------------

    def _event_rows(self, ev: _Events, phase: int, order: np.ndarray):
        """Per event, a unit's (alloc, copy, free) rows for each slot in runtime order,
        which of them happen, and the change of resident memory each causes."""
        lay = self.layout
        slots = lay.unit_slots[ev.unit]  # (events, slots per unit)
        n, k = slots.shape
        row_bytes = lay.row_bytes[slots]
        block = np.zeros((n, 3, k), dtype=ROW)
        block["step"] = _col(ev.step)[..., None] if np.ndim(ev.step) else ev.step
        block["phase"], block["request"] = phase, self.request
        block["layer"] = lay.layer[slots][:, None, :]
        block["tensor"] = lay.tensor[slots][:, None, :]
        block["op"] = np.array([ALLOC, COPY, FREE], dtype=np.int8)[None, :, None]
        alloc, copy, free = block[:, 0], block[:, 1], block[:, 2]
        alloc["bytes"] = _col(ev.new_cap) * ev.batch * row_bytes
        alloc["capacity_tokens"] = copy["capacity_tokens"] = _col(ev.new_cap)
        alloc["used_tokens"] = _col(ev.needed)
        alloc["buffer"] = copy["buffer"] = ev.ids
        copy["bytes"] = _col(ev.copied) * ev.batch * row_bytes
        copy["used_tokens"] = _col(ev.copied)
        free["bytes"] = _col(ev.old_rows) * row_bytes
        free["capacity_tokens"] = _col(ev.old_rows) // ev.old_batch
        free["used_tokens"] = _col(ev.copied)
        free["buffer"] = ev.old_ids

        had = np.broadcast_to(_col(ev.old_rows) > 0, (n, k))
        happens = np.zeros((n, 3, k), dtype=bool)
        happens[:, 0] = True
        happens[:, 1] = had & (_col(ev.copied) > 0)
        happens[:, 2] = had
        zeros = np.zeros((n, k), dtype=np.int64)
        if self.first_touch:
            resident = np.stack([zeros, copy["bytes"], -np.broadcast_to(ev.old_resident, (n, k))], axis=1)
        else:
            resident = np.stack([alloc["bytes"], zeros, -free["bytes"]], axis=1)
        flat = lambda a: a.reshape(n, 3 * k)[:, order]  # noqa: E731
        return flat(block), flat(happens), flat(resident)

    def _view_rows(self, step: int, phase: int, rows_needed: int, tokens: int, new_id: int):
        """Rows growing the past-view block to ``rows_needed`` rows, if it must grow."""
        nbytes = rows_needed * self.view_row_bytes
        if nbytes <= self.view["bytes"]:
            return _NO_ROWS
        out = np.zeros(2 if self.view["bytes"] else 1, dtype=ROW)
        out["step"], out["phase"], out["request"], out["layer"] = step, phase, self.request, -1
        out["tensor"] = TENSOR_CODE["past_view"]
        out[0]["op"], out[0]["bytes"], out[0]["capacity_tokens"], out[0]["buffer"] = ALLOC, nbytes, tokens, new_id
        if len(out) == 2:
            old = self.view
            out[1]["op"], out[1]["bytes"], out[1]["buffer"] = FREE, old["bytes"], old["id"]
            out[1]["capacity_tokens"] = old["tokens"]
        self.view = {"bytes": nbytes, "id": new_id, "tokens": tokens}
        return out

    # -- one step --------------------------------------------------------------

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
            if policy.reset == "free" and self.budget.any():
                slots = lay.unit_slots[np.flatnonzero(self.budget)].ravel()
                free = self._live_rows(slots, step, phase)
                rows.append(free)
                resident_delta.append(-self._live_resident(slots) if self.first_touch else -free["bytes"])
                self.budget[:], self.buf[:], self.written[:], self.batch = 0, -1, 0, 1
            self.after_reset = True
        else:
            if policy.past_view:
                view = self._view_rows(step, phase, inf.batch_in * self.stored, self.stored, self.next_id)
                self.next_id += int((view["op"] == ALLOC).sum())
                rows.append(view)
                resident_delta.append(np.zeros(len(view), dtype=np.int64) if self.first_touch else alloc_delta(view))
            needed = self.stored + inf.tokens
            has = self.budget > 0
            if has.any() and inf.batch != self.batch and policy.reset_adopts_batch and self.after_reset:
                self.batch = inf.batch  # the kept buffers now hold rows of the new width
            rebatch = has & (inf.batch != self.batch)
            fits = has & ~rebatch & (inf.batch * needed <= self.budget)
            needed_all = np.full(lay.units, needed, dtype=np.int64)
            fits &= ~policy.reclaim(needed_all, lay.unit_prim, self.budget // self.batch)
            units = np.flatnonzero(~fits)
            if len(units):
                kind = "rebatch" if rebatch.any() else "grow_empty" if has.any() and not self.stored else "grow"
                block, happens, resident = self._reallocate(units, needed, inf.batch, step, phase, rows, kind)
                is_free = block["op"] == FREE
                deferred_mask = happens & is_free
                if policy.free_old != "immediate":
                    happens &= ~is_free
                rows.append(block[happens])
                resident_delta.append(resident[happens])
                deferred, deferred_resident = block[deferred_mask], -resident[deferred_mask]
            self.after_reset = False

        rows, resident_delta = np.concatenate(rows), np.concatenate(resident_delta)
        allocated = self.allocated + np.cumsum(alloc_delta(rows))
        over = np.flatnonzero(allocated + self.scenario.weights_memory > self.scenario.device_memory)
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
                growth = np.maximum(needed * self.batch - self.written, 0)
                self.resident += int((growth * lay.row_bytes).sum())
                np.maximum(self.written, needed * self.batch, out=self.written)
        resident_peak = max(resident_peak, self.resident)

        if policy.free_old == "next_inference":
            self.pending, self.pending_resident = deferred, deferred_resident
        elif policy.free_old == "end_of_step" and len(deferred):
            self.ledger.append(deferred)
            self.allocated -= int(deferred["bytes"].sum())
            self.resident -= int(deferred_resident.sum())
        self._record(step, phase, peak, resident_peak)

    def _reallocate(self, units, needed, batch, step, phase, rows_so_far, kind):
        lay, policy = self.layout, self.policy
        caps = np.asarray(policy.capacity(np.full(len(units), needed, dtype=np.int64), lay.unit_prim[units]), dtype=np.int64)
        if caps.shape != units.shape or (caps < needed).any():
            raise SimkvError(f"policy {policy.name} returned a capacity below the {needed} tokens needed")
        old_rows = self.budget[units]
        old_unit_bytes = old_rows * self.unit_row[units]
        start = self.allocated + sum(int(alloc_delta(r).sum()) for r in rows_so_far)
        immediate = policy.free_old == "immediate"
        caps = limit_headroom(
            policy, needed, caps,
            unit_bytes=lambda i, cap: int(cap) * int(self.unit_row[units[i]]) * batch,
            running_before=lambda i, chosen: start + sum(chosen) - (int(old_unit_bytes[:i].sum()) if immediate else 0),
            device_memory=self.scenario.device_memory, weights=self.scenario.weights_memory,
        )
        slots = lay.unit_slots[units]
        ids = self._ids_in_order(len(units), self.orders[kind])
        ev = _Events(
            unit=units, step=step, needed=needed, copied=self.stored, new_cap=caps, batch=batch,
            old_rows=old_rows, old_batch=self.batch, old_ids=self.buf[slots],
            old_resident=self._live_resident(slots), ids=ids,
        )
        out = self._event_rows(ev, phase, self.orders[kind])
        self.budget[units] = caps * batch
        self.buf[slots] = ids
        self.written[slots] = np.where((old_rows > 0)[:, None], self.stored * batch, 0)
        self.batch = batch
        return out

    def _ids_in_order(self, n: int, order: np.ndarray) -> np.ndarray:
        """Fresh buffer ids for ``n`` units' slots, numbered in the order they are allocated."""
        k = self.layout.unit_slots.shape[1]
        alloc_slots = order[order // k == ALLOC] % k
        rank = np.argsort(alloc_slots)
        ids = self.next_id + k * np.arange(n, dtype=np.int64)[:, None] + rank[None, :]
        self.next_id += n * k
        return ids

    def _live_rows(self, slots: np.ndarray, step: int, phase: int) -> np.ndarray:
        lay = self.layout
        budget = self.budget[slots // lay.unit_slots.shape[1]]
        rows = np.zeros(len(slots), dtype=ROW)
        rows["step"], rows["phase"], rows["request"], rows["op"] = step, phase, self.request, FREE
        rows["layer"] = lay.layer[slots]
        rows["tensor"] = lay.tensor[slots]
        rows["bytes"] = budget * lay.row_bytes[slots]
        rows["capacity_tokens"] = budget // self.batch
        rows["used_tokens"] = self.stored
        rows["buffer"] = self.buf[slots]
        return rows

    def _live_resident(self, slots: np.ndarray) -> np.ndarray:
        return self.written[slots] * self.layout.row_bytes[slots]

    # -- a run of decode steps -------------------------------------------------

    def _decode_run(self, first_step: int, n: int) -> bool:
        """Plan ``n`` one-token decode steps at once; False (nothing changed) if a limit intervenes."""
        lay, policy = self.layout, self.policy
        L0, B = self.stored, self.batch
        U, K = lay.unit_slots.shape
        decode = PHASE_CODE["decode"]

        # 1. Each unit's chain of reallocations, one wave per link; k = 1..n is the step in the run.
        budget = self.budget.copy()
        chains = []  # (unit, k, old rows, new capacity) per wave
        k_next = budget // B + 1 - L0
        active = np.flatnonzero(k_next <= n)
        while len(active):
            k = k_next[active]
            new = np.asarray(policy.capacity(L0 + k, lay.unit_prim[active]), dtype=np.int64)
            if (new < L0 + k).any():
                raise SimkvError(f"policy {policy.name} returned a capacity below the tokens needed")
            chains.append((active, k, budget[active].copy(), new))
            budget[active] = new * B
            k_next[active] = new + 1 - L0
            active = active[k_next[active] <= n]
        if chains:
            unit, k, old_rows, new_cap = (np.concatenate(c) for c in zip(*chains))
        else:
            unit = k = old_rows = new_cap = _NO_BYTES
        if policy.max_alloc_bytes and (new_cap * self.unit_row[unit] * B > policy.max_alloc_bytes).any():
            return False

        # 2. Events in runtime order (by step, then unit); each link frees the previous one's buffers.
        order = np.lexsort((unit, k))
        unit, k, old_rows, new_cap = unit[order], k[order], old_rows[order], new_cap[order]
        E = len(unit)
        ids = self.next_id + np.arange(E * K, dtype=np.int64).reshape(E, K)  # provisional
        by_unit = np.lexsort((k, unit))
        su = unit[by_unit]
        later_link = np.zeros(E, dtype=bool)
        later_link[1:] = su[1:] == su[:-1]
        first_link = np.ones(E, dtype=bool)
        first_link[by_unit] = ~later_link
        prev = np.zeros(E, dtype=np.int64)
        prev[by_unit[later_link]] = by_unit[np.flatnonzero(later_link) - 1]
        slots = lay.unit_slots[unit]
        held = B * (L0 + k - 1)[:, None]  # rows written in the old buffer when it is replaced
        ev = _Events(
            unit=unit, step=first_step + k - 1, needed=L0 + k, copied=L0 + k - 1, new_cap=new_cap, batch=B,
            old_rows=old_rows, old_batch=B, ids=ids,
            old_ids=np.where(first_link[:, None], self.buf[slots], ids[prev]),
            old_resident=np.where(first_link[:, None], np.maximum(self.written[slots], held), held) * lay.row_bytes[slots],
        )
        block, happens, resident = self._event_rows(ev, decode, self.orders["grow"])

        # 3. One stream of rows with sort keys (step, section, unit, position in the unit's order).
        def key(step_k, section, u, pos):
            return ((step_k * _SECTIONS + section) * U + u) * (3 * K) + pos

        steps_k = np.arange(1, n + 1, dtype=np.int64)
        kk = np.broadcast_to(k[:, None], block.shape).copy()
        section = np.full(block.shape, _UNITS)
        if policy.free_old != "immediate":
            is_free = block["op"] == FREE
            late = policy.free_old == "next_inference"
            section[is_free] = _PENDING if late else _END
            kk[is_free] += late
        keys = key(kk, section, unit[:, None], np.arange(3 * K)[None, :])[happens]
        rows, res = block[happens], resident[happens]

        writes = np.full(n, B * self.row_total, dtype=np.int64)
        if self.first_touch:
            writes -= self._writes_below_mark(L0, B, n, unit, k)
        pseudo = np.zeros(n, dtype=ROW)
        pseudo["op"] = -1
        view_rows, view_k, view_growth, new_view = self._view_plan(first_step, n, L0, B, self.next_id + E * K)
        n_views = len(view_growth)
        pending = self.pending.copy()
        pending["step"], pending["phase"] = first_step, decode
        all_rows = np.concatenate([pending, view_rows, rows, pseudo])
        all_keys = np.concatenate([
            np.full(len(pending), key(1, _PENDING, 0, 0)), key(view_k, _VIEW, 0, (view_rows["op"] == FREE).astype(np.int64)),
            keys, key(steps_k, _WRITES, 0, 0),
        ])
        all_res = np.concatenate([-self.pending_resident, np.zeros(len(view_rows), dtype=np.int64), res, writes])
        sort = np.argsort(all_keys, kind="stable")
        all_rows, all_keys, all_res = all_rows[sort], all_keys[sort], all_res[sort]
        row_k = all_keys // (_SECTIONS * U * 3 * K)
        all_rows["step"] = first_step + row_k - 1  # frees deferred to the next inference move on
        # Buffer ids follow the order of allocation: renumber the provisional ones.
        real = all_rows["op"] >= 0
        fresh = real & (all_rows["op"] == ALLOC)
        provisional = all_rows["buffer"][fresh] - self.next_id
        final = np.empty(E * K + n_views, dtype=np.int64)
        final[provisional] = self.next_id + np.arange(len(provisional))
        renumber = real & (all_rows["buffer"] >= self.next_id)
        all_rows["buffer"][renumber] = final[all_rows["buffer"][renumber] - self.next_id]
        inside = row_k <= n
        carried, carried_res = all_rows[~inside], -all_res[~inside]
        all_rows, row_k, all_res, real = all_rows[inside], row_k[inside], all_res[inside], real[inside]

        # 4. Memory along the stream, then per step.
        delta = np.where(real, alloc_delta(all_rows), 0)
        running = self.allocated + np.cumsum(delta)
        if (running + self.scenario.weights_memory > self.scenario.device_memory).any():
            return False
        if policy.headroom_limit and E:
            # The limit looks at what is allocated just before an event's first alloc
            # row plus all the event's bytes (its K alloc rows are consecutive).
            unit_allocs = np.flatnonzero((all_rows["op"] == ALLOC) & (all_rows["layer"] >= 0))
            before = running[unit_allocs[::K]] - delta[unit_allocs[::K]]
            event_bytes = np.add.reduceat(all_rows["bytes"][unit_allocs], np.arange(0, len(unit_allocs), K))
            if (before + event_bytes + self.scenario.weights_memory >= policy.headroom_limit * self.scenario.device_memory).any():
                return False
        resident_run = self.resident + np.cumsum(all_res) if self.first_touch else running
        starts = np.searchsorted(row_k, steps_k)
        ends = np.r_[starts[1:], len(row_k)] - 1
        end_alloc, end_res = running[ends], resident_run[ends]
        prev_alloc = np.r_[self.allocated, end_alloc[:-1]]
        prev_res = np.r_[self.resident if self.first_touch else self.allocated, end_res[:-1]]
        steady_change = np.zeros(n + 1, dtype=np.int64)
        np.add.at(steady_change, k, (new_cap * B - old_rows) * self.unit_row[unit])
        np.add.at(steady_change, view_k[view_rows["op"] == ALLOC], view_growth)

        block_steps = np.zeros(n, dtype=STEP)
        block_steps["step"] = first_step + steps_k - 1
        block_steps["phase"] = decode
        block_steps["tokens"] = L0 + steps_k
        block_steps["batch"] = B
        block_steps["allocated"] = end_alloc
        block_steps["peak"] = np.maximum(np.maximum.reduceat(running, starts), prev_alloc)
        block_steps["steady"] = self._steady() + np.cumsum(steady_change[1:])
        block_steps["used"] = (L0 + steps_k) * B * self.row_total
        block_steps["resident"] = end_res
        block_steps["resident_peak"] = np.maximum(np.maximum.reduceat(resident_run, starts), prev_res)

        # 5. Commit.
        self.ledger.append(all_rows[real])
        self.steps.add_block(block_steps)
        self.pending, self.pending_resident = carried, carried_res if self.first_touch else carried["bytes"]
        self.allocated = int(end_alloc[-1])
        self.resident = int(end_res[-1]) if self.first_touch else self.allocated
        if E:
            last = np.ones(E, dtype=bool)
            last[by_unit[:-1]] = su[1:] != su[:-1]
            self.buf[slots[last]] = final[ids[last] - self.next_id]
            self.written[slots[last]] = 0
        if n_views:
            self.view = {**new_view, "id": int(final[E * K + n_views - 1])}
        self.next_id += len(provisional)
        self.budget = budget
        self.stored = L0 + n
        np.maximum(self.written, self.stored * B, out=self.written)
        return True

    def _view_plan(self, first_step: int, n: int, L0: int, B: int, first_id: int):
        """Past-view rows of a decode run: step k sizes the block for the L0 + k - 1 tokens
        stored before it. Returns the rows, their step in the run, each growth in bytes,
        and the block after the run (committed by the caller)."""
        if not self.policy.past_view:
            return _NO_ROWS, _NO_BYTES, _NO_BYTES, self.view
        tokens = L0 + np.arange(n, dtype=np.int64)
        need = B * tokens * self.view_row_bytes
        grow_k = np.flatnonzero(need > self.view["bytes"]) + 1  # need grows with k: a suffix of the run
        if not len(grow_k):
            return _NO_ROWS, _NO_BYTES, _NO_BYTES, self.view
        sizes = need[grow_k - 1]
        old_sizes = np.r_[self.view["bytes"], sizes[:-1]]
        ids = first_id + np.arange(len(grow_k))
        rows = np.zeros((len(grow_k), 2), dtype=ROW)
        rows["step"], rows["phase"], rows["request"], rows["layer"] = first_step, PHASE_CODE["decode"], self.request, -1
        rows["tensor"] = TENSOR_CODE["past_view"]
        alloc, free = rows[:, 0], rows[:, 1]
        alloc["op"], alloc["bytes"], alloc["buffer"] = ALLOC, sizes, ids
        alloc["capacity_tokens"] = tokens[grow_k - 1]
        free["op"], free["bytes"], free["buffer"] = FREE, old_sizes, np.r_[self.view["id"], ids[:-1]]
        free["capacity_tokens"] = np.r_[self.view["tokens"], tokens[grow_k[:-1] - 1]]
        keep = np.ones((len(grow_k), 2), dtype=bool)
        keep[0, 1] = self.view["bytes"] > 0
        new_view = {"bytes": int(sizes[-1]), "tokens": int(tokens[grow_k[-1] - 1])}
        return rows[keep], np.repeat(grow_k, 2)[keep.ravel()], sizes - old_sizes, new_view

    def _writes_below_mark(self, L0: int, B: int, n: int, unit: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Per step, bytes of token rows written below a slot's high-water mark (already resident).

        Only slots written past the history (kept across a reset) have such rows, and
        only until they are reallocated: a new buffer is written from its copy on.
        """
        lay = self.layout
        high = np.flatnonzero(self.written > B * L0)
        out = np.zeros(n + 2, dtype=np.int64)
        if not len(high):
            return out[1 : n + 1]
        first_event = np.full(lay.units, n + 1, dtype=np.int64)
        np.minimum.at(first_event, unit, k)
        mark = self.written[high]
        row = lay.row_bytes[high]
        event = first_event[high // lay.unit_slots.shape[1]]
        cross = mark // B - L0 + 1  # first step whose rows pass the mark
        # Steps 1 .. cross-1 (before any reallocation) write only below the mark.
        full_until = np.minimum(cross - 1, event - 1)
        np.add.at(out, np.ones_like(high), B * row)
        np.add.at(out, np.minimum(full_until, n) + 1, -B * row)
        # The crossing step writes partly below it.
        partial = (cross < event) & (cross <= n)
        np.add.at(out, cross[partial], (mark[partial] - B * (L0 + cross[partial] - 1)) * row[partial])
        np.add.at(out, cross[partial] + 1, -(mark[partial] - B * (L0 + cross[partial] - 1)) * row[partial])
        return np.cumsum(out)[1 : n + 1]

    # -- bookkeeping -------------------------------------------------------------

    def _steady(self) -> int:
        return int((self.budget * self.unit_row).sum()) + self.view["bytes"]

    def _used(self) -> int:
        return self.stored * self.batch * self.row_total if self.budget.any() else 0

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
            step, int(rows[failing]["layer"]), int(rows[failing]["bytes"]), self.allocated, self.scenario.device_memory,
            self.scenario.weights_memory,
        )
        tokens, batch, used = before
        self._record(step, phase, peak, resident_peak, tokens=tokens, batch=batch, steady=self.allocated, used=used)

"""The fast engine: only allocation events are events.

A session is a SimPy process whose clock counts steps (one per operation).
Single operations (prefill, chat turn, fork, select, reset) are processed as
one step, all units at once with array operations. A run of decode steps is
planned as a whole: every unit's chain of reallocations follows from its
capacity (the unit overflows when the history passes it, and the policy sizes
the next buffer), so the engine computes all chains together (:mod:`simkv.chains`),
builds every ledger row of the run at once, orders them as the
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

from simkv.chains import chains
from simkv.engine.beam_tables import BeamTables
from simkv.engine.events import NO_BYTES, NO_ROWS, Events, alloc_delta, alloc_rank, event_rows
from simkv.engine.oom import ExactSizes, failure, first_failure, limit_headroom, over_device
from simkv.engine.past_view import PastView
from simkv.errors import SimkvError
from simkv.layout import Layout
from simkv.ledger import (
    ALLOC,
    FREE,
    PHASE_CODE,
    ROW,
    TENSOR_CODE,
    Ledger,
    join,
    pick,
)
from simkv.limits import MAX_LEDGER_ROWS
from simkv.memory import OutOfMemory
from simkv.steps import STEP, StepRecorder
from simkv.workload import Decode, Inference, inference_of

# Order of rows inside a step: frees deferred from the previous inference, the
# past-view block, each unit's rows, the step's token writes, frees deferred to
# the end of the step.
_PENDING, _VIEW, _UNITS, _WRITES, _END = range(5)
_SECTIONS = 5
# A run of decode steps is planned in chunks: the first of FIRST_PLAN_STEPS steps, then
# doubled while a chunk writes under PLAN_ROWS / 2 ledger rows (halved above), at most
# MAX_PLAN_STEPS. Chunks keep a huge --decode bounded in memory and let a run that meets
# a memory limit stop there instead of planning everything first.
FIRST_PLAN_STEPS = 4096
MAX_PLAN_STEPS = 1 << 18
PLAN_ROWS = 1 << 20


class FastEngine:
    def __init__(self, scenario, request: int = 0) -> None:
        self.scenario = scenario
        self.policy = policy = scenario.policy
        self.first_touch = policy.first_touch
        lay = self.layout = Layout.build(scenario.model, scenario.precision, policy)
        self.request = request
        self.ledger = Ledger(limit=MAX_LEDGER_ROWS)
        self.steps = StepRecorder()
        self.oom: OutOfMemory | None = None
        orders = policy.orders(scenario.model) or {}
        self.orders = {kind: lay.row_order(orders.get(kind)) for kind in ("grow", "grow_empty", "rebatch", "gather")}
        self.keep = policy.kept_tokens(scenario.model)  # a sliding window's kept tokens, or None
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
        self.pending, self.pending_resident = NO_ROWS, NO_BYTES
        self.view = PastView(scenario.model, request, policy.past_view)  # the CPU plugin's model-wide past block
        self.row_total = int(lay.row_bytes.sum())
        self.unit_row = lay.unit_row_bytes
        # Bytes per token per beam the headroom limits look at (policy.headroom_buffer).
        self.check_row = lay.row_bytes[lay.unit_slots[:, 0]] if policy.headroom_buffer == "data" else self.unit_row
        self.tables = BeamTables(lay, policy, request)  # the beam tables a GPU kernel keeps per unit
        self.chunk = FIRST_PLAN_STEPS  # decode steps planned at once (adapts: see _session)
        self.planned_rows = 0  # ledger rows of the last plan
        self.limit_step = None  # where the last failed plan met a memory limit (see _decode_run)
        self.met_headroom = False  # whether that limit was the policy's headroom limit, met at the policy's sizes

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
            remaining, plan, near_limit = op.steps, self.keep is None, False  # a window's held length stops growing: step by step
            limit_next = False  # the last plan ended on the step before a known limit
            exact_sizes = False  # past the headroom limit: plans size every reallocation exactly
            while remaining and self.oom is None:
                reclaim = self._reclaims_next()
                n = min(remaining, self.chunk)
                if plan and not reclaim and self._decode_run(int(env.now), n, exact_sizes):
                    done = n
                    # Plans are sized to about PLAN_ROWS ledger rows, so memory stays bounded.
                    # Near a limit the size stays (a failure that cannot say where the limit is
                    # halves it); just before a known limit, the next plan is its one step.
                    if limit_next:
                        self.chunk = 1
                    elif self.planned_rows > PLAN_ROWS:
                        self.chunk = max(n // 2, 1)
                    elif self.planned_rows < PLAN_ROWS // 2 and not near_limit:
                        self.chunk = min(2 * n, MAX_PLAN_STEPS)
                elif plan and not reclaim and n > 1:
                    # A limit (device memory, headroom) falls inside the plan: plan up to the step
                    # before it (those steps are as the failed plan computed them, no limit met),
                    # or, where the plan cannot say, bisect towards it; either way the run stops
                    # at the step where the limit is met, without planning the rest.
                    hint = self.limit_step
                    self.chunk, near_limit, limit_next = (max(hint - 1, 1) if hint else n // 2), True, bool(hint)
                    continue
                else:
                    # One step at a time: a reclaim is due (then plan again), or the plan
                    # met a memory limit, where the limit rules must apply step by step.
                    if plan and not reclaim and self.met_headroom:
                        # Past the headroom limit every reallocation gets exactly the tokens it
                        # needs, step after step: plan on with those sizes (each plan checks that
                        # the limit's rule gives each of them that size, else step by step).
                        # Small at first: where that fails at once (staggered headroom), it costs
                        # little; where it holds, plans double from there.
                        exact_sizes, near_limit, limit_next, self.chunk = True, False, False, 16
                    else:
                        plan = plan and reclaim
                    self._step(int(env.now), Inference("decode", 1, self.width, self.width))
                    done = 1
                remaining -= done
                yield env.timeout(done)

    def _reclaims_next(self) -> bool:
        needed = np.full(self.layout.units, self.stored + 1, dtype=np.int64)
        fits = self.batch * needed <= self.budget
        padded = needed + self._room()
        return bool((fits & self.policy.reclaim(padded, self.layout.unit_prim, self.budget // self.batch)).any())

    def _room(self) -> np.ndarray:
        """Tokens of room each unit still has, carried into its next buffer (policy.carry_padding).

        None before the first inference or after a reset, where the runtime resets the padding.
        """
        if not self.policy.carry_padding or not self.stored:
            return np.zeros(self.layout.units, dtype=np.int64)
        return np.where(self.budget > 0, self.budget // self.batch - self.stored, 0)

    # -- rows ------------------------------------------------------------------

    # -- one step --------------------------------------------------------------

    def _step(self, step: int, inf: Inference) -> None:
        lay, policy = self.layout, self.policy
        phase = PHASE_CODE[inf.phase]
        before = (self.stored, self.batch, self._used())
        self.width = inf.batch
        rows = [self.pending.copy()]
        rows[0]["step"], rows[0]["phase"] = step, phase
        resident_delta = [-self.pending_resident if self.first_touch else -self.pending["bytes"]]
        self.pending, self.pending_resident = NO_ROWS, NO_BYTES
        deferred, deferred_resident = NO_ROWS, NO_BYTES
        needed = 0
        if inf.phase == "reset":
            if policy.reset == "free" and self.budget.any():
                slots = lay.unit_slots[np.flatnonzero(self.budget)].ravel()
                free = self._live_rows(slots, step, phase)
                rows.append(free)
                resident_delta.append(-self._live_resident(slots) if self.first_touch else -free["bytes"])
                self.budget[:], self.buf[:], self.written[:], self.batch = 0, -1, 0, 1
            elif policy.reset == "free":  # nothing live (a stateless policy): the batch still resets
                self.batch = 1
            self.after_reset = True
        else:
            if policy.past_view:
                view = self.view.grow(step, phase, inf.batch_in * self.stored, self.stored, self.next_id)
                self.next_id += int((view["op"] == ALLOC).sum())
                rows.append(view)
                resident_delta.append(np.zeros(len(view), dtype=np.int64) if self.first_touch else alloc_delta(view))
            if policy.beam_gather and inf.phase in ("fork", "reorder", "select") and self.budget.any():
                # beam_idx first: every layer gathered into new buffers at the new batch, old freed at once.
                units = np.flatnonzero(self.budget)
                held = np.full(lay.units, self._held(), dtype=np.int64)  # exact size: no padding is carried
                block, happens, resident = self._reallocate(units, self._held(), inf.batch, step, phase, rows, "gather",
                                                            held, np.zeros(lay.units, dtype=np.int64), immediate=True)
                rows.append(block[happens])
                resident_delta.append(resident[happens])
            needed = self._held() + inf.tokens
            has = self.budget > 0
            if has.any() and inf.batch != self.batch and policy.reset_adopts_batch and self.after_reset:
                self.batch = inf.batch  # the kept buffers now hold rows of the new width
            rebatch = has & (inf.batch != self.batch)
            fits = has & ~rebatch & (inf.batch * needed <= self.budget)
            padded = needed + self._room()
            fits &= ~policy.reclaim(padded, lay.unit_prim, self.budget // self.batch)
            units = np.flatnonzero(~fits)
            id_start = self.next_id
            tables, table_unit, table_delta, self.next_id = self.tables.step(step, phase, needed, inf.batch, self.stored,
                                                                             self.next_id)
            unit_rows, unit_res, unit_key = NO_ROWS, NO_BYTES, NO_BYTES
            if len(units):
                kind = "rebatch" if rebatch.any() else "grow_empty" if has.any() and not self.stored else "grow"
                tables_before = np.cumsum(table_delta) - table_delta  # tables of earlier units (the kernel runs first)
                block, happens, resident = self._reallocate(units, needed, inf.batch, step, phase, rows, kind, padded,
                                                            tables_before)
                is_free = block["op"] == FREE
                deferred_mask = happens & is_free
                if policy.free_old != "immediate":
                    happens &= ~is_free
                unit_rows, unit_res = block[happens], resident[happens]
                unit_key = np.broadcast_to(2 * units[:, None], block.shape)[happens]
                deferred, deferred_resident = block[deferred_mask], -resident[deferred_mask]
            if len(tables):
                # Per unit: its buffers' rows, then its kernel's beam tables; ids in allocation order.
                order = np.argsort(np.concatenate([unit_key, 2 * table_unit + 1]), kind="stable")
                unit_rows = np.concatenate([unit_rows, tables])[order]
                table_res = np.zeros(len(tables), dtype=np.int64) if self.first_touch else alloc_delta(tables)
                unit_res = np.concatenate([unit_res, table_res])[order]
                self._renumber(unit_rows, id_start)
            rows.append(unit_rows)
            resident_delta.append(unit_res)
            self.after_reset = False

        rows, resident_delta = np.concatenate(rows), np.concatenate(resident_delta)
        allocated = self.allocated + np.cumsum(alloc_delta(rows))
        resident = self.resident + np.cumsum(resident_delta)
        failing = first_failure(rows, allocated, policy, self.scenario)
        done = len(rows) if failing is None else failing  # an allocation that fails ends the step before it
        peak = int(allocated[:done].max(initial=self.allocated))
        resident_peak = int(resident[:done].max(initial=self.resident))
        self.ledger.append(rows[:done])
        if done:
            self.allocated, self.resident = int(allocated[done - 1]), int(resident[done - 1])
        if failing is not None:
            # The step's row shows the state before the step (tokens, batch, used), what was
            # allocated when the allocation failed, and ``steady`` = that allocation; the run stops.
            self.oom = failure(rows[failing], step, self.allocated, policy, self.scenario)
            tokens, batch, used = before
            self._record(step, phase, peak, resident_peak, tokens=tokens, batch=batch, steady=self.allocated, used=used)
            return

        if inf.phase == "reset":
            self.stored = 0
        else:
            self.stored += inf.tokens
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
        if policy.stateless and self.budget.any():
            self._free_all(step, phase)
        self._record(step, phase, peak, resident_peak)

    def _free_all(self, step: int, phase: int) -> None:
        """Free every live K/V buffer at the end of a step (a stateless policy keeps nothing)."""
        slots = self.layout.unit_slots[np.flatnonzero(self.budget)].ravel()
        free = self._live_rows(slots, step, phase)
        self.ledger.append(free)
        self.allocated -= int(free["bytes"].sum())
        self.resident -= int(self._live_resident(slots).sum()) if self.first_touch else int(free["bytes"].sum())
        self.budget[:], self.buf[:], self.written[:] = 0, -1, 0

    def _reallocate(self, units, needed, batch, step, phase, rows_so_far, kind, padded, tables_before, immediate=None):
        """``padded``: per unit, the tokens needed plus the room carried over (policy.carry_padding);
        ``tables_before``: per unit, bytes the kernels' beam tables took this step before it;
        ``immediate``: whether old buffers are freed as each unit is rebuilt (default: the policy's free_old)."""
        lay, policy = self.layout, self.policy
        padded = padded[units]
        caps = np.asarray(policy.capacity(padded, lay.unit_prim[units]), dtype=np.int64)
        if caps.shape != units.shape or (caps < needed).any():
            raise SimkvError(f"policy {policy.name} returned a capacity below the {needed} tokens needed")
        old_rows = self.budget[units]
        old_unit_bytes = old_rows * self.unit_row[units]
        start = self.allocated + sum(int(alloc_delta(r).sum()) for r in rows_so_far)
        immediate = policy.free_old == "immediate" if immediate is None else immediate
        freed_before = np.r_[0, np.cumsum(old_unit_bytes)]  # old buffers freed before unit i (immediate)
        if not immediate:
            freed_before[:] = 0
        caps = limit_headroom(
            policy, padded, caps,
            unit_bytes=lambda i, cap: int(cap) * int(self.check_row[units[i]]) * batch,
            alloc_bytes=lambda i, cap: int(cap) * int(self.unit_row[units[i]]) * batch,
            running_before=lambda i, chosen: start + chosen - int(freed_before[i]) + int(tables_before[units[i]]),
            device_memory=self.scenario.device_memory, weights=self.scenario.weights_memory,
        )
        slots = lay.unit_slots[units]
        ids = self._ids_in_order(len(units), self.orders[kind])
        ev = Events(
            unit=units, step=step, needed=needed, copied=self._held(), new_cap=caps, batch=batch,
            old_rows=old_rows, old_batch=self.batch, old_ids=self.buf[slots],
            old_resident=self._live_resident(slots), ids=ids,
        )
        out = event_rows(lay, ev, phase, self.orders[kind], self.request, self.first_touch)
        self.budget[units] = caps * batch
        self.buf[slots] = ids
        self.written[slots] = np.where((old_rows > 0)[:, None], self._held() * batch, 0)
        self.batch = batch
        return out

    def _renumber(self, rows: np.ndarray, id_start: int) -> None:
        """Renumber the ids allocated since ``id_start`` in the order ``rows`` allocates them,
        in the rows and in the live state."""
        fresh = rows["buffer"] >= id_start
        allocs = rows["buffer"][fresh & (rows["op"] == ALLOC)]
        remap = np.empty(self.next_id - id_start, dtype=np.int64)
        remap[allocs - id_start] = id_start + np.arange(len(allocs))
        rows["buffer"][fresh] = remap[rows["buffer"][fresh] - id_start]
        for ids in (self.buf, self.tables.ids):
            moved = ids >= id_start
            ids[moved] = remap[ids[moved] - id_start]

    def _ids_in_order(self, n: int, order: np.ndarray) -> np.ndarray:
        """Fresh buffer ids for ``n`` units' slots, numbered in the order they are allocated."""
        k = self.layout.unit_slots.shape[1]
        rank = alloc_rank(order, k)
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
        rows["used_tokens"] = self._held()
        rows["buffer"] = self.buf[slots]
        return rows

    def _live_resident(self, slots: np.ndarray) -> np.ndarray:
        return self.written[slots] * self.layout.row_bytes[slots]

    # -- a run of decode steps -------------------------------------------------

    def _decode_run(self, first_step: int, n: int, exact_sizes: bool = False) -> bool:
        """Plan ``n`` one-token decode steps at once; False (nothing changed) if a limit intervenes,
        with :attr:`limit_step` the step of the run (1..n) where a memory limit is met, if known,
        and :attr:`met_headroom` whether it is the headroom limit at the policy's sizes.
        ``exact_sizes``: past the headroom limit, every reallocation sized exactly (the plan holds
        only where the step-by-step rule gives that size)."""
        lay, policy = self.layout, self.policy
        self.limit_step, self.met_headroom = None, False
        if policy.stateless:
            return self._stateless_run(first_step, n)
        L0, B = self.stored, self.batch
        U, K = lay.unit_slots.shape
        decode = PHASE_CODE["decode"]

        # 1. Each unit's chain of reallocations; k = 1..n is the step in the run.
        sizes = ExactSizes if exact_sizes else policy
        unit, k, old_rows, new_cap, budget = chains(sizes, lay.unit_prim, self.budget, L0, B, n, PLAN_ROWS)
        if policy.max_alloc_bytes and (new_cap * self.unit_row[unit] * B > policy.max_alloc_bytes).any():
            return False
        tables = self.tables.plan(first_step, n, L0, B, self.next_id)
        if tables is None:
            return False
        t_rows, t_k, t_unit, t_growth, t_state = tables
        if policy.max_alloc_bytes and (t_rows["bytes"] > policy.max_alloc_bytes).any():
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
        ev = Events(
            unit=unit, step=first_step + k - 1, needed=L0 + k, copied=L0 + k - 1, new_cap=new_cap, batch=B,
            old_rows=old_rows, old_batch=B, ids=ids,
            old_ids=np.where(first_link[:, None], self.buf[slots], ids[prev]),
            old_resident=np.where(first_link[:, None], np.maximum(self.written[slots], held), held) * lay.row_bytes[slots],
        )
        block, happens, resident = event_rows(lay, ev, decode, self.orders["grow"], self.request, self.first_touch)

        # 3. One stream of rows with sort keys (step, section, unit, position in the unit's order).
        W = 3 * K + 2  # a unit's rows, then its kernel's beam table alloc and free

        def key(step_k, section, u, pos):
            return ((step_k * _SECTIONS + section) * U + u) * W + pos

        steps_k = np.arange(1, n + 1, dtype=np.int64)
        kk = np.broadcast_to(k[:, None], block.shape).copy()
        section = np.full(block.shape, _UNITS)
        if policy.free_old != "immediate":
            is_free = block["op"] == FREE
            late = policy.free_old == "next_inference"
            section[is_free] = _PENDING if late else _END
            kk[is_free] += late
        keys = key(kk, section, unit[:, None], np.arange(3 * K)[None, :])[happens]
        rows, res = pick(block, happens), resident[happens]
        # Each copy of a plan's rows is dropped once used, so memory peaks at about two of them.
        del block, happens, resident, kk, section

        writes = np.full(n, B * self.row_total, dtype=np.int64)
        if self.first_touch:
            writes -= self._writes_below_mark(L0, B, n, unit, k)
        pseudo = np.zeros(n, dtype=ROW)
        pseudo["op"] = -1
        view_rows, view_k, view_growth, new_view = self.view.plan(first_step, n, L0, B, self.next_id + E * K)
        n_views = len(view_growth)
        if policy.max_alloc_bytes and (view_rows["bytes"] > policy.max_alloc_bytes).any():
            return False  # a block the device cannot allocate: step by step, where that ends the run
        t_rows["buffer"] += np.where(t_rows["buffer"] >= self.next_id, E * K + n_views, 0)  # provisional ids after the views'
        n_tables = int((t_rows["op"] == ALLOC).sum())
        pending = self.pending.copy()
        pending["step"], pending["phase"] = first_step, decode
        all_rows = join([pending, view_rows, rows, t_rows, pseudo])
        all_keys = np.concatenate([
            np.full(len(pending), key(1, _PENDING, 0, 0)), key(view_k, _VIEW, 0, (view_rows["op"] == FREE).astype(np.int64)),
            keys, key(t_k, _UNITS, t_unit, 3 * K + (t_rows["op"] == FREE)), key(steps_k, _WRITES, 0, 0),
        ])
        t_res = np.zeros(len(t_rows), dtype=np.int64) if self.first_touch else alloc_delta(t_rows)
        all_res = np.concatenate([-self.pending_resident, np.zeros(len(view_rows), dtype=np.int64), res, t_res, writes])
        del rows, keys, res
        sort = np.argsort(all_keys, kind="stable")
        all_rows, all_keys, all_res = pick(all_rows, sort), all_keys[sort], all_res[sort]
        row_k = all_keys // (_SECTIONS * U * W)
        all_rows["step"] = first_step + row_k - 1  # frees deferred to the next inference move on
        # Buffer ids follow the order of allocation: renumber the provisional ones.
        real = all_rows["op"] >= 0
        fresh = real & (all_rows["op"] == ALLOC)
        provisional = all_rows["buffer"][fresh] - self.next_id
        final = np.empty(E * K + n_views + n_tables, dtype=np.int64)
        final[provisional] = self.next_id + np.arange(len(provisional))
        renumber = real & (all_rows["buffer"] >= self.next_id)
        all_rows["buffer"][renumber] = final[all_rows["buffer"][renumber] - self.next_id]
        inside = row_k <= n
        carried, carried_res = pick(all_rows, ~inside), -all_res[~inside]
        all_rows, row_k, all_res, real = pick(all_rows, inside), row_k[inside], all_res[inside], real[inside]

        # 4. Memory along the stream, then per step.
        delta = np.where(real, alloc_delta(all_rows), 0)
        running = self.allocated + np.cumsum(delta)
        over = over_device(running, self.scenario)
        if len(over):
            self.limit_step = int(row_k[over[0]])
            return False
        if policy.headroom_limit and E:
            # The limit looks at what is allocated just before an event's first alloc
            # row plus all the event's bytes (its K alloc rows are consecutive).
            is_table = np.isin(all_rows["tensor"], (TENSOR_CODE["k_beam"], TENSOR_CODE["v_beam"])) & policy.kernel_beam_tables
            unit_allocs = np.flatnonzero((all_rows["op"] == ALLOC) & (all_rows["layer"] >= 0) & ~is_table)
            before = running[unit_allocs[::K]] - delta[unit_allocs[::K]]
            event_bytes = np.add.reduceat(all_rows["bytes"][unit_allocs], np.arange(0, len(unit_allocs), K))
            if policy.headroom_buffer == "data":  # the data buffer alone: each event's first alloc row
                event_bytes = all_rows["bytes"][unit_allocs[::K]]
            meets = before + event_bytes + self.scenario.weights_memory >= policy.headroom_limit * self.scenario.device_memory
            # Policy sizes hold while no event meets the limit. Exact sizes hold for an event that
            # meets it at its exact size (then also at the policy's, which is no smaller), or
            # whose policy size is the exact one anyway (events are in the order of unit and k).
            if exact_sizes:
                meets |= np.asarray(policy.capacity(L0 + k, lay.unit_prim[unit]), dtype=np.int64) == L0 + k
            wrong = np.flatnonzero(~meets if exact_sizes else meets)
            if len(wrong):
                self.limit_step = int(row_k[unit_allocs[::K][wrong[0]]])
                self.met_headroom = not exact_sizes
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
        np.add.at(steady_change, t_k[t_rows["op"] == ALLOC], t_growth)

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
        self.planned_rows = int(real.sum())
        self.ledger.append(pick(all_rows, real))
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
            self.view.bytes, self.view.tokens = new_view
            self.view.id = int(final[E * K + n_views - 1])
        if t_state is not None:
            self.tables.rows, self.tables.batch, self.tables.ids = t_state
            moved = self.tables.ids >= self.next_id
            self.tables.ids[moved] = final[self.tables.ids[moved] - self.next_id + E * K + n_views]
        self.next_id += len(provisional)
        self.budget = budget
        self.stored = L0 + n
        np.maximum(self.written, self.stored * B, out=self.written)
        return True

    def _stateless_run(self, first_step: int, n: int) -> bool:
        """``n`` decode steps of a stateless policy at once: each allocates every slot for the whole
        history (no copy), the history is written, and every buffer is freed at the step's end.
        False (nothing changed) where the plain per-step path must decide (past view, memory limit)."""
        lay, policy = self.layout, self.policy
        L0, B = self.stored, self.width
        U, K = lay.unit_slots.shape
        k = np.arange(1, n + 1, dtype=np.int64)
        needed = L0 + k
        caps = np.asarray(policy.capacity(np.repeat(needed, U), np.tile(lay.unit_prim, n)), dtype=np.int64)
        if policy.past_view or len(self.pending) or self.budget.any() or (caps != np.repeat(needed, U)).any():
            return False
        if self.allocated + self.scenario.weights_memory + int(needed[-1]) * B * self.row_total > self.scenario.device_memory:
            return False
        if policy.max_alloc_bytes:
            # a buffer larger than the device's largest allocation ends the run (the per-step path says so)
            too_large = needed * B * int(lay.row_bytes.max()) > policy.max_alloc_bytes
            if too_large.any():
                self.limit_step = int(too_large.argmax()) + 1
                return False
        order = self.orders["grow"]
        alloc_slots = order[order // K == ALLOC] % K  # a unit's slots in allocation order
        rank = alloc_rank(order, K)  # buffer id offset of each slot within its unit
        ids = self.next_id + ((k[:, None] - 1) * U + np.arange(U)[None, :])[..., None] * K + rank  # (n, U, K)
        slots = lay.unit_slots  # (U, K)

        def rows(op, slot_index):
            out = np.zeros((n, U, K), dtype=ROW)
            s = np.take_along_axis(slots, slot_index, axis=1) if slot_index is not None else slots
            out["step"] = (first_step + k - 1)[:, None, None]
            out["phase"], out["request"], out["op"] = PHASE_CODE["decode"], self.request, op
            out["layer"], out["tensor"] = lay.layer[s][None], lay.tensor[s][None]
            out["bytes"] = needed[:, None, None] * B * lay.row_bytes[s][None]
            out["capacity_tokens"] = out["used_tokens"] = needed[:, None, None]
            sid = ids if slot_index is None else np.take_along_axis(ids, np.broadcast_to(slot_index, (n, U, K)), axis=2)
            out["buffer"] = sid
            return out

        allocs = rows(ALLOC, np.broadcast_to(alloc_slots, (U, K)).copy())
        frees = rows(FREE, None)
        rows = np.concatenate([allocs.reshape(n, -1), frees.reshape(n, -1)], axis=1).ravel()
        self.planned_rows = len(rows)  # sizes the next plan (_session)
        self.ledger.append(rows)
        block = np.zeros(n, dtype=STEP)
        block["step"], block["phase"] = first_step + k - 1, PHASE_CODE["decode"]
        block["tokens"], block["batch"] = needed, B
        block["allocated"] = self.allocated
        block["peak"] = self.allocated + needed * B * self.row_total
        block["steady"], block["used"] = self._steady(), 0
        base = self.resident if self.first_touch else self.allocated
        block["resident"] = base
        block["resident_peak"] = base + needed * B * self.row_total if self.first_touch else block["peak"]
        self.steps.add_block(block)
        self.next_id += n * U * K
        self.stored, self.batch = L0 + n, B
        return True

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
        return int((self.budget * self.unit_row).sum()) + self.view.bytes + self.tables.bytes()

    def _used(self) -> int:
        return self._held() * self.batch * self.row_total if self.budget.any() else 0

    def _held(self) -> int:
        """Tokens per beam the buffers hold between inferences: the history, or a window's part."""
        return self.stored if self.keep is None else min(self.stored, self.keep)

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

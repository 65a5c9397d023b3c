"""The fast engine's conductor: :class:`FastEngine` keeps the session loop and the state.

A session is a SimPy process whose clock counts steps (one per operation).
Single operations (prefill, chat turn, fork, select, reset) are processed as
one step, all units at once with array operations (:meth:`FastEngine._step`).
A run of decode steps is planned as a whole (:mod:`.decode_run`, :mod:`.stateless`)
and committed at once; in-place appends cost no event, and the SimPy clock jumps
over the whole run. Runs are planned in chunks sized to a number of ledger rows.

Near a device-memory limit the plan is discarded and the run is processed
step by step, where the limit rules apply sequentially (:mod:`.oom`).

Buffers are sized in *rows* (token positions × beams), as in
:class:`simkv.memory.Buffer`: ``budget`` holds each unit's rows, ``written``
each slot's first-touch high-water mark in rows (:mod:`.residency`).
"""

from __future__ import annotations

import numpy as np
import simpy

from simkv.engine import decode_run, stateless
from simkv.engine.beam_tables import BeamTables
from simkv.engine.decode_run import NoPlan
from simkv.engine.events import NO_BYTES, NO_ROWS, Events, alloc_delta, event_rows, fresh_ids
from simkv.engine.npu import NpuBuffers
from simkv.engine.oom import failure, first_failure, limit_headroom
from simkv.engine.past_view import PastView
from simkv.engine.residency import touch
from simkv.engine.state_buffers import StateBuffers
from simkv.errors import SimkvError
from simkv.layout import Layout
from simkv.ledger import ALLOC, COPY, FREE, PHASE_CODE, ROW, Ledger
from simkv.limits import MAX_LEDGER_ROWS
from simkv.memory import OutOfMemory
from simkv.steps import StepRecorder
from simkv.workload import Decode, Inference, inference_of

# A run of decode steps is planned in chunks: the first of FIRST_PLAN_STEPS steps, then
# doubled while a chunk writes under PLAN_ROWS / 2 ledger rows (halved above), at most
# MAX_PLAN_STEPS. Chunks keep a huge --decode bounded in memory and let a run that meets
# a memory limit stop there instead of planning everything first.
FIRST_PLAN_STEPS = 4096
MAX_PLAN_STEPS = 1 << 18
PLAN_ROWS = 1 << 20


class FastEngine:
    """One session's KV-cache memory, fast. The planners read this state; only the engine changes it."""

    def __init__(self, scenario, request: int = 0) -> None:
        self.scenario = scenario
        self.policy = policy = scenario.policy
        self.first_touch = policy.first_touch
        lay = self.layout = Layout.build(scenario.model, scenario.precision, policy)
        self.request = request
        self.ledger = Ledger(limit=MAX_LEDGER_ROWS)
        self.steps = StepRecorder()
        self.oom: OutOfMemory | None = None
        # Per kind, one row order for all units, or one per unit (layers of different kinds).
        self.orders = {kind: lay.orders(kind) for kind in ("grow", "grow_empty", "rebatch", "gather")}
        self.keep = lay.unit_keep  # per unit: a window's kept tokens (a state: 1), or -1: the whole history
        self.state = lay.unit_state  # per unit: a linear-attention state (one row per sequence)
        self.ring = lay.unit_ring  # per unit: a fixed ring buffer's tokens (policy.ring_tokens), or -1
        self.rings = bool((self.ring >= 0).any())
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
        self.view = PastView(scenario.model, request, policy.past_view, policy.mla_form)  # the CPU plugin's past block
        self.row_total = int(lay.row_bytes.sum())
        self.unit_row = lay.unit_row_bytes
        # Bytes per token per beam the headroom limits look at (policy.headroom_buffer).
        self.check_row = lay.row_bytes[lay.unit_slots[:, 0]] if policy.headroom_buffer == "data" else self.unit_row
        self.tables = BeamTables(lay, policy, request)  # the beam tables a GPU kernel keeps per unit
        # Double-buffered linear-attention states (policy.double_buffered_states): sized outside the units.
        self.states = StateBuffers(lay, policy, request, policy.first_touch)
        self.outside = lay.unit_state & self.states.enabled  # per unit: its buffers are the states'
        self.chunk = FIRST_PLAN_STEPS  # decode steps planned at once (adapts: see _session)
        self.planned_rows = 0  # ledger rows of the last plan
        self.limit_step = None  # where the last failed plan met a memory limit (see _decode_run)
        self.met_headroom = False  # whether that limit was the policy's headroom limit, met at the policy's sizes
        # A trim (policy.trim_rule). "rebuild" leaves a unit's slots at different sizes (the scales keep theirs):
        # per slot its rows where they differ from the unit's budget (-1: the budget), None while none do; and
        # the copy each K and V state keeps (per data slot: buffer id, bytes, tokens; -1 / 0 when none).
        # "reset_room": the next inference rebuilds every unit with no room carried.
        self.slot_rows: np.ndarray | None = None
        self.copy_id = np.full(len(lay.layer), -1, dtype=np.int64)
        self.copy_bytes = np.zeros(len(lay.layer), dtype=np.int64)
        self.copy_tokens = np.zeros(len(lay.layer), dtype=np.int64)
        self.trimmed = False
        # The NPU pipeline's present outputs, staging copies and prefix-cache blocks (policy.npu_pipeline).
        self.npu = NpuBuffers(lay, policy, scenario.workload, request)
        self.inferred = False  # an inference has run (the NPU's fixed buffers exist)

    # -- the SimPy process ---------------------------------------------------

    def run(self) -> None:
        env = simpy.Environment()
        env.process(self._session(env))
        env.run()

    def _session(self, env: simpy.Environment):
        """The workload's operations in order: each one a step, a decode run planned in chunks
        (:meth:`_decode_run`), or step by step where a plan cannot hold."""
        for op in self.scenario.workload.ops:
            if self.oom is not None:
                return
            if not isinstance(op, Decode):
                self._step(int(env.now), inference_of(op, self.width, self.stored))
                yield env.timeout(1)
                continue
            # Decode runs are planned where every unit grows alike; windows and states go step by step.
            remaining, plan, near_limit = op.steps, self.layout.uniform, False
            limit_next = False  # the last plan ended on the step before a known limit
            exact_sizes = False  # past the headroom limit: plans size every reallocation exactly
            while remaining and self.oom is None:
                if self.slot_rows is not None or self.trimmed or self.npu.pending(int(env.now)):
                    # right after a trim, or the NPU's first generate step after a prefill: that step alone
                    self._step(int(env.now), Inference("decode", 1, self.width, self.width))
                    remaining -= 1
                    yield env.timeout(1)
                    continue
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
        needed = self._needed(1)
        fits = self.batch * needed <= self.budget
        padded = needed + self._room()
        return bool((fits & self._reclaimed(padded)).any())

    def _reclaimed(self, padded: np.ndarray) -> np.ndarray:
        """Units whose buffers the policy rebuilds although they fit (policy.reclaim); never a state,
        which the runtime updates in place."""
        return self.policy.reclaim(padded, self.layout.unit_prim, self.budget // self.batch) & ~self.state

    def _room(self) -> np.ndarray:
        """Tokens of room each unit still has, carried into its next buffer (policy.carry_padding).

        None before the first inference or after a reset, where the runtime resets the padding.
        """
        if not self.policy.carry_padding or not self.stored or self.trimmed:
            return np.zeros(self.layout.units, dtype=np.int64)
        return np.where((self.budget > 0) & ~self.state, self.budget // self.batch - self._held(), 0)

    # -- a run of decode steps -------------------------------------------------

    def _decode_run(self, first_step: int, n: int, exact_sizes: bool = False) -> bool:
        """Plan ``n`` one-token decode steps at once (:mod:`.decode_run`, :mod:`.stateless`) and
        commit them; False (nothing changed) if a limit intervenes, with :attr:`limit_step` the step
        of the run (1..n) where a memory limit is met, if known, and :attr:`met_headroom` whether it
        is the headroom limit at the policy's sizes. ``exact_sizes``: past the headroom limit, every
        reallocation sized exactly (the plan holds only where the step-by-step rule gives that size)."""
        if self.policy.stateless:
            run = stateless.plan(self, first_step, n)
        else:
            run = decode_run.plan(self, first_step, n, exact_sizes, PLAN_ROWS)
        if isinstance(run, NoPlan):
            self.limit_step, self.met_headroom = run
            return False
        self.limit_step, self.met_headroom = None, False
        self.planned_rows = len(run.rows)  # sizes the next plan (_session)
        self.ledger.append(run.rows)
        self.steps.add_block(run.steps)
        self.next_id, self.stored, self.batch = run.next_id, run.stored, run.batch
        held = run.held
        if held is not None:
            self.pending, self.pending_resident = held.pending, held.pending_resident
            self.allocated, self.resident = held.allocated, held.resident
            self.buf[held.slots] = held.buffers
            self.written[held.slots] = 0
            if held.view is not None:
                self.view.commit(*held.view)
            if held.tables is not None:
                self.tables.commit(*held.tables)
            self.budget = held.budget
            np.maximum(self.written, self.stored * self.batch, out=self.written)
        return True

    # -- one step --------------------------------------------------------------

    def _step(self, step: int, inf: Inference) -> None:
        """One operation as one step, all units at once: the frees deferred from the previous
        inference, a reset's frees or an inference's reallocations, all allocated in order (an
        allocation that fails ends the run there), then the tokens written and the step's last frees."""
        phase = PHASE_CODE[inf.phase]
        before = (self.stored, self.batch, self._used())
        self.width = inf.batch
        rows = [self.pending.copy()]
        rows[0]["step"], rows[0]["phase"] = step, phase
        resident_delta = [-self.pending_resident if self.first_touch else -self.pending["bytes"]]
        self.pending, self.pending_resident = NO_ROWS, NO_BYTES
        deferred, needed = (NO_ROWS, NO_BYTES), 0
        if inf.phase == "reset":
            self._reset(step, phase, rows, resident_delta)
        elif inf.phase == "trim":
            self._trim(step, phase, inf, rows, resident_delta)
        else:
            needed = self._needed(inf.tokens)
            deferred = self._inference(step, phase, inf, needed, rows, resident_delta)
            if self.npu.enabled:
                npu, self.next_id = self.npu.rows(step, phase, not self.inferred, self.buf[self.npu.data],
                                                  self.policy.total - self.policy.generate_tokens, self.next_id)
                rows.append(npu)
                resident_delta.append(alloc_delta(npu))  # resident = allocated (the policy refuses first touch)
            self.inferred = True
        peaks = self._allocate(step, phase, before, np.concatenate(rows), np.concatenate(resident_delta))
        if peaks is not None:  # None: out of memory, the run stops
            self._end_step(step, phase, inf, needed, *peaks, deferred)

    def _reset(self, step: int, phase: int, rows: list, resident_delta: list) -> None:
        """A reset (policy.reset): ``free`` frees every live buffer and the batch goes back to one
        beam; ``keep`` keeps them for the next prompt. Appends its rows."""
        if self.policy.reset == "free":
            if self.budget.any():
                free, released = self._free_live(step, phase, keep_states=self.policy.reset_keeps_states)
                rows.append(free)
                resident_delta.append(-released)
            if self.states.live() and not self.policy.reset_keeps_states:
                free, released = self.states.free_all(step, phase)
                rows.append(free)
                resident_delta.append(released)
            self.batch = 1  # also with nothing live (a stateless policy)
        self.states.reset()
        self.after_reset = True

    def _trim(self, step: int, phase: int, inf: Inference, rows: list, resident_delta: list) -> None:
        """A trim from ``stored`` to ``stored + inf.tokens`` tokens (policy.trim_rule): for ``rebuild``, per K and
        V state (``Layout.trim_states``) the rows the reference engine's ``_trim`` performs one by one — the
        read-back and the kept copy, the previous kept copy freed, the exact-size data and beam table replacing
        the old — all states at once; appends its rows."""
        policy, lay = self.policy, self.layout
        if policy.trim_rule == "reset_room":
            self.trimmed = True
        if policy.trim_rule != "rebuild":
            return
        L0, kept = self.stored, self.stored + inf.tokens
        units, data, beam, code, io_row = lay.trim_states(self.scenario.precision.bits, policy.trim_io_bytes)
        n, has_beam = len(data), bool((beam >= 0).any())
        if not n:
            return
        k = lay.unit_slots.shape[1]
        old_rows = self._slot_rows(np.arange(len(lay.layer)))
        per = 4 if has_beam else 3  # allocations per state: read-back, kept copy, data, beam table
        ids = self.next_id + per * np.arange(n)[:, None] + np.arange(per)[None, :]
        self.next_id += per * n
        block = np.zeros((n, 11), dtype=ROW)
        block["step"], block["phase"], block["request"] = step, phase, self.request
        block["layer"] = lay.layer[data][:, None]
        ops = np.array([ALLOC, COPY, ALLOC, COPY, FREE, ALLOC, COPY, FREE, ALLOC, FREE, FREE], dtype=np.int8)
        block["op"] = ops[None, :]
        tensor = np.stack([code, code, code, code, code, lay.tensor[data], lay.tensor[data], lay.tensor[data],
                           lay.tensor[np.maximum(beam, 0)], lay.tensor[np.maximum(beam, 0)], code], axis=1)
        block["tensor"] = tensor
        row_d, row_b = lay.row_bytes[data], lay.row_bytes[np.maximum(beam, 0)]
        old_d, old_b = old_rows[data], old_rows[np.maximum(beam, 0)]
        nbytes = np.stack([L0 * io_row, L0 * io_row, kept * io_row, kept * io_row, self.copy_bytes[data],
                           kept * row_d, kept * row_d, old_d * row_d, kept * row_b, old_b * row_b, L0 * io_row], axis=1)
        block["bytes"] = nbytes
        block["capacity_tokens"] = np.stack([np.full(n, L0), np.full(n, L0), np.full(n, kept), np.full(n, kept),
                                             self.copy_tokens[data], np.full(n, kept), np.full(n, kept), old_d,
                                             np.full(n, kept), old_b, np.full(n, L0)], axis=1)
        block["used_tokens"] = np.stack([np.full(n, L0), np.full(n, L0), np.full(n, kept), np.full(n, kept),
                                         self.copy_tokens[data], np.full(n, kept), np.full(n, kept), np.full(n, L0),
                                         np.full(n, kept), np.full(n, L0), np.full(n, L0)], axis=1)
        beam_id = ids[:, 3] if has_beam else np.full(n, -1)
        block["buffer"] = np.stack([ids[:, 0], ids[:, 0], ids[:, 1], ids[:, 1], self.copy_id[data], ids[:, 2],
                                    ids[:, 2], self.buf[data], beam_id, self.buf[np.maximum(beam, 0)], ids[:, 0]],
                                   axis=1)
        happens = np.ones((n, 11), dtype=bool)
        happens[:, 4] = self.copy_id[data] >= 0
        happens[:, 8:10] = (beam >= 0)[:, None]
        if self.first_touch:  # written on copy (and the beam table as it is filled); freed as far as written
            resident = np.stack([0 * io_row, L0 * io_row, 0 * io_row, kept * io_row, -self.copy_bytes[data],
                                 0 * row_d, kept * row_d, -self.written[data] * row_d, kept * row_b,
                                 -self.written[np.maximum(beam, 0)] * row_b, -L0 * io_row], axis=1)
        else:
            resident = np.where(block["op"] == ALLOC, nbytes, np.where(block["op"] == FREE, -nbytes, 0))
        rows.append(block[happens])
        resident_delta.append(resident[happens])
        # The state after the trim: every rebuilt unit holds ``kept`` rows; its other slots (scales) keep theirs.
        rebuilt = np.unique(units)
        slot_rows = self._slot_rows(np.arange(len(lay.layer)))
        self.budget[rebuilt] = kept
        slots = lay.unit_slots[rebuilt].ravel()
        self.slot_rows = np.where(np.isin(np.arange(len(lay.layer)), slots), slot_rows, -1)
        changed = np.concatenate([data, beam[beam >= 0]])
        self.slot_rows[changed] = -1
        if not (self.slot_rows >= 0).any() or (self.slot_rows == np.repeat(self.budget, k)).all():
            self.slot_rows = None
        self.buf[data] = ids[:, 2]
        self.written[data] = kept
        if has_beam:
            self.buf[beam] = ids[:, 3]
            self.written[beam] = kept
        self.copy_id[data], self.copy_bytes[data], self.copy_tokens[data] = ids[:, 1], kept * io_row, kept
        self.batch = 1

    def _slot_rows(self, slots: np.ndarray) -> np.ndarray:
        """Rows each slot's buffer holds: its unit's budget, unless a trim left it at its own size."""
        rows = self.budget[slots // self.layout.unit_slots.shape[1]]
        if self.slot_rows is None:
            return rows
        own = self.slot_rows[slots]
        return np.where(own >= 0, own, rows)

    def _inference(self, step: int, phase: int, inf: Inference, needed: int, rows: list, resident_delta: list):
        """An inference's rows, appended to ``rows`` (and their changes of resident memory): the past
        block grown, the beams gathered, and the units that no longer hold ``needed`` tokens
        reallocated with their kernels' beam tables. Returns the old buffers' frees deferred
        (policy.free_old) and the resident bytes they release."""
        lay, policy = self.layout, self.policy
        if self.states.enabled:  # the state-read phase, before the past block and any unit
            read, read_res, self.next_id = self.states.read(step, phase, inf.batch, self.stored == 0, self.next_id)
            if len(read):
                rows.append(read)
                resident_delta.append(read_res)
        view = self.view.grow(step, phase, inf.batch_in * self.stored, self.stored, self.next_id)
        if len(view):
            self.next_id += int((view["op"] == ALLOC).sum())
            rows.append(view)
            resident_delta.append(np.zeros(len(view), dtype=np.int64) if self.first_touch else alloc_delta(view))
        if policy.beam_gather and inf.phase in ("fork", "reorder", "select") and self.budget.any():
            # beam_idx first: every layer gathered into new buffers at the new batch, old freed at once.
            units = np.flatnonzero(self.budget)
            held = self._held()  # exact size: no padding is carried
            id_start = self.next_id
            block, happens, resident = self._reallocate(units, held, inf.batch, step, phase, rows, "gather",
                                                        held, np.zeros(lay.units, dtype=np.int64), immediate=True)
            gathered = block[happens]
            if lay.has_absent and len(gathered):  # absent slots (LFM2's recurrent place) took ids they never use
                self._renumber(gathered, id_start)
            rows.append(gathered)
            resident_delta.append(resident[happens])
        unit_rows, unit_res, deferred = self._grow(step, phase, inf, needed, rows)
        rows.append(unit_rows)
        resident_delta.append(unit_res)
        self.after_reset = self.trimmed = False
        if self.states.enabled:
            self.batch = inf.batch  # also where no unit holds a buffer (a model of linear layers only)
        return deferred

    def _grow(self, step: int, phase: int, inf: Inference, needed: int, rows_so_far: list):
        """The units that do not hold ``needed`` tokens at the inference's batch (or whose buffers
        the policy reclaims) get new buffers, each unit's rows followed by its kernel's beam tables.
        Returns the rows that happen now with their changes of resident memory, and the frees
        deferred (policy.free_old) with the resident bytes they release."""
        lay, policy = self.layout, self.policy
        has = self.budget > 0
        if has.any() and inf.batch != self.batch and policy.reset_adopts_batch and self.after_reset:
            self.batch = inf.batch  # the kept buffers now hold rows of the new width
        rebatch = has & (inf.batch != self.batch)
        fits = has & ~rebatch & (inf.batch * needed <= self.budget)
        padded = needed + self._room()
        fits &= ~self._reclaimed(padded)
        if self.trimmed:  # the padding a trim reset: nothing appends in place (policy.trim_rule "reset_room")
            fits[:] = False
        if self.rings:  # a full ring is rebuilt (policy.ring_tokens)
            fits &= ~((self.ring >= 0) & (self._held() >= self.ring))
        units = np.flatnonzero(~fits & ~self.outside)
        id_start = self.next_id
        tables, table_unit, table_delta, self.next_id = self.tables.step(step, phase, self.stored + inf.tokens,
                                                                         inf.batch, self.stored, self.next_id)
        unit_rows, unit_res, unit_key, deferred = NO_ROWS, NO_BYTES, NO_BYTES, (NO_ROWS, NO_BYTES)
        if len(units):
            kind = "rebatch" if rebatch.any() else "grow_empty" if has.any() and not self.stored else "grow"
            tables_before = np.cumsum(table_delta) - table_delta  # tables of earlier units (the kernel runs first)
            block, happens, resident = self._reallocate(units, needed, inf.batch, step, phase, rows_so_far, kind, padded,
                                                        tables_before)
            is_free = block["op"] == FREE
            deferred_mask = happens & is_free
            if policy.free_old != "immediate":
                happens &= ~is_free
            unit_rows, unit_res = block[happens], resident[happens]
            unit_key = np.broadcast_to(2 * units[:, None], block.shape)[happens]
            deferred = block[deferred_mask], -resident[deferred_mask]
        writes, write_key, write_res = NO_ROWS, NO_BYTES, NO_BYTES
        if self.states.enabled:  # the state-write phase, among the units' rows (policy.state_writes)
            writes, write_key, write_res, self.next_id = self.states.write(step, phase, inf.batch, self.next_id)
        if len(tables) or len(writes):
            # Per unit: its buffers' rows, then its kernel's beam tables; the states' writes where they go;
            # ids in allocation order.
            order = np.argsort(np.concatenate([unit_key, 2 * table_unit + 1, write_key]), kind="stable")
            unit_rows = np.concatenate([unit_rows, tables, writes])[order]
            table_res = np.zeros(len(tables), dtype=np.int64) if self.first_touch else alloc_delta(tables)
            unit_res = np.concatenate([unit_res, table_res, write_res])[order]
            self._renumber(unit_rows, id_start)
        elif lay.has_absent and len(unit_rows):
            self._renumber(unit_rows, id_start)  # absent slots took ids they never use
        return unit_rows, unit_res, deferred

    def _allocate(self, step: int, phase: int, before: tuple, rows: np.ndarray, resident_delta: np.ndarray):
        """Perform a step's rows in order, following allocated and resident memory along them.
        Returns the step's peaks (allocated, resident), or None where an allocation fails: the rows
        before it are kept, the step is recorded as it stood, and the run stops (:attr:`oom`)."""
        allocated = self.allocated + np.cumsum(alloc_delta(rows))
        resident = self.resident + np.cumsum(resident_delta)
        failing = first_failure(rows, allocated, self.policy, self.scenario)
        done = len(rows) if failing is None else failing
        peak = int(allocated[:done].max(initial=self.allocated))
        resident_peak = int(resident[:done].max(initial=self.resident))
        self.ledger.append(rows[:done])
        if done:
            self.allocated, self.resident = int(allocated[done - 1]), int(resident[done - 1])
        if failing is None:
            return peak, resident_peak
        # The step's row shows the state before the step (tokens, batch, used), what was
        # allocated when the allocation failed, and ``steady`` = that allocation.
        self.oom = failure(rows[failing], step, self.allocated, self.policy, self.scenario)
        tokens, batch, used = before
        self._record(step, phase, peak, resident_peak, tokens=tokens, batch=batch, steady=self.allocated, used=used)
        return None

    def _end_step(self, step: int, phase: int, inf: Inference, needed: int, peak: int, resident_peak: int,
                  deferred: tuple) -> None:
        """The step's tokens written, the old buffers' frees where policy.free_old puts them, a
        stateless policy's frees of everything; then the step's row."""
        policy = self.policy
        if inf.phase == "reset":
            self.stored = 0
        else:
            self.stored += inf.tokens
            if self.first_touch:
                slot_needed = np.repeat(np.where(self.outside, 0, needed), self.layout.unit_slots.shape[1])
                self.resident += touch(self.written, slot_needed * self.batch, self.layout.row_bytes)
            if self.states.enabled:
                self.resident += self.states.end(inf.batch)
        resident_peak = max(resident_peak, self.resident)
        if policy.free_old == "next_inference":
            self.pending, self.pending_resident = deferred
        elif policy.free_old == "end_of_step" and len(deferred[0]):
            self.ledger.append(deferred[0])
            self.allocated -= int(deferred[0]["bytes"].sum())
            self.resident -= int(deferred[1].sum())
        if policy.stateless and self.budget.any():
            free, released = self._free_live(step, phase)  # a stateless policy keeps nothing
            self.ledger.append(free)
            self.allocated -= int(free["bytes"].sum())
            self.resident -= int(released.sum())
        self._record(step, phase, peak, resident_peak)

    def _free_live(self, step: int, phase: int, keep_states: bool = False):
        """Free every live K/V buffer (``keep_states``: not the linear-attention states): their rows,
        and the resident bytes they release."""
        units = np.flatnonzero((self.budget > 0) & ~(self.state & keep_states))
        slots = self.layout.unit_slots[units].ravel()
        slots = slots[self.layout.row_bytes[slots] > 0]  # absent slots hold nothing
        free = self._live_rows(slots, step, phase)
        released = self._live_resident(slots) if self.first_touch else free["bytes"]
        self.budget[units], self.written[slots] = 0, 0
        self.buf[self.layout.unit_slots[units].ravel()] = -1
        if self.slot_rows is not None:
            self.slot_rows[self.layout.unit_slots[units].ravel()] = -1
        return free, released

    def _reallocate(self, units, needed, batch, step, phase, rows_so_far, kind, padded, tables_before, immediate=None):
        """``padded``: per unit, the tokens needed plus the room carried over (policy.carry_padding);
        ``tables_before``: per unit, bytes the kernels' beam tables took this step before it;
        ``immediate``: whether old buffers are freed as each unit is rebuilt (default: the policy's free_old)."""
        lay, policy = self.layout, self.policy
        padded, needed, held = padded[units], needed[units], self._held()[units]
        caps = np.asarray(policy.capacity(padded, lay.unit_prim[units]), dtype=np.int64)
        if caps.shape != units.shape or (caps < needed).any():
            raise SimkvError(f"policy {policy.name} returned a capacity below the {needed.max()} tokens needed")
        caps = np.where(self.state[units], 1, caps)  # a state is one row per sequence, whatever the policy
        if self.rings:  # a ring has its one size
            caps = np.where(self.ring[units] >= 0, self.ring[units], caps)
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
        order = self.orders[kind] if self.orders[kind].ndim == 1 else self.orders[kind][units]
        ids = self._ids_in_order(len(units), order)
        ev = Events(
            unit=units, step=step, needed=needed, copied=held, new_cap=caps, batch=batch,
            old_rows=old_rows if self.slot_rows is None else self._slot_rows(slots), old_batch=self.batch,
            old_ids=self.buf[slots], old_resident=self._live_resident(slots), ids=ids,
        )
        if self.slot_rows is not None:  # rebuilt units hold one size again
            self.slot_rows[slots.ravel()] = -1
            if not (self.slot_rows >= 0).any():
                self.slot_rows = None
        out = event_rows(lay, ev, phase, order, self.request, self.first_touch)
        self.budget[units] = caps * batch
        self.buf[slots] = ids
        self.written[slots] = np.where((old_rows > 0)[:, None], held[:, None] * batch, 0)
        self.batch = batch
        return out

    def _renumber(self, rows: np.ndarray, id_start: int) -> None:
        """Renumber the ids allocated since ``id_start`` in the order ``rows`` allocates them,
        in the rows and in the live state."""
        fresh = rows["buffer"] >= id_start
        allocs = rows["buffer"][fresh & (rows["op"] == ALLOC)]
        remap = np.full(self.next_id - id_start, -1, dtype=np.int64)  # -1: an absent slot's unused id
        remap[allocs - id_start] = id_start + np.arange(len(allocs))
        rows["buffer"][fresh] = remap[rows["buffer"][fresh] - id_start]
        for ids in (self.buf, self.tables.ids, self.states.ids):
            moved = ids >= id_start
            ids[moved] = remap[ids[moved] - id_start]
        self.next_id = id_start + len(allocs)

    def _ids_in_order(self, n: int, order: np.ndarray) -> np.ndarray:
        """Fresh buffer ids for ``n`` units' slots, numbered in the order they are allocated."""
        k = self.layout.unit_slots.shape[1]
        ids = fresh_ids(self.next_id, n, order, k)
        self.next_id += n * k
        return ids

    def _live_rows(self, slots: np.ndarray, step: int, phase: int) -> np.ndarray:
        lay = self.layout
        budget = self._slot_rows(slots)
        rows = np.zeros(len(slots), dtype=ROW)
        rows["step"], rows["phase"], rows["request"], rows["op"] = step, phase, self.request, FREE
        rows["layer"] = lay.layer[slots]
        rows["tensor"] = lay.tensor[slots]
        rows["bytes"] = budget * lay.row_bytes[slots]
        rows["capacity_tokens"] = budget // self.batch
        rows["used_tokens"] = self._held()[slots // lay.unit_slots.shape[1]]
        rows["buffer"] = self.buf[slots]
        return rows

    def _live_resident(self, slots: np.ndarray) -> np.ndarray:
        return self.written[slots] * self.layout.row_bytes[slots]

    # -- bookkeeping -------------------------------------------------------------

    def steady(self) -> int:
        """Bytes the live buffers, the past block and the beam tables hold."""
        held = int((self._slot_rows(np.arange(len(self.layout.layer))) * self.layout.row_bytes).sum())
        return (held + self.view.bytes + self.tables.bytes() + self.states.bytes() + int(self.copy_bytes.sum())
                + self.npu.bytes())

    def _used(self) -> int:
        live = self.budget.any() or self.states.live()
        return int((self._held() * self.unit_row).sum()) * self.batch if live else 0

    def _held(self) -> np.ndarray:
        """Per unit, tokens per beam its buffers hold between inferences: the history, or a window's part
        (a state: one row, once there is a history)."""
        return np.where(self.keep < 0, self.stored, np.minimum(self.stored, self.keep))

    def _needed(self, tokens: int) -> np.ndarray:
        """Per unit, tokens per beam its buffers must hold for an inference of ``tokens`` more (a state: one,
        a ring: at most its size)."""
        wanted = self._held() + tokens
        if self.rings:
            wanted = np.where(self.ring >= 0, np.minimum(wanted, self.ring), wanted)
        return np.where(self.state, 1, wanted)

    def _record(self, step, phase, peak, resident_peak, tokens=None, batch=None, steady=None, used=None) -> None:
        self.steps.add(
            step, phase,
            self.stored if tokens is None else tokens,
            self.batch if batch is None else batch,
            self.allocated, peak,
            self.steady() if steady is None else steady,
            self._used() if used is None else used,
            self.resident if self.first_touch else self.allocated,
            resident_peak if self.first_touch else peak,
        )

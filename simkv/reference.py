"""The reference engine: every step, every layer, every buffer, one token at a time.

Slow on purpose and written to be read: it walks the workload step by step,
asks every unit whether its buffers still fit, performs each allocation,
copy and free through :class:`simkv.memory.Allocator` in the order the
policy's runtime uses, appends each new token to each buffer, and measures
every step by summing over all live buffers. The fast engine
(:mod:`simkv.engine`) must produce exactly the same ledger and step table;
``--engine reference`` selects this one.
"""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from simkv.errors import SimkvError
from simkv.layout import PAST_VIEW_BYTES, Layout
from simkv.ledger import ALLOC, COPY, PHASE_CODE, TENSOR_CODE, Ledger
from simkv.memory import Allocator, Buffer, OutOfMemory
from simkv.steps import StepRecorder


class ReferenceEngine:
    def __init__(self, scenario, request: int = 0, progress: bool = False) -> None:
        self.scenario = scenario
        self.policy = scenario.policy
        self.layout = Layout.build(scenario.model, scenario.precision, scenario.policy)
        self.request = request
        self.progress = progress
        self.memory = Allocator(scenario.device_memory, first_touch=scenario.policy.first_touch,
                                weights=scenario.weights_memory)
        self.ledger = Ledger()
        self.steps = StepRecorder()
        self.oom: OutOfMemory | None = None
        self.current: list[Buffer | None] = [None] * len(self.layout.layer)
        self.view: Buffer | None = None
        model = scenario.model
        self.view_row_bytes = model.kv_heads * model.head_dim * PAST_VIEW_BYTES

    def run(self) -> None:
        lay, policy, mem = self.layout, self.policy, self.memory
        k = lay.unit_slots.shape[1]
        stored, batch, after_reset = 0, 1, False
        pending: list[Buffer] = []
        inferences = tqdm(
            self.scenario.workload.inferences(), total=self.scenario.workload.steps, unit="step",
            desc="reference engine", disable=None if self.progress else True, leave=False,
        )
        for step, inf in enumerate(inferences):
            phase = PHASE_CODE[inf.phase]
            where = (step, phase, self.request)
            mem.peak, mem.resident_peak = mem.allocated, mem.resident
            before = (stored, batch, self._used() if self._live() else 0)
            try:
                for buf in pending:
                    mem.free(*where, buf)
                pending = []
                if inf.phase == "reset":
                    if policy.reset == "free":
                        for slot, buf in enumerate(self.current):
                            if buf is not None:
                                mem.free(*where, buf)
                                self.current[slot] = None
                        batch = 1
                    for buf in self.current:
                        if buf is not None:
                            buf.used = 0
                    stored, after_reset = 0, True
                    self.ledger.append(mem.take_rows())
                    self._record(step, phase, stored, batch)
                    continue

                if policy.past_view:
                    self._grow_view(where, inf.batch_in * stored, stored)
                needed = stored + inf.tokens
                if self._live() and inf.batch != batch and policy.reset_adopts_batch and after_reset:
                    batch = inf.batch  # the buffers now hold rows of the new batch width
                    for buf in self.current:
                        buf.batch = batch
                todo = [u for u in range(lay.units) if not self._fits(u, needed, inf.batch, batch)]
                kind = self._situation(todo, inf.batch, batch, stored)
                order = lay.row_order((policy.row_orders or {}).get(kind))
                caps = policy.capacity(np.full(len(todo), needed, dtype=np.int64), lay.unit_prim[todo]) if todo else []
                later: list[Buffer] = []
                for unit, cap in zip(todo, (int(c) for c in caps)):
                    if cap < needed:
                        raise SimkvError(f"policy {policy.name} returned a capacity below the {needed} tokens needed")
                    unit_bytes = cap * int(lay.unit_row_bytes[unit]) * inf.batch
                    near_limit = policy.headroom_limit and (
                        mem.allocated + mem.weights + unit_bytes >= policy.headroom_limit * self.scenario.device_memory
                    )
                    if near_limit or (policy.max_alloc_bytes and unit_bytes > policy.max_alloc_bytes):
                        cap = needed  # no headroom near the device's limits
                    slots = [int(s) for s in lay.unit_slots[unit]]
                    olds = [self.current[s] for s in slots]
                    news: list[Buffer | None] = [None] * k
                    for position in order.tolist():
                        op, j = divmod(position, k)
                        if op == ALLOC:
                            s = slots[j]
                            news[j] = mem.alloc(
                                *where, layer=int(lay.layer[s]), tensor=int(lay.tensor[s]), capacity=cap,
                                batch=inf.batch, row_bytes=int(lay.row_bytes[s]), holds=needed,
                            )
                        elif op == COPY:
                            if olds[j] is not None and stored > 0:
                                mem.copy(*where, olds[j], news[j], stored)
                        elif olds[j] is not None:
                            if policy.free_old == "immediate":
                                mem.free(*where, olds[j])
                            else:
                                later.append(olds[j])
                    for s, new in zip(slots, news):
                        self.current[s] = new
                batch = inf.batch
                for _token in range(inf.tokens):
                    for buf in self.current:
                        buf.used += 1
                        mem.write(buf, buf.used)
                stored, after_reset = needed, False
                mem.resident_peak = max(mem.resident_peak, mem.resident)
                if policy.free_old == "end_of_step":
                    for buf in later:
                        mem.free(*where, buf)
                else:
                    pending = later
            except OutOfMemory as oom:
                self.oom = oom
                self.ledger.append(mem.take_rows())
                tokens, width, used = before
                self._record(step, phase, tokens, width, steady=mem.allocated, used=used)
                return
            self.ledger.append(mem.take_rows())
            self._record(step, phase, stored, batch)

    def _grow_view(self, where, rows: int, tokens: int) -> None:
        """The CPU plugin's past block: grown to exactly ``rows`` rows, new before old is freed."""
        old = self.view
        if rows * self.view_row_bytes <= (old.bytes if old else 0):
            return
        self.view = self.memory.alloc(
            *where, layer=-1, tensor=TENSOR_CODE["past_view"], capacity=tokens, batch=rows // tokens,
            row_bytes=self.view_row_bytes, holds=0,
        )
        if old is not None:
            self.memory.free(*where, old)

    def _fits(self, unit: int, needed: int, new_batch: int, batch: int) -> bool:
        buf = self.current[int(self.layout.unit_slots[unit][0])]
        if buf is None or new_batch != batch or new_batch * needed > buf.rows:
            return False
        prim = self.layout.unit_prim[unit : unit + 1]
        return not bool(self.policy.reclaim(np.array([needed]), prim, np.array([buf.capacity]))[0])

    def _situation(self, todo: list[int], new_batch: int, batch: int, stored: int) -> str:
        """Which of the policy's row orders applies to this step's reallocations."""
        had = bool(todo) and self.current[int(self.layout.unit_slots[todo[0]][0])] is not None
        if had and new_batch != batch:
            return "rebatch"
        if had and stored == 0:
            return "grow_empty"
        return "grow"

    def _live(self) -> bool:
        return any(buf is not None for buf in self.current)

    def _used(self) -> int:
        return sum(b.used * b.batch * b.row_bytes for b in self.current if b is not None)

    def _record(self, step, phase, stored, batch, steady=None, used=None) -> None:
        """Measure the step by summing over every live buffer."""
        mem = self.memory
        live = list(mem.live.values())
        allocated = sum(b.bytes for b in live)
        if allocated != mem.allocated:
            raise AssertionError("allocator lost track of memory")
        current = [b for b in self.current if b is not None] + ([self.view] if self.view else [])
        if steady is None:
            steady = sum(b.bytes for b in current)
        if used is None:
            used = self._used()
        if mem.first_touch:
            resident = sum(b.resident_bytes for b in live)
            resident_peak = mem.resident_peak
        else:
            resident, resident_peak = allocated, mem.peak
        self.steps.add(step, phase, stored, batch, allocated, mem.peak, steady, used, resident, resident_peak)

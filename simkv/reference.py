"""The reference engine: every step, every layer, every buffer, one token at a time.

Slow on purpose and written to be read: it walks the workload step by step,
asks every unit whether its buffers still fit, performs each allocation,
copy and free through :class:`simkv.memory.Allocator`, appends each new token
to each buffer, and measures every step by summing over all live buffers.
The fast engine (:mod:`simkv.engine`) must produce exactly the same ledger
and step table; ``--engine reference`` selects this one.
"""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from simkv.errors import SimkvError
from simkv.layout import Layout
from simkv.ledger import PHASE_CODE, ROW, Ledger
from simkv.memory import Allocator, Buffer, OutOfMemory
from simkv.steps import StepRecorder


class ReferenceEngine:
    def __init__(self, scenario, request: int = 0, progress: bool = False) -> None:
        self.progress = progress
        self.scenario = scenario
        self.policy = scenario.policy
        self.layout = Layout.build(scenario.model, scenario.precision, scenario.policy)
        self.request = request
        self.memory = Allocator(scenario.device_memory, first_touch=scenario.policy.first_touch)
        self.ledger = Ledger()
        self.steps = StepRecorder()
        self.oom: OutOfMemory | None = None
        self.current: list[Buffer | None] = [None] * len(self.layout.layer)
        self.capacity = [0] * self.layout.units

    def run(self) -> None:
        lay, policy, mem = self.layout, self.policy, self.memory
        stored, batch = 0, 1
        pending: list[Buffer] = []
        inferences = tqdm(
            self.scenario.workload.inferences(), total=self.scenario.workload.steps, unit="step",
            desc="reference engine", disable=None if self.progress else True, leave=False,
        )
        for step, inf in enumerate(inferences):
            phase = PHASE_CODE[inf.phase]
            where = (step, phase, self.request)
            mem.peak, mem.resident_peak = mem.allocated, mem.resident
            had_before, stored_before, batch_before = self._any_live(), stored, batch
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
                        self.capacity = [0] * lay.units
                        batch = 1
                    for buf in self.current:
                        if buf is not None:
                            buf.used = 0
                    stored = 0
                else:
                    needed = stored + inf.tokens
                    todo = [u for u in range(lay.units) if not self._fits(u, needed, inf.batch, batch)]
                    caps = policy.capacity(np.full(len(todo), needed, dtype=np.int64), lay.unit_prim[todo]) if todo else []
                    later: list[Buffer] = []
                    for unit, cap in zip(todo, (int(c) for c in caps)):
                        if cap < needed:
                            raise SimkvError(f"policy {policy.name} returned a capacity below the {needed} tokens needed")
                        unit_bytes = cap * int(lay.unit_row_bytes[unit]) * inf.batch
                        near_limit = policy.headroom_limit and (
                            mem.allocated + unit_bytes >= policy.headroom_limit * self.scenario.device_memory
                        )
                        if near_limit or (policy.max_alloc_bytes and unit_bytes > policy.max_alloc_bytes):
                            cap = needed  # no headroom near the device's limits
                        slots = [int(s) for s in lay.unit_slots[unit]]
                        olds = [self.current[s] for s in slots]
                        news = [
                            mem.alloc(
                                *where, layer=int(lay.layer[s]), tensor=int(lay.tensor[s]), capacity=cap,
                                batch=inf.batch, row_bytes=int(lay.row_bytes[s]), holds=needed,
                            )
                            for s in slots
                        ]
                        for old, new in zip(olds, news):
                            if old is not None and stored > 0:
                                mem.copy(*where, old, new, stored)
                        for old in olds:
                            if old is not None:
                                if policy.free_old == "immediate":
                                    mem.free(*where, old)
                                else:
                                    later.append(old)
                        for s, new in zip(slots, news):
                            self.current[s] = new
                        self.capacity[unit] = cap
                    batch = inf.batch
                    for _token in range(inf.tokens):
                        for buf in self.current:
                            buf.used += 1
                            mem.write(buf, buf.used)
                    stored = needed
                    mem.resident_peak = max(mem.resident_peak, mem.resident)
                    if policy.free_old == "end_of_step":
                        for buf in later:
                            mem.free(*where, buf)
                    else:
                        pending = later
            except OutOfMemory as oom:
                self.oom = oom
                self.ledger.append(mem.take_rows())
                used_before = self._logical(stored_before, batch_before) if had_before else 0
                self._record(step, phase, stored_before, batch_before, steady=mem.allocated, used=used_before)
                return
            self.ledger.append(mem.take_rows())
            self._record(step, phase, stored, batch)

    def _fits(self, unit: int, needed: int, new_batch: int, batch: int) -> bool:
        cap = self.capacity[unit]
        if cap == 0 or new_batch != batch or needed > cap:
            return False
        prim = self.layout.unit_prim[unit : unit + 1]
        return not bool(self.policy.reclaim(np.array([needed]), prim, np.array([cap]))[0])

    def _any_live(self) -> bool:
        return any(buf is not None for buf in self.current)

    def _logical(self, tokens: int, batch: int) -> int:
        return sum(tokens * batch * int(b) for b in self.layout.row_bytes)

    def _record(self, step, phase, stored, batch, steady=None, used=None) -> None:
        """Measure the step by summing over every live buffer."""
        mem = self.memory
        live = list(mem.live.values())
        allocated = sum(b.bytes for b in live)
        if allocated != mem.allocated:
            raise AssertionError("allocator lost track of memory")
        current = [b for b in self.current if b is not None]
        if steady is None:
            steady = sum(b.bytes for b in current)
        if used is None:
            used = sum(b.used * b.batch * b.row_bytes for b in current)
        if mem.first_touch:
            resident = sum(b.resident_bytes for b in live)
            resident_peak = mem.resident_peak
        else:
            resident, resident_peak = allocated, mem.peak
        self.steps.add(step, phase, stored, batch, allocated, mem.peak, steady, used, resident, resident_peak)


__all__ = ["ReferenceEngine", "ROW"]

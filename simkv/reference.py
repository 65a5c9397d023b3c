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
from simkv.kvspec import widest_row
from simkv.layout import BEAM_TABLE_BYTES, PAST_VIEW_BYTES, Layout
from simkv.ledger import ALLOC, COPY, PHASE_CODE, TENSOR_CODE, TENSORS, Ledger
from simkv.limits import MAX_LEDGER_ROWS
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
                                weights=scenario.weights_memory, max_alloc=scenario.policy.max_alloc_bytes)
        self.ledger = Ledger(limit=MAX_LEDGER_ROWS)
        self.steps = StepRecorder()
        self.oom: OutOfMemory | None = None
        self.current: list[Buffer | None] = [None] * len(self.layout.layer)
        # Beam tables a GPU kernel keeps beside each unit (policy.kernel_beam_tables): [new, prev].
        self.tables: list[list[Buffer | None]] = [[None, None] for _ in range(self.layout.units)]
        self.view: Buffer | None = None
        model = scenario.model
        self.view_row_bytes = widest_row(model.kv_layers, self.policy.mla_form) * PAST_VIEW_BYTES
        lay = self.layout
        # Per unit: tokens kept between inferences (a window; -1 the whole history), and whether it is a
        # linear-attention state (one row per sequence, never resized by the policy).
        self.keep = [int(k) for k in lay.unit_keep]
        self.state = [bool(x) for x in lay.unit_state]
        self.ring = [int(r) for r in lay.unit_ring]  # per unit: a fixed ring buffer's tokens, or -1
        self.unit_of = np.repeat(np.arange(lay.units), lay.unit_slots.shape[1])  # per slot
        # Double-buffered states (policy.double_buffered_states): per state place (a state unit's slot that is
        # not absent), its [read, write] buffers, outside self.current; and the rows of the last inference.
        self.double = bool(self.policy.double_buffered_states and lay.has_states)
        self.places = [s for s in range(len(lay.layer))
                       if self.double and self.state[self.unit_of[s]] and lay.row_bytes[s]]
        self.pair: dict[int, list[Buffer | None]] = {s: [None, None] for s in self.places}
        self.last_rows = 0
        # Where each state's write buffer is sized (policy.state_writes): with its unit, or after the last unit.
        late = [s for s in self.places if self.policy.state_writes.get(TENSORS[lay.tensor[s]], "unit") == "end"]
        self.writes_at_unit = {int(self.unit_of[s]): [] for s in self.places}
        for s in self.places:
            if s not in late:
                self.writes_at_unit[int(self.unit_of[s])].append(s)
        self.writes_at_end = late[::-1]  # descending
        # A trim (policy.trim_rule): the copy each K and V state keeps (per data slot), and whether the next
        # inference must rebuild every unit with no room carried ("reset_room").
        self.copies: dict[int, Buffer] = {}
        self.trimmed = False
        # The NPU pipeline (policy.npu_pipeline): its step plan, present outputs and prefix-cache blocks.
        self.npu_plan = self.policy.plan(scenario.workload) if self.policy.npu_pipeline else []
        self.presents: list[Buffer] = []
        self.blocks: dict[int, list[Buffer]] = {}

    def run(self) -> None:
        lay, policy, mem = self.layout, self.policy, self.memory
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
                            if buf is not None and not (policy.reset_keeps_states and self.state[self.unit_of[slot]]):
                                mem.free(*where, buf)
                                self.current[slot] = None
                        if not policy.reset_keeps_states:  # both buffers of each state; the next starts afresh
                            for pair in self.pair.values():
                                for col, buf in enumerate(pair):
                                    if buf is not None:
                                        mem.free(*where, buf)
                                        pair[col] = None
                            self.last_rows = 0
                        batch = 1
                    for buf in self._state_buffers() + self.current:
                        if buf is not None:
                            buf.used = 0
                    stored, after_reset = 0, True
                    self.ledger.append(mem.take_rows())
                    self._record(step, phase, stored, batch)
                    continue

                if inf.phase == "trim":
                    kept = stored + inf.tokens  # a trim's tokens are minus the tokens cut off
                    self._trim(where, stored, kept)
                    stored = kept
                    self.ledger.append(mem.take_rows())
                    self._record(step, phase, stored, batch)
                    continue

                fresh = stored == 0
                for slot in self.places:  # the state-read phase: the write buffer, then (fresh) the read one
                    self._grow_state(where, slot, 1, self.last_rows)
                    if fresh:
                        self._grow_state(where, slot, 0, inf.batch)
                if policy.past_view:
                    self._grow_view(where, inf.batch_in * stored, stored)
                held = [stored if keep < 0 else min(stored, keep) for keep in self.keep]
                if policy.beam_gather and inf.phase in ("fork", "reorder", "select") and self._live():
                    # beam_idx first: each layer's buffers gathered at the new batch, old freed at once.
                    orders = lay.orders("gather")
                    for unit in range(lay.units):
                        if self.double and self.state[unit]:
                            continue  # the states keep their own buffers
                        cap = self._capacity(unit, held[unit])
                        self._replace(where, unit, cap, inf.batch, held[unit], held[unit], self._order(orders, unit),
                                      immediate=True)
                    batch = inf.batch
                needed = [1 if self.state[u] else held[u] + inf.tokens if self.ring[u] < 0
                          else min(held[u] + inf.tokens, self.ring[u]) for u in range(lay.units)]
                if self._live() and inf.batch != batch and policy.reset_adopts_batch and after_reset:
                    batch = inf.batch  # the buffers now hold rows of the new batch width
                    for buf in self.current:
                        if buf is not None:  # an absent slot holds nothing
                            buf.batch = batch
                padded = {u: needed[u] + self._room(u, held[u]) for u in range(lay.units)}
                todo = [u for u in range(lay.units) if not (self.double and self.state[u]) and (
                        not self._fits(u, needed[u], inf.batch, batch, padded[u])
                        or 0 <= self.ring[u] <= held[u])]  # a full ring is rebuilt
                orders = lay.orders(self._situation(todo, inf.batch, batch, stored))
                later: list[Buffer] = []
                kernels = 0  # units whose kernel ran this step (the GPU beam tables come after the unit's buffers)
                tokens = stored + inf.tokens  # what an attention kernel's beam tables hold
                for unit in sorted(todo + list(self.writes_at_unit)):
                    if unit in self.writes_at_unit:  # a double-buffered state's write buffers, at its unit
                        for slot in self.writes_at_unit[unit]:
                            self._grow_state(where, slot, 1, inf.batch)
                        continue
                    kernels = self._run_kernels(where, kernels, unit, tokens, inf.batch, stored)
                    later += self._replace(where, unit, self._capacity(unit, padded[unit]), inf.batch, needed[unit],
                                           held[unit], self._order(orders, unit),
                                           immediate=policy.free_old == "immediate", exact=padded[unit])
                self._run_kernels(where, kernels, lay.units, tokens, inf.batch, stored)
                if policy.npu_pipeline:
                    self._npu(where, step)
                for slot in self.writes_at_end:  # and those written after the last unit
                    self._grow_state(where, slot, 1, inf.batch)
                batch = inf.batch
                live = [(slot, buf) for slot, buf in enumerate(self.current) if buf is not None]
                if policy.stateless:  # the history is recomputed into the fresh buffers, not copied
                    for slot, buf in live:
                        buf.used = 1 if self.state[self.unit_of[slot]] else stored
                        mem.write(buf, buf.used)
                for _token in range(inf.tokens):
                    for slot, buf in live:
                        if not self.state[self.unit_of[slot]]:
                            buf.used = min(buf.used + 1, buf.capacity)  # a full ring overwrites its oldest
                            mem.write(buf, buf.used)
                for slot, buf in live:
                    keep = self.keep[self.unit_of[slot]]
                    if self.state[self.unit_of[slot]]:
                        buf.used = 1  # a state is rewritten in place
                        mem.write(buf, 1)
                    elif keep >= 0:
                        buf.used = min(buf.used, keep)  # a window keeps its last tokens only
                for pair in self.pair.values():  # the write buffer holds the new state (a fresh read one, its start)
                    mem.write_rows(pair[1], inf.batch)
                    if fresh:
                        mem.write_rows(pair[0], inf.batch)
                    pair[0].used = pair[1].used = 1
                    pair.reverse()  # commit: the buffers swap
                if self.double:
                    self.last_rows = inf.batch
                stored, after_reset, self.trimmed = stored + inf.tokens, False, False
                mem.resident_peak = max(mem.resident_peak, mem.resident)
                if policy.free_old == "end_of_step":
                    for buf in later:
                        mem.free(*where, buf)
                else:
                    pending = later
                if policy.stateless:  # nothing is kept to the next step
                    for slot, buf in enumerate(self.current):
                        if buf is not None:
                            mem.free(*where, buf)
                            self.current[slot] = None
            except OutOfMemory as oom:
                self.oom = oom
                self.ledger.append(mem.take_rows())
                tokens, width, used = before
                self._record(step, phase, tokens, width, steady=mem.allocated, used=used)
                return
            self.ledger.append(mem.take_rows())
            self._record(step, phase, stored, batch)

    def _trim(self, where, stored: int, kept: int) -> None:
        """Cut the history from ``stored`` to ``kept`` tokens as the policy's runtime does (Policy.trim_rule)."""
        policy, lay, mem = self.policy, self.layout, self.memory
        if policy.trim_rule == "reset_room":
            self.trimmed = True
        if policy.trim_rule == "rebuild":
            for _unit, data, beam, code, io_row in zip(*lay.trim_states(self.scenario.precision.bits,
                                                                         policy.trim_io_bytes)):
                layer, old = int(lay.layer[data]), self.current[data]
                # get_state: the whole history read back; the cut copy handed to set_state, which keeps it
                got = mem.alloc(*where, layer=layer, tensor=int(code), capacity=stored, batch=1, row_bytes=int(io_row),
                                holds=stored)
                mem.copy(*where, old, got, stored)
                cut = mem.alloc(*where, layer=layer, tensor=int(code), capacity=kept, batch=1, row_bytes=int(io_row),
                                holds=kept)
                mem.copy(*where, got, cut, kept)
                if data in self.copies:
                    mem.free(*where, self.copies.pop(data))
                self.copies[data] = cut
                # set_state: new data of exactly the kept tokens, then the old freed; a new beam table likewise
                new = mem.alloc(*where, layer=layer, tensor=int(lay.tensor[data]), capacity=kept, batch=1,
                                row_bytes=int(lay.row_bytes[data]), holds=kept)
                mem.copy(*where, cut, new, kept)
                mem.free(*where, old)
                self.current[data] = new
                if beam >= 0:
                    table = mem.alloc(*where, layer=layer, tensor=int(lay.tensor[beam]), capacity=kept, batch=1,
                                      row_bytes=int(lay.row_bytes[beam]), holds=kept)
                    mem.write(table, kept)
                    table.used = kept
                    mem.free(*where, self.current[beam])
                    self.current[beam] = table
                mem.free(*where, got)
        for buf in self.current:
            if buf is not None:
                buf.used = min(buf.used, kept)

    def _npu(self, where, step: int) -> None:
        """The NPU pipeline's step (policies/openvino_npu.py, ``plan``), one buffer at a time: the present outputs
        at the first inference, a prefill's restored and stored prefix-cache blocks, the first generate step's
        copy of the prefill's KV into the cache (through a staging tensor per K and V for earlier chunks)."""
        policy, lay, mem, plan = self.policy, self.layout, self.memory, self.npu_plan[step]
        kv = [s for s in range(len(lay.layer)) if TENSORS[lay.tensor[s]] in ("k", "v") and lay.row_bytes[s]]

        def new(slot: int, kind: str, tokens: int, holds: int) -> Buffer:
            return mem.alloc(*where, layer=int(lay.layer[slot]), tensor=TENSOR_CODE[TENSORS[lay.tensor[slot]] + kind],
                             capacity=tokens, batch=1, row_bytes=int(lay.row_bytes[slot]), holds=holds)

        def copy(src: Buffer, dst: Buffer, tokens: int) -> None:
            used = dst.used
            mem.copy(*where, src, dst, tokens)
            if TENSORS[dst.tensor] in ("k", "v"):
                dst.used = used  # a copy into the cache does not change what it holds

        if not self.presents:
            for tokens in policy.presents():  # the generate model's, then the prefill model's
                self.presents += [new(s, "_present", tokens, 0) for s in kv]
        prefill_present = {s: self.presents[len(kv) + i] for i, s in enumerate(kv)}
        block = policy.block
        for key in plan.restored:
            for s in kv:
                copy(self.blocks[key][kv.index(s)], self.current[s], block)
        made = None
        for action, key in plan.stores:
            if action == "new":
                if made is not None:
                    self.blocks[made[0]] = made[1]
                buffers = []
                for s in kv:
                    buffers.append(new(s, "_block", block, block))
                    copy(prefill_present[s], buffers[-1], block)
                made = (key, buffers)
            else:
                for buf in self.blocks.pop(key) if action == "evict" else made[1]:
                    mem.free(*where, buf)
                made = None if action == "drop" else made
        if made is not None:
            self.blocks[made[0]] = made[1]
        if plan.copied:
            rest = plan.copied - plan.staged
            for s in kv:
                if plan.staged:
                    past = policy.prompt_size - policy.chunk
                    staging = new(s, "_copy", past, past)
                    copy(self.current[s], staging, past)
                    copy(staging, self.current[s], plan.staged)
                    mem.free(*where, staging)
                copy(prefill_present[s], self.current[s], rest)

    def _run_kernels(self, where, start: int, stop: int, needed: int, batch: int, stored: int) -> int:
        """Run the kernels of units ``start`` … ``stop - 1`` (their beam tables); returns ``stop``."""
        for unit in range(start, stop):
            self._beam_tables(where, unit, needed, batch, stored)
        return stop

    def _beam_tables(self, where, unit: int, needed: int, batch: int, stored: int) -> None:
        """The kernel of a unit (GPU primitive) updates its beam tables: only with more than one
        beam or on an empty cache; swap prev and new, grow new when it holds fewer than
        batch × needed elements (prev too the first time), free the one it replaces at once."""
        policy, lay = self.policy, self.layout
        if not (policy.kernel_beam_tables and policy.beam_tables) or not (batch > 1 or stored == 0):
            return
        if self.state[unit]:  # a linear-attention state has no attention kernel
            return
        pair = self.tables[unit]
        pair.reverse()
        new, prev = pair
        if new is not None and new.rows >= batch * needed:
            return
        cap = int(policy.capacity(np.array([needed]), lay.unit_prim[unit : unit + 1])[0])
        spec = dict(layer=int(lay.unit_layer[unit]), tensor=int(lay.unit_table_tensor[unit]),
                    capacity=cap, batch=batch, row_bytes=BEAM_TABLE_BYTES, holds=needed)
        pair[0] = self.memory.alloc(*where, **spec)
        if prev is None:
            pair[1] = self.memory.alloc(*where, **spec)
        elif new is not None:
            self.memory.free(*where, new)

    def _replace(self, where, unit: int, cap: int, batch: int, needed: int, held: int, order, immediate: bool,
                 exact: int | None = None) -> list[Buffer]:
        """Give a unit new buffers of ``cap`` tokens × ``batch`` (``exact``, default ``needed``, near
        the device's limits), copying ``held`` tokens, in the runtime's row ``order``; returns the old
        buffers still to free unless ``immediate``."""
        lay, mem, policy = self.layout, self.memory, self.policy
        if cap < needed:
            raise SimkvError(f"policy {policy.name} returned a capacity below the {needed} tokens needed")
        checked = lay.row_bytes[lay.unit_slots[unit][0]] if policy.headroom_buffer == "data" else lay.unit_row_bytes[unit]
        unit_bytes = cap * int(checked) * batch
        near_limit = policy.headroom_limit and (
            mem.allocated + mem.weights + unit_bytes >= policy.headroom_limit * self.scenario.device_memory
        )
        if near_limit or (policy.max_alloc_bytes and unit_bytes > policy.max_alloc_bytes):
            cap = needed if exact is None else exact  # no headroom near the device's limits
        k = lay.unit_slots.shape[1]
        slots = [int(s) for s in lay.unit_slots[unit]]
        olds = [self.current[s] for s in slots]
        news: list[Buffer | None] = [None] * k
        later: list[Buffer] = []
        for position in order.tolist():
            op, j = divmod(position, k)
            if not lay.row_bytes[slots[j]]:
                continue  # an absent slot
            if op == ALLOC:
                s = slots[j]
                news[j] = mem.alloc(
                    *where, layer=int(lay.layer[s]), tensor=int(lay.tensor[s]), capacity=cap,
                    batch=batch, row_bytes=int(lay.row_bytes[s]), holds=needed,
                )
            elif op == COPY:
                if olds[j] is not None and held > 0:
                    mem.copy(*where, olds[j], news[j], held)
            elif olds[j] is not None:
                if immediate:
                    mem.free(*where, olds[j])
                else:
                    later.append(olds[j])
        for s, new in zip(slots, news):
            self.current[s] = new
        return later

    def _grow_state(self, where, slot: int, col: int, rows: int) -> None:
        """A double-buffered state's read (``col`` 0) or write (1) buffer, grown to ``rows`` rows (one per
        sequence) if it has fewer: a new buffer of exactly that, then the old one freed."""
        pair = self.pair[slot]
        old = pair[col]
        if rows <= (old.rows if old is not None else 0):
            return
        lay = self.layout
        pair[col] = self.memory.alloc(*where, layer=int(lay.layer[slot]), tensor=int(lay.tensor[slot]), capacity=1,
                                      batch=rows, row_bytes=int(lay.row_bytes[slot]), holds=1)
        if old is not None:
            self.memory.free(*where, old)

    def _state_buffers(self) -> list[Buffer]:
        return [b for pair in self.pair.values() for b in pair if b is not None]

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

    def _fits(self, unit: int, needed: int, new_batch: int, batch: int, padded: int) -> bool:
        buf = self.current[int(self.layout.unit_slots[unit][0])]
        if buf is None or new_batch != batch or new_batch * needed > buf.rows or self.trimmed:
            return False
        if self.state[unit]:  # updated in place: never rebuilt while it fits
            return True
        prim = self.layout.unit_prim[unit : unit + 1]
        return not bool(self.policy.reclaim(np.array([padded]), prim, np.array([buf.capacity]))[0])

    def _capacity(self, unit: int, tokens: int) -> int:
        """The capacity the policy gives a unit that must hold ``tokens``; a state holds one row."""
        if self.state[unit]:
            return 1
        if self.ring[unit] >= 0:
            return self.ring[unit]
        return int(self.policy.capacity(np.array([tokens], dtype=np.int64), self.layout.unit_prim[unit : unit + 1])[0])

    @staticmethod
    def _order(orders: np.ndarray, unit: int) -> np.ndarray:
        """A unit's row order from :meth:`Layout.orders` (one for all units, or one per unit)."""
        return orders if orders.ndim == 1 else orders[unit]

    def _room(self, unit: int, held: int) -> int:
        """Unused tokens of a unit's buffer, carried into its next one (policy.carry_padding);
        none before the first inference or after a reset (the runtime resets the padding), nor in a state."""
        buf = self.current[int(self.layout.unit_slots[unit][0])]
        if not self.policy.carry_padding or not held or buf is None or self.state[unit] or self.trimmed:
            return 0
        return buf.capacity - held

    def _situation(self, todo: list[int], new_batch: int, batch: int, stored: int) -> str:
        """Which of the policy's row orders applies to this step's reallocations."""
        had = bool(todo) and self.current[int(self.layout.unit_slots[todo[0]][0])] is not None
        if had and new_batch != batch:
            return "rebatch"
        if had and stored == 0:
            return "grow_empty"
        return "grow"

    def _live(self) -> bool:
        return any(buf is not None for buf in self.current) or bool(self._state_buffers())

    def _used(self) -> int:
        """Bytes the history holds: each live buffer's tokens, a double-buffered state once (its read
        buffer, at the rows of the last inference)."""
        states = sum(pair[0].used * self.last_rows * pair[0].row_bytes for pair in self.pair.values()
                     if pair[0] is not None)
        return sum(b.used * b.batch * b.row_bytes for b in self.current if b is not None) + states

    def _record(self, step, phase, stored, batch, steady=None, used=None) -> None:
        """Measure the step by summing over every live buffer."""
        mem = self.memory
        live = list(mem.live.values())
        allocated = sum(b.bytes for b in live)
        if allocated != mem.allocated:
            raise AssertionError("allocator lost track of memory")
        current = [b for b in self.current if b is not None] + ([self.view] if self.view else [])
        current += [b for pair in self.tables for b in pair if b is not None] + self._state_buffers()
        current += list(self.copies.values()) + self.presents + [b for bufs in self.blocks.values() for b in bufs]
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

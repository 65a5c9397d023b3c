"""A run of one-token decode steps, planned at once (the fast engine's core).

Every unit's chain of reallocations over the run follows from its capacity: the unit
overflows when the history passes it, and the policy sizes the next buffer
(:mod:`simkv.chains`). :func:`plan` computes all chains together, builds every ledger
row of the run at once (each link is a reallocation event, :mod:`simkv.engine.events`,
that frees the previous link's buffers), merges them with the past block's growths and
the beam tables' in one stream ordered as the runtime orders them, numbers the buffer ids
in allocation order, and derives each step's memory from running sums. In-place appends
cost no row: each step has one pseudo row (op -1) that stands for its token writes.

Near a memory limit the plan is discarded (:class:`NoPlan`) and the engine takes the
steps one by one, where the limit rules apply sequentially. Planning reads the engine's
state and changes nothing; the engine commits the :class:`Run`
(:meth:`simkv.engine.session.FastEngine._decode_run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from simkv.chains import chains
from simkv.engine.beam_tables import TablePlan
from simkv.engine.events import NO_BYTES, NO_ROWS, Events, alloc_delta, event_rows
from simkv.engine.oom import ExactSizes, over_device, too_large
from simkv.engine.past_view import ViewPlan
from simkv.engine.residency import writes_below_mark
from simkv.ledger import ALLOC, FREE, PHASE_CODE, ROW, TENSOR_CODE, join, pick
from simkv.steps import STEP

# Order of rows inside a step: frees deferred from the previous inference, the
# past-view block, each unit's rows, the step's token writes, frees deferred to
# the end of the step.
_PENDING, _VIEW, _UNITS, _WRITES, _END = range(5)
_SECTIONS = 5


class NoPlan(NamedTuple):
    """A run left to the steps one by one: ``limit_step``, the step of the run (1..n) where a
    memory limit is met, if known; ``met_headroom``, whether that is the headroom limit met at the
    policy's sizes."""

    limit_step: int | None = None
    met_headroom: bool = False


@dataclass
class Held:
    """What a run leaves live: the units' buffers, the frees deferred to the next inference,
    memory, and the past block and beam tables if they changed."""

    budget: np.ndarray  # rows per unit
    slots: np.ndarray  # the slots reallocated in the run
    buffers: np.ndarray  # their last buffer ids
    pending: np.ndarray  # frees due at the start of the next inference
    pending_resident: np.ndarray  # the resident bytes they release
    allocated: int
    resident: int
    view: tuple | None  # the past block's (bytes, tokens, id): PastView.commit's arguments
    tables: tuple | None  # the beam tables' (rows, batch, ids): BeamTables.commit's arguments


@dataclass
class Run:
    """A planned run: its ledger rows and step rows, and the engine's state after it."""

    rows: np.ndarray
    steps: np.ndarray
    next_id: int
    stored: int
    batch: int
    held: Held | None  # None: a stateless run keeps no buffer


class _Links(NamedTuple):
    """Every unit's chain of reallocations over the run, one entry per link, in runtime order
    (by step, then unit): the unit, the step of the run (1..n), the rows it replaces, its capacity."""

    unit: np.ndarray
    k: np.ndarray
    old_rows: np.ndarray
    new_cap: np.ndarray


class _Keys:
    """Sort keys of a run's rows: (step, section, unit, position in the unit's rows)."""

    def __init__(self, units: int, slots: int) -> None:
        self.U, self.W = units, 3 * slots + 2  # a unit's rows, then its kernel's beam table alloc and free

    def key(self, step_k, section, u, pos):
        return ((step_k * _SECTIONS + section) * self.U + u) * self.W + pos

    def step_of(self, keys):
        return keys // (_SECTIONS * self.U * self.W)


def plan(eng, first_step: int, n: int, exact_sizes: bool = False, shortcut_links: int = 0) -> Run | NoPlan:
    """Plan ``n`` one-token decode steps from ``first_step`` on. ``exact_sizes``: past the headroom
    limit, every reallocation sized exactly (the plan holds only where the step-by-step rule gives
    that size); ``shortcut_links``: passed to :func:`simkv.chains.chains`."""
    lay, policy = eng.layout, eng.policy
    L0, B, next_id = eng.stored, eng.batch, eng.next_id
    K = lay.unit_slots.shape[1]

    # 1. Each unit's chain of reallocations, its kernel's beam tables and the past block's growths.
    unit, k, old_rows, new_cap, budget = chains(ExactSizes if exact_sizes else policy, lay.unit_prim, eng.budget,
                                                L0, B, n, shortcut_links)
    if np.any(too_large(policy, new_cap * eng.unit_row[unit] * B)):  # the steps one by one end the run
        return NoPlan()
    E = len(unit)
    view = eng.view.plan(first_step, n, L0, B, next_id + E * K)  # provisional ids after the links'
    if np.any(too_large(policy, view.rows["bytes"])):
        return NoPlan()
    n_views = len(view.growth)
    tables = eng.tables.plan(first_step, n, L0, B, next_id + E * K + n_views)  # after the views'
    if tables is None or np.any(too_large(policy, tables.rows["bytes"])):
        return NoPlan()
    order = np.lexsort((unit, k))
    links = _Links(unit[order], k[order], old_rows[order], new_cap[order])
    del unit, k, old_rows, new_cap  # each array once: the plan's memory is its size

    # 2. One stream of rows in the runtime's order; ids numbered in allocation order.
    ids = next_id + np.arange(E * K, dtype=np.int64).reshape(E, K)  # provisional, per link and slot
    first_link, prev, last = _link_order(links.unit, links.k)
    rows, row_k, res = _stream(eng, first_step, n, links, ids, first_link, prev, view, tables)
    real = rows["op"] >= 0  # not a step's pseudo row
    final = _number_ids(rows, real, next_id)
    inside = row_k <= n  # else a free deferred to the next inference: carried to it
    carried, carried_res = NO_ROWS, NO_BYTES
    if not inside.all():
        carried, carried_res = pick(rows, ~inside), -res[~inside]
        rows, row_k, res, real = pick(rows, inside), row_k[inside], res[inside], real[inside]

    # 3. Memory along the stream; a limit met inside the run leaves it to the steps one by one.
    delta = np.where(real, alloc_delta(rows), 0)
    running = eng.allocated + np.cumsum(delta)
    limit = _limit_met(eng, rows, row_k, delta, running, links, exact_sizes)
    if limit is not None:
        return limit
    resident = eng.resident + np.cumsum(res) if eng.first_touch else running
    steps = _step_rows(eng, first_step, n, links, row_k, running, resident, view, tables)

    # 4. The state the run leaves, for the engine to commit.
    slots = lay.unit_slots[links.unit[last]]
    if tables.state is not None:
        t_ids = tables.state[2]
        moved = t_ids >= next_id
        t_ids[moved] = final[t_ids[moved] - next_id]
    held = Held(
        budget=budget, slots=slots, buffers=final[ids[last] - next_id], pending=carried,
        pending_resident=carried_res if eng.first_touch else carried["bytes"],
        allocated=int(steps["allocated"][-1]), resident=int(steps["resident"][-1]),
        view=(*view.after, int(final[E * K + n_views - 1])) if n_views else None, tables=tables.state,
    )
    return Run(pick(rows, real), steps, next_id + len(final), L0 + n, B, held)


def _link_order(unit: np.ndarray, k: np.ndarray):
    """Each unit's links in step order: per link, whether it is its unit's first, the link
    before it (whose buffers it frees), and whether it is its unit's last."""
    E = len(unit)
    by_unit = np.lexsort((k, unit))
    su = unit[by_unit]
    later_link = np.zeros(E, dtype=bool)
    later_link[1:] = su[1:] == su[:-1]
    first_link = np.ones(E, dtype=bool)
    first_link[by_unit] = ~later_link
    prev = np.zeros(E, dtype=np.int64)
    prev[by_unit[later_link]] = by_unit[np.flatnonzero(later_link) - 1]
    last = np.ones(E, dtype=bool)
    last[by_unit[:-1]] = su[1:] != su[:-1]
    return first_link, prev, last


def _link_rows(eng, first_step: int, links: _Links, ids, first_link, prev, keys: _Keys):
    """The links' rows that happen, their sort keys and their change of resident memory. A unit's
    first link replaces its live buffers; each later one, the buffers of the link before it."""
    lay, policy = eng.layout, eng.policy
    L0, B, K = eng.stored, eng.batch, lay.unit_slots.shape[1]
    unit, k = links.unit, links.k
    slots = lay.unit_slots[unit]
    held = B * (L0 + k - 1)[:, None]  # rows written in the old buffer when it is replaced
    ev = Events(
        unit=unit, step=first_step + k - 1, needed=L0 + k, copied=L0 + k - 1, new_cap=links.new_cap, batch=B,
        old_rows=links.old_rows, old_batch=B, ids=ids,
        old_ids=np.where(first_link[:, None], eng.buf[slots], ids[prev]),
        old_resident=np.where(first_link[:, None], np.maximum(eng.written[slots], held), held) * lay.row_bytes[slots],
    )
    block, happens, resident = event_rows(lay, ev, PHASE_CODE["decode"], eng.orders["grow"], eng.request, eng.first_touch)
    kk = np.broadcast_to(k[:, None], block.shape).copy()
    section = np.full(block.shape, _UNITS, dtype=np.int8)
    if policy.free_old != "immediate":
        is_free = block["op"] == FREE
        late = policy.free_old == "next_inference"
        section[is_free] = _PENDING if late else _END
        kk[is_free] += late
    row_keys = keys.key(kk, section, unit[:, None], np.arange(3 * K)[None, :])[happens]
    return pick(block, happens), row_keys, resident[happens]


def _stream(eng, first_step: int, n: int, links: _Links, ids, first_link, prev, view: ViewPlan, tables: TablePlan):
    """The run's rows sorted as the runtime performs them: the frees deferred from the previous
    inference, then per step the past block, each unit's rows and its kernel's beam tables, a
    pseudo row for the step's token writes, and the frees deferred to the step's end (frees
    deferred to the next inference move to the next step: n + 1 is past the run). Returns the
    rows, each one's step in the run and its change of resident memory."""
    L0, B = eng.stored, eng.batch
    U, K = eng.layout.unit_slots.shape
    keys = _Keys(U, K)
    view_rows, view_k = view.rows, view.k
    t_rows, t_k, t_unit = tables.rows, tables.k, tables.unit
    rows, row_keys, res = _link_rows(eng, first_step, links, ids, first_link, prev, keys)
    steps_k = np.arange(1, n + 1, dtype=np.int64)
    writes = np.full(n, B * eng.row_total, dtype=np.int64)
    if eng.first_touch:
        writes -= writes_below_mark(eng.written, eng.layout, L0, B, n, links.unit, links.k)
    pseudo = np.zeros(n, dtype=ROW)
    pseudo["op"] = -1
    pending = eng.pending.copy()
    pending["step"], pending["phase"] = first_step, PHASE_CODE["decode"]
    all_rows = join([pending, view_rows, rows, t_rows, pseudo])
    all_keys = np.concatenate([
        np.full(len(pending), keys.key(1, _PENDING, 0, 0)),
        keys.key(view_k, _VIEW, 0, (view_rows["op"] == FREE).astype(np.int64)),
        row_keys, keys.key(t_k, _UNITS, t_unit, 3 * K + (t_rows["op"] == FREE)), keys.key(steps_k, _WRITES, 0, 0),
    ])
    t_res = np.zeros(len(t_rows), dtype=np.int64) if eng.first_touch else alloc_delta(t_rows)
    all_res = np.concatenate([-eng.pending_resident, np.zeros(len(view_rows), dtype=np.int64), res, t_res, writes])
    # Each copy of a plan's rows is dropped once used, so memory peaks at about two of them.
    del rows, row_keys, res
    sort = np.argsort(all_keys, kind="stable")
    all_rows, all_keys, all_res = pick(all_rows, sort), all_keys[sort], all_res[sort]
    row_k = keys.step_of(all_keys)
    all_rows["step"] = first_step + row_k - 1  # frees deferred to the next inference move on
    return all_rows, row_k, all_res


def _number_ids(rows: np.ndarray, real: np.ndarray, next_id: int) -> np.ndarray:
    """Renumber the provisional ids (from ``next_id`` on) of the ``real`` rows in the order they
    are allocated, in place; returns each provisional id's final id."""
    fresh = real & (rows["op"] == ALLOC)
    provisional = rows["buffer"][fresh] - next_id
    final = np.empty(len(provisional), dtype=np.int64)
    final[provisional] = next_id + np.arange(len(provisional))
    renumber = real & (rows["buffer"] >= next_id)
    rows["buffer"][renumber] = final[rows["buffer"][renumber] - next_id]
    return final


def _limit_met(eng, rows, row_k, delta, running, links: _Links, exact_sizes: bool) -> NoPlan | None:
    """Where the run meets a memory limit: the device's memory, or the headroom limit (whose rule
    the planned sizes must follow), as a :class:`NoPlan`; None if it meets none."""
    policy, scenario = eng.policy, eng.scenario
    over = over_device(running, scenario)
    if len(over):
        return NoPlan(int(row_k[over[0]]))
    if not policy.headroom_limit or not len(links.unit):
        return None
    K = eng.layout.unit_slots.shape[1]
    # The limit looks at what is allocated just before an event's first alloc
    # row plus all the event's bytes (its K alloc rows are consecutive).
    is_table = np.isin(rows["tensor"], (TENSOR_CODE["k_beam"], TENSOR_CODE["v_beam"])) & policy.kernel_beam_tables
    unit_allocs = np.flatnonzero((rows["op"] == ALLOC) & (rows["layer"] >= 0) & ~is_table)
    before = running[unit_allocs[::K]] - delta[unit_allocs[::K]]
    event_bytes = np.add.reduceat(rows["bytes"][unit_allocs], np.arange(0, len(unit_allocs), K))
    if policy.headroom_buffer == "data":  # the data buffer alone: each event's first alloc row
        event_bytes = rows["bytes"][unit_allocs[::K]]
    meets = before + event_bytes + scenario.weights_memory >= policy.headroom_limit * scenario.device_memory
    # Policy sizes hold while no event meets the limit. Exact sizes hold for an event that
    # meets it at its exact size (then also at the policy's, which is no smaller), or
    # whose policy size is the exact one anyway (events are in the order of unit and k).
    if exact_sizes:
        needed = eng.stored + links.k
        meets |= np.asarray(policy.capacity(needed, eng.layout.unit_prim[links.unit]), dtype=np.int64) == needed
    wrong = np.flatnonzero(~meets if exact_sizes else meets)
    if len(wrong):
        return NoPlan(int(row_k[unit_allocs[::K][wrong[0]]]), not exact_sizes)
    return None


def _step_rows(eng, first_step: int, n: int, links: _Links, row_k, running, resident, view: ViewPlan,
               tables: TablePlan) -> np.ndarray:
    """The run's step rows: each step's memory at its end and its peaks, from the running sums
    along the stream; ``steady`` grows with each reallocation, past-block and beam-table growth."""
    L0, B = eng.stored, eng.batch
    steps_k = np.arange(1, n + 1, dtype=np.int64)
    starts = np.searchsorted(row_k, steps_k)
    ends = np.r_[starts[1:], len(row_k)] - 1
    end_alloc, end_res = running[ends], resident[ends]
    prev_alloc = np.r_[eng.allocated, end_alloc[:-1]]
    prev_res = np.r_[eng.resident if eng.first_touch else eng.allocated, end_res[:-1]]
    steady_change = np.zeros(n + 1, dtype=np.int64)
    np.add.at(steady_change, links.k, (links.new_cap * B - links.old_rows) * eng.unit_row[links.unit])
    np.add.at(steady_change, view.k[view.rows["op"] == ALLOC], view.growth)
    np.add.at(steady_change, tables.k[tables.rows["op"] == ALLOC], tables.growth)

    steps = np.zeros(n, dtype=STEP)
    steps["step"] = first_step + steps_k - 1
    steps["phase"] = PHASE_CODE["decode"]
    steps["tokens"] = L0 + steps_k
    steps["batch"] = B
    steps["allocated"] = end_alloc
    steps["peak"] = np.maximum(np.maximum.reduceat(running, starts), prev_alloc)
    steps["steady"] = eng.steady() + np.cumsum(steady_change[1:])
    steps["used"] = (L0 + steps_k) * B * eng.row_total
    steps["resident"] = end_res
    steps["resident_peak"] = np.maximum(np.maximum.reduceat(resident, starts), prev_res)
    return steps

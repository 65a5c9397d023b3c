"""OpenVINO GenAI's continuous-batching scheduler over a paged pool (one ``schedule()`` per step).

Rules read in openvinotoolkit/openvino.genai ``src/cpp/src/continuous_batching/scheduler.hpp``
(``Scheduler::schedule``, ``_schedule_generate_phase_dynamic_split_fuse``,
``_schedule_prompt_phase_dynamic_split_fuse``, ``_schedule_prompt_phase_vllm``,
``_apply_preemption``, ``_get_low_priority_sequence_group_id``, ``_preempt_by_recompute``,
``_initialize_cache``, ``_reserve_dynamic_capacity_for_active_sequences``, ``_try_increase_cache``),
``block_manager.hpp`` (``required_blocks_count``, ``append_slots``, ``available_token_slots``,
``free_group_partially``, ``_blocks_released_to_tokens``, ``get_full_prefix_restore_plan``,
``get_processed_tokens_after_restore``) and ``sequence_group.hpp`` (``can_generate_tokens``,
``get_num_available_tokens_for_batching``, ``requires_sampling``, ``finish_iteration``):

* ``dynamic_split_fuse`` (default): groups that can generate are scheduled first, in
  request order, ``min(budget / sequences, available)`` tokens per sequence; if their
  blocks do not fit, the pool grows (dynamic pool) or the *last* group holding
  processed tokens is preempted by recompute — partially (its tail blocks, as many
  as the target needs, rewinding to a block boundary) when it holds more blocks than
  the target needs, else fully — until it fits or the victim would be the target
  itself or an earlier group. Then prompt chunks, in request order, within
  ``max_num_batched_tokens`` and the free token slots.
* vLLM mode (``dynamic_split_fuse=False``): whole prompts while fewer than
  ``max_num_seqs`` groups can generate and they fit; the generate phase only in
  steps that scheduled no prompt.
* A group generates a token when its context passes everything it had ever processed
  (``requires_sampling``); after a preemption it recomputes up to there first.
* Dynamic pool (``num_kv_blocks = cache_size = 0``): first sized for every request
  present, ``ceil(min(2P, P + max_new) / block)`` blocks per sequence; raised to that
  sum over active requests whenever one is in its prompt phase (neither with a memory
  check, on any device); grown by 256 tokens' worth of blocks whenever a sequence needs
  a block — on a CPU device unconditionally, on a GPU device only as far as
  ``total - 1.1 x used`` allows (:func:`gpu_available`), else preemption or waiting.
  The tensors are reallocated (and copied) once per step, after scheduling
  (``allocate_cache_if_needed``); one that does not fit the device is out of memory.
* A step that schedules nothing: every request is marked IGNORED
  (``pipeline_impl.cpp``, ``ContinuousBatchingImpl::step``).
* Cache eviction (``SchedulerConfig.cache_eviction``, :mod:`.eviction`): after the forward a sequence past its
  prompt drops whole blocks (:meth:`ContinuousScheduler.evict`); its blocks are then its context's less the
  tokens evicted (``BlockManager::get_num_logical_blocks``), and a victim that had evicted is preempted whole and
  recomputed from its first token (``_preempt_by_recompute``: ``was_evicted_from``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from simkv.serving.kv.block_pool import BlockPool, prefix_hash, token_hashes
from simkv.serving.sched.eviction import after_forward
from simkv.serving.sched.group import IGNORED, REJECTED, RUNNING, Group

if TYPE_CHECKING:
    from simkv.serving.sched.config import SchedulerConfig

GROWTH_TOKENS = 256  # Scheduler::m_cache_growth_num_tokens
INITIAL_MULTIPLIER = 2  # Scheduler::m_kv_blocks_initial_multiplier



class GpuCheck(NamedTuple):
    """What GenAI's GPU path reads to decide a growth (``utils::get_available_gpu_memory``): the device's total
    memory (``device_total_mem_size``), the weights' bytes (besides the pools, what ``memory_statistics`` counts as
    used; simkv models no other device allocation), the largest single allocation (``device_max_alloc_mem_size``)
    and the pools' tensors (``num_cache_tensors``)."""

    total: int
    weights: int
    max_alloc: int
    tensors: int


def gpu_available(gpu: GpuCheck, used: int) -> int:
    """``utils::get_available_gpu_memory`` (openvino.genai ``src/cpp/src/utils.cpp:1070-1104``) with ``used`` bytes
    allocated: ``used *= 1.1f`` (a size_t times a float: a float product, truncated, :1090-1091), then
    ``min(total - used, max_alloc * num_cache_tensors)`` (:1103) in unsigned 64-bit arithmetic — so once
    1.1 × used exceeds the total the difference wraps around and only the allocation limit is left."""
    used11 = int(np.float32(used) * np.float32(1.1))
    return min((gpu.total - used11) % (1 << 64), gpu.max_alloc * gpu.tensors)


class ContinuousScheduler:
    def __init__(self, config: SchedulerConfig, pool: BlockPool, *, dynamic: bool, max_blocks: int, kv=None,
                 state_pool: BlockPool | None = None, budget: int = 0, gpu: GpuCheck | None = None) -> None:
        """``kv``: the paged layout (:class:`simkv.serving.kv.groups.PagedKV`; None: one full group of
        ``config.block_size``). ``state_pool``: GenAI's linear-attention pool; ``budget``, ``max_blocks``: the device's
        bytes for both pools, and in KV blocks (a dynamic pool is not capped by them: it is out of memory where it
        is allocated, docs/DESIGN.md §7); ``gpu``: GenAI's GPU growth check (None: the CPU path, no check)."""
        self.cfg = config
        self.pool = pool
        self.bs = config.block_size if kv is None else kv.block_size
        self.dynamic = dynamic
        self.initialized = not dynamic
        self.max_blocks = max_blocks  # the device's byte budget, in blocks
        self.copies = 0  # copy-on-write block copies this step
        self.pool_limited = False  # the pool could not grow when asked to this step
        # the layout's groups beyond one plain full table (simkv.serving.kv.groups)
        self.kv = kv
        self.group0 = None if kv is None else kv.groups[0]
        self.side = () if kv is None else kv.side
        self.windowed0 = self.group0 is not None and self.group0.kind in ("sliding", "chunked")
        self.windowed = self.windowed0 or any(grp.kind in ("sliding", "chunked") for grp in self.side)
        #: One plain full table per sequence: the scheduler's own rules and nothing else.
        self.simple = not self.side and not self.windowed0
        #: vLLM frees a request's blocks tail first (``SingleTypeKVCacheManager.free``), and a window's leading
        #: blocks last index first (``remove_skipped_blocks``); GenAI first to last.
        self.reverse_free = kv is not None and kv.manager == "vllm"
        self.state_pool = state_pool
        self.pools = (pool, state_pool)
        self.block_bytes = 0 if kv is None else kv.block_bytes
        self.state_bytes = 0 if kv is None else kv.state_bytes
        self.budget = budget
        #: GenAI's linear-attention pool without prefix caching: one block per sequence, sized by sequences.
        self.state_fixed = any(grp.kind == "state" and grp.pool == 1 for grp in self.side)
        self.state_copies = 0  # copy-on-write copies in the state pool this step
        #: GenAI's GPU path (:class:`GpuCheck`), or None: the CPU path, where growth is never checked.
        self.gpu = gpu
        self.weights_bytes = 0 if gpu is None else gpu.weights
        self.held_bytes = 0
        #: GenAI's cache eviction (simkv.serving.sched.eviction.CacheEviction), or None; the blocks dropped so far.
        self.eviction = config.cache_eviction
        self.evicted_blocks = 0

    # -- blocks of a group ------------------------------------------------------------------

    def _need(self, g: Group, tokens: int) -> int:
        """Blocks a sequence holding ``processed`` + ``tokens`` tokens, less those evicted, must have
        (``get_num_logical_blocks``)."""
        return -(-(g.processed + tokens - g.evicted) // self.bs)

    def required_blocks(self, g: Group) -> int:
        """``BlockManager::required_blocks_count`` for the scheduled tokens."""
        return _required(g.tables, self._need(g, g.scheduled), self.pool.ref)

    def can_append(self, g: Group) -> bool:
        if self.simple:
            return self.required_blocks(g) <= self.pool.num_free()
        kv, state = self.required(g)
        return kv <= self.pool.num_free() and (not state or state <= self.state_pool.num_free())

    def required(self, g: Group) -> tuple[int, int]:
        """Blocks the scheduled tokens need in the KV pool and in the state pool, every group
        (``required_blocks_count`` of each block manager: a shared last block is copied)."""
        counts = [self.required_blocks(g), 0]
        if self.side:
            content = g.processed + g.scheduled
            for grp, tables in zip(self.side, g.side or ()):
                counts[grp.pool] += _required(tables, grp.needed(content), self.pools[grp.pool].ref)
        return counts[0], counts[1]

    def _new_blocks(self, g: Group, tokens: int) -> tuple[int, int]:
        """Blocks a one-sequence group needs in each pool to hold ``tokens`` more (a prompt chunk: no copy)."""
        if tokens <= 0:
            return 0, 0
        content = g.processed + tokens
        counts = [max(0, self._need(g, tokens) - len(g.tables[0])), 0]
        for grp, tables in zip(self.side, g.side or ()):
            counts[grp.pool] += max(0, grp.needed(content) - len(tables[0]))
        return counts[0], counts[1]

    def _slots(self, g: Group, want: int) -> int:
        """The most of ``want`` tokens whose blocks fit the free blocks (``available_token_slots``, the minimum
        over the pools), for a one-sequence group."""
        free0 = self.pool.num_free()
        if self.simple:  # one table of the KV pool: the room in its blocks and in the free ones, in closed form
            return min(want, (len(g.tables[0]) + free0) * self.bs - g.processed + g.evicted)
        free1 = self.state_pool.num_free() if self.state_pool is not None else 0

        def fits(t):
            a, b = self._new_blocks(g, t)
            return a <= free0 and b <= free1

        if fits(want):
            return want
        if not fits(1):  # (a full pool: the common case)
            return 0
        lo, hi = 1, want  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def _hash(self, g: Group, seq: int, length: int):
        toks = g.seq_tokens[seq]
        full = g.full_hashes[seq]
        while len(full) * self.bs + self.bs <= len(toks):
            s = len(full) * self.bs
            full.append(hash((full[-1] if full else None, tuple(toks[s : s + self.bs]))))
        return prefix_hash(toks, length, self.bs, full)

    def append_slots(self, g: Group, copy_on_write: bool = True) -> None:
        """Give every running sequence blocks for its scheduled tokens; copy a shared last block
        (``BlockManager::append_slots``). A prompt chunk under dynamic split-fuse only adds blocks
        (``allocate_tokens`` → ``allocate``): no copy-on-write.

        Prefix hashes as ``BlockManager::allocate`` gives them: a new block is hashed by the content it
        will hold once the known tokens (prompt + generated so far) are processed — its full length,
        or up to the last known token — not by the chunk computed in this step; before adding blocks the
        last block is re-hashed as a full block. In the generate phase a block that is not copied is
        re-hashed by the context after the step (the non-copy-on-write branch of ``append_slots``); a
        prompt chunk that needs no new block leaves the hashes alone (``allocate_tokens``)."""
        pool, need = self.pool, self._need(g, g.scheduled)
        prefix = pool.prefix_caching
        content = g.processed + g.scheduled
        known = g.P + g.generated
        bs = self.bs
        for s, table in enumerate(g.tables):
            if need > len(table):
                if prefix and table and table[-1] is not None:
                    pool.rehash(table[-1], self._hash(g, s, min(len(table) * bs, len(g.seq_tokens[s]))))
                for k in range(len(table), need):
                    h = self._hash(g, s, min((k + 1) * bs, known)) if prefix else None
                    table.append(pool.allocate(h))
            elif table and copy_on_write and table[-1] is not None:  # (a prompt chunk needing no block: nothing)
                last = table[-1]
                if pool.ref[last] > 1:
                    h = self._hash(g, s, content) if prefix else None
                    table[-1] = pool.allocate(h)
                    pool.release(last)
                    self.copies += 1
                elif prefix:
                    pool.rehash(last, self._hash(g, s, content))
        if self.side:
            self._append_side(g, content, copy_on_write)

    def _append_side(self, g: Group, content: int, copy_on_write: bool) -> None:
        """The side groups' blocks for ``content`` tokens (no prefix hashes: prefix caching keeps to one
        group), group by group; a shared last block is copied before a sequence writes into it."""
        for grp, tables in zip(self.side, g.side or ()):
            pool = self.pools[grp.pool]
            need = grp.needed(content)
            for table in tables:
                if need > len(table):
                    table.extend(pool.allocate_many(need - len(table)))
                elif table and copy_on_write and table[-1] is not None and pool.ref[table[-1]] > 1:
                    last = table[-1]
                    table[-1] = pool.allocate(None)
                    pool.release(last)
                    if grp.pool:
                        self.state_copies += 1
                    else:
                        self.copies += 1

    def free_group(self, g: Group) -> None:
        """``BlockManager::free_sequence``: each sequence's blocks, first to last (vLLM's manager: last to
        first, group by group)."""
        if self.reverse_free:
            self._free_reversed(g)
            return
        for table in g.tables:
            self.pool.release_many(table if not g.dropped else table[g.dropped:])
            table.clear()
        g.dropped = 0
        if g.side:
            for grp, tables in zip(self.side, g.side or ()):
                for table in tables:
                    self.pools[grp.pool].release_many(table)
                    table.clear()
        if len(g.tables) > 1 and not g.can_generate():
            g.tables = [[]]
            if g.side:
                g.side = [[[]] for _ in self.side]

    def _free_reversed(self, g: Group) -> None:
        for s, table in enumerate(g.tables):
            self.pool.release_many(table[::-1])
            table.clear()
            if g.side:
                for grp, tables in zip(self.side, g.side or ()):
                    self.pools[grp.pool].release_many(tables[s][::-1])
                    tables[s].clear()
        g.dropped = 0
        if len(g.tables) > 1 and not g.can_generate():
            g.tables = [[]]
            if g.side:
                g.side = [[[]] for _ in self.side]

    def drop_skipped(self, g: Group, computed: int | None = None) -> None:
        """Free the leading blocks no window needs any more, now that ``computed`` (default ``g.processed``)
        tokens are computed (vLLM's ``remove_skipped_blocks``: a null placeholder stays in the table)."""
        computed = g.processed if computed is None else computed
        if self.windowed0:
            drop = self.group0.skipped(computed)
            if drop > g.dropped:
                for table in g.tables:
                    _drop(table, drop, self.pool)
                g.dropped = drop
        for grp, tables in zip(self.side, g.side or ()):
            if grp.kind in ("sliding", "chunked"):
                drop = grp.skipped(computed)
                pool = self.pools[grp.pool]
                for table in tables:
                    _drop(table, drop, pool)

    def add_group(self, g: Group, tokens=None) -> None:
        """A request arrives (``add_request``): empty side tables, and with prefix caching (``tokens``: its prompt's
        ids) its hashes and the blocks restored from the cache. (The engine's interface: :class:`..vllm.EngineVllm`
        answers the same.)"""
        self.init_side(g)
        if tokens is not None:
            prepare_tokens(g, tokens, self.bs)
            self.restore(g)

    def update(self, scheduled: list[Group], finished: list[Group]) -> None:
        """After sampling: vLLM's manager (``kv_manager="vllm"``) frees the blocks that left a window of each request
        still running; the finished are freed by the engine (:meth:`free_group`)."""
        if self.windowed:
            for g in scheduled:
                if g.status == RUNNING:
                    self.drop_skipped(g)

    def init_side(self, g: Group) -> None:
        """Empty side tables for a new group (one sequence)."""
        if self.side:
            g.side = [[[]] for _ in self.side]

    # -- restore (add_request with prefix caching) --------------------------------------------

    def restore(self, g: Group) -> None:
        """``get_full_prefix_restore_plan`` + ``restore_cached_blocks``: full blocks while cached,
        then the shortest cached partial tail of the first missing one; a fully restored
        prompt recomputes its last token."""
        if not self.pool.prefix_caching or self.side:
            return  # (a hybrid model's prompts are computed whole: simkv.serving.kv.groups)
        plan, content = [], 0
        while content < g.P:
            prev, nxt = content, min(content + self.bs, g.P)
            h = self._hash(g, 0, nxt)
            if self.pool.has(h):
                plan.append(h)
                content = nxt
                continue
            for i in range(1, self.bs):
                if prev + i >= nxt:
                    break
                h = self._hash(g, 0, prev + i)
                if self.pool.has(h):
                    plan.append(h)
                    content = prev + i
                    break
            break
        if not plan:
            return
        for h in plan:
            g.tables[0].append(self.pool.restore(h))
        g.prefix_hit = content
        g.processed = content - 1 if content == g.P else content

    # -- the dynamic pool ----------------------------------------------------------------------

    def _target_blocks(self, groups) -> int:
        if self.simple:
            return sum(self.target_of(g) for g in groups)
        return self._targets(groups)[0]

    def target_of(self, g: Group) -> int:
        """One group's part of :meth:`_target_blocks` with one plain table: min(2P, P + max_new) tokens' blocks per
        sequence."""
        return -(-min(g.P * INITIAL_MULTIPLIER, g.P + g.G) // self.bs) * g.n

    def _targets(self, groups) -> tuple[int, int]:
        """``ensure_sequence_token_capacity`` of every group of each pool: blocks for min(2P, P + max_new) tokens
        per sequence (a state group of the KV pool: its one block; GenAI's fixed state pool: none). A window's
        group counts what it can hold at most: vLLM's ``max_memory_usage_bytes`` of a sliding window,
        ``cdiv(min(W - 1 + max_num_batched_tokens, n), block) + 1``, of a chunk ``cdiv(min(C +
        max_num_batched_tokens, n), block)``."""
        counts = [0, 0]
        batch = self.cfg.max_num_batched_tokens
        for g in groups:
            target = min(g.P * INITIAL_MULTIPLIER, g.P + g.G)
            for grp in (self.group0,) + self.side:
                if grp.pool == 1 and grp.kind == "state":
                    continue
                need = grp.needed(target)
                if grp.kind == "sliding":
                    need = min(need, grp.needed(min(grp.window - 1 + batch, target)) + 1)
                elif grp.kind == "chunked":
                    need = min(need, grp.needed(min(grp.window + batch, target)))
                counts[grp.pool] += need * g.n
        return counts[0], counts[1]

    def _ensure(self, blocks: int) -> None:
        """``ensure_sequence_token_capacity``: no memory check on any device (GenAI checks only
        ``_try_increase_cache``'s growth, and only on GPU); a pool that cannot be allocated is out of memory
        where the engine allocates it (:meth:`simkv.serving.engine.PagedServing._slow_step`)."""
        if blocks > self.pool.total:
            self.pool.grow(blocks)

    def _ensure_state(self, blocks: int) -> None:
        if blocks > self.state_pool.total:
            self.state_pool.grow(blocks)

    def _reserve(self, groups, first: bool) -> None:
        """Size the dynamic pools for ``groups``: at the first step (``_initialize_cache``, which also grows a
        fixed state pool by one block per sequence: ``grow_fixed_size_capacity``), or when a prompt arrives
        (``_reserve_dynamic_capacity_for_active_sequences``: variable-size pools only)."""
        if self.simple:
            self._ensure(self._target_blocks(groups))
            return
        kv, state = self._targets(groups)
        self._ensure(kv)
        if self.state_pool is not None:
            if self.state_fixed:
                if first:
                    self._ensure_state(self.state_pool.total + sum(g.n for g in groups))
            else:
                self._ensure_state(state)

    def _growth_cost(self, tokens: int) -> int:
        """``CacheOrchestrator::memory_cost_for_additional_tokens`` (cache_orchestrator.hpp:364-374): the new
        blocks' bytes of every variable-size pool."""
        cost = -(-tokens // self.bs) * self.block_bytes
        if self.state_pool is not None and not self.state_fixed:
            cost += -(-tokens // self.side[-1].block_size) * self.state_bytes
        return cost

    def _grow_tokens(self, tokens: int) -> None:
        """``grow_capacity_by_tokens``: every variable-size pool by ``tokens``' worth of its blocks."""
        self.pool.grow(self.pool.total + -(-tokens // self.bs))
        if self.state_pool is not None and not self.state_fixed:
            self.state_pool.grow(self.state_pool.total + -(-tokens // self.side[-1].block_size))

    def try_increase(self, g: Group | None = None) -> bool:
        """``_try_increase_cache`` (scheduler.hpp:754-788): a fixed state pool first grows by the blocks ``g``
        lacks (``ensure_sequence_capacity``, no check), then every variable-size pool by 256 tokens' worth of
        blocks: unconditionally on a CPU device (:769); on a GPU device (:772-786) by 256 tokens if their bytes fit
        :func:`gpu_available`, else by the most tokens that fit, else not at all (False, ``pool_limited``)."""
        if not self.dynamic:
            return False
        grew = False
        if self.state_fixed and g is not None:
            lack = self.required(g)[1] - self.state_pool.num_free()
            if lack > 0:
                self.state_pool.grow(self.state_pool.total + lack)
                grew = True
        tokens = GROWTH_TOKENS
        if self.gpu is not None:
            available = gpu_available(self.gpu, self.held_bytes)
            if self._growth_cost(tokens) > available:
                bpt = self.block_bytes // self.bs + (self.state_bytes // self.side[-1].block_size
                                                     if self.state_pool is not None and not self.state_fixed else 0)
                lo, hi = 0, available // bpt if bpt else 0  # max_additional_tokens_for_memory (:377-396)
                while lo < hi:
                    mid = lo + (hi - lo + 1) // 2
                    if self._growth_cost(mid) <= available:
                        lo = mid
                    else:
                        hi = mid - 1
                if lo == 0:
                    self.pool_limited = True
                    return grew
                tokens = lo
        self._grow_tokens(tokens)
        return True

    # -- cache eviction, after the forward -------------------------------------------------------------

    def evict(self, scheduled: list[Group]) -> tuple[str, str] | None:
        """GenAI's ``_maybe_evict_cache_blocks`` after the forward of a step (:func:`.eviction.after_forward` per
        scheduled group): each group's dropped blocks are freed now, before sampling. GenAI picks them by attention
        score, per layer; only their number is observable, so the blocks after ``start`` go (their ids decide
        nothing: every free list is first in, first out). Returns GenAI's check where ``step()`` throws, else None."""
        ev, bs = self.eviction, self.bs
        first = ev.start // bs
        release = self.pool.release
        for g in scheduled:
            drop, stop = after_forward(g, ev, bs)
            if stop is not None:
                return stop
            if drop:
                self.evicted_blocks += drop
                table = g.tables[0]
                for b in table[first : first + drop]:
                    release(b)
                del table[first : first + drop]
        return None

    # -- one schedule() --------------------------------------------------------------------------

    def schedule(self, groups: list[Group]) -> tuple[int, list[Group]]:
        """Schedule one step. Returns the tokens scheduled and the groups scheduled, in order."""
        self.copies = self.state_copies = 0
        self.pool_limited = False
        # the bytes GenAI's GPU check sees as used: what is physically allocated, i.e. the pools as the last
        # step's allocate_cache_if_needed left them (growth within this schedule() is logical until its end)
        self.held_bytes = self.weights_bytes + self.pool.total * self.block_bytes + (
            self.state_pool.total * self.state_bytes if self.state_pool is not None else 0)
        if not self.initialized:
            self._reserve(groups, True)
            self.initialized = True
        elif self.dynamic:
            active = [g for g in groups if not g.waiting]
            if any(not g.can_generate() for g in active):
                self._reserve(active, False)
        scheduled: list[Group] = []
        total = 0
        if self.cfg.dynamic_split_fuse:
            total = self._generate_phase(groups, scheduled, total)
            total = self._prompt_phase_dsf(groups, scheduled, total)
        else:
            total, is_prompt = self._prompt_phase_vllm(groups, scheduled, total)
            if not is_prompt:
                total = self._generate_phase(groups, scheduled, total)
        for g in groups:
            g.waiting = False
        return total, scheduled

    def _generate_phase(self, groups, scheduled, total) -> int:
        budget = self.cfg.max_num_batched_tokens
        for i, g in enumerate(groups):
            if g.status != RUNNING or not g.can_generate() or g.waiting:
                continue
            n = g.running_seqs()
            per_seq = (budget - total) // n
            if not per_seq:
                continue
            g.scheduled = min(per_seq, g.available())
            fits = self.can_append(g)  # (asked once per change: growth and preemption are what change it)
            while not fits:
                if not self.try_increase(g):
                    break
                fits = self.can_append(g)
            if not fits and self.cfg.on_oom == "preempt":
                self._apply_preemption(i, groups)
                fits = self.can_append(g)
            if not fits:
                g.scheduled = 0
                if self.cfg.on_oom == "reject":
                    self.free_group(g)
                    g.status = REJECTED
                continue
            self.append_slots(g)
            scheduled.append(g)
            total += g.scheduled * n
            if total == budget:
                break
        return total

    def _apply_preemption(self, i: int, groups) -> None:
        g = groups[i]
        while not self.can_append(g):
            j = next((k for k in range(len(groups) - 1, -1, -1)
                      if groups[k].status == RUNNING and groups[k].processed > 0), -1)
            if j <= i:
                break
            if not self._preempt(groups[j], g):
                break

    def _occupied(self, g: Group) -> int:
        return len({b for t in g.tables for b in t if b is not None})

    def _num_free(self) -> int:
        """``CacheOrchestrator::num_free_blocks``: the fewest free blocks of any pool."""
        if self.state_pool is None:
            return self.pool.num_free()
        return min(self.pool.num_free(), self.state_pool.num_free())

    def _preempt(self, victim: Group, target: Group) -> bool:
        before = self._num_free()
        needed = self.required_blocks(target)
        victim.preemptions += 1
        # Partial preemption rewinds to a block boundary: not with windows (the blocks it would need again are
        # gone) nor with states (``can_partially_preempt`` is false for a victim holding a linear-attention block),
        # nor after an eviction (``was_evicted_from``: the victim is recomputed whole, its evicted tokens again)
        if not self.simple or victim.evicted or not (needed == 0 or self._occupied(victim) > needed):
            self.free_group(victim)
            victim.processed = 0
            victim.evicted = 0
            victim.waiting = True
            return self._num_free() > before
        n = len(victim.tables)
        per_seq = -(-needed // n)
        for table in victim.tables:
            for _ in range(min(per_seq, len(table))):
                self.pool.release(table.pop())
        rem = victim.processed % self.bs or self.bs
        tokens = min(rem + (per_seq - 1) * self.bs, victim.processed) if per_seq else 0
        if not self.cfg.dynamic_split_fuse and victim.processed - tokens < victim.P:
            tokens = victim.processed
            self.free_group(victim)
        victim.processed -= tokens
        victim.waiting = True
        return self.pool.num_free() > before

    def _prompt_phase_dsf(self, groups, scheduled, total) -> int:
        budget = self.cfg.max_num_batched_tokens
        for g in groups:
            if g.status != RUNNING or g.can_generate() or g.waiting:
                continue
            tokens = min(budget - total, g.available())
            while self._slots(g, tokens) < tokens:
                if not self.try_increase(g):
                    break
            tokens = self._slots(g, tokens)
            if tokens > 0:
                g.scheduled = tokens
                self.append_slots(g, copy_on_write=False)
                scheduled.append(g)
                total += tokens
            if total == budget:
                break
        return total

    def _prompt_phase_vllm(self, groups, scheduled, total) -> tuple[int, bool]:
        budget = self.cfg.max_num_batched_tokens
        running = sum(1 for g in groups if g.status == RUNNING and g.can_generate())
        is_prompt = False
        for g in groups:
            if g.status != RUNNING or g.can_generate() or g.waiting:
                continue
            length = g.available()
            if length > budget:  # GenAI asserts here; the request can never be scheduled
                self.free_group(g)
                g.status = IGNORED
                continue
            if running >= self.cfg.max_num_seqs or budget - total < length:
                break
            # BlockManager::can_allocate_tokens: new blocks for the tokens beyond the free slots of the
            # last block (restored, possibly shared, blocks are not counted again)
            if not self.simple:  # can_allocate_tokens of every pool
                while self._slots(g, length) < length:
                    if not self.try_increase(g):
                        break
                if self._slots(g, length) < length:
                    break
            else:
                unused = (self.bs - g.processed % self.bs) % self.bs
                blocks = -(-max(0, length - unused) // self.bs)
                while blocks > self.pool.num_free():
                    if not self.try_increase():
                        break
                if blocks > self.pool.num_free():
                    break
                if blocks == 0 and self.pool.num_free() == 0 and any(
                        t and t[-1] is not None and self.pool.ref[t[-1]] > 1 for t in g.tables):
                    # The prompt fits in its restored last block, but that block is shared, so append_slots
                    # must copy it, and can_allocate_tokens does not count that block: GenAI would allocate
                    # from an empty pool (its pipeline crashed on such workloads, docs/DESIGN.md §4b). Wait.
                    break
            g.scheduled = length
            self.append_slots(g)
            scheduled.append(g)
            total += length
            is_prompt = True
            running += 1
        return total, is_prompt


def fork_samples(pool: BlockPool, g: Group, pools=()) -> None:
    """After the prompt, a group with n samples or beams runs n sequences sharing the prompt's blocks (every
    group's: ``pools`` are the side groups' pools, in their order)."""
    if g.n > 1 and len(g.tables) == 1:
        base = g.tables[0]
        for _ in range(g.n - 1):
            for b in base:
                if b is not None:
                    pool.share(b)
            g.tables.append(list(base))
        for side_pool, tables in zip(pools, g.side or ()):
            for _ in range(g.n - 1):
                for b in tables[0]:
                    if b is not None:
                        side_pool.share(b)
                tables.append(list(tables[0]))
        if g.seq_tokens is not None:
            g.seq_tokens = [list(g.seq_tokens[0]) for _ in range(g.n)]
            g.full_hashes = [list(g.full_hashes[0]) for _ in range(g.n)]


def _required(tables: list, need: int, ref: list) -> int:
    """``required_blocks_count`` of one group's tables (one per running sequence) for ``need`` blocks each."""
    count, seen = 0, set()
    for table in tables:
        if not table:
            count += need
            continue
        if len(table) > need:
            continue
        last = table[-1]
        extra = need - len(table)
        if last is None:
            count += extra
            continue
        if last in seen:
            continue
        seen.add(last)
        refs = ref[last]
        if refs > 1:
            count += refs - 1 if extra == 0 else extra * refs
        else:
            count += extra
    return count


def _drop(table: list, stop: int, pool: BlockPool) -> None:
    """Free the entries before ``stop`` that still hold a block, last index first, down to the first null
    placeholder (``remove_skipped_blocks``: the blocks before it were freed by earlier calls)."""
    for i in range(min(stop, len(table)) - 1, -1, -1):
        b = table[i]
        if b is None:
            break
        pool.release(b)
        table[i] = None


def prepare_tokens(g: Group, tokens: list, block_size: int) -> None:
    g.seq_tokens = [list(tokens)]
    g.full_hashes = [token_hashes(tokens, block_size)]

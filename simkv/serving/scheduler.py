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
  sum over active requests whenever one is in its prompt phase; grown by 256 tokens'
  worth of blocks whenever a sequence needs a block. The tensors are reallocated
  (and copied) once per step, after scheduling (``allocate_cache_if_needed``).
* A step that schedules nothing: every request is marked IGNORED
  (``pipeline_impl.cpp``, ``ContinuousBatchingImpl::step``).
"""

from __future__ import annotations

from dataclasses import dataclass

from simkv.serving.paged import BlockPool, prefix_hash, token_hashes

GROWTH_TOKENS = 256  # Scheduler::m_cache_growth_num_tokens
INITIAL_MULTIPLIER = 2  # Scheduler::m_kv_blocks_initial_multiplier

RUNNING, FINISHED, IGNORED, REJECTED = "RUNNING", "FINISHED", "IGNORED", "REJECTED"
#: Still running when the simulation stopped (a step limit, or requests that never finish).
UNFINISHED = "UNFINISHED"


#: The fields of GenAI's ``SchedulerConfig`` that simkv models, by GenAI's names and in this order
#: (``openvino_genai.SchedulerConfig``; ``src/cpp/include/openvino/genai/scheduler_config.hpp``).
GENAI_FIELDS = ("num_kv_blocks", "cache_size", "max_num_batched_tokens", "max_num_seqs", "dynamic_split_fuse",
                "enable_prefix_caching")


@dataclass
class SchedulerConfig:
    """OpenVINO GenAI's ``SchedulerConfig`` (its field names and defaults), and simkv's extensions.

    The one scheduler configuration of the paged serving model (``ServingSpec.paged``) and of
    ``simkv validate --paged``, which hands the GenAI fields to the real pipeline (:meth:`genai`).
    """

    #: simkv extension: tokens per block. GenAI takes the block size from the device plugin (32 on CPU,
    #: 16 on GPU), not from its SchedulerConfig.
    block_size: int = 32
    # GenAI's SchedulerConfig (GENAI_FIELDS): num_kv_blocks = cache_size = 0 is the dynamic pool.
    num_kv_blocks: int = 0
    #: Pool size in GiB. GenAI takes whole GB (an integer); the simulator also takes a fraction.
    cache_size: float = 0.0
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 256
    dynamic_split_fuse: bool = True
    enable_prefix_caching: bool = False
    #: simkv extension: what happens when a sequence needs a block and none is free: "preempt" (GenAI),
    #: "wait" (the sequence skips steps until blocks free up) or "reject" (it is dropped).
    on_oom: str = "preempt"
    #: simkv extension: the CPU plugin allocates and frees 2·L scratch buffers of the new pool tensors' sizes
    #: at every pool (re)allocation (measured by ``simkv validate --paged``): the in-step peak is twice the pool.
    transient_buffers: bool = True
    #: simkv extension: sliding-window models (``ModelSpec.sliding_window``) release blocks that left the window.
    window_blocks: bool = True

    @property
    def dynamic(self) -> bool:
        """No ``num_kv_blocks`` and no ``cache_size``: the pool is sized and grown by the scheduler."""
        return self.num_kv_blocks == 0 and self.cache_size == 0

    def genai(self) -> dict:
        """The GenAI fields, as ``openvino_genai.SchedulerConfig`` takes them (``cache_size`` an int)."""
        return {name: int(self.cache_size) if name == "cache_size" else getattr(self, name) for name in GENAI_FIELDS}

    def summary(self) -> dict:
        """The ``paged`` object of ``simkv run --json``: every field, the pool size under its older key,
        ``cache_size_gib``."""
        return {"cache_size_gib" if name == "cache_size" else name: value for name, value in vars(self).items()}


class Group:
    """A request in the pipeline (GenAI's ``SequenceGroup``): its sequences' block tables and counters."""

    __slots__ = ("req", "index", "P", "G", "n", "processed", "maxc", "generated", "scheduled", "waiting",
                 "tables", "status", "tokens", "full_hashes", "preemptions", "prefix_hit", "first_token_s",
                 "finish_s", "added_s", "added_step", "first_token_step", "finish_step", "seq_tokens", "dropped")

    def __init__(self, req, index: int, prompt_tokens: int) -> None:
        self.req = req
        self.index = index  # position in the request order
        self.P = prompt_tokens
        self.G = req.max_new_tokens
        self.n = req.sequences
        self.processed = 0
        self.maxc = 0
        self.generated = 0
        self.scheduled = 0
        self.waiting = False
        self.tables: list[list[int]] = [[]]  # one block table per running sequence
        self.status = RUNNING
        self.tokens = None  # prompt token ids (prefix caching only)
        self.seq_tokens = None  # per sequence: prompt + generated tokens (prefix caching only)
        self.full_hashes = None
        self.preemptions = 0
        self.prefix_hit = 0
        self.first_token_s = self.finish_s = None
        self.added_s = 0.0
        self.added_step = 0
        self.first_token_step = self.finish_step = None
        self.dropped = 0  # leading blocks released because they left a sliding window (None in the tables)

    # sequence_group.hpp
    def can_generate(self) -> bool:
        return self.maxc >= self.P

    def available(self) -> int:
        return max(max(self.P, self.maxc) - self.processed, 1)

    def running_seqs(self) -> int:
        return len(self.tables)


class ContinuousScheduler:
    def __init__(self, config: SchedulerConfig, pool: BlockPool, *, dynamic: bool, max_blocks: int) -> None:
        self.cfg = config
        self.pool = pool
        self.bs = config.block_size
        self.dynamic = dynamic
        self.initialized = not dynamic
        self.max_blocks = max_blocks  # the device's byte budget, in blocks
        self.copies = 0  # copy-on-write block copies this step
        self.pool_limited = False  # the pool could not grow when asked to this step

    # -- blocks of a group ------------------------------------------------------------------

    def _need(self, g: Group, tokens: int) -> int:
        """Blocks a sequence holding ``processed`` + ``tokens`` tokens must have."""
        return -(-(g.processed + tokens) // self.bs)

    def required_blocks(self, g: Group) -> int:
        """``BlockManager::required_blocks_count`` for the scheduled tokens."""
        need = self._need(g, g.scheduled)
        count, seen = 0, set()
        for table in g.tables:
            if not table:
                count += need
                continue
            if len(table) > need:
                continue
            last = table[-1]
            if last in seen:
                continue
            seen.add(last)
            extra = need - len(table)
            refs = self.pool.ref[last]
            if refs > 1:
                count += refs - 1 if extra == 0 else extra * refs
            else:
                count += extra
        return count

    def can_append(self, g: Group) -> bool:
        return self.required_blocks(g) <= self.pool.num_free()

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
            elif table and copy_on_write:  # (a prompt chunk that needs no new block changes nothing)
                last = table[-1]
                if pool.ref[last] > 1:
                    h = self._hash(g, s, content) if prefix else None
                    table[-1] = pool.allocate(h)
                    pool.release(last)
                    self.copies += 1
                elif prefix:
                    pool.rehash(last, self._hash(g, s, content))

    def free_group(self, g: Group) -> None:
        """``BlockManager::free_sequence``: each sequence's blocks, first to last."""
        for table in g.tables:
            self.pool.release_many(table if not g.dropped else table[g.dropped:])
            table.clear()
        g.dropped = 0
        if len(g.tables) > 1 and not g.can_generate():
            g.tables = [[]]

    # -- restore (add_request with prefix caching) --------------------------------------------

    def restore(self, g: Group) -> None:
        """``get_full_prefix_restore_plan`` + ``restore_cached_blocks``: full blocks while cached,
        then the shortest cached partial tail of the first missing one; a fully restored
        prompt recomputes its last token."""
        if not self.pool.prefix_caching:
            return
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
        return sum(-(-min(g.P * INITIAL_MULTIPLIER, g.P + g.G) // self.bs) * g.n for g in groups)

    def _ensure(self, blocks: int) -> None:
        if blocks > self.pool.total:
            self.pool.grow(min(blocks, self.max_blocks))
            if blocks > self.max_blocks:
                self.pool_limited = True

    def drop_outside_window(self, g: Group, window: int) -> None:
        """Release the leading blocks that hold no position of the last ``window`` ones (sliding-window
        attention never reads them again)."""
        drop = max(0, g.processed - window) // self.bs
        if drop <= g.dropped:
            return
        for table in g.tables:
            for i in range(g.dropped, min(drop, len(table))):
                if table[i] is not None:
                    self.pool.release(table[i])
                    table[i] = None
        g.dropped = drop

    def try_increase(self) -> bool:
        if not self.dynamic:
            return False
        new = self.pool.total + -(-GROWTH_TOKENS // self.bs)
        if new > self.max_blocks:
            self.pool_limited = True
            return False
        self.pool.grow(new)
        return True

    # -- one schedule() --------------------------------------------------------------------------

    def schedule(self, groups: list[Group]) -> tuple[int, list[Group]]:
        """Schedule one step. Returns the tokens scheduled and the groups scheduled, in order."""
        self.copies = 0
        self.pool_limited = False
        if not self.initialized:
            self._ensure(self._target_blocks(groups))
            self.initialized = True
        elif self.dynamic:
            active = [g for g in groups if not g.waiting]
            if any(not g.can_generate() for g in active):
                self._ensure(self._target_blocks(active))
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
            while not self.can_append(g):
                if not self.try_increase():
                    break
            if self.cfg.on_oom == "preempt":
                self._apply_preemption(i, groups)
            if not self.can_append(g):
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

    def _preempt(self, victim: Group, target: Group) -> bool:
        before = self.pool.num_free()
        needed = self.required_blocks(target)
        victim.preemptions += 1
        if not (needed == 0 or self._occupied(victim) > needed):
            self.free_group(victim)
            victim.processed = 0
            victim.waiting = True
            return self.pool.num_free() > before
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
            table = g.tables[0]
            while len(table) * self.bs - g.processed + self.pool.num_free() * self.bs < tokens:
                if not self.try_increase():
                    break
            tokens = min(tokens, len(table) * self.bs - g.processed + self.pool.num_free() * self.bs)
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


def fork_samples(pool: BlockPool, g: Group) -> None:
    """After the prompt, a group with n samples or beams runs n sequences sharing the prompt's blocks."""
    if g.n > 1 and len(g.tables) == 1:
        base = g.tables[0]
        for _ in range(g.n - 1):
            for b in base:
                if b is not None:
                    pool.share(b)
            g.tables.append(list(base))
        if g.seq_tokens is not None:
            g.seq_tokens = [list(g.seq_tokens[0]) for _ in range(g.n)]
            g.full_hashes = [list(g.full_hashes[0]) for _ in range(g.n)]


def prepare_tokens(g: Group, tokens: list, block_size: int) -> None:
    g.seq_tokens = [list(tokens)]
    g.full_hashes = [token_hashes(tokens, block_size)]

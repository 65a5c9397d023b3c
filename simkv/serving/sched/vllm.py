"""vLLM V1's scheduler (``--scheduler vllm``): ``Scheduler.schedule`` and ``update_from_output`` of
``vllm/v1/core/sched/scheduler.py`` (vLLM 0.33.0), over vLLM's block pool and per-group tables
(:mod:`simkv.serving.kv.vllm_pool`).

The rules, each read in vLLM's source and checked against the real scheduler (docs/research/vllm-scheduler.md):

* S1/S3: one token budget (``max_num_batched_tokens``) per step; a request gets ``num_tokens − num_computed``
  capped by ``long_prefill_token_threshold`` (only when more than one request is eligible), the budget, and
  ``max_model_len − num_computed − 1``. No prefill/decode phases: chunked prefill falls out of the budget.
* S2: running requests first, in ``self.running`` order; waiting requests only in a step that preempted none.
* S4: admission (``allocate_slots(..., full_sequence_must_fit=True)``, ``scheduler_reserve_full_isl``): the blocks
  of the whole known sequence must fit the free blocks (sliding/chunked groups capped); the waiting loop stops at
  the first request that does not fit, at ``max_num_seqs`` running, or when the budget is spent.
* S5: prefix lookup for a request with 0 computed tokens: whole cached blocks, at most ``num_tokens − 1`` tokens.
* S6/S7: a running request that gets no slots preempts the last running request (FCFS: ``running.pop()``) or the
  one with the largest ``(priority, arrival)`` (priority; its tokens this step go back to the budget), by
  recompute: all blocks freed, 0 computed tokens, back at the waiting queue's head (FCFS) or into the heap.
* S9: ``update_from_output``: a request past its known tokens samples one; it finishes at ``max_tokens`` outputs
  or ``max_model_len`` tokens, and its blocks are freed then, in scheduled order.
* K2: ``KVCacheManager.allocate_slots``: remove skipped blocks, count, touch the hit, allocate group by group,
  cache the blocks that became full.

* S5/K9: prefix caching beside sliding and chunked groups (``HybridKVCacheCoordinator.find_longest_cache_hit``):
  each spec's hit rule (:func:`~simkv.serving.kv.vllm_pool.find_longest_cache_hit`), full attention first, the
  others cut the candidate length until every spec accepts it (one pass for one full + one other spec); a sliding
  group caches only the blocks a later hit can reach (vLLM's default ``prefix_cache_retention_interval = 0``).

* K10: prefix caching beside Mamba groups (``mamba_cache_mode="align"``, set by vLLM whenever prefix caching is on
  for a Mamba hybrid): prefill chunks cut to end on block boundaries (:meth:`VllmScheduler._aligned_split`,
  ``Scheduler._mamba_block_aligned_split``), the Mamba tables' rules in :class:`~simkv.serving.kv.vllm_pool.GroupTables`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from math import lcm

from simkv.errors import ConfigError

from simkv.serving.kv.vllm_pool import NULL, GroupTables, VllmBlockPool, cdiv, find_longest_cache_hit

WAITING, RUNNING, PREEMPTED, FINISHED = "WAITING", "RUNNING", "PREEMPTED", "FINISHED"
#: Generated tokens' ids start here (as the real driver's: distinct per request, never a prompt's).
GENERATED_ID = 1_000_000


@dataclass(frozen=True)
class VllmSettings:
    """The scheduler and cache settings (vLLM's ``SchedulerConfig`` / ``CacheConfig`` names); also the real
    driver's (:mod:`simkv.validate.vllm.real`)."""

    num_blocks: int = 64  # the whole pool, null block 0 included
    block_size: int = 16
    max_num_batched_tokens: int = 64
    max_num_seqs: int = 8
    max_model_len: int = 4096
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    enable_prefix_caching: bool = False

    def check(self) -> None:
        if self.num_blocks < 2:
            raise ConfigError("num_blocks must be >= 2 (block 0 is vLLM's null block)")
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        if self.long_prefill_token_threshold < 0:
            raise ConfigError("long_prefill_token_threshold must be >= 0")
        if self.policy not in ("fcfs", "priority"):
            raise ConfigError(f"unknown vLLM scheduling policy {self.policy!r}; choose fcfs, priority")


@dataclass
class VRequest:
    """vLLM's ``Request`` as the scheduler reads it."""

    id: str
    index: int  # arrival order (arrival_time)
    tokens: list  # prompt + generated token ids, kept only with prefix caching (the block hashes read them)
    prompt: int
    max_tokens: int
    priority: int = 0
    computed: int = 0
    status: str = WAITING
    preemptions: int = 0
    hashes: list = field(default_factory=list)
    num_tokens: int = 0  # prompt + generated (``Request.num_tokens``)
    #: ``Request.shared_prefix_boundary``: set by each prefix lookup (:meth:`VllmScheduler._lookup`).
    junction: int = 0

    @property
    def outputs(self) -> int:
        return self.num_tokens - self.prompt

    def sample(self, n: int = 1) -> None:
        """``n`` generated tokens appended (their ids only where prefix caching hashes them)."""
        self.num_tokens += n
        if self.tokens is not None:
            self.tokens.extend([GENERATED_ID + self.index] * n)

    def __lt__(self, other: "VRequest") -> bool:  # Request.__lt__: (priority, arrival_time, request_id)
        return (self.priority, self.index, self.id) < (other.priority, other.index, other.id)


def group_specs(kv, max_model_len: int, prefix_caching: bool = False) -> list[tuple[str, int, int]]:
    """vLLM's groups (kind, block size, window) in vLLM's order from simkv's ``--kv-manager vllm`` layout
    (:func:`simkv.serving.kv.groups.paged_kv`): buckets of equal specs in order of first appearance, then the
    strided groups of each (``_get_kv_cache_groups_uniform_page_size``). A Mamba group's block is
    ``max_model_len`` without prefix caching (``mamba_cache_mode="none"``) and the attention block with it
    (``"align"``: ``MambaModelConfig.verify_and_update_config``, ``model_executor/models/config.py``, sets
    ``mamba_block_size = block_size``)."""
    groups = list(kv.groups)
    first = {}
    for g in groups:
        key = (g.kind, g.window, g.block_size)
        first[key] = min(first.get(key, min(g.layers)), min(g.layers))
    groups.sort(key=lambda g: (first[(g.kind, g.window, g.block_size)], min(g.layers)))
    attention = min((g.block_size for g in groups if g.kind != "state"), default=max_model_len)
    state_block = attention if prefix_caching else max_model_len
    return [("mamba" if g.kind == "state" else g.kind, state_block if g.kind == "state" else g.block_size,
             g.window) for g in groups]


class VllmScheduler:
    """``Scheduler`` + ``KVCacheManager`` over one pool. :meth:`add`, :meth:`schedule`, :meth:`update`."""

    def __init__(self, specs: list[tuple[str, int, int]], settings: VllmSettings) -> None:
        s = self.s = settings
        s.check()
        self.pool = VllmBlockPool(s.num_blocks, s.enable_prefix_caching)
        #: ``scheduler_block_size``: the LCM of the groups' block sizes (a hit's and the cached length's unit; one
        #: group's own block size where there is one, as ``UnitaryKVCacheCoordinator`` uses).
        self.scheduler_block = lcm(*(bs for _, bs, _ in specs))
        self.groups = [GroupTables(i, kind, bs, w, self.pool, max_in_flight=s.max_num_batched_tokens,
                                   max_model_len=s.max_model_len, alignment=self.scheduler_block)
                       for i, (kind, bs, w) in enumerate(specs)]
        #: ``HybridKVCacheCoordinator.verify_and_split_kv_cache_groups``: groups of one spec looked up together,
        #: full attention (MLA included) first, the rest in group order.
        batches: dict[tuple, list[GroupTables]] = {}
        for g in self.groups:
            batches.setdefault((g.kind, g.block_size, g.window), []).append(g)
        self.hit_batches = sorted(batches.values(), key=lambda b: b[0].kind not in ("full", "mla"))
        self.hash_block = min(bs for _, bs, _ in specs)
        #: ``Scheduler.need_mamba_block_aligned_split``: Mamba groups under prefix caching ("align").
        self.align_groups = [g for g in self.groups if g.align]
        self.aligned = bool(self.align_groups)
        #: Groups that never skip a block and share none (full attention or MLA, prefix caching off): their
        #: ``allocate_slots`` is the block count alone (:meth:`_allocate_plain`).
        self.plain = not s.enable_prefix_caching and all(kind in ("full", "mla") for kind, _, _ in specs)
        #: Groups the engine's planned runs cover (:mod:`simkv.serving.engine.vllm_run`): full attention and MLA,
        #: prefix caching on or off (nothing leaves a window; a run replays the caching through this pool).
        self.plannable = all(kind in ("full", "mla") for kind, _, _ in specs)
        #: The serving engine's fast path (set by it): arithmetic shortcuts where the rules reduce to them.
        self.lean = False
        self.running: list[VRequest] = []
        self.waiting: list[VRequest] = []  # FCFS: a list, head first; priority: a heap
        self.requests: dict[str, VRequest] = {}

    # -- queues (request_queue.py) -------------------------------------------------------------------

    def _push(self, r: VRequest, head: bool = False) -> None:
        if self.s.policy == "priority":
            heapq.heappush(self.waiting, r)
        elif head:
            self.waiting.insert(0, r)
        else:
            self.waiting.append(r)

    def _peek(self) -> VRequest:
        return self.waiting[0]

    def _pop(self) -> VRequest:
        return heapq.heappop(self.waiting) if self.s.policy == "priority" else self.waiting.pop(0)

    def waiting_order(self) -> list[VRequest]:
        return sorted(self.waiting) if self.s.policy == "priority" else list(self.waiting)

    # -- requests ----------------------------------------------------------------------------------

    def add(self, rid: str, index: int, prompt_ids, max_tokens: int, priority: int = 0) -> None:
        n = len(prompt_ids)
        # the token ids only where block hashes read them (without prefix caching a prompt is its length)
        ids = list(prompt_ids) if self.s.enable_prefix_caching else None
        r = VRequest(str(rid), index, ids, n, max_tokens, priority, num_tokens=n)
        self._rehash(r)
        self.requests[r.id] = r
        self._push(r)

    def _rehash(self, r: VRequest) -> None:
        """``Request.update_block_hashes``: one chained hash per full block of known tokens."""
        if not self.s.enable_prefix_caching:
            return
        bs = self.hash_block
        while (len(r.hashes) + 1) * bs <= r.num_tokens:
            i = len(r.hashes)
            parent = r.hashes[-1] if r.hashes else None
            r.hashes.append(hash((parent, tuple(r.tokens[i * bs:(i + 1) * bs]))))

    def unfinished(self) -> int:
        return len(self.running) + len(self.waiting)

    def block_ids(self, rid: str) -> list[list[int]]:
        return [list(g.tables.get(rid, ())) for g in self.groups]

    # -- the KV-cache manager (kv_cache_manager.py) ------------------------------------------------

    def _allocate(self, r: VRequest, n: int, hit=None, hit_tokens: int = 0, full: bool = False) -> bool:
        """``KVCacheManager.allocate_slots``: False where the blocks do not fit (vLLM returns None)."""
        if self.lean and self.plain:
            return self._allocate_plain(r, n, full)
        hit = hit or [[] for _ in self.groups]
        local = r.computed + hit_tokens
        total = min(local, self.s.max_model_len)
        free = self.pool.num_free()
        if full:  # full_sequence_must_fit (scheduler_reserve_full_isl)
            whole = min(r.num_tokens, self.s.max_model_len)
            need = sum(g.blocks_to_allocate(r.id, whole, h, total, cap=True) for g, h in zip(self.groups, hit))
            if need > free:
                return False
        slot = min(total + n, self.s.max_model_len)
        for g in self.groups:
            g.remove_skipped(r.id, total)
        need = sum(g.blocks_to_allocate(r.id, slot, h, local) for g, h in zip(self.groups, hit))
        if need > self.pool.num_free():
            return False
        if hit_tokens or (self.s.enable_prefix_caching and r.computed == 0):
            for g, h in zip(self.groups, hit):
                g.add_hit(r.id, h, local)
        for g in self.groups:
            g.allocate(r.id, slot)
        if self.s.enable_prefix_caching:
            upto = min(total + n, r.num_tokens)
            if len(self.groups) > 1:  # HybridKVCacheCoordinator.get_num_cacheable_tokens: a hit's unit at most
                upto -= upto % self.scheduler_block
            # kv_cache_coordinator.replay_boundaries (no EAGLE) and the junction of the last lookup
            boundaries = (r.prompt - 1, r.junction) if r.junction else (r.prompt - 1,)
            for g in self.groups:
                g.cache_blocks(r.id, r.hashes, upto, boundaries)
        return True

    def _allocate_plain(self, r: VRequest, n: int, full: bool) -> bool:
        """:meth:`_allocate` for :attr:`plain` groups: nothing is skipped (``get_num_skipped_tokens`` is 0), no hit
        and nothing cached, so ``get_num_blocks_to_allocate`` is each table's missing blocks and allocation takes
        them; a decode step inside its last block allocates nothing."""
        mml = self.s.max_model_len
        free = self.pool.num_free()
        if full:
            whole = min(r.num_tokens, mml)
            need = 0
            for g in self.groups:
                need += max(-(-whole // g.block_size) - len(g.tables.get(r.id, ())), 0)
            if need > free:
                return False
        slot = min(r.computed + n, mml)
        need = 0
        for g in self.groups:
            need += max(-(-slot // g.block_size) - len(g.tables.get(r.id, ())), 0)
        if need > free:
            return False
        if need:
            for g in self.groups:
                g.allocate(r.id, slot)
        return True

    def _free(self, r: VRequest) -> None:
        for g in self.groups:
            g.free(r.id)

    def _lookup(self, r: VRequest) -> tuple[list[list[int]], int]:
        """``KVCacheManager.get_computed_blocks``: the longest hit common to every group, at most ``num_tokens − 1``
        tokens (the last token is recomputed for its logits), and ``r.junction`` (``shared_prefix_boundary``).

        ``HybridKVCacheCoordinator.find_longest_cache_hit`` (``kv_cache_coordinator.py``): a fixed point over the
        spec batches (:attr:`hit_batches`, full attention first). Full attention is looked up once (its hit is
        downward closed: later passes only cut to it); every other spec is looked up again at the current candidate
        length, which its hit replaces. A pass that shortened the candidate starts another, except with exactly two
        batches, full attention first (one pass suffices). The full-attention hits are then cut to the final length.
        The junction is the longest single batch's hit where it exceeds the common one (a prefix a sparse group did
        not cache): that request caches its sliding blocks there too (:meth:`GroupTables.reachable_mask`)."""
        if not self.s.enable_prefix_caching:
            return [[] for _ in self.groups], 0
        batches = self.hit_batches
        if len(batches) == 1:  # UnitaryKVCacheCoordinator: the one spec's hit, no junction
            hit, n = find_longest_cache_hit(batches[0], r.hashes, r.num_tokens - 1)
            r.junction = 0
            return hit, n
        hits: list = [None] * len(self.groups)
        lengths = [0] * len(self.groups)
        hit_length = r.num_tokens - 1
        longest = 0
        simple = len(batches) == 2 and batches[0][0].kind in ("full", "mla")
        while True:
            curr = hit_length
            for batch in batches:
                first = batch[0]
                if first.kind in ("full", "mla") and hits[first.gid] is not None:
                    curr = min(curr, lengths[first.gid])
                    continue
                found, curr = find_longest_cache_hit(batch, r.hashes, curr)
                for g, h in zip(batch, found):
                    hits[g.gid], lengths[g.gid] = h, curr
                longest = max(longest, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        for batch in batches:
            if batch[0].kind in ("full", "mla"):
                for g in batch:
                    del hits[g.gid][cdiv(hit_length, g.block_size):]
        r.junction = longest if longest > hit_length else 0
        return [h if h is not None else [] for h in hits], hit_length

    def _preempt(self, r: VRequest) -> None:
        self._free(r)
        r.status, r.computed = PREEMPTED, 0
        r.preemptions += 1
        self._push(r, head=True)

    def _aligned_split(self, r: VRequest, n: int, hit_tokens: int = 0) -> int:
        """``Scheduler._mamba_block_aligned_split`` (vLLM 0.33.0; no EAGLE, no prefill checkpoint blocks, the hash
        block equal to the Mamba block, so no partial hit): a prefill chunk (one starting before
        ``max(prompt, num_tokens − 1)``) that does not reach that end is cut to end on a block boundary (unless
        it would shrink to nothing and a block exceeds the per-request chunk limit); then it stops at the first
        of these strictly inside it: the next boundary (a chunk starting mid-block), the last cacheable boundary
        ``(num_tokens − 1) // block × block`` and the block-floored shared-prefix junction. Mamba states are
        written at chunk ends, so chunk ends are where they can be cached."""
        bs = self.scheduler_block
        start = r.computed + hit_tokens
        prefill_end = max(r.prompt, r.num_tokens - 1)
        if start >= prefill_end:
            return n
        last_cache = (r.num_tokens - 1) // bs * bs  # get_mamba_prefill_checkpoint_position
        end = start + n
        if end < prefill_end:
            limit = self.s.max_num_batched_tokens
            if self.s.long_prefill_token_threshold > 0:
                limit = min(limit, self.s.long_prefill_token_threshold)
            aligned = end // bs * bs
            if aligned > start or bs <= limit:
                end = aligned
        junction = r.junction
        stops = ((start // bs + 1) * bs if start % bs else 0, last_cache,
                 start + (junction - start) // bs * bs if start < junction < end else 0)
        end = min((x for x in stops if start < x < end), default=end)
        return max(end - start, 0)

    # -- one step ------------------------------------------------------------------------------------

    def schedule(self) -> dict:
        """``Scheduler.schedule``: ``{"scheduled": {id: tokens}, "new", "resumed", "preempted", "hits"}``."""
        s = self.s
        for g in self.align_groups:  # KVCacheManager.new_step_starts
            g.new_step()
        budget = s.max_num_batched_tokens
        eligible = len(self.running) + len(self.waiting)
        threshold = s.long_prefill_token_threshold if eligible > 1 else 0
        scheduled: dict[str, int] = {}
        preempted: list[VRequest] = []
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = r.num_tokens - r.computed
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, s.max_model_len - r.computed - 1)
            if self.aligned:
                n = self._aligned_split(r, n)
            if n <= 0:
                i += 1
                continue
            ok = False
            while True:
                ok = self._allocate(r, n)
                if ok:
                    break
                if s.policy == "priority":
                    victim = max(self.running, key=lambda q: (q.priority, q.index))
                    at = self.running.index(victim)
                    del self.running[at]
                    if at < i:
                        i -= 1
                    if victim.id in scheduled:
                        budget += scheduled.pop(victim.id)
                else:
                    victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is r:
                    break
            if not ok:
                if s.policy == "priority" and r.status == PREEMPTED:
                    continue
                break
            scheduled[r.id] = n
            budget -= n
            i += 1
        new, resumed, hits = [], [], {}
        if not preempted:
            while budget > 0 and self.waiting and len(self.running) < s.max_num_seqs:
                r = self._peek()
                hit, hit_tokens = self._lookup(r) if r.computed == 0 else ([[] for _ in self.groups], 0)
                computed = r.computed + hit_tokens
                n = r.num_tokens - computed
                if 0 < threshold < n:
                    n = threshold
                n = min(n, budget)
                if self.aligned:
                    n = self._aligned_split(r, n, hit_tokens)
                    if n == 0:
                        break
                if not self._allocate(r, n, hit, hit_tokens, full=True):
                    break
                self._pop()
                (resumed if r.status == PREEMPTED else new).append(r.id)
                hits[r.id] = computed
                r.computed = computed
                r.status = RUNNING
                self.running.append(r)
                scheduled[r.id] = n
                budget -= n
        for rid, n in scheduled.items():  # _update_after_schedule
            self.requests[rid].computed += n
        return {"scheduled": scheduled, "new": new, "resumed": sorted(resumed),
                "preempted": sorted(q.id for q in preempted), "hits": hits}

    def update(self, scheduled: dict[str, int]) -> list[str]:
        """``update_from_output`` with one sampled token for each request past its known tokens; the finished."""
        finished = []
        for rid in scheduled:
            r = self.requests[rid]
            if r.computed < r.num_tokens:
                continue  # a partial prefill chunk samples nothing
            r.sample()
            self._rehash(r)
            if r.outputs >= r.max_tokens or r.num_tokens >= self.s.max_model_len:  # check_stop
                r.status = FINISHED
                self.running.remove(r)
                self._free(r)
                del self.requests[rid]
                finished.append(rid)
        return finished


def simulate_steps(specs, settings: VllmSettings, requests, token_ids, *, max_steps: int = 100_000,
                   check=None) -> list[dict]:
    """The workload step by step, recorded as the real driver records it (``simkv/validate/vllm/driver.py``):
    requests arriving at step ``k`` are added (file order) before ``schedule()``. ``check(scheduler)`` runs after
    ``schedule()`` and after ``update()`` (tests)."""
    sched = VllmScheduler(specs, settings)
    pending = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_step, i))
    order = {str(r.id): i for i, r in enumerate(requests)}
    steps, k, cursor = [], 0, 0
    while cursor < len(pending) or sched.unfinished():
        while cursor < len(pending) and requests[pending[cursor]].arrival_step <= k:
            i = pending[cursor]
            r = requests[i]
            sched.add(str(r.id), i, token_ids[i], r.max_new_tokens, int(getattr(r, "priority", 0) or 0))
            cursor += 1
        out = sched.schedule()
        record = {"step": k, "scheduled": dict(out["scheduled"]), "new": out["new"], "resumed": out["resumed"],
                  "preempted": out["preempted"], "hits": out["hits"],
                  "blocks": {r.id: sched.block_ids(r.id) for r in sched.running},
                  "free_after_schedule": sched.pool.num_free()}
        if check is not None:
            check(sched)
        fin = sched.update(out["scheduled"])
        if check is not None:
            check(sched)
        record["finished"] = sorted(fin, key=order.get)
        record["free"] = sched.pool.num_free()
        record["running"] = [r.id for r in sched.running]
        record["waiting"] = [r.id for r in sched.waiting_order()]
        steps.append(record)
        k += 1
        if not out["scheduled"] and not sched.running and cursor == len(pending) and sched.waiting:
            head = sched.waiting_order()[0].id
            raise ConfigError(f"stalled at step {k - 1}: request {head} can never be admitted (the pool is too small "
                              "for its whole prompt: scheduler_reserve_full_isl)")
        if k >= max_steps:
            raise ConfigError(f"no end after {max_steps} steps")
    return steps


class EngineVllm:
    """:class:`VllmScheduler` as the serving engine asks any scheduler (:class:`simkv.serving.engine.core.PagedServing`,
    the same questions it asks GenAI's :class:`~simkv.serving.sched.genai.ContinuousScheduler`):

    * :meth:`add_group` a request that arrived; :meth:`schedule` one step (sets each scheduled request's
      ``scheduled`` tokens; a preempted one's counters go back to 0, a prefix hit's ``processed`` to the hit);
    * :meth:`update` after the engine sampled (``update_from_output``: vLLM appends each sampled token and frees
      what finished; the engine's finished must be vLLM's); :meth:`free_group` (a request the engine drops);
    * metrics: :attr:`pool` (``total`` and ``used()`` blocks), :meth:`data_bytes`; ``copies`` / ``state_copies``
      (none: vLLM copies no block).

    The engine's :class:`~simkv.serving.sched.group.Group` keeps the counters the cost model and the request table
    read (``processed``, ``maxc``, ``generated``, times); vLLM's own :class:`VRequest` keeps its queues and tables.
    """

    #: No GenAI fast path reads this scheduler (the engine takes the reference path: core.takes_fast_paths).
    simple = False
    dynamic = False
    windowed = False
    copies = state_copies = 0

    def __init__(self, kv, settings: VllmSettings) -> None:
        specs = group_specs(kv, settings.max_model_len, settings.enable_prefix_caching)
        self.v = VllmScheduler(specs, settings)
        self.pool = self.v.pool
        self.pools = [self.pool]
        self.kv = kv
        # bytes of data in one block of each vLLM group (simkv's groups in vLLM's order, as group_specs gives it)
        by_spec: dict[tuple, list] = {}
        for g in sorted(kv.groups, key=lambda g: min(g.layers)):
            by_spec.setdefault(("mamba" if g.kind == "state" else g.kind, g.window), []).append(g)
        taken: dict[tuple, int] = {}
        self._real = []
        for kind, _, window in specs:
            k = taken.get((kind, window), 0)
            taken[(kind, window)] = k + 1
            self._real.append(by_spec[(kind, window)][k].real_bytes)
        self.by_id: dict[str, object] = {}
        self._last: dict[str, int] = {}  # the last step's scheduled tokens, for update()
        #: Steps the engine's next planned run is planned for (None: the longest; engine/vllm_run.py adapts it).
        self.run_horizon: int | None = None

    @property
    def lean(self) -> bool:
        """The engine's fast path: arithmetic shortcuts (:attr:`VllmScheduler.lean`, :meth:`data_bytes`)."""
        return self.v.lean

    @lean.setter
    def lean(self, on: bool) -> None:
        self.v.lean = on

    def init_side(self, g) -> None:  # the engine's fast paths' hook (never called: no fast path here)
        raise AssertionError("no fast path runs under --scheduler vllm")

    def add_group(self, g, tokens=None) -> None:
        """A request arrives (``Scheduler.add_request``): prompt token ids are the trace's (prefix caching) or ids
        unique to the request (never a hit)."""
        if g.n != 1:
            raise ConfigError("--scheduler vllm: parallel samples (n > 1) and beams are not modelled")
        rid = str(g.index)
        ids = tokens if tokens is not None else range(g.P)
        self.v.add(rid, g.index, ids, g.G, int(getattr(g.req, "priority", 0) or 0))
        self.by_id[rid] = g

    def schedule(self, live) -> tuple[int, list]:
        out = self.v.schedule()
        for rid in out["preempted"]:
            g = self.by_id[rid]
            g.processed = 0  # recompute: vLLM's num_computed_tokens = 0
            g.preemptions += 1
        for rid, hit in out["hits"].items():
            g = self.by_id[rid]
            g.processed = hit
            if hit and g.maxc == 0:
                g.prefix_hit = hit
        scheduled = []
        total = 0
        for rid, n in out["scheduled"].items():
            g = self.by_id[rid]
            g.scheduled = n
            total += n
            scheduled.append(g)
        scheduled.sort(key=lambda g: g.index)
        self._last = out["scheduled"]
        return total, scheduled

    def update(self, scheduled, finished) -> None:
        """``update_from_output``; vLLM frees the finished requests' blocks here, in scheduled order."""
        done = self.v.update(self._last)
        self._last = {}
        if sorted(done, key=int) != [str(g.index) for g in sorted(finished, key=lambda g: g.index)]:
            raise AssertionError(f"vLLM finished {done}, the engine {[g.index for g in finished]}")
        for rid in done:
            del self.by_id[rid]

    def free_group(self, g) -> None:
        """Drop a request vLLM still holds (the engine gave up on it: nothing could be scheduled)."""
        rid = str(g.index)
        r = self.v.requests.pop(rid, None)
        if r is None:
            return
        if r in self.v.running:
            self.v.running.remove(r)
        elif r in self.v.waiting:
            self.v.waiting.remove(r)
            if self.v.s.policy == "priority":
                heapq.heapify(self.v.waiting)
        self.v._free(r)
        self.by_id.pop(rid, None)

    def data_bytes(self, live) -> int:
        """Bytes of data the blocks in use hold: per group, each running request's non-null blocks less its last
        block's unfilled slots (a Mamba page whole), at the group's bytes per block; a prefix-shared block once.
        Per table in arithmetic (:meth:`GroupTables.data_blocks`) on the engine's fast path, block by block
        (:meth:`GroupTables.data_blocks_walk`) on its reference path."""
        by_id = self.by_id

        def ctx_of(rid):
            g = by_id.get(rid)
            return (g.processed + g.scheduled) if g is not None else 0

        if self.v.lean:
            return sum(gt.data_blocks(ctx_of, real) for gt, real in zip(self.v.groups, self._real))
        return sum(gt.data_blocks_walk(ctx_of, real) for gt, real in zip(self.v.groups, self._real))


#: ``max_model_len`` of the engine's vLLM scheduler: no length stop (simkv's run rejects prompts at or above the
#: model's context before the engine, ``--max-context``; a request ends at its ``max_new_tokens``).
UNBOUNDED_MODEL_LEN = 1 << 40
#: Bytes per activation element (bf16/f16) and per logit (the sampler's fp32 logits).
ACTIVATION_BYTES, LOGIT_BYTES = 2, 4


def profile_peak_bytes(model, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """The activation peak of vLLM's profile run, as simkv models it (a profile run's peak is measured by the
    real vLLM, not computable from the config: this is the model). ``Worker.determine_available_memory``
    (``vllm/v1/worker/gpu_worker.py``) runs ``profile_run``: a dummy forward of ``max_num_batched_tokens`` tokens,
    then the sampler on ``max_num_seqs`` rows of logits. simkv takes the peak as the larger of

    * the forward's live tensors inside one layer, per token: the residual stream and the normed input
      (``2 × hidden``), the fused QKV output (``(heads + 2 × kv_heads) × head_dim``) and the MLP's gate and up
      outputs (``2 × intermediate``; an MoE layer's ``experts_per_token`` experts), at 2 B per element;
    * the sampler's ``max_num_seqs × vocab`` fp32 logits.

    Left out: CUDA-graph memory (not applied unless ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``), the allocator's
    fragmentation and non-torch memory (NCCL, the CUDA context) that ``memory_profiling`` also counts."""
    inter = model.intermediate or model.expert_intermediate * max(model.experts_per_token, 1)
    per_token = 2 * model.hidden + (model.heads + 2 * model.kv_heads) * model.head_dim + 2 * inter
    return max(max_num_batched_tokens * per_token * ACTIVATION_BYTES, max_num_seqs * model.vocab * LOGIT_BYTES)


def num_gpu_blocks(block_bytes: int, device_memory: int, weights_bytes: int, activation_bytes: int,
                   gpu_memory_utilization: float) -> int:
    """vLLM's pool size: ``requested_memory = total × gpu_memory_utilization`` less the non-KV memory (weights and
    the profile run's peak, ``determine_available_memory``), divided by one block's bytes over every layer
    sharing it (``kv_cache_utils.get_num_blocks``: ``available // page_size // num_layers``, the page size unified
    across groups), the null block included."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError("--gpu-memory-utilization must be in (0, 1]")
    available = int(device_memory * gpu_memory_utilization) - weights_bytes - activation_bytes
    blocks = available // block_bytes if available > 0 else 0
    if blocks < 2:
        raise ConfigError(f"no KV cache fits: {gpu_memory_utilization} × {device_memory:,} B less {weights_bytes:,} B "
                          f"weights and {activation_bytes:,} B activations leaves {max(available, 0):,} B, under two "
                          f"{block_bytes:,}-byte blocks (vLLM: \"No available memory for the cache blocks\")")
    return blocks


def batch_defaults(device_name: str, device_memory: int) -> tuple[int, int]:
    """vLLM's ``max_num_batched_tokens`` and ``max_num_seqs`` when not given, for a server
    (``UsageContext.OPENAI_API_SERVER``; ``EngineArgs.get_batch_defaults``, ``vllm/engine/arg_utils.py``, vLLM 0.33.0):
    a device of ≥ 160 GiB 16384 / 1024; ≥ 70 GiB and not an A100 (H100, H200) 8192 / 1024; others 2048 / 256."""
    gib = 1024 ** 3
    if device_memory >= 160 * gib:
        return 16384, 1024
    if device_memory >= 70 * gib and "a100" not in device_name.lower():
        return 8192, 1024
    return 2048, 256

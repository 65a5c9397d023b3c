"""vLLM V1's block pool and per-group block tables (``vllm/v1/core/block_pool.py``, ``kv_cache_utils.py``
``FreeKVCacheBlockQueue``, ``single_type_kv_cache_manager.py``), as simkv's ``--scheduler vllm`` runs them.

Rules (docs/research/vllm-scheduler.md, K1–K5, K9, K10):

* K1: ``num_blocks`` blocks; block 0 is the null block (never free, never counted); the free queue starts as
  1, 2, …; ``get_new_blocks(n)`` pops the queue's head (``popleft_n``), evicting a cached block's hash as it goes.
* K3: ``BlockPool.free_blocks(ordered)``: ref counts drop; blocks reaching 0 without a hash (or any, caching off)
  are prepended to the queue's front in the given order (``prepend_n``), cached ones appended to its tail
  (``append_n``: LRU). A manager frees its table in reverse (``SingleTypeKVCacheManager.free``).
* K4/K5: ``remove_skipped_blocks`` replaces the blocks before ``get_num_skipped_tokens(n)`` by the null block,
  walking back from the last skipped one and stopping at a null block (``_remove_blocks_in_range``).
* K2/S4: ``get_num_blocks_to_allocate`` (base class), with the admission cap of sliding/chunked specs
  (``max_admission_blocks_per_request``, ``vllm/v1/kv_cache_interface.py``).
* K10: a Mamba group under prefix caching (``MambaManager`` in ``mamba_cache_mode="align"``): its hit rule, at most
  one new state block per allocation, retirement of the states behind, caching only the boundary states, and no
  hit on a state cached in the same step.
"""

from __future__ import annotations

from collections import OrderedDict

NULL = 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class FrontStack:
    """vLLM's free queue without prefix caching: blocks leave only at its front (``popleft_n``) and return only to it
    (``prepend_n``: nothing is cached, so nothing goes to the tail), so it is a stack — a list whose end is the
    queue's front, taken and given back a slice at a time at C speed. Iterates front first, as the queue does."""

    __slots__ = ("stack",)

    def __init__(self, ids) -> None:
        self.stack = list(ids)
        self.stack.reverse()

    def __len__(self) -> int:
        return len(self.stack)

    def __iter__(self):
        return reversed(self.stack)

    def __contains__(self, b) -> bool:
        return b in self.stack

    def popleft_n(self, n: int) -> list[int]:
        """The queue's first ``n`` blocks, front first, taken out."""
        st = self.stack
        cut = len(st) - n
        out = st[cut:]
        del st[cut:]
        out.reverse()
        return out

    def prepend_n(self, blocks: list) -> None:
        """``blocks`` at the queue's front in their order (``blocks[0]`` first)."""
        self.stack.extend(reversed(blocks))


class VllmBlockPool:
    """``BlockPool`` with its free queue of block ids (front = next handed out): an ordered dict with prefix caching
    (a prefix hit takes a block out of the queue's middle, ``touch``; cached blocks return to its tail), a
    :class:`FrontStack` without."""

    def __init__(self, num_blocks: int, prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.caching = prefix_caching
        self.free_queue = (OrderedDict.fromkeys(range(1, num_blocks)) if prefix_caching
                           else FrontStack(range(1, num_blocks)))
        self.ref = [0] * num_blocks
        self.hash_of: list = [None] * num_blocks
        #: (block hash, group id) -> the cached blocks with it, first cached first (``cached_block_hash_to_block``;
        #: a short list: two blocks share a hash only where two requests computed the same block at once).
        self.cached: dict[object, list[int]] = {}
        #: Block ids handed out so far are all below this (the engine's resident pool: ``BlockPool.touched``).
        self.touched = 0

    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def total(self) -> int:
        """Blocks the pool's tensors hold, the null block included (the serving engine's ledger)."""
        return self.num_blocks

    def used(self) -> int:
        """Blocks held by requests (the null block is never counted; cached free blocks are free)."""
        return self.num_blocks - 1 - len(self.free_queue)

    def get_new_blocks(self, n: int) -> list[int]:
        if n > len(self.free_queue):
            raise ValueError(f"cannot get {n} free blocks from the pool")
        if not self.caching:
            out = self.free_queue.popleft_n(n)
            ref = self.ref
            for b in out:
                ref[b] = 1
            if out:
                self.touched = max(self.touched, max(out) + 1)
            return out
        out = []
        popitem, ref, hash_of, cached = self.free_queue.popitem, self.ref, self.hash_of, self.cached
        for _ in range(n):
            b = popitem(last=False)[0]
            key = hash_of[b]
            if key is not None:  # evicted: its hash out of the cache (_maybe_evict_cached_block)
                hash_of[b] = None
                holders = cached[key]
                if len(holders) == 1:
                    del cached[key]
                else:
                    holders.remove(b)
            ref[b] = 1
            out.append(b)
        if out:
            self.touched = max(self.touched, max(out) + 1)
        return out

    def touch(self, blocks) -> int:
        """A prefix hit: each block's ref count + 1, out of the free queue if it was free (``BlockPool.touch``).
        Returns how many of them another table already held (now shared once more)."""
        shared = 0
        for b in blocks:
            if b == NULL:
                continue
            if self.ref[b] == 0:
                del self.free_queue[b]
            else:
                shared += 1
            self.ref[b] += 1
        return shared

    def free_blocks(self, ordered) -> int:
        """Returns how many of the blocks another table still holds (shared once less)."""
        if not self.caching:  # (every block is one table's: refs 1 -> 0, all to the front in the given order)
            first = [b for b in ordered if b != NULL]
            ref = self.ref
            for b in first:
                ref[b] -= 1
            self.free_queue.prepend_n(first)
            return 0
        first, last = [], []
        still_held = 0
        ref, hash_of, queue = self.ref, self.hash_of, self.free_queue
        for b in ordered:
            if b == NULL:
                continue
            ref[b] -= 1
            if ref[b] == 0:
                (first if hash_of[b] is None else last).append(b)
            else:
                still_held += 1
        for b in reversed(first):  # prepend_n: the list's order at the queue's front
            queue[b] = None
            queue.move_to_end(b, last=False)
        queue.update(dict.fromkeys(last))  # append_n: the cached ones at the tail, in order
        return still_held

    def cache(self, b: int, key) -> None:
        """``cache_full_blocks``: a block that became full gets its hash (block hash ‖ group id)."""
        if self.hash_of[b] is not None:
            return
        self.hash_of[b] = key
        holders = self.cached.get(key)
        if holders is None:
            self.cached[key] = [b]
        else:
            holders.append(b)

    def cached_block(self, key) -> int | None:
        holders = self.cached.get(key)
        return holders[0] if holders else None


class GroupTables:
    """One KV-cache group's manager: its spec (kind, block size, window) and each request's block table."""

    def __init__(self, gid: int, kind: str, block_size: int, window: int, pool: VllmBlockPool, *,
                 max_in_flight: int, max_model_len: int, alignment: int | None = None) -> None:
        self.gid, self.kind, self.block_size, self.window = gid, kind, block_size, window
        self.pool = pool
        #: ``cache_hit_alignment_tokens``: a hit's length is a multiple of it (the coordinator's
        #: ``scheduler_block_size``, the LCM of the groups' block sizes; ``HybridKVCacheCoordinator``).
        self.alignment = alignment or block_size
        self.tables: dict[str, list[int]] = {}
        #: ``num_cached_block``: requests registered by a prefix lookup or by caching (their count of cached blocks).
        self.num_cached: dict[str, int] = {}
        #: Bookkeeping for :meth:`data_blocks` (no rule of vLLM's): each table's leading null blocks (a window's
        #: skipped blocks are always a prefix: ``_remove_blocks_in_range`` walks back to the last null), and how
        #: many more references than blocks the tables hold (prefix hits on blocks another table holds).
        self.nulls: dict[str, int] = {}
        self.shared = 0
        #: A Mamba group under prefix caching (``mamba_cache_mode="align"``, ``MambaManager``): the state is kept
        #: per block boundary, so a table is mostly null blocks around the live state (:meth:`_align_allocate`).
        self.align = kind == "mamba" and pool.caching
        #: ``MambaManager.last_state_block_idx``, ``_num_retired_blocks`` ("align").
        self.last_state: dict[str, int] = {}
        self.retired: dict[str, int] = {}
        #: ``MambaManager.cached_blocks_this_step``: keys cached in this step (cleared by :meth:`new_step`).
        self.cached_this_step: set = set()
        # max_admission_blocks_per_request (kv_cache_interface.py): SlidingWindowSpec / ChunkedLocalAttentionSpec
        if kind == "sliding":
            self.cap = cdiv(min(window - 1 + max_in_flight, max_model_len), block_size) + 1
        elif kind == "chunked":
            self.cap = cdiv(min(window + max_in_flight, max_model_len), block_size)
        else:
            self.cap = None

    def skipped_tokens(self, n: int) -> int:
        """``get_num_skipped_tokens``: sliding ``n − W + 1``, chunked ``n // C × C``, Mamba ``n − 1``."""
        if self.kind == "sliding":
            return max(0, n - self.window + 1)
        if self.kind == "chunked":
            return n // self.window * self.window
        if self.kind == "mamba":
            return max(0, n - 1)
        return 0

    def blocks_to_allocate(self, rid: str, num_tokens: int, hit: list[int], total_computed: int,
                           cap: bool = False) -> int:
        if self.align:
            return self._align_blocks_to_allocate(rid, num_tokens, hit)
        required = cdiv(num_tokens, self.block_size)
        if cap and self.cap is not None:
            required = min(required, self.cap)
        have = len(self.tables.get(rid, ()))
        if rid in self.num_cached:
            return max(required - have, 0)
        skipped_blocks = self.skipped_tokens(total_computed) // self.block_size
        new = max(required - max(skipped_blocks, len(hit) + have), 0)
        skip_hit = max(0, skipped_blocks - have)
        evictable = sum(1 for b in hit[skip_hit:] if b != NULL and self.pool.ref[b] == 0)
        return new + evictable

    def _align_blocks_to_allocate(self, rid: str, num_tokens: int, hit: list[int]) -> int:
        """``MambaManager.get_num_blocks_to_allocate`` under "align" (no speculative or checkpoint blocks, a hash
        block equal to the Mamba block: no partial hit): a hit whose state was cached in this very step cannot be
        used yet (``num_gpu_blocks + 1``: the request waits a step); otherwise the missing blocks, at most one new
        (the rest of the table is null blocks), plus the hit's blocks that are free (evictable). Not clamped at 0,
        as vLLM's is not."""
        pool = self.pool
        if hit and hit[-1] != NULL and pool.hash_of[hit[-1]] in self.cached_this_step:
            return pool.num_blocks + 1
        new = cdiv(num_tokens, self.block_size) - len(hit) - len(self.tables.get(rid, ()))
        if new > 0:
            new = 1
        return new + sum(1 for b in hit if b != NULL and pool.ref[b] == 0)

    def _align_remove_skipped(self, rid: str, computed: int) -> None:
        """``MambaManager.remove_skipped_blocks`` under "align": every non-null block before the state of token
        ``computed − 1`` is freed (from ``_num_retired_blocks`` on, walking back past null gaps,
        ``_remove_blocks_in_range``), then the state block the previous allocation copied from
        (``last_state_block_idx``) once it lies before the block of the last computed token."""
        table = self.tables.setdefault(rid, [])
        skipped = computed - 1
        if skipped > 0:
            first = self.retired.get(rid, 0)
            last = min(skipped // self.block_size, len(table))
            if first < last:
                freed = []
                for i in range(last - 1, first - 1, -1):
                    if table[i] != NULL:
                        freed.append(table[i])
                        table[i] = NULL
                if freed:
                    self.shared -= self.pool.free_blocks(freed)
                self.retired[rid] = last
        at = self.last_state.get(rid)
        if at is not None and at < cdiv(computed, self.block_size) - 1 and table[at] != NULL:
            self.shared -= self.pool.free_blocks([table[at]])
            table[at] = NULL

    def _align_allocate(self, rid: str, num_tokens: int) -> None:
        """``MambaManager.allocate_new_blocks`` under "align": the table reaches ``cdiv(num_tokens, block)``
        entries, null blocks up to the last and one new block for the state of the chunk's end; the block
        holding the previous state (the last one, or a prefix hit's) is remembered as ``last_state_block_idx``,
        freed by the next :meth:`_align_remove_skipped` that passes it."""
        table = self.tables.setdefault(rid, [])
        required = cdiv(num_tokens, self.block_size)
        if required <= len(table):
            return
        if table:
            self.last_state[rid] = len(table) - 1
        if len(table) < required - 1:
            table.extend([NULL] * (required - 1 - len(table)))
        table.extend(self.pool.get_new_blocks(required - len(table)))

    def new_step(self) -> None:
        """``new_step_starts``: the states cached in the last step are usable from now on."""
        self.cached_this_step.clear()

    def remove_skipped(self, rid: str, computed: int) -> None:
        if self.align:
            return self._align_remove_skipped(rid, computed)
        skipped = self.skipped_tokens(computed)
        if skipped <= 0:
            return
        table = self.tables.setdefault(rid, [])
        last = min(skipped // self.block_size, len(table))
        freed = []
        for i in range(last - 1, -1, -1):
            if table[i] == NULL:
                break
            freed.append(table[i])
            table[i] = NULL
        if last > self.nulls.get(rid, 0):
            self.nulls[rid] = last
        if freed:
            self.shared -= self.pool.free_blocks(freed)

    def add_hit(self, rid: str, hit: list[int], computed: int) -> None:
        """``add_local_computed_blocks``: the hit's blocks before ``get_num_skipped_tokens(computed)`` become null
        blocks (not touched: a sliding or chunked hit holds nulls or blocks out of the window there), the rest are
        touched; all count as cached (``num_cached_block``)."""
        skipped = self.skipped_tokens(computed) // self.block_size
        kept = hit[skipped:]
        self.shared += self.pool.touch(kept)
        table = self.tables.setdefault(rid, [])
        table.extend([NULL] * skipped)
        table.extend(kept)
        if skipped:
            self.nulls[rid] = skipped
        self.num_cached[rid] = len(table)

    def allocate(self, rid: str, num_tokens: int) -> None:
        if self.align:
            return self._align_allocate(rid, num_tokens)
        table = self.tables.setdefault(rid, [])
        n = cdiv(num_tokens, self.block_size) - len(table)
        if n > 0:
            table.extend(self.pool.get_new_blocks(n))

    def cache_blocks(self, rid: str, hashes: list, num_tokens: int, boundaries=()) -> None:
        """``SingleTypeKVCacheManager.cache_blocks``: the blocks that became full get their hash
        (``BlockPool.cache_full_blocks``), null blocks and, in a sliding or Mamba group, blocks outside
        :meth:`reachable_mask` skipped for good (``num_cached_block`` moves past them)."""
        cached = self.num_cached.get(rid, 0)
        full = min(num_tokens, len(hashes) * self.block_size) // self.block_size
        if cached >= full:
            return
        table = self.tables[rid]
        cache, gid = self.pool.cache, self.gid
        mask = self.reachable_mask(cached, full, boundaries) if self.kind in ("sliding", "mamba") else None
        for i in range(cached, full):
            if table[i] != NULL and (mask is None or mask[i - cached]):
                cache(table[i], (hashes[i], gid))
                if self.align:
                    self.cached_this_step.add(self.pool.hash_of[table[i]])
        self.num_cached[rid] = full

    def reachable_mask(self, start: int, end: int, boundaries) -> list[bool]:
        """``reachable_block_mask`` (vLLM 0.33.0, no EAGLE) under vLLM's default ``prefix_cache_retention_interval =
        0`` (``CacheConfig``, carried into ``KVCacheConfig`` by ``kv_cache_planning.get_kv_cache_config_from_groups``):
        of blocks ``start … end − 1`` only those ending at each reachable boundary are cached — the replay boundary
        (``prompt − 1``, ``kv_cache_coordinator.replay_boundaries``) and the request's shared-prefix junction
        (``Request.shared_prefix_boundary``), each floored to the alignment (a whole number of this group's blocks:
        the LCM of the groups' block sizes). ``SlidingWindowManager``'s: the ``cdiv(W − 1, block)`` blocks a hit
        needs; ``MambaManager``'s: the one state block."""
        bs, align = self.block_size, self.alignment
        need = 1 if self.kind == "mamba" else cdiv(self.window - 1, bs)
        mask = [False] * (end - start)
        for b in boundaries:
            stop = b // align * align // bs
            for j in range(max(start, stop - need), min(end, stop)):
                mask[j - start] = True
        return mask

    def free(self, rid: str) -> None:
        if self.align:
            self.last_state.pop(rid, None)
            self.retired.pop(rid, None)
        table = self.tables.pop(rid, [])
        self.num_cached.pop(rid, None)
        self.nulls.pop(rid, None)
        while table and table[0] == NULL:  # trim_null_head
            table = table[1:]
        self.shared -= self.pool.free_blocks(reversed(table))

    def data_blocks(self, ctx_of, real: int) -> int:
        """Bytes of data this group's blocks hold, ``real`` bytes per full block, ``ctx_of(rid)`` tokens in each
        table (a Mamba page whole; a shared block once), in arithmetic per table: the tables' leading nulls and
        the shared count stand for the walk over every block that :meth:`data_blocks_walk` (the reference) does.
        A shared block is a prefix hit's, full in every table holding it (a hit is whole cached blocks), so each
        table counts it full and the extra references are taken off once each."""
        bs = self.block_size
        nulls = self.nulls
        total = 0
        if self.kind == "mamba":  # (under "align" null blocks lie between states: counted, not inferred)
            for table in self.tables.values():
                total += len(table) - table.count(NULL)
            return (total - self.shared) * real
        for rid, table in self.tables.items():
            m = min(ctx_of(rid), len(table) * bs)
            n = nulls.get(rid, 0)
            if m > n * bs:
                full, part = divmod(m, bs)
                total += (full - n) * real + real * part // bs
        return total - self.shared * real

    def data_blocks_walk(self, ctx_of, real: int) -> int:
        """:meth:`data_blocks` block by block (the reference): each non-null block once, filled up to the
        table's ``ctx_of(rid)`` tokens."""
        total = 0
        seen = set()
        for rid, table in self.tables.items():
            ctx = ctx_of(rid)
            for i, b in enumerate(table):
                if b == NULL or b in seen:
                    continue
                seen.add(b)
                if self.kind == "mamba":
                    total += real
                else:
                    filled = min(self.block_size, max(ctx - i * self.block_size, 0))
                    total += real * filled // self.block_size
        return total



def find_longest_cache_hit(batch: list[GroupTables], hashes: list, max_length: int) -> tuple[list[list[int]], int]:
    """One spec's ``find_longest_cache_hit`` over the groups ``batch`` (equal specs, looked up together: a block
    hits only if every group in the batch has it cached, ``BlockPool.get_cached_block``): each group's hit blocks
    (null blocks where the window skips them) and the hit length in tokens. ``single_type_kv_cache_manager.py``:

    * full attention / MLA (``FullAttentionManager``): cached blocks from the left while every hash is cached;
    * sliding window (``SlidingWindowManager``): scanned from the right for ``cdiv(W − 1, block)`` contiguous
      cached blocks; the blocks before them are null blocks; without such a run, the run of cached blocks at the
      start (shorter than the window) is the hit;
    * chunked local attention (``ChunkedLocalAttentionManager``): blocks before the chunk of ``max_length``
      (``max_length // C × C``) are null blocks and count as hit; from there cached blocks from the left.
    """
    g0 = batch[0]
    bs, align, kind = g0.block_size, g0.alignment, g0.kind
    pool = g0.pool
    keys = [g.gid for g in batch]

    def cached(h):
        out = []
        for gid in keys:
            b = pool.cached_block((h, gid))
            if b is None:
                return None
            out.append(b)
        return out

    max_blocks = max_length // bs
    if kind in ("full", "mla"):
        hit = [[] for _ in batch]
        for h in hashes[:max_blocks]:
            c = cached(h)
            if c is None:
                break
            for col, b in zip(hit, c):
                col.append(b)
        length = len(hit[0]) * bs
        length -= length % align
        for col in hit:
            del col[cdiv(length, bs):]
        return hit, length
    if kind == "sliding":
        need = cdiv(g0.window - 1, bs)
        hit = [[NULL] * max_blocks for _ in batch]
        run, found = 0, False
        for i in range(max_blocks - 1, -1, -1):
            c = cached(hashes[i])
            if c is None:
                run = 0
                continue
            if run == 0 and bs != align and ((i + 1) * bs) % align:
                continue
            for col, b in zip(hit, c):
                col[i] = b
            run += 1
            if run >= need:
                for col in hit:
                    del col[i + run:]
                found = True
                break
        if not found:
            for col in hit:
                del col[run:]
            while bs != align and len(hit[0]) * bs % align:
                for col in hit:
                    col.pop()
        return hit, len(hit[0]) * bs
    if kind == "chunked":
        start = max_length // g0.window * g0.window // bs if max_length > 0 else 0
        hit = [[NULL] * start for _ in batch]
        for i in range(start, max_blocks):
            c = cached(hashes[i])
            if c is None:
                break
            for col, b in zip(hit, c):
                col.append(b)
        return hit, len(hit[0]) * bs
    if kind == "mamba":
        # MambaManager.find_longest_cache_hit: from the right, the first cached state block whose end is a
        # multiple of the alignment; null blocks before it (one state is all a hit needs)
        for i in range(max_blocks - 1, -1, -1):
            c = cached(hashes[i])
            if c is None or (bs != align and ((i + 1) * bs) % align):
                continue
            return [[NULL] * i + [b] for b in c], (i + 1) * bs
        return [[] for _ in batch], 0
    raise ValueError(f"no prefix-cache hit rule for a {kind} group")

"""The paged KV pool of OpenVINO GenAI continuous batching: blocks, a FIFO free list, reference
counts and the prefix cache.

Rules (openvinotoolkit/openvino.genai ``src/cpp/src/continuous_batching/cache/block_manager.hpp``):

* ``BlockAllocator``: block ids ``0 .. total-1`` start on a free *list* in order;
  ``allocate_block`` takes the front, ``free`` appends to the back (FIFO), and
  ``increase_block_count`` appends the new ids. One id stands for the block in
  every layer (all layers allocate identically), so one id here covers 2·L tensors' rows.
* The free list is FIFO, so on a CPU the resident memory follows the blocks *ever* handed out
  (``BlockPool.touched``: ids ``0 .. touched-1``), not those in use (DESIGN §4b).
* ``CacheBlock::copy_on_write``: a block referenced by more than one sequence
  (forked samples, restored prefixes) is copied before a sequence writes into it.
* Prefix caching (``allocate_block(hash, cached_blocks)``, ``free(blocks, cached_blocks)``,
  ``OverwritableBlocksHashStore``): every block carries the hash of the token prefix
  it ends (hash-chained over full blocks, the last one partial); a block whose last
  reference goes away is *not* returned to the free list but kept, still restorable,
  in the overwritable store, where it counts as free. Allocation takes the free
  list first, then overwrites the least recently used stored block (its timestamp:
  allocation or restore time; ``get_lru_block_to_overwrite``). A stored block
  whose hash is freed again by another block (a collision) goes to the free list.

Timestamps are a logical clock (one tick per allocation or restore), so runs are
deterministic; GenAI's ``steady_clock`` can tie for blocks stamped in the same
instant, where its order falls back to the hash map (not reproducible).
"""

from __future__ import annotations

import heapq
from collections import deque

from simkv.errors import SimkvError


class BlockPool:
    def __init__(self, total: int, prefix_caching: bool = False) -> None:
        self.total = 0
        self.free: deque[int] = deque()
        self.ref: list[int] = []
        self.prefix_caching = prefix_caching
        self.hash_of: list[object] = []
        self.stamp: list[int] = []
        self.cached: dict[object, int] = {}  # hash -> block (live or stored)
        self.stored: dict[object, int] = {}  # the overwritable store: hash -> unreferenced block
        #: The store's blocks by (stamp, block) — the eviction order — as a heap with stale entries left in
        #: (a block restored, re-stored with a newer stamp, or pushed out by a collision): skipped when popped.
        self.lru: list = []
        self.clock = 0
        #: Blocks ever handed out: with a FIFO free list, what is resident on a CPU (written pages stay).
        self.touched = 0
        self.grow(total)

    # -- size ----------------------------------------------------------------------------

    def grow(self, new_total: int) -> None:
        """``increase_block_count``: new ids join the back of the free list."""
        if new_total < self.total:
            raise SimkvError("a block pool never shrinks")
        self.free.extend(range(self.total, new_total))
        extra = new_total - self.total
        self.ref.extend([0] * extra)
        self.hash_of.extend([None] * extra)
        self.stamp.extend([0] * extra)
        self.total = new_total

    def num_free(self) -> int:
        """Free list + overwritable store (``BlockAllocator::num_free_blocks``)."""
        return len(self.free) + len(self.stored)

    def used(self) -> int:
        return self.total - self.num_free()

    # -- blocks --------------------------------------------------------------------------

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def allocate(self, h: object = None) -> int:
        if self.free:
            b = self.free.popleft()
        elif self.stored:
            # least recently used stored block (``get_lru_block_to_overwrite``): the smallest (stamp, id); a
            # logical clock gives every block its own stamp, so no ties
            lru, stored, stamp = self.lru, self.stored, self.stamp
            while True:
                t, b, old = heapq.heappop(lru)
                if stored.get(old) == b and stamp[b] == t:
                    break
            del stored[old]
            if self.cached.get(old) == b:
                del self.cached[old]
        else:
            raise SimkvError("internal error: allocation from an exhausted pool")
        self.ref[b] = 1
        self.touched = max(self.touched, b + 1)
        self.stamp[b] = self._tick()
        if self.prefix_caching:
            self.hash_of[b] = h
            if h is not None:
                self.cached[h] = b
        return b

    def allocate_many(self, n: int) -> list[int]:
        """``n`` blocks without prefix hashes, as ``n`` calls of :meth:`allocate` would give them."""
        if self.prefix_caching or n > len(self.free):
            return [self.allocate(None) for _ in range(n)]
        free, ref = self.free, self.ref
        out = [free.popleft() for _ in range(n)]
        for b in out:
            ref[b] = 1  # (timestamps only order the prefix cache's evictions)
        if self.touched < self.total:
            self.touched = max(self.touched, max(out) + 1)
        return out

    def release_many(self, blocks: list[int]) -> None:
        """:meth:`release` of each block in order."""
        if self.prefix_caching:
            for b in blocks:
                if b is not None:
                    self.release(b)
            return
        ref, free = self.ref, self.free
        for b in blocks:
            if b is None:
                continue
            r = ref[b]
            if r <= 0:
                raise SimkvError(f"internal error: block {b} freed twice")
            ref[b] = r - 1
            if r == 1:
                free.append(b)

    def share(self, b: int) -> None:
        """One more sequence refers to ``b`` (a fork)."""
        self.ref[b] += 1

    def release(self, b: int) -> None:
        if self.ref[b] <= 0:
            raise SimkvError(f"internal error: block {b} freed twice")
        self.ref[b] -= 1
        if self.ref[b]:
            return
        h = self.hash_of[b]
        if self.prefix_caching and h is not None:
            other = self.stored.pop(h, None)
            if other is not None:  # a collision: the older copy goes back to the free list
                self.free.append(other)
            self.stored[h] = b
            self.cached[h] = b
            heapq.heappush(self.lru, (self.stamp[b], b, h))
        else:
            self.free.append(b)

    def rehash(self, b: int, h: object) -> None:
        """The last, partial block of a sequence now ends a longer prefix (``append_slots``)."""
        old = self.hash_of[b]
        if old == h:
            return
        if old is not None and self.cached.get(old) == b:
            del self.cached[old]
        self.hash_of[b] = h
        self.cached[h] = b

    def has(self, h: object) -> bool:
        return h in self.stored or h in self.cached

    def restore(self, h: object) -> int | None:
        """``get_cached_block``: a stored block comes back with one reference; a live one gains one."""
        b = self.stored.pop(h, None)
        if b is None:
            b = self.cached.get(h)
            if b is None or self.ref[b] == 0:
                return None
        self.ref[b] += 1
        self.stamp[b] = self._tick()
        return b

    def check(self) -> None:
        """Invariants (tests): every block is exactly one of free, stored, referenced."""
        free = set(self.free)
        stored = set(self.stored.values())
        referenced = {b for b in range(self.total) if self.ref[b] > 0}
        if len(free) != len(self.free) or free & stored or free & referenced or stored & referenced:
            raise AssertionError("a block is in two states")
        if len(free) + len(stored) + len(referenced) != self.total:
            raise AssertionError("blocks lost")


def token_hashes(tokens, block_size: int) -> list:
    """Hash of every full block's prefix, chained: ``h_k = hash((h_{k-1}, tokens of block k))``."""
    out, prev = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        prev = hash((prev, tuple(tokens[start : start + block_size])))
        out.append(prev)
    return out


def prefix_hash(tokens, length: int, block_size: int, full: list) -> object:
    """Hash of the first ``length`` tokens: the chain of full blocks, then the partial tail."""
    k, rem = divmod(length, block_size)
    if rem == 0:
        return full[k - 1]
    prev = full[k - 1] if k else None
    return hash((prev, tuple(tokens[k * block_size : length])))

"""The paged pool's tensors in the ledger: a K and a V cache tensor per layer, each holding
every block of the pool, (re)allocated whole when the pool grows.

Order measured on the real pipeline (memray, ``KVCacheManager::allocate_cache_if_needed``;
docs/DESIGN.md §4b, checked by ``simkv validate --paged`` unless ``--no-memray``): per layer ``+K_new +V_new (copy K, V) -K_old -V_old``; then
(``SchedulerConfig.transient_buffers``, the CPU plugin) 2·L more buffers of the new tensors'
sizes, allocated and freed in the same step — at the first allocation too — so the
in-step peak is twice the new pool. The scratch pair of a layer comes V-sized first. The scratch
buffers come with the step's inference: a step that allocates the pool without running one (idle
step 0, or everything IGNORED) has none, and none follow later (measured, docs/DESIGN.md §4b).
"""

from __future__ import annotations

import numpy as np

from simkv.ledger import ALLOC, COPY, FREE, PHASE_CODE, ROW, TENSOR_CODE, Ledger
from simkv.limits import MAX_SERVING_LEDGER_ROWS


class PoolTensors:
    """The 2·L tensors' ledger, their size in blocks (``total``) and buffer ids."""

    def __init__(self, layers: int, k_block: int, v_block: int, block_bytes: int, block_size: int,
                 transient: bool) -> None:
        self.layers, self.k_block, self.v_block = layers, k_block, v_block
        self.block_bytes, self.bs, self.transient = block_bytes, block_size, transient
        self.ledger = Ledger(limit=MAX_SERVING_LEDGER_ROWS)
        self.total = 0  # blocks the tensors hold
        self.ids: dict = {}
        self.next_buffer = 0

    def resize(self, step: int, new_total: int, inference: bool = True) -> tuple[int, int]:
        """(Re)allocate the tensors at ``new_total`` blocks. Returns (bytes copied, in-step peak)."""
        L = self.layers
        per_k, per_v = self.k_block, self.v_block
        last_v = per_v + self.block_bytes - L * (per_k + per_v)  # any remainder on the last V
        old = self.total
        out = []

        def row(layer, tensor, op, nbytes, blocks, buffer):
            out.append((step, PHASE_CODE["decode"], -1, layer, TENSOR_CODE[tensor], op, nbytes, blocks * self.bs,
                        0, buffer))

        new_ids = {}
        for layer in range(L):
            sizes = (("k", per_k), ("v", last_v if layer == L - 1 else per_v))
            for t, per in sizes:
                new_ids[layer, t] = self.next_buffer
                row(layer, t, ALLOC, new_total * per, new_total, self.next_buffer)
                self.next_buffer += 1
            if old:
                for t, per in sizes:
                    row(layer, t, COPY, old * per, old, new_ids[layer, t])
                for t, per in sizes:
                    row(layer, t, FREE, old * per, old, self.ids[layer, t])
        transient = []
        if self.transient and inference:
            for layer in range(L):  # V-sized first (memray: +V0 +K0 +V1 +K1 ... -V0 -K0 ...)
                for t, per in (("v", last_v if layer == L - 1 else per_v), ("k", per_k)):
                    transient.append((layer, t, per, self.next_buffer))
                    row(layer, t, ALLOC, new_total * per, new_total, self.next_buffer)
                    self.next_buffer += 1
            for layer, t, per, buf in transient:
                row(layer, t, FREE, new_total * per, new_total, buf)
        self.ledger.append(np.array(out, dtype=ROW))
        self.ids = new_ids
        self.total = new_total
        new_bytes = new_total * self.block_bytes
        peak = new_bytes + old * (per_k + max(per_v, last_v))
        if transient:
            peak = max(peak, 2 * new_bytes)
        return old * self.block_bytes, peak

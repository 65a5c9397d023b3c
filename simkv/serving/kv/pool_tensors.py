"""The paged pool's tensors in the ledger: each tensor holds one row per block of its pool, and is
(re)allocated whole when the pool grows.

KV pool, order measured on the real pipeline (memray, ``KVCacheManager::allocate_cache_if_needed``;
docs/DESIGN.md §4b, checked by ``simkv validate --paged`` unless ``--no-memray``): per layer ``+K_new +V_new (copy
K, V) -K_old -V_old``; then (``SchedulerConfig.transient_buffers``, the CPU plugin, GenAI's manager) one more
buffer of each new tensor's size, allocated and freed in the same step — at the first allocation too — so the
in-step peak is twice the new pool. The scratch pair of a layer comes V-sized first. The scratch buffers come
with the step's inference: a step that allocates the pool without running one (idle step 0, or everything
IGNORED) has none, and none follow later (measured, docs/DESIGN.md §4b).

GenAI's linear-attention pool (read in ``LinearAttentionCacheManager::allocate_cache_if_needed``, not
measured): after the KV pool (``CacheOrchestrator`` walks its managers in ``CacheType`` order), every
``conv_state_table.N`` then every ``gated_delta_state_table.N`` (state tables grouped by name prefix, layers in
order): ``+new (copy) -old`` each. No scratch buffers are modelled for it (none measured).

vLLM's manager: ``group_size`` shared tensors (tensor i holds the i-th layer of every group), ledger tensor ``k``
of layer i, reallocated like the KV pool's, without the CPU plugin's scratch buffers.
"""

from __future__ import annotations

import numpy as np

from simkv.ledger import ALLOC, COPY, FREE, PHASE_CODE, ROW, TENSOR_CODE, Ledger
from simkv.limits import MAX_SERVING_LEDGER_ROWS


class PoolTensors:
    """The pools' tensors' ledger, their sizes in blocks (``total``, ``state_total``) and buffer ids.

    ``tensors``: the KV pool's (layer, ledger tensor name, bytes per block), per layer K then V (their sum is
    ``block_bytes``); ``state_tensors``: GenAI's linear-attention pool's, in allocation order."""

    def __init__(self, tensors, block_bytes: int, block_size: int, transient: bool, state_tensors=(),
                 by_layer: bool = True) -> None:
        self.tensors = tuple(tensors)
        self.block_bytes, self.bs, self.transient = block_bytes, block_size, transient
        self.state_tensors = tuple(state_tensors)
        self.state_bytes = sum(t[2] for t in self.state_tensors)
        # the KV pool's tensors per layer, in order (a layer's K and V are allocated, copied and freed together)
        layers: dict[int, list] = {}
        for layer, name, per in self.tensors:
            layers.setdefault(layer, []).append((name, per))
        self.layers = list(layers.items()) if by_layer else [(layer, [(name, per)]) for layer, name, per in self.tensors]
        self.ledger = Ledger(limit=MAX_SERVING_LEDGER_ROWS)
        self.total = 0  # blocks the KV tensors hold
        self.state_total = 0  # blocks the state tensors hold
        self.ids: dict = {}
        self.state_ids: dict = {}
        self.next_buffer = 0

    def resident_peak(self, new_total: int, new_state_total: int) -> int:
        """Bytes the pools hold at the peak of (re)allocating them to these sizes, the CPU plugin's scratch buffers
        left out (virtual, never touched: experiments/genai_layer_kinds/README.md §1.4): per KV layer the new
        tensors beside every old one not yet freed, then per state tensor the same (:meth:`resize`,
        :meth:`resize_state`)."""
        old, bb = self.total, self.block_bytes
        state_old = self.state_total * self.state_bytes
        peak = running = old * bb
        if new_total != old:
            for _, sizes in self.layers:
                per = sum(p for _, p in sizes)
                running += new_total * per
                peak = max(peak, running)
                running -= old * per
        peak += state_old
        if new_state_total != self.state_total:
            running = new_total * bb + state_old
            for _, _, per in self.state_tensors:
                running += new_state_total * per
                peak = max(peak, running)
                running -= self.state_total * per
        return peak

    def resize(self, step: int, new_total: int, inference: bool = True) -> tuple[int, int]:
        """(Re)allocate the KV pool's tensors at ``new_total`` blocks. Returns (bytes copied, in-step peak of the
        KV pool)."""
        old = self.total
        out = []

        def row(layer, tensor, op, nbytes, blocks, buffer):
            out.append((step, PHASE_CODE["decode"], -1, layer, TENSOR_CODE[tensor], op, nbytes, blocks * self.bs,
                        0, buffer))

        new_ids = {}
        peak = running = old * self.block_bytes  # bytes held as the layers are replaced one by one
        for layer, sizes in self.layers:
            for t, per in sizes:
                new_ids[layer, t] = self.next_buffer
                row(layer, t, ALLOC, new_total * per, new_total, self.next_buffer)
                self.next_buffer += 1
            layer_new = sum(per for _, per in sizes)
            running += new_total * layer_new
            peak = max(peak, running)
            running -= old * layer_new
            if old:
                for t, per in sizes:
                    row(layer, t, COPY, old * per, old, new_ids[layer, t])
                for t, per in sizes:
                    row(layer, t, FREE, old * per, old, self.ids[layer, t])
        transient = []
        if self.transient and inference:
            for layer, sizes in self.layers:  # V-sized first (memray: +V0 +K0 +V1 +K1 ... -V0 -K0 ...)
                for t, per in reversed(sizes):
                    transient.append((layer, t, per, self.next_buffer))
                    row(layer, t, ALLOC, new_total * per, new_total, self.next_buffer)
                    self.next_buffer += 1
            for layer, t, per, buf in transient:
                row(layer, t, FREE, new_total * per, new_total, buf)
        self.ledger.append(np.array(out, dtype=ROW))
        self.ids = new_ids
        self.total = new_total
        new_bytes = new_total * self.block_bytes
        if transient:
            peak = max(peak, 2 * new_bytes)
        return old * self.block_bytes, peak

    def resize_state(self, step: int, new_total: int) -> tuple[int, int]:
        """(Re)allocate the linear-attention pool's tensors at ``new_total`` blocks: per tensor ``+new (copy)
        -old``. Returns (bytes copied, the state pool's in-step peak)."""
        old = self.state_total
        out = []
        peak = running = old * self.state_bytes
        new_ids = {}
        for layer, t, per in self.state_tensors:
            buf = self.next_buffer
            self.next_buffer += 1
            new_ids[layer, t] = buf
            code = TENSOR_CODE[t]
            out.append((step, PHASE_CODE["decode"], -1, layer, code, ALLOC, new_total * per, new_total, 0, buf))
            running += new_total * per
            peak = max(peak, running)
            if old:
                out.append((step, PHASE_CODE["decode"], -1, layer, code, COPY, old * per, old, 0, buf))
                out.append((step, PHASE_CODE["decode"], -1, layer, code, FREE, old * per, old, 0, self.state_ids[layer, t]))
                running -= old * per
        self.ledger.append(np.array(out, dtype=ROW))
        self.state_ids = new_ids
        self.state_total = new_total
        return old * self.state_bytes, peak

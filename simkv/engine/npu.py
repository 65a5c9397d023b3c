"""The NPU pipeline's buffers outside the units, as ledger rows (policies/openvino_npu.py).

The units are the generate model's past KV (the policy's ``capacity``); everything else the pipeline
does to memory comes from the policy's step plan (:meth:`policies.openvino_npu.OpenVINONPU.plan`), turned
into rows here all at once per step: the present outputs at the first inference (each layer's K and V of
the generate model, then of the prefill model), a prefill's restored prefix-cache blocks (copies into the
past), its stored blocks (allocated and filled per layer's K and V; an evicted block freed; a block not kept
freed again), and the first generate step's copy of the prefill's KV (through a staging tensor per K and V
for the earlier chunks). The reference engine performs the same one buffer at a time (``simkv.reference``).
"""

from __future__ import annotations

import numpy as np

from simkv.engine.events import NO_ROWS
from simkv.ledger import ALLOC, COPY, FREE, ROW, TENSOR_CODE


class NpuBuffers:
    """One session's present outputs and prefix-cache blocks; ``rows`` plans a step's."""

    def __init__(self, layout, policy, workload, request: int) -> None:
        self.enabled = bool(policy.npu_pipeline)
        self.policy, self.request = policy, request
        self.plan = policy.plan(workload) if self.enabled else []
        kv = (layout.tensor == TENSOR_CODE["k"]) | (layout.tensor == TENSOR_CODE["v"])
        self.data = np.flatnonzero(kv & (layout.row_bytes > 0))  # per layer K then V, layers in order
        self.layer = layout.layer[self.data]
        self.row = layout.row_bytes[self.data]
        is_k = layout.tensor[self.data] == TENSOR_CODE["k"]
        self.present_code = np.where(is_k, TENSOR_CODE["k_present"], TENSOR_CODE["v_present"]).astype(np.int8)
        self.block_code = np.where(is_k, TENSOR_CODE["k_block"], TENSOR_CODE["v_block"]).astype(np.int8)
        self.copy_code = np.where(is_k, TENSOR_CODE["k_copy"], TENSOR_CODE["v_copy"]).astype(np.int8)
        self.present_bytes = 0
        self.blocks: dict[int, np.ndarray] = {}  # prefix-cache block key -> its tensors' buffer ids
        self.block_bytes = int(self.row.sum()) * (policy.block if self.enabled and policy.prefix_caching else 0)

    def pending(self, step: int) -> bool:
        """Whether ``step`` has rows of its own (a decode run cannot be planned across it)."""
        return self.enabled and step < len(self.plan) and bool(self.plan[step].copied)

    def bytes(self) -> int:
        return self.present_bytes + len(self.blocks) * self.block_bytes

    def rows(self, step: int, phase: int, first: bool, data_ids: np.ndarray, data_cap: int, next_id: int):
        """A step's rows (``first``: the session's first inference; ``data_ids``: the units' K and V data
        buffers, as :attr:`data` orders them, of ``data_cap`` tokens) and the next free buffer id."""
        if not self.enabled:
            return NO_ROWS, next_id
        plan, policy, n = self.plan[step], self.policy, len(self.data)
        parts: list[np.ndarray] = []

        def block_of(op, code, nbytes, cap, used, ids):
            rows = np.zeros(n, dtype=ROW)
            rows["step"], rows["phase"], rows["request"] = step, phase, self.request
            rows["layer"], rows["tensor"], rows["op"] = self.layer, code, op
            rows["bytes"], rows["capacity_tokens"], rows["used_tokens"], rows["buffer"] = nbytes, cap, used, ids
            return rows

        def interleave(*blocks):
            return np.stack(blocks, axis=1).ravel()

        if first:
            for tokens in policy.presents():
                ids = next_id + np.arange(n)
                next_id += n
                parts.append(block_of(ALLOC, self.present_code, tokens * self.row, tokens, 0, ids))
                self.present_bytes += int((tokens * self.row).sum())
        block = policy.block if policy.prefix_caching else 0
        for _key in plan.restored:
            parts.append(block_of(COPY, self.tensor_of_data(), block * self.row, data_cap, block, data_ids))
        pending = None  # the block just stored, kept unless the next action drops it
        for action, key in plan.stores:
            if action == "new":
                if pending is not None:
                    self.blocks[pending[0]] = pending[1]
                ids = next_id + np.arange(n)
                next_id += n
                nbytes = block * self.row
                parts.append(interleave(block_of(ALLOC, self.block_code, nbytes, block, block, ids),
                                        block_of(COPY, self.block_code, nbytes, block, block, ids)))
                pending = (key, ids)
            else:  # evict a cached block, or drop the one just made
                ids = self.blocks.pop(key) if action == "evict" else pending[1]
                if action == "drop":
                    pending = None
                parts.append(block_of(FREE, self.block_code, block * self.row, block, block, ids))
        if pending is not None:
            self.blocks[pending[0]] = pending[1]
        if plan.copied:
            staged, rest = plan.staged, plan.copied - plan.staged
            if staged:
                past = policy.prompt_size - policy.chunk
                ids = next_id + np.arange(n)
                next_id += n
                parts.append(interleave(
                    block_of(ALLOC, self.copy_code, past * self.row, past, past, ids),
                    block_of(COPY, self.copy_code, past * self.row, past, past, ids),
                    block_of(COPY, self.tensor_of_data(), staged * self.row, data_cap, staged, data_ids),
                    block_of(FREE, self.copy_code, past * self.row, past, past, ids),
                    block_of(COPY, self.tensor_of_data(), rest * self.row, data_cap, rest, data_ids)))
            else:
                parts.append(block_of(COPY, self.tensor_of_data(), rest * self.row, data_cap, rest, data_ids))
        return (np.concatenate(parts) if parts else NO_ROWS), next_id

    def tensor_of_data(self) -> np.ndarray:
        """The K / V tensor codes of the data slots."""
        return np.where(self.present_code == TENSOR_CODE["k_present"], TENSOR_CODE["k"], TENSOR_CODE["v"]).astype(np.int8)

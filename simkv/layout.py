"""Which buffers a model's KV cache consists of, and in which order they are touched.

Every layer owns, per K and per V primitive, a data buffer, a scale/zero-point
buffer when the precision is quantised, and the beam tables the runtime keeps.
A *slot* is one such buffer position (it holds one live buffer at a time); a
*unit* is what a policy sizes and reallocates as a whole: a layer (CPU plugin,
K and V together) or a primitive (GPU plugin, K and V independently).

A slot's ``row_bytes`` is what one token costs it for one batch row; a buffer
in that slot holds ``capacity × batch × row_bytes`` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from simkv.errors import ConfigError
from simkv.ledger import ALLOC, COPY, FREE, TENSOR_CODE, TENSORS
from simkv.models import ModelSpec
from simkv.precision import Precision

if TYPE_CHECKING:
    from policies.base import Policy

BEAM_TABLE_BYTES = 4  # i32 per batch row per token
PAST_VIEW_BYTES = 4  # f32 per element of the CPU plugin's past block
_OP_SYMBOL = {"+": ALLOC, "=": COPY, "-": FREE}


@dataclass(frozen=True, eq=False)
class Layout:
    layer: np.ndarray  # per slot
    tensor: np.ndarray  # per slot: code in simkv.ledger.TENSORS
    row_bytes: np.ndarray  # per slot
    unit_slots: np.ndarray  # (units, slots per unit), in the order rows are emitted
    unit_prim: np.ndarray  # per unit: primitive id handed to the policy (K's id for a layer unit)

    @property
    def units(self) -> int:
        return len(self.unit_slots)

    # Per-unit arrays are computed once (engines read them one unit at a time: a property that built the
    # array on each read made 100,000 layers quadratic). A layout is frozen; cached_property writes the
    # instance's __dict__ directly.
    @cached_property
    def unit_layer(self) -> np.ndarray:
        """Per unit, its layer."""
        return self.layer[self.unit_slots[:, 0]]

    @cached_property
    def unit_table_tensor(self) -> np.ndarray:
        """Per unit, the tensor code of the beam tables a GPU kernel keeps beside it (k_beam / v_beam)."""
        is_k = self.tensor[self.unit_slots[:, 0]] == TENSOR_CODE["k"]
        return np.where(is_k, TENSOR_CODE["k_beam"], TENSOR_CODE["v_beam"]).astype(np.int8)

    @cached_property
    def unit_row_bytes(self) -> np.ndarray:
        """Bytes per token per batch row of each unit (all its buffers)."""
        return self.row_bytes[self.unit_slots].sum(axis=1)

    def row_order(self, template: str | None) -> np.ndarray:
        """Emission order of one unit's rows as indices ``op * slots + slot``.

        ``template`` lists ``+tensor`` (alloc), ``=tensor`` (copy) and ``-tensor``
        (free) for every tensor of a unit; tensors this precision lacks are skipped.
        ``None``: allocs, then copies, then frees, each in slot order.
        """
        k = self.unit_slots.shape[1]
        if template is None:
            return np.arange(3 * k)
        names = [TENSORS[t] for t in self.tensor[self.unit_slots[0]]]
        order = [  # a tensor with several buffers (two beam tables) names them all, in slot order
            _OP_SYMBOL[token[0]] * k + slot
            for token in template.split()
            for slot, name in enumerate(names)
            if name == token[1:]
        ]
        if sorted(order) != list(range(3 * k)):
            raise ConfigError(f"row order {template!r} must name each of {names} once per operation")
        return np.asarray(order)

    @classmethod
    def build(cls, model: ModelSpec, precision: Precision, policy: Policy) -> Layout:
        data = precision.data_bytes_per_token(model)
        meta = model.kv_heads * policy.meta_bytes_per_head(precision)

        def primitive(kv: str) -> list[tuple[str, int]]:
            slots = [(kv, data)]
            if meta:
                slots.append((f"{kv}_scale", meta))
            if not policy.kernel_beam_tables:  # else the kernel keeps them outside the unit (engines)
                slots += [(f"{kv}_beam", BEAM_TABLE_BYTES)] * policy.beam_tables
            return slots

        k, v = primitive("k"), primitive("v")
        if policy.unit == "layer":
            # Grouped by kind: K, V, then K scale, V scale, then beam tables.
            units = [[s for pair in zip(k, v) for s in pair]]
            prims = [0]
        else:
            units = [k, v]
            prims = [0, 1]
        per_layer = len(units)
        width = len(units[0])

        layer, tensor, row = [], [], []
        for lay in range(model.layers):
            for unit in units:
                for name, nbytes in unit:
                    layer.append(lay)
                    tensor.append(TENSOR_CODE[name])
                    row.append(nbytes)
        n_units = model.layers * per_layer
        unit_slots = np.arange(n_units * width, dtype=np.int64).reshape(n_units, width)
        unit_prim = (np.arange(model.layers)[:, None] * 2 + np.asarray(prims)[None, :]).ravel()
        return cls(
            layer=np.asarray(layer, dtype=np.int32),
            tensor=np.asarray(tensor, dtype=np.int8),
            row_bytes=np.asarray(row, dtype=np.int64),
            unit_slots=unit_slots,
            unit_prim=unit_prim.astype(np.int64),
        )

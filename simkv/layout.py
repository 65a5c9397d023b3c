"""Which buffers a model's KV cache consists of, and in which order they are touched.

Every attention layer owns, per K and per V primitive, a data buffer, a scale/zero-point
buffer when the precision is quantised, and the beam tables the runtime keeps.
A *slot* is one such buffer position (it holds one live buffer at a time); a
*unit* is what a policy sizes and reallocates as a whole: a layer (CPU plugin,
K and V together) or a primitive (GPU plugin, K and V independently).

A slot's ``row_bytes`` is what one token costs it for one batch row; a buffer
in that slot holds ``capacity × batch × row_bytes`` bytes. Layers differ
(:mod:`simkv.kvspec`): each slot's bytes are its layer's, a window is kept per
unit (``unit_keep``), and a linear-attention layer is a *state* unit: its conv and
recurrent states take the places of K and V, hold one row per sequence
(capacity 1, whatever the tokens) and are sized by no policy. A *ring* unit
(``unit_ring``, transformers' static sliding layer) has one fixed size and is
rebuilt at it whenever a step appends to it full. Units are equally
wide; a place a unit lacks (a state unit has no scales or beam tables) is an
*absent* slot of 0 bytes that never emits a row. A layer that caches nothing has
no unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from simkv.errors import ConfigError
from simkv.kvspec import LayerKV, cached_heads, k_v_bytes, state_bytes
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
    row_bytes: np.ndarray  # per slot; 0: an absent slot
    unit_slots: np.ndarray  # (units, slots per unit), in the order rows are emitted
    unit_prim: np.ndarray  # per unit: primitive id handed to the policy (K's id for a layer unit; -1: a state)
    #: Per unit: tokens its buffers keep between inferences (policy.kept_tokens), -1: the whole history.
    unit_keep: np.ndarray
    #: Per unit: a linear-attention state (one row per sequence, capacity 1).
    unit_state: np.ndarray
    #: Per unit: tokens of its fixed ring buffer (policy.ring_tokens; its keep too), -1: none.
    unit_ring: np.ndarray
    #: Per unit and row-order kind, an index into :attr:`templates` (None: every unit alike).
    unit_template: np.ndarray | None = None
    #: The policy's row orders, one dict per distinct layer kind (policy.orders).
    templates: tuple[dict, ...] = ({},)
    #: Slot *roles* (k, v, k_scale …) the row-order templates name; states fill the k and v roles.
    role: np.ndarray | None = None

    @property
    def units(self) -> int:
        return len(self.unit_slots)

    @cached_property
    def uniform(self) -> bool:
        """Every unit alike: no window, no state, one row order (decode runs are planned as a whole)."""
        return not (self.unit_keep >= 0).any() and not self.has_states and len(self.templates) == 1

    @cached_property
    def has_states(self) -> bool:
        return bool(self.unit_state.any())

    @cached_property
    def has_absent(self) -> bool:
        return bool((self.row_bytes == 0).any())

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

    def trim_states(self, bits: int, io_bytes: int) -> tuple[np.ndarray, ...]:
        """The K and V states a trim rebuilds (``Policy.trim_rule == "rebuild"``) in the order the CPU
        plugin's ``query_state()`` returns them — last layer first, V before K (measured, openvino 2026.4.1;
        policies/openvino_cpu.py): per state its unit, data slot, beam-table slot (-1: none), the tensor code
        of its copies (``k_copy`` / ``v_copy``) and their bytes per token per beam (the data's elements at
        ``io_bytes`` each, the data being ``bits`` per element)."""
        units, data, beam, code, io_row = [], [], [], [], []
        for unit in range(self.units - 1, -1, -1):
            slots = self.unit_slots[unit]
            if self.unit_state[unit]:
                continue
            for kv in ("v", "k"):
                found = [int(s) for s in slots if self.tensor[s] == TENSOR_CODE[kv] and self.row_bytes[s]]
                if not found:
                    continue
                tables = [int(s) for s in slots if self.tensor[s] == TENSOR_CODE[kv + "_beam"] and self.row_bytes[s]]
                units.append(unit)
                data.append(found[0])
                beam.append(tables[0] if tables else -1)
                code.append(TENSOR_CODE[kv + "_copy"])
                io_row.append(int(self.row_bytes[found[0]]) * 8 // bits * io_bytes)
        as_array = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
        return as_array(units), as_array(data), as_array(beam), as_array(code), as_array(io_row)

    def row_order(self, template: str | None) -> np.ndarray:
        """Emission order of one unit's rows as indices ``op * slots + slot``.

        ``template`` lists ``+tensor`` (alloc), ``=tensor`` (copy) and ``-tensor``
        (free) for every tensor of a unit; tensors this precision lacks are skipped.
        ``None``: allocs, then copies, then frees, each in slot order.
        """
        k = self.unit_slots.shape[1]
        if template is None:
            return np.arange(3 * k)
        roles = self.tensor if self.role is None else self.role
        names = [TENSORS[t] for t in roles[self.unit_slots[0]]]
        order = [  # a tensor with several buffers (two beam tables) names them all, in slot order
            _OP_SYMBOL[token[0]] * k + slot
            for token in template.split()
            for slot, name in enumerate(names)
            if name == token[1:]
        ]
        if sorted(order) != list(range(3 * k)):
            raise ConfigError(f"row order {template!r} must name each of {names} once per operation")
        return np.asarray(order)

    def orders(self, kind: str) -> np.ndarray:
        """The row order of ``kind`` (grow, grow_empty, rebatch, gather): one order ``(3k,)`` when every
        unit has the same, else one per unit ``(units, 3k)``."""
        first = self.row_order(self.templates[0].get(kind))
        if self.unit_template is None:
            return first
        per_kind = np.stack([first] + [self.row_order(t.get(kind)) for t in self.templates[1:]])
        return per_kind[self.unit_template]

    @classmethod
    def build(cls, model: ModelSpec, precision: Precision, policy: Policy) -> Layout:
        """Each distinct layer spec is laid out once (:func:`_layer_units`); the layers repeat them in order.
        kv_cache primitive ids count the attention layers only (a linear-attention state has none: -1)."""
        layers = model.kv_layers
        kinds = list(dict.fromkeys(spec for spec in layers if spec.kind != "none"))
        index = {spec: i for i, spec in enumerate(kinds)}
        laid = [_layer_units(spec, precision, policy) for spec in kinds]
        templates: list[dict] = []
        for one in laid:
            if one.orders not in templates:
                templates.append(one.orders)
        which = np.asarray([index[spec] for spec in layers if spec.kind != "none"], dtype=np.int64)
        at = np.asarray([i for i, spec in enumerate(layers) if spec.kind != "none"], dtype=np.int64)
        per_layer_units, per_unit = laid[0].row.shape if laid else (0, 0)
        stack = lambda name: np.stack([getattr(one, name) for one in laid])[which]  # noqa: E731
        attention = np.asarray([spec.caches_tokens for spec in kinds], dtype=bool)[which]
        kv_id = np.cumsum(attention) - attention
        prims = np.asarray([0] if policy.unit == "layer" else [0, 1], dtype=np.int64)
        unit_prim = np.where(attention[:, None], 2 * kv_id[:, None] + prims[None, :], -1)
        tensor_codes, role_codes = stack("tensor").ravel(), stack("role").ravel()
        n_units = len(at) * per_layer_units
        template_of = np.asarray([templates.index(one.orders) for one in laid], dtype=np.int64)
        return cls(
            layer=np.repeat(at, per_layer_units * per_unit).astype(np.int32),
            tensor=tensor_codes,
            row_bytes=stack("row").ravel(),
            unit_slots=np.arange(n_units * per_unit, dtype=np.int64).reshape(n_units, per_unit),
            unit_prim=unit_prim.ravel(),
            unit_keep=np.repeat(np.asarray([one.keep for one in laid], dtype=np.int64)[which], per_layer_units),
            unit_state=np.repeat(~attention, per_layer_units),
            unit_ring=np.repeat(np.asarray([one.ring for one in laid], dtype=np.int64)[which], per_layer_units),
            unit_template=None if len(templates) <= 1 else np.repeat(template_of[which], per_layer_units),
            templates=tuple(templates) or ({},),
            role=None if (role_codes == tensor_codes).all() else role_codes,
        )


class _LayerUnits(NamedTuple):
    """One layer spec's units under a policy: per unit and slot the tensor, role and bytes per row; the
    tokens kept and the ring size (-1: none); the policy's row orders for the kind."""

    tensor: np.ndarray
    role: np.ndarray
    row: np.ndarray
    keep: int
    ring: int
    orders: dict


def _layer_units(spec: LayerKV, precision: Precision, policy: Policy) -> _LayerUnits:
    """A layer's units: K and V primitives (or, for a linear-attention state, conv in K's place and recurrent
    in V's) of a data slot, a scale slot if the precision has metadata, and the unit's beam tables; a layer
    unit interleaves them grouped by kind (K, V, then K scale, V scale, then beam tables)."""
    meta_per_head = policy.meta_bytes_per_head(precision)
    beams = 0 if policy.kernel_beam_tables else policy.beam_tables  # else the kernel keeps them outside the unit
    if spec.caches_tokens:
        k_bytes, v_bytes = k_v_bytes(spec, precision, policy.mla_form)
        meta = cached_heads(spec, policy.mla_form) * meta_per_head
        place = {"k": (k_bytes, "k"), "v": (v_bytes, "v")}
        metas, beam_bytes = {"k": meta, "v": meta}, BEAM_TABLE_BYTES
        ring = policy.ring_tokens(spec)
        kept = ring or policy.kept_tokens(spec)
    else:  # a linear-attention state: absent scale and beam-table places
        conv, recurrent = state_bytes(spec, *policy.state_element_bytes(precision))
        place = {"k": (conv, "conv_state"), "v": (recurrent, "recurrent_state")}
        metas, beam_bytes = {"k": 0, "v": 0}, 0
        ring, kept = None, 1

    def primitive(kv: str) -> list[tuple[str, str, int]]:
        nbytes, name = place[kv]
        slots = [(kv, name, nbytes)]
        if meta_per_head:
            slots.append((f"{kv}_scale", f"{kv}_scale", metas[kv]))
        return slots + [(f"{kv}_beam", f"{kv}_beam", beam_bytes)] * beams

    k, v = primitive("k"), primitive("v")
    units = [[s for pair in zip(k, v) for s in pair]] if policy.unit == "layer" else [k, v]
    return _LayerUnits(
        tensor=np.asarray([[TENSOR_CODE[name] for _, name, _ in unit] for unit in units], dtype=np.int8),
        role=np.asarray([[TENSOR_CODE[role] for role, _, _ in unit] for unit in units], dtype=np.int8),
        row=np.asarray([[nbytes for _, _, nbytes in unit] for unit in units], dtype=np.int64),
        keep=-1 if kept is None else kept, ring=-1 if ring is None else ring,
        orders=policy.orders(spec) or {},
    )

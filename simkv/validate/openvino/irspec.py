"""What a stateful IR keeps per layer, read from the IR itself: the model simkv simulates for ``--ir``.

Each state variable of the model is a ReadValue/Assign pair. Two kinds occur in optimum-intel exports:

* a **KV cache** variable ``[B, H_kv, L, S]`` (the sequence axis dynamic): two per attention layer, K and V
  (named ``...key...`` / ``...value...``), fused by the CPU plugin into the layer's SDPA node;
* a **linear-attention state** with every axis but the batch static: a conv state ``[B, C, K]`` and a
  recurrent state (Qwen3-Next's Gated DeltaNet: ``[B, H_v, d_k, d_v]``), plain variables; or a conv state
  alone (LFM2's short conv: ``cache_params.past.conv.N`` ``[B, hidden_size, conv_L_cache]``).

The layer a variable belongs to is read from the graph: the first node downstream of its ReadValue whose
name holds ``layers.N.`` (optimum-intel keeps the PyTorch module path in the node names), else the number
in ``past_key_values.N`` (simkv's own toy model), else the order of the variables. Windows are not in
the IR's state (a stateful export keeps every token; the window lives in the attention mask): they come
from the export's ``config.json`` when one lies beside the IR (``layer_types``, ``sliding_window``,
``attention_chunk_size``), so the simulated model has the right kinds; OpenVINO's policies keep every
token of a windowed layer anyway (docs/DESIGN.md §4c).

Needs only the ``openvino`` Python API (and the standard library).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from simkv.errors import ConfigError
from simkv.kvspec import LayerKV
from simkv.models import ModelSpec

__all__ = ["IRVariable", "IRLayers", "read_ir_layers"]

_LAYER_IN_NAME = re.compile(r"layers\.(\d+)\.")
_PAST_KV_INDEX = re.compile(r"past_key_values\.(\d+)\.")
#: How far downstream of a ReadValue the layer name is looked for.
_SEARCH_DEPTH = 8


@dataclass(frozen=True)
class IRVariable:
    """One state variable: its id, the model layer, its role and its static shape after the batch."""

    variable_id: str
    layer: int
    role: str  # "k", "v" (KV cache) | "conv", "recurrent" (linear-attention state)
    dims: tuple[int, ...]  # every axis after the batch; the KV sequence axis is -1

    @property
    def elements(self) -> int:
        """Elements per batch row of a state (not of a KV variable, whose length is dynamic)."""
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass
class IRLayers:
    """The IR's layers in model order, each with its variables, and the LayerKV simkv simulates."""

    variables: list[IRVariable]
    layer_kv: tuple[LayerKV, ...]
    heads: int  # query heads (of the first attention layer)
    source: str  # where the windows came from
    notes: list[str] = field(default_factory=list)

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, spec in enumerate(self.layer_kv) if spec.caches_tokens]

    @property
    def state_layers(self) -> list[int]:
        return [i for i, spec in enumerate(self.layer_kv) if spec.kind == "linear"]

    def model_spec(self, name: str = "ir") -> ModelSpec:
        """The :class:`~simkv.models.ModelSpec` simkv simulates (uniform fields from the first attention layer)."""
        first = self.layer_kv[self.attention_layers[0]]
        uniform = all(spec == first for spec in self.layer_kv)
        return ModelSpec(name=name, layers=len(self.layer_kv), heads=self.heads, kv_heads=first.kv_heads,
                         head_dim=first.k_dim, layer_kv=() if uniform and first.kind == "full" else self.layer_kv,
                         source=self.source)


def _layer_of(read_value) -> int | None:
    """Model layer of a ReadValue: the first ``layers.N.`` in a node name downstream of it."""
    seen: set[int] = set()
    frontier = [read_value]
    for _ in range(_SEARCH_DEPTH):
        nxt = []
        for node in frontier:
            for out in node.outputs():
                for target in out.get_target_inputs():
                    child = target.get_node()
                    if id(child) in seen:
                        continue
                    seen.add(id(child))
                    found = _LAYER_IN_NAME.search(child.get_friendly_name())
                    if found:
                        return int(found.group(1))
                    nxt.append(child)
        frontier = nxt
    return None


def _role(variable_id: str, dims: tuple[int, ...], kv: bool) -> str:
    low = variable_id.lower()
    if kv:  # the last of "key" / "value" in the id ("past_key_values.0.valuepresent.0.value" is V)
        k, v = low.rfind("key"), low.rfind("value")
        if max(k, v) >= 0:
            return "k" if k > v else "v"
        raise ConfigError(f"state variable {variable_id!r}: a KV variable that names neither key nor value")
    if "conv" in low or len(dims) == 2:
        return "conv"
    return "recurrent"


def _config_kinds(ir_dir: Path, layers: int) -> tuple[list[tuple[str, int | None]] | None, str]:
    """Per layer (kind, window) from the export's config.json (``text_config`` when nested), or None."""
    path = ir_dir / "config.json"
    if not path.exists():
        return None, "IR state variables (no config.json beside the IR: every attention layer full)"
    cfg = json.loads(path.read_text())
    cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
    types = cfg.get("layer_types")
    if not isinstance(types, list) or len(types) != layers:
        window = cfg.get("sliding_window")
        kind = ("sliding", window) if isinstance(window, int) and window > 0 else ("full", None)
        return [kind] * layers, f"IR state variables, {path.name} (no layer_types)"
    out: list[tuple[str, int | None]] = []
    for t in types:
        if t == "sliding_attention" and cfg.get("sliding_window"):
            out.append(("sliding", int(cfg["sliding_window"])))
        elif t == "chunked_attention" and cfg.get("attention_chunk_size"):
            out.append(("chunked", int(cfg["attention_chunk_size"])))
        elif t in ("linear_attention", "mamba", "conv"):
            out.append(("linear", None))
        else:
            out.append(("full", None))
    return out, f"IR state variables, {path.name} layer_types"


def read_ir_layers(model, ir_path: str | Path | None = None) -> IRLayers:
    """Read the layers of a stateful ``ov.Model`` (module docstring); ``ir_path``: the IR file or its
    folder, for ``config.json``. Raises :class:`~simkv.errors.ConfigError` when the variables cannot be
    read as KV pairs and linear-attention states."""
    found: list[tuple[str, int | None, bool, tuple[int, ...]]] = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "ReadValue":
            continue
        variable_id = op.get_variable_id()
        shape = op.get_output_partial_shape(0)
        if shape.rank.is_dynamic or shape.rank.get_length() < 2:
            raise ConfigError(f"state variable {variable_id!r} has shape {shape}: not a KV cache or a layer state")
        rest = [shape[i] for i in range(1, shape.rank.get_length())]
        kv = shape.rank.get_length() == 4 and rest[0].is_static and rest[1].is_dynamic and rest[2].is_static
        if not kv and not all(d.is_static for d in rest):
            raise ConfigError(f"state variable {variable_id!r} has shape {shape}: not a KV cache or a layer state")
        dims = tuple(-1 if d.is_dynamic else d.get_length() for d in rest)
        layer = _layer_of(op)
        if layer is None:
            m = _PAST_KV_INDEX.search(variable_id)
            layer = int(m.group(1)) if m else None
        found.append((variable_id, layer, kv, dims))
    if not found:
        raise ConfigError("the model has no state variables (ReadValue): not a stateful export")
    notes: list[str] = []
    if any(layer is None for _, layer, _, _ in found):
        notes.append("layers numbered by the order of the state variables (no layers.N in the graph)")
        kv_pairs = [v for v in found if v[2]]
        found = [(vid, i // 2, kv, dims) for i, (vid, _, kv, dims) in enumerate(kv_pairs)] + \
                [(vid, len(kv_pairs) // 2 + i, kv, dims) for i, (vid, _, kv, dims) in enumerate(v for v in found if not v[2])]
    by_layer: dict[int, list[IRVariable]] = defaultdict(list)
    for vid, layer, kv, dims in found:
        by_layer[layer].append(IRVariable(vid, layer, _role(vid, dims, kv), dims))
    n_layers = max(by_layer) + 1
    kinds, source = _config_kinds(Path(ir_path).parent if ir_path and Path(ir_path).suffix == ".xml"
                                  else Path(ir_path or "."), n_layers)
    heads = _query_heads(model)
    layer_kv: list[LayerKV] = []
    for i in range(n_layers):
        roles = {v.role: v for v in by_layer.get(i, [])}
        kind, window = kinds[i] if kinds else ("full", None)
        if set(roles) == {"k", "v"}:
            k, v = roles["k"], roles["v"]
            if kind == "linear":
                raise ConfigError(f"layer {i}: config.json says linear attention, the IR has a KV cache")
            if k.dims[0] != v.dims[0]:
                raise ConfigError(f"layer {i}: K has {k.dims[0]} heads, V {v.dims[0]}")
            layer_kv.append(LayerKV(kind if kind != "linear" else "full", k.dims[0], k.dims[2], v.dims[2], window))
        elif set(roles) == {"conv", "recurrent"}:
            layer_kv.append(LayerKV("linear", conv_elements=roles["conv"].elements,
                                    recurrent_elements=roles["recurrent"].elements))
        elif set(roles) == {"conv"}:  # LFM2's short conv: a conv state only (hfconfig.lfm2.lfm2_conv)
            layer_kv.append(LayerKV("linear", conv_elements=roles["conv"].elements))
        elif not roles:
            layer_kv.append(LayerKV("none"))
        else:
            raise ConfigError(f"layer {i}: state variables {sorted(roles)} are neither a K/V pair nor a conv "
                              "(+ recurrent) state (simkv models those)")
    variables = [v for i in range(n_layers) for v in sorted(by_layer.get(i, []), key=lambda v: v.role)]
    if not any(spec.caches_tokens for spec in layer_kv):
        raise ConfigError("the model has no KV cache variable")
    return IRLayers(variables, tuple(layer_kv), heads, source, notes)


def _query_heads(model) -> int:
    """Query heads: dimension 1 of the query ``[B, H, L, S]`` of the first ScaledDotProductAttention."""
    for op in model.get_ordered_ops():
        if op.get_type_name() == "ScaledDotProductAttention":
            shape = op.input(0).get_partial_shape()
            if shape.rank.is_static and shape.rank.get_length() == 4 and shape[1].is_static:
                return shape[1].get_length()
    raise ConfigError("cannot read the query heads: no ScaledDotProductAttention with a static [B, H, L, S] query")

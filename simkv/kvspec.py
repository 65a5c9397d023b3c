"""What each decoder layer keeps per sequence, and what that costs in bytes: the one place that does the sums.

A model is a list of layers, each with a :class:`LayerKV`: full attention, a sliding window of W tokens,
chunked local attention of C tokens, multi-head latent attention (MLA), a linear-attention / SSM state of
fixed size per sequence, or nothing (a layer that reuses another layer's KV, or an MLP-only layer).
Identical layers form a *group* (:func:`groups`), as vLLM's ``KVCacheSpec`` groups and transformers'
``config.layer_types`` do. A uniform model (every layer alike) is one group.

What a runtime keeps of a layer is the runtime's choice, not the layer's: a sliding layer costs its window
in vLLM and transformers but the whole context in OpenVINO (docs/DESIGN.md §3c, §4c); an MLA layer caches
the compressed latent in vLLM and transformers 5.x but decompressed per-head K and V in an optimum-intel
export. The byte functions take that choice as an argument (``mla``); window rules live in the policies.

No other module multiplies heads by head sizes: engines, policies, serving, the cost model, validation
and the dashboard ask this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from simkv.errors import ConfigError


class Precision(Protocol):
    """What the byte sums read of an element type (:class:`simkv.precision.Precision`, which imports this module)."""

    name: str
    bits: int
    meta_bytes_per_head: int

#: Layer kinds. ``full``, ``sliding`` and ``chunked`` cache K and V per token; ``linear`` keeps a
#: fixed-size state per sequence; ``none`` keeps nothing of its own.
KINDS = ("full", "sliding", "chunked", "linear", "none")
TOKEN_KINDS = ("full", "sliding", "chunked")
#: How an MLA layer is cached: the compressed latent (vLLM, transformers 5.x: keys
#: ``[B, 1, L, kv_lora_rank]``, values ``[B, 1, L, qk_rope_head_dim]``) or decompressed per-head K and V
#: (an optimum-intel export, older transformers: K ``nope + rope``, V ``v_head_dim`` per head).
MLA_FORMS = ("latent", "decompressed")
#: Bytes per element of the recurrent state when nothing else is said: transformers' torch
#: delta-rule keeps it in f32 whatever the model's dtype (docs/DESIGN.md §3c).
F32 = 4


@dataclass(frozen=True, slots=True)
class LayerKV:
    """What one layer keeps per sequence.

    Attention kinds: ``kv_heads`` heads of ``k_dim`` (keys) and ``v_dim`` (values) elements per token.
    MLA layers also give ``latent = (kv_lora_rank, qk_rope_head_dim)``; ``kv_heads``/``k_dim``/``v_dim``
    are then the decompressed per-head form. ``window``: W of a sliding layer, C of a chunked one.
    ``sinks``: learned attention sinks (gpt-oss), compute only. Linear kind: ``conv_elements`` (the
    convolution state, model dtype) and ``recurrent_elements`` per sequence; either may be 0 (LFM2's
    short-conv layers keep only a conv state: its recurrent place is then an absent slot of 0 bytes).
    ``reuses``: the layer whose KV a ``none`` layer reads (cross-layer sharing), if any.
    ``indexer = (index_n_heads, index_head_dim)``: an MLA layer's DeepSeek sparse-attention indexer (DeepSeek-V3.2,
    GLM-5), which keeps one key of ``index_head_dim`` per token beside the latent (:func:`indexer_bytes`).
    """

    kind: str = "full"
    kv_heads: int = 0
    k_dim: int = 0
    v_dim: int = 0
    window: int | None = None
    latent: tuple[int, int] | None = None
    sinks: bool = False
    conv_elements: int = 0
    recurrent_elements: int = 0
    reuses: int | None = None
    indexer: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"unknown layer kind {self.kind!r}; kinds: {', '.join(KINDS)}")
        if self.kind in TOKEN_KINDS:
            for name in ("kv_heads", "k_dim", "v_dim"):
                value = getattr(self, name)
                if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                    raise ConfigError(f"a {self.kind} layer's {name} must be a positive integer, got {value!r}")
        windowed = self.kind in ("sliding", "chunked")
        if windowed and (not isinstance(self.window, int) or self.window <= 0):
            raise ConfigError(f"a {self.kind} layer needs a positive window, got {self.window!r}")
        if not windowed and self.window is not None:
            raise ConfigError(f"a {self.kind} layer has no window (got {self.window!r})")
        if self.latent is not None and (len(self.latent) != 2 or min(self.latent) <= 0):
            raise ConfigError(f"an MLA latent is (kv_lora_rank, qk_rope_head_dim) > 0, got {self.latent!r}")
        if self.indexer is not None and (self.latent is None or len(self.indexer) != 2 or min(self.indexer) <= 0):
            raise ConfigError(f"an indexer is (index_n_heads, index_head_dim) > 0 on an MLA layer, got {self.indexer!r}")
        if self.kind == "linear" and (min(self.conv_elements, self.recurrent_elements) < 0
                                      or self.conv_elements + self.recurrent_elements <= 0):
            raise ConfigError("a linear-attention layer needs a state: conv and recurrent elements >= 0, not both 0 "
                              f"(got conv {self.conv_elements}, recurrent {self.recurrent_elements})")

    @property
    def caches_tokens(self) -> bool:
        """Whether the layer's cache grows with the sequence (attention kinds)."""
        return self.kind in TOKEN_KINDS

    def cached(self, mla: str = "latent") -> tuple[int, int, int]:
        """(heads, K elements per head, V elements per head) per token as cached; MLA by ``mla``."""
        if not self.caches_tokens:
            return 0, 0, 0
        if self.latent is not None and mla == "latent":
            rank, rope = self.latent
            return 1, rank, rope
        if mla not in MLA_FORMS:
            raise ConfigError(f"unknown MLA form {mla!r}; choose {', '.join(MLA_FORMS)}")
        return self.kv_heads, self.k_dim, self.v_dim

    def describe(self) -> str:
        if self.kind == "linear":
            if not self.recurrent_elements:
                return f"linear state: conv {self.conv_elements:,} elements (no recurrent state)"
            return f"linear state: conv {self.conv_elements:,} + recurrent {self.recurrent_elements:,} elements"
        if self.kind == "none":
            return "no cache" + (f" (reuses layer {self.reuses})" if self.reuses is not None else "")
        if self.latent is not None:
            rank, rope = self.latent
            text = (f"MLA latent {rank}+{rope} (decompressed {self.kv_heads} heads x K {self.k_dim} / V {self.v_dim})")
        else:
            dims = f"{self.k_dim}" if self.k_dim == self.v_dim else f"K {self.k_dim} / V {self.v_dim}"
            text = f"{self.kv_heads} kv heads x {dims}"
        if self.indexer is not None:
            text += f" + indexer key {self.indexer[1]}"
        window = {"sliding": f", window {self.window}", "chunked": f", chunk {self.window}"}.get(self.kind, "")
        return f"{self.kind}{window}: {text}" + (", sinks" if self.sinks else "")


def whole_bytes(elements: int, bits: int, what: str) -> int:
    """Bytes of ``elements`` values of ``bits`` each; a precision that would split a byte is refused."""
    total = elements * bits
    if total % 8:
        raise ConfigError(f"{what} needs kv_heads x head_dim to fill whole bytes ({elements} elements of {bits} bits)")
    return total // 8


def k_v_bytes(layer: LayerKV, precision: Precision, mla: str = "latent") -> tuple[int, int]:
    """Data bytes one token takes in the layer's K and in its V buffer (one batch row)."""
    heads, k_dim, v_dim = layer.cached(mla)
    what = precision.name
    return whole_bytes(heads * k_dim, precision.bits, what), whole_bytes(heads * v_dim, precision.bits, what)


#: vLLM's indexer key cache (vllm/model_executor/models/deepseek_v2.py ``Indexer.__init__``: "fp8 naive cache,
#: where we store value in fp8 and scale in fp32 per quant_block_size element", ``quant_block_size = 128``;
#: ``DeepseekV32IndexerCache(head_dim=head_dim + head_dim // quant_block_size * 4, dtype=torch.uint8)``, whose
#: ``get_kv_cache_spec`` is an ``MLAAttentionSpec`` of one head: one such vector per token per layer).
INDEXER_QUANT_BLOCK = 128
INDEXER_SCALE_BYTES = 4


def indexer_bytes(layer: LayerKV) -> int:
    """Bytes per token of an MLA layer's sparse-attention indexer key as vLLM caches it, whatever the KV cache's
    own dtype: ``index_head_dim`` fp8 bytes + one f32 scale per 128 (DeepSeek-V3.2 / GLM-5: 128 + 4 = 132); 0 for
    a layer without an indexer. simkv's other runtimes do not hold it (:meth:`simkv.precision.Precision.check`
    refuses such a model there)."""
    if layer.indexer is None:
        return 0
    dim = layer.indexer[1]
    return dim + dim // INDEXER_QUANT_BLOCK * INDEXER_SCALE_BYTES


def cached_heads(layer: LayerKV, mla: str = "latent") -> int:
    """Heads the layer's cache keeps per token (quantisation metadata is per head)."""
    return layer.cached(mla)[0]


def state_bytes(layer: LayerKV, conv_bytes: float, recurrent_bytes: float = F32) -> tuple[int, int]:
    """Bytes of a linear layer's conv and recurrent state for one sequence, at the given bytes per element."""
    return int(layer.conv_elements * conv_bytes), int(layer.recurrent_elements * recurrent_bytes)


def groups(layers: Sequence[LayerKV]) -> list[tuple[LayerKV, tuple[int, ...]]]:
    """Identical layers together, in order of first appearance: ``(spec, layer indices)``."""
    out: dict[LayerKV, list[int]] = {}
    for i, layer in enumerate(layers):
        out.setdefault(layer, []).append(i)
    return [(spec, tuple(ids)) for spec, ids in out.items()]


def token_bytes(layers: Sequence[LayerKV], precision: Precision, *, meta_per_head: int | None = None,
                mla: str = "latent") -> int:
    """Bytes one token adds across the model's attention layers when every token is kept (K + V data and
    per-head metadata; ``meta_per_head`` defaults to the precision's): what a runtime that keeps the whole
    context (OpenVINO, docs/DESIGN.md §4c) holds per token."""
    meta = precision.meta_bytes_per_head if meta_per_head is None else meta_per_head
    total = 0
    for layer in layers:
        if layer.caches_tokens:
            k, v = k_v_bytes(layer, precision, mla)
            total += k + v + 2 * cached_heads(layer, mla) * meta + indexer_bytes(layer)
    return total


def request_bytes(layers: Sequence[LayerKV], precision: Precision, context: int, *, mla: str = "latent",
                  windows: bool = True, meta_per_head: int | None = None, conv_bytes: float | None = None,
                  recurrent_bytes: float = F32) -> int:
    """Logical bytes one sequence of ``context`` tokens holds: attention layers ``min(context, W)`` tokens
    where ``windows`` (a runtime that frees what left the window), else every token; linear layers their
    state (``conv_bytes`` per conv element: default the precision's element size)."""
    meta = precision.meta_bytes_per_head if meta_per_head is None else meta_per_head
    conv = precision.bits / 8 if conv_bytes is None else conv_bytes
    total = 0
    for layer in layers:
        if layer.caches_tokens:
            k, v = k_v_bytes(layer, precision, mla)
            held = min(context, layer.window) if windows and layer.window else context
            total += held * (k + v + 2 * cached_heads(layer, mla) * meta + indexer_bytes(layer))
        elif layer.kind == "linear":
            total += sum(state_bytes(layer, conv, recurrent_bytes))
    return total


def widest_row(layers: Sequence[LayerKV], mla: str = "latent") -> int:
    """Elements of the widest attention layer's K row (heads × K head size): the CPU plugin's model-wide
    f32 past block ``[B, H_kv, L0, S]`` is one such row per token (for a uniform model, every layer's)."""
    return max((heads * k_dim for heads, k_dim, _ in (layer.cached(mla) for layer in layers if layer.caches_tokens)),
               default=0)


# --------------------------------------------------------------------------- the arithmetic of a layer (cost model)

def pair_flops(layer: LayerKV, query_heads: int, absorbed: bool = False) -> int:
    """FLOPs of one (query token, attended position) pair in an attention layer: QKᵀ and PV, one multiply-add
    (2 FLOPs) per element of a query head's key and of its value, for each of ``query_heads``:
    ``2 · query_heads · (k_dim + v_dim)``.

    An MLA layer computes either *expanded* (the latent decompressed per head: keys of qk_head_dim = ``k_dim``,
    values of ``v_dim``; vLLM's ``_forward_prefill``, transformers' ``DeepseekV3Attention.expand_kv``, a
    decompressed cache) or, with ``absorbed``, in the latent (vLLM ``_forward_decode``, the "data-movement
    friendly" path of vllm/v1/attention/backends/mla/common.py: queries absorbed through W_UK, MQA with keys of
    ``kv_lora_rank + qk_rope_head_dim`` and values of ``kv_lora_rank`` per query head)."""
    if not layer.caches_tokens:
        return 0
    if absorbed and layer.latent is not None:
        rank, rope = layer.latent
        return 2 * query_heads * (rank + rope + rank)
    return 2 * query_heads * (layer.k_dim + layer.v_dim)


def expand_flops(layer: LayerKV) -> int:
    """FLOPs of decompressing one cached position of an MLA layer (``kv_b_proj``: kv_lora_rank →
    heads × (qk_nope_head_dim + v_head_dim), one multiply-add per weight); 0 for other layers."""
    if layer.latent is None or not layer.caches_tokens:
        return 0
    rank, rope = layer.latent
    return 2 * rank * layer.kv_heads * (layer.k_dim - rope + layer.v_dim)


#: FLOPs per recurrent-state element per token of a gated delta rule step (transformers
#: ``torch_recurrent_gated_delta_rule``, per value head on its dk × dv state S): decay ``S·g`` (1), ``kv_mem =
#: Σ_k S·k`` (2), ``S += k ⊗ delta`` (2), ``out = Σ_k S·q`` (2); the O(dk + dv) vector work is left out.
DELTA_RULE_FLOPS = 7


def state_flops(layer: LayerKV) -> int:
    """FLOPs a linear-attention layer spends per token on its state: :data:`DELTA_RULE_FLOPS` per recurrent
    element, and one multiply-add per conv-state element (the depthwise causal conv1d, ``causal_conv1d_update``).
    The recurrent form for every token (a prefill's chunked kernel does more work per token: not modelled)."""
    if layer.kind != "linear":
        return 0
    return DELTA_RULE_FLOPS * layer.recurrent_elements + 2 * layer.conv_elements


# --------------------------------------------------------------------------- tensor parallelism (one device's share)

def tp_kv_heads(kv_heads: int, tp: int) -> int:
    """KV heads one of ``tp`` tensor-parallel devices caches: ``max(1, kv_heads // tp)`` — vLLM's
    ``ModelConfig.get_num_kv_heads`` ("replicate the KV heads in the case where the number of KV heads is smaller
    than the tensor parallel size"; ``QKVParallelLinear``: ``num_kv_heads = divide(total_kv_heads, tp)``, or 1 with
    ``num_kv_head_replicas = divide(tp, total_kv_heads)`` when ``tp >= total_kv_heads``; docs/research/plan-facts.md
    §2.1). Refused (one line) where vLLM's ``divide`` would fail: neither divides the other."""
    if kv_heads % tp and tp % kv_heads:
        raise ConfigError(f"--tp {tp} does not split {kv_heads} KV heads: vLLM needs the KV heads to be a multiple "
                          f"of the tensor-parallel size or the size a multiple of them (then each head is replicated)")
    return max(1, kv_heads // tp)


def _split(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise ConfigError(f"--tp {tp} does not divide {what} ({value}): vLLM splits it evenly across the devices")
    return value // tp


def tp_layers(layers: Sequence[LayerKV], tp: int) -> tuple[LayerKV, ...]:
    """What one of ``tp`` tensor-parallel devices keeps of each layer (vLLM's sharding, plan-facts §2.1):

    - full / sliding / chunked attention: :func:`tp_kv_heads` KV heads (replicated when ``kv_heads < tp``);
    - MLA: the latent is **not** divided — ``get_num_kv_heads`` is 1 for MLA and ``MLAAttentionSpec`` stores one
      ``kv_lora_rank + qk_rope_head_dim`` latent per token on every rank; the decompressed per-head form
      (``kv_heads``, the query heads) is split like the query heads (``kv_heads / tp``);
    - linear attention (Gated DeltaNet): the conv state and the recurrent state are split by heads — vLLM
      ``MambaStateShapeCalculator.gated_delta_net_state_shape``: conv ``(divide(conv_dim, tp), kernel − 1)``,
      recurrent ``(divide(num_v_heads, tp), head_v_dim, head_k_dim)``
      (vllm/model_executor/layers/mamba/mamba_utils.py @ 02d71083), so each is ``/ tp``;
    - none: unchanged (nothing kept).
    ``tp = 1`` gives the layers themselves."""
    if tp == 1:
        return tuple(layers)
    out: dict[LayerKV, LayerKV] = {}
    for layer in set(layers):
        if layer.kind == "linear":
            out[layer] = replace(layer, conv_elements=_split(layer.conv_elements, tp, "a linear layer's conv state"),
                                 recurrent_elements=_split(layer.recurrent_elements, tp,
                                                           "a linear layer's recurrent state"))
        elif layer.latent is not None:
            out[layer] = replace(layer, kv_heads=_split(layer.kv_heads, tp, "an MLA layer's heads"))
        elif layer.caches_tokens:
            out[layer] = replace(layer, kv_heads=tp_kv_heads(layer.kv_heads, tp))
        else:
            out[layer] = layer
    return tuple(out[layer] for layer in layers)

"""Tell which raw allocations of an OpenVINO CPU run belong to the KV cache, and to which layer.

Why this is not done with stack-frame names
-------------------------------------------
The PyPI build of ``libopenvino_intel_cpu_plugin.so`` is stripped and its internal
symbols are hidden: memray resolves every frame inside the plugin to ``<unknown>``, so
``updatePastkv`` / ``updateBeamTable`` never appear in a trace.  What memray *does*
give is ``native_stack_id``: one id per distinct native call stack.  The plugin
allocates each KV buffer from its own source line (``new_memory(S)`` for K and
``new_memory(SV)`` for V in ``updatePastkv``, two ``std::make_shared<Memory>`` in
``updateBeamTable``, two ``PlainTensor::resize`` for the u8/u4 scale/zero-point
buffers, and again separate lines in ``resetBeamTablePastkv``), and every layer runs
the same code, so a *call site* (stack id) is a stable name for "K data", "V beam
table", ... across layers and steps -- it only has to be labelled once.

How a call site gets its label (no capacity rule is assumed)
------------------------------------------------------------
For an allocation of ``size`` bytes made in an inference with batch ``B`` that leaves
``L`` tokens in the cache, each buffer kind implies a capacity in tokens:

* data  ``[cap, B, H_kv, S]`` of the KV element type -> ``cap = 8*size / (B*H*S*bits)``
* scale ``[cap, B, H_kv, 2]`` f32 (u8/u4 only)        -> ``cap = size / (B*H*8)``
* beam  ``[B, cap]`` i32                              -> ``cap = size / (B*4)``

A hypothesis is *valid* when ``cap`` is a whole number ``>= L`` (the buffer must hold
the state).  An allocation keeps *every* valid hypothesis: sizes coincide whenever
head size x bits <= 128 (a u4 scale buffer of ``2L`` tokens has the bytes of a head-32
u4 data buffer of ``L`` tokens; with head size x bits = 64 a data and a scale buffer of
one capacity have equal bytes), so a buffer cannot be named from its size alone.  The
layouts are those of ``scaled_attn.cpp``; the capacity itself is an *output* of the
classification, so a simulator's growth rule is tested, not assumed.

A site is labelled only from a *layer group*: consecutive ``posix_memalign`` calls (no
other ``posix_memalign`` in between) forming K/V pairs -- two calls of equal size from
two different sites, K first (the plugin always allocates K before V) -- one data pair,
one beam pair and (u8/u4) one scale pair, which must all be read at the *same*
capacity (``updateBeamTable``/``updatePastkv`` and ``resetBeamTablePastkv`` size every
buffer of a layer from the same ``2*(L0+L1)``, and decide to grow on the same
condition).  That shared capacity is what tells a scale buffer from a data buffer of
equal bytes; when both readings share it too, the data pair is the earlier one (the
plugin's order, docs/DESIGN.md §3).  Coincidences -- an activation that happens to be
a multiple of the data unit (the bf16 k projection [B,H,P,S] at prefill equals a u8
buffer of capacity 2P), oneDNN scratch pairs of 768 B that look like u8 data of
capacity 6 when P = 1 -- do not form such groups.  Once labelled, every allocation at
that site is KV, wherever it happens; the j-th allocation of a site inside one
operation is layer j (the SDPA nodes execute in layer order).

A *trim* (an operation whose ``OpContext.trim`` is set: GenAI's ``utils::trim_kv_cache``, one
``get_state`` / ``set_state`` per K and V state) allocates per state, in this order, the read-back of the
whole history (``get_state``: ``[B, H_kv, L0, S]`` in the state's external type), the cut tensor handed to
``set_state`` (``L'`` tokens, same type; kept by the state), a data buffer of exactly ``L'`` tokens, then
frees the state's old data buffer, allocates a beam table ``[B, L']`` and frees the old one
(``VariableStateKVcache::set_state_impl``, ``memory_state.cpp``). None of these come in K/V pairs, so no
site is learned from them: the free of the old data buffer (labelled by its address) names the state,
and the read-back, the cut copy and the new data before it, and the beam table after it, take its kind
and layer (``k_copy`` / ``v_copy`` for the two copies), each recognised by its size.

``past_view`` marks the one extra state-shaped buffer of the model: an f32
``[B_state, H_kv, L0, S]`` block (B_state = batch of the stored state *before* the
inference; one block for the whole model, not per layer: the MemoryInput past-KV
edges), recognised by that exact size.  It is reported so a simulator can model its
address space (it is never written), but it is not part of the cache.  It is
reallocated only when it must grow, so after a reset or a select it is reused
silently; a reused block is not re-labelled.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import permutations
from typing import Iterable, Sequence

from ..memtrace import RawRecord

__all__ = [
    "KV_KINDS",
    "COPY_KINDS",
    "KVDims",
    "OpContext",
    "SiteLabel",
    "Classification",
    "element_bits",
    "classify",
]

#: Buffer kinds a KV event can carry (plus "past_view" and "other").
KV_KINDS = ("k", "v", "k_scale", "v_scale", "k_beam", "v_beam")
#: A trim's copies of a K or V history (the read-back and the tensor the state keeps).
COPY_KINDS = ("k_copy", "v_copy")

_BITS = {"u4": 4, "i4": 4, "u8": 8, "i8": 8, "bf16": 16, "f16": 16, "f32": 32}


def element_bits(precision: str) -> int:
    """Bits per stored KV element for an effective ``kv_cache_precision`` string."""
    try:
        return _BITS[precision]
    except KeyError as exc:
        raise ValueError(f"unknown KV cache precision {precision!r}") from exc


@dataclass(frozen=True)
class KVDims:
    """What the classifier must know about the model (not about the cache policy)."""

    layers: int  # attention layers (the ones with a KV cache)
    kv_heads: int
    head_dim: int
    precision: str  # effective kv_cache_precision, e.g. "u8"
    #: Model layer of each attention layer, in order (a hybrid model's linear-attention layers have no
    #: KV cache); empty: attention layer j is model layer j.
    layer_ids: tuple[int, ...] = ()

    def model_layer(self, j: int) -> int:
        """Model layer of the j-th attention layer."""
        return self.layer_ids[j] if self.layer_ids else j

    @property
    def bits(self) -> int:
        return element_bits(self.precision)

    @property
    def quantized(self) -> bool:
        return self.bits < 16


@dataclass(frozen=True)
class OpContext:
    """Shape facts of one scenario operation (inference or reset)."""

    seq: int
    batch: int  # batch of the inputs (after a fork/select: the new width)
    past_len: int  # L0, tokens stored before the operation
    total_len: int  # L0 + L1 after the operation (0 after a reset; L' after a trim)
    state_batch: int = 0  # batch of the stored state before the operation (0: same as batch)
    trim: bool = False  # a trim: get_state / set_state of every K and V state (module docstring)

    @property
    def past_batch(self) -> int:
        return self.state_batch or self.batch


@dataclass(frozen=True)
class SiteLabel:
    kind: str
    first_seen_seq: int


@dataclass
class Classification:
    """Per-record labels, parallel to the input record list."""

    kinds: list[str]
    layers: list[int | None]
    capacities: list[int | None]  # implied capacity (tokens) of KV allocations
    sites: dict[int, SiteLabel]
    warnings: list[str] = field(default_factory=list)


_UNIT_OF_KIND = {"k": "data", "v": "data", "k_scale": "scale", "v_scale": "scale", "k_beam": "beam", "v_beam": "beam"}


def _units(batch: int, dims: KVDims) -> dict[str, Fraction]:
    """Bytes per token of capacity of each buffer family (layouts: module docstring)."""
    h, s = dims.kv_heads, dims.head_dim
    units = {"data": Fraction(batch * h * s * dims.bits, 8), "beam": Fraction(batch * 4)}
    if dims.quantized:
        units["scale"] = Fraction(batch * h * 2 * 4)
    return units


def _hypotheses(size: int, ctx: OpContext, dims: KVDims) -> dict[str, int]:
    """Every buffer family an allocation of ``size`` bytes could be, with the capacity
    it implies: a whole number of tokens that holds the state (``>= L``).

    All readings are kept, not only the smallest: sizes coincide (a u4 scale buffer of
    ``2L`` tokens has the bytes of a head-32 data buffer of ``L`` tokens; with
    head size x bits = 64 a data and a scale buffer of the same capacity have the same
    bytes), and only the layer's group (one capacity for all its buffers) decides."""
    out: dict[str, int] = {}
    for family, unit in _units(ctx.batch, dims).items():
        cap = Fraction(size) / unit
        if cap.denominator == 1 and cap >= max(ctx.total_len, 1):
            out[family] = int(cap)
    return out


def _capacity(kind: str, size: int, ctx: OpContext, dims: KVDims) -> int | None:
    """Capacity (tokens) of a buffer whose kind is known; None if the size does not fit."""
    cap = Fraction(size) / _units(ctx.batch, dims)[_UNIT_OF_KIND[kind]]
    return int(cap) if cap.denominator == 1 else None


_PAIR_KINDS = {"data": ("k", "v"), "scale": ("k_scale", "v_scale"), "beam": ("k_beam", "v_beam")}


def _read_group(pairs: list[tuple[dict[str, int], RawRecord, RawRecord]], families: tuple[str, ...]) -> list[str] | None:
    """The families of a layer's consecutive K/V pairs, or None if they are not one layer.

    One family per pair, each family once, and one capacity shared by every pair
    (``updateBeamTable``/``updatePastkv``/``resetBeamTablePastkv`` size all buffers of a
    layer from the same ``2*(L0+L1)``).  When two readings remain (a data and a scale
    buffer of equal bytes), the one with data first is taken: in every order the plugin
    uses, a layer allocates its data pair before its scale pair (docs/DESIGN.md §3)."""
    caps = set.intersection(*(set(h.values()) for h, _, _ in pairs))
    for cap in sorted(caps):
        readings = [
            list(perm)
            for perm in permutations(families)
            if all(h.get(family) == cap for (h, _, _), family in zip(pairs, perm))
        ]
        if readings:
            data_first = [r for r in readings if "scale" not in r or r.index("data") < r.index("scale")]
            return (data_first or readings)[0]
    return None


def _discover_sites(
    records: Sequence[RawRecord], contexts: dict[int, OpContext], dims: KVDims, warnings: list[str]
) -> dict[int, SiteLabel]:
    """Label call sites from layer groups of K/V pairs (see module docstring).

    A group is ``2`` (``3`` with scales) consecutive pairs of ``posix_memalign`` calls:
    equal sizes, two different sites, K first.  A site that two groups label
    differently is dropped (reported in ``warnings``)."""
    labels: dict[int, SiteLabel] = {}
    conflicted: set[int] = set()
    by_seq: dict[int, list[tuple[RawRecord, dict[str, int]]]] = defaultdict(list)
    for rec in records:
        if rec.op == "alloc" and rec.allocator == "POSIX_MEMALIGN":
            by_seq[rec.seq].append((rec, _hypotheses(rec.size, contexts[rec.seq], dims)))
    shapes = [("data", "beam", "scale"), ("data", "beam")] if dims.quantized else [("data", "beam")]

    for seq, stream in sorted(by_seq.items()):
        i = 0
        while i < len(stream):
            for families in shapes:
                n = len(families)
                if i + 2 * n > len(stream):
                    continue
                pairs = []
                for j in range(i, i + 2 * n, 2):
                    (a, ha), (b, hb) = stream[j], stream[j + 1]
                    common = {f: c for f, c in ha.items() if hb.get(f) == c}
                    if not common or a.size != b.size or a.site == b.site:
                        break
                    pairs.append((common, a, b))
                sites = [r.site for _, a, b in pairs for r in (a, b)]
                reading = _read_group(pairs, families) if len(pairs) == n and len(set(sites)) == len(sites) else None
                if reading is not None:
                    break
            else:
                i += 1
                continue
            for family, (_, a, b) in zip(reading, pairs):
                for rec, name in zip((a, b), _PAIR_KINDS[family]):
                    old = labels.get(rec.site)
                    if old is None:
                        labels[rec.site] = SiteLabel(name, seq)
                    elif old.kind != name:
                        conflicted.add(rec.site)
                        warnings.append(
                            f"site {rec.site} labelled {old.kind} (seq {old.first_seen_seq}) and {name} (seq {seq})"
                        )
            i += 2 * len(reading)
    return {site: label for site, label in labels.items() if site not in conflicted}


def classify(records: Sequence[RawRecord], contexts: Iterable[OpContext], dims: KVDims) -> Classification:
    """Label every record with a kind, a layer and (for KV allocations) the implied capacity."""
    ctx = {c.seq: c for c in contexts}
    warnings: list[str] = []
    sites = _discover_sites(records, ctx, dims, warnings)

    kinds: list[str] = []
    layers: list[int | None] = []
    caps: list[int | None] = []
    per_seq_site_count: dict[tuple[int, int], int] = defaultdict(int)
    per_seq_site_total: dict[tuple[int, int], int] = defaultdict(int)
    for rec in records:
        if rec.op == "alloc" and rec.site in sites:
            per_seq_site_total[(rec.seq, rec.site)] += 1
    for (seq, site), n in sorted(per_seq_site_total.items()):
        if n != dims.layers:
            warnings.append(f"seq {seq}: site {site} ({sites[site].kind}) allocated {n}x for {dims.layers} layers")

    by_address: dict[int, tuple[str, int | None, int | None]] = {}
    trim = _TrimReader(dims)
    for rec in records:
        c = ctx[rec.seq]
        if rec.op == "free":
            kind, layer, cap = by_address.pop(rec.address, ("other", None, None))
            kinds.append(kind)
            layers.append(layer)
            caps.append(cap)
            if c.trim:
                trim.freed(rec, kind, layer, c, kinds, layers, caps, by_address)
            continue
        kind, layer, cap = "other", None, None
        if c.trim:
            kind, layer, cap = trim.allocated(len(kinds), rec, c)
        elif rec.site in sites:
            kind = sites[rec.site].kind
            key = (rec.seq, rec.site)
            if per_seq_site_total[key] == dims.layers:
                layer = dims.model_layer(per_seq_site_count[key])
            per_seq_site_count[key] += 1
            cap = _capacity(kind, rec.size, c, dims)
        elif (
            rec.allocator == "POSIX_MEMALIGN"
            and c.past_len > 0
            and rec.size == c.past_batch * dims.kv_heads * c.past_len * dims.head_dim * 4
        ):
            kind = "past_view"
        by_address[rec.address] = (kind, layer, cap)
        kinds.append(kind)
        layers.append(layer)
        caps.append(cap)
    warnings.extend(trim.warnings)
    return Classification(kinds, layers, caps, sites, warnings)


class _TrimReader:
    """Labels a trim's allocations (module docstring): the read-back, the cut copy and the new data wait for
    the free of the old data buffer that names their state; the beam table after it takes that state's name."""

    def __init__(self, dims: KVDims) -> None:
        self.dims = dims
        self.pending: list[tuple[int, int, int, str]] = []  # (record index, address, capacity, role)
        self.state: tuple[str, int | None] | None = None  # (k | v, layer) of the state being set
        self.io = 0  # bytes per element of the read-back (the state's external type)
        self.warnings: list[str] = []

    def _elements(self, tokens: int, c: OpContext) -> int:
        return c.past_batch * self.dims.kv_heads * self.dims.head_dim * tokens

    def allocated(self, index: int, rec: RawRecord, c: OpContext) -> tuple[str, int | None, int | None]:
        kept, whole = c.total_len, c.past_len
        per_token = self._elements(1, c)
        if (rec.allocator == "POSIX_MEMALIGN" and whole and rec.size % (per_token * whole) == 0
                and rec.size // (per_token * whole) in (2, 4)):  # the read-back of the whole history (f16 or f32)
            self.state, self.io = None, rec.size // (per_token * whole)
            self.pending.append((index, rec.address, whole, "copy"))
        elif self.pending and rec.size == per_token * kept * self.io:  # the cut tensor set_state keeps
            self.pending.append((index, rec.address, kept, "copy"))
        elif self.pending and rec.allocator == "POSIX_MEMALIGN" and rec.size == per_token * kept * self.dims.bits // 8:
            self.pending.append((index, rec.address, kept, "data"))
        elif self.state is not None and rec.allocator == "POSIX_MEMALIGN" and rec.size == c.past_batch * kept * 4:
            kind, layer = self.state
            self.state = None
            return kind + "_beam", layer, kept
        return "other", None, None

    def freed(self, rec: RawRecord, kind: str, layer: int | None, c: OpContext, kinds, layers, caps, by_address) -> None:
        if kind not in ("k", "v") or not self.pending:
            return
        for index, address, cap, role in self.pending:
            name = kind if role == "data" else kind + "_copy"
            kinds[index], layers[index], caps[index] = name, layer, cap
            if address in by_address:
                by_address[address] = (name, layer, cap)
        if sum(role == "data" for *_, role in self.pending) != 1:
            self.warnings.append(f"seq {rec.seq}: trim of {kind} layer {layer} without one new data buffer")
        self.pending = []
        self.state = (kind, layer)

"""Run a stateful-decoding scenario on a compiled OpenVINO CPU model and observe its KV memory.

This is the *observation* half of ``simkv validate``: it produces the ground truth a
simulator's ledger is compared with, event by event.  For every scenario operation
(prefill, decode step, chat turn, reset, beam fork / reorder / select) it records

* every allocator call the process made during that operation (memray; see
  :mod:`..memtrace`), with exact size and address, classified as K / V data,
  K / V scale-zero-point, K / V beam table, ``past_view``, a linear-attention layer's
  ``conv_state`` / ``recurrent_state`` buffer, or ``other``, with the layer when it can be
  inferred (see :mod:`.kvclassify`, :mod:`.statebufs`);
* RSS, VmSize and the RSS high-water mark of the operation (``/proc/self/status``;
  VmHWM is reset before each operation by writing "5" to ``/proc/self/clear_refs``);
* the operation's wall-clock latency.

Steps: ``step`` is the inference index (0 = first prefill, +1 per inference).  A
``reset_state()`` is an operation of its own (``phase="reset"``) that carries the
step number the *next* inference will get; ``seq`` numbers all operations.

One module (~620 lines) because the scenario it drives, the allocator stream it records and the
per-operation samples it takes are interleaved in one loop (:func:`observe`): a step marker, an
inference and a sample must stay in lockstep, and the data classes around it are that loop's results.

Caveats worth knowing before reading numbers: with memray on, latency includes
unwinding every allocation and RSS includes memray's buffers -- run with
``tracker="none"`` for clean latency/RSS.  glibc serves allocations below
``M_MMAP_THRESHOLD`` from its heap, whose slack makes RSS a staircase; start Python
with ``MALLOC_MMAP_THRESHOLD_=65536`` for RSS that follows written bytes (recorded in
``RunFacts.malloc_env``).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import numpy as np
import openvino as ov

from ..memtrace import RawRecord, Recorder, TraceSummary, read_segments
from ..memtrace import proc_status as _proc_status
from ..memtrace import reset_hwm as _reset_hwm
from .kvclassify import COPY_KINDS, KV_KINDS, Classification, KVDims, OpContext, classify
from .ovmodel import RuntimeInspection, inspect_runtime, require_fused
from .statebufs import STATE_KINDS, StateVar, buffer_signature, identify, value_signature

#: Kinds of cache events: KV buffers, a hybrid model's linear-attention state buffers, a trim's copies.
CACHE_KINDS = KV_KINDS + STATE_KINDS + COPY_KINDS

__all__ = [
    "Op",
    "Scenario",
    "AllocEvent",
    "StepSample",
    "RunFacts",
    "Observation",
    "kv_dims_from_model",
    "query_heads_from_model",
    "observe",
    "cpu_flags",
]

PHASES = ("prefill", "decode", "chat", "fork", "reorder", "select", "reset", "trim")


# --------------------------------------------------------------------------- scenario


@dataclass(frozen=True)
class Op:
    """One scenario operation.

    ``prefill``: T prompt tokens on an empty (fresh or reset) state; batch 1 unless
    ``beam_idx`` is ``range(batch)``.  ``decode``: one token per beam.  ``chat``: T tokens appended to the stored
    history (a user turn).  ``fork``/``reorder``/``select``: one decode token per beam
    with an explicit ``beam_idx``; the new batch is ``len(beam_idx)``.  ``reset``:
    ``request.reset_state()``, no inference.  ``trim``: T tokens cut off the stored history as
    GenAI's ``utils::trim_kv_cache`` does (:func:`trim_states`), no inference.
    """

    phase: str
    tokens: int = 1
    beam_idx: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"unknown phase {self.phase!r}")
        if self.phase != "reset" and self.tokens < 1:
            raise ValueError("an inference or a trim needs at least one token")


class Scenario:
    """Fluent builder of an operation list: ``Scenario().prefill(32).decode(300)``."""

    def __init__(self, ops: Iterable[Op] = ()) -> None:
        self.ops: list[Op] = list(ops)

    def prefill(self, tokens: int, batch: int = 1) -> "Scenario":
        """A prompt of ``tokens`` tokens (per row) on an empty state (start or after reset)."""
        self.ops.append(Op("prefill", tokens, tuple(range(batch)) if batch != 1 else None))
        return self

    def decode(self, steps: int) -> "Scenario":
        self.ops.extend(Op("decode", 1) for _ in range(steps))
        return self

    def chat(self, tokens: int) -> "Scenario":
        self.ops.append(Op("chat", tokens))
        return self

    def reset(self) -> "Scenario":
        self.ops.append(Op("reset", 0))
        return self

    def trim(self, tokens: int) -> "Scenario":
        """Cut the last ``tokens`` tokens off the stored history (GenAI's chat-history trim)."""
        self.ops.append(Op("trim", tokens))
        return self

    def fork(self, width: int) -> "Scenario":
        """Batch 1 -> ``width`` beams, all copies of beam 0 (``beam_idx=[0]*width``)."""
        self.ops.append(Op("fork", 1, (0,) * width))
        return self

    def reorder(self, beam_idx: Sequence[int]) -> "Scenario":
        """Same width, beams permuted/duplicated by ``beam_idx``."""
        self.ops.append(Op("reorder", 1, tuple(beam_idx)))
        return self

    def select(self, beam: int) -> "Scenario":
        """Width -> 1 keeping ``beam`` (``beam_idx=[beam]``)."""
        self.ops.append(Op("select", 1, (beam,)))
        return self

    def __len__(self) -> int:
        return len(self.ops)

    def describe(self) -> str:
        """Compact text form, e.g. ``prefill(32) -> decode x300 -> fork([0, 0])``."""
        parts: list[tuple[str, int]] = []
        for op in self.ops:
            if op.phase in ("decode", "reset"):
                label = op.phase
            elif op.phase == "prefill":
                label = f"prefill({op.tokens}" + (f", batch={len(op.beam_idx)})" if op.beam_idx else ")")
            elif op.phase in ("chat", "trim"):
                label = f"{op.phase}({op.tokens})"
            else:
                label = f"{op.phase}({list(op.beam_idx or ())})"
            if parts and parts[-1][0] == label:
                parts[-1] = (label, parts[-1][1] + 1)
            else:
                parts.append((label, 1))
        return " -> ".join(lbl if n == 1 else f"{lbl} x{n}" for lbl, n in parts)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class AllocEvent:
    """One allocation or free observed inside an operation, in stream order."""

    index: int  # position among all returned events
    seq: int  # operation index
    step: int  # inference index (reset: index of the next inference)
    phase: str
    op: str  # "alloc" | "free"
    bytes: int
    address: int
    kind: str  # k v k_scale v_scale k_beam v_beam conv_state recurrent_state past_view other
    layer: int | None
    capacity: int | None  # tokens the buffer holds (KV allocations and their frees)
    site: int  # memray native_stack_id of the allocation (call-site fingerprint)
    allocator: str
    thread: int

    @property
    def is_kv(self) -> bool:
        """A cache buffer: K/V data, scales, beam tables, or a linear-attention state."""
        return self.kind in CACHE_KINDS


@dataclass(frozen=True)
class StepSample:
    """Per-operation process measurements."""

    seq: int
    step: int
    phase: str
    batch: int
    tokens: int  # new tokens per beam (0 for reset)
    past_len: int  # L0 before
    total_len: int  # L0 + L1 after (0 after reset)
    latency_s: float
    rss_bytes: int
    vmsize_bytes: int
    hwm_bytes: int | None  # peak RSS during the operation (None if clear_refs failed)
    kv_live_bytes: int | None = None  # live K/V/scale/beam bytes after the op (tracked runs)


@dataclass
class RunFacts:
    openvino_version: str
    memray_version: str | None
    python_version: str
    cpu_model: str
    cpu_flags: dict[str, bool]
    requested: dict[str, str]
    kv_cache_precision: str | None
    inference_precision: str | None
    fused: bool
    layers: int
    kv_heads: int
    head_dim: int
    tracker: str
    scenario: str
    malloc_env: dict[str, str]
    trace: dict[str, int] = field(default_factory=dict)
    kv_sites: dict[int, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class Observation:
    events: list[AllocEvent]
    samples: list[StepSample]
    facts: RunFacts

    def kv_events(self, include_view: bool = False) -> list[AllocEvent]:
        keep = set(CACHE_KINDS) | ({"past_view"} if include_view else set())
        return [e for e in self.events if e.kind in keep]

    def events_by_seq(self, kv_only: bool = True) -> dict[int, list[AllocEvent]]:
        out: dict[int, list[AllocEvent]] = {}
        for e in self.kv_events() if kv_only else self.events:
            out.setdefault(e.seq, []).append(e)
        return out

    def signature(self, include_view: bool = True) -> list[tuple]:
        """Address- and site-free KV event sequence; equal for equal runs (determinism)."""
        return [
            (e.seq, e.step, e.phase, e.op, e.bytes, e.kind, e.layer, e.capacity)
            for e in self.kv_events(include_view)
        ]

    def to_dict(self) -> dict:
        return {
            "facts": asdict(self.facts),
            "samples": [asdict(s) for s in self.samples],
            "events": [asdict(e) for e in self.events],
        }


# --------------------------------------------------------------------------- helpers


def cpu_flags() -> tuple[str, dict[str, bool]]:
    """CPU model and the flags that decide the CPU plugin's default precisions."""
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name") and model in ("unknown", "", "x86_64"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "avx512_vnni")
    return model, {f: f in flags for f in wanted}


def kv_dims_from_model(model: ov.Model, kv_cache_precision: str) -> KVDims:
    """Attention layers, KV heads and head size read from the model's KV state variables
    (:func:`~.irspec.read_ir_layers`: ``[B, H_kv, L, S]`` with static H_kv and S; a hybrid model's
    linear-attention states are not KV), with each attention layer's model layer."""
    from simkv.errors import ConfigError

    from .irspec import read_ir_layers

    try:
        layers = read_ir_layers(model)
    except ConfigError as err:
        raise ValueError(str(err)) from None
    attention = layers.attention_layers
    shapes = {(layers.layer_kv[i].kv_heads, layers.layer_kv[i].k_dim, layers.layer_kv[i].v_dim) for i in attention}
    if len(shapes) != 1 or len({d for _, k, v in shapes for d in (k, v)}) != 1:
        raise ValueError(f"KV state variables differ in shape: {sorted(shapes)}")
    h, s, _ = shapes.pop()
    ids = tuple(attention) if attention != list(range(len(attention))) else ()
    return KVDims(layers=len(attention), kv_heads=h, head_dim=s, precision=kv_cache_precision, layer_ids=ids)


def state_vars_from_model(model: ov.Model, precision: str | None) -> list[StateVar]:
    """The linear-attention state variables of ``model`` with their row bytes in ``precision`` (the
    element type the plugin keeps them in: :attr:`~.ovmodel.RuntimeInspection.state_precision`)."""
    from .irspec import read_ir_layers

    variables = [v for v in read_ir_layers(model).variables if v.role in ("conv", "recurrent")]
    if not variables:
        return []
    size = {"bf16": 2, "f16": 2, "f32": 4}.get(precision or "")
    if size is None:
        raise ValueError(f"linear-attention states kept in {precision!r}: simkv reads bf16, f16 or f32")
    return [StateVar(v.variable_id, v.layer, "conv_state" if v.role == "conv" else "recurrent_state",
                     v.elements * size) for v in variables]


def query_heads_from_model(model: ov.Model) -> int:
    """Query heads of the model: dimension 1 of the query ([B, H, L, S]) of its first
    ``ScaledDotProductAttention`` op, as optimum-intel exports it (and as
    :func:`~simkv.validate.openvino.ovmodel.build_stateful_decoder` builds it)."""
    for op in model.get_ordered_ops():
        if op.get_type_name() == "ScaledDotProductAttention":
            shape = op.input(0).get_partial_shape()
            if shape.rank.is_static and shape.rank.get_length() == 4 and shape[1].is_static:
                return shape[1].get_length()
    raise ValueError("cannot read the query heads: no ScaledDotProductAttention with a static [B, H, L, S] query")


class _Feeder:
    """Makes the four optimum-style inputs for each inference and tracks L and B.

    The inputs are views of buffers allocated (and touched) once for the longest
    inference of the scenario and passed to OpenVINO with ``shared_memory=True``:
    fresh arrays of growing size every step (the attention mask grows by one column per
    token), copied into fresh OpenVINO tensors, fragment the heap and add RSS that has
    nothing to do with the KV cache.
    """

    def __init__(self, vocab: int, seed: int, ops: Sequence[Op] = (), position_ids: bool = True) -> None:
        self.vocab = vocab
        self.position_ids = position_ids  # Qwen3-Next's export computes positions from the mask
        self.rng = np.random.default_rng(seed)
        self.batch = 1
        self.length = 0
        rows = tokens = mask = 1
        batch, length = 1, 0
        for op in ops:
            if op.phase == "reset":
                batch, length = 1, 0
                continue
            if op.phase == "trim":
                length -= op.tokens
                continue
            b = len(op.beam_idx) if op.beam_idx is not None else (1 if op.phase == "prefill" else batch)
            rows, tokens = max(rows, b), max(tokens, b * op.tokens)
            mask = max(mask, b * (length + op.tokens))
            batch, length = b, length + op.tokens
        self._ids = np.zeros(tokens, dtype=np.int64)
        self._pos = np.zeros(tokens, dtype=np.int64)
        self._mask = np.ones(mask, dtype=np.int64)
        self._beam = np.zeros(max(rows, 1), dtype=np.int32)
        for buf in (self._ids, self._pos, self._mask, self._beam):
            buf.view(np.uint8)[:] = buf.view(np.uint8)  # make every page resident now

    @staticmethod
    def _view(buf: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape))
        if n > len(buf):  # an operation longer than announced: a fresh array
            return np.empty(shape, dtype=buf.dtype)
        return buf[:n].reshape(shape)

    def inputs(self, op: Op) -> dict[str, np.ndarray]:
        if op.phase == "prefill":
            if self.length:
                raise ValueError("prefill needs an empty state: add reset() before a new prompt")
            beam_idx = range(len(op.beam_idx) if op.beam_idx else 1)
        else:
            if not self.length:
                raise ValueError(f"{op.phase} needs a stored history: start with prefill()")
            beam_idx = op.beam_idx if op.beam_idx is not None else range(self.batch)
        if op.phase != "prefill" and op.beam_idx is not None and max(op.beam_idx) >= self.batch:
            raise ValueError(f"beam_idx {list(op.beam_idx)} out of range for batch {self.batch}")
        b, t, l0 = len(beam_idx), op.tokens, self.length
        ids = self._view(self._ids, (b, t))
        ids[...] = self.rng.integers(0, self.vocab, size=(b, t), dtype=np.int64)
        pos = self._view(self._pos, (b, t))
        pos[...] = np.arange(l0, l0 + t, dtype=np.int64)
        mask = self._view(self._mask, (b, l0 + t))
        mask[...] = 1
        beam = self._view(self._beam, (b,))
        beam[...] = np.asarray(beam_idx, dtype=np.int32)
        feed = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "beam_idx": beam}
        if not self.position_ids:
            del feed["position_ids"]
        return feed

    def advance(self, op: Op, batch: int) -> None:
        if op.phase == "reset":
            self.length = 0
        elif op.phase == "trim":
            self.length -= op.tokens
        else:
            self.length += op.tokens
            self.batch = batch


# --------------------------------------------------------------------------- observe


def observe(
    compiled: ov.CompiledModel,
    scenario: Scenario,
    dims: KVDims | None = None,
    model: ov.Model | None = None,
    tracker: str = "memray",
    trace_path: str | None = None,
    other_min_bytes: int = 4096,
    vocab: int | None = None,
    seed: int = 0,
    progress: bool = True,
    inspection: RuntimeInspection | None = None,
    states: Sequence[StateVar] | None = None,
) -> Observation:
    """Run ``scenario`` on ``compiled`` (one infer request) and return what happened.

    ``dims`` (layers, kv heads, head size, effective precision) is needed to classify
    events; it is derived from ``model`` and the runtime model when not given.
    ``tracker``: "memray" (events + samples) or "none" (samples only, clean latency).
    ``other_min_bytes``: non-KV events smaller than this are not returned (0 returns
    every allocator call; a long run then holds millions of events).  Every
    ``posix_memalign`` call is still read, because the classifier needs them all.
    ``inspection``: the result of :func:`~simkv.validate.openvino.ovmodel.compile_checked`
    (keeps the requested hints in the facts); re-read from ``compiled`` when omitted.
    ``states``: a hybrid model's linear-attention state variables (default: read from ``model``).
    Their buffers are found by content (:mod:`.statebufs`): after the scenario, two more one-token
    inferences run untracked and every live buffer is compared with the states' values.
    Raises :class:`~simkv.validate.openvino.ovmodel.NotFusedError` if the model is not fused.
    """
    if tracker not in ("memray", "none"):
        raise ValueError("tracker must be 'memray' or 'none'")
    inspection = require_fused(inspection or inspect_runtime(compiled))
    if dims is None:
        if model is None:
            raise ValueError("give dims or the ov.Model the compiled model was built from")
        dims = kv_dims_from_model(model, inspection.kv_cache_precision or "u8")
    if vocab is None:
        vocab = _vocab_of(compiled)

    request = compiled.create_infer_request()
    feeder = _Feeder(vocab, seed, scenario.ops,
                     position_ids=any("position_ids" in i.get_names() for i in compiled.inputs))
    if states is None:
        states = state_vars_from_model(model, inspection.state_precision) if model is not None else []
    # Per-operation bookkeeping goes into one array allocated and written *before* the
    # run: appending a Python dict per step (~700 B) would itself grow RSS by ~700 B per
    # token, which on a small model is a sizeable share of the KV growth being measured.
    table = _sample_table(len(scenario.ops))
    n_infer = sum(op.phase not in ("reset", "trim") for op in scenario.ops)
    bar = _progress(n_infer, progress)
    recorder = Recorder(trace_path, enabled=tracker == "memray")
    step = 0
    try:
        with recorder:
            for seq, op in enumerate(scenario.ops):
                past = feeder.length
                if op.phase in ("reset", "trim"):
                    batch, tensors = feeder.batch, None
                else:
                    arrays = feeder.inputs(op)
                    past = feeder.length
                    batch = arrays["input_ids"].shape[0]
                    tensors = {k: ov.Tensor(v, shared_memory=True) for k, v in arrays.items()}
                    for name, tensor in tensors.items():
                        request.set_tensor(name, tensor)
                hwm_ok = _reset_hwm()
                with recorder.operation(seq):
                    t0 = time.perf_counter()
                    if op.phase == "trim":
                        trim_states(request, op.tokens)
                    elif tensors is None:
                        request.reset_state()
                    else:
                        request.infer(share_outputs=True)
                    latency = time.perf_counter() - t0
                status = _proc_status()
                state_batch = feeder.batch
                feeder.advance(op, batch)
                row = table[seq]
                row["step"] = step
                row["phase"] = PHASES.index(op.phase)
                row["batch"] = batch
                row["state_batch"] = state_batch
                row["tokens"] = 0 if tensors is None else op.tokens  # a trim appends nothing
                row["past_len"] = past
                row["total_len"] = feeder.length
                row["latency_s"] = latency
                row["rss_bytes"] = status.get("VmRSS", 0)
                row["vmsize_bytes"] = status.get("VmSize", 0)
                row["hwm_bytes"] = status.get("VmHWM", -1) if hwm_ok else -1
                if tensors is not None:
                    step += 1
                    bar.update(1)
        bar.close()
        raw_samples = _samples_from_table(table)
        contexts = [
            OpContext(s["seq"], s["batch"], s["past_len"], s["total_len"], int(table[s["seq"]]["state_batch"]),
                      trim=s["phase"] == "trim")
            for s in raw_samples
        ]
        events, summary, classification = [], TraceSummary(), None
        if tracker == "memray":
            snapshots = _state_snapshots(request, feeder, states) if states else []
            trims = frozenset(seq for seq, op in enumerate(scenario.ops) if op.phase == "trim")
            records, summary = read_segments(recorder.path, len(scenario.ops), keep_min_bytes=other_min_bytes,
                                             keep_all_in=trims)
            classification = classify(records, contexts, dims)
            if states:
                _label_states(records, classification, states, snapshots, state_precision=inspection.state_precision)
            events = _events(records, classification, raw_samples, other_min_bytes)
    finally:
        recorder.cleanup()

    samples = _with_kv_live(raw_samples, events if tracker == "memray" else None)
    facts = _facts(inspection, dims, tracker, scenario, summary, classification)
    return Observation(events, samples, facts)



def trim_states(request, tokens: int, seq_axis: int = 2) -> None:
    """Cut ``tokens`` tokens off every state as GenAI's ``utils::trim_kv_cache`` does (openvino.genai
    da1db864, ``src/cpp/src/utils.cpp``): per state of ``query_state()``, ``get_state()``, an ROI of the kept
    tokens, a new tensor of that shape, ``copy_to``, ``set_state``; the read-back and the handles are dropped at
    the end of each state, as the C++ loop's scope does (the state keeps the tensor it was set to)."""
    for state in request.query_state():
        old = state.state
        shape = list(old.shape)
        shape[seq_axis] -= tokens
        cut = ov.Tensor(old, ov.Coordinate([0] * len(shape)), ov.Coordinate(shape))
        new = ov.Tensor(old.element_type, ov.Shape(shape))
        cut.copy_to(new)
        state.state = new
        del old, cut, new


def _state_snapshots(request, feeder: "_Feeder", states: Sequence[StateVar]) -> list[dict[str, np.ndarray]]:
    """Two more one-token inferences, untracked, each followed by the states' values: afterwards one of a
    state's two buffers holds the second value, the other the first (docs/DESIGN.md §4c)."""
    wanted = {s.name for s in states}
    out = []
    for _ in range(2):
        op = Op("decode", 1) if feeder.length else Op("prefill", 1)
        arrays = feeder.inputs(op)
        for name, value in arrays.items():  # fresh tensors: the scenario's shared views may be too small
            request.set_tensor(name, ov.Tensor(np.array(value)))
        request.infer()
        feeder.advance(op, arrays["input_ids"].shape[0])
        out.append({st.name: np.array(st.state.data) for st in request.query_state() if st.name in wanted})
    return out


def _label_states(records, classification: Classification, states: Sequence[StateVar],
                  snapshots: list[dict[str, np.ndarray]], state_precision: str | None) -> None:
    """Mark the state buffers among ``records`` in ``classification`` (kind, model layer), in place."""
    import ctypes

    signatures = [(name, len(value_signature(value, state_precision or "f32")), value_signature(value, state_precision or "f32"))
                  for snap in snapshots for name, value in snap.items()]

    def matcher(address: int, size: int) -> set[str]:
        names = set()
        for name, nbytes, sig in signatures:
            if nbytes <= size and buffer_signature(ctypes.string_at(address, nbytes), state_precision or "f32") == sig:
                names.add(name)
        return names

    found = identify(records, states, matcher)
    for i, (kind, layer) in found.labels.items():
        if classification.kinds[i] not in ("other", "past_view", kind):  # content outranks size
            classification.warnings.append(f"record {i}: a {classification.kinds[i]} buffer holds state {kind} of layer {layer}")
            continue
        classification.kinds[i] = kind
        classification.layers[i] = layer
        classification.capacities[i] = None
    classification.warnings.extend(found.warnings)


_SAMPLE_DTYPE = np.dtype(
    [
        ("step", np.int64),
        ("phase", np.int8),
        ("batch", np.int64),
        ("state_batch", np.int64),
        ("tokens", np.int64),
        ("past_len", np.int64),
        ("total_len", np.int64),
        ("latency_s", np.float64),
        ("rss_bytes", np.int64),
        ("vmsize_bytes", np.int64),
        ("hwm_bytes", np.int64),  # -1: VmHWM could not be reset
    ]
)


def _sample_table(n: int) -> np.ndarray:
    """A zeroed, already-resident table of ``n`` per-operation rows."""
    table = np.empty(n, dtype=_SAMPLE_DTYPE)
    table.view(np.uint8)[:] = 0  # touch every page now, not during the run
    return table


def _samples_from_table(table: np.ndarray) -> list[dict]:
    out = []
    for seq, row in enumerate(table.tolist()):
        step, phase, batch, _state_batch, tokens, past, total, latency, rss, vmsize, hwm = row
        out.append(
            dict(
                seq=seq,
                step=step,
                phase=PHASES[phase],
                batch=batch,
                tokens=tokens,
                past_len=past,
                total_len=total,
                latency_s=latency,
                rss_bytes=rss,
                vmsize_bytes=vmsize,
                hwm_bytes=None if hwm < 0 else hwm,
            )
        )
    return out


def _vocab_of(compiled: ov.CompiledModel) -> int:
    shape = compiled.output("logits").get_partial_shape()
    last = shape[shape.rank.get_length() - 1]
    return last.get_length() if last.is_static else 1000


def _progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc="simkv observe", unit="inf", disable=not enabled, leave=False)
    except ImportError:  # pragma: no cover - tqdm is a declared dependency
        class _Null:
            def update(self, n: int) -> None: ...
            def close(self) -> None: ...

        return _Null()


def _events(
    records: list[RawRecord], cls: Classification, samples: list[dict], other_min_bytes: int
) -> list[AllocEvent]:
    by_seq = {s["seq"]: s for s in samples}
    out: list[AllocEvent] = []
    for rec, kind, layer, cap in zip(records, cls.kinds, cls.layers, cls.capacities):
        if kind == "other" and rec.size < other_min_bytes:
            continue
        s = by_seq[rec.seq]
        out.append(
            AllocEvent(
                index=len(out),
                seq=rec.seq,
                step=s["step"],
                phase=s["phase"],
                op=rec.op,
                bytes=rec.size,
                address=rec.address,
                kind=kind,
                layer=layer,
                capacity=cap,
                site=rec.site,
                allocator=rec.allocator,
                thread=rec.thread,
            )
        )
    return out


def _with_kv_live(raw: list[dict], events: list[AllocEvent] | None) -> list[StepSample]:
    live = 0
    per_seq: dict[int, int] = {}
    if events is not None:
        for e in events:
            if e.is_kv:
                live += e.bytes if e.op == "alloc" else -e.bytes
            per_seq[e.seq] = live
    out, last = [], 0
    for s in raw:
        if events is not None:
            last = per_seq.get(s["seq"], last)
        out.append(StepSample(**s, kv_live_bytes=last if events is not None else None))
    return out


def _facts(
    inspection: RuntimeInspection,
    dims: KVDims,
    tracker: str,
    scenario: Scenario,
    summary: TraceSummary,
    cls: Classification | None,
) -> RunFacts:
    try:
        import memray

        memray_version = memray.__version__ if hasattr(memray, "__version__") else _dist_version("memray")
    except ImportError:  # pragma: no cover
        memray_version = None
    model, flags = cpu_flags()
    return RunFacts(
        openvino_version=ov.__version__,
        memray_version=memray_version,
        python_version=platform.python_version(),
        cpu_model=model,
        cpu_flags=flags,
        requested=inspection.requested,
        kv_cache_precision=inspection.kv_cache_precision,
        inference_precision=inspection.inference_precision,
        fused=inspection.fused,
        layers=dims.layers,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        tracker=tracker,
        scenario=scenario.describe(),
        malloc_env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        trace=asdict(summary),
        kv_sites={site: label.kind for site, label in (cls.sites.items() if cls else [])},
        warnings=list(cls.warnings) if cls else [],
    )


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # pragma: no cover
        return None

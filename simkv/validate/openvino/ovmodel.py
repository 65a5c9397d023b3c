"""Build, load, compile and inspect stateful decoder models for OpenVINO CPU validation.

Why this module exists
----------------------
``simkv validate`` compares the simulator's predicted KV-cache ledger with what the
real OpenVINO CPU plugin allocates.  That comparison is only meaningful when the
plugin really runs its *stateful* KV-cache path: per layer, the chain

    ReadValue(past K) -> Gather(beam_idx, axis 0) -> Concat(new K, seq axis) -> SDPA
                                                     Concat -> Assign

must be fused by the CPU plugin's ``StatefulSDPAFusion`` pass into one
``ScaledDotProductAttentionWithKVCache`` node, whose state is kept in a
``VariableStateKVcache`` (see ``src/plugins/intel_cpu/src/transformations/cpu_opset/
common/pass/stateful_sdpa_fusion.cpp`` and ``src/plugins/intel_cpu/src/memory_state.cpp``).
When the fusion does not fire the cache is a plain Concat that is copied every step,
and every number measured would describe the wrong policy.  So this module

* builds a small random-weight decoder in exactly the form optimum-intel's stateful
  export produces (inputs ``input_ids``, ``attention_mask``, ``position_ids``,
  ``beam_idx``; output ``logits``; RoPE; GQA through the transformers ``repeat_kv``
  pattern Unsqueeze -> Broadcast(BIDIRECTIONAL) -> Reshape, which the fusion matches,
  whereas a NUMPY-mode Broadcast would not be matched),
* loads an existing IR (``openvino_model.xml``) so real exports can be checked too,
* compiles on CPU with the requested precision hints, and
* inspects the *runtime* (compiled) model, refusing to proceed when a layer is not
  fused, and reporting the *effective* KV-cache precision, which the CPU plugin writes
  into the rt_info (key ``kv_cache_precision``) of each fused SDPA node of the runtime
  model (the ``KV_CACHE_PRECISION`` compiled-model property only echoes the hint).

Only the OpenVINO Python opset API and numpy are used; no torch, no network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from .toy import ToyDecoderSpec

__all__ = [
    "RuntimeInspection",
    "NotFusedError",
    "build_stateful_decoder",
    "load_ir",
    "compile_cpu",
    "inspect_runtime",
    "require_fused",
    "compile_checked",
    "inference_precision",
    "FUSED_SDPA_LAYER_TYPE",
]

#: ``layerType`` rt_info value of the CPU plugin's executable SDPA node.  The plugin
#: maps both ``opset13::ScaledDotProductAttention`` and its internal
#: ``ScaledDotProductAttentionWithKVCache`` op onto node type ``ScaledDotProductAttention``
#: (``cpu_types.cpp``); the fused one is told apart by its extra inputs (beam_idx,
#: past K, past V) -- see :func:`inspect_runtime`.
FUSED_SDPA_LAYER_TYPE = "ScaledDotProductAttention"

_NEG_INF = float(np.finfo(np.float32).min)


class NotFusedError(RuntimeError):
    """Raised when the compiled model does not run every layer's KV cache in a fused,
    stateful SDPA node, i.e. when measurements would not describe the KV-cache policy."""


@dataclass
class RuntimeInspection:
    """What the CPU plugin really compiled (read from ``compiled.get_runtime_model()``).

    ``fused`` is True only when every KV variable pair is consumed by a fused stateful
    SDPA node.  ``kv_cache_precision`` is
    the *effective* element type the plugin stores the cache in (rt_info key
    ``kv_cache_precision`` of the fused SDPA nodes), which may differ from the hint;
    ``inference_precision`` is those nodes' ``runtimePrecision`` (bf16 or f32 here).
    """

    fused: bool
    n_variables: int
    n_fused_sdpa: int
    n_unfused_sdpa: int
    fused_sdpa_names: list[str]
    kv_cache_precision: str | None
    inference_precision: str | None
    requested: dict[str, str]
    layer_type_counts: dict[str, int]
    runtime_rt_info: dict[str, str] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    #: Plain state variables (linear-attention conv / recurrent states): MemoryInput nodes that feed no
    #: fused SDPA, and the element type the plugin keeps them in (its inference precision; None: none).
    n_state_variables: int = 0
    state_precision: str | None = None


# --------------------------------------------------------------------------- build


def _const(array: np.ndarray | float | int | list, dtype=np.float32) -> ov.Node:
    return ops.constant(np.asarray(array, dtype=dtype))


def _rms_norm(x: ov.Output, dim: int, eps: float = 1e-6) -> ov.Node:
    """x * rsqrt(mean(x^2) + eps) * w (w = 1): the normalisation Llama-style models use."""
    sq = ops.multiply(x, x)
    mean = ops.reduce_mean(sq, _const([-1], np.int64), keep_dims=True)
    inv = ops.divide(_const(1.0), ops.sqrt(ops.add(mean, _const(eps))))
    return ops.multiply(ops.multiply(x, inv), _const(np.ones(dim, np.float32)))


def _rotate_half(x: ov.Output) -> ov.Node:
    """transformers' ``rotate_half``: concat(-x2, x1) over the last axis."""
    parts = ops.split(x, _const(-1, np.int64), 2)
    return ops.concat([ops.negative(parts.output(1)), parts.output(0)], -1)


def _apply_rope(x: ov.Output, cos: ov.Output, sin: ov.Output) -> ov.Node:
    """q*cos + rotate_half(q)*sin, the HF Llama form (the CPU plugin may fuse it to RoPE)."""
    return ops.add(ops.multiply(x, cos), ops.multiply(_rotate_half(x), sin))


def _project_heads(x: ov.Output, weight: np.ndarray, n_heads: int, head_dim: int) -> ov.Node:
    """[B,T,D] @ W^T -> [B,T,n_heads*S] -> [B,n_heads,T,S] (torch Linear layout)."""
    y = ops.matmul(x, _const(weight), transpose_a=False, transpose_b=True)
    y = ops.reshape(y, _const([0, 0, n_heads, head_dim], np.int64), special_zero=True)
    return ops.transpose(y, _const([0, 2, 1, 3], np.int64))


def _repeat_kv(kv: ov.Output, n_rep: int, heads: int, head_dim: int, mode: str = "bidirectional") -> ov.Output:
    """transformers ``repeat_kv`` as the optimum export traces it.

    Unsqueeze(axis 2) -> Broadcast(BIDIRECTIONAL) -> Reshape is the exact form that
    ``StatefulSDPAFusion``'s ``multi_query_bcst`` pattern accepts (opset3 Broadcast,
    mode "bidirectional"); anything else leaves the cache as an unfused Concat.
    For MHA transformers returns the tensor unchanged, and so do we.
    """
    if n_rep == 1:
        return kv
    unsq = ops.unsqueeze(kv, _const([2], np.int64))
    if mode == "numpy":  # explicit target shape [B,Hk,n_rep,L,S]: defeats the fusion
        target = ops.multiply(ops.shape_of(unsq, "i64"), _const([1, 1, n_rep, 1, 1], np.int64))
        bc = ops.broadcast(unsq, target, broadcast_spec="NUMPY")
    else:
        bc = ops.broadcast(unsq, _const([1, 1, n_rep, 1, 1], np.int64), broadcast_spec="BIDIRECTIONAL")
    return ops.reshape(bc, _const([0, heads, -1, head_dim], np.int64), special_zero=True).output(0)


def _causal_mask(input_ids: ov.Output, attention_mask: ov.Output) -> ov.Node:
    """Additive float mask [B,1,T,L0+T]: 0 where key j is visible to query i, else -max.

    Query i sits at absolute position L0+i with L0 = L - T (the stored history), key j
    is visible when j <= L0+i and attention_mask[b, j] != 0.
    """
    ids_shape = ops.shape_of(input_ids, "i64")
    mask_shape = ops.shape_of(attention_mask, "i64")
    zero = _const(0, np.int64)
    t_len = ops.gather(ids_shape, _const(1, np.int64), zero)
    total = ops.gather(mask_shape, _const(1, np.int64), zero)
    past = ops.subtract(total, t_len)
    kv_pos = ops.range(zero, total, _const(1, np.int64), "i64")
    q_pos = ops.range(past, total, _const(1, np.int64), "i64")
    causal = ops.less_equal(ops.unsqueeze(kv_pos, zero), ops.unsqueeze(q_pos, _const(1, np.int64)))  # [T,L]
    keep = ops.not_equal(attention_mask, _const(0, np.int64))  # [B,L]
    keep = ops.unsqueeze(keep, _const([1, 2], np.int64))  # [B,1,1,L]
    allowed = ops.logical_and(keep, causal)  # [B,1,T,L]
    return ops.select(allowed, _const(0.0), _const(_NEG_INF))


def build_stateful_decoder(spec: ToyDecoderSpec = ToyDecoderSpec()) -> ov.Model:
    """Build an optimum-intel-style stateful decoder with seeded random weights.

    Inputs: ``input_ids`` [B,T] i64, ``attention_mask`` [B,L0+T] i64, ``position_ids``
    [B,T] i64, ``beam_idx`` [B] i32.  Output: ``logits`` [B,T,vocab] f32.  Variables:
    ``past_key_values.{i}.key`` / ``.value`` holding [B, kv_heads, L, head_dim] (the
    logical layout; the CPU plugin stores it internally as [L, B, H, S]).

    Each ReadValue gets the initialiser optimum's ``build_state_initializer`` adds:
    zeros of shape [B, kv_heads, 0, head_dim] with B taken from ``input_ids``, so a
    first (or post-reset) inference starts from an empty history of the right batch.
    """
    rng = np.random.default_rng(spec.seed)
    d, h, hk, s = spec.hidden_size, spec.heads, spec.kv_heads, spec.head_dim

    def weight(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    input_ids = ops.parameter([-1, -1], ov.Type.i64, name="input_ids")
    attention_mask = ops.parameter([-1, -1], ov.Type.i64, name="attention_mask")
    position_ids = ops.parameter([-1, -1], ov.Type.i64, name="position_ids")
    beam_idx = ops.parameter([-1], ov.Type.i32, name="beam_idx")
    params = [input_ids, attention_mask, position_ids, beam_idx]
    for p in params:
        p.output(0).set_names({p.get_friendly_name()})

    x = ops.gather(_const(weight(spec.vocab, d)), input_ids, _const(0, np.int64)).output(0)  # [B,T,D]

    # RoPE tables shared by all layers, computed from position_ids like HF's rotary embedding.
    half = s // 2
    inv_freq = 1.0 / (spec.rope_theta ** (np.arange(0, half, dtype=np.float32) * 2.0 / s))
    pos = ops.unsqueeze(ops.convert(position_ids, "f32"), _const([-1], np.int64))  # [B,T,1]
    freqs = ops.multiply(pos, _const(inv_freq.reshape(1, 1, half)))  # [B,T,S/2]
    emb = ops.concat([freqs, freqs], -1)  # [B,T,S]
    cos = ops.unsqueeze(ops.cos(emb), _const([1], np.int64)).output(0)  # [B,1,T,S]
    sin = ops.unsqueeze(ops.sin(emb), _const([1], np.int64)).output(0)

    mask = _causal_mask(input_ids.output(0), attention_mask.output(0)).output(0)

    # Initial state: zeros [B, H_kv, 0, S], B from input_ids (optimum's state initializer).
    batch = ops.gather(ops.shape_of(input_ids, "i64"), _const([0], np.int64), _const(0, np.int64))
    init_shape = ops.concat([batch, _const([hk, 0, s], np.int64)], 0)

    sinks: list[ov.Node] = []
    for layer in range(spec.layers):
        if layer in spec.linear_layers:
            x = _linear_attention_layer(x, layer, spec, weight, beam_idx, batch, sinks)
            continue
        hn = _rms_norm(x, d).output(0)
        q = _apply_rope(_project_heads(hn, weight(h * s, d), h, s).output(0), cos, sin)
        k = _apply_rope(_project_heads(hn, weight(hk * s, d), hk, s).output(0), cos, sin)
        v = _project_heads(hn, weight(hk * s, d), hk, s)

        present = []
        for kind, new in (("key", k), ("value", v)):
            info = ov.op.util.VariableInfo()
            info.data_shape = ov.PartialShape([-1, hk, -1, s])
            info.data_type = ov.Type.f32
            info.variable_id = f"past_key_values.{layer}.{kind}"
            var = ov.op.util.Variable(info)
            init = ops.broadcast(_const(0.0), init_shape)
            past = ov.opset6.read_value(init, var)
            gathered = ops.gather(past, beam_idx, _const(0, np.int64))
            if spec.linear_layers:  # names a hybrid's layers, as an export's module paths do (irspec)
                gathered.set_friendly_name(f"model.layers.{layer}.self_attn.{kind}_gather")
            cat = ops.concat([gathered, new], 2)
            sinks.append(ov.opset6.assign(cat, var))
            present.append(_repeat_kv(cat.output(0), spec.n_rep, h, s, spec.gqa_broadcast))

        attn = ops.scaled_dot_product_attention(q, present[0], present[1], mask, causal=False)
        attn = ops.transpose(attn, _const([0, 2, 1, 3], np.int64))
        attn = ops.reshape(attn, _const([0, 0, h * s], np.int64), special_zero=True)
        x = ops.add(x, ops.matmul(attn, _const(weight(d, h * s)), False, True)).output(0)

    logits = ops.matmul(_rms_norm(x, d), _const(weight(spec.vocab, d)), False, True)
    logits.output(0).set_names({"logits"})
    result = ops.result(logits)
    model = ov.Model([result], sinks, params, "simkv_toy_stateful_decoder")
    return model


def _state(name: str, layer: int, shape: list[int], init_shape: ov.Output, beam_idx) -> tuple:
    """A plain state variable ``[B, *shape]``: ReadValue (zeros of the batch) -> Gather(beam_idx)."""
    info = ov.op.util.VariableInfo()
    info.data_shape = ov.PartialShape([-1, *shape])
    info.data_type = ov.Type.f32
    info.variable_id = f"cache_params.past.{name}.{layer}"
    var = ov.op.util.Variable(info)
    past = ov.opset6.read_value(ops.broadcast(_const(0.0), init_shape), var)
    gathered = ops.gather(past, beam_idx, _const(0, np.int64))
    gathered.set_friendly_name(f"model.layers.{layer}.linear_attn.{name}_gather")
    return var, gathered


def _linear_attention_layer(x, layer: int, spec: ToyDecoderSpec, weight, beam_idx, batch, sinks: list) -> ov.Output:
    """A toy linear-attention block with the two states of a Qwen3-Next layer, as plain variables:
    conv ``[B, D, K]`` (the last K inputs: Concat then Slice, like the export's causal-conv cache) and
    recurrent ``[B, H, S, S]`` (decayed sum of k^T v, read by q)."""
    d, h, s, kk = spec.hidden_size, spec.heads, spec.head_dim, spec.conv_kernel
    hn = _rms_norm(x, d).output(0)
    conv_var, conv_past = _state("conv", layer, [d, kk], ops.concat([batch, _const([d, kk], np.int64)], 0), beam_idx)
    cat = ops.concat([conv_past, ops.transpose(hn, _const([0, 2, 1], np.int64))], 2)  # [B, D, K + T]
    new_conv = ops.slice(cat, _const([-kk], np.int64), _const([np.iinfo(np.int64).max], np.int64),
                         _const([1], np.int64), _const([2], np.int64))
    sinks.append(ov.opset6.assign(new_conv, conv_var))
    conv_out = ops.reduce_sum(ops.multiply(new_conv, _const(weight(d, kk))), _const([2], np.int64), keep_dims=False)
    q = _project_heads(hn, weight(h * s, d), h, s)
    k = _project_heads(hn, weight(h * s, d), h, s)
    v = _project_heads(hn, weight(h * s, d), h, s)
    rec_var, rec_past = _state("ssm", layer, [h, s, s], ops.concat([batch, _const([h, s, s], np.int64)], 0), beam_idx)
    new_rec = ops.add(ops.multiply(rec_past, _const(0.9)), ops.matmul(k, v, transpose_a=True, transpose_b=False))
    sinks.append(ov.opset6.assign(new_rec, rec_var))
    out = ops.transpose(ops.matmul(q, new_rec, False, False), _const([0, 2, 1, 3], np.int64))
    out = ops.reshape(out, _const([0, 0, h * s], np.int64), special_zero=True)
    y = ops.add(ops.matmul(out, _const(weight(d, h * s)), False, True), ops.unsqueeze(conv_out, _const([1], np.int64)))
    return ops.add(x, y).output(0)


def load_ir(path: str | Path, core: ov.Core | None = None) -> ov.Model:
    """Read an existing IR (``openvino_model.xml`` or its folder), e.g. an optimum-intel
    stateful export, so the same observation can run on a real model.  The IR's own
    ``runtime_options`` rt_info (optimum writes ``KV_CACHE_PRECISION``) is kept; explicit
    hints given to :func:`compile_cpu` override it."""
    p = Path(path)
    if p.is_dir():
        p = p / "openvino_model.xml"
    if not p.exists():
        raise FileNotFoundError(p)
    return (core or ov.Core()).read_model(str(p))


# --------------------------------------------------------------------------- compile


def compile_cpu(
    model: ov.Model,
    kv_cache_precision: str | None = None,
    inference_precision: str | None = None,
    extra_config: Mapping[str, Any] | None = None,
    core: ov.Core | None = None,
) -> ov.CompiledModel:
    """Compile ``model`` on CPU with optional ``KV_CACHE_PRECISION`` and
    ``INFERENCE_PRECISION_HINT`` (e.g. "u8", "u4", "bf16", "f16", "f32").

    ``NUM_STREAMS=1`` and ``INFERENCE_NUM_THREADS`` are left to the caller via
    ``extra_config``; ``PERFORMANCE_HINT=LATENCY`` is set by default so a single request
    owns the cores, as in an LLM pipeline.
    """
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
    if kv_cache_precision is not None:
        config["KV_CACHE_PRECISION"] = kv_cache_precision
    if inference_precision is not None:
        config["INFERENCE_PRECISION_HINT"] = inference_precision
    if extra_config:
        config.update(extra_config)
    return (core or ov.Core()).compile_model(model, "CPU", config)


def inference_precision() -> str:
    """The precision the CPU plugin computes in by default on this host (bf16 with AMX/AVX-512-BF16, else f32)."""
    value = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
    return value.to_string() if hasattr(value, "to_string") else str(value)


# --------------------------------------------------------------------------- inspect


def _rt_str(value: Any) -> str:
    try:
        return value.astype(str)
    except AttributeError:
        return str(value)


def inspect_runtime(
    compiled: ov.CompiledModel,
    requested: Mapping[str, str] | None = None,
) -> RuntimeInspection:
    """Read the runtime model: is every KV chain fused, and in which precision is it kept?

    Detection (verified on openvino 2026.4.1, see /tmp/ov_facts.md): every executable
    node of ``compiled.get_runtime_model()`` carries rt_info ``layerType``.

    * A *fused* stateful SDPA has ``layerType == "ScaledDotProductAttention"`` and 7
      inputs (q, k, v, mask, beam_idx, past K, past V; 8 with an explicit scale):
      ``StatefulSDPAFusion`` appends beam_idx and the two ReadValue outputs to the
      opset13 inputs, and the node gets 3 outputs (attention, present K, present V).
      An unfused opset13 SDPA has at most 5 inputs and 1 output.
    * Each state variable is one ``MemoryInput`` node (present whether fused or not). A KV variable's
      feeds a fused SDPA; the others are plain states (a hybrid model's conv and recurrent states,
      double-buffered by the plugin, docs/DESIGN.md §4c). ``#KV MemoryInput == 2 * #fused SDPA`` is
      required; a model with only plain states (or an unfused KV cache) is refused.
    * The effective KV precision is the rt_info key ``kv_cache_precision`` of the
      fused SDPA nodes (e.g. ``"u8"``); the runtime *model* rt_info is empty and the
      ``KV_CACHE_PRECISION`` property only echoes the request.
    """
    runtime = compiled.get_runtime_model()
    n_kv_vars, state_types = 0, set()
    for op in runtime.get_ordered_ops():
        rt = op.get_rt_info()
        if "layerType" not in rt or _rt_str(rt["layerType"]) != "MemoryInput":
            continue
        feeds_sdpa = any(
            "layerType" in t.get_node().get_rt_info()
            and _rt_str(t.get_node().get_rt_info()["layerType"]) == FUSED_SDPA_LAYER_TYPE
            and t.get_node().get_input_size() >= 7
            for out in op.outputs() for t in out.get_target_inputs()
        )
        if feeds_sdpa:
            n_kv_vars += 1
        else:
            state_types.add(op.get_output_element_type(0).get_type_name())
    counts: dict[str, int] = {}
    fused_names: list[str] = []
    kv_precisions: list[str] = []
    runtime_precisions: list[str] = []
    n_unfused = 0
    for op in runtime.get_ordered_ops():
        rt = op.get_rt_info()
        layer_type = _rt_str(rt["layerType"]) if "layerType" in rt else op.get_type_name()
        counts[layer_type] = counts.get(layer_type, 0) + 1
        if layer_type != FUSED_SDPA_LAYER_TYPE:
            continue
        if op.get_input_size() >= 7 and op.get_output_size() == 3:
            fused_names.append(op.get_friendly_name())
            if "kv_cache_precision" in rt:
                kv_precisions.append(_rt_str(rt["kv_cache_precision"]))
            if "runtimePrecision" in rt:
                runtime_precisions.append(_rt_str(rt["runtimePrecision"]))
        else:
            n_unfused += 1

    model_rt = runtime.get_rt_info()
    rt_info = {str(k): _rt_str(model_rt[k]) for k in model_rt}
    n_vars = counts.get("MemoryInput", 0)
    n_states = n_vars - n_kv_vars
    n_kv_expected = n_vars if not fused_names else n_kv_vars  # unfused: every variable counts as KV

    reasons: list[str] = []
    if n_vars == 0:
        reasons.append("model has no state variables (no MemoryInput node: not a stateful model)")
    elif n_kv_expected % 2:
        reasons.append(f"odd number of KV state variables ({n_kv_expected}); expected K/V pairs")
    if len(fused_names) != n_kv_expected // 2 or (n_vars and not fused_names):
        reasons.append(f"{len(fused_names)} fused stateful SDPA node(s) for {n_kv_expected // 2} K/V variable pair(s)")
    if n_unfused:
        reasons.append(f"{n_unfused} SDPA node(s) without KV-cache inputs (StatefulSDPAFusion did not match)")
    if len(set(kv_precisions)) > 1:
        reasons.append(f"layers disagree on kv_cache_precision: {sorted(set(kv_precisions))}")
    if fused_names and len(kv_precisions) != len(fused_names):
        reasons.append("a fused SDPA node has no kv_cache_precision rt_info")

    return RuntimeInspection(
        fused=not reasons,
        n_variables=n_vars,
        n_fused_sdpa=len(fused_names),
        n_unfused_sdpa=n_unfused,
        fused_sdpa_names=fused_names,
        kv_cache_precision=kv_precisions[0] if kv_precisions else None,
        inference_precision=runtime_precisions[0] if runtime_precisions else None,
        requested=dict(requested or {}),
        layer_type_counts=counts,
        runtime_rt_info=rt_info,
        reasons=reasons,
        n_state_variables=n_states if fused_names else 0,
        state_precision=_precision_name(state_types) if fused_names and n_states else None,
    )


def _precision_name(types: set[str]) -> str | None:
    """One OpenVINO element type name (``bf16``, ``f32`` …) for a set, or ``mixed`` / None."""
    if not types:
        return None
    return next(iter(types)) if len(types) == 1 else "mixed"


def require_fused(inspection: RuntimeInspection) -> RuntimeInspection:
    """Raise :class:`NotFusedError` unless every layer's KV cache is a fused stateful SDPA."""
    if not inspection.fused:
        raise NotFusedError(
            "OpenVINO CPU plugin did not fuse the KV cache into stateful SDPA nodes: "
            + "; ".join(inspection.reasons)
            + ". Memory measured on this model would describe a per-step Concat copy, not "
            "the KV-cache policy (check GQA is written as Unsqueeze -> Broadcast(BIDIRECTIONAL) "
            "-> Reshape and that each ReadValue feeds only Gather(beam_idx) -> Concat -> SDPA/Assign)."
        )
    return inspection


def compile_checked(
    model: ov.Model,
    kv_cache_precision: str | None = None,
    inference_precision: str | None = None,
    extra_config: Mapping[str, Any] | None = None,
    core: ov.Core | None = None,
) -> tuple[ov.CompiledModel, RuntimeInspection]:
    """:func:`compile_cpu` + :func:`inspect_runtime` + :func:`require_fused` in one call."""
    requested = {}
    if kv_cache_precision is not None:
        requested["KV_CACHE_PRECISION"] = kv_cache_precision
    if inference_precision is not None:
        requested["INFERENCE_PRECISION_HINT"] = inference_precision
    compiled = compile_cpu(model, kv_cache_precision, inference_precision, extra_config, core)
    return compiled, require_fused(inspect_runtime(compiled, requested))

"""``step_cost``: the one function that prices a step everywhere (``simkv cost``, ``run --device``, ``validate``,
serving). The formula is in the package docstring (:mod:`simkv.cost`); each term's inputs come from its own module:
weights streamed (:mod:`.weights`), attention (:mod:`.attention`), all-reduces (:mod:`.interconnects`), and the
device's peaks, fractions and fixed costs (:mod:`.devices`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simkv.cost.attention import pair_flops_per_model
from simkv.cost.devices import Device
from simkv.cost.interconnects import allreduce_s
from simkv.cost.weights import matmul_params, weights_read_bytes
from simkv.errors import ConfigError
from simkv.models import ModelSpec, params_by_format


@dataclass(frozen=True)
class StepCost:
    """One step's time and the terms behind it (floats, or arrays when the inputs were arrays)."""

    seconds: Any
    #: "memory" or "compute": what bounds the longer of the two kernel groups (matmuls, attention).
    bound: Any
    #: All bytes over the bandwidth, all FLOPs over their rates (what each bound alone would give).
    memory_s: Any
    compute_s: Any
    copy_s: Any
    overhead_s: Any
    bytes: Any
    flops: Any
    #: The two kernel groups: weight matmuls, attention (each the larger of its memory and compute time;
    #: attention their sum where the device does not overlap them).
    matmul_s: Any = 0.0
    attention_s: Any = 0.0
    #: The four affine terms behind the rooflines: (weights streaming, matmul FLOPs, KV bytes, attention FLOPs).
    terms: Any = None
    #: Tensor parallelism: the step's all-reduces (0 on one device; :func:`allreduce_s`).
    allreduce_s: Any = 0.0


def step_cost(
    model: ModelSpec,
    device: Device,
    *,
    weights_bytes: Any,
    new_tokens: Any,
    attended_pairs: Any,
    kv_read_bytes: Any,
    kv_write_bytes: Any,
    copy_bytes: Any = 0,
    precision: str | None = None,
    logit_tokens: Any = None,
    decode_pairs: Any = 0,
    attention_flops: Any = 0,
    decode_flops: Any = 0,
    gemm_mix: tuple[tuple[str, int], ...] | None = None,
    graph_tokens: Any = None,
) -> StepCost:
    """Time of one step (or of many, when arguments are arrays; they broadcast).

    See the module docstring for the formula. ``weights_bytes``: all the weights (a mixture of experts
    streams a part, :func:`weights_read_bytes`). ``precision`` is the compute
    precision (a key of ``device.peak_flops``; default ``device.compute_precision``).
    ``logit_tokens``: tokens whose logits the LM head computes (default ``new_tokens``;
    engines compute only each sequence's last prompt token in a prefill).
    ``attended_pairs`` are priced as if every attention layer attended them (:func:`pair_flops_per_model`);
    ``decode_pairs``: the part of them that belongs to one-token queries. A model whose layers attend
    different positions gives its attention arithmetic as ``attention_flops`` instead (:func:`attention_work`),
    ``decode_flops`` of it from one-token queries; the two ways add.
    ``gemm_mix``: the transformer layers' weight matmuls as (peak, parameters a token multiplies by) pairs where
    they do not all run at ``precision`` — a quantized checkpoint's parts, each at its kernel's peak on this device
    (:func:`gemm_mix`: fp8 weights on an H100 run W8A8 fp8 GEMMs, mxfp4 experts weight-only bf16 ones); the
    parameters add up to the layers' (``matmul_params`` less the LM head), which with the LM head and attention
    stay at ``precision``.
    ``graph_tokens``: the tokens the forward pass runs over where a CUDA graph pads the batch
    (:func:`simkv.cost.cudagraphs.padded_tokens`; default ``new_tokens``): the layers' GEMMs, the experts streamed
    and the all-reduces run over them; KV writes, attention and the LM head over the real tokens.
    """
    peak = device.peak(precision) * device.flops_efficiency
    decode_rate = device.decode_attention_flops or peak
    weights_bw = device.memory_bandwidth * device.bandwidth_efficiency
    kv_bw = device.memory_bandwidth * device.kv_efficiency
    logit_tokens = new_tokens if logit_tokens is None else logit_tokens
    graph_tokens = new_tokens if graph_tokens is None else graph_tokens
    args = (weights_bytes, new_tokens, attended_pairs, kv_read_bytes, kv_write_bytes, copy_bytes, logit_tokens,
            decode_pairs, attention_flops, decode_flops, graph_tokens)
    scalar = all(np.ndim(a) == 0 for a in args)
    w, new, pairs, kr, kw, cb, logits, dpairs, aflops, dflops, n = np.broadcast_arrays(
        *(np.asarray(a, dtype=np.float64) for a in args))
    # n: the tokens the layers run over (the padded batch); the real new tokens enter through kv_write_bytes and a
    # prompt token's fixed kernel work (Device.prompt_token_overhead_s)
    w = weights_read_bytes(model, w, n)
    nbytes = w + kr + kw
    head = float(model.vocab * model.hidden) if model.weight_params else 0.0
    per_pair = float(pair_flops_per_model(model))
    matmul_flops = 2.0 * (matmul_params(model) - head) * n + 2.0 * head * logits
    flops = matmul_flops + per_pair * pairs + aflops
    weights_s, kv_s = w / weights_bw, (kr + kw) / kv_bw
    if gemm_mix is None and not device.matmul_rows_flops:
        matmul_compute_s = matmul_flops / peak
    elif gemm_mix is None:  # the layers' matmuls over the step's tokens, the LM head over its logit rows, each at
        # the rate the calibration measured at those rows (a CPU brgemm at few rows: Device.matmul_rows_flops)
        matmul_compute_s = (2.0 * (matmul_params(model) - head) * n / device.matmul_rate(n, peak)
                            + 2.0 * head * logits / device.matmul_rate(logits, peak))
    else:  # the layers' GEMMs each at their kernel's peak, the LM head at the compute precision's
        if sum(params for _, params in gemm_mix) != matmul_params(model) - head:
            raise ConfigError(f"gemm_mix holds {sum(p for _, p in gemm_mix):,} parameters, the layers of {model.name} "
                              f"{matmul_params(model) - head:,}")
        matmul_compute_s = 2.0 * head * logits / peak
        for key, params in gemm_mix:
            matmul_compute_s = matmul_compute_s + 2.0 * params * n / (device.peak(key) * device.flops_efficiency)
    attention_compute_s = (per_pair * (pairs - dpairs) + (aflops - dflops)) / peak + (per_pair * dpairs + dflops) / decode_rate
    matmul_s = np.maximum(weights_s, matmul_compute_s)
    attention_s = device.attention_time(kv_s, attention_compute_s)
    memory_s, compute_s = weights_s + kv_s, matmul_compute_s + attention_compute_s
    copy_s = cb / device.copy_bandwidth
    overhead = np.full(w.shape, device.step_overhead_s + model.layers * device.layer_overhead_s)
    if device.sequence_overhead_s:  # per sequence that samples a token (a serving engine's bookkeeping)
        overhead = overhead + device.sequence_overhead_s * logits
    if device.head_overhead_s:  # per sequence, layer and query head: the attention kernel's fixed work
        overhead = overhead + device.head_overhead_s * logits * model.layers * model.heads
    if device.prompt_token_overhead_s:  # per prompt token, layer and query head: a multi-token query's kernel work
        overhead = overhead + device.prompt_token_overhead_s * (new - logits) * model.layers * model.heads
    if device.vocab_overhead_s:  # per vocabulary entry of each sampling sequence: the sampler over its logits row
        overhead = overhead + device.vocab_overhead_s * logits * model.vocab
    seconds = matmul_s + attention_s + copy_s + overhead
    reduce_s = allreduce_s(model, device, n)
    if model.tp > 1:
        seconds = seconds + reduce_s
    longer_is_compute = np.where(matmul_s >= attention_s, matmul_compute_s > weights_s, attention_compute_s > kv_s)
    bound = np.where(longer_is_compute, "compute", "memory")
    terms = (weights_s, matmul_compute_s, kv_s, attention_compute_s)
    if scalar:
        return StepCost(float(seconds), str(bound), float(memory_s), float(compute_s), float(copy_s),
                        float(overhead), float(nbytes), float(flops), float(matmul_s), float(attention_s),
                        tuple(float(t) for t in terms), float(reduce_s))
    return StepCost(seconds, bound, memory_s, compute_s, copy_s, overhead, nbytes, flops, matmul_s, attention_s, terms,
                    reduce_s)



def gemm_mix(model: ModelSpec, device: Device, precision: str) -> tuple[tuple[str, int], ...] | None:
    """The layers' weight matmuls of ``model`` stored at weight ``precision`` (a format, or ``checkpoint``) as
    (peak, parameters per token) pairs on ``device`` (:meth:`Device.gemm_precision` of each format of
    :func:`simkv.models.params_by_format`, the LM head left out: it runs at the compute precision), or None when
    they all run at the device's compute precision."""
    by_format = params_by_format(model, precision, active=True)
    head = model.vocab * model.hidden if model.weight_params else 0
    mix: dict[str, int] = {}
    head_left = head
    for fmt, params in sorted(by_format.items()):
        take = 0
        if head_left and fmt in (device.compute_precision, "bf16", "f16", "f32") and params >= head_left:
            take = head_left  # the LM head is in the unquantized dtype (simkv.weights: no method quantizes it here)
            head_left = 0
        if params - take:
            key = device.gemm_precision(fmt)
            mix[key] = mix.get(key, 0) + params - take
    if head_left or set(mix) <= {device.compute_precision}:
        return None
    return tuple(sorted(mix.items()))

"""The cost model: how long one engine step takes on a device.

One step processes ``new_tokens`` tokens over all its sequences (decode: one per
sequence; a prefill chunk: its length). It runs two kinds of kernels one after the
other: the weight matmuls (stream the weights once, do the matmul FLOPs) and
attention (read the KV cache its tokens attend to, write the KV of the new tokens,
do the QKᵀ and PV FLOPs). Each kind is bounded by its own roofline, and the step
is their sum plus two separate terms::

    t = max(weights_bytes / (bandwidth · η_bw), matmul FLOPs / (peak[precision] · η_flops))     # matmuls
        + max(KV bytes / (bandwidth · η_kv), attention FLOPs / attention rate)                 # attention
          (or their sum, where the device's attention does not overlap its reads: see below)
        + copy_bytes / copy_bandwidth          # KV reallocations (a synchronised copy)
        + step_overhead_s + layers · layer_overhead_s   # runtime/framework fixed cost per step
        + R · (α(n) + 2(n − 1)/n · new_tokens · hidden · 2 B / busbw(n))   # tensor parallelism of n > 1 devices

    weights_bytes read = weights_bytes                                       (dense)
                       = W · (1 − f) + W · f · E · (1 − (1 − k/E)^B) / E      (mixture of experts, B = new_tokens)
    KV bytes = kv_read_bytes + kv_write_bytes   (η_kv defaults to η_bw)
    matmul FLOPs = 2 · active_layer_params · new_tokens + 2 · vocab · hidden · logit_tokens
    attention FLOPs = P · attended_pairs + attention_flops,   P = Σ_layers 2 · heads · (k_dim + v_dim)
                                                               (= 4 · layers · heads · head_dim, uniform)
    attention time = (P · (pairs - decode_pairs) + attention_flops - decode_flops) / (peak · η_flops)
                     + (P · decode_pairs + decode_flops) / decode_attention_flops   (default: peak · η_flops too)

Under tensor parallelism (``model.tp = n > 1``, :func:`simkv.models.tp_shard`) the model is one device's share,
so weights, FLOPs and KV above are already divided; each step adds ``R`` all-reduces of the step's activations
(:func:`allreduces_per_step`: vLLM's ``o_proj`` and ``down_proj`` row-parallel linears in every layer and the
vocab-parallel embedding, ``2 · L + 1`` for a dense model; bf16/f16 activations, 2 B per element), each timed
by the device's :class:`Interconnect` (docs/research/plan-facts.md §2.2, §3).

``active_layer_params`` are the parameters of the matrices a token multiplies by in the
transformer layers (``ModelSpec.active_params`` without the LM head: of a mixture of
experts only the k experts it is routed to); the LM
head runs only for the tokens whose logits are needed (every token by default,
the last token of each sequence in :func:`forward_cost`). A mixture of experts
streams its non-expert weights (share 1 − f) once and, per MoE layer, the experts
its tokens touch (:func:`expected_experts`: uniform independent routing).
``attended_pairs`` is Σ over the step's tokens of the positions each attends to
(QKᵀ and PV cost 2 · k_dim and 2 · v_dim FLOPs per *query* head per pair), priced as
if every attention layer attended them; a model whose layers attend differently
(sliding, chunked, MLA absorbed or expanded, linear-attention state) gives its work per
layer kind as ``attention_flops`` (:func:`attention_work`, which :func:`forward_cost`
uses; docs/DESIGN.md §6a). ``decode_pairs`` are the pairs of
one-token queries (a sequence decoding): a CPU runtime computes them with a
dot-product loop per query head, not a matrix kernel — the OpenVINO CPU plugin's
``mha_single_token_kernel`` (``src/plugins/intel_cpu/src/nodes/kernels/scaled_attn/
mha_single_token.cpp``) dequantises each cached key and value row once per query
head of its group — so their rate is a device property of its own
(``Device.decode_attention_flops``, measured by ``simkv calibrate``), and grouped-query
models pay per query head, not per KV byte. That loop also does not hide its KV reads behind
its arithmetic: it walks the rows one at a time, so on such a device (``attention_overlap``
False) the attention time is the *sum* of the two terms, not the larger. ``simkv calibrate``
measures both rates on two probes that differ only in KV heads, and this host's figures fit
the sum (docs/guide/step-times.md).

Every argument of :func:`step_cost` may be a numpy array: the serving engine
evaluates ~10⁵ steps at once. The model leaves out activations' bytes (but for the decompressed K and V
of an expanded MLA cache), kernel
fusion gaps, cache effects and the overlap of a copy with compute.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simkv.errors import ConfigError
from simkv.kvspec import F32, LayerKV, expand_flops, pair_flops, request_bytes, state_bytes, state_flops, token_bytes
from simkv.models import (ModelSpec, checkpoint_weights_precision, optimum_intel_weights_precision,
                          weights_bytes as model_weights_bytes)
from simkv.precision import Precision

GIB = 1024**3

#: Bytes per activation element in an all-reduce: vLLM runs bf16/f16 activations (Vidur converts all-reduce
#: sizes to tokens with ``size / embedding_dim / 2``, vidur sklearn_execution_time_predictor.py; plan-facts §2.2).
ACTIVATION_BYTES = 2


@dataclass(frozen=True)
class Interconnect:
    """How long an all-reduce of S bytes over n devices takes: ``α(n) + 2(n − 1)/n · S / busbw(n)``
    (NCCL's bus-bandwidth definition, nccl-tests doc/PERFORMANCE.md: ``busbw = algbw · 2(n − 1)/n``; its tuner's
    ``time = latency + bytes / bw``, nccl src/graph/tuning.cc; docs/research/plan-facts.md §3.1).

    ``fits`` holds (α seconds, busbw bytes/s) per device count n; ``None`` as a key: any n."""

    name: str
    description: str
    fits: Mapping[int | None, tuple[float, float]]
    source: str

    def fit(self, n: int) -> tuple[float, float]:
        if n in self.fits:
            return self.fits[n]
        if None in self.fits:
            return self.fits[None]
        raise ConfigError(f"no all-reduce figures for {n} devices over {self.name} (measured: "
                          f"{', '.join(str(k) for k in self.fits)}); use --tp {' or '.join(str(k) for k in self.fits)}")

    def allreduce_s(self, nbytes: Any, n: int) -> Any:
        """Seconds of one all-reduce of ``nbytes`` bytes over ``n`` devices."""
        alpha, busbw = self.fit(n)
        return alpha + 2.0 * (n - 1) / n * nbytes / busbw


_VIDUR_FIT = ("fitted here by least squares of t = α + 2(n−1)/n · S / busbw on every size (2 KiB – 64 MiB) of "
              "microsoft/vidur data/profiling/network/{}/all_reduce.csv @ 7d475133 (torch.distributed all-reduce, "
              "rank 0, median time; one node, devices_per_node = n); a fit to published measurements, "
              "docs/research/plan-facts.md §3.3")

#: Interconnect presets by name (what ``Device.interconnect`` names).
INTERCONNECTS: dict[str, Interconnect] = {i.name: i for i in (
    Interconnect("nvlink4", "NVLink 4 through NVSwitch (H100 SXM, DGX H100; 18 links, 900 GB/s per GPU)",
                 {2: (24.00e-6, 305.0e9), 4: (27.90e-6, 353.4e9), 8: (34.74e-6, 365.9e9)},
                 _VIDUR_FIT.format("h100_dgx") + "; median relative error 7.2 / 4.4 / 3.1 % for n = 2 / 4 / 8"),
    Interconnect("nvlink3", "NVLink 3 through NVSwitch (A100 SXM, DGX A100; 12 links, 600 GB/s per GPU)",
                 {2: (45.44e-6, 171.7e9), 4: (54.42e-6, 182.6e9), 8: (70.44e-6, 181.2e9)},
                 _VIDUR_FIT.format("a100_dgx") + "; median relative error 1.9 / 3.6 / 7.8 % for n = 2 / 4 / 8"),
    Interconnect("pcie", "PCIe Gen4 x16 between devices (no NVLink)",
                 {None: (72.61e-6, 23.7e9)},
                 "assumed for any n: the n = 4 fit of Vidur's a100_pairwise_nvlink profile, whose pairs talk over "
                 "PCIe Gen4 (" + _VIDUR_FIT.format("a100_pairwise_nvlink") + "; median relative error 0.6 %); "
                 "23.7 GB/s is 0.74 of PCIe Gen4 x16's 32 GB/s per direction"),
)}

#: The runtimes a device preset's usual engine is: ``vllm`` (CUDA GPUs) or ``openvino`` (Intel devices,
#: OpenVINO GenAI over an optimum-intel export). It decides the default weights precision and whether
#: tensor parallelism is offered.
RUNTIMES = ("vllm", "openvino")


@dataclass(frozen=True)
class Device:
    """A device's peaks, the fractions of them a real engine achieves, and its fixed costs.

    ``sources`` names where each number comes from (keys: field names).
    """

    name: str
    description: str
    memory_bytes: int
    #: Peak memory bandwidth, bytes/s.
    memory_bandwidth: float
    #: Peak dense FLOP/s per compute precision ("f32", "bf16", "f16", "int8", ...).
    peak_flops: Mapping[str, float]
    #: Achieved fraction of ``memory_bandwidth`` when streaming weights and KV.
    bandwidth_efficiency: float
    #: Achieved fraction of ``peak_flops`` on large matmuls.
    flops_efficiency: float
    #: Fixed runtime/framework cost of one step (kernel launches, graph dispatch), seconds.
    step_overhead_s: float
    #: Bytes per second of a device-to-device copy (a KV reallocation moving its old contents).
    copy_bandwidth: float
    #: The precision matmuls run in when none is given.
    compute_precision: str = "bf16"
    sources: Mapping[str, str] = field(default_factory=dict)
    #: Achieved fraction of ``memory_bandwidth`` when attention streams the KV cache
    #: (long contiguous reads, closer to a copy than a small-batch weight GEMV); None = ``bandwidth_efficiency``.
    kv_bandwidth_efficiency: float | None = None
    #: Fixed cost per transformer layer per step (a CPU runtime dispatching each layer's nodes), seconds:
    #: the step's overhead is ``step_overhead_s + layers x layer_overhead_s``.
    layer_overhead_s: float = 0.0
    #: Achieved FLOP/s of attention for one-token queries (decode) where it is not a matrix kernel
    #: (a CPU's per-query-head dot-product loop); None = ``peak · flops_efficiency`` like the rest.
    decode_attention_flops: float | None = None
    #: Whether attention's KV reads overlap its arithmetic (a roofline: the larger term counts). False
    #: where a per-row loop reads and computes in turn (the CPU plugin's one-token attention): they add up.
    attention_overlap: bool = True
    #: The usual serving runtime on this device (:data:`RUNTIMES`): what weights precision it loads by
    #: default (:meth:`default_weights_precision`) and whether ``--tp`` is offered.
    runtime: str = "openvino"
    #: How the devices of a tensor-parallel group talk (a key of :data:`INTERCONNECTS`).
    interconnect: str = "pcie"

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"device {self.name}: runtime must be one of {', '.join(RUNTIMES)}, got {self.runtime!r}")
        if self.interconnect not in INTERCONNECTS:
            raise ConfigError(f"device {self.name}: interconnect must be one of {', '.join(INTERCONNECTS)}, "
                              f"got {self.interconnect!r}")
        for name in ("memory_bytes", "memory_bandwidth", "copy_bandwidth"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"device {self.name}: {name} must be positive")
        for name in ("bandwidth_efficiency", "flops_efficiency", "kv_bandwidth_efficiency"):
            if name == "kv_bandwidth_efficiency" and self.kv_bandwidth_efficiency is None:
                continue
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"device {self.name}: {name} must be in (0, 1]")
        if not (self.step_overhead_s >= 0 and self.layer_overhead_s >= 0):
            raise ConfigError(f"device {self.name}: step_overhead_s and layer_overhead_s must be >= 0")
        if not isinstance(self.attention_overlap, bool):
            raise ConfigError(f"device {self.name}: attention_overlap must be true or false")
        if self.decode_attention_flops is not None and not self.decode_attention_flops > 0:
            raise ConfigError(f"device {self.name}: decode_attention_flops must be positive")
        if not self.peak_flops or any(not v > 0 for v in self.peak_flops.values()):
            raise ConfigError(f"device {self.name}: peak_flops needs positive values")
        if self.compute_precision not in self.peak_flops:
            raise ConfigError(f"device {self.name}: no peak for compute precision {self.compute_precision!r}")

    def attention_time(self, kv_s: Any, compute_s: Any) -> Any:
        """Attention's time from its two terms: the larger (a roofline) or, without overlap, their sum."""
        return (np.maximum if self.attention_overlap else np.add)(kv_s, compute_s)

    def default_weights_precision(self, model: ModelSpec) -> str:
        """The weights precision this device's usual runtime loads when none is given
        (docs/research/plan-facts.md §4): vLLM (``runtime == "vllm"``: h100-sxm, a100-80gb) the checkpoint's dtype,
        :func:`simkv.models.checkpoint_weights_precision` (2 B per parameter); OpenVINO (the Intel presets, ``host``)
        what an optimum-intel export holds, :func:`simkv.models.optimum_intel_weights_precision` (int8 from 10^9
        parameters, else f16)."""
        if self.runtime == "vllm":
            return checkpoint_weights_precision(model)
        return optimum_intel_weights_precision(model)

    def check_tp(self, tp: int) -> None:
        """Refuse tensor parallelism this device's runtime does not offer, or a size its interconnect has no
        figures for (one line)."""
        if tp == 1:
            return
        if self.runtime == "openvino":
            raise ConfigError(f"--tp {tp}: device {self.name} runs OpenVINO, which has no tensor parallelism to model "
                              "here: its GPU plugin has none (multi-GPU is HETERO pipeline parallelism) and the CPU "
                              "plugin's socket split (model_distribution_policy TENSOR_PARALLEL) splits the "
                              "fully-connected weights, not the KV cache (docs/research/plan-facts.md §2.3)")
        INTERCONNECTS[self.interconnect].fit(tp)

    @property
    def kv_efficiency(self) -> float:
        return self.bandwidth_efficiency if self.kv_bandwidth_efficiency is None else self.kv_bandwidth_efficiency

    def peak(self, precision: str | None = None) -> float:
        precision = precision or self.compute_precision
        try:
            return self.peak_flops[precision]
        except KeyError:
            raise ConfigError(
                f"device {self.name} has no peak for {precision!r}; it has {', '.join(self.peak_flops)}"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["peak_flops"] = dict(self.peak_flops)
        d["sources"] = dict(self.sources)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Device":
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"device file has unknown keys: {', '.join(sorted(unknown))}")
        try:
            return cls(**{**data, "peak_flops": dict(data["peak_flops"]), "sources": dict(data.get("sources", {}))})
        except (TypeError, KeyError, ValueError) as exc:
            raise ConfigError(f"bad device description: {exc}") from None


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


def matmul_params(model: ModelSpec) -> int:
    """Parameters a token multiplies by if its logits are computed: the weight matrices and
    the LM head, not the input-embedding lookup (a separate table unless tied), and of a mixture
    of experts only the experts it is routed to (:attr:`simkv.models.ModelSpec.active_params`)."""
    return model.active_params


def expected_experts(experts: int, per_token: int, tokens: Any) -> Any:
    """Expected distinct experts one MoE layer runs for ``tokens`` tokens, each routed to ``per_token``
    of ``experts``: ``E · (1 − (1 − k/E)^B)``.

    Assumption: routing is uniform and independent between tokens (each token picks a uniformly random
    set of k distinct experts). An expert is then in one token's set with probability k/E, in none of B
    tokens' with (1 − k/E)^B, and the expectation of the count is E times the complement. Real routers
    are skewed (load-balancing losses only even them out on average), which touches fewer experts for
    the same B: this is an upper bound of the weights a step reads under skew. B = 1 gives k; B → ∞ gives E."""
    tokens = np.asarray(tokens, dtype=np.float64)
    return experts * (1.0 - (1.0 - per_token / experts) ** tokens)


def weights_read_bytes(model: ModelSpec, weights_bytes: Any, tokens: Any) -> Any:
    """Bytes of weights a step of ``tokens`` tokens streams, of ``weights_bytes`` for all of them.

    A dense model reads every weight once per step (``weights_bytes`` itself; the input-embedding table
    included, as the H100 preset's weight-streaming efficiency was derived). A mixture of experts reads its
    non-expert weights once and, in each MoE layer, only the experts the step's tokens are routed to — the
    :func:`expected_experts` of E: ``W · (1 − f) + W · f · expected(B) / E``, where ``f`` is the routed experts'
    share of the parameters (``routed_params / weight_params``; every weight at one precision)."""
    routed = model.routed_params
    if not routed:
        return weights_bytes
    w = np.asarray(weights_bytes, dtype=np.float64)
    share = routed / model.weight_params
    touched = expected_experts(model.experts, model.experts_per_token, tokens)
    return w * (1.0 - share) + w * share * touched / model.experts


def pair_flops_per_model(model: ModelSpec) -> int:
    """FLOPs of one attended pair summed over every attention layer (:func:`simkv.kvspec.pair_flops`, MLA
    expanded): ``4 · layers · heads · head_dim`` for a uniform model. What :func:`step_cost` charges per
    ``attended_pairs`` — right where every attention layer attends the same positions."""
    return sum(pair_flops(layer, model.heads) for layer in model.kv_layers)


def allreduces_per_step(model: ModelSpec) -> int:
    """All-reduces one tensor-parallel step runs (docs/research/plan-facts.md §2.1–2.2): in each decoder layer one
    after attention (``o_proj``, a linear-attention ``out_proj``: ``RowParallelLinear``) when the layer has
    attention projections, one after the MLP or MoE (``down_proj``), and one after the vocab-parallel input
    embedding (``VocabParallelEmbedding.forward``): ``2 · L + 1`` for a dense model (vllm/model_executor/models/
    llama.py; Vidur adds the same two per layer, vidur/entities/execution_time.py). The LM head's logits gather
    is left out."""
    projections = sum(layer.kind != "none" or layer.reuses is not None for layer in model.kv_layers)
    return projections + model.layers + 1


def allreduce_s(model: ModelSpec, device: Device, new_tokens: Any) -> Any:
    """Seconds of a step's all-reduces under tensor parallelism (0 when ``model.tp`` is 1): :func:`allreduces_per_step`
    all-reduces of ``new_tokens · hidden · 2 B`` each over ``model.tp`` devices (:class:`Interconnect`)."""
    n = model.tp
    if n == 1:
        return 0.0 * np.asarray(new_tokens, dtype=np.float64)
    link = INTERCONNECTS[device.interconnect]
    nbytes = np.asarray(new_tokens, dtype=np.float64) * float(model.hidden * ACTIVATION_BYTES)
    return allreduces_per_step(model) * link.allreduce_s(nbytes, n)


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
    """
    peak = device.peak(precision) * device.flops_efficiency
    decode_rate = device.decode_attention_flops or peak
    weights_bw = device.memory_bandwidth * device.bandwidth_efficiency
    kv_bw = device.memory_bandwidth * device.kv_efficiency
    logit_tokens = new_tokens if logit_tokens is None else logit_tokens
    args = (weights_bytes, new_tokens, attended_pairs, kv_read_bytes, kv_write_bytes, copy_bytes, logit_tokens,
            decode_pairs, attention_flops, decode_flops)
    scalar = all(np.ndim(a) == 0 for a in args)
    w, n, pairs, kr, kw, cb, logits, dpairs, aflops, dflops = np.broadcast_arrays(
        *(np.asarray(a, dtype=np.float64) for a in args))
    w = weights_read_bytes(model, w, n)
    nbytes = w + kr + kw
    head = float(model.vocab * model.hidden) if model.weight_params else 0.0
    per_pair = float(pair_flops_per_model(model))
    matmul_flops = 2.0 * (matmul_params(model) - head) * n + 2.0 * head * logits
    flops = matmul_flops + per_pair * pairs + aflops
    weights_s, kv_s = w / weights_bw, (kr + kw) / kv_bw
    matmul_compute_s = matmul_flops / peak
    attention_compute_s = (per_pair * (pairs - dpairs) + (aflops - dflops)) / peak + (per_pair * dpairs + dflops) / decode_rate
    matmul_s = np.maximum(weights_s, matmul_compute_s)
    attention_s = device.attention_time(kv_s, attention_compute_s)
    memory_s, compute_s = weights_s + kv_s, matmul_compute_s + attention_compute_s
    copy_s = cb / device.copy_bandwidth
    overhead = np.full(w.shape, device.step_overhead_s + model.layers * device.layer_overhead_s)
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


def _window_pairs(context: Any, new: Any, window: int | None) -> Any:
    """Σ over ``new`` tokens appended after ``context`` of min(position + 1, window) (floats, exact on integers)."""
    # token i (0-based among the new) attends to context + i + 1 positions
    total = new * context + new * (new + 1) / 2
    if window is not None:
        w = float(window)
        # positions beyond the window: Σ_i max(0, context + i + 1 - w)
        first = np.maximum(0.0, w - context)  # new tokens that still fit the window entirely
        over = np.maximum(0.0, new - np.minimum(first, new))
        start = context + np.minimum(first, new) + 1 - w  # excess of the first over-window token
        total = total - over * start - over * (over - 1) / 2
    return total


def _chunk_prefix(n: Any, chunk: int) -> Any:
    """Σ_{p < n} (p mod C + 1): the pairs of the first n positions under chunked attention of C."""
    full = np.floor(n / chunk)
    rest = n - full * chunk
    return full * (chunk * (chunk + 1) / 2) + rest * (rest + 1) / 2


def layer_pairs(layer: LayerKV, context: Any, new: Any) -> Any:
    """Σ over ``new`` tokens appended after ``context`` cached ones of the positions each attends to in
    ``layer`` (itself included): all ``context + i + 1`` (full, MLA), at most W (sliding), or those since its
    chunk's start (chunked of C: the token at position p attends to positions C·⌊p/C⌋ … p, ``p mod C + 1`` of
    them, so the sum is F(context + new) − F(context) with F(n) = ⌊n/C⌋ · C(C+1)/2 + r(r+1)/2, r = n mod C).
    0 for a layer without attention."""
    context = np.asarray(context, dtype=np.float64)
    new = np.asarray(new, dtype=np.float64)
    if not layer.caches_tokens:
        return np.zeros(np.broadcast(context, new).shape)
    if layer.kind == "chunked":
        return _chunk_prefix(context + new, layer.window) - _chunk_prefix(context, layer.window)
    return _window_pairs(context, new, layer.window if layer.kind == "sliding" else None)


def read_tokens(layer: LayerKV, context: Any) -> Any:
    """Cached tokens a step reads from ``layer`` when its sequence has ``context`` of them: all (full, MLA),
    the last ``min(context, W)`` (sliding), or those of the current chunk, ``context mod C`` (chunked: after the
    chunk boundary a token attends to nothing before it; over a long decode the mean is (C − 1)/2). Python
    integers stay integers."""
    if not layer.caches_tokens:
        return 0 * context
    if layer.kind == "sliding":
        return np.minimum(context, layer.window) if isinstance(context, np.ndarray) else min(context, layer.window)
    if layer.kind == "chunked":
        return context % layer.window
    return context


def attended_pairs(model: ModelSpec, context: Any, new: Any) -> Any:
    """Σ over ``new`` tokens appended after ``context`` cached ones of the positions each
    attends to (itself included), capped by the model's sliding window (a uniform model)."""
    context = np.asarray(context, dtype=np.float64)
    new = np.asarray(new, dtype=np.float64)
    total = _window_pairs(context, new, model.sliding_window)
    return total if total.ndim else float(total)


#: How a runtime computes MLA attention (and so which cache form it reads):
#: ``latent`` — vLLM (vllm/v1/attention/backends/mla/common.py): a latent cache; one-token queries (decode)
#: absorbed into the latent, multi-token queries (prefill, chunked prefill) expand the cached latent per head;
#: ``latent-expand`` — transformers 5.x (``DeepseekV3Attention.expand_kv``): a latent cache, every step expands
#: all of it; ``decompressed`` — an optimum-intel / OpenVINO export: per-head K and V cached (docs/DESIGN.md §4c).
MLA_COMPUTE = ("latent", "latent-expand", "decompressed")


@dataclass(frozen=True)
class AttentionWork:
    """What one sequence's attention and state layers do in a step (arrays or floats)."""

    #: Attention and state arithmetic, FLOPs; ``decode_flops`` is the part from a one-token query's pairs.
    flops: Any
    decode_flops: Any
    #: Bytes read (the cache the step attends to, linear states, decompressed MLA K/V) and written (the new
    #: tokens' KV, updated states, decompressed MLA K/V).
    read_bytes: Any
    write_bytes: Any


def attention_work(model: ModelSpec, kv: Precision, context: Any, new: Any, *, sequences: Any = 1,
                   mla: str = "latent", recurrent_bytes: float = F32) -> AttentionWork:
    """The attention work of ``sequences`` sequences, each with ``context`` cached tokens appending ``new``
    ones, summed over the model's layers by kind (floats; arrays broadcast).

    - Attention layers (full, sliding, chunked, MLA): :func:`layer_pairs` pairs at
      :func:`simkv.kvspec.pair_flops` each; reads :func:`read_tokens` cached tokens and writes ``new`` at the
      layer's bytes per token (:func:`simkv.kvspec.token_bytes`: K + V + metadata, MLA in its cached form).
    - MLA by ``mla`` (:data:`MLA_COMPUTE`): absorbed pairs where vLLM absorbs (``latent``, one-token queries);
      where a latent cache is expanded, the pairs are the expanded ones, ``kv_b_proj`` runs on every cached
      position read (:func:`simkv.kvspec.expand_flops`; the new tokens' share is in the weight matmuls) and the
      decompressed K and V of every attended position are written once and read once (2 × their bytes at the
      KV precision, no metadata).
    - Linear-attention layers: O(1) per token — the state (conv + recurrent, :func:`simkv.kvspec.state_bytes`:
      conv at the KV precision's element size, recurrent at ``recurrent_bytes``, f32 in transformers' torch
      delta rule) is read once and written once per step whatever ``new`` is, and every new token costs
      :func:`simkv.kvspec.state_flops`.
    """
    if mla not in MLA_COMPUTE:
        raise ConfigError(f"unknown MLA computation {mla!r}; choose {', '.join(MLA_COMPUTE)}")
    storage = "decompressed" if mla == "decompressed" else "latent"
    b = np.asarray(sequences, dtype=np.float64)
    context = np.asarray(context, dtype=np.float64)
    new = np.asarray(new, dtype=np.float64)
    one_token = new == 1
    flops = decode = read = write = 0.0
    for layer, ids in model.groups:
        n = len(ids)
        if layer.kind == "linear":
            state = float(sum(state_bytes(layer, kv.bits / 8, recurrent_bytes)))
            stepped = b * np.where(new > 0, n * state, 0.0)
            read, write = read + stepped, write + stepped
            flops = flops + b * new * (n * float(state_flops(layer)))
            continue
        if not layer.caches_tokens:
            continue
        pairs = b * layer_pairs(layer, context, new)
        tokens = read_tokens(layer, context)
        per_token = float(n * token_bytes([layer], kv, mla=storage))
        read, write = read + b * tokens * per_token, write + b * new * per_token
        expanded = float(n * pair_flops(layer, model.heads))
        if layer.latent is not None and mla != "decompressed":
            absorbed = float(n * pair_flops(layer, model.heads, absorbed=True))
            expands = ~one_token if mla == "latent" else np.ones(np.shape(one_token), dtype=bool)
            pair = np.where(expands, expanded, absorbed) * pairs
            big = float(n * token_bytes([layer], kv, mla="decompressed", meta_per_head=0))
            flops = flops + np.where(expands, b * tokens * (n * float(expand_flops(layer))), 0.0)
            moved = np.where(expands, b * (tokens + new) * (2.0 * big), 0.0)
            read, write = read + moved / 2, write + moved / 2
        else:
            pair = expanded * pairs
        flops = flops + pair
        decode = decode + np.where(one_token, pair, 0.0)
    return AttentionWork(flops, decode, read, write)


def forward_cost(
    model: ModelSpec,
    device: Device,
    kv: Precision,
    *,
    batch: Any,
    context: Any,
    new: Any,
    weights_precision: str = "f16",
    copy_bytes: Any = 0,
    precision: str | None = None,
    mla: str = "latent",
    recurrent_bytes: float = F32,
) -> StepCost:
    """One forward pass of ``batch`` sequences, each with ``context`` cached tokens and
    ``new`` tokens to process: decode is ``new=1``, a prefill is ``context=0, new=prompt``.
    Each layer reads what it attends to (window- and chunk-capped; a linear layer its state) and writes
    the new tokens' KV (:func:`attention_work`; ``mla`` and ``recurrent_bytes`` as there); a mixture of
    experts reads the experts its ``batch × new`` tokens are routed to (:func:`weights_read_bytes`)."""
    batch = np.asarray(batch, dtype=np.float64)
    context = np.asarray(context, dtype=np.float64)
    new = np.asarray(new, dtype=np.float64)
    work = attention_work(model, kv, context, new, sequences=batch, mla=mla, recurrent_bytes=recurrent_bytes)
    result = step_cost(
        model,
        device,
        weights_bytes=model_weights_bytes(model, weights_precision),
        new_tokens=batch * new,
        attended_pairs=0,
        kv_read_bytes=work.read_bytes,
        kv_write_bytes=work.write_bytes,
        copy_bytes=copy_bytes,
        precision=precision,
        logit_tokens=batch,
        attention_flops=work.flops,
        decode_flops=work.decode_flops,  # a one-token query per sequence
    )
    return result


# --------------------------------------------------------------------------- devices

#: Preset devices by name; ``host`` is added from the calibration file when present.
DEVICES: dict[str, Device] = {}


def _register(device: Device) -> Device:
    DEVICES[device.name] = device
    return device


def host_preset_path() -> Path:
    """Where ``simkv calibrate`` writes the host preset (``$SIMKV_HOST_PRESET`` overrides)."""
    import os

    override = os.environ.get("SIMKV_HOST_PRESET")
    if override:
        return Path(override)
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "simkv" / "host.json"


def load_device(path: str | Path) -> Device:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read device file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"device file {path} is not JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"device file {path} must hold a JSON object")
    return Device.from_dict(data)


def get_device(name_or_path: str) -> Device:
    """A preset by name, ``host`` (the calibration file), or a device JSON file path."""
    key = name_or_path.lower()
    if key in DEVICES:
        return DEVICES[key]
    if key == "host":
        path = host_preset_path()
        if not path.exists():
            raise ConfigError(f"no host preset at {path}; run `simkv calibrate` first")
        return load_device(path)
    if name_or_path.endswith(".json") or Path(name_or_path).exists():
        return load_device(name_or_path)
    raise ConfigError(f"unknown device {name_or_path!r}; presets: {', '.join(DEVICES)}, host, or a preset file")


T = 1e12
G = 1e9

# Presets: peaks from vendor sheets; efficiencies from published measurements (see sources).
_H100 = "experiments/data/h100.json (experiments/h100_bench.py on one H100 80GB HBM3 SXM, torch 2.11, CUDA events, median of 30)"
_register(Device(
    name="h100-sxm",
    description="NVIDIA H100 SXM5 80 GB (HBM3), engine-grade step (CUDA graphs)",
    memory_bytes=80 * 10**9,
    memory_bandwidth=3.35 * T,
    peak_flops={"bf16": 989.4 * T, "f16": 989.4 * T, "f8": 1978.9 * T, "int8": 1978.9 * T, "tf32": 494.7 * T, "f32": 66.9 * T},
    bandwidth_efficiency=0.694,
    kv_bandwidth_efficiency=0.892,
    flops_efficiency=0.561,
    step_overhead_s=0.0,
    copy_bandwidth=1.493 * T,
    compute_precision="bf16",
    runtime="vllm",
    interconnect="nvlink4",
    sources={
        "runtime": "an H100 serves with vLLM (or a CUDA engine like it): weights at the checkpoint's dtype, "
                   "vLLM --dtype auto (docs/research/plan-facts.md §4)",
        "interconnect": "NVLink 4 (H100 SXM5: 18 links, 900 GB/s per GPU, nvidia.com Hopper architecture page); "
                        "all-reduce times: " + _VIDUR_FIT.format("h100_dgx"),
        "memory_bandwidth": "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 3.35 TB/s HBM3, 80 GB)",
        "peak_flops": "NVIDIA H100 datasheet, dense (half the with-sparsity figures)",
        "kv_bandwidth_efficiency": "measured: 2 GiB device-to-device copy, 2.99 TB/s read+written = 0.892 of peak; " + _H100,
        "bandwidth_efficiency": "measured: llama-2-7b bf16 decode, batch 1, context 128, CUDA-graph step 5.82 ms, "
                                "minus its KV at the copy rate: 13.48 GB of weights at 0.694 of peak; " + _H100,
        "flops_efficiency": "measured: llama-2-7b bf16 prefill of 2,048 tokens (eager forward) 49.8 ms for 27.6 TFLOP "
                            "= 0.561 of peak (a bf16 8192^3 matmul alone reaches 0.772); " + _H100,
        "step_overhead_s": "0: a CUDA-graph step has no per-kernel launch cost; the eager loop adds 0.7-5 ms on the "
                           "same shapes (eager_step_s - step_s in " + _H100.split(" (")[0] + ")",
        "copy_bandwidth": "measured: the 2 GiB copy moved 1.49 TB/s of buffer (each byte read and written); " + _H100,
    },
))

_register(Device(
    name="a100-80gb",
    description="NVIDIA A100 SXM4 80 GB (HBM2e)",
    memory_bytes=80 * 10**9,
    memory_bandwidth=2.039 * T,
    peak_flops={"bf16": 312 * T, "f16": 312 * T, "int8": 624 * T, "tf32": 156 * T, "f32": 19.5 * T},
    bandwidth_efficiency=0.685,
    kv_bandwidth_efficiency=0.88,
    flops_efficiency=0.561,
    step_overhead_s=0.0,
    copy_bandwidth=2.039 * T * 0.88 / 2,
    compute_precision="bf16",
    runtime="vllm",
    interconnect="nvlink3",
    sources={
        "runtime": "an A100 serves with vLLM: weights at the checkpoint's dtype, vLLM --dtype auto "
                   "(docs/research/plan-facts.md §4)",
        "interconnect": "NVLink 3 (A100 SXM4: 12 links, 600 GB/s, nvidia.com NVLink page); all-reduce times: "
                        + _VIDUR_FIT.format("a100_dgx"),
        "memory_bandwidth": "NVIDIA A100 Tensor Core GPU datasheet (80 GB SXM: 2,039 GB/s)",
        "peak_flops": "NVIDIA A100 datasheet, dense (half the with-sparsity figures)",
        "kv_bandwidth_efficiency": "published: a DRAM read kernel reaches 1.80 TB/s = 88 % on an A100 80GB SXM, Nsight "
                                   "Compute agreeing (forums.developer.nvidia.com/t/trouble-to-reach-peak-bandwidth-of-a100/339083)",
        "bandwidth_efficiency": "assumed: 0.88 x the GEMV/stream ratio measured on the H100 (0.694 / 0.892)",
        "flops_efficiency": "assumed: the H100's measured prefill fraction (0.561), same CUDA software stack",
        "step_overhead_s": "0: an engine-grade step (CUDA graphs), as for h100-sxm",
        "copy_bandwidth": "a copy reads and writes each byte: 0.88 x peak / 2",
    },
))

#: The Intel presets' efficiencies, overhead and copy rate: no public measurement of these runtimes on
#: these devices was found, so they are assumptions, and say so.
_INTEL_ASSUMED = {
        "runtime": "OpenVINO GenAI over an optimum-intel export: int8 weights from 10^9 parameters, else f16 "
                   "(optimum-intel, docs/research/plan-facts.md §4); no tensor parallelism (§2.3)",
        "bandwidth_efficiency": "assumed, not measured: no public measurement of this runtime on this device was found; "
                                "0.8, between the H100's measured GEMV (0.69) and stream (0.89) fractions",
        "flops_efficiency": "assumed, not measured: 0.5 of the matrix-engine peak (the H100's measured prefill fraction is 0.56)",
        "step_overhead_s": "assumed, not measured: 0.5 ms per inference, the order `simkv calibrate` measures for the "
                           "OpenVINO CPU plugin here (a 1-layer model)",
        "copy_bandwidth": "a copy reads and writes each byte: 0.8 x peak / 2",
}


_register(Device(
    name="arc-a770",
    description="Intel Arc A770 16 GB (GDDR6, 32 Xe-cores, 512 XMX engines)",
    memory_bytes=16 * GIB,
    memory_bandwidth=560 * G,
    # Xe-core: 2,048 FP16/BF16 and 4,096 INT8 XMX ops per clock; 256 FP32 ops per clock (vector)
    peak_flops={"f16": 32 * 2048 * 2.1e9, "bf16": 32 * 2048 * 2.1e9, "int8": 32 * 4096 * 2.1e9, "f32": 32 * 256 * 2.1e9},
    bandwidth_efficiency=0.8,
    flops_efficiency=0.5,
    step_overhead_s=0.5e-3,
    copy_bandwidth=560 * G * 0.8 / 2,
    compute_precision="f16",
    sources={
        "memory_bandwidth": "Intel ARK, Arc A770 Graphics 16GB: 560 GB/s, 2,100 MHz graphics clock",
        "peak_flops": "Intel Architecture Day 2021, Xe-HPG Xe-core ops/clock x 32 Xe-cores x 2.1 GHz",
        **_INTEL_ASSUMED,
    },
))

_register(Device(
    name="xeon-8480",
    description="Intel Xeon Platinum 8480+ socket (Sapphire Rapids, 56 cores, 8x DDR5-4800, AMX)",
    memory_bytes=512 * GIB,
    memory_bandwidth=8 * 8 * 4800e6,
    # AMX: 1,024 BF16 / 2,048 INT8 ops per cycle per core; AVX-512: 2 FMA x 16 f32 lanes
    peak_flops={"bf16": 56 * 1024 * 2.0e9, "int8": 56 * 2048 * 2.0e9, "f32": 56 * 64 * 2.0e9},
    bandwidth_efficiency=0.8,
    flops_efficiency=0.5,
    step_overhead_s=0.5e-3,
    copy_bandwidth=8 * 8 * 4800e6 * 0.8 / 2,
    compute_precision="bf16",
    sources={
        "memory_bandwidth": "Intel ARK, Xeon Platinum 8480+: 8 channels DDR5-4800 (8 B x 4.8 GT/s each)",
        "peak_flops": "Intel ARK base clock 2.0 GHz x 56 cores x AMX/AVX-512 ops per cycle (Intel optimization manual)",
        **_INTEL_ASSUMED,
    },
))

_register(Device(
    name="core-ultra-155h-igpu",
    description="Intel Core Ultra 7 155H integrated Arc GPU (8 Xe-LPG cores, LPDDR5X-7467 shared)",
    memory_bytes=16 * GIB,
    memory_bandwidth=16 * 7467e6,
    # Xe-LPG core: 128 FP32 lanes (FMA = 2 FLOPs), FP16 at twice the rate, INT8 DP4a at 4x; 2.25 GHz
    peak_flops={"f32": 8 * 256 * 2.25e9, "f16": 8 * 512 * 2.25e9, "int8": 8 * 1024 * 2.25e9},
    bandwidth_efficiency=0.8,
    flops_efficiency=0.5,
    step_overhead_s=0.5e-3,
    copy_bandwidth=16 * 7467e6 * 0.8 / 2,
    compute_precision="f16",
    sources={
        "memory_bytes": "half of a 32 GB system (the iGPU shares system memory)",
        "memory_bandwidth": "Intel ARK, Core Ultra 7 155H: LPDDR5X-7467, 128-bit bus",
        "peak_flops": "Intel ARK max graphics clock 2.25 GHz x 8 Xe-cores x 128 FP32 lanes x 2",
        **_INTEL_ASSUMED,
    },
))


#: The device a command takes when ``--device`` names none — every command alike (docs/guide/cli.md, "The default
#: device"): the memory a single session or a serving run has beside the weights, the precisions its usual runtime
#: loads the weights (and, serving, keeps the KV cache) in, and what each step costs. The Xeon 8480 socket is the
#: CPU that OpenVINO's runtimes — the CPU plugin and GenAI's continuous batching, the rules simkv models and checks
#: against the real runtimes on a CPU — run on, and its 512 GiB hold every preset's weights as an optimum-intel
#: export stores them (int8 from 10^9 parameters) except deepseek-v3's 625 GiB.
DEFAULT_DEVICE = "xeon-8480"


# --------------------------------------------------------------------------- reports


def device_summary(device: Device) -> dict[str, Any]:
    """What ``simkv cost --json`` and ``simkv devices --json`` say about a device."""
    return {
        "name": device.name,
        "description": device.description,
        "memory_bytes": device.memory_bytes,
        "bandwidth": device.memory_bandwidth,
        "peak": dict(device.peak_flops),
        "compute_precision": device.compute_precision,
        "efficiencies": {
            "bandwidth": device.bandwidth_efficiency,
            "kv_bandwidth": device.kv_efficiency,
            "flops": device.flops_efficiency,
        },
        "overhead": device.step_overhead_s,
        "layer_overhead": device.layer_overhead_s,
        "copy_bandwidth": device.copy_bandwidth,
        "decode_attention_flops": device.decode_attention_flops,
        "attention_overlap": device.attention_overlap,
        "runtime": device.runtime,
        "interconnect": device.interconnect,
        "sources": dict(device.sources),
    }


def estimate(
    model: ModelSpec,
    device: Device,
    kv: Precision,
    *,
    batch: int = 1,
    context: int = 1024,
    prompt: int | None = None,
    weights_precision: str = "f16",
    mla: str = "latent",
) -> dict[str, Any]:
    """The figures of ``simkv cost``: a decode step of ``batch`` sequences with ``context`` cached
    tokens, a prefill of ``prompt`` tokens, the copy time per GiB, and the stateless loop's step
    (the whole ``context + 1`` tokens recomputed) beside the stateful one. The stateful KV is what a
    runtime that keeps every token holds (OpenVINO's stateful pipeline, docs/DESIGN.md §4c), linear
    layers' states included. A mixture of experts adds ``moe`` (experts touched, weights read)."""
    from simkv.limits import MAX_BATCH, MAX_TOKENS

    for name, value, low, high in (("batch", batch, 1, MAX_BATCH), ("context", context, 0, MAX_TOKENS),
                                   ("prompt", prompt, 1, MAX_TOKENS)):
        if value is not None and (not isinstance(value, int) or value < low or value > high):
            raise ConfigError(f"--{name} must be an integer in {low:,}..{high:,}, got {value!r}")
    if mla not in MLA_COMPUTE:
        raise ConfigError(f"unknown MLA computation {mla!r}; choose {', '.join(MLA_COMPUTE)}")
    storage = "decompressed" if mla == "decompressed" else "latent"
    decode = forward_cost(model, device, kv, batch=batch, context=context, new=1, weights_precision=weights_precision,
                          mla=mla)
    work = attention_work(model, kv, context, 1, mla=mla)
    layers = model.kv_layers
    # the decode step's bytes per sequence in integers (exact at any size): the cache it reads, the new token's KV,
    # plus what attention_work adds on top (linear states, expanded MLA K/V; none for plain attention layers)
    cache_read = sum(read_tokens(layer, context) * token_bytes([layer], kv, mla=storage) for layer in layers)
    cache_write = token_bytes(layers, kv, mla=storage)
    kv_read = batch * (cache_read + int(round(float(work.read_bytes) - cache_read)))
    kv_write = batch * (cache_write + int(round(float(work.write_bytes) - cache_write)))
    kept = batch * request_bytes(layers, kv, context + 1, mla=storage, windows=False)
    stateless = forward_cost(model, device, kv, batch=batch, context=0, new=context + 1,
                             weights_precision=weights_precision, mla=mla)
    all_weights = model_weights_bytes(model, weights_precision)
    out: dict[str, Any] = {
        "model": model.name,
        "batch": batch,
        "context": context,
        "kv_precision": kv.name,
        "weights_precision": weights_precision,
        "decode_step_s": decode.seconds,
        "copy_s_per_gib": GIB / device.copy_bandwidth,
        "bound": decode.bound,
        "weights_bytes": all_weights,
        "kv_read_bytes": kv_read,
        "kv_write_bytes": kv_write,
        "flops": decode.flops,
        "terms": {"memory_s": decode.memory_s, "compute_s": decode.compute_s, "matmul_s": decode.matmul_s,
                  "attention_s": decode.attention_s, "overhead_s": decode.overhead_s},
        "stateless": {
            "decode_step_s": stateless.seconds,
            "bound": stateless.bound,
            "flops": stateless.flops,
            "kv_peak_bytes": kept,
            "kv_between_steps_bytes": 0,
            "slowdown": stateless.seconds / decode.seconds,
        },
        "stateful_kv_bytes": kept,
        "device": device_summary(device),
    }
    if model.routed_params:
        out["moe"] = {
            "experts": model.experts,
            "experts_per_token": model.experts_per_token,
            "moe_layers": model.moe_layers,
            "params": model.weight_params,
            "active_params": model.active_params,
            "decode_experts_touched": float(expected_experts(model.experts, model.experts_per_token, batch)),
            "decode_weights_read_bytes": float(weights_read_bytes(model, all_weights, batch)),
        }
    if any(layer.latent is not None for layer in layers):
        out["mla"] = mla
    if prompt is not None:
        pre = forward_cost(model, device, kv, batch=batch, context=0, new=prompt, weights_precision=weights_precision,
                           mla=mla)
        out["prefill_s"] = pre.seconds
        out["prefill_bound"] = pre.bound
        out["prefill_flops"] = pre.flops
    return out

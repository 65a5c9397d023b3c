"""Devices: a device's peaks, the fractions of them a real engine achieves, its fixed costs, and its usual runtime.

The presets are data: one file per device in ``simkv/data/devices/<name>.json`` (beside the model configs'
``data/configs``), every number with its source in the file's ``sources`` (vendor sheet, published measurement,
measured here, or "assumed" with the rule). A preset file is also a valid ``--device PATH.json``; ``host`` is the file
``simkv calibrate`` writes (:func:`host_preset_path`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simkv.cost.interconnects import INTERCONNECTS
from simkv.errors import ConfigError
from simkv.jsonfile import read_json_object
from simkv.limits import MAX_CONFIG_BYTES, MAX_OVERHEAD_S
from simkv.shipped import DEVICE_DIR
from simkv.models import ModelSpec, checkpoint_weights_precision, optimum_intel_weights_precision

GIB = 1024**3

#: The terms a device's ``paged`` block may set (:meth:`Device.paged_kernel`).
PAGED_TERMS = ("step_overhead_s", "layer_overhead_s", "sequence_overhead_s", "head_overhead_s", "prompt_token_overhead_s",
               "vocab_overhead_s", "decode_attention_flops", "kv_bandwidth_efficiency", "memory_bandwidth", "matmul_flops",
               "matmul_rows_flops")

#: Rows of one block of the CPU plugin's weight matmuls (a FullyConnected node runs as oneDNN's brgemm inner
#: product, ``brgemm_avx512_bf16`` on an AVX-512 bf16 host without AMX). ``jit_brgemm_ip_conf_t::get_os_block``
#: (oneDNN ``src/cpu/x64/jit_brgemm_inner_product_utils.cpp``, forward): ``max_os_block`` is 64 (128 only with AMX
#: bf16 and rows a multiple of 128, or a "gigantic" shape: ic >= 9,216, oc >= 4,096, rows >= 512); the minimum
#: block is raised to it when ``div_up(rows, 64) · div_up(oc, 64) > 50 · threads`` (enough blocks per thread), so
#: then ``os_block = max_div(rows, 64)`` falls below the minimum past 64 rows unless 64 divides them and becomes 64:
#: ``jit_brgemm_ip_fwd_conf_t::init_conf`` sets ``nb_os = div_up(rows, os_block)``, the last block the rows left
#: over (its own brgemm kernel, ``get_brg_kernel_index``'s ``is_M_tail``). Up to 64 rows the call is one block of
#: all its rows. :meth:`Device.matmul_rate` prices a step's matmuls so.
MATMUL_ROW_BLOCK = 64


def _finite_seconds(v: Any) -> bool:
    """A fixed cost per unit of work (seconds) a device file may give: a number in [0, MAX_OVERHEAD_S], not a
    boolean (times a step's tokens, layers and heads it stays finite)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= MAX_OVERHEAD_S


def _check_rows_flops(name: str, points: Any) -> None:
    """One line unless ``points`` are (rows, FLOP/s) pairs: rows whole, >= 1, increasing; rates positive."""
    try:
        pairs = [(r, f) for r, f in points]
    except (TypeError, ValueError):
        pairs = None
    if pairs is None or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 or not isinstance(f, (int, float))
                            or not f > 0 for r, f in pairs) or any(a[0] >= b[0] for a, b in zip(pairs, pairs[1:])):
        raise ConfigError(f"device {name}: matmul_rows_flops must be [rows, FLOP/s] pairs, rows whole, >= 1 and "
                          "increasing, rates positive")


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
    #: The peak (a key of ``peak_flops``) the weight matmuls of a quantized checkpoint run at, per weight format
    #: (simkv.weights' names; ``int4`` covers every ``int4-gN``): the kernel the device's runtime picks for it —
    #: fp8 W8A8 tensor cores, or a weight-only kernel that dequantises in the GEMM and multiplies in bf16
    #: (:meth:`gemm_precision`; docs/research/latency-facts.md §4). A format not listed: ``compute_precision``.
    gemm_kernels: Mapping[str, str] = field(default_factory=dict)
    #: Fixed cost per sequence in a step (a serving engine's per-sequence bookkeeping: block tables, the sampler),
    #: seconds, charged per sequence that samples a token (``step_cost``'s ``logit_tokens``).
    sequence_overhead_s: float = 0.0
    #: Fixed attention work per sequence, layer and query head in a step, seconds, whatever the context: OpenVINO's
    #: CPU paged-attention kernel (``MHAHelper::exec_loop_bhl`` in the CPU plugin's
    #: ``nodes/kernels/scaled_attn/executor_pa.cpp``) runs, per sequence and query head, a softmax call
    #: (``loop_softmax``), zeroes and reduces that head's output accumulators (``_output_bhl``, ``attn_reduce``)
    #: besides its per-block dot products (the per-position terms). Charged per sequence that samples a token
    #: (``step_cost``'s ``logit_tokens``) x layers x query heads. A paged term (``simkv calibrate`` measures it).
    head_overhead_s: float = 0.0
    #: Work per prompt token, layer and query head of a multi-token query beyond its priced matmuls and attention
    #: arithmetic, seconds: OpenVINO's CPU paged-attention kernel runs a prompt chunk in ``exec_loop_mixed``
    #: (``nodes/kernels/scaled_attn/executor_pa.cpp``): the chunk's K and V quantised into the u8 cache with a
    #: scale and zero point per token and KV head, every cached block of the sequence repacked for the brgemm
    #: kernels (``transpose_16NxK``, dequantised), then per block of 32 query rows and head a brgemm, a softmax per
    #: row and the output written back. Charged per new token that samples no token (``new_tokens -
    #: logit_tokens``: a step's prompt tokens but each finishing prompt's last) x layers x query heads; a decode
    #: token's share of it is in the per-sequence terms. A paged term (``simkv calibrate`` measures it).
    prompt_token_overhead_s: float = 0.0
    #: Work per vocabulary entry of each sequence that samples a token, seconds: the serving engine's sampler reads
    #: the whole logits row of every sampling sequence after the LM head (priced as a matmul): OpenVINO GenAI's
    #: ``Sampler::_get_logit_vector`` takes the row of ``vocab_size`` floats and ``Sampler::_greedy_sample``
    #: (``src/cpp/src/sampling/sampler.cpp``) scans all of it for the arg max. Charged per sequence that samples a
    #: token (``step_cost``'s ``logit_tokens``) x the model's vocabulary. A paged term (``simkv calibrate``
    #: measures it).
    vocab_overhead_s: float = 0.0
    #: The terms a paged-attention serving engine on this device runs at where they differ from the stateful
    #: model's (:data:`PAGED_TERMS`; ``matmul_flops`` replaces the compute precision's peak, efficiency 1):
    #: ``simkv calibrate`` times OpenVINO GenAI's ContinuousBatchingPipeline for them
    #: (simkv.validate.genai.calibrate). :meth:`paged_kernel` applies them; empty: the same as the stateful model.
    paged: Mapping[str, Any] = field(default_factory=dict)
    #: The weight matmuls' achieved FLOP/s by the rows they multiply (a step's tokens: a decode step's batch, a
    #: prefill chunk), as ((rows, FLOP/s), ...) in increasing rows: where the rate at a step's rows (interpolated
    #: in log rows, the end points held beyond them) is below the compute precision's peak · efficiency, the
    #: matmuls run at it (:meth:`matmul_rate`). A CPU's brgemm kernel at few rows is neither bound by streaming
    #: the weights nor at its large-matrix rate. Set by ``simkv calibrate``'s paged terms (the host); empty: the peak.
    matmul_rows_flops: tuple[tuple[int, float], ...] = ()

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
        if not isinstance(self.attention_overlap, bool):
            raise ConfigError(f"device {self.name}: attention_overlap must be true or false")
        if self.decode_attention_flops is not None and not self.decode_attention_flops > 0:
            raise ConfigError(f"device {self.name}: decode_attention_flops must be positive")
        if not self.peak_flops or any(not v > 0 for v in self.peak_flops.values()):
            raise ConfigError(f"device {self.name}: peak_flops needs positive values")
        if self.compute_precision not in self.peak_flops:
            raise ConfigError(f"device {self.name}: no peak for compute precision {self.compute_precision!r}")
        unknown = set(self.paged) - set(PAGED_TERMS)
        if unknown:
            raise ConfigError(f"device {self.name}: paged takes {', '.join(PAGED_TERMS)}, not {', '.join(sorted(unknown))}")
        _check_rows_flops(self.name, self.matmul_rows_flops)
        if "matmul_rows_flops" in self.paged:
            _check_rows_flops(self.name, self.paged["matmul_rows_flops"])
        per_work = (self.step_overhead_s, self.layer_overhead_s, self.sequence_overhead_s, self.head_overhead_s,
                    self.prompt_token_overhead_s, self.vocab_overhead_s)
        if not all(_finite_seconds(v) for v in per_work) or any(
                not _finite_seconds(v) if k.endswith("_overhead_s") else not isinstance(v, (int, float)) or not v >= 0
                for k, v in self.paged.items() if k != "matmul_rows_flops"):
            raise ConfigError(f"device {self.name}: step_overhead_s, layer_overhead_s, sequence_overhead_s, "
                              f"head_overhead_s, prompt_token_overhead_s, "
                              f"vocab_overhead_s and the paged terms must be numbers >= 0 (the overheads at most {MAX_OVERHEAD_S:g} s)")
        if "memory_bandwidth" in self.paged and not self.paged["memory_bandwidth"] > 0:
            raise ConfigError(f"device {self.name}: paged memory_bandwidth must be positive")
        for fmt, peak in self.gemm_kernels.items():
            if peak not in self.peak_flops:
                raise ConfigError(f"device {self.name}: gemm_kernels[{fmt!r}] = {peak!r} has no peak")

    def gemm_precision(self, weights_format: str) -> str:
        """The peak the weight matmuls of a checkpoint stored in ``weights_format`` run at on this device
        (:attr:`gemm_kernels`; ``int4-g128`` as ``int4``), else :attr:`compute_precision`."""
        kernels = self.gemm_kernels
        if weights_format in kernels:
            return kernels[weights_format]
        family = weights_format.split("-")[0]
        return kernels.get(family, self.compute_precision)

    def paged_kernel(self) -> "Device":
        """This device as a paged-attention serving engine runs on it: the :attr:`paged` terms in place of the
        stateful ones (``matmul_flops`` as the compute precision's peak at efficiency 1, ``memory_bandwidth`` as the
        weights' achieved streaming rate at efficiency 1), or the device itself."""
        if not self.paged:
            return self
        terms = dict(self.paged)
        changes: dict[str, Any] = {k: terms.pop(k) for k in list(terms) if k != "matmul_flops"}
        if "matmul_flops" in terms:
            changes["peak_flops"] = {**self.peak_flops, self.compute_precision: terms["matmul_flops"]}
            changes["flops_efficiency"] = 1.0
        if "memory_bandwidth" in changes:  # the achieved weight-streaming rate: efficiency 1, as matmul_flops
            changes["bandwidth_efficiency"] = 1.0
        if "matmul_rows_flops" in changes:
            changes["matmul_rows_flops"] = tuple((int(r), float(f)) for r, f in changes["matmul_rows_flops"])
        return replace(self, paged={}, **changes)

    def matmul_rate(self, rows: Any, peak: float) -> Any:
        """The weight matmuls' FLOP/s at ``rows`` rows (array or scalar), ``peak`` (the compute precision's peak ·
        efficiency) where no :attr:`matmul_rows_flops` is set. With it, the rate at r rows is the curve's,
        interpolated linearly in log2(rows) between its points (its end points held beyond them; rows below 1
        taken as 1) and capped at ``peak``, as the plugin's brgemm runs them (:data:`MATMUL_ROW_BLOCK` = B): up to B
        rows, or a multiple of B, the curve at r; past B, the ⌊r/B⌋ full blocks at the curve's rate for their
        ⌊r/B⌋·B rows and the r mod B rows left over at the rate of their own row count, the two times added
        (68 rows = 64 at the rate of 64 plus 4 at the rate of 4; 132 = 128 + 4)."""
        if not self.matmul_rows_flops:
            return peak
        xs = np.log2([r for r, _ in self.matmul_rows_flops])
        ys = [f for _, f in self.matmul_rows_flops]

        def curve(r):
            return np.minimum(np.interp(np.log2(r), xs, ys), peak)

        r = np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
        full = np.where(r > MATMUL_ROW_BLOCK, np.floor(r / MATMUL_ROW_BLOCK) * MATMUL_ROW_BLOCK, r)
        tail = r - full
        if not np.any(tail > 0):
            return curve(r)
        blocked = r / (full / curve(full) + tail / curve(np.maximum(tail, 1.0)))
        out = np.where(tail > 0, blocked, curve(r))
        return out if np.ndim(rows) else out[()]

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
        d["gemm_kernels"] = dict(self.gemm_kernels)
        d["paged"] = {k: ([list(p) for p in v] if k == "matmul_rows_flops" else v) for k, v in self.paged.items()}
        d["matmul_rows_flops"] = [list(p) for p in self.matmul_rows_flops]
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Device":
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"device file has unknown keys: {', '.join(sorted(unknown))}")
        try:
            return cls(**{**data, "peak_flops": dict(data["peak_flops"]), "sources": dict(data.get("sources", {})),
                          "gemm_kernels": dict(data.get("gemm_kernels", {})), "paged": dict(data.get("paged", {})),
                          "matmul_rows_flops": tuple(tuple(p) for p in data.get("matmul_rows_flops", ()))})
        except (TypeError, KeyError, ValueError) as exc:
            raise ConfigError(f"bad device description: {exc}") from None


#: The device presets' files are in ``simkv/data/devices`` (simkv.shipped.DEVICE_DIR, beside the model configs),
#: with device files that are no preset (``--device PATH``: an NPU).

#: The presets, in the order they are listed (each is ``DEVICE_DIR/<name>.json``).
PRESET_NAMES = ("h100-sxm", "a100-80gb", "arc-a770", "xeon-8480", "core-ultra-155h-igpu", "h200-sxm", "b200", "b300")


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
    data = read_json_object(path, f"device file {path}", MAX_CONFIG_BYTES, "a device file")
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


#: Preset devices by name (``host`` is read from the calibration file when asked for: :func:`get_device`).
DEVICES: dict[str, Device] = {name: load_device(DEVICE_DIR / f"{name}.json") for name in PRESET_NAMES}

#: The device a command takes when ``--device`` names none — every command alike (docs/guide/cli.md, "The default
#: device"): the memory a single session or a serving run has beside the weights, the precisions its usual runtime
#: loads the weights (and, serving, keeps the KV cache) in, and what each step costs. The Xeon 8480 socket is the
#: CPU that OpenVINO's runtimes — the CPU plugin and GenAI's continuous batching, the rules simkv models and checks
#: against the real runtimes on a CPU — run on, and its 512 GiB hold every preset's weights as an optimum-intel
#: export stores them (int8 from 10^9 parameters) except deepseek-v3's 625 GiB.
DEFAULT_DEVICE = "xeon-8480"


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
        "gemm_kernels": dict(device.gemm_kernels),
        "sequence_overhead": device.sequence_overhead_s,
        "paged": dict(device.paged),
        "matmul_rows_flops": [list(p) for p in device.matmul_rows_flops],
        "sources": dict(device.sources),
    }

"""One library call runs a scenario: :func:`simulate` → :class:`Result` (ledger, steps, metrics).

The CLI, the dashboard and the experiments all go through :func:`simulate`
and :func:`build_scenario`, so they always agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from simkv.cost import DEFAULT_DEVICE, DEVICES, get_device
from simkv.errors import ConfigError
from simkv.kvspec import token_bytes
from simkv.ledger import Ledger
from simkv.metrics import Metrics, compute, per_layer
from simkv.hfconfig import resolve_model
from simkv.models import (CHECKPOINT, INT8_WEIGHTS_FROM_PARAMS, WEIGHT_BYTES, WEIGHT_PRECISIONS, ModelSpec,  # noqa: F401 (re-exported)
                          optimum_intel_weights_precision, weights_bytes)
from simkv.precision import Precision, get_precision
from simkv.units import format_bytes, parse_bytes
from simkv.workload import Trim, Workload, chat_session, parse_ops

if TYPE_CHECKING:  # policies imports simkv, so simkv imports policies only when used
    from policies import Policy

DEFAULT_MODEL = "llama-3-8b"
DEFAULT_POLICY = "openvino-gpu"
DEFAULT_PROMPT = 1024
DEFAULT_DECODE = 2048
#: The default device's memory (:data:`simkv.cost.DEFAULT_DEVICE`), as a size a form or a flag holds.
DEFAULT_DEVICE_MEMORY = f"{DEVICES[DEFAULT_DEVICE].memory_bytes >> 30}GiB"
ENGINES = ("fast", "reference")


@dataclass(frozen=True)
class Scenario:
    model: ModelSpec
    precision: Precision
    policy: Policy
    workload: Workload
    device_memory: int = parse_bytes(DEFAULT_DEVICE_MEMORY)
    #: Bytes on the device besides the KV cache (weights, other models). They count toward the
    #: headroom limit and toward out-of-memory: KV allocated + weights_memory > device_memory.
    weights_memory: int = 0

    def __post_init__(self) -> None:
        if self.device_memory <= 0:
            raise ConfigError("device memory must be positive")
        if not isinstance(self.weights_memory, int) or self.weights_memory < 0:
            raise ConfigError(f"weights memory must be a non-negative number of bytes, got {self.weights_memory!r}")
        self.precision.check(self.model)  # rejects u4 with an odd head size
        self.policy.check(self.model, self.workload)
        if any(isinstance(op, Trim) for op in self.workload.ops):
            self.policy.check_trim(self.model, self.precision)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of one token across the whole model (K + V data and scales of every layer) as
        this policy's runtime stores them (the GPU plugin's scales follow its inference precision)."""
        return token_bytes(self.model.kv_layers, self.precision, meta_per_head=self.policy.meta_bytes_per_head(self.precision),
                           mla=self.policy.mla_form)

    def describe(self) -> str:
        return (
            f"{self.model.describe()}; {self.precision.name} KV; policy {self.policy.describe()}; "
            f"workload {self.workload}"
        )


@dataclass(frozen=True, eq=False)
class Result:
    scenario: Scenario
    ledger: Ledger
    #: One row per step (see :mod:`simkv.steps`).
    steps: np.ndarray
    oom: Exception | None = None
    engine: str = "fast"

    @cached_property
    def metrics(self) -> Metrics:
        return compute(self.ledger, self.steps, self.oom.step if self.oom else None)

    def per_layer(self, layers: int | None = None) -> list[dict]:
        """:func:`simkv.metrics.per_layer` for the first ``layers`` layers (default: all)."""
        return per_layer(self.ledger, self.scenario.model.layers if layers is None else layers)

    def summary(self) -> dict:
        """Metrics plus the scenario, JSON-ready."""
        s = self.scenario
        out = self.metrics.to_dict()
        out["scenario"] = {
            "model": s.model.name,
            "layers": s.model.layers,
            "heads": s.model.heads,
            "kv_heads": s.model.kv_heads,
            "head_dim": s.model.head_dim,
            "sliding_window": s.model.sliding_window,
            "precision": s.precision.name,
            "policy": s.policy.name,
            "policy_options": {f.name: getattr(s.policy, f.name) for f in s.policy.options()},
            "workload": str(s.workload),
            "device_memory_bytes": s.device_memory,
            "weights_memory_bytes": s.weights_memory,
            "kv_bytes_per_token": s.kv_bytes_per_token,
        }
        out["oom"] = str(self.oom) if self.oom else None
        return out


def simulate(scenario: Scenario, engine: str = "fast", progress: bool = False) -> Result:
    """Run a scenario. ``engine="reference"`` runs the slow, obviously-correct engine.

    ``progress`` shows a progress bar (on a terminal) for the reference engine,
    the only one slow enough to need it.
    """
    from simkv.engine import FastEngine
    from simkv.reference import ReferenceEngine

    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; choose fast or reference")
    runner = FastEngine(scenario) if engine == "fast" else ReferenceEngine(scenario, progress=progress)
    runner.run()
    return Result(scenario, runner.ledger, runner.steps.table(), runner.oom, engine)


def build_scenario(
    *,
    model: str | None = DEFAULT_MODEL,
    layers: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    sliding_window: int | None = None,
    precision: str | None = None,
    policy: str = DEFAULT_POLICY,
    policy_options: dict[str, object] | None = None,
    prompt: int = DEFAULT_PROMPT,
    decode: int = DEFAULT_DECODE,
    turns: int = 0,
    turn_tokens: int = 64,
    turn_decode: int | None = None,
    beam: int = 1,
    turn_divergence: int = 0,
    ops: str | None = None,
    device_memory: str | int | None = None,
    weights_memory: str | int | None = None,
    weights_precision: str | None = None,
    device: str | None = None,
) -> Scenario:
    """A scenario from plain values (what a CLI flag or a dashboard control holds).

    ``model``: a preset name or a ``config.json`` path (simkv.hfconfig); ``None`` with all four dimensions
    gives a custom shape; a preset with some dimensions overrides those (a uniform model's only); ``sliding_window`` N sets a window (0 removes a preset's,
    None keeps it; only policies that model windows use it). ``ops`` (e.g. ``"prefill:32,decode:100,reset"``)
    replaces the prompt/decode/turns/beam description of the workload; ``turn_divergence`` D makes each further
    turn first trim the D tokens the re-tokenized history differs in (:func:`simkv.workload.chat_session`).

    ``device`` (a preset, ``host`` or a preset file; default :data:`simkv.cost.DEFAULT_DEVICE`) is the device the
    session runs on: its memory unless ``device_memory`` (bytes or a size such as ``"16GiB"``) is given, and the
    weights' default precision, what its usual runtime loads. ``weights_memory`` (bytes or a size) is the device
    memory taken besides the KV cache; by default the model's weights at ``weights_precision`` (default:
    :func:`default_weights_precision` on the device), 0 for a custom shape. Weights that leave no room for the KV
    cache are refused here, before anything runs (:func:`check_weights_fit`).
    """
    from policies import get_policy

    spec = resolve_model(model, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                         sliding_window=sliding_window)
    pol = get_policy(policy, policy_options)
    prec = get_precision(precision or default_precision(pol, spec))
    if pol.accepted_precisions and prec.name not in pol.accepted_precisions:
        raise ConfigError(f"policy {pol.name}: the runtime does not accept {prec.name} for the KV cache "
                          f"(it takes {', '.join(pol.accepted_precisions)})")
    if ops:
        workload = parse_ops(ops)
    else:
        workload = chat_session(
            prompt, decode, turns=turns, turn_tokens=turn_tokens, turn_decode=turn_decode, beam=beam,
            turn_divergence=turn_divergence,
        )
    dev = get_device(device or DEFAULT_DEVICE)
    memory = dev.memory_bytes if device_memory is None else parse_bytes(device_memory)
    weights = resolve_weights_memory(spec, weights_memory, weights_precision, dev)
    scenario = Scenario(spec, prec, pol, workload, memory, weights)  # what the model or policy cannot run, first
    check_weights_fit(spec, weights, memory, dev, weights_precision=weights_precision,
                      memory_given=device_memory is not None, weights_given=weights_memory is not None)
    return scenario


#: A config's dtype name → simkv's precision of the same element type.
DTYPE_PRECISION = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def default_precision(policy, model: ModelSpec) -> str:
    """The KV precision when none is asked for: the model's own dtype where the runtime keeps its cache in it
    (``policy.kv_in_model_dtype``: transformers) and the config names one simkv models, else the runtime's
    default (``policy.default_precision``)."""
    if policy.kv_in_model_dtype and model.dtype.lower() in DTYPE_PRECISION:
        return DTYPE_PRECISION[model.dtype.lower()]
    return policy.default_precision


def default_weights_precision(model: ModelSpec, device=None) -> str:
    """The weight precision a model is loaded in when none is given: the device's usual runtime's
    (:meth:`simkv.cost.Device.default_weights_precision`: vLLM the checkpoint dtype on h100-sxm / a100-80gb,
    optimum-intel's export on the OpenVINO presets); without a device what an optimum-intel export holds: int8
    from 10^9 parameters, else f16."""
    if device is not None:
        return device.default_weights_precision(model)
    return optimum_intel_weights_precision(model)


def resolve_weights_memory(model: ModelSpec, weights_memory: str | int | None, weights_precision: str | None,
                           device=None) -> int:
    """Bytes besides the KV cache: given explicitly, or the model's weights at a precision (default:
    :func:`default_weights_precision` on ``device``). ``model`` may be one tensor-parallel device's share
    (:func:`simkv.models.tp_shard`): its weights are that device's."""
    if weights_memory is not None:
        if weights_precision is not None:
            raise ConfigError("give the weights memory or the weights precision, not both")
        return 0 if weights_memory in (0, "0") else parse_bytes(weights_memory)
    if weights_precision is not None and weights_precision not in WEIGHT_PRECISIONS:
        raise ConfigError(f"unknown weight precision {weights_precision!r}; choose {', '.join(WEIGHT_PRECISIONS)}")
    return weights_bytes(model, weights_precision or default_weights_precision(model, device))


def check_weights_fit(model: ModelSpec, weights: int, memory: int, device, *, weights_precision: str | None = None,
                      memory_given: bool = False, weights_given: bool = False, tp: int | None = None,
                      usable: float = 1.0) -> None:
    """Refuse, before anything runs, weights that leave the device no room for a KV cache (weights >= memory), in
    one line that names the fixes that would fit: a device preset that holds them (at its runtime's precision),
    lighter weights, tensor parallelism (``tp``: a serving run's size; None: a single session, which has none), or
    ``--weights-memory 0`` to simulate the KV cache alone. ``model`` is what one device holds (a tensor-parallel
    share in serving). ``usable``: the fraction of the memory the runtime may fill (vLLM's ``gpu_memory_utilization``
    under ``--scheduler vllm``: its pool is that fraction less the weights and activations)."""
    if weights < memory * usable:
        return
    where = f"{format_bytes(memory)} of device memory" if memory_given else f"{device.name}'s {format_bytes(memory)}"
    if usable < 1:
        where = f"{usable:g} of {where} ({format_bytes(int(memory * usable))}, vLLM's --gpu-memory-utilization)"
    if weights_given:
        raise ConfigError(f"--weights-memory {format_bytes(weights)} is no less than {where}: no room for the KV cache")
    precision = weights_precision or default_weights_precision(model, device)
    fixes = weight_fixes(model, weights, memory, device, precision, memory_given=memory_given, tp=tp, usable=usable)
    fixes.append("--weights-memory 0 (the KV cache alone)")
    stored = "as the checkpoint stores them" if precision == CHECKPOINT else f"at {precision}"
    raise ConfigError(f"{model.name}'s weights take {format_bytes(weights)} {stored}, no less than {where}: no "
                      f"room for the KV cache; give {', '.join(fixes[:-1]) + ' or ' if len(fixes) > 1 else ''}"
                      f"{fixes[-1]}")


def weight_fixes(model: ModelSpec, weights: int, memory: int, device, precision: str, *, memory_given: bool = False,
                 tp: int | None = None, kv: int = 0, usable: float = 1.0) -> list[str]:
    """The flags that would make ``weights`` (at ``precision``) and ``kv`` bytes fit: the smallest device preset
    that holds them at its runtime's precision (unless the memory was given), tensor parallelism where the device's
    runtime has it (vLLM; ``tp``: the serving run's size, None: no serving run), lighter weights. Shared by the
    refusal of weights that leave no room (:func:`check_weights_fit`) and ``simkv cost``'s warning. ``usable``: the
    fraction of a device's memory the runtime may fill (vLLM's ``gpu_memory_utilization`` under ``--scheduler
    vllm``), on every device a fix names."""
    from simkv.models import tp_shard

    fixes = []
    if not memory_given:
        bigger = [d for d in sorted(DEVICES.values(), key=lambda d: d.memory_bytes) if d.memory_bytes > memory
                  and weights_bytes(model, default_weights_precision(model, d)) + kv < d.memory_bytes * usable]
        if bigger:
            fixes.append(f"--device {bigger[0].name}")
    if tp == 1 and device.runtime == "vllm":
        for n in (2, 4, 8):
            try:
                if weights_bytes(tp_shard(model, n), precision) + kv // n < memory * usable:
                    fixes.append(f"--tp {n}")
                    break
            except ConfigError:  # the model does not split n ways
                continue
    lighter = [p for p in ("int8", "int4") if weights_bytes(model, p) < min(weights, memory * usable - kv)]
    if lighter:
        fixes.append(f"--weights-precision {lighter[0]}")
    return fixes

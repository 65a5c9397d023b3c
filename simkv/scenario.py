"""One library call runs a scenario: :func:`simulate` → :class:`Result` (ledger, steps, metrics).

The CLI, the dashboard and the experiments all go through :func:`simulate`
and :func:`build_scenario`, so they always agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from simkv.errors import ConfigError
from simkv.ledger import Ledger
from simkv.metrics import Metrics, compute, per_layer
from simkv.models import ModelSpec, custom_model, get_model
from simkv.precision import Precision, get_precision
from simkv.units import parse_bytes
from simkv.workload import Workload, chat_session, parse_ops

if TYPE_CHECKING:  # policies imports simkv, so simkv imports policies only when used
    from policies import Policy

DEFAULT_MODEL = "llama-3-8b"
DEFAULT_POLICY = "openvino-gpu"
DEFAULT_PROMPT = 1024
DEFAULT_DECODE = 2048
DEFAULT_DEVICE_MEMORY = "16GiB"
ENGINES = ("fast", "reference")


@dataclass(frozen=True)
class Scenario:
    model: ModelSpec
    precision: Precision
    policy: Policy
    workload: Workload
    device_memory: int = parse_bytes(DEFAULT_DEVICE_MEMORY)

    def __post_init__(self) -> None:
        if self.device_memory <= 0:
            raise ConfigError("device memory must be positive")
        self.precision.data_bytes_per_token(self.model)  # rejects u4 with an odd head size
        self.policy.check(self.model, self.workload)

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

    def per_layer(self) -> list[dict]:
        return per_layer(self.ledger, self.scenario.model.layers)

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
            "precision": s.precision.name,
            "policy": s.policy.name,
            "policy_options": {f.name: getattr(s.policy, f.name) for f in s.policy.options()},
            "workload": str(s.workload),
            "device_memory_bytes": s.device_memory,
            "kv_bytes_per_token": s.precision.kv_bytes_per_token(s.model),
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
    precision: str | None = None,
    policy: str = DEFAULT_POLICY,
    policy_options: dict[str, object] | None = None,
    prompt: int = DEFAULT_PROMPT,
    decode: int = DEFAULT_DECODE,
    turns: int = 0,
    turn_tokens: int = 64,
    turn_decode: int | None = None,
    beam: int = 1,
    ops: str | None = None,
    device_memory: str | int = DEFAULT_DEVICE_MEMORY,
) -> Scenario:
    """A scenario from plain values (what a CLI flag or a dashboard control holds).

    ``model=None`` with all four dimensions gives a custom shape; a preset with
    some dimensions overrides those. ``ops`` (e.g. ``"prefill:32,decode:100,reset"``)
    replaces the prompt/decode/turns/beam description of the workload.
    """
    from policies import get_policy

    base = get_model(model) if model else None
    spec = custom_model(base, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    pol = get_policy(policy, policy_options)
    prec = get_precision(precision or pol.default_precision)
    if pol.accepted_precisions and prec.name not in pol.accepted_precisions:
        raise ConfigError(f"policy {pol.name}: the runtime does not accept {prec.name} for the KV cache "
                          f"(it takes {', '.join(pol.accepted_precisions)})")
    if ops:
        workload = parse_ops(ops)
    else:
        workload = chat_session(
            prompt, decode, turns=turns, turn_tokens=turn_tokens, turn_decode=turn_decode, beam=beam
        )
    return Scenario(spec, prec, pol, workload, parse_bytes(device_memory))

"""Per-step time of one simulated session: each step of a :class:`simkv.scenario.Result` priced by
the cost model (:func:`simkv.cost.forward_cost`), the same function the serving engine uses.

A step appends ``tokens`` per beam to a history of ``tokens_before`` for ``batch`` beams; it reads
the cached history, writes the new KV, streams the weights once and copies what its reallocations
copy (the ledger's copy rows). A reset is no inference: it takes no time. Under a ``stateless``
policy every step recomputes the whole history (a prefill of all its tokens).

TTFT is the time of the first inference (the prompt's prefill, which yields the first token);
TPOT is the mean time of the decode steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simkv.cost import Device, StepCost, forward_cost
from simkv.ledger import COPY, PHASE_CODE
from simkv.models import ModelSpec

DEFAULT_WEIGHTS_PRECISION = "f16"


@dataclass(frozen=True)
class SessionTimes:
    device: str
    weights_precision: str
    #: Per step, aligned with ``result.steps``.
    step_s: np.ndarray
    copy_s: np.ndarray
    bound: np.ndarray
    cost: StepCost

    @property
    def ttft_s(self) -> float:
        return float(self.step_s[0]) if len(self.step_s) else 0.0

    def _decode(self, phases: np.ndarray) -> np.ndarray:
        return self.step_s[phases == PHASE_CODE["decode"]]

    def summary(self, phases: np.ndarray) -> dict:
        """JSON-ready: TTFT, TPOT (mean decode step), the slowest decode step and its copy time, totals."""
        decode = self._decode(phases)
        slowest = int(np.argmax(np.where(phases == PHASE_CODE["decode"], self.step_s, -1.0))) if len(decode) else None
        return {
            "device": self.device,
            "weights_precision": self.weights_precision,
            "ttft_s": self.ttft_s,
            "tpot_s": float(decode.mean()) if len(decode) else None,
            "tpot_median_s": float(np.median(decode)) if len(decode) else None,
            "tpot_max_s": float(decode.max()) if len(decode) else None,
            "tpot_max_step": slowest,
            "copy_s": float(self.copy_s.sum()),
            "total_s": float(self.step_s.sum()),
        }


def copy_bytes_per_step(result) -> np.ndarray:
    """Bytes the ledger's copy rows move in each step (aligned with ``result.steps``)."""
    rows = result.ledger.rows
    copies = rows[rows["op"] == COPY]
    steps = result.steps["step"]
    out = np.zeros(len(steps), dtype=np.float64)
    if len(copies) and len(steps):
        index = np.searchsorted(steps, copies["step"])
        np.add.at(out, index, copies["bytes"].astype(np.float64))
    return out


def session_times(result, device: Device, weights_precision: str | None = None, precision: str | None = None,
                  model: ModelSpec | None = None) -> SessionTimes:
    """Every step of a single-session result priced on ``device`` (vectorised: one cost-model call).
    ``model`` overrides the scenario's shape for pricing (e.g. with its hidden size and vocabulary)."""
    weights_precision = weights_precision or DEFAULT_WEIGHTS_PRECISION
    scenario, steps = result.scenario, result.steps
    tokens = steps["tokens"].astype(np.float64)
    before = np.r_[0.0, tokens[:-1]]
    before[np.r_[False, steps["phase"][:-1] == PHASE_CODE["reset"]]] = 0.0
    new = np.maximum(tokens - before, 0.0)
    if scenario.policy.stateless:  # the whole history is recomputed every step
        new, before = np.where(new > 0, tokens, 0.0), np.zeros_like(tokens)
    calls = None
    if scenario.policy.npu_pipeline:  # fixed shapes: each call computes its whole padded tensors
        from simkv.ledger import PHASES

        plan = scenario.policy.plan(scenario.workload)[: len(steps)]
        calls, new, before = scenario.policy.priced_calls(plan, [PHASES[p] for p in steps["phase"]])
    # an MLA model's attention reads the form the policy caches (the latent, or OpenVINO's decompressed K and V)
    cost = forward_cost(
        model or scenario.model, device, scenario.precision, batch=steps["batch"].astype(np.float64), context=before, new=new,
        weights_precision=weights_precision, copy_bytes=copy_bytes_per_step(result), precision=precision,
        mla=scenario.policy.mla_compute,
    )
    idle = (steps["phase"] == PHASE_CODE["reset"]) | (new == 0)
    # A trim runs no model: it takes the time of its copies (a CPU plugin's read-back, kept copy and rebuild).
    trim = steps["phase"] == PHASE_CODE["trim"]
    seconds = np.where(idle, 0.0, np.broadcast_to(cost.seconds, tokens.shape))
    if calls is not None:  # the calls' compute, then the step's copies
        seconds = np.where(idle, 0.0, calls * (np.broadcast_to(cost.seconds, tokens.shape) - cost.copy_s) + cost.copy_s)
    copy_s = np.where(idle & ~trim, 0.0, np.broadcast_to(cost.copy_s, tokens.shape))
    seconds = np.where(trim, copy_s, seconds)
    return SessionTimes(device.name, weights_precision, seconds, copy_s, np.broadcast_to(cost.bound, tokens.shape), cost)


def step_table(result, times: SessionTimes) -> np.ndarray:
    """The session's step table (:mod:`simkv.steps` columns) with ``time_s`` and ``copy_s`` appended."""
    steps = result.steps
    dtype = np.dtype(steps.dtype.descr + [("time_s", np.float64), ("copy_s", np.float64)])
    out = np.zeros(len(steps), dtype=dtype)
    for name in steps.dtype.names:
        out[name] = steps[name]
    out["time_s"], out["copy_s"] = times.step_s, times.copy_s
    return out

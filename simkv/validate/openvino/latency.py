"""Step times predicted by the cost model vs the real CPU plugin's (``simkv validate``'s ``latency``).

The prediction prices every simulated step with :func:`simkv.latency.session_times` on a device
(``host`` after ``simkv calibrate``), for the toy decoder as :mod:`.ovmodel` builds it (:func:`.toy.toy_model_spec`): attention-only
blocks (q, k, v, o projections), an embedding table and an LM head, weights in the plugin's inference
precision. The measurement is the clean run's wall time per operation. Nothing measured on the run
enters the prediction.

* **decode**: ordinary decode steps (no KV event, not the first decode step after a prompt):
  median and 90th percentile of ``|predicted - measured| / measured``;
* **reallocations**: at each decode step that reallocates the KV, the *excess* over the median of its
  ordinary neighbours (up to :data:`NEIGHBOURS` steps either side), measured vs predicted (the
  predicted excess is the copy time plus any change of the other terms): median absolute % error.
"""

from __future__ import annotations

import numpy as np

from .toy import toy_model_spec

NEIGHBOURS = 8


def _pct(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return 100.0 * np.abs(predicted - measured) / measured


def compare_latency(predicted_s: np.ndarray, measured_s: np.ndarray, phases: np.ndarray, event_steps,
                    realloc_steps, device: str) -> dict:
    """The ``latency`` figures of ``simkv validate --json`` from per-step predicted and measured seconds.

    ``phases``: phase names per step; ``event_steps``: steps with any KV event (predicted or observed);
    ``realloc_steps``: steps where KV buffers are replaced.
    """
    n = len(measured_s)
    predicted_s, measured_s = np.asarray(predicted_s, dtype=float), np.asarray(measured_s, dtype=float)
    decode = np.array([p == "decode" for p in phases])
    after_prompt = np.zeros(n, dtype=bool)
    after_prompt[1:] = decode[1:] & ~decode[:-1]  # first decode step after a prompt: cold kernels
    busy = np.zeros(n, dtype=bool)
    busy[[s for s in event_steps if 0 <= s < n]] = True
    ordinary = decode & ~busy & ~after_prompt & (measured_s > 0)
    errors = _pct(predicted_s[ordinary], measured_s[ordinary])
    steps = []
    for s in sorted(set(int(x) for x in realloc_steps)):
        if not (0 <= s < n and decode[s]):
            continue
        lo, hi = max(0, s - NEIGHBOURS), min(n, s + NEIGHBOURS + 1)
        near = [i for i in range(lo, hi) if i != s and ordinary[i]]
        if not near:
            continue
        measured = float(measured_s[s] - np.median(measured_s[near]))
        predicted = float(predicted_s[s] - np.median(predicted_s[near]))
        steps.append({"step": s, "measured_excess_ms": 1e3 * measured, "predicted_excess_ms": 1e3 * predicted,
                      "error_pct": float(100.0 * abs(predicted - measured) / abs(measured)) if measured else None})
    realloc_errors = [r["error_pct"] for r in steps if r["error_pct"] is not None]
    return {
        "device": device,
        "steps_compared": int(ordinary.sum()),
        "decode_error_median_pct": float(np.median(errors)) if len(errors) else None,
        "decode_error_p90_pct": float(np.percentile(errors, 90)) if len(errors) else None,
        "decode_predicted_median_ms": float(1e3 * np.median(predicted_s[ordinary])) if len(errors) else None,
        "decode_measured_median_ms": float(1e3 * np.median(measured_s[ordinary])) if len(errors) else None,
        "realloc_excess_error_median_pct": float(np.median(realloc_errors)) if realloc_errors else None,
        "realloc_excess": steps,
    }


def predict_and_compare(result, measured_s, phases, event_steps, realloc_steps, *, device_name: str,
                        hidden: int, vocab: int, weights_precision: str) -> dict:
    """Price ``result`` on ``device_name`` as the toy decoder and compare with the measured step times."""
    from simkv.cost import get_device
    from simkv.latency import session_times

    device = get_device(device_name)
    model = toy_model_spec(result.scenario.model, hidden, vocab)
    times = session_times(result, device, weights_precision, model=model)
    out = compare_latency(times.step_s, measured_s, phases, event_steps, realloc_steps, device.name)
    out["weights_precision"] = weights_precision
    return out


def measure_and_compare(cfg, repeats: int = 2, segments: bool = False) -> dict:
    """Benchmark-style check of one configuration: ``repeats`` clean runs of the real CPU plugin
    (:func:`.cleanrun.run_clean`: untracked subprocess, the plugin's default thread
    pinning), the per-step median over runs, against the cost model's prediction on ``cfg.device``.
    The KV events are the simulator's (``simkv validate`` checks them against memray separately).
    ``segments``: also compare each run of decode steps on its own (``"segments"``: one entry per
    decode run, with the history length it starts at)."""
    from simkv.cost import get_device
    from simkv.latency import session_times
    from simkv.ledger import PHASES
    from simkv.models import WEIGHT_BYTES
    from simkv.scenario import build_scenario, simulate

    from ..compare import predicted_events
    from .cleanrun import run_clean
    from .ovmodel import inference_precision

    runs = [run_clean(cfg) for _ in range(repeats)]
    measured = np.median([[s["latency_s"] for s in run["samples"]] for run in runs], axis=0)
    effective = runs[0]["kv_cache_precision"]
    scenario = build_scenario(model=None, layers=cfg.layers, heads=cfg.heads, kv_heads=cfg.kv_heads,
                              head_dim=cfg.head_dim, precision=effective, policy="openvino-cpu", ops=cfg.workload)
    result = simulate(scenario)
    pred = [e for e in predicted_events(result) if e["tensor"] != "past_view"]
    events, realloc = {e["step"] for e in pred}, {e["step"] for e in pred if e["op"] == "free"}
    precision = cfg.inference_precision if cfg.inference_precision in WEIGHT_BYTES else inference_precision()
    device = get_device(cfg.device)
    model = toy_model_spec(result.scenario.model, cfg.hidden or cfg.heads * cfg.head_dim, cfg.vocab)
    predicted = session_times(result, device, precision, model=model).step_s
    phases = [PHASES[p] for p in result.steps["phase"]]
    out = compare_latency(predicted, measured, phases, events, realloc, device.name)
    out.update(weights_precision=precision, kv_precision=effective, repeats=repeats)
    if segments:
        out["segments"] = []
        decode = np.array([p == "decode" for p in phases])
        starts = np.flatnonzero(decode & ~np.r_[False, decode[:-1]])
        for start in starts:
            end = start
            while end + 1 < len(phases) and decode[end + 1]:
                end += 1
            lo = start - 1  # include the prompt step, so the first decode step counts as "after a prompt"
            shift = lambda steps: {s - lo for s in steps if lo <= s <= end}  # noqa: E731
            seg = compare_latency(predicted[lo:end + 1], measured[lo:end + 1], phases[lo:end + 1], shift(events),
                                  shift(realloc), device.name)
            seg["history_tokens"] = int(result.steps["tokens"][start - 1])
            out["segments"].append(seg)
    return out

"""``simkv validate``: run a scenario on the real OpenVINO CPU plugin and on the simulator, compare.

1. Model (:func:`.cleanrun.build_and_compile`): the toy stateful decoder of :mod:`.ovmodel`
   (any shape), or an exported IR (``--ir``: the per-layer model read from its state variables and,
   for windows, its ``config.json``: :mod:`.irspec`; a hybrid model's linear-attention layers are
   state units, their element type read from the runtime model).
   Compiled on CPU with the requested hints; refused unless every layer's KV cache is a
   fused stateful SDPA. The *effective* KV precision is read from the runtime model.
2. Real run with memray (:func:`.observe.observe`): every KV allocation and free.
   Then a clean run of the same scenario without a tracker, in a subprocess started
   with ``MALLOC_MMAP_THRESHOLD_`` in its environment (:func:`.cleanrun.run_clean`):
   RSS, VmSize, VmHWM, latency.
3. Prediction: the same workload through :func:`simkv.simulate` with policy
   ``openvino-cpu``, the effective precision and the model's dimensions. For an IR the CPU
   plugin's past block (``past_view``, address space only) is compared on its own: whether the
   plugin gives it a block of its own or pools it with activations is its memory solver's choice
   for that graph (a gpt-oss or Qwen3-Next export pools it), which simkv does not model; the
   verdict covers the cache (K/V data, scales, beam tables, states).
4. :func:`simkv.validate.compare.compare` aligns the events and compares the memory and
   latency; :mod:`.latency` prices the steps with the cost model.

Needs ``openvino`` and ``memray`` (``pip install 'simkv[openvino]'``); imported lazily.
"""

from __future__ import annotations

import os
import platform
import sys
import time

from simkv.errors import ConfigError
from simkv.workload import parse_ops

from .cleanrun import CleanRunError, ValidateConfig, build_and_compile, observer_scenario, run_clean

__all__ = ["run_validation", "versions", "MISSING_DEPS", "check_dependencies"]

MISSING_DEPS = "OpenVINO validation needs openvino and memray: pip install 'simkv[openvino]'"


def check_dependencies() -> None:
    """Raise ImportError with :data:`MISSING_DEPS` unless openvino and memray import."""
    try:
        import memray  # noqa: F401
        import openvino  # noqa: F401
    except ImportError as exc:
        raise ImportError(MISSING_DEPS) from exc


# --------------------------------------------------------------------------- versions


def versions(mmap_threshold: int | None, memray_version: str | None = None) -> dict:
    import numpy
    import openvino as ov

    from simkv.version import __version__

    from .observe import cpu_flags

    model, flags = cpu_flags()
    if memray_version is None:
        try:
            from importlib.metadata import version

            memray_version = version("memray")
        except Exception:  # pragma: no cover
            memray_version = None
    return {
        "simkv": __version__,
        "openvino": ov.__version__,
        "memray": memray_version,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "glibc": "-".join(platform.libc_ver()),
        "cpu_model": model,
        "cpu_flags": flags,
        "cpu_count": os.cpu_count(),
        "MALLOC_MMAP_THRESHOLD_": str(mmap_threshold) if mmap_threshold is not None else None,
    }


# --------------------------------------------------------------------------- run


def run_validation(cfg: ValidateConfig) -> dict:
    """Steps 1-4 of the module docstring; returns the ``simkv validate --json`` dict."""
    check_dependencies()
    from simkv.precision import PRECISIONS
    from simkv.scenario import build_scenario, simulate

    from ..compare import compare
    from .observe import observe, query_heads_from_model

    t0 = time.perf_counter()
    workload = parse_ops(cfg.workload)
    model, compiled, inspection, dims = build_and_compile(cfg)
    effective = inspection.kv_cache_precision
    if effective not in PRECISIONS:
        raise ConfigError(f"the plugin runs the KV cache in {effective!r}, which simkv does not model")
    ir_layers = None
    if cfg.ir:  # the model simkv simulates comes from the IR (irspec): per-layer kinds, heads, states
        from .irspec import read_ir_layers

        ir_layers = read_ir_layers(model, cfg.ir)
    try:  # --ir: query heads as read from the model (KV heads come from its state variables)
        heads = cfg.heads if not cfg.ir else query_heads_from_model(model)
    except ValueError as err:
        raise ConfigError(f"{cfg.ir}: {err}") from None
    cfg.layers, cfg.kv_heads, cfg.head_dim = dims.layers, dims.kv_heads, dims.head_dim
    if cfg.ir:  # its layers are known once it is read: bounded before a token runs (the workload was, by the CLI)
        from simkv.limits import check_validation

        check_validation(dims.layers, workload)
    # The scenario simkv predicts, built first: what the plugin cannot run is refused before it runs.
    scenario = build_scenario(model=None, layers=dims.layers, heads=heads, kv_heads=dims.kv_heads,
                              head_dim=dims.head_dim, precision=effective, policy="openvino-cpu", ops=cfg.workload)
    if ir_layers is not None:
        scenario = _ir_scenario(scenario, ir_layers, inspection)

    if not cfg.progress:  # a terminal shows progress bars; a log gets what runs and roughly how long it takes
        from simkv.limits import validation_tokens

        print(f"simkv validate: {validation_tokens(workload):,} tokens at {dims.layers} layers on the OpenVINO CPU "
              "plugin, run twice (memray, then a clean run); 4 layers x 4,200 tokens take about 70 s here, "
              "32 layers about 400 s", file=sys.stderr)
    # 2. events (memray, this process)
    obs = observe(compiled, observer_scenario(workload), dims=dims, model=model, tracker="memray",
                  other_min_bytes=1 << 62, progress=cfg.progress, inspection=inspection, seed=cfg.seed)
    observed = [{"step": e.seq, "layer": e.layer, "tensor": e.kind, "op": e.op, "bytes": e.bytes}
                for e in obs.kv_events(include_view=True)]

    from .observe import _vocab_of

    vocab = _vocab_of(compiled)
    del compiled

    # 2b. RSS / VmSize / VmHWM / latency (clean subprocess). If it dies (the plugin's u4
    # batch change reads past the old buffer and segfaults once that buffer is its own
    # mapping: docs/DESIGN.md §3), the events are still compared and the error is reported.
    clean, clean_error = None, None
    if cfg.clean_run:
        try:
            clean = run_clean(cfg)
        except CleanRunError as err:
            clean_error = str(err)
            if cfg.progress:
                print(f"simkv validate: warning: {clean_error}; memory and latency are not compared", file=sys.stderr)
    if clean is not None and clean["kv_cache_precision"] != effective:
        raise RuntimeError(f"clean run compiled to {clean['kv_cache_precision']}, the memray run to {effective}")

    # 3. prediction
    result = simulate(scenario)
    if len(result.steps) != len(obs.samples):
        raise RuntimeError(f"simulator has {len(result.steps)} steps, the real run {len(obs.samples)} operations")

    # 4. compare (a trim's states in the simulator's order: the plugin's past 5 layers is its hash map's)
    observed, reordered = _trim_states_in_predicted_order(observed, result)
    data = compare(observed, clean["samples"] if clean else None, result, min_tokens=cfg.slope_min_tokens,
                   mmap_threshold=cfg.mmap_threshold)
    view = _split_view(data, observed, result) if ir_layers is not None else None
    f = obs.facts
    head = {
        "events_total": data.pop("events_total"),
        "events_matched": data.pop("events_matched"),
        "events_missing": data.pop("events_missing"),
        "events_unexpected": data.pop("events_unexpected"),
        "effective_kv_precision": effective,
        "fused": bool(inspection.fused),
        "rise_error_pct": data.pop("rise_error_pct"),
        "resident_slope_error_pct": data.pop("resident_slope_error_pct"),
        "rss_error_pct": data.pop("rss_error_pct"),
        "scenario": {
            "model": cfg.model_name if not cfg.ir else "ir",
            "ir": cfg.ir,
            "layers": dims.layers if ir_layers is None else len(ir_layers.layer_kv),
            "attention_layers": dims.layers,
            "layer_kinds": scenario.model.describe(),
            "model_source": None if ir_layers is None else ir_layers.source,
            "state_variables": inspection.n_state_variables,
            "state_precision": inspection.state_precision,
            "heads": heads,
            "kv_heads": dims.kv_heads,
            "head_dim": dims.head_dim,
            "hidden": None if cfg.ir else (cfg.hidden or cfg.heads * cfg.head_dim),
            "vocab": vocab,
            "seed": cfg.seed,
            "workload": str(workload),
            "steps": len(result.steps),
            "requested_kv_precision": cfg.kv_cache_precision,
            "requested_inference_precision": cfg.inference_precision,
            "inference_precision": inspection.inference_precision,
            "policy": "openvino-cpu",
            "kv_bytes_per_token": scenario.precision.kv_bytes_per_token(scenario.model),
            "slope_min_tokens": cfg.slope_min_tokens,
        },
        "versions": versions(cfg.mmap_threshold if cfg.clean_run else None, f.memray_version),
    }
    head["versions"]["clean_run_malloc_env"] = clean["malloc_env"] if clean else None
    if view is not None:
        head["past_view"] = view
    head["clean_run_error"] = clean_error
    head.update(data)
    if clean is not None:
        head["latency"] = {**data.get("latency", {}), **_predicted_latency(cfg, result, clean["samples"], observed,
                                                                            vocab, inspection.inference_precision)}
    warnings = f.warnings + [f"trim at step {step}: the plugin set the K and V states in its own order (its hash map "
                             "of state names); compared state by state" for step in reordered]
    head["observer"] = {"trace": f.trace, "warnings": warnings, "kv_sites": {str(k): v for k, v in f.kv_sites.items()}}
    head["elapsed_s"] = time.perf_counter() - t0
    return head


def _trim_states_in_predicted_order(observed: list[dict], result) -> tuple[list[dict], list[int]]:
    """The observed events with each trim's K and V states put in the order the simulator sets them.

    A trim sets every state in the order ``query_state()`` returns them: last layer first, V before K for up
    to 5 attention layers; past that, the order of the plugin's hash map of state names, which simkv does
    not model (policies/openvino_cpu.py). Each state's own events stay in their observed order and must
    match one by one. Returns the events and the trim steps whose order was changed."""
    from simkv.ledger import PHASE_CODE

    steps = result.steps
    trims = set(steps["step"][steps["phase"] == PHASE_CODE["trim"]].tolist())
    if not trims:
        return observed, []
    from ..compare import predicted_events

    def state(e: dict) -> tuple:
        return (e["layer"], e["tensor"][0]) if e["tensor"][:1] in ("k", "v") else (None, e["tensor"])

    wanted: dict[int, list[tuple]] = {}
    for e in predicted_events(result):
        if e["step"] in trims and state(e) not in wanted.setdefault(e["step"], []):
            wanted[e["step"]].append(state(e))
    out, reordered, i = [], [], 0
    while i < len(observed):
        step = observed[i]["step"]
        j = i
        while j < len(observed) and observed[j]["step"] == step:
            j += 1
        block = observed[i:j]
        if step in trims:
            groups: dict[tuple, list[dict]] = {}
            for e in block:
                groups.setdefault(state(e), []).append(e)
            order = [key for key in wanted.get(step, []) if key in groups] + [key for key in groups
                                                                              if key not in wanted.get(step, [])]
            if order != list(groups):
                reordered.append(step)
            block = [e for key in order for e in groups[key]]
        out.extend(block)
        i = j
    return out, reordered


def _ir_scenario(scenario, ir_layers, inspection):
    """An IR's scenario: its per-layer model (:mod:`.irspec`), states in the element type the plugin keeps
    them in (read from the runtime model)."""
    from dataclasses import replace

    from policies import get_policy
    from policies.mechanics import STATE_PRECISIONS

    options = {}
    if inspection.n_state_variables:
        if inspection.state_precision not in STATE_PRECISIONS:
            raise ConfigError(f"the plugin keeps the linear-attention states in {inspection.state_precision!r}, "
                              "which simkv does not model")
        options["state_precision"] = inspection.state_precision
    return replace(scenario, model=ir_layers.model_spec(), policy=get_policy("openvino-cpu", options))


def _split_view(data: dict, observed: list[dict], result) -> dict:
    """For an IR: the event verdict over the cache alone (K/V data, scales, beam tables, states), and the
    past view compared on its own (module docstring). Rewrites ``data``'s event fields in place and
    returns the past view's comparison. Memory figures keep the past view on both sides."""
    from ..compare import align_events, predicted_events

    predicted = predicted_events(result)
    split = {}
    for name, keep in (("cache", lambda e: e["tensor"] != "past_view"), ("view", lambda e: e["tensor"] == "past_view")):
        obs, pred = [e for e in observed if keep(e)], [e for e in predicted if keep(e)]
        aligned = align_events(obs, pred)
        counts = {k: sum(e["status"] == k for e in aligned) for k in ("matched", "missing", "unexpected")}
        split[name] = (obs, pred, aligned, counts)
    obs, pred, aligned, counts = split["cache"]
    data.update(events=aligned, events_observed=len(obs), events_predicted=len(pred), events_total=len(aligned),
                events_matched=counts["matched"], events_missing=counts["missing"],
                events_unexpected=counts["unexpected"])
    obs, pred, aligned, counts = split["view"]
    exact = counts["missing"] == counts["unexpected"] == 0
    return {"observed": len(obs), "predicted": len(pred), **counts,
            "first_observed_step": next((e["step"] for e in obs if e["op"] == "alloc"), None),
            "first_predicted_step": next((e["step"] for e in pred if e["op"] == "alloc"), None),
            "note": "exact" if exact else (
                "pooled with activations by the plugin's memory solver (not modelled)"
                + (f" until step {obs[0]['step']}, exact from there" if obs and not counts["unexpected"]
                   and all(e["step"] < obs[0]["step"] for e in aligned if e["status"] == "missing") else "")),
            "events": [e for e in aligned if e["status"] != "matched"][:50]}


def _predicted_latency(cfg: ValidateConfig, result, samples, observed, vocab, inference_precision) -> dict:
    """The cost model's step times vs the clean run's (:mod:`.latency`); fields are None
    with a ``latency_note`` when no prediction can be made (an IR's weights, no host preset)."""
    from simkv.ledger import PHASES
    from simkv.models import WEIGHT_BYTES

    from ..compare import predicted_events
    from .latency import predict_and_compare

    empty = {"decode_error_median_pct": None, "decode_error_p90_pct": None, "realloc_excess_error_median_pct": None,
             "steps_compared": 0, "device": cfg.device}
    if cfg.ir or not cfg.device:
        return {**empty, "latency_note": "no prediction: " + ("an IR's weights are not modelled" if cfg.ir else "no device")}
    pred = predicted_events(result)
    events = {e["step"] for e in pred if e["tensor"] != "past_view"} | {
        int(e["step"]) for e in observed if e["tensor"] != "past_view"}
    realloc = {e["step"] for e in pred if e["tensor"] != "past_view" and e["op"] == "free"}
    precision = inference_precision if inference_precision in WEIGHT_BYTES else "f32"
    try:
        return predict_and_compare(result, [s["latency_s"] for s in samples], [PHASES[p] for p in result.steps["phase"]],
                                   events, realloc, device_name=cfg.device, hidden=cfg.hidden or cfg.heads * cfg.head_dim,
                                   vocab=vocab, weights_precision=precision)
    except ConfigError as err:  # e.g. no host preset yet
        return {**empty, "latency_note": f"no prediction: {err}"}

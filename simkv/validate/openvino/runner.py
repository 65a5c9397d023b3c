"""``simkv validate``: run a scenario on the real OpenVINO CPU plugin and on the simulator, compare.

1. Model: the toy stateful decoder of :mod:`.ovmodel` (any shape), or an exported IR
   (``--ir``: dimensions read from its state variables). Compiled on CPU with the
   requested hints; refused unless every layer's KV cache is a fused stateful SDPA.
   The *effective* KV precision is read from the runtime model.
2. Real run with memray (:func:`.observe.observe`): every KV allocation and free.
   Then a clean run of the same scenario without a tracker, in a subprocess started
   with ``MALLOC_MMAP_THRESHOLD_`` in its environment (glibc reads it at start-up; it
   makes buffers of at least that size separate mappings, so that RSS follows the
   bytes written instead of glibc's heap staircase): RSS, VmSize, VmHWM, latency.
3. Prediction: the same workload through :func:`simkv.simulate` with policy
   ``openvino-cpu``, the effective precision and the model's dimensions.
4. :func:`.compare.compare` aligns the events and compares the memory and latency.

Needs ``openvino`` and ``memray`` (``pip install 'simkv[openvino]'``); imported lazily.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from simkv.errors import ConfigError
from simkv.workload import Decode, Fork, Prefill, Reorder, Reset, Select, Workload, parse_ops

__all__ = ["ValidateConfig", "CleanRunError", "run_validation", "observer_scenario", "MISSING_DEPS", "check_dependencies"]

MISSING_DEPS = "OpenVINO validation needs openvino and memray: pip install 'simkv[openvino]'"
DEFAULT_MMAP_THRESHOLD = 65536


def check_dependencies() -> None:
    """Raise ImportError with :data:`MISSING_DEPS` unless openvino and memray import."""
    try:
        import memray  # noqa: F401
        import openvino  # noqa: F401
    except ImportError as exc:
        raise ImportError(MISSING_DEPS) from exc


class CleanRunError(RuntimeError):
    """The untracked measuring subprocess did not finish (the events are still compared)."""


@dataclass
class ValidateConfig:
    """What to validate. ``workload`` is simkv's text form (``prefill:32,decode:100,...``)."""

    workload: str
    layers: int = 4
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 64
    hidden: int | None = None
    vocab: int = 1000
    seed: int = 0
    kv_cache_precision: str | None = None  # KV_CACHE_PRECISION hint (None: plugin default)
    inference_precision: str | None = None  # INFERENCE_PRECISION_HINT
    ir: str | None = None
    mmap_threshold: int = DEFAULT_MMAP_THRESHOLD
    slope_min_tokens: int = 500
    clean_run: bool = True
    progress: bool = True
    model_name: str = "custom"
    extra: dict = field(default_factory=dict)
    device: str | None = "host"  # cost-model device for the latency prediction (None: none)


# --------------------------------------------------------------------------- scenario


def observer_scenario(workload: Workload):
    """The observer's :class:`~.observe.Scenario` for a simkv workload, step for step.

    ``prefill`` on a stored history is a chat turn; ``fork:W`` is ``beam_idx=[0]*W``;
    ``reorder`` reverses the beams (same width: any permutation allocates the same);
    ``select:i`` keeps beam i.
    """
    from .observe import Scenario

    sc = Scenario()
    batch, stored = 1, 0
    for op in workload.ops:
        if isinstance(op, Prefill):
            (sc.chat if stored else sc.prefill)(op.tokens)
            stored += op.tokens
        elif isinstance(op, Decode):
            sc.decode(op.steps)
            stored += op.steps
        elif isinstance(op, Fork):
            sc.fork(op.width)
            batch, stored = op.width, stored + 1
        elif isinstance(op, Reorder):
            sc.reorder(tuple(reversed(range(batch))))
            stored += 1
        elif isinstance(op, Select):
            sc.select(op.beam)
            batch, stored = 1, stored + 1
        elif isinstance(op, Reset):
            sc.reset()
            batch, stored = 1, 0
        else:  # pragma: no cover - Workload validates its ops
            raise ConfigError(f"cannot observe {op!r}")
    return sc


# --------------------------------------------------------------------------- model


def _build_and_compile(cfg: ValidateConfig):
    """Model + compiled model + inspection + KV dims (raises NotFusedError if unfused)."""
    from .observe import kv_dims_from_model
    from .ovmodel import ToyDecoderSpec, build_stateful_decoder, compile_checked, load_ir

    if cfg.ir:
        model = load_ir(cfg.ir)
    else:
        model = build_stateful_decoder(
            ToyDecoderSpec(layers=cfg.layers, heads=cfg.heads, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                           hidden=cfg.hidden, vocab=cfg.vocab, seed=cfg.seed)
        )
    compiled, inspection = compile_checked(model, cfg.kv_cache_precision, cfg.inference_precision)
    dims = kv_dims_from_model(model, inspection.kv_cache_precision or "u8")
    return model, compiled, inspection, dims


def _clean_child(config_path: str, out_path: str) -> int:
    """Subprocess entry (``python -m simkv.validate.openvino.runner CONFIG OUT``): the untracked run."""
    from .observe import observe

    cfg = ValidateConfig(**json.loads(Path(config_path).read_text()))
    model, compiled, inspection, dims = _build_and_compile(cfg)
    obs = observe(compiled, observer_scenario(parse_ops(cfg.workload)), dims=dims, model=model,
                  tracker="none", progress=cfg.progress, inspection=inspection, seed=cfg.seed)
    Path(out_path).write_text(json.dumps({
        "kv_cache_precision": inspection.kv_cache_precision,
        "malloc_env": obs.facts.malloc_env,
        "samples": [asdict(s) for s in obs.samples],
    }))
    return 0


def _clean_run(cfg: ValidateConfig) -> dict:
    with tempfile.TemporaryDirectory(prefix="simkv_validate_") as tmp:
        cpath, opath = Path(tmp) / "config.json", Path(tmp) / "clean.json"
        cpath.write_text(json.dumps(asdict(cfg)))
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(cfg.mmap_threshold), "PYTHONFAULTHANDLER": "1"}
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = subprocess.run([sys.executable, "-m", "simkv.validate.openvino.runner", str(cpath), str(opath)], env=env,
                              stdout=subprocess.DEVNULL, stderr=None if cfg.progress else subprocess.PIPE, text=True)
        if proc.returncode != 0:
            if proc.returncode < 0:
                import signal

                what = f"crashed ({signal.Signals(-proc.returncode).name})"
            else:
                lines = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
                what = f"failed (exit {proc.returncode}): {lines[-1].strip() if lines else 'see stderr'}"
            raise CleanRunError(f"clean run (MALLOC_MMAP_THRESHOLD_={cfg.mmap_threshold}) {what}")
        return json.loads(opath.read_text())


# --------------------------------------------------------------------------- versions


def versions(mmap_threshold: int | None, memray_version: str | None = None) -> dict:
    import numpy
    import openvino as ov

    from simkv import __version__

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
    model, compiled, inspection, dims = _build_and_compile(cfg)
    effective = inspection.kv_cache_precision
    if effective not in PRECISIONS:
        raise ConfigError(f"the plugin runs the KV cache in {effective!r}, which simkv does not model")
    try:  # --ir: query heads as read from the model (KV heads come from its state variables)
        heads = cfg.heads if not cfg.ir else query_heads_from_model(model)
    except ValueError as err:
        raise ConfigError(f"{cfg.ir}: {err}") from None
    cfg.layers, cfg.kv_heads, cfg.head_dim = dims.layers, dims.kv_heads, dims.head_dim

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
            clean = _clean_run(cfg)
        except CleanRunError as err:
            clean_error = str(err)
            if cfg.progress:
                print(f"simkv validate: warning: {clean_error}; memory and latency are not compared", file=sys.stderr)
    if clean is not None and clean["kv_cache_precision"] != effective:
        raise RuntimeError(f"clean run compiled to {clean['kv_cache_precision']}, the memray run to {effective}")

    # 3. prediction
    scenario = build_scenario(model=None, layers=dims.layers, heads=heads, kv_heads=dims.kv_heads,
                              head_dim=dims.head_dim, precision=effective, policy="openvino-cpu", ops=cfg.workload)
    result = simulate(scenario)
    if len(result.steps) != len(obs.samples):
        raise RuntimeError(f"simulator has {len(result.steps)} steps, the real run {len(obs.samples)} operations")

    # 4. compare
    data = compare(observed, clean["samples"] if clean else None, result, min_tokens=cfg.slope_min_tokens,
                   mmap_threshold=cfg.mmap_threshold)
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
            "layers": dims.layers,
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
    head["clean_run_error"] = clean_error
    head.update(data)
    if clean is not None:
        head["latency"] = {**data.get("latency", {}), **_predicted_latency(cfg, result, clean["samples"], observed,
                                                                            vocab, inspection.inference_precision)}
    head["observer"] = {"trace": f.trace, "warnings": f.warnings, "kv_sites": {str(k): v for k, v in f.kv_sites.items()}}
    head["elapsed_s"] = time.perf_counter() - t0
    return head


def _predicted_latency(cfg: ValidateConfig, result, samples, observed, vocab, inference_precision) -> dict:
    """The cost model's step times vs the clean run's (simkv/validate/openvino/latency.py); fields are None
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


if __name__ == "__main__":  # the clean-run subprocess
    sys.exit(_clean_child(sys.argv[1], sys.argv[2]))

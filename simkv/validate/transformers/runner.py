"""``simkv validate --runtime transformers``: Hugging Face caches on torch CPU vs hf-dynamic / hf-static.

1. Model (:mod:`.model`): a random-weight ``LlamaForCausalLM`` of the requested shape (MHA or GQA), or a
   ``MistralForCausalLM`` when a sliding window is asked for (every layer then gets a
   ``DynamicSlidingWindowLayer``), or — ``--arch`` / ``--model PATH`` — a tiny Gemma-3, gpt-oss,
   Llama-4, Qwen3-Next or DeepSeek-V3 (:mod:`.archs`) or any ``config.json``, whose layers get the
   cache class of their kind; built from a config — offline, no hub — in f32, f16 or bf16 (the KV
   precision is the model's dtype; a linear-attention recurrent state is f32).
2. Real run under memray (Python stacks): the workload drives
   ``model(input_ids, past_key_values=cache, use_cache=True)`` one operation at a time —
   prefill, decode, chat turn; fork / reorder / select call ``cache.reorder_cache(beam_idx)``
   first, then the forward; reset calls ``cache.reset()``. Each operation is bracketed by
   the same in-stream markers as the OpenVINO validator (:mod:`simkv.validate.memtrace`).
3. Cache events (:mod:`.events`): torch allocates every CPU tensor with ``posix_memalign`` of its exact
   size, but so do oneDNN's scratch buffers (bf16 matmuls, ``conv1d``): only allocations made by
   ``transformers/cache_utils.py`` count. An allocation is a K (or V) cache tensor when the innermost
   frame of that file on its Python stack is a line that names keys (or values) only — the
   ``torch.cat``, ``torch.zeros``, ``roll`` and ``index_select`` lines of ``DynamicLayer``,
   ``DynamicSlidingWindowLayer``, ``StaticLayer``, ``StaticSlidingWindowLayer`` and ``reorder_cache`` —,
   a conv or recurrent state when it is ``LinearAttentionLayer``'s ``lazy_initialization`` or
   ``reorder_cache``; index tensors, the 8-byte counters and other temporaries name neither. Its layer
   is the cache layer whose (wrapped) method made it; a free is matched to its allocation by address.
   After each operation the live cache tensors are held against the data pointers the cache object
   holds (``pointer_check``).
4. A clean run in a subprocess without the tracker (``MALLOC_MMAP_THRESHOLD_`` set, as
   for OpenVINO) measures RSS, VmSize, VmHWM and latency per operation.
5. Prediction with ``hf-dynamic`` / ``hf-static``; :func:`simkv.validate.compare.compare` aligns the
   events and compares memory; the in-step increase of live KV bytes is compared step by step.

Needs torch, transformers and memray (``pip install 'simkv[transformers]'``), imported lazily.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from simkv.workload import Prefill, parse_ops

from ..child import child_env
from .events import cache_storages, kv_events, kv_site_of, label_layers, pointer_check
from .model import HFValidateConfig, build_model, drive, make_cache, transformers_config

__all__ = ["MISSING_DEPS", "check_dependencies", "run_validation", "in_step_increase", "command"]

MISSING_DEPS = "transformers validation needs torch, transformers and memray: pip install 'simkv[transformers]'"
#: Bounds of a real run on torch CPU: attention of a long prompt alone would take minutes and gigabytes.
MAX_INPUT_TOKENS = 8192  # one prefill or chat turn
MAX_STEPS = 20_000
MAX_KV_BYTES = 2 << 30


def check_dependencies() -> None:
    """Raise ImportError with :data:`MISSING_DEPS` unless torch, transformers and memray import."""
    try:
        import memray  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ImportError(MISSING_DEPS) from exc


def in_step_increase(observed: list[dict], result) -> dict:
    """Per step, the highest live KV bytes inside the step minus those at its start: observed
    (memray stream, in order) vs predicted (ledger: step peak minus the previous step's allocated)."""
    import numpy as np

    st = result.steps
    n = len(st)
    measured = np.zeros(n, dtype=np.int64)
    live = 0
    by_step: dict[int, list[dict]] = {}
    for e in observed:
        by_step.setdefault(int(e["step"]), []).append(e)
    for s in range(n):
        start = top = live
        for e in by_step.get(s, []):
            live += e["bytes"] if e["op"] == "alloc" else -e["bytes"]
            top = max(top, live)
        measured[s] = top - start
    predicted = st["peak"].astype(np.int64) - np.r_[0, st["allocated"][:-1].astype(np.int64)]
    top = int(np.argmax(predicted)) if n else 0
    return {"steps_equal": int((measured == predicted).sum()), "steps": n, "step": top,
            "measured_bytes": int(measured[top]) if n else 0, "predicted_bytes": int(predicted[top]) if n else 0}


# --------------------------------------------------------------------------- runs


def _observe(cfg: HFValidateConfig) -> tuple[list[dict], int, dict]:
    """The memray run: KV events, steps, and trace facts."""
    import torch

    from ..memtrace import Recorder, read_segments

    torch.set_num_threads(1)  # one thread: small runs, and the allocation order never depends on a pool
    model = build_model(cfg)
    cache = make_cache(model, cfg)
    classes = [type(layer).__name__ for layer in cache.layers]
    label_layers(cache)
    snapshots: list[dict] = []
    rec = Recorder(native_traces=False)
    try:
        with rec:
            steps = drive(model, cache, cfg, rec, on_step=lambda seq, _: snapshots.append(cache_storages(cache)))
        sites: dict = {}
        records, summary = read_segments(rec.path, steps, keep_min_bytes=1 << 62, site_of=kv_site_of(sites))
    finally:
        rec.cleanup()
    events, warnings = kv_events(records, model.config.num_hidden_layers)
    pointers = pointer_check(records, snapshots)
    if pointers["first_difference"]:
        warnings.append(f"cache tensors by stack and by data pointer differ at {pointers['first_difference']}")
    facts = {"trace": asdict(summary), "warnings": warnings[:20], "cache": type(cache).__name__,
             "layer_classes": sorted(set(classes)), "cache_layers": classes, "pointer_check": pointers}
    return events, steps, facts


def scenario_of(cfg: HFValidateConfig):
    """simkv's scenario of the run: the Llama / Mistral shape, or the model of an ``arch`` / ``config_path``
    (:func:`.archs.model_spec`); raises what the policy refuses."""
    from policies import get_policy
    from simkv.precision import get_precision
    from simkv.scenario import Scenario, build_scenario

    from .archs import model_spec

    options = {"max_cache_len": cfg.cache_len} if cfg.policy == "hf-static" else {}
    config = transformers_config(cfg)
    if config is None:
        return build_scenario(model=None, layers=cfg.layers, heads=cfg.heads, kv_heads=cfg.kv_heads,
                              head_dim=cfg.head_dim, sliding_window=cfg.sliding_window or 0, precision=cfg.dtype,
                              policy=cfg.policy, policy_options=options, ops=cfg.workload)
    return Scenario(model_spec(config, cfg.model_name), get_precision(cfg.dtype), get_policy(cfg.policy, options),
                    parse_ops(cfg.workload), weights_memory=0)


def _clean_child(config_path: str, out_path: str) -> int:
    """Subprocess entry (``python -m simkv.validate.transformers.runner CONFIG OUT``): the untracked run."""
    import torch

    from ..memtrace import Recorder, proc_status, reset_hwm

    cfg = HFValidateConfig(**json.loads(Path(config_path).read_text()))
    torch.set_num_threads(1)
    model = build_model(cfg)
    cache = make_cache(model, cfg)
    samples: list[dict] = []
    hwm_ok = reset_hwm()

    def sample(seq: int, latency: float) -> None:
        status = proc_status()
        samples.append({"seq": seq, "rss_bytes": status["VmRSS"], "vmsize_bytes": status["VmSize"],
                        "hwm_bytes": status["VmHWM"] if hwm_ok else None, "latency_s": latency})
        reset_hwm()

    drive(model, cache, cfg, Recorder(enabled=False), on_step=sample)
    Path(out_path).write_text(json.dumps({"samples": samples,
                                          "malloc_env": os.environ.get("MALLOC_MMAP_THRESHOLD_")}))
    return 0


def _clean_run(cfg: HFValidateConfig) -> dict:
    with tempfile.TemporaryDirectory(prefix="simkv_validate_hf_") as tmp:
        cpath, opath = Path(tmp) / "config.json", Path(tmp) / "clean.json"
        cpath.write_text(json.dumps(asdict(cfg)))
        env = child_env(MALLOC_MMAP_THRESHOLD_=str(cfg.mmap_threshold))
        proc = subprocess.run([sys.executable, "-m", "simkv.validate.transformers.runner", str(cpath), str(opath)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            raise RuntimeError(f"clean run failed: {lines[-1] if lines else proc.returncode}")
        return json.loads(opath.read_text())


def versions(mmap_threshold: int | None) -> dict:
    from importlib.metadata import version

    import numpy
    import torch
    import transformers

    from simkv.version import __version__

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else None
    return {"simkv": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "memray": version("memray"), "python": platform.python_version(), "numpy": numpy.__version__,
            "platform": platform.platform(), "cpu_model": cpu, "cpu_count": os.cpu_count(),
            "MALLOC_MMAP_THRESHOLD_": str(mmap_threshold) if mmap_threshold is not None else None}


def run_validation(cfg: HFValidateConfig) -> dict:
    """Steps 1-5 of the module docstring; returns the ``simkv validate --json`` dict."""
    check_dependencies()
    from simkv.scenario import simulate

    from ..compare import compare

    t0 = time.perf_counter()
    workload = parse_ops(cfg.workload)
    scenario = scenario_of(cfg)  # refuses what HF cannot run
    m = scenario.model
    observed, steps, facts = _observe(cfg)
    clean = _clean_run(cfg) if cfg.clean_run else None
    result = simulate(scenario)
    if len(result.steps) != steps:
        raise RuntimeError(f"simulator has {len(result.steps)} steps, the real run {steps} operations")
    data = compare(observed, clean["samples"] if clean else None, result, min_tokens=cfg.slope_min_tokens)
    head = {
        "events_total": data.pop("events_total"),
        "events_matched": data.pop("events_matched"),
        "events_missing": data.pop("events_missing"),
        "events_unexpected": data.pop("events_unexpected"),
        "runtime": "transformers",
        "effective_kv_precision": cfg.dtype,
        "fused": None,
        "alloc_peak_error_pct": data.pop("alloc_peak_error_pct"),
        "rise_error_pct": data.pop("rise_error_pct"),
        "rss_error_pct": data.pop("rss_error_pct"),
        "resident_slope_error_pct": data.pop("resident_slope_error_pct"),
        "in_step_increase": in_step_increase(observed, result),
        # The beam "gather": what reorder_cache (index_select) allocated in each fork / reorder / select step.
        "beam_gather": [{"step": s, "measured_bytes": sum(e["bytes"] for e in observed
                                                          if e["step"] == s and e.get("via") == "reorder_cache")}
                        for s in sorted({e["step"] for e in observed if e.get("via") == "reorder_cache"})],
        "scenario": {
            "model": cfg.model_name, "runtime": "transformers", "cache": facts["cache"],
            "layer_classes": facts["layer_classes"], "cache_layers": facts["cache_layers"],
            "layer_kv": m.describe(), "arch": cfg.arch, "config": cfg.config_path, "layers": m.layers,
            "heads": m.heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
            "hidden": (m.hidden or m.heads * m.head_dim) if cfg.arch or cfg.config_path else cfg.hidden or cfg.heads * cfg.head_dim,
            "vocab": m.vocab or cfg.vocab, "seed": cfg.seed, "sliding_window": cfg.sliding_window,
            "max_cache_len": cfg.cache_len if cfg.policy == "hf-static" else None,
            "workload": str(workload), "steps": steps, "requested_kv_precision": cfg.dtype,
            "inference_precision": cfg.dtype, "policy": cfg.policy,
            "kv_bytes_per_token": scenario.kv_bytes_per_token,
            "slope_min_tokens": cfg.slope_min_tokens,
        },
        "versions": versions(cfg.mmap_threshold if cfg.clean_run else None),
    }
    head["versions"]["clean_run_malloc_env"] = clean["malloc_env"] if clean else None
    head["clean_run_error"] = None
    head.update(data)
    head["observer"] = {"trace": facts["trace"], "warnings": facts["warnings"], "pointer_check": facts["pointer_check"]}
    head["elapsed_s"] = time.perf_counter() - t0
    return head


# --------------------------------------------------------------------------- command


def _config_source(args) -> tuple[str | None, str | None]:
    """``(arch, config path)`` of the command line: ``--arch NAME`` or ``--model PATH`` (a config.json or a
    folder holding one; not a preset name), else ``(None, None)``: the Llama / Mistral shape."""
    from simkv.errors import SimkvError
    from simkv.models import PRESETS

    arch = getattr(args, "arch", None)
    path = args.model if args.model not in ("custom", *PRESETS) and (
        Path(args.model).exists() or args.model.endswith(".json")) else None
    if arch and args.model != "custom":
        raise SimkvError("give --arch or --model, not both")
    if path and not Path(path).exists():
        raise SimkvError(f"no such config: {path}")
    given = [f"--{k.replace('_', '-')}" for k in ("layers", "heads", "kv_heads", "head_dim", "hidden", "sliding_window")
             if getattr(args, k) is not None]
    if (arch or path) and given:
        raise SimkvError(f"{'--arch' if arch else '--model PATH'} takes the shape from the config: drop {', '.join(given)}")
    return arch, path


#: A config's ``dtype`` (``torch_dtype``) as a --precision: the run's default.
_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def _config_scenario(args, arch: str | None, path: str | None, policy: str, opts: dict):
    """The scenario of an ``--arch`` / ``--model PATH`` run: simkv's model of the transformers config."""
    from policies import get_policy
    from simkv.precision import get_precision
    from simkv.scenario import Scenario
    from simkv.workload import chat_session

    from .archs import model_spec

    name = arch or (Path(path).stem if Path(path).suffix == ".json" else Path(path).name)
    config = transformers_config(HFValidateConfig(workload="prefill:1", arch=arch, config_path=path))
    workload = parse_ops(args.ops) if args.ops else chat_session(
        args.prompt, args.decode, turns=args.turns, turn_tokens=args.turn_tokens, turn_decode=args.turn_decode,
        beam=args.beam)
    if policy == "hf-static":
        opts.setdefault("max_cache_len", str(workload.max_tokens))
    precision = args.precision or _DTYPES.get(str(getattr(config, "dtype", None)).removeprefix("torch."), "f32")
    HFValidateConfig(workload=str(workload), dtype=precision)  # refuses a dtype the model cannot have
    return Scenario(model_spec(config, name), get_precision(precision), get_policy(policy, opts), workload,
                    weights_memory=0)


def command(args) -> int:
    """``simkv validate --runtime transformers`` (parsed arguments of the validate parser)."""
    from policies import parse_policy_opts
    from simkv.errors import SimkvError
    from simkv.scenario import build_scenario

    from .. import model_dims
    from ..report import emit

    if args.ir or args.inference_precision:
        raise SimkvError("--ir and --inference-precision are OpenVINO options; the transformers runtime builds "
                         "its model from the shape flags and runs it in --precision")
    policy = args.policy or "hf-dynamic"
    opts = parse_policy_opts(args.policy_opt)
    if set(opts) - {"max_cache_len"}:
        raise SimkvError(f"--runtime transformers takes --policy-opt max_cache_len only, not {', '.join(opts)}")
    arch, path = _config_source(args)
    if arch or path:
        try:  # reading the config needs transformers
            check_dependencies()
        except ImportError:
            print(f"simkv validate: error: {MISSING_DEPS}", file=sys.stderr)
            return 2
        sc = _config_scenario(args, arch, path, policy, opts)
    else:
        model = None if args.model == "custom" else args.model
        dims = model_dims(args)
        # Validates the shape, the workload and the policy's limits before anything slow happens.
        scenario = dict(model=model, **dims, sliding_window=args.sliding_window, precision=args.precision or "f32",
                        prompt=args.prompt, decode=args.decode, turns=args.turns, turn_tokens=args.turn_tokens,
                        turn_decode=args.turn_decode, beam=args.beam, ops=args.ops,
                        weights_memory=0)  # a host run: only the KV cache is predicted and bounded
        sc = build_scenario(**scenario, policy="hf-dynamic")
        if policy == "hf-static":
            opts.setdefault("max_cache_len", str(sc.workload.max_tokens))
            sc = build_scenario(**scenario, policy=policy, policy_options=opts)
    m = sc.model
    longest_input = max((op.tokens for op in sc.workload.ops if isinstance(op, Prefill)), default=0)
    if longest_input > MAX_INPUT_TOKENS or sc.workload.steps > MAX_STEPS:
        raise SimkvError(f"a real transformers run is limited to prompts/turns of {MAX_INPUT_TOKENS:,} tokens and "
                         f"{MAX_STEPS:,} steps (this one: {longest_input:,} and {sc.workload.steps:,})")
    from simkv.scenario import simulate

    peak = int(simulate(sc).steps["peak"].max())
    if peak > MAX_KV_BYTES:
        raise SimkvError(f"the KV cache would peak at {peak / 2**30:.1f} GiB; a real run here is limited to "
                         f"{MAX_KV_BYTES / 2**30:.0f} GiB (fewer layers, heads or tokens)")
    cfg = HFValidateConfig(
        workload=str(sc.workload), layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim,
        hidden=args.hidden, vocab=m.vocab if arch or path else args.vocab, seed=args.seed, dtype=sc.precision.name, policy=policy,
        max_cache_len=getattr(sc.policy, "max_cache_len", None), sliding_window=m.sliding_window,
        mmap_threshold=args.mmap_threshold, slope_min_tokens=args.slope_min_tokens, model_name=m.name,
        progress=sys.stderr.isatty(), arch=arch, config_path=str(Path(path).resolve()) if path else None,
    )
    try:
        check_dependencies()
    except ImportError:
        print(f"simkv validate: error: {MISSING_DEPS}", file=sys.stderr)
        return 2
    return emit(args, run_validation(cfg))


if __name__ == "__main__":  # the clean-run subprocess
    sys.exit(_clean_child(sys.argv[1], sys.argv[2]))

"""The ``simkv`` command: a thin layer over :func:`simkv.build_scenario` and :func:`simkv.simulate`.

Any error caused by input is printed as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from simkv.errors import SimkvError
from simkv.flags import (Parser, add_latency_arguments, add_model_arguments, add_policy_arguments,
                         add_scenario_arguments, scenario_fields, scenario_from_args)
from simkv.units import format_bytes


#: Exit code of a single-session run that ran out of device memory (0: it fit; 2: bad input).
EXIT_OUT_OF_MEMORY = 3


def _cmd_run(args: argparse.Namespace) -> int:
    from simkv import limits
    from simkv.jsonout import write_json
    from simkv.scenario import simulate

    if args.ledger:
        limits.check_output(args.ledger, "--ledger", (".csv", ".parquet"))
    if args.timeline:
        limits.check_output(args.timeline, "--timeline", (".html", ".htm"))
    if args.trace or args.synthetic:  # serving: a stream of requests (issue #7)
        from simkv.serving.cli import run_serving

        return run_serving(args)
    limits.check_flags(args)
    if args.ops is not None and not args.ops.strip(" ,"):
        raise SimkvError("--ops is empty: give operations, e.g. prefill:32,decode:100")
    scenario = scenario_from_args(args)
    limits.check_scenario(scenario)
    result = simulate(scenario, engine=args.engine, progress=not args.json)
    latency = run_latency(result, args)  # None without --device
    if args.ledger:
        result.ledger.write(args.ledger)
    if args.timeline:
        from simkv.figures import timeline, write_html

        write_html(timeline(result), args.timeline)
    if args.json:
        out = result.summary()
        out["per_layer"] = result.per_layer()
        if latency:
            out["latency"] = latency
        write_json(out, sys.stdout)  # json.dump's bytes, fast on a long run's per-layer lists
    else:
        print("\n".join([render_summary(result)] + (_latency_lines(latency) if latency else [])))
        for what, path in (("ledger", args.ledger), ("timeline", args.timeline)):
            if path:
                print(f"  {what:<22}{path}")
    return EXIT_OUT_OF_MEMORY if result.oom else 0


def render_summary(result) -> str:
    """The human-readable report of ``simkv run``."""
    m, s = result.metrics, result.scenario
    spike = f"{format_bytes(m.max_spike_bytes)}" + (f" at step {m.max_spike_step}" if m.max_spike_step is not None else "")
    # Out of memory: said first; the last step is the failed one, cut at the allocation
    # that did not fit, so "final" figures are the state when it failed.
    final = "at failure" if result.oom else "final"
    lines = [f"simkv: OUT OF MEMORY: {result.oom}"] if result.oom else []
    lines += [
        f"simkv: {s.describe()}",
        f"  {'engine':<22}{result.engine}",
        f"  {'steps':<22}{m.steps:,}" + (f" ({m.steps - 1:,} completed, step {result.oom.step:,} failed)"
                                           if result.oom else ""),
        f"  {'device memory':<22}{format_bytes(s.device_memory)} ({format_bytes(s.weights_memory)} of it weights and other models)",
        f"  {'KV bytes per token':<22}{format_bytes(s.kv_bytes_per_token)} (all layers, K+V, with scales)",
        f"  {'peak allocated':<22}{format_bytes(m.peak_allocated_bytes)}",
        f"  {'peak resident':<22}{format_bytes(m.peak_resident_bytes)}",
        f"  {'mean allocated':<22}{format_bytes(m.mean_allocated_bytes)}",
        f"  {final + ' allocated':<22}{format_bytes(m.final_allocated_bytes)}",
        f"  {final + ' used':<22}{format_bytes(m.used_bytes)}",
        f"  {final + ' waste':<22}{format_bytes(m.waste_bytes)} ({m.waste_pct:.1f} %: "
        f"{format_bytes(m.waste_reserved_bytes)} headroom, {format_bytes(m.waste_transient_bytes)} old buffers)",
        f"  {'reallocations':<22}{m.realloc_count:,} (K/V data buffers replaced)",
        f"  {'bytes copied':<22}{format_bytes(m.bytes_copied)}",
        f"  {'largest spike':<22}{spike}",
    ]
    for entry in result.per_layer(layers=1):
        steps = entry["alloc_steps"]
        shown = ", ".join(map(str, steps[:12])) + (f", … ({len(steps)} in all)" if len(steps) > 12 else "")
        lines.append(f"  {'layer 0 ' + entry['tensor'].upper() + ' allocs at':<22}"
                     + (f"steps {shown}" if steps else "none (no allocation completed)"))
    return "\n".join(lines)


def _cmd_policies(args: argparse.Namespace) -> int:
    from policies import REGISTRY

    for name, cls in REGISTRY.items():
        print(f"{name}: {cls.summary}")
        print(f"    default precision {cls.default_precision}; source: {cls.__module__.replace('.', '/')}.py")
        for f in cls.options():
            print(f"    {f.name + '=' + str(f.default):<30} {f.metadata.get('help', '')}")
        print()
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from simkv.models import PRESETS
    from simkv.precision import PRECISIONS

    f16 = PRECISIONS["f16"]
    print(f"{'model':<16}{'layers':>7}{'heads':>7}{'kv_heads':>10}{'head_dim':>10}{'f16 KV/token':>15}")
    for m in PRESETS.values():
        print(f"{m.name:<16}{m.layers:>7}{m.heads:>7}{m.kv_heads:>10}{m.head_dim:>10}{format_bytes(f16.kv_bytes_per_token(m)):>15}")
    print("\nprecisions: " + ", ".join(f"{p.name} ({p.bits} bit{'; ' + p.note if p.note else ''})" for p in PRECISIONS.values()))
    return 0


# --- simkv validate (issue #3): real OpenVINO CPU run vs the openvino-cpu policy -------------
# Self-contained block: the parser, the command, and one registration line in build_parser().
# OpenVINO and memray are imported only when the command runs (simkv.validate.runner).

VALIDATE_DEFAULTS = {"model": "custom", "prompt": 32, "decode": 1100}
VALIDATE_TOY = {"layers": 4, "heads": 8, "head_dim": 64}  # a custom model's dimensions when not given


def _add_validate_parser(sub) -> None:
    p = sub.add_parser("validate", help="run a scenario on the real OpenVINO CPU plugin and compare with the simulator",
                       description=(
        "Run a scenario on OpenVINO's CPU plugin (a random-weight stateful decoder of the given shape, or --ir), "
        "record every KV-cache allocation and free with memray, measure RSS/VmSize/VmHWM/latency in a clean "
        "run (MALLOC_MMAP_THRESHOLD_ set), predict the same scenario with the openvino-cpu policy at the "
        "effective KV precision, and compare event by event. Exit 0 only if every KV event matched. "
        "Defaults: 4 layers, 8 heads (MHA) x 64, 32-token prompt, 1,100 generated tokens (5 reallocations). "
        "--runtime transformers runs Hugging Face DynamicCache / StaticCache on torch CPU instead and compares "
        "with hf-dynamic / hf-static."))
    add_scenario_arguments(p)
    p.set_defaults(**VALIDATE_DEFAULTS)
    helps = {
        "model": "preset whose dimensions the toy model takes, or 'custom' (default custom)",
        "layers": "attention layers (default 4)",
        "heads": "query heads (default 8)",
        "kv_heads": "key/value heads (default: --heads, MHA; fewer: GQA)",
        "head_dim": "head size (default 64)",
        "precision": "KV_CACHE_PRECISION hint: u8 u4 f16 bf16 f32 (default: the plugin's; the effective precision "
                     "is read from the compiled model)",
        "prompt": "prompt tokens (default 32)",
        "decode": "generated tokens (default 1100)",
    }
    for action in p._actions:
        if action.dest in helps:
            action.help = helps[action.dest]
    r = p.add_argument_group("real run")
    r.add_argument("--hidden", type=int, help="hidden size of the toy model (default heads x head-dim)")
    r.add_argument("--vocab", type=int, default=1000, help="vocabulary of the toy model (default 1000)")
    r.add_argument("--inference-precision", help="INFERENCE_PRECISION_HINT: bf16 f16 f32 (default: the plugin's)")
    r.add_argument("--ir", metavar="PATH", help="validate an exported model (openvino_model.xml or its folder); "
                   "dimensions come from its state variables")
    r.add_argument("--mmap-threshold", type=int, default=65536,
                   help="MALLOC_MMAP_THRESHOLD_ of the clean run (default 65536)")
    r.add_argument("--slope-min-tokens", type=int, default=500,
                   help="quiet decode stretches at least this long give the resident slope (default 500)")
    r.add_argument("--seed", type=int, default=0, help="weights and token ids (default 0)")
    r.add_argument("--runtime", choices=("openvino", "transformers"), default="openvino",
                   help="openvino: the CPU plugin vs openvino-cpu (default); transformers: Hugging Face caches on "
                   "torch CPU vs hf-dynamic / hf-static (--precision f32 f16 bf16, default f32)")
    r.add_argument("--policy", choices=("hf-dynamic", "hf-static"),
                   help="--runtime transformers: DynamicCache (hf-dynamic, default) or StaticCache (hf-static)")
    r.add_argument("--policy-opt", action="append", metavar="KEY=VALUE",
                   help="--runtime transformers: max_cache_len=N for hf-static (default: the longest history)")
    add_latency_arguments(p, default="host")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    o.add_argument("--out", metavar="PATH.json", help="write the JSON result to a file")
    o.add_argument("--report", metavar="PATH.html", help="write a self-contained HTML report")
    _add_paged_validate_arguments(p)
    p.set_defaults(func=_cmd_validate)


def _add_paged_validate_arguments(p) -> None:
    """``simkv validate --paged`` (issue #8): OpenVINO GenAI continuous batching vs the paged model."""
    g = p.add_argument_group("paged (--paged: OpenVINO GenAI ContinuousBatchingPipeline vs the paged serving model)")
    g.add_argument("--paged", action="store_true",
                   help="validate the paged continuous-batching model step by step against GenAI's pipeline on CPU "
                        "(model flags shape its toy model: default 2 layers, 4 heads, 2 kv heads x 32)")
    g.add_argument("--trace", metavar="W.csv", help="the workload (serving CSV/JSONL with arrival_step)")
    g.add_argument("--random", type=int, metavar="N", help="N random workloads and configurations from --seed")
    g.add_argument("--num-kv-blocks", type=int, default=0, metavar="N", help="pool blocks (0 with --cache-size 0: dynamic pool)")
    g.add_argument("--cache-size", type=int, default=0, metavar="GIB", help="pool size in whole GiB (GenAI's cache_size)")
    g.add_argument("--max-num-batched-tokens", type=int, default=256, metavar="N", help="tokens per step (default 256)")
    g.add_argument("--max-num-seqs", type=int, default=256, metavar="N",
                   help="running requests in vLLM mode (split-fuse does not apply it; default 256)")
    g.add_argument("--no-dynamic-split-fuse", action="store_true", help="vLLM mode: whole prompts, no chunks")
    g.add_argument("--prefix-caching", action="store_true", help="enable_prefix_caching")
    g.add_argument("--no-memray", action="store_true", help="skip recording the pool allocations (faster)")


def _cmd_validate(args: argparse.Namespace) -> int:
    if args.paged:  # OpenVINO GenAI continuous batching vs the paged serving model (simkv/validate/genai.py)
        from simkv.validate.genai import cli_main

        return cli_main(args)
    from simkv.limits import check_flags
    from simkv.scenario import build_scenario

    check_flags(args)
    if args.runtime == "transformers":  # Hugging Face caches on torch CPU (simkv.validate.transformers)
        from simkv.validate.transformers import command

        return command(args)
    if args.sliding_window or args.policy or args.policy_opt:
        raise SimkvError("--sliding-window, --policy and --policy-opt need --runtime transformers")

    given = [f"--{k.replace('_', '-')}" for k in ("layers", "heads", "kv_heads", "head_dim", "hidden")
             if getattr(args, k) is not None] + (["--model"] if args.model != "custom" else [])
    if args.ir and given:
        raise SimkvError(f"--ir takes the dimensions from the model: drop {', '.join(given)}")
    for name in ("vocab", "mmap_threshold", "slope_min_tokens"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise SimkvError(f"--{name.replace('_', '-')} must be positive")
    model = None if args.model == "custom" else args.model
    dims = {k: getattr(args, k) for k in ("layers", "heads", "kv_heads", "head_dim")}
    if model is None:
        for k, v in VALIDATE_TOY.items():
            dims[k] = v if dims[k] is None else dims[k]
    # Validates the shape and the workload before anything slow happens.
    sc = build_scenario(model=model, **dims, precision="u8", policy="openvino-cpu", prompt=args.prompt, decode=args.decode,
                        turns=args.turns, turn_tokens=args.turn_tokens, turn_decode=args.turn_decode,
                        beam=args.beam, ops=args.ops, weights_memory=0)  # a host run: KV only
    m = sc.model  # ModelSpec has already rejected heads that are not a multiple of kv_heads
    try:
        from simkv.validate.runner import ValidateConfig, check_dependencies, run_validation

        check_dependencies()
    except ImportError:
        print("simkv validate: error: OpenVINO validation needs openvino and memray: "
              "pip install 'simkv[openvino]'", file=sys.stderr)
        return 2
    from simkv.validate.ovmodel import NotFusedError

    cfg = ValidateConfig(
        workload=str(sc.workload), layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim,
        hidden=args.hidden, vocab=args.vocab, seed=args.seed, kv_cache_precision=args.precision,
        inference_precision=args.inference_precision, ir=args.ir, mmap_threshold=args.mmap_threshold,
        slope_min_tokens=args.slope_min_tokens, progress=sys.stderr.isatty(), model_name=m.name, device=args.device,
    )
    try:
        data = run_validation(cfg)
    except NotFusedError as err:
        print(f"simkv validate: error: {str(err).split('. ')[0]}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"simkv validate: error: no such model: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # compile errors, unsupported precision hints, a failed clean run
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and not ln.startswith("Exception from ")]
        print(f"simkv validate: error: {lines[-1] if lines else repr(err)}", file=sys.stderr)
        return 2
    return emit_validation(args, data)


def emit_validation(args: argparse.Namespace, data: dict) -> int:
    """Write/print a validation result as asked (--out, --report, --json); exit 0 only if every KV event matched."""
    from simkv.validate.report import emit

    return emit(args, data)


# --- end of simkv validate ---------------------------------------------------------------------


# --- simkv app (issue #4): the interactive what-if dashboard -----------------------------------
# Self-contained block: the parser, the command, and one registration line in build_parser().


def _add_app_parser(sub) -> None:
    from simkv.dashboard.server import add_arguments

    p = sub.add_parser("app", help="serve the interactive what-if dashboard in the browser",
                       description="Serve the simkv what-if dashboard (Dash) on http://HOST:PORT/.")
    add_arguments(p)
    p.set_defaults(func=_cmd_app)


def _cmd_app(args: argparse.Namespace) -> int:
    from simkv.dashboard.server import serve

    if not 0 < args.port < 65536:
        raise SimkvError(f"--port must be in 1..65535, got {args.port}")
    serve(args.host, args.port, args.debug)
    return 0


# --- simkv cost / devices / calibrate (issue #13): the cost model ---------------------------------
# Self-contained block: parsers, commands, and one registration line each in build_parser().
# The substance is in simkv/cost.py (model, presets), simkv/latency.py (a session's steps), simkv/calibrate.py.


def run_latency(result, args: argparse.Namespace) -> dict | None:
    """TTFT/TPOT of a single-session run on ``--device`` (None without it)."""
    if not getattr(args, "device", None):
        return None
    from simkv.cost import get_device
    from simkv.latency import session_times

    times = session_times(result, get_device(args.device), getattr(args, "weights_precision", None))
    return times.summary(result.steps["phase"])


def _latency_lines(latency: dict) -> list[str]:
    ms = lambda v: "-" if v is None else f"{1e3 * v:,.3f} ms"  # noqa: E731
    slowest = "" if latency["tpot_max_step"] is None else f" (max {ms(latency['tpot_max_s'])} at step {latency['tpot_max_step']})"
    return [
        f"  {'TTFT':<22}{ms(latency['ttft_s'])} on {latency['device']}, {latency['weights_precision']} weights",
        f"  {'TPOT':<22}{ms(latency['tpot_s'])} mean{slowest}",
        f"  {'copy time':<22}{ms(latency['copy_s'])} in all; whole session {latency['total_s']:,.3f} s",
    ]


def _add_cost_parser(sub) -> None:
    from simkv.models import WEIGHT_BYTES

    p = sub.add_parser("cost", help="one step's time on a device: decode, prefill, copy per GiB, and the terms",
                       description=(
        "Price a decode step (BATCH sequences with CONTEXT cached tokens each) and, with --prompt, a prefill on "
        "a device with the cost model: max(bytes / (bandwidth x efficiency), FLOPs / (peak x efficiency)) + copy "
        "time + fixed overhead. Also the stateless loop (the whole sequence recomputed every step) beside it."))
    add_model_arguments(p)
    p.add_argument("--hidden", type=int, help="hidden size (a custom shape's weights; default: the preset's)")
    p.add_argument("--intermediate", type=int, help="MLP size (a custom shape's weights)")
    p.add_argument("--vocab", type=int, help="vocabulary (a custom shape's weights)")
    p.add_argument("--device", default="h100-sxm", metavar="NAME|host|PATH", help="device preset, host or a preset file (default h100-sxm)")
    p.add_argument("--batch", type=int, default=1, help="sequences in the step (default 1)")
    p.add_argument("--context", type=int, default=1024, help="tokens already cached per sequence (default 1024)")
    p.add_argument("--prompt", type=int, help="also price a prefill of this many tokens per sequence")
    p.add_argument("--weights-precision", choices=list(WEIGHT_BYTES), default="f16", help="weight precision (default f16)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_cmd_cost)


def _cmd_cost(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from simkv.cost import estimate, get_device
    from simkv.models import custom_model, get_model
    from simkv.precision import get_precision

    base = None if args.model == "custom" else get_model(args.model)
    model = custom_model(base, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim)
    extra = {k: getattr(args, k) for k in ("hidden", "intermediate", "vocab") if getattr(args, k) is not None}
    if extra:
        model = replace(model, **extra)
    device = get_device(args.device)
    out = estimate(model, device, get_precision(args.precision or "f16"), batch=args.batch, context=args.context,
                   prompt=args.prompt, weights_precision=args.weights_precision)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    ms = lambda v: f"{1e3 * v:,.3f} ms"  # noqa: E731
    t, sl = out["terms"], out["stateless"]
    lines = [
        f"simkv cost: {model.describe()}; {out['kv_precision']} KV, {out['weights_precision']} weights; "
        f"batch {out['batch']} x context {out['context']:,} on {device.name}",
        f"  {'decode step':<22}{ms(out['decode_step_s'])} ({out['bound']} bound)",
        f"  {'  memory term':<22}{ms(t['memory_s'])}: weights {format_bytes(out['weights_bytes'])}, KV read "
        f"{format_bytes(out['kv_read_bytes'])}, written {format_bytes(out['kv_write_bytes'])}",
        f"  {'  compute term':<22}{ms(t['compute_s'])}: {out['flops']:.4g} FLOPs",
        f"  {'  rooflines':<22}matmuls {ms(t['matmul_s'])} + attention {ms(t['attention_s'])}"
        + ("" if device.attention_overlap else " (attention: its reads and arithmetic added)"),
        f"  {'  overhead':<22}{ms(t['overhead_s'])}",
    ]
    if "prefill_s" in out:
        lines.append(f"  {'prefill':<22}{ms(out['prefill_s'])} for {out['batch']} x {args.prompt:,} tokens ({out['prefill_bound']} bound)")
    lines += [
        f"  {'copy per GiB':<22}{ms(out['copy_s_per_gib'])} (a reallocation moving 1 GiB)",
        f"  {'stateful KV':<22}{format_bytes(out['stateful_kv_bytes'])} kept between steps",
        f"  {'stateless step':<22}{ms(sl['decode_step_s'])} ({sl['slowdown']:,.1f}x; {sl['bound']} bound): recomputes "
        f"{out['context'] + 1:,} tokens, {format_bytes(sl['kv_peak_bytes'])} KV inside the step, 0 B between steps",
    ]
    print("\n".join(lines))
    return 0


def _add_devices_parser(sub) -> None:
    p = sub.add_parser("devices", help="list cost-model device presets with their sources",
                       description="Device presets of the cost model: peaks, achieved efficiencies, overhead, and "
                       "where each number comes from. `host` appears after `simkv calibrate`.")
    p.add_argument("--json", action="store_true", help="print the presets as JSON")
    p.set_defaults(func=_cmd_devices)


def _cmd_devices(args: argparse.Namespace) -> int:
    from simkv.cost import DEVICES, device_summary, host_preset_path, load_device

    devices = list(DEVICES.values())
    if host_preset_path().exists():
        devices.append(load_device(host_preset_path()))
    if args.json:
        json.dump([device_summary(d) for d in devices], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{'device':<22}{'memory':>11}{'bandwidth':>12}{'peak':>16}{'eff bw/kv/flops':>18}{'overhead':>11}{'copy':>12}")
    for d in devices:
        peak = f"{d.peak() / 1e12:,.1f} T {d.compute_precision}"
        eff = f"{d.bandwidth_efficiency:.2f}/{d.kv_efficiency:.2f}/{d.flops_efficiency:.2f}"
        print(f"{d.name:<22}{format_bytes(d.memory_bytes):>11}{d.memory_bandwidth / 1e9:>8,.0f} GB/s{peak:>16}"
              f"{eff:>18}{d.step_overhead_s * 1e3:>8.3f} ms{d.copy_bandwidth / 1e9:>7,.0f} GB/s")
    for d in devices:
        print(f"\n{d.name}: {d.description}")
        for key, source in d.sources.items():
            print(f"    {key:<24}{source}")
    return 0


def _add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this host and write the `host` device preset",
                       description="Measure this host on the OpenVINO CPU plugin: its fixed per-inference overhead on "
                       "tiny decoders, its one-token attention (per query head and per KV head), the rate a "
                       "decode step streams weights at, matmul throughput in the precision it computes in, and "
                       "the copy rate of its own KV reallocation; write the host preset (path printed). "
                       "About 30 s.")
    p.add_argument("--out", metavar="PATH.json", help="where to write the preset (default: the host preset path, "
                   "$SIMKV_HOST_PRESET or ~/.config/simkv/host.json)")
    p.add_argument("--threads", type=int, help="CPU threads to measure with (default: the OpenVINO default)")
    p.add_argument("--json", action="store_true", help="print the preset as JSON")
    p.set_defaults(func=_cmd_calibrate)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from simkv.calibrate import calibrate
    from simkv.cost import device_summary, host_preset_path

    if args.threads is not None and args.threads < 1:
        raise SimkvError("--threads must be positive")
    path = args.out or host_preset_path()
    device = calibrate(path, threads=args.threads, progress=not args.json)
    if args.json:
        json.dump({**device_summary(device), "path": str(path)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"host preset written to {path}")
        print(f"  {'weight streaming':<24}{device.memory_bandwidth * device.bandwidth_efficiency / 1e9:,.2f} GB/s")
        print(f"  {'matmul':<24}{device.peak() / 1e9:,.1f} GFLOP/s {device.compute_precision}")
        if device.decode_attention_flops:
            print(f"  {'decode attention':<24}{device.decode_attention_flops / 1e9:,.1f} GFLOP/s (one-token queries)"
                  + ("" if device.attention_overlap else
                     f" + KV reads at {device.memory_bandwidth * device.kv_efficiency / 1e9:,.2f} GB/s, added"))
        print(f"  {'copy bandwidth':<24}{device.copy_bandwidth / 1e9:,.2f} GB/s of KV copied by a plugin reallocation")
        print(f"  {'per-inference overhead':<24}{device.step_overhead_s * 1e3:,.3f} ms + "
              f"{device.layer_overhead_s * 1e3:,.3f} ms per layer")
    return 0


# --- end of simkv cost / devices / calibrate ----------------------------------------------------

# --- simkv sweep / simkv tune (issue #11): the policy lab ----------------------------------------
# Self-contained block: parsers, commands, two registration lines in build_parser(). Substance: simkv.lab.


def _add_executor_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where points run")
    g.add_argument("--workers", type=int, help="local processes (default: one per core; 1 = in this process)")
    g.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="run on this Dask cluster (dask.distributed) instead")


def _add_sweep_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run a parameter grid and store one Parquet row per point (resumable)",
                       description=(
        "Run every combination of the --param values (policy options or scenario fields such as decode) on top of "
        "the scenario flags, and store one row per point in a Parquet file: every scenario field, policy options as "
        "policy.NAME, the metrics of `simkv run --json` (per-layer lists left out), spike_p99_bytes and "
        "mean_waste_bytes. Rerunning with the same --out skips the points already there, so an interrupted sweep "
        "resumes. Points run on local processes, or on a Dask cluster with --scheduler."))
    add_scenario_arguments(p)
    add_policy_arguments(p)
    p.add_argument("--param", action="append", required=True, metavar="KEY=START:STOP:STEP|KEY=V1,V2,...",
                   help="values of one key (repeatable; STOP included when on the grid)")
    p.add_argument("--out", required=True, metavar="PATH.parquet", help="rows go here (existing rows are kept)")
    _add_executor_arguments(p)
    p.set_defaults(func=_cmd_sweep)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from simkv.lab import sweep

    out = sweep.check_out_path(args.out)
    base = scenario_fields(args)
    points = [sweep.make_point(base, o) for o in sweep.grid(args.param, args.policy)]
    try:
        result = sweep.run_sweep(points, out, workers=args.workers, scheduler=args.scheduler,
                                 progress=sys.stderr.isatty())
    except KeyboardInterrupt:
        print(f"simkv sweep: interrupted; {len(sweep.read_rows(out)):,} rows kept in {out}: rerun the same command "
              "to resume", file=sys.stderr)
        return 130
    oom = sum(1 for r in result.rows if r["oom"])
    print(f"simkv sweep: {len(points):,} points ({result.computed:,} run, {result.skipped:,} already in {out})"
          f"{f', {oom:,} out of memory' if oom else ''} -> {out}")
    return 0



def _add_tune_parser(sub) -> None:
    from simkv.lab import tune

    p = sub.add_parser("tune", help="search a policy's parameters over a workload distribution (Pareto front)",
                       description=(
        "Run every candidate configuration on every workload of a distribution (decode lengths, and with "
        "--trace-prompts prompt lengths, drawn from --trace; else the one workload of the scenario flags), aggregate "
        "each objective over the workloads (METRIC:mean or METRIC:max = worst case), keep configurations with no OOM "
        "and a worst peak that fits next to the weights (device memory - --weights-memory) and every --constraint, "
        "and print the Pareto front, the recommendation next to the policy's defaults, and a command reproducing it. "
        f"Metrics: {', '.join(tune.METRICS)}. Default parameters: "
        + "; ".join(f"{k}: {' '.join(v)}" for k, v in tune.TUNABLE.items()) + "."))
    add_scenario_arguments(p)
    add_policy_arguments(p)
    d = p.add_argument_group("workload distribution")
    d.add_argument("--trace", metavar="PATH.csv", help="request trace (ContextTokens,GeneratedTokens or prompt,decode "
                   "columns); its decode lengths replace --decode")
    d.add_argument("--samples", type=_samples, default=64, metavar="N|all",
                   help="workloads drawn from the trace (default 64; all = every row, each length simulated once)")
    d.add_argument("--trace-prompts", action="store_true", help="take prompt lengths from the trace too")
    d.add_argument("--holdout", type=int, default=0, help="also draw this many OTHER trace rows, never searched, and "
                   "re-score the defaults and the recommendation on them (default 0)")
    s = p.add_argument_group("search")
    s.add_argument("--param", action="append", metavar="KEY=START:STOP:STEP|KEY=V1,V2,...",
                   help="a parameter's values (repeatable; default: the policy's tunable parameters)")
    s.add_argument("--objective", action="append", metavar="METRIC[:mean|max]",
                   help=f"minimise (repeatable; the first decides the recommendation; default {' '.join(tune.DEFAULT_OBJECTIVES)})")
    s.add_argument("--constraint", action="append", metavar="METRIC[:mean|max]<=VALUE", help="e.g. spike:max<=64MiB (repeatable)")
    s.add_argument("--search", choices=tune.SEARCHES, default="optuna", help="optuna (default), random or grid")
    s.add_argument("--budget", type=int, default=60, help="configurations to try (default 60; grid: the most allowed)")
    s.add_argument("--seed", type=int, default=0, help="trace sampling and search seed (default 0)")
    v = p.add_argument_group("serving (--serving: tune GenAI's scheduler settings on a trace, simkv.lab.tune_serving)")
    v.add_argument("--serving", action="store_true", help="search paged serving settings (block_size, cache_size GiB "
                   "or num_kv_blocks, max_num_batched_tokens, max_num_seqs, dynamic_split_fuse, prefix_caching) for "
                   "the requests of --trace served with their arrival times; baseline: GenAI's defaults; metrics: "
                   "peak, pool, tpot_p99, ttft_p99, preemptions, copied, waste, time (default objectives "
                   "peak:max tpot_p99:max ttft_p99:max); constraints: every request FINISHED, peak <= device memory - weights")
    v.add_argument("--limit", type=int, help="serve the first N requests of the trace (default 1000)")
    v.add_argument("--device", metavar="NAME|host|PATH", help="cost-model device that times the steps, and its "
                   "memory unless --device-memory (default xeon-8480, as simkv run --trace)")
    v.add_argument("--max-context", type=int, help="refuse prompts at or above this (default: the preset's context; 0: none)")
    v.add_argument("--max-preemptions", type=int, help="stop a candidate's run after this many preemptions: "
                   "infeasible (default: one per request; bounds the time a far too small pool takes)")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the result as JSON (keys baseline, recommendation, pareto, command)")
    o.add_argument("--figure", metavar="PATH.html|.png|.svg", help="write the Pareto front figure")
    o.add_argument("--out", metavar="PATH.parquet", help="also store every simulated point (as simkv sweep; resumable)")
    _add_executor_arguments(p)
    p.set_defaults(func=_cmd_tune)


def _samples(text: str) -> int:
    from simkv.lab.traces import ALL

    if text == "all":
        return ALL
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or all, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (or all), got {value}")
    return value


def _cmd_tune(args: argparse.Namespace) -> int:
    import shlex

    from simkv.lab import sweep, traces, tune

    if args.out:
        sweep.check_out_path(args.out)
    if args.figure and not args.figure.endswith((".html", ".png", ".svg")):
        raise SimkvError(f"--figure must end in .html, .png or .svg, got {args.figure!r}")
    serving_only = [f for f in ("limit", "device", "max_context", "max_preemptions") if getattr(args, f) is not None]
    if serving_only and not args.serving:
        raise SimkvError(f"--{serving_only[0].replace('_', '-')} is for --serving")
    base = scenario_fields(args)
    holdout = []
    target = None
    if args.serving:
        from simkv.lab import tune_serving

        if not args.trace:
            raise SimkvError("--serving needs --trace PATH (the requests to serve)")
        target = tune_serving.build_target(
            trace=args.trace, limit=args.limit, model=None if args.model == "custom" else args.model,
            layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
            precision=args.precision, device=args.device, device_memory=args.device_memory,
            weights_memory=args.weights_memory, weights_precision=args.weights_precision,
            max_context=args.max_context, max_preemptions=args.max_preemptions)
        base = {"policy": "paged"}
        workloads, source = [], f"the first {target.limit:,} requests of {args.trace}"
    elif args.trace:
        (prompts, decodes), (held_p, held_d) = traces.split(args.trace, args.samples, args.holdout, args.seed)

        def pairs(ps, ds):
            return [(int(p) if args.trace_prompts else args.prompt, int(d)) for p, d in zip(ps, ds)]

        workloads, holdout = pairs(prompts, decodes), pairs(held_p, held_d)
        drawn = "every row" if args.samples == traces.ALL else f"{len(workloads)} rows, seed {args.seed}"
        source = f"{args.trace} ({drawn}, {'prompt+decode' if args.trace_prompts else 'decode'})"
    elif args.holdout:
        raise SimkvError("--holdout needs --trace")
    else:
        workloads, source = [(args.prompt, args.decode)], "the scenario flags"
    if target:
        params = [tune.Param.parse(x, "paged", tune_serving.kinds()) for x in (args.param or tune_serving.TUNABLE)]
        objectives = args.objective or tune_serving.DEFAULT_OBJECTIVES
    else:
        params = [tune.Param.parse(x, args.policy) for x in (args.param or tune.TUNABLE.get(args.policy, ()))]
        objectives = args.objective or tune.DEFAULT_OBJECTIVES
    spec = tune.TuneSpec(
        base=base, params=params, workloads=workloads, objectives=[tune.Objective.parse(x) for x in objectives],
        constraints=[tune.Constraint.parse(x) for x in args.constraint or ()],
        search=args.search, budget=args.budget, seed=args.seed, holdout=holdout, serving=target)
    result = tune.run_tune(spec, workers=args.workers, scheduler=args.scheduler, out=args.out,
                           progress=sys.stderr.isatty() and not args.json)
    command = (target.command(result.recommendation.params) if target
               else tune.run_command(base, result.recommendation.params))
    tune_command = shlex.join(["simkv", *sys.argv[1:]]) if sys.argv[1:2] == ["tune"] else ""
    if args.figure:
        from simkv.lab.output import save_figure

        save_figure(tune.figure(result), args.figure)
    if args.json:
        json.dump(result.to_json(command, tune_command, source), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        what = (f"GenAI scheduler settings serving {source}" if target
                else f"{args.policy} over {len(workloads)} workloads from {source}")
        print(f"simkv tune: {what}; search {args.search}, "
              f"{len(result.evaluated)} configurations; objectives {', '.join(o.name for o in spec.objectives)}; "
              f"constraints: {'every request FINISHED' if target else 'no OOM'}, "
              f"peak:max <= {format_bytes(spec.free_bytes)} free"
              + "".join(f", {c.name}" for c in spec.constraints))
        print("\n".join(tune.summary_lines(result, command)))
        if args.figure:
            print(f"  {'figure':<22}{args.figure}")
    return 0


# --- end of simkv sweep / simkv tune -------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from simkv import __version__
    from simkv.serving.cli import add_run_arguments

    parser = Parser(prog="simkv", description="KV-cache memory simulator and policy lab for LLM inference.")
    parser.add_argument("--version", action="version", version=f"simkv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    run = sub.add_parser("run", help="simulate one scenario and report its memory", description=(
        "Simulate a stateful LLM session and report peak/mean memory, waste, reallocations, copies and spikes. "
        "With no arguments: llama-3-8b, openvino-gpu policy, 1,024-token prompt, 2,048 generated tokens."
    ), epilog=(
        f"Exit codes: 0 the run fit in device memory; {EXIT_OUT_OF_MEMORY} it ran out of memory (the OUT OF MEMORY "
        "line comes first, the figures describe the run up to the failing allocation); 2 bad input. Limits: "
        "layers <= 100,000, heads and head size <= 65,536, tokens per flag or operation <= 100,000,000, "
        "turns <= 100,000, beam <= 4,096, device <= 1 PiB, <= 10,000,000 steps before memory runs out, "
        "<= 8,000,000 ledger rows (a run that would record more stops there, exit 2). "
        "--ledger must end in .csv or .parquet, --timeline in .html, in an existing directory."
    ))
    add_run_arguments(run)  # simkv.serving.cli: the dashboard's Serving view parses with it too
    run.set_defaults(func=_cmd_run)

    sub.add_parser("policies", help="list policies and their parameters").set_defaults(func=_cmd_policies)
    sub.add_parser("models", help="list model presets and precisions").set_defaults(func=_cmd_models)
    _add_validate_parser(sub)  # simkv validate (block above)
    _add_app_parser(sub)  # simkv app (block above)
    _add_cost_parser(sub), _add_devices_parser(sub), _add_calibrate_parser(sub)  # simkv cost/devices/calibrate
    _add_sweep_parser(sub)  # simkv sweep (lab block above)
    _add_tune_parser(sub)  # simkv tune (lab block above)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand's parser, so the error names `simkv run`, not `simkv`
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except SimkvError as err:
        print(f"simkv {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `simkv run --json | head`
        return 0
    except OSError as err:  # an output path that cannot be written
        print(f"simkv {args.command}: error: {err.strerror or err}: {err.filename or ''}".rstrip(": "),
              file=sys.stderr)
        return 2
    except MemoryError:
        print(f"simkv {args.command}: error: out of host memory simulating this run (see README, Limits)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

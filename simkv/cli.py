"""The ``simkv`` command: a thin layer over :func:`simkv.build_scenario` and :func:`simkv.simulate`.

Any error caused by input is printed as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from simkv.errors import SimkvError
from simkv.units import format_bytes


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit code 2)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_scenario_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that describe a scenario, shared by ``run`` and ``validate``."""
    from simkv import scenario as sc

    m = p.add_argument_group("model (a preset, optionally with some dimensions overridden)")
    m.add_argument("--model", default=sc.DEFAULT_MODEL, help=f"preset name, or 'custom' (default {sc.DEFAULT_MODEL}; see `simkv models`)")
    m.add_argument("--layers", type=int, help="attention layers")
    m.add_argument("--heads", type=int, help="query heads")
    m.add_argument("--kv-heads", type=int, help="key/value heads (fewer than heads: GQA)")
    m.add_argument("--head-dim", type=int, help="head size")
    m.add_argument("--precision", help="KV precision: f32 f16 bf16 u8 u4 i8 (default: the policy's runtime default)")

    w = p.add_argument_group("workload (one stateful session)")
    w.add_argument("--prompt", type=int, default=sc.DEFAULT_PROMPT, help=f"prompt tokens (default {sc.DEFAULT_PROMPT})")
    w.add_argument("--decode", type=int, default=sc.DEFAULT_DECODE, help=f"generated tokens (default {sc.DEFAULT_DECODE})")
    w.add_argument("--turns", type=int, default=0, help="further chat turns after the first answer (default 0)")
    w.add_argument("--turn-tokens", type=int, default=64, help="user tokens appended per chat turn (default 64)")
    w.add_argument("--turn-decode", type=int, help="tokens generated per chat turn (default: --decode)")
    w.add_argument("--beam", type=int, default=1, help="beam width for every answer: fork, decode, select (default 1)")
    w.add_argument(
        "--ops",
        help="explicit operations instead of the above, e.g. prefill:32,decode:100,fork:4,decode:50,"
        "reorder,select:0,reset,prefill:16,decode:10",
    )


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    from simkv import scenario as sc
    from simkv.models import WEIGHT_BYTES

    g = p.add_argument_group("allocation policy and device")
    g.add_argument("--policy", default=sc.DEFAULT_POLICY, help=f"policy name (default {sc.DEFAULT_POLICY}; see `simkv policies`)")
    g.add_argument("--policy-opt", action="append", metavar="KEY=VALUE", help="override a policy parameter (repeatable)")
    g.add_argument("--device-memory", default=sc.DEFAULT_DEVICE_MEMORY, help=f"device memory, e.g. 16GiB (default {sc.DEFAULT_DEVICE_MEMORY})")
    g.add_argument("--weights-memory", metavar="BYTES", help="device memory taken besides the KV cache (weights, other "
                   "models), e.g. 8GiB or 0; counts toward the headroom limit and out of memory (default: the "
                   "preset's weights at --weights-precision; 0 for a custom shape)")
    g.add_argument("--weights-precision", choices=list(WEIGHT_BYTES), help="precision of the weights for the default "
                   "--weights-memory (default: as optimum-intel exports: int8 from 1e9 parameters, else f16)")


def scenario_from_args(args: argparse.Namespace):
    from policies import parse_policy_opts
    from simkv.scenario import build_scenario

    return build_scenario(
        model=None if args.model == "custom" else args.model,
        layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
        precision=args.precision, policy=args.policy, policy_options=parse_policy_opts(args.policy_opt),
        prompt=args.prompt, decode=args.decode, turns=args.turns, turn_tokens=args.turn_tokens,
        turn_decode=args.turn_decode, beam=args.beam, ops=args.ops, device_memory=args.device_memory,
        weights_memory=args.weights_memory, weights_precision=args.weights_precision,
    )


def _cmd_run(args: argparse.Namespace) -> int:
    from simkv.scenario import simulate

    scenario = scenario_from_args(args)
    result = simulate(scenario, engine=args.engine, progress=not args.json)
    if args.ledger:
        result.ledger.write(args.ledger)
    if args.timeline:
        from simkv.figures import timeline, write_html

        write_html(timeline(result), args.timeline)
    if args.json:
        out = result.summary()
        out["per_layer"] = result.per_layer()
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_summary(result))
        for what, path in (("ledger", args.ledger), ("timeline", args.timeline)):
            if path:
                print(f"  {what:<22}{path}")
    return 0


def render_summary(result) -> str:
    """The human-readable report of ``simkv run``."""
    m, s = result.metrics, result.scenario
    spike = f"{format_bytes(m.max_spike_bytes)}" + (f" at step {m.max_spike_step}" if m.max_spike_step is not None else "")
    lines = [
        f"simkv: {s.describe()}",
        f"  {'engine':<22}{result.engine}",
        f"  {'steps':<22}{m.steps:,}",
        f"  {'device memory':<22}{format_bytes(s.device_memory)} ({format_bytes(s.weights_memory)} of it weights and other models)",
        f"  {'KV bytes per token':<22}{format_bytes(s.precision.kv_bytes_per_token(s.model))} (all layers, K+V, with scales)",
        f"  {'peak allocated':<22}{format_bytes(m.peak_allocated_bytes)}",
        f"  {'peak resident':<22}{format_bytes(m.peak_resident_bytes)}",
        f"  {'mean allocated':<22}{format_bytes(m.mean_allocated_bytes)}",
        f"  {'final allocated':<22}{format_bytes(m.final_allocated_bytes)}",
        f"  {'final used':<22}{format_bytes(m.used_bytes)}",
        f"  {'final waste':<22}{format_bytes(m.waste_bytes)} ({m.waste_pct:.1f} %: "
        f"{format_bytes(m.waste_reserved_bytes)} headroom, {format_bytes(m.waste_transient_bytes)} old buffers)",
        f"  {'reallocations':<22}{m.realloc_count:,} (K/V data buffers replaced)",
        f"  {'bytes copied':<22}{format_bytes(m.bytes_copied)}",
        f"  {'largest spike':<22}{spike}",
    ]
    layers = result.per_layer()
    for entry in layers[:2]:
        steps = entry["alloc_steps"]
        shown = ", ".join(map(str, steps[:12])) + (f", … ({len(steps)} in all)" if len(steps) > 12 else "")
        lines.append(f"  {'layer 0 ' + entry['tensor'].upper() + ' allocs at':<22}steps {shown}")
    if result.oom:
        lines.append(f"  OUT OF MEMORY: {result.oom}")
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
        "Defaults: 4 layers, 8 heads (MHA) x 64, 32-token prompt, 1,100 generated tokens (5 reallocations)."))
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
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    o.add_argument("--out", metavar="PATH.json", help="write the JSON result to a file")
    o.add_argument("--report", metavar="PATH.html", help="write a self-contained HTML report")
    p.set_defaults(func=_cmd_validate)


def _cmd_validate(args: argparse.Namespace) -> int:
    from simkv.scenario import build_scenario

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
                        beam=args.beam, ops=args.ops)
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
        slope_min_tokens=args.slope_min_tokens, progress=sys.stderr.isatty(), model_name=m.name,
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
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    if args.report:
        from simkv.validate.report import write_report

        write_report(data, args.report)
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        from simkv.validate.compare import summary_lines

        print("\n".join(summary_lines(data)))
        for what, path in (("json", args.out), ("report", args.report)):
            if path:
                print(f"  {what:<22}{path}")
    return 0 if data["events_missing"] == 0 and data["events_unexpected"] == 0 else 1


# --- end of simkv validate ---------------------------------------------------------------------


# --- simkv app (issue #4): the interactive what-if dashboard -----------------------------------
# Self-contained block: the parser, the command, and one registration line in build_parser().


def _add_app_parser(sub) -> None:
    p = sub.add_parser("app", help="serve the interactive what-if dashboard in the browser",
                       description="Serve the simkv what-if dashboard (Dash) on http://HOST:PORT/.")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    p.add_argument("--debug", action="store_true", help="Dash debug mode: reload on change, dev tools")
    p.set_defaults(func=_cmd_app)


def _cmd_app(args: argparse.Namespace) -> int:
    from simkv.dashboard import serve

    if not 0 < args.port < 65536:
        raise SimkvError(f"--port must be in 1..65535, got {args.port}")
    serve(args.host, args.port, args.debug)
    return 0


# --- simkv sweep / simkv tune (issue #11): the policy lab ----------------------------------------
# Self-contained block: parsers, commands, two registration lines in build_parser(). Substance: simkv.lab.


def _point_from_args(args: argparse.Namespace) -> dict:
    """The scenario flags of ``simkv run`` as a sweep point (simkv.lab.sweep)."""
    from policies import parse_policy_opts

    return {
        "model": None if args.model == "custom" else args.model, "layers": args.layers, "heads": args.heads,
        "kv_heads": args.kv_heads, "head_dim": args.head_dim, "precision": args.precision,
        "policy": args.policy, "policy_options": parse_policy_opts(args.policy_opt),
        "prompt": args.prompt, "decode": args.decode, "turns": args.turns, "turn_tokens": args.turn_tokens,
        "turn_decode": args.turn_decode, "beam": args.beam, "ops": args.ops, "device_memory": args.device_memory,
        "weights_memory": args.weights_memory, "weights_precision": args.weights_precision,
    }


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
    base = _point_from_args(args)
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
    base = _point_from_args(args)
    holdout = []
    if args.trace:
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
    spec = tune.TuneSpec(
        base=base, params=[tune.Param.parse(x, args.policy) for x in (args.param or tune.TUNABLE.get(args.policy, ()))],
        workloads=workloads,
        objectives=[tune.Objective.parse(x) for x in (args.objective or tune.DEFAULT_OBJECTIVES)],
        constraints=[tune.Constraint.parse(x) for x in args.constraint or ()],
        search=args.search, budget=args.budget, seed=args.seed, holdout=holdout)
    result = tune.run_tune(spec, workers=args.workers, scheduler=args.scheduler, out=args.out,
                           progress=sys.stderr.isatty() and not args.json)
    command = tune.run_command(base, result.recommendation.params)
    tune_command = shlex.join(["simkv", *sys.argv[1:]]) if sys.argv[1:2] == ["tune"] else ""
    if args.figure:
        from simkv.lab.output import save_figure

        save_figure(tune.figure(result), args.figure)
    if args.json:
        json.dump(result.to_json(command, tune_command, source), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(f"simkv tune: {args.policy} over {len(workloads)} workloads from {source}; search {args.search}, "
              f"{len(result.evaluated)} configurations; objectives {', '.join(o.name for o in spec.objectives)}; "
              f"constraints: no OOM, peak:max <= {format_bytes(spec.free_bytes)} free"
              + "".join(f", {c.name}" for c in spec.constraints))
        print("\n".join(tune.summary_lines(result, command)))
        if args.figure:
            print(f"  {'figure':<22}{args.figure}")
    return 0


# --- end of simkv sweep / simkv tune -------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from simkv.scenario import ENGINES

    parser = _Parser(prog="simkv", description="KV-cache memory simulator and policy lab for LLM inference.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="simulate one scenario and report its memory", description=(
        "Simulate a stateful LLM session and report peak/mean memory, waste, reallocations, copies and spikes. "
        "With no arguments: llama-3-8b, openvino-gpu policy, 1,024-token prompt, 2,048 generated tokens."
    ))
    add_scenario_arguments(run)
    add_policy_arguments(run)
    o = run.add_argument_group("output")
    o.add_argument("--engine", choices=ENGINES, default="fast", help="fast (events only) or reference (every step, every layer)")
    o.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    o.add_argument("--ledger", metavar="PATH", help="write every alloc/copy/free event (.csv or .parquet)")
    o.add_argument("--timeline", metavar="PATH.html", help="write the memory timeline as a self-contained HTML page")
    run.set_defaults(func=_cmd_run)

    sub.add_parser("policies", help="list policies and their parameters").set_defaults(func=_cmd_policies)
    sub.add_parser("models", help="list model presets and precisions").set_defaults(func=_cmd_models)
    _add_validate_parser(sub)  # simkv validate (block above)
    _add_app_parser(sub)  # simkv app (block above)
    _add_sweep_parser(sub)  # simkv sweep (lab block above)
    _add_tune_parser(sub)  # simkv tune (lab block above)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SimkvError as err:
        print(f"simkv {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `simkv run --json | head`
        return 0
    except OSError as err:  # an output path that cannot be written
        print(f"simkv {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``simkv tune`` (issue #11): search a policy's parameters over a workload distribution (Pareto front and
a recommendation), or with ``--serving`` GenAI's scheduler settings on a trace. The substance is in
simkv.lab.tune and simkv.lab.tune_serving."""

from __future__ import annotations

import argparse
import json
import sys

from simkv.cost import DEFAULT_DEVICE
from simkv.errors import SimkvError
from simkv.flags import (ANY, EXECUTOR_MODES, Mode, add_executor_arguments, add_latency_arguments,
                         add_policy_arguments, add_scenario_arguments, scenario_fields, workload_modes)
from simkv.units import format_bytes


#: The modes of ``simkv tune`` (simkv.flags: every flag declares the ones that use it).
TUNE_MODES = (
    Mode("policy", "tuning a policy over sessions (no --serving)", lambda a: not a.serving, "what"),
    Mode("serving", "tuning serving settings (--serving)", lambda a: a.serving, "what",
         ("--serving", "--trace", "azure-code")),
    Mode("flags", "the one workload of the scenario flags (no --trace)", lambda a: not a.serving and not a.trace,
         "source"),
    Mode("trace", "session workloads drawn from --trace (no --serving)", lambda a: not a.serving and bool(a.trace),
         "source", ("--trace", "azure-code")),
    Mode("flags-lengths", "the one workload of the scenario flags, by its lengths (no --trace, no --ops)",
         lambda a: not a.serving and not a.trace and not a.ops, "source"),
    Mode("prompt-flag", "sessions whose prompt is --prompt (no --serving, --trace-prompts or --ops)",
         lambda a: not a.serving and not (a.trace and a.trace_prompts) and not a.ops, "prompt"),
    *workload_modes(lambda a: not a.serving),
    *EXECUTOR_MODES,
)


def add_parser(sub) -> argparse.ArgumentParser:
    from simkv.lab import tune

    p = sub.add_parser("tune", help="search a policy's parameters over a workload distribution (Pareto front)",
                       modes=TUNE_MODES, description=(
        "Run every candidate configuration on every workload of a distribution (decode lengths, and with "
        "--trace-prompts prompt lengths, drawn from --trace; else the one workload of the scenario flags), aggregate "
        "each objective over the workloads (METRIC:mean or METRIC:max = worst case), keep configurations with no OOM "
        "and a worst peak that fits next to the weights (device memory - --weights-memory) and every --constraint, "
        "and print the Pareto front, the recommendation next to the policy's defaults, and a command reproducing it. "
        f"Metrics: {', '.join(tune.METRICS)}. Default parameters: "
        + "; ".join(f"{k}: {' '.join(v)}" for k, v in tune.TUNABLE.items()) + "."))
    add_scenario_arguments(p, model=ANY, workload="flags", sliding_window="policy", prompt="prompt-flag",
                           decode="flags-lengths")
    add_policy_arguments(p, policy="policy", memory=ANY)
    add_latency_arguments(p, modes=ANY, help=(
        "the device, as simkv run's: its memory unless --device-memory (the room a candidate's worst peak must fit "
        "beside the weights), the precisions its runtime loads, weights that leave no room refused; with --serving "
        "also the cost model's step times"))
    d = p.add_argument_group("workload distribution")
    d.add_argument("--trace", metavar="PATH.csv", modes=ANY, help="request trace (ContextTokens,GeneratedTokens or "
                   "prompt,decode columns); its decode lengths replace --decode (--serving: the requests served)")
    d.add_argument("--samples", type=_samples, default=64, metavar="N|all", modes="trace",
                   help="workloads drawn from the trace (default 64; all = every row, each length simulated once)")
    d.add_argument("--trace-prompts", action="store_true", modes="trace",
                   help="take prompt lengths from the trace too")
    d.add_argument("--holdout", type=int, default=0, modes="trace", help="also draw this many OTHER trace rows, never "
                   "searched, and re-score the defaults and the recommendation on them (default 0)")
    s = p.add_argument_group("search")
    s.add_argument("--param", action="append", metavar="KEY=START:STOP:STEP|KEY=V1,V2,...", modes=ANY,
                   help="a parameter's values (repeatable; default: the policy's tunable parameters)")
    s.add_argument("--objective", action="append", metavar="METRIC[:mean|max]", modes=ANY,
                   help=f"minimise (repeatable; the first decides the recommendation; default {' '.join(tune.DEFAULT_OBJECTIVES)})")
    s.add_argument("--constraint", action="append", metavar="METRIC[:mean|max]<=VALUE", modes=ANY,
                   help="e.g. spike:max<=64MiB (repeatable)")
    s.add_argument("--search", choices=tune.SEARCHES, default="optuna", modes=ANY,
                   help="optuna (default), random or grid")
    s.add_argument("--budget", type=int, default=60, modes=ANY,
                   help="configurations to try (default 60; grid: the most allowed)")
    s.add_argument("--seed", type=int, default=0, modes=ANY, help="trace sampling and search seed (default 0)")
    v = p.add_argument_group("serving (--serving: tune GenAI's scheduler settings on a trace, simkv.lab.tune_serving)")
    v.add_argument("--serving", action="store_true", modes="serving", help="search paged serving settings "
                   "(block_size, cache_size GiB or num_kv_blocks, max_num_batched_tokens, max_num_seqs, "
                   "dynamic_split_fuse, prefix_caching, cache_eviction_max: GenAI's cache eviction keeping at most that "
                   "many tokens, 0 off) for the requests of --trace served with their arrival times; baseline: GenAI's "
                   "defaults; metrics: peak, pool, tpot_p99, ttft_p99, preemptions, copied, waste, time (default "
                   "objectives peak:max tpot_p99:max ttft_p99:max); constraints: every request FINISHED, "
                   "peak <= device memory - weights; a prompt at or above the context is refused before any run")
    v.add_argument("--serving-scheduler", choices=("continuous", "vllm"), default="continuous", modes="serving",
                   help="whose settings to search: continuous (GenAI's, default) or vllm (vLLM V1's: block_size, "
                   "gpu_memory_utilization, max_num_batched_tokens, max_num_seqs, long_prefill_token_threshold, "
                   "prefix_caching; baseline vLLM's server defaults for --device)")
    v.add_argument("--limit", type=int, modes="serving", help="serve the first N requests of the trace (default 1000)")
    v.add_argument("--max-context", type=int, modes="serving",
                   help="refuse prompts at or above this (default: the preset's context; 0: none)")
    v.add_argument("--max-preemptions", type=int, modes="serving", help="stop a candidate's run after this many "
                   "preemptions: infeasible (default: one per request; bounds the time a far too small pool takes)")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", modes=ANY,
                   help="print the result as JSON (keys baseline, recommendation, pareto, command)")
    o.add_argument("--figure", metavar="PATH.html|.png|.svg", modes=ANY, output=(".html", ".png", ".svg"),
                   help="write the Pareto front figure (an HTML page holds plotly.js: one file)")
    o.add_argument("--out", metavar="PATH.parquet", modes=ANY, output=(".parquet",),
                   help="also store every simulated point (as simkv sweep; resumable)")
    add_executor_arguments(p)
    return p


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


def main(args: argparse.Namespace) -> int:
    import shlex

    from simkv.lab import traces, tune

    base = scenario_fields(args)  # the flags and output paths were checked by the parser (simkv.flags)
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
            max_context=args.max_context, max_preemptions=args.max_preemptions, scheduler=args.serving_scheduler)
        base = {"policy": "paged"}
        workloads, source = [], f"the first {target.limit:,} requests of {args.trace}"
    elif args.trace:
        (prompts, decodes), (held_p, held_d) = traces.split(args.trace, args.samples, args.holdout, args.seed)

        def pairs(ps, ds):
            return [(int(p) if args.trace_prompts else args.prompt, int(d)) for p, d in zip(ps, ds)]

        workloads, holdout = pairs(prompts, decodes), pairs(held_p, held_d)
        drawn = "every row" if args.samples == traces.ALL else f"{len(workloads)} rows, seed {args.seed}"
        source = f"{args.trace} ({drawn}, {'prompt+decode' if args.trace_prompts else 'decode'})"
    else:
        workloads, source = [(args.prompt, args.decode)], "the scenario flags"
    if target:
        sched = args.serving_scheduler
        params = [tune.Param.parse(x, "paged", tune_serving.kinds(sched))
                  for x in (args.param or tune_serving.tunable(sched))]
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
    command, reproduces = ((target.command(result.recommendation.params), True) if target
                           else tune.session_command(spec, result.recommendation.params))
    tune_command = shlex.join(["simkv", *sys.argv[1:]]) if sys.argv[1:2] == ["tune"] else ""
    if args.figure:
        from simkv.lab.output import save_figure

        save_figure(tune.figure(result), args.figure, self_contained=True)
    if args.json:
        json.dump(result.to_json(command, tune_command, source, reproduces), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        whose = "vLLM" if target and target.template.scheduler == "vllm" else "GenAI"
        what = (f"{whose} scheduler settings serving {source}" if target
                else f"{args.policy} over {len(workloads):,} workload{'' if len(workloads) == 1 else 's'} from {source}")
        print(f"simkv tune: {what}; search {args.search}, "
              f"{len(result.evaluated)} configurations; objectives {', '.join(o.name for o in spec.objectives)}; "
              f"constraints: {'every request FINISHED' if target else 'no OOM'}, "
              f"peak:max <= {format_bytes(spec.free_bytes)} free on {args.device or DEFAULT_DEVICE}"
              + "".join(f", {c.name}" for c in spec.constraints))
        print("\n".join(tune.summary_lines(result, command, tune.command_label(spec, reproduces))))
        if args.figure:
            print(f"  {'figure':<22}{args.figure}")
    return 0

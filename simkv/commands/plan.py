"""``simkv plan`` (issue #21): the cheapest deployment — devices, tensor parallelism, replicas, router, KV
settings — that serves a trace within latency targets. The substance is in simkv.lab.plan."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simkv.errors import ConfigError
from simkv.flags import ANY, EXECUTOR_MODES, REQUEST_MODES, Mode, add_executor_arguments

DEFAULT_SLO = "ttft_p99=2s,tpot_p99=50ms"
DEFAULT_DEVICES = "h100-sxm,a100-80gb,xeon-8480"

#: The modes of ``simkv plan`` (simkv.flags: every flag declares the ones that use it).
PLAN_MODES = (
    *REQUEST_MODES,
    Mode("arrivals", "requests at their arrival times (no --concurrency)", lambda a: a.concurrency is None, "load"),
    Mode("paged", "paged memory (--memory paged, the default)", lambda a: a.memory == "paged", "memory",
         ("--synthetic", "--memory", "paged")),
    Mode("contiguous", "contiguous memory (--memory contiguous)", lambda a: a.memory == "contiguous", "memory",
         ("--synthetic", "--memory", "contiguous"),
         hints={"--cache-eviction": "it is GenAI's paged pool's: use --memory paged"}),
    # on the memory axis too: a scheduler's flag given with --memory contiguous is refused by the memory it names
    Mode("genai", "deployments GenAI's scheduler serves (paged, --serving-scheduler auto or continuous)",
         lambda a: a.memory == "paged" and a.serving_scheduler != "vllm", "memory"),
    Mode("vllm-only", "vLLM's scheduler on every device (--serving-scheduler vllm)",
         lambda a: a.memory == "paged" and a.serving_scheduler == "vllm", "memory",
         ("--synthetic", "--serving-scheduler", "vllm")),
    *EXECUTOR_MODES,
)


def add_parser(sub) -> argparse.ArgumentParser:
    from simkv.lab import plan

    p = sub.add_parser("plan", help="the cheapest deployment (devices, tp, replicas, router, KV settings) meeting an SLO",
                       modes=PLAN_MODES, description=(
        "Serve the trace on every deployment of the search space — device preset x tensor parallelism x replicas x "
        "router x KV precision x block size x pool x max_num_batched_tokens — as `simkv run --trace ... --tp T "
        "--replicas N --router R` serves it, and report the cheapest that meets every SLO (every request finished, "
        "no out of memory, each latency percentile within its limit), the Pareto front of cost against each latency, "
        "and why every other deployment was rejected. Deployments run in waves of 1, 2, ... devices; once a device "
        "kind meets the SLO with d devices its larger deployments are pruned. A run that can no longer meet a TTFT "
        "or e2e percentile stops early (the SLO guard). A trace with a prompt at or above the context is refused "
        "before any run (--max-context). Rows go to --out (Parquet, resumable as `simkv sweep`); points run on local "
        "processes or on a Dask cluster (--scheduler)."))
    w = p.add_argument_group("traffic")
    w.add_argument("--trace", metavar="PATH", modes="trace",
                   help="requests with their arrival times (as simkv run --trace)")
    w.add_argument("--limit", type=int, modes="trace", help="only the first N requests of the trace")
    w.add_argument("--synthetic", action="store_true", modes="synthetic", help="draw requests: --requests, --rate, "
                   "--prompt-dist, --output-dist (as simkv run --synthetic)")
    w.add_argument("--requests", type=int, default=1000, modes="synthetic", help="synthetic: requests (default 1000)")
    w.add_argument("--rate", type=float, default=5.0, modes="synthetic-arrivals",
                   help="synthetic: arrivals per second (default 5)")
    w.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson", modes="synthetic-arrivals",
                   help="synthetic arrival process")
    w.add_argument("--prompt-dist", default="lognormal:1024:1.0", modes="synthetic",
                   help="synthetic prompt lengths (default lognormal:1024:1.0)")
    w.add_argument("--output-dist", default="lognormal:200:1.0", modes="synthetic",
                   help="synthetic output lengths (default lognormal:200:1.0)")
    w.add_argument("--seed", type=int, default=0, modes="synthetic", help="synthetic: random seed (default 0)")
    w.add_argument("--concurrency", type=int, metavar="C", modes=ANY, help="closed-loop load: C clients send the "
                   "requests in order, each its next when its previous ended (as simkv run --concurrency; one engine "
                   "per deployment, no replicas)")
    w.add_argument("--traffic-report", action="store_true", modes="arrivals", help="also size steady traffic "
                   "at the trace's mean and peak arrival rates (the same requests evenly spaced; two more searches) and "
                   "show the cheapest deployment of each beside the trace's")
    t = p.add_argument_group("targets and cost")
    t.add_argument("--model", metavar="NAME|PATH", default="llama-3.1-8b", modes=ANY,
                   help="preset or config.json (default llama-3.1-8b; see simkv models)")
    t.add_argument("--slo", default=DEFAULT_SLO, modes=ANY, help="targets, METRIC_pQ=LIMIT,...: METRIC ttft, tpot or "
                   f"e2e, Q {', '.join(map(str, plan.QUANTILES))}, LIMIT with a unit s/ms/us/min (default {DEFAULT_SLO})")
    t.add_argument("--devices", default=DEFAULT_DEVICES, modes=ANY, help="device presets to choose from (default "
                   f"{DEFAULT_DEVICES}; see simkv devices)")
    t.add_argument("--max-devices", type=int, default=8, modes=ANY,
                   help="most devices one deployment may use (default 8)")
    t.add_argument("--price", action="append", metavar="DEVICE=$/h", modes=ANY, help="price per device-hour, for "
                   "every device (repeatable or comma-separated; default: cost in device-hours)")
    s = p.add_argument_group("search space (comma-separated lists)")
    s.add_argument("--tp", default=",".join(map(str, plan.DEFAULT_TP)), modes=ANY, help="tensor-parallel sizes "
                   "(default 1,2,4,8; those a device's runtime offers and the model splits)")
    s.add_argument("--routers", default=",".join(plan.DEFAULT_ROUTERS), modes=ANY, help="routers for 2+ replicas "
                   "(default round-robin,least-outstanding; also least-kv, session)")
    s.add_argument("--precisions", modes=ANY, help="KV precisions (default per device, as simkv run serves: vLLM "
                   "presets the model's dtype, OpenVINO u8 on CPU, f16 on GPU)")
    s.add_argument("--block-sizes", modes="paged", help="tokens per block (default per device: vLLM 16, GenAI 32 on "
                   "CPU, 16 on GPU)")
    s.add_argument("--pools", modes="paged", help="the KV pool: dynamic (GenAI grows it) or a fraction of the device "
                   "memory less the weights, as vLLM's gpu_memory_utilization (default per device: vLLM 0.9, OpenVINO "
                   "dynamic)")
    s.add_argument("--max-num-batched-tokens", default=",".join(map(str, plan.DEFAULT_MNBT)), modes="paged",
                   help="tokens per step (default 256,2048)")
    s.add_argument("--max-num-seqs", type=int, default=256, modes=ANY,
                   help="requests running at once (vLLM mode; contiguous memory) (default 256)")
    s.add_argument("--no-dynamic-split-fuse", action="store_true", modes="genai", help="GenAI's vLLM mode (whole "
                   "prompts first; --max-num-seqs applies) in every deployment")
    s.add_argument("--prefix-caching", action="store_true", modes="paged",
                   help="enable_prefix_caching in every deployment")
    s.add_argument("--serving-scheduler", default="auto", choices=("auto", "continuous", "vllm"), modes="paged",
                   help="the serving scheduler: auto (default) each device's runtime's: vLLM's (--scheduler vllm) on "
                   "vLLM presets (h100-sxm, h200-sxm, b200, a100 ...), OpenVINO GenAI's on OpenVINO ones (xeon, arc, "
                   "NPU ...); or continuous / vllm for every device")
    s.add_argument("--cache-eviction", metavar="start=N,recent=N,max=N[,kvcrush=B]", modes="genai",
                   help="GenAI's cache eviction in every GenAI-scheduled paged deployment (as simkv run; default off)")
    s.add_argument("--kv-manager", default="genai", modes="genai", help="genai or vllm (as simkv run; default genai; "
                   "GenAI-scheduled deployments only)")
    s.add_argument("--memory", default="paged", choices=("paged", "contiguous"), modes=ANY, help="paged pool "
                   "(default) or contiguous per-request buffers under --policies")
    s.add_argument("--policies", default="openvino-cpu", modes="contiguous", help="contiguous: memory policies to "
                   "search (default openvino-cpu)")
    s.add_argument("--max-context", type=int, modes=ANY,
                   help="refuse prompts at or above this (default: the model's context)")
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="PATH.parquet", modes=ANY, output=(".parquet",), help="one row per deployment "
                   "run (existing rows are reused: rerun to resume)")
    o.add_argument("--json", action="store_true", modes=ANY, help="print the recommendation, the fronts and every "
                   "deployment as JSON")
    o.add_argument("--figure", metavar="PATH", modes=ANY, output=(".html", ".png", ".svg", ""),
                   help="the Pareto fronts (.html, .png or .svg; no suffix: all three)")
    add_executor_arguments(p)
    return p


def target_from_args(args):
    """The :class:`~simkv.lab.plan.Target` and :class:`~simkv.lab.plan.Space` the flags describe."""
    from simkv.lab import plan
    from simkv.serving.sched.eviction import parse_cache_eviction

    if bool(args.trace) == bool(args.synthetic):
        raise ConfigError("give --trace PATH or --synthetic")
    if args.trace:
        if args.limit is not None and args.limit <= 0:
            raise ConfigError("--limit must be positive")
        workload = {"trace": args.trace, "limit": args.limit}
    else:
        if args.requests <= 0 or not args.rate > 0:
            raise ConfigError("--requests and --rate must be positive")
        workload = {"requests": args.requests, "rate": args.rate, "arrivals": args.arrivals,
                    "prompt_dist": args.prompt_dist, "output_dist": args.output_dist, "seed": args.seed}
    if args.concurrency is not None:
        if args.concurrency < 1:
            raise ConfigError(f"--concurrency must be a positive integer, got {args.concurrency}")
        if args.traffic_report:
            raise ConfigError("--traffic-report sizes arrival rates; a closed loop (--concurrency) has none")
        workload["concurrency"] = args.concurrency
    devices = plan._str_list(args.devices)
    if not devices:
        raise ConfigError("--devices names no device")
    eviction = parse_cache_eviction(args.cache_eviction)
    if eviction is not None and args.memory != "paged":
        raise ConfigError("--cache-eviction is GenAI's paged pool's: use --memory paged --scheduler continuous")
    target = plan.Target(workload, args.model, plan.parse_slo(args.slo), kv_manager=args.kv_manager,
                         prefix_caching=args.prefix_caching, max_num_seqs=args.max_num_seqs, memory=args.memory,
                         max_context=args.max_context, dynamic_split_fuse=not args.no_dynamic_split_fuse,
                         scheduler=args.serving_scheduler,
                         cache_eviction=eviction.label() if eviction is not None else None)
    if args.max_num_seqs <= 0:
        raise ConfigError("--max-num-seqs must be positive")
    paged = args.memory == "paged"
    space = plan.Space(devices, args.max_devices, plan._int_list(args.tp, "--tp"),
                       plan._str_list(args.routers) or plan.DEFAULT_ROUTERS, plan._str_list(args.precisions),
                       plan._int_list(args.block_sizes, "--block-sizes"),
                       # contiguous memory takes each prompt whole: one value (the runs would be the same)
                       plan._int_list(args.max_num_batched_tokens, "--max-num-batched-tokens") if paged
                       else plan.DEFAULT_MNBT[:1],
                       plan._str_list(args.pools),
                       plan._str_list(args.policies) if args.memory == "contiguous" else ("openvino-cpu",))
    return target, space, plan.parse_prices(args.price, list(devices))


def main(args: argparse.Namespace) -> int:
    from simkv.lab import plan

    out = Path(args.out) if args.out else None  # checked before the command runs (simkv.flags)
    figure = Path(args.figure) if args.figure else None
    target, space, prices = target_from_args(args)
    try:
        result = plan.run_plan(target, space, prices, out=out, workers=args.workers, scheduler=args.scheduler,
                               progress=sys.stderr.isatty())
        if args.traffic_report:
            plan.traffic_report(result, workers=args.workers, scheduler=args.scheduler)
    except KeyboardInterrupt:
        print("simkv plan: interrupted" + (f"; the deployments run so far are in {out}: rerun the same command to "
                                           "resume" if out else ""), file=sys.stderr)
        return 130
    if figure is not None:
        from simkv.lab.output import save_figure
        from simkv.lab.plan_figure import plan_figure

        save_figure(plan_figure(result), figure, self_contained=True)
    if args.json:
        plan.write_json(result)
    else:
        print(plan.render(result))
        for what, path in (("rows", out), ("figure", figure)):
            if path:
                print(f"  {what:<14}{path}")
    return 0

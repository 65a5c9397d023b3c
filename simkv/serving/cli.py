"""``simkv run``'s flags, declared once, and its serving path: flags → :class:`ServingSpec` → :func:`serve` → report.

The declaration (:func:`add_run_arguments`) is here, below the CLI and the dashboard, because both read
it: ``simkv run`` (simkv.commands.run) and the dashboard's Serving view, which parses the ``simkv run``
line it shows with :func:`run_parser` and builds its spec with :func:`spec_from_args`, as the command does.
"""

from __future__ import annotations

import argparse
import json
import sys

from simkv.errors import ConfigError
from simkv.flags import (ANY, REQUEST_MODES, Mode, Parser, add_latency_arguments, add_policy_arguments,
                         add_scenario_arguments, workload_modes)
from simkv.units import format_bytes, parse_bytes


def _serving(a) -> bool:
    return bool(a.trace or a.synthetic)


#: Where GenAI's cache eviction runs (simkv.serving.sched.eviction): what a scheduler mode without it says.
_EVICTION_HINT = {"--cache-eviction": "it is GenAI's paged pool's: use --memory paged --scheduler continuous"}

#: The modes of ``simkv run`` (simkv.flags: every flag declares the ones that use it).
RUN_MODES = (
    Mode("session", "a single session (no --trace or --synthetic)", lambda a: not _serving(a), "run"),
    Mode("serving", "serving (--trace or --synthetic)", _serving, "run", ("--synthetic",), hints={
        "--prompt": "a trace gives each request's prompt; synthetic prompt lengths are --prompt-dist (e.g. fixed:50)",
        "--decode": "a trace gives each request's output; synthetic output lengths are --output-dist (e.g. fixed:10)",
        "--ops": "a trace gives each request's own operations", "--turns": "a trace's session column makes chat turns",
        "--beam": "a trace's beam column (or samples) gives a request several sequences"}),
    *workload_modes(lambda a: not _serving(a)),
    *REQUEST_MODES,
    Mode("paged", "paged memory (--memory paged, serving's default)", lambda a: _serving(a) and a.memory == "paged",
         "memory", ("--synthetic", "--memory", "paged"), hints={
             "--policy": "the pool's blocks are GenAI's (--block-size, --num-kv-blocks, --cache-size); a policy "
                         "sizes per-request buffers under --memory contiguous",
             "--policy-opt": "a policy sizes per-request buffers under --memory contiguous"}),
    Mode("genai-paged", "GenAI's scheduler on paged memory (--scheduler continuous)",
         lambda a: _serving(a) and a.memory == "paged" and a.scheduler != "vllm", "scheduler",
         ("--synthetic", "--memory", "paged", "--scheduler", "continuous")),
    Mode("vllm", "vLLM's scheduler (--scheduler vllm)", lambda a: _serving(a) and a.scheduler == "vllm", "scheduler",
         ("--synthetic", "--scheduler", "vllm"), hints={
             "--kv-manager": "vLLM's scheduler has vLLM's own KV manager",
             "--no-dynamic-split-fuse": "vLLM's scheduler always chunks prefills (--long-prefill-token-threshold)",
             "--on-oom": "vLLM's scheduler preempts the last running request", **_EVICTION_HINT}),
    Mode("contiguous", "contiguous memory (--memory contiguous)",
         lambda a: _serving(a) and a.memory == "contiguous", "memory", ("--synthetic", "--memory", "contiguous")),
    Mode("contiguous-continuous", "contiguous memory under the continuous scheduler",
         lambda a: _serving(a) and a.memory == "contiguous" and a.scheduler == "continuous", "scheduler",
         ("--synthetic", "--memory", "contiguous", "--scheduler", "continuous"), hints=_EVICTION_HINT),
    Mode("static", "the static scheduler (--scheduler static)", lambda a: _serving(a) and a.scheduler == "static",
         "scheduler", ("--synthetic", "--memory", "contiguous", "--scheduler", "static"), hints=_EVICTION_HINT),
    Mode("one-device", "one device (no --replicas above 1)", lambda a: not (_serving(a) and a.replicas > 1),
         "replicas"),
    Mode("replicas", "replicas (--replicas above 1)", lambda a: _serving(a) and a.replicas > 1, "replicas",
         ("--synthetic", "--replicas", "2"), hints={"--ledger": "the step and request tables (--steps, --requests "
                                                    "PATH) have a replica column", "--timeline": "the step and request "
                                                    "tables (--steps, --requests PATH) have a replica column"}),
    Mode("round-robin", "replicas behind the round-robin router",
         lambda a: _serving(a) and a.replicas > 1 and a.router == "round-robin", "router",
         ("--synthetic", "--replicas", "2", "--router", "round-robin")),
)


def _requests_mode(value: str):
    """``--requests N`` draws N synthetic requests; ``--requests PATH`` writes any serving run's request table."""
    return "synthetic" if value.isdigit() else "serving"


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of ``simkv run``: one session (scenario, policy), output, device, and serving; each with the modes
    (:data:`RUN_MODES`) that use it."""
    from simkv.scenario import ENGINES

    p.modes = RUN_MODES
    add_scenario_arguments(p, model=ANY, workload="session")
    add_policy_arguments(p, policy=("session", "contiguous"), memory=ANY)
    o = p.add_argument_group("output")
    o.add_argument("--engine", choices=ENGINES, default="fast", modes=("session", "paged"),
                   help="fast (events only) or reference (every step, every layer)")
    o.add_argument("--json", action="store_true", modes=ANY, help="print the summary as JSON on stdout")
    o.add_argument("--ledger", metavar="PATH", modes="one-device", output=(".csv", ".parquet"),
                   help="write every alloc/copy/free event (.csv or .parquet)")
    o.add_argument("--timeline", metavar="PATH.html", modes="one-device", output=(".html", ".htm"),
                   help="write the memory timeline as a self-contained HTML page")
    add_latency_arguments(p)
    add_serving_arguments(p)


def add_serving_arguments(p: argparse.ArgumentParser) -> None:
    """``simkv run --trace/--synthetic``: a stream of requests on one device."""
    from simkv.serving.run import MEMORIES, ON_OOM, SCHEDULERS

    g = p.add_argument_group("serving (a stream of requests on one device; given --trace or --synthetic)")
    g.add_argument("--trace", metavar="PATH|NAME", modes="serving", help="requests from a trace (a shipped one by "
                   "name: azure-conv, azure-code): Azure LLM CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or our "
                   "CSV/JSONL (id, arrival|arrival_step, prompt, max_new_tokens[, session, prefix_id, prefix_tokens, "
                   "samples, beam, token_ids])")
    g.add_argument("--synthetic", action="store_true", modes="serving",
                   help="draw requests: --requests, --rate, --prompt-dist, --output-dist")
    g.add_argument("--requests", action="append", metavar="N|PATH.csv", modes=_requests_mode,
                   output=(".csv", ".parquet"), path_if=lambda v: not v.isdigit(),
                   help="a number: synthetic requests to draw (default 100); a path: write the request table there "
                   "(.csv or .parquet; repeatable: both)")
    g.add_argument("--rate", type=float, default=1.0, modes="synthetic-arrivals",
                   help="synthetic: arrivals per second (default 1)")
    g.add_argument("--concurrency", type=int, metavar="C", modes="serving", help="closed-loop load: C clients send "
                   "the requests in order, each its next when its previous ended, as benchmark clients do (vllm bench "
                   "serve --max-concurrency); arrival times (--rate, the trace's) are not used")
    g.add_argument("--async-scheduling", action="store_true", modes="closed-loop", help="with --concurrency: vLLM's "
                   "--async-scheduling (the next step is scheduled while one runs: a request sent as another ends "
                   "waits for two steps in flight, not one)")
    g.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson", modes="synthetic-arrivals",
                   help="synthetic arrival process")
    g.add_argument("--prompt-dist", default="lognormal:1024:1.0", modes="synthetic", help="synthetic prompt lengths: "
                   "fixed:N, uniform:LO:HI, lognormal:MEAN:SIGMA, trace:PATH (default lognormal:1024:1.0; clipped to "
                   "the context)")
    g.add_argument("--output-dist", default="lognormal:200:1.0", modes="synthetic",
                   help="synthetic output lengths (same forms; default lognormal:200:1.0)")
    g.add_argument("--seed", type=int, default=0, modes="synthetic", help="synthetic: random seed (default 0)")
    g.add_argument("--limit", type=int, modes="trace", help="use only the first N requests of the trace")
    g.add_argument("--scheduler", default="continuous", modes="serving",
                   help=f"{' | '.join(SCHEDULERS)} (default continuous)")
    g.add_argument("--memory", default="paged", modes="serving", help=f"{' | '.join(MEMORIES)}: GenAI block pool, "
                   "or per-request buffers under --policy (default paged)")
    g.add_argument("--block-size", type=int, modes="paged", help="paged: tokens per block (32 on CPU, 16 on GPU; "
                   "default 32, --scheduler vllm 16)")
    g.add_argument("--num-kv-blocks", type=int, default=0, modes="paged", help="paged: pool size in blocks (default 0)")
    g.add_argument("--cache-size", type=float, default=0.0, modes="paged", help="paged: pool size in GiB (default 0; "
                   "with --num-kv-blocks 0: a dynamic pool that grows by 256 tokens' worth of blocks)")
    g.add_argument("--max-num-seqs", type=int, modes=("paged", "contiguous-continuous"),
                   help="requests running at once (paged: vLLM mode, and linear-attention state blocks; contiguous "
                   "continuous; default 256; --scheduler vllm: vLLM's server default for the device, 1024 or 256)")
    g.add_argument("--max-num-batched-tokens", type=int, modes="paged", help="paged: tokens per step (default 256; "
                   "--scheduler vllm: vLLM's server default for the device, 8192 on an H100, 2048 on an A100)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9, modes="vllm", help="--scheduler vllm: the "
                   "device's share vLLM takes; the pool is that less the weights and the profile run's activations "
                   "(default 0.9; --num-kv-blocks or --cache-size override it)")
    g.add_argument("--scheduling-policy", default="fcfs", modes="vllm",
                   help="--scheduler vllm: fcfs | priority (default fcfs)")
    g.add_argument("--long-prefill-token-threshold", type=int, default=0, modes="vllm", help="--scheduler vllm: most "
                   "prompt tokens one request gets per step while others are present (default 0: no cap)")
    g.add_argument("--no-dynamic-split-fuse", action="store_true", modes="genai-paged",
                   help="paged: vLLM mode (whole prompts first)")
    g.add_argument("--prefix-caching", action="store_true", modes="paged", help="paged: enable_prefix_caching")
    g.add_argument("--kv-manager", default="genai", modes="genai-paged", help="paged: genai (one block spans every "
                   "attention layer, windows keep every block, linear-attention states in a pool of their own) | vllm "
                   "(vLLM's hybrid manager: a block table per group of layers, windows and chunks free blocks, MLA as "
                   "its latent, a state block per running request; GenAI's scheduling either way; default genai)")
    g.add_argument("--cache-eviction", metavar="start=N,recent=N,max=N[,kvcrush=B]", modes="genai-paged",
                   help="paged: GenAI's cache eviction (use_cache_eviction): a request keeps its first start and last "
                   "recent tokens and at most max (tokens, multiples of the block size; kvcrush: blocks KVCrush keeps; "
                   "'on': start=32,recent=128,max=672; default off)")
    g.add_argument("--on-oom", default="preempt", modes=("genai-paged", "contiguous"), help="when a request's memory "
                   f"does not fit: {' | '.join(ON_OOM)} (default preempt: by recompute, GenAI's victim rule)")
    g.add_argument("--static-batch", type=int, default=8, modes="static",
                   help="static scheduler: requests per batch (default 8)")
    g.add_argument("--max-context", type=int, modes="serving", help="reject prompts at or above this many tokens "
                   "(default: the model's context length, its config's max_position_embeddings; 0 = no limit)")
    g.add_argument("--strict-context", action="store_true", modes="serving", help="refuse the whole run when a "
                   "prompt is at or above the context (default: reject those requests one by one, counted and reported "
                   "as rejected, and serve the rest, as a serving engine's front end does)")
    g.add_argument("--steps", metavar="PATH.csv", modes="serving", output=(".csv", ".parquet"),
                   help="write the step table, .csv or .parquet (with --replicas: every replica's, a replica column "
                   "last)")
    g.add_argument("--replicas", type=int, default=1, modes="serving", help="engines, each on a device of its own, "
                   "behind a router (default 1)")
    g.add_argument("--router", default="round-robin", modes="replicas", help="with --replicas: round-robin | "
                   "least-outstanding | least-kv | session (default round-robin; rules in docs/guide/serving.md, simkv/serving/router.py)")
    g.add_argument("--workers", type=int, default=1, modes="round-robin", help="with --replicas and a router that "
                   "reads no state (round-robin): run the replicas in this many local processes (default 1: in this "
                   "process)")
    g.add_argument("--tp", type=int, default=1, metavar="N", modes="serving", help="tensor parallelism: the model "
                   "split across N devices as vLLM splits it (weights, KV heads, FLOPs per device; each step adds its "
                   "all-reduces over the device's interconnect); the figures are one device's (default 1)")
    g.add_argument("--pp", type=int, default=1, metavar="N", modes="serving", help=argparse.SUPPRESS)


def run_parser() -> Parser:
    """A parser of ``simkv run``'s arguments alone (the words after ``run``), as the command parses them."""
    p = Parser(prog="simkv run", modes=RUN_MODES)
    add_run_arguments(p)
    return p


def _requests_flags(values: list[str] | None) -> tuple[int, str | None]:
    """``--requests`` holds a count (synthetic) and/or a path (the request table)."""
    count, path = 100, None
    for v in values or []:
        if v.isdigit():
            count = int(v)
        else:
            path = v
    return count, path


def spec_from_args(args):
    """The :class:`~simkv.serving.run.ServingSpec` of ``simkv run``'s serving flags (the dashboard builds its runs
    with this too)."""
    from policies import get_policy, parse_policy_opts
    from simkv.hfconfig import resolve_model
    from simkv.models import tp_shard, vllm_kv_precision
    from simkv.precision import get_precision
    from simkv.scenario import resolve_weights_memory
    from simkv.serving.requests import load_trace, synthetic
    from simkv.serving.run import ServingSpec, context_of, runtime_defaults
    from simkv.serving.sched.config import SchedulerConfig
    from simkv.serving.sched.eviction import parse_cache_eviction
    from simkv.serving.sched.vllm import batch_defaults

    if args.trace and args.synthetic:
        raise ConfigError("give --trace or --synthetic, not both")
    count, _ = _requests_flags(args.requests)
    if args.limit is not None and args.limit <= 0:
        raise ConfigError("--limit must be positive")
    model = resolve_model(args.model, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                          head_dim=args.head_dim, sliding_window=args.sliding_window)
    device = check_parallel(args)
    if args.trace:
        requests = load_trace(args.trace, limit=args.limit)
    else:
        context = args.max_context if args.max_context is not None else context_of(model)
        requests = synthetic(count, args.rate, args.prompt_dist, args.output_dist, arrivals=args.arrivals,
                             seed=args.seed, max_prompt=context - 1 if context else None)
    policy = get_policy(args.policy, parse_policy_opts(args.policy_opt))
    # the KV precision: vLLM's scheduler as kv_cache_dtype "auto" does (the checkpoint's fp8 KV, else the model's dtype); GenAI's paged pool what the
    # device's runtime keeps (as simkv plan takes it: u8 on a CPU, f16 on an Intel GPU, the model's dtype on a vLLM
    # device); contiguous buffers the policy's runtime's
    default = (vllm_kv_precision(model) if args.scheduler == "vllm" else
               runtime_defaults(device, model)["precision"] if args.memory == "paged" else policy.default_precision)
    precision = get_precision(args.precision or default)
    precision.check(model)
    vllm = args.scheduler == "vllm"
    if vllm:  # vLLM's defaults where GenAI's differ (block size 16: CacheConfig.DEFAULT_BLOCK_SIZE on CUDA)
        tokens, seqs = batch_defaults(device.name, device.memory_bytes)
        block_size, batched, seqs = args.block_size or 16, args.max_num_batched_tokens or tokens, args.max_num_seqs or seqs
    else:
        block_size, batched, seqs = args.block_size or 32, args.max_num_batched_tokens or 256, args.max_num_seqs or 256
    cfg = SchedulerConfig(block_size=block_size, num_kv_blocks=args.num_kv_blocks, cache_size=args.cache_size,
                          max_num_batched_tokens=batched, max_num_seqs=seqs,
                          dynamic_split_fuse=not args.no_dynamic_split_fuse, enable_prefix_caching=args.prefix_caching,
                          on_oom=args.on_oom, kv_manager=args.kv_manager, scheduler="vllm" if vllm else "genai",
                          gpu_memory_utilization=args.gpu_memory_utilization,
                          long_prefill_token_threshold=args.long_prefill_token_threshold,
                          scheduling_policy=args.scheduling_policy,
                          cache_eviction=parse_cache_eviction(args.cache_eviction))
    device_memory = None if args.device_memory is None else parse_bytes(args.device_memory)
    weights = resolve_weights_memory(tp_shard(model, args.tp), args.weights_memory, args.weights_precision, device)
    if args.static_batch <= 0:
        raise ConfigError("--static-batch must be positive")
    return ServingSpec(requests, model, precision, scheduler=args.scheduler, memory=args.memory, paged=cfg,
                       device=device.name if args.device is None else args.device, device_memory=device_memory,
                       weights_bytes=weights, policy=policy, static_batch=args.static_batch,
                       max_context=args.max_context, strict_context=args.strict_context, engine=args.engine,
                       tp=args.tp, replicas=args.replicas, router=args.router, workers=args.workers,
                       weights_precision=args.weights_precision, weights_given=args.weights_memory is not None,
                       concurrency=args.concurrency, async_scheduling=args.async_scheduling)


def check_parallel(args):
    """The device preset of a serving run, after refusing parallelism it cannot have (one line each): ``--pp``
    (pipeline parallelism is not modelled), a ``--tp`` below 1 or on an OpenVINO device (simkv.cost.Device.check_tp)."""
    from simkv.cost import DEFAULT_DEVICE, get_device

    if getattr(args, "pp", 1) != 1:
        raise ConfigError("--pp: pipeline parallelism is not modelled (each device would hold some of the layers and "
                          "their KV, with micro-batches in flight between them); use --tp")
    if args.tp < 1:
        raise ConfigError(f"--tp must be a positive integer, got {args.tp}")
    device = get_device(args.device or DEFAULT_DEVICE)
    device.check_tp(args.tp)
    return device


def run_serving(args) -> int:
    from simkv.serving.run import serve

    spec = spec_from_args(args)
    result = serve(spec, progress=not args.json)
    _, table_path = _requests_flags(args.requests)
    if args.ledger:
        result.ledger.write(args.ledger)
    if args.steps:
        result.write_steps(args.steps)
    if table_path:
        result.write_requests(table_path)
    if args.timeline:
        from simkv.figures import write_html
        from simkv.serving.figures import serving_timeline

        write_html(serving_timeline(result), args.timeline)
    if args.json:
        json.dump(result.summary(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render(result))
        for what, path in (("ledger", args.ledger), ("steps", args.steps), ("requests", table_path),
                           ("timeline", args.timeline)):
            if path:
                print(f"  {what:<24}{path}")
    return 0


def render(result) -> str:
    if getattr(result, "assignment", None) is not None:
        return render_replicas(result)
    m, sp = result.metrics, result.spec

    sec = _sec
    mem = (f"paged, block {sp.paged.block_size}" + (f", {sp.paged.num_kv_blocks:,} blocks" if sp.paged.num_kv_blocks
           else f", {sp.paged.cache_size:,g} GiB" if sp.paged.cache_size else
           f", pool of gpu_memory_utilization {sp.paged.gpu_memory_utilization}" if sp.paged.scheduler == "vllm" else
           ", dynamic pool")
           + (", prefix caching" if sp.paged.enable_prefix_caching else "")
           + (f", {sp.paged.kv_manager} KV manager" if sp.paged.kv_manager != "genai" else "")
           + (f", cache eviction {sp.paged.cache_eviction.label()}" if sp.paged.cache_eviction else "")) \
        if sp.memory == "paged" else \
        f"contiguous, policy {sp.policy if isinstance(sp.policy, str) else sp.policy.name}"
    alloc = m["mean_allocated_bytes"] or 1
    lines = [
        f"simkv serving: {sp.model.describe()}; {sp.precision.name} KV; {sp.scheduler} scheduler; {mem}",
        f"  {'device':<24}{result.device_name}, {format_bytes(sp.device_memory)} "
        f"({format_bytes(sp.weights_bytes)} of it weights)"
        + (f"; one of {sp.tp} tensor-parallel devices (every figure below is one device's)" if sp.tp > 1 else ""),
        f"  {'requests':<24}{m['requests_total']:,}: {m['requests_finished']:,} finished, "
        f"{m['requests_ignored']:,} ignored, {m['requests_rejected']:,} rejected; {m['preemptions']:,} preemptions",
        *_rejected_lines(result),
        f"  {'steps':<24}{m['steps']:,} over {m['sim_time_s']:,.1f} s simulated",
        f"  {'throughput':<24}{m['throughput_tokens_per_s']:,.0f} generated tokens/s",
        f"  {'TTFT p50 / p99':<24}{sec(m['ttft_p50_s'])} / {sec(m['ttft_p99_s'])}",
        f"  {'TPOT p50 / p99':<24}{sec(m['tpot_p50_s'])} / {sec(m['tpot_p99_s'])}",
        f"  {'peak allocated':<24}{format_bytes(m['peak_allocated_bytes'])}"
        + (f" (more than the device beside the weights only through the CPU plugin's scratch buffers, virtual and "
           f"never touched; "
           f"the pool's own peak, {format_bytes(m['peak_pool_bytes'])}, fits)"
           if sp.memory == "paged" and m["peak_allocated_bytes"] + sp.weights_bytes > sp.device_memory else ""),
        f"  {'peak resident':<24}{format_bytes(m['peak_resident_bytes'])}"
        + (" (blocks ever handed out: the free list is FIFO)" if sp.memory == "paged" else ""),
        f"  {'mean allocated':<24}{format_bytes(m['mean_allocated_bytes'])} (time-weighted)",
        f"  {'mean used':<24}{format_bytes(m['mean_allocated_bytes'] - m['waste_bytes'])} (tokens' KV)",
        f"  {'waste':<24}{100 * m['waste_bytes'] / alloc:.1f} % of allocated: "
        f"{format_bytes(m['waste_reserved_bytes'])} reserved-unused, {format_bytes(m['waste_internal_bytes'])} "
        f"internal, {format_bytes(m['waste_transient_bytes'])} transient",
    ]
    if sp.memory == "paged":
        lines.append(f"  {'internal waste':<24}{m['waste_internal_pct_of_in_use']:.2f} % of the "
                     f"{format_bytes(m['mean_in_use_bytes'])} in blocks in use (last-block slack)")
        lines.append(f"  {'prefix cache hit rate':<24}{100 * m['prefix_hit_rate']:.1f} % of prompt tokens")
        if sp.paged.cache_eviction is not None:
            lines.append(f"  {'cache eviction':<24}{result.evicted_blocks:,} blocks dropped "
                         f"({format_bytes(result.evicted_blocks * result.block_bytes)})")
    if result.stopped:
        lines.append(f"  {'OUT OF MEMORY' if result.oom else 'NOT FINISHED':<24}{result.stopped}")
    lines.append(f"  {'reallocations':<24}{m['realloc_count']:,}; {format_bytes(m['bytes_copied'])} copied")
    return "\n".join(lines)


def _rejected_lines(result) -> list[str]:
    """The requests rejected on arrival, by reason (simkv.serving.run: the front end)."""
    return [f"  {'rejected on arrival':<24}{n:,}: {why} (served the rest; --strict-context refuses the run)"
            for why, n in getattr(result, "rejected_reasons", {}).items()]


def _sec(v) -> str:
    return "n/a" if v is None else f"{v * 1000:,.1f} ms" if v < 10 else f"{v:,.1f} s"


def render_replicas(result) -> str:
    """``simkv run --replicas N``: the totals, then one line per replica."""
    m, sp = result.metrics, result.spec
    first = render(result.replicas[0]).splitlines()
    lines = [first[0] + f"; {len(result.replicas)} replicas, router {sp.router}", first[1] + " each",
             f"  {'requests':<24}{m['requests_total']:,}: {m['requests_finished']:,} finished, "
             f"{m['requests_ignored']:,} ignored, {m['requests_rejected']:,} rejected; {m['preemptions']:,} preemptions",
             *_rejected_lines(result),
             f"  {'steps':<24}{m['steps']:,} (all replicas) over {m['sim_time_s']:,.1f} s simulated",
             f"  {'throughput':<24}{m['throughput_tokens_per_s']:,.0f} generated tokens/s",
             f"  {'TTFT p50 / p99':<24}{_sec(m['ttft_p50_s'])} / {_sec(m['ttft_p99_s'])}",
             f"  {'TPOT p50 / p99':<24}{_sec(m['tpot_p50_s'])} / {_sec(m['tpot_p99_s'])}",
             f"  {'peak allocated':<24}{format_bytes(m['peak_allocated_bytes'])} (the largest replica's)"]
    if result.stopped:
        lines.append(f"  {'NOT FINISHED':<24}{result.stopped}")
    lines.append(f"  {'replica':>9} {'requests':>9} {'finished':>9} {'preempt':>8} {'steps':>9} {'TTFT p99':>10} "
                 f"{'TPOT p99':>9} {'peak alloc':>11} {'mean alloc':>11}")
    for k, res in enumerate(result.replicas):
        r = res.metrics
        lines.append(f"  {k:>9} {r['requests_total']:>9,} {r['requests_finished']:>9,} {r['preemptions']:>8,} "
                     f"{r['steps']:>9,} {_sec(r['ttft_p99_s']):>10} {_sec(r['tpot_p99_s']):>9} "
                     f"{format_bytes(r['peak_allocated_bytes']):>11} {format_bytes(r['mean_allocated_bytes']):>11}")
    return "\n".join(lines)

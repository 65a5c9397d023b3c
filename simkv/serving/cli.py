"""``simkv run --trace/--synthetic``: flags → :class:`ServingSpec` → :func:`serve` → report."""

from __future__ import annotations

import json
import sys

from simkv.errors import ConfigError
from simkv.units import format_bytes, parse_bytes


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
    from policies import get_policy, parse_policy_opts
    from simkv.models import custom_model, get_model
    from simkv.precision import get_precision
    from simkv.scenario import DEFAULT_DEVICE_MEMORY, resolve_weights_memory
    from simkv.serving.requests import load_trace, synthetic
    from simkv.serving.run import CONTEXT, DEFAULT_DEVICE, ServingSpec
    from simkv.serving.scheduler import SchedulerConfig

    if args.trace and args.synthetic:
        raise ConfigError("give --trace or --synthetic, not both")
    if args.ops or args.turns or args.beam != 1:
        raise ConfigError("--ops/--turns/--beam describe one session; a trace gives each request's own")
    count, _ = _requests_flags(args.requests)
    if args.limit is not None and args.limit <= 0:
        raise ConfigError("--limit must be positive")
    base = get_model(args.model) if args.model != "custom" else None
    model = custom_model(base, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim)
    if args.trace:
        requests = load_trace(args.trace, limit=args.limit)
    else:
        context = args.max_context if args.max_context is not None else CONTEXT.get(model.name)
        requests = synthetic(count, args.rate, args.prompt_dist, args.output_dist, arrivals=args.arrivals,
                             seed=args.seed, max_prompt=context - 1 if context else None)
    policy = get_policy(args.policy, parse_policy_opts(args.policy_opt))
    precision = get_precision(args.precision or ("u8" if args.memory == "paged" else policy.default_precision))
    precision.data_bytes_per_token(model)
    cfg = SchedulerConfig(block_size=args.block_size, num_kv_blocks=args.num_kv_blocks, cache_size=args.cache_size,
                          max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                          dynamic_split_fuse=not args.no_dynamic_split_fuse, enable_prefix_caching=args.prefix_caching,
                          on_oom=args.on_oom)
    device_memory = None if args.device_memory == DEFAULT_DEVICE_MEMORY else parse_bytes(args.device_memory)
    weights = resolve_weights_memory(model, args.weights_memory, args.weights_precision)
    if args.static_batch <= 0:
        raise ConfigError("--static-batch must be positive")
    return ServingSpec(requests, model, precision, scheduler=args.scheduler, memory=args.memory, paged=cfg,
                       device=args.device or DEFAULT_DEVICE, device_memory=device_memory, weights_bytes=weights, policy=policy,
                       static_batch=args.static_batch, max_context=args.max_context, engine=args.engine)


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
    m, sp = result.metrics, result.spec

    def sec(v):
        return "n/a" if v is None else f"{v * 1000:.1f} ms" if v < 10 else f"{v:.1f} s"

    mem = (f"paged, block {sp.paged.block_size}" + (f", {sp.paged.num_kv_blocks} blocks" if sp.paged.num_kv_blocks else
           f", {sp.paged.cache_size} GiB" if sp.paged.cache_size else ", dynamic pool")
           + (", prefix caching" if sp.paged.enable_prefix_caching else "")) if sp.memory == "paged" else \
        f"contiguous, policy {sp.policy if isinstance(sp.policy, str) else sp.policy.name}"
    alloc = m["mean_allocated_bytes"] or 1
    lines = [
        f"simkv serving: {sp.model.describe()}; {sp.precision.name} KV; {sp.scheduler} scheduler; {mem}",
        f"  {'device':<24}{result.device_name}, {format_bytes(sp.device_memory)} "
        f"({format_bytes(sp.weights_bytes)} of it weights)",
        f"  {'requests':<24}{m['requests_total']:,}: {m['requests_finished']:,} finished, "
        f"{m['requests_ignored']:,} ignored, {m['requests_rejected']:,} rejected; {m['preemptions']:,} preemptions",
        f"  {'steps':<24}{m['steps']:,} over {m['sim_time_s']:.1f} s simulated",
        f"  {'throughput':<24}{m['throughput_tokens_per_s']:,.0f} generated tokens/s",
        f"  {'TTFT p50 / p99':<24}{sec(m['ttft_p50_s'])} / {sec(m['ttft_p99_s'])}",
        f"  {'TPOT p50 / p99':<24}{sec(m['tpot_p50_s'])} / {sec(m['tpot_p99_s'])}",
        f"  {'peak allocated':<24}{format_bytes(m['peak_allocated_bytes'])}",
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
    if result.stopped:
        lines.append(f"  {'NOT FINISHED':<24}{result.stopped}")
    lines.append(f"  {'reallocations':<24}{m['realloc_count']:,}; {format_bytes(m['bytes_copied'])} copied")
    return "\n".join(lines)

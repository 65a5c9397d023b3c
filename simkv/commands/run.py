"""``simkv run``: simulate one session and report its memory (and with ``--device`` its latency);
given ``--trace`` or ``--synthetic``, serve a stream of requests instead (simkv.serving.cli).

Its flags are declared in :func:`simkv.serving.cli.add_run_arguments`, which the dashboard's Serving
view parses its ``simkv run`` lines with too.
"""

from __future__ import annotations

import argparse
import sys

from simkv.errors import SimkvError
from simkv.units import format_bytes

#: Exit code of a single-session run that ran out of device memory (0: it fit; 2: bad input).
EXIT_OUT_OF_MEMORY = 3


def add_parser(sub) -> argparse.ArgumentParser:
    from simkv.cost import DEFAULT_DEVICE
    from simkv.serving.cli import RUN_MODES, add_run_arguments

    p = sub.add_parser("run", help="simulate one scenario and report its memory", modes=RUN_MODES, description=(
        "Simulate a stateful LLM session and report peak/mean memory, waste, reallocations, copies and spikes; "
        "given --trace or --synthetic, serve a stream of requests instead. With no arguments: llama-3-8b, "
        f"openvino-gpu policy, 1,024-token prompt, 2,048 generated tokens, on {DEFAULT_DEVICE}."
    ), epilog=(
        f"Exit codes: 0 the run fit in device memory; {EXIT_OUT_OF_MEMORY} a single session ran out of memory (the "
        "OUT OF MEMORY line comes first, the figures describe the run up to the failing allocation); 2 bad input, "
        "a flag the mode does not use, an output path that cannot be written, or weights that leave no room for "
        "the KV cache; 130 interrupted. Limits: layers <= 100,000, heads and head size <= 65,536, tokens per flag "
        "or operation <= 100,000,000, turns <= 100,000, beam <= 4,096, device <= 1 PiB, <= 10,000,000 steps before "
        "memory runs out, <= 8,000,000 ledger rows (a run that would record more stops there, exit 2). --ledger, "
        "--steps and --requests must end in .csv or .parquet, --timeline in .html, in an existing directory."
    ))
    add_run_arguments(p)
    return p


def main(args: argparse.Namespace) -> int:
    from simkv import limits
    from simkv.flags import scenario_from_args
    from simkv.jsonout import write_json
    from simkv.scenario import simulate

    if args.trace or args.synthetic:  # serving: a stream of requests
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


def run_latency(result, args: argparse.Namespace) -> dict | None:
    """TTFT/TPOT of a single-session run on ``--device`` (None without it)."""
    if not getattr(args, "device", None):
        return None
    from simkv.cost import get_device
    from simkv.latency import session_times
    from simkv.scenario import default_weights_precision

    device = get_device(args.device)
    precision = getattr(args, "weights_precision", None) or default_weights_precision(result.scenario.model, device)
    times = session_times(result, device, precision)
    return times.summary(result.steps["phase"])


def _latency_lines(latency: dict) -> list[str]:
    ms = lambda v: "-" if v is None else f"{1e3 * v:,.3f} ms"  # noqa: E731
    slowest = "" if latency["tpot_max_step"] is None else f" (max {ms(latency['tpot_max_s'])} at step {latency['tpot_max_step']})"
    return [
        f"  {'TTFT':<22}{ms(latency['ttft_s'])} on {latency['device']}, {latency['weights_precision']} weights",
        f"  {'TPOT':<22}{ms(latency['tpot_s'])} mean{slowest}",
        f"  {'copy time':<22}{ms(latency['copy_s'])} in all; whole session {latency['total_s']:,.3f} s",
    ]

"""``simkv cost`` (issue #13): one step's time on a device with the cost model (simkv/cost/): decode,
prefill, copy per GiB, the terms, and the stateless loop beside it."""

from __future__ import annotations

import argparse
import json
import sys

from simkv.flags import add_model_arguments
from simkv.models import WEIGHT_BYTES
from simkv.units import format_bytes


def add_parser(sub) -> argparse.ArgumentParser:
    from simkv.cost import DEFAULT_DEVICE

    p = sub.add_parser("cost", help="one step's time on a device: decode, prefill, copy per GiB, and the terms",
                       description=(
        "Price a decode step (BATCH sequences with CONTEXT cached tokens each) and, with --prompt, a prefill on "
        "a device with the cost model: max(bytes / (bandwidth x efficiency), FLOPs / (peak x efficiency)) + copy "
        "time + fixed overhead. Also the stateless loop (the whole sequence recomputed every step) beside it. "
        "A context past the model's, or weights and KV that do not fit the device, are priced with a warning."))
    add_model_arguments(p)
    p.add_argument("--hidden", type=int, help="hidden size (a custom shape's weights; default: the preset's)")
    p.add_argument("--intermediate", type=int, help="MLP size (a custom shape's weights)")
    p.add_argument("--vocab", type=int, help="vocabulary (a custom shape's weights)")
    p.add_argument("--device", default=DEFAULT_DEVICE, metavar="NAME|host|PATH",
                   help=f"device preset, host or a preset file (default {DEFAULT_DEVICE})")
    p.add_argument("--batch", type=int, default=1, help="sequences in the step (default 1)")
    p.add_argument("--context", type=int, default=1024, help="tokens already cached per sequence (default 1024)")
    p.add_argument("--prompt", type=int, help="also price a prefill of this many tokens per sequence")
    p.add_argument("--weights-precision", choices=list(WEIGHT_BYTES), help="weight precision (default: what the "
                   "device's runtime loads, as simkv run)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    for action in p._actions:  # the KV precision's default is the device's too
        if action.dest == "precision":
            action.help = "KV precision: f32 f16 bf16 u8 u4 i8 (default: the device's runtime's, as simkv run serves)"
    return p


def main(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from simkv.cost import estimate, get_device
    from simkv.hfconfig import resolve_model
    from simkv.precision import get_precision
    from simkv.serving.run import context_of, runtime_defaults

    model = resolve_model(args.model, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                          head_dim=args.head_dim, sliding_window=args.sliding_window)
    extra = {k: getattr(args, k) for k in ("hidden", "intermediate", "vocab") if getattr(args, k) is not None}
    if extra:
        model = replace(model, **extra)
    device = get_device(args.device)
    weights = args.weights_precision or device.default_weights_precision(model)
    kv = get_precision(args.precision or runtime_defaults(device, model)["precision"])
    kv.check(model)  # also refuses a sparse-attention indexer: its top-k attention is not costed
    out = estimate(model, device, kv, batch=args.batch, context=args.context, prompt=args.prompt,
                   weights_precision=weights)
    out["warnings"] = warnings(out, model, device, context_of(model), args)
    for line in out["warnings"]:
        print(f"simkv cost: warning: {line}", file=sys.stderr)
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
        *([] if "moe" not in out else [
            f"  {'  experts':<22}{out['moe']['decode_experts_touched']:,.1f} of {out['moe']['experts']} per MoE layer "
            f"({out['moe']['experts_per_token']} per token, {out['batch']:,} token{'' if out['batch'] == 1 else 's'}): "
            "weights read "
            f"{format_bytes(out['moe']['decode_weights_read_bytes'])} of {format_bytes(out['weights_bytes'])}"]),
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


def warnings(out: dict, model, device, context: int | None, args) -> list[str]:
    """What makes the priced step one no real run takes: a context past the model's, weights or KV that do not fit
    the device (priced anyway: the terms are still the arithmetic of that step)."""
    lines = []
    longest = args.context + 1 + (args.prompt or 0)
    if context and longest > context:
        lines.append(f"{longest:,} tokens per sequence are past {model.name}'s context of {context:,}")
    need = out["weights_bytes"] + out["stateful_kv_bytes"]
    if need > device.memory_bytes:
        from simkv.scenario import weight_fixes

        # the fixes simkv run would name (simkv.scenario): --tp only on a device whose runtime splits a model (vLLM)
        fixes = [f"serve it with simkv run --synthetic --model {args.model} --device {device.name} {fix}" if fix.startswith("--tp ") else fix
                 for fix in weight_fixes(model, out["weights_bytes"], device.memory_bytes, device,
                                         out["weights_precision"], tp=1, kv=out["stateful_kv_bytes"])]
        lines.append(f"{format_bytes(out['weights_bytes'])} of {out['weights_precision']} weights + "
                     f"{format_bytes(out['stateful_kv_bytes'])} of KV do not fit {device.name}'s "
                     f"{format_bytes(device.memory_bytes)}: priced as if they did ("
                     + "".join(f"{fix}, " for fix in fixes) + ("or " if fixes else "") + "size a deployment with simkv plan)")
    return lines

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
    return p


def main(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from simkv.cost import estimate, get_device
    from simkv.hfconfig import resolve_model
    from simkv.precision import get_precision

    model = resolve_model(args.model, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                          head_dim=args.head_dim)
    extra = {k: getattr(args, k) for k in ("hidden", "intermediate", "vocab") if getattr(args, k) is not None}
    if extra:
        model = replace(model, **extra)
    device = get_device(args.device)
    precision = get_precision(args.precision or "f16")
    precision.check(model)  # also refuses a sparse-attention indexer: its top-k attention is not costed
    out = estimate(model, device, precision, batch=args.batch, context=args.context,
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
        *([] if "moe" not in out else [
            f"  {'  experts':<22}{out['moe']['decode_experts_touched']:,.1f} of {out['moe']['experts']} per MoE layer "
            f"({out['moe']['experts_per_token']} per token, {out['batch']} tokens): weights read "
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

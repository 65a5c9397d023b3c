"""Where a prefill chunk's missing fixed time goes: one-sequence prefill chunks of probe decoders by layers and heads.

``ContinuousBatchingPipeline.step()`` (:func:`simkv.validate.genai.live.time_steps`) of one prompt of C tokens in
one chunk (C in :data:`CHUNKS`) on random-weight decoders with 1 or 9 layers and several head shapes on hidden 64
(weights small), next to simkv's price of the same chunk on the host preset (``$SIMKV_HOST_PRESET``). What simkv
misses per chunk, per layer (the 9- minus the 1-layer probe, over 8), per layer and query head, and how it grows
with C, says which term is absent. Rounds interleave the probes; medians over rounds. Pinned on a quiet machine:

    taskset -c 1 python experiments/genai_prefill_probe.py --rounds 3

``--steps STEPS.json`` (the ``--out`` of ``simkv validate --serving --stage steps`` run on ``$SIMKV_HOST_PRESET``)
instead prices that run's fixed batches with the preset's terms and without ``prompt_token_overhead_s`` (its
``matmul_flops`` back at the plain prefill slope it was solved with: ``1 / (1 / F + Δc · 2 · 16 · p / ΔFLOPs)``):
the step stage before and after the term on one calibration and one set of measurements.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.genai_head_probe import probe_models  # noqa: E402
from simkv.validate.genai.live import time_steps  # noqa: E402
from simkv.validate.genai.model import GenaiModelSpec  # noqa: E402

HEADS = ((1, 1, 64), (16, 8, 128), (8, 8, 128), (32, 8, 128))  # (query, KV heads, head dim)
CHUNKS = (16, 64, 256)
#: The paged terms ``--without`` may zero in the price.
ZEROABLE = ("step_overhead_s", "layer_overhead_s", "sequence_overhead_s", "head_overhead_s", "prompt_token_overhead_s")


def main(argv=None) -> int:
    from dataclasses import replace

    from simkv.cost import get_device
    from simkv.precision import get_precision
    from simkv.validate.genai.serving import _step_s, cost_model
    from simkv.validate.openvino.ovmodel import inference_precision

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--without", default="", choices=("",) + ZEROABLE, help="a paged term to zero in the price")
    parser.add_argument("--steps", help="reprice a validate --serving --stage steps JSON with and without the term")
    args = parser.parse_args(argv)
    if not (1 <= args.rounds <= 50 and 1 <= args.repeats <= 100):
        parser.error("--rounds must be in 1..50 and --repeats in 1..100")
    if args.steps:
        return reprice(args.steps)
    shapes, paths = probe_models(HEADS)
    times = {key: {c: [] for c in CHUNKS} for key in shapes}
    for r in range(args.rounds):
        for key, path in paths.items():
            d = time_steps(path, decode_batches=[], prefill_chunks=list(CHUNKS), context=64, warmup=2,
                           repeats=args.repeats)
            for p in d["prefill"]:
                times[key][p["chunk"]].append(statistics.median(p["times_s"]))
        print(f"round {r + 1} done", file=sys.stderr, flush=True)
    dev = get_device("host").paged_kernel()
    if args.without:
        dev = replace(dev, **{args.without: 0.0})
    kv, wp = get_precision("u8"), inference_precision()

    def row(key):
        real = {c: statistics.median(times[key][c]) for c in CHUNKS}
        pred = {c: float(_step_s(cost_model(shapes[key]), dev, kv, wp, batch=1, context=0, new=c)) for c in CHUNKS}
        return real, pred

    print("shape                real ms by chunk " + " ".join(f"{c:>7d}" for c in CHUNKS) + "   missing ms by chunk")
    miss = {}
    for key in shapes:
        real, pred = row(key)
        miss[key] = {c: real[c] - pred[c] for c in CHUNKS}
        print(f"  {str(key):20s} " + " ".join(f"{real[c] * 1e3:7.3f}" for c in CHUNKS) + "   "
              + " ".join(f"{miss[key][c] * 1e3:7.3f}" for c in CHUNKS))
    print("per layer (9 - 1 layers) / 8, and per layer and query head, by chunk:")
    for q, k, d in HEADS:
        pl = {c: (miss[(q, k, d, 9)][c] - miss[(q, k, d, 1)][c]) / 8 for c in CHUNKS}
        print(f"  {q:2d}/{k:2d} x {d:3d}  " + " ".join(f"{pl[c] * 1e6:8.1f} us" for c in CHUNKS) + "   "
              + " ".join(f"{pl[c] / q * 1e6:7.2f} us/head" for c in CHUNKS))
    return 0


def reprice(path: str) -> int:
    """The step stage of ``path`` priced on the host preset with and without ``prompt_token_overhead_s``."""
    import json
    from dataclasses import replace

    from simkv.cost import get_device
    from simkv.cost.attention import attended_pairs, pair_flops_per_model
    from simkv.cost.weights import matmul_params
    from simkv.precision import get_precision
    from simkv.validate.genai.calibrate import PREFILL_CHUNKS, PROBES, _model
    from simkv.validate.genai.serving import _STEP_UNIT, DECODE_CONTEXT, _step_s, cost_model, mixed_step_s
    from simkv.validate.openvino.ovmodel import inference_precision

    run = json.loads(Path(path).read_text())
    spec = GenaiModelSpec(**{k: run["model"][k] for k in ("layers", "heads", "kv_heads", "head_dim", "hidden", "vocab")})
    model, kv, wp = cost_model(spec), get_precision(run["kv_precision"]), inference_precision()
    after = get_device("host")
    p = after.paged.get("prompt_token_overhead_s", 0.0)
    pm = _model("prefill")[1]
    head = pm.vocab * pm.hidden
    flops = {c: 2.0 * (matmul_params(pm) - head) * c + pair_flops_per_model(pm) * attended_pairs(pm, 0, c)
             for c in PREFILL_CHUNKS}
    small, big = PREFILL_CHUNKS
    pp = PROBES["prefill"]
    plain = 1.0 / (1.0 / after.paged["matmul_flops"]
                   + (big - small) * pp.layers * pp.heads * p / (flops[big] - flops[small]))
    before = replace(after, paged={**after.paged, "prompt_token_overhead_s": 0.0, "matmul_flops": plain})
    devs = {"after": after.paged_kernel(), "before": before.paged_kernel()}
    print(f"prompt_token_overhead_s {p * 1e6:.3f} us; matmul_flops {after.paged['matmul_flops'] / 1e9:.1f} GFLOP/s "
          f"(plain slope {plain / 1e9:.1f})")
    print("  step               measured ms   before ms  error    after ms  error")
    for r in run["steps"]["rows"]:
        ctx = DECODE_CONTEXT + 6  # the timed decode steps' middle context
        if r["kind"] == "mixed":  # DECODESxCHUNK: the decodes at that context beside one prompt chunk
            b, c = (int(v) for v in r["size"].split("x"))
            price = {k: float(mixed_step_s(model, d, kv, wp, batch=b, context=ctx, chunk=c)) for k, d in devs.items()}
        else:
            b, new = (r["size"], 1) if r["kind"] == "decode" else (1, r["size"])
            price = {k: float(_step_s(model, d, kv, wp, batch=b, context=ctx if r["kind"] == "decode" else 0, new=new))
                     for k, d in devs.items()}
        # the run's own prediction (exact contexts) moved by the difference the term makes
        pred_before = r["predicted_ms"] + 1e3 * (price["before"] - price["after"])
        m = r["measured_ms"]
        print(f"  {r['kind']} {_STEP_UNIT[r['kind']]} {r['size']:<6}   {m:10.2f}  "
              f"{pred_before:9.2f} {100 * (pred_before / m - 1):+6.1f}%  {r['predicted_ms']:9.2f} "
              f"{100 * (r['predicted_ms'] / m - 1):+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

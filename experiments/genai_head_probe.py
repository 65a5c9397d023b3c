"""Where a decode step's missing time per sequence goes: per-sequence slopes of probe decoders by layers and heads.

``ContinuousBatchingPipeline.step()`` (:func:`simkv.validate.genai.live.time_steps`) at decode batch 1 and 16
(64-token prompts) of random-weight decoders with 1 or 9 layers and several head shapes on hidden 64 (weights
small), next to simkv's price of the same steps on the host preset (``$SIMKV_HOST_PRESET``) less its per-head term. What simkv misses per
sequence, per layer (the 9- minus the 1-layer probe, over 8) and per query head says which term is absent: on this
host ~1 us per sequence, layer and query head (``Device.head_overhead_s``, which ``simkv calibrate`` now measures on
the 16/8 shape), where the tiny 1-head probes of ``sequence_overhead_s`` miss nothing. Rounds interleave the probes;
medians over rounds. Run it pinned on a quiet machine (a minute):

    taskset -c 1 python experiments/genai_head_probe.py --rounds 3
"""

from __future__ import annotations

import argparse
from dataclasses import replace
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simkv.validate.genai.calibrate import ProbeShape  # noqa: E402
from simkv.validate.genai.live import time_steps  # noqa: E402
from simkv.validate.genai.model import GenaiModelSpec, model_dir  # noqa: E402
from simkv.validate.genai.serving import DEFAULT_SHAPE  # noqa: E402

HEADS = ((1, 1, 64), (16, 8, 128), (16, 16, 128), (8, 8, 128), (32, 8, 128))  # (query, KV heads, head dim)
CONTEXT = 64
#: The model ``simkv validate --serving`` runs (6 layers, hidden 1,024, 16/8 heads x 128), timed in the same rounds.
VALIDATED = GenaiModelSpec(**DEFAULT_SHAPE)


def probe_models(heads) -> tuple[dict, dict]:
    """The probe decoders of each (query heads, KV heads, head dim) in ``heads`` with 1 and 9 layers on hidden 64
    (keys ``(q, kv, dim, layers)``) and :data:`VALIDATED` (key ``"validated"``): ({key: spec}, {key: the exported
    model's directory})."""
    shapes = {(q, k, d, L): ProbeShape(L, q, k, d, 64).spec() for q, k, d in heads for L in (1, 9)}
    shapes["validated"] = VALIDATED
    return shapes, {key: str(model_dir(s)) for key, s in shapes.items()}


def main(argv=None) -> int:
    from simkv.cost import get_device
    from simkv.precision import get_precision
    from simkv.validate.genai.serving import _step_s, cost_model
    from simkv.validate.openvino.ovmodel import inference_precision

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 50:
        parser.error("--rounds must be in 1..50")
    shapes, paths = probe_models(HEADS)
    times = {key: {1: [], 16: []} for key in shapes}
    for _ in range(args.rounds):
        for key, path in paths.items():
            for b in (1, 16):
                d = time_steps(path, decode_batches=[b], prefill_chunks=[], context=CONTEXT, warmup=2, repeats=7)
                times[key][b].append(statistics.median(d["decode"][0]["times_s"]))
    # priced without the per-head term, so that what is missing is what the other terms leave
    dev = replace(get_device("host").paged_kernel(), head_overhead_s=0.0)
    kv, wp = get_precision("u8"), inference_precision()
    ctx = CONTEXT + 2 + np.arange(7)  # the timed steps' contexts (prompt, first step, warm-up)

    def missing(key) -> float:
        """What simkv misses per extra sequence from batch 1 to 16 (seconds)."""
        pred = {b: float(np.median(_step_s(cost_model(shapes[key]), dev, kv, wp, batch=b, context=ctx, new=1)))
                for b in (1, 16)}
        real = {b: statistics.median(times[key][b]) for b in (1, 16)}
        return ((real[16] - real[1]) - (pred[16] - pred[1])) / 15

    print("heads (q/kv x dim)  missing per sequence: 1 layer   9 layers   per layer   per layer and query head")
    per_head = {}
    for q, k, d in HEADS:
        one, nine = missing((q, k, d, 1)), missing((q, k, d, 9))
        per_layer = (nine - one) / 8
        per_head[(q, k, d)] = per_layer / q
        print(f"  {q:2d}/{k:2d} x {d:3d}         {one * 1e6:9.1f} us {nine * 1e6:8.1f} us "
              f"{per_layer * 1e6:8.1f} us {per_layer / q * 1e6:10.2f} us")
    v = VALIDATED
    h = per_head[(v.heads, v.kv_heads, v.head_dim)]
    print(f"validated model ({v.layers} layers, {v.heads}/{v.kv_heads} x {v.head_dim}, hidden {v.hidden}): misses "
          f"{missing('validated') * 1e3:.4f} ms per sequence; its layers x query heads x the {v.heads}/{v.kv_heads} "
          f"probes' per-head figure: {v.layers * v.heads * h * 1e3:.4f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

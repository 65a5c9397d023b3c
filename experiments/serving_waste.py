"""KV memory waste serving the Azure conversation trace with llama-2-7b shapes: GenAI's paged pool versus
per-request contiguous buffers reserved for the model's whole context (what serving systems did before paging).

    PYTHONPATH=. python experiments/serving_waste.py [--limit N] [--device h100-sxm] [--precision f16]
                                                      [--also POLICY ...]

Waste is time-weighted over the run (each step weighted by its simulated duration):
* paged: internal waste (unfilled tail of each request's last block) as a share of the blocks in use; the pool's
  free blocks are reported apart (a dynamic pool never shrinks, so they are reservation, not fragmentation);
* contiguous: allocated minus the tokens' KV, as a share of allocated (a reservation of 4,096 tokens per request,
  the llama-2 context: `--policy static`, max_prompt_len 4096, no rounding). Requests longer than the context cannot
  be served that way and are REJECTED (counted).
"""

from __future__ import annotations

import argparse
import time

from simkv.models import get_model
from simkv.precision import get_precision
from simkv.scenario import resolve_weights_memory
from simkv.serving import ServingSpec, load_trace, serve

TRACE = "data/traces/azure_llm_2023_conv.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int)
    ap.add_argument("--device", default="h100-sxm")
    ap.add_argument("--precision", default="f16")
    ap.add_argument("--also", nargs="*", default=[], help="more contiguous policies to compare (e.g. openvino-gpu)")
    args = ap.parse_args()
    reqs = load_trace(TRACE, limit=args.limit)
    model = get_model("llama-2-7b")
    weights = resolve_weights_memory(model, None, None)
    base = dict(model=model, precision=get_precision(args.precision), device=args.device, weights_bytes=weights,
                max_context=0)
    runs = [("paged (GenAI, block 32, dynamic pool)", ServingSpec(reqs, memory="paged", **base)),
            ("contiguous, 4,096-token reservation", ServingSpec(
                reqs, memory="contiguous", policy="static",
                policy_options={"max_prompt_len": 4096, "min_response_len": 0, "prefill_chunk": 1}, **base))]
    runs += [(f"contiguous, {p}", ServingSpec(reqs, memory="contiguous", policy=p, **base)) for p in args.also]
    print(f"{len(reqs):,} requests of {TRACE}; llama-2-7b shapes, {args.precision} KV, device {args.device}")
    print(f"{'memory':<40} {'finished':>9} {'rejected':>9} {'mean alloc GiB':>15} {'mean used GiB':>14} "
          f"{'waste % of alloc':>17} {'internal % of in-use':>21} {'cpu s':>7}")
    for name, spec in runs:
        t = time.process_time()
        m = serve(spec).metrics
        cpu = time.process_time() - t
        alloc = m["mean_allocated_bytes"]
        used = alloc - m["waste_bytes"]
        internal = f"{m['waste_internal_pct_of_in_use']:.2f}" if spec.memory == "paged" else "-"
        print(f"{name:<40} {m['requests_finished']:>9,} {m['requests_rejected']:>9,} {alloc / 2**30:>15.2f} "
              f"{used / 2**30:>14.2f} {100 * m['waste_bytes'] / alloc:>17.1f} {internal:>21} {cpu:>7.1f}")


if __name__ == "__main__":
    main()

"""The transformers validation table (docs/results/validation.md): real Hugging Face caches on torch CPU vs
hf-dynamic / hf-static.

Every cache kind (DynamicCache, StaticCache, a sliding window shorter than the session,
beam fork / reorder / select through ``reorder_cache``) on an MHA and a GQA shape, in f16,
bf16 and f32: ``simkv.validate.transformers.runner.run_validation`` without the clean RSS run (the
events, the allocated KV peak and the in-step increase come from the memray stream).

    python experiments/hf_validation.py            # 36 runs, ~2 min on this 2-core machine
    python experiments/hf_validation.py --quick    # f16 only

Writes experiments/out/hf_validation/<row>.json and table.md; prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simkv.validate.transformers.model import HFValidateConfig  # noqa: E402
from simkv.validate.transformers.runner import check_dependencies, run_validation  # noqa: E402

TURNS = "prefill:40,decode:60,prefill:20,decode:20,reset,prefill:12,decode:12"
BEAM = "prefill:24,decode:8,fork:4,decode:12,reorder,decode:4,select:1,decode:8"
CASES = [  # (name, policy, sliding window, workload)
    ("DynamicCache", "hf-dynamic", None, TURNS),
    ("StaticCache", "hf-static", None, TURNS),
    ("sliding window 16 (DynamicSlidingWindowLayer)", "hf-dynamic", 16, TURNS),
    ("beam, DynamicCache", "hf-dynamic", None, BEAM),
    ("beam, StaticCache", "hf-static", None, BEAM),
    ("beam, sliding window 16", "hf-dynamic", 16, BEAM),
]
SHAPES = [("MHA 4x16", 4, 4), ("GQA 8/2x16", 8, 2)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="f16 only")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "out" / "hf_validation"))
    args = ap.parse_args()
    check_dependencies()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtypes = ["f16"] if args.quick else ["f16", "bf16", "f32"]
    lines = ["| case | shape | dtype | events matched / total | missing | unexpected | KV peak B (measured = predicted) "
             "| in-step increase equal | gather B (fork / reorder / select) | time |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    versions = None
    for name, policy, window, ops in CASES:
        for shape, heads, kv_heads in SHAPES:
            for dtype in dtypes:
                cfg = HFValidateConfig(workload=ops, layers=2, heads=heads, kv_heads=kv_heads, head_dim=16, vocab=128,
                                       dtype=dtype, policy=policy, sliding_window=window, clean_run=False)
                t0 = time.perf_counter()
                data = run_validation(cfg)
                elapsed = time.perf_counter() - t0
                versions = data["versions"]
                slug = f"{name.split(' (')[0].replace(', ', '-').replace(' ', '-')}-{shape.split()[0]}-{dtype}".lower()
                (out / f"{slug}.json").write_text(json.dumps(data, indent=1) + "\n")
                ap_ = data["alloc_peak"]
                peak = f"{ap_['measured_bytes']:,}" + ("" if ap_["measured_bytes"] == ap_["predicted_bytes"]
                                                        else f" vs {ap_['predicted_bytes']:,}")
                inc = data["in_step_increase"]
                # The gather: bytes the real run allocated in reorder_cache in each fork / reorder / select step.
                gather = " / ".join(f"{g['measured_bytes']:,}" for g in data["beam_gather"]) or "-"
                lines.append(f"| {name} | {shape} | {dtype} | {data['events_matched']:,} / {data['events_total']:,} | "
                             f"{data['events_missing']} | {data['events_unexpected']} | {peak} | "
                             f"{inc['steps_equal']} / {inc['steps']} | {gather} | {elapsed:.1f} s |")
                print(lines[-1], flush=True)
    lines.append("")
    lines.append(f"torch {versions['torch']}, transformers {versions['transformers']}, memray {versions['memray']}, "
                 f"Python {versions['python']}, {versions['cpu_model']}; workloads: turns `{TURNS}`, beam `{BEAM}`; "
                 "2 layers, head size 16.")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:2] + lines[-1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The per-layer-kind transformers validation table (docs/results/validation.md): tiny Gemma-3, gpt-oss,
Llama-4, Qwen3-Next, DeepSeek-V3 and LFM2 configs on torch CPU vs hf-dynamic / hf-static, event by event.

Each architecture's tiny config (``simkv.validate.transformers.archs``, the configs of
``experiments/hf_layer_kinds``: window and chunk 4) is written to a ``config.json`` and validated from that
file, as ``simkv validate --runtime transformers --model PATH`` does, under DynamicCache and StaticCache, in
f32 and bf16: ``run_validation`` without the clean RSS run (events, allocated KV peak, in-step increase and
the data-pointer check come from the memray run).

    python experiments/hf_arch_validation.py            # 24 runs, ~1 min on this 2-core machine
    python experiments/hf_arch_validation.py --quick    # f32 only

Writes experiments/out/hf_arch_validation/<row>.json, the configs and table.md; prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simkv.validate.transformers.archs import ARCHS, tiny_config  # noqa: E402
from simkv.validate.transformers.model import HFValidateConfig  # noqa: E402
from simkv.validate.transformers.runner import check_dependencies, run_validation  # noqa: E402

#: Prefills shorter and longer than the window (4), decode across window and chunk boundaries, a chat turn,
#: beam fork / reorder / select, reset. StaticCache: a turn that fits the sliding rings.
WORKLOADS = {
    "hf-dynamic": "prefill:6,decode:7,prefill:5,decode:2,fork:3,decode:2,reorder,select:1,decode:1,reset,prefill:2,decode:4",
    "hf-static": "prefill:1,prefill:2,decode:7,fork:3,decode:2,reorder,select:1,decode:1,reset,prefill:6,decode:4",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="f32 only")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "out" / "hf_arch_validation"))
    args = ap.parse_args()
    check_dependencies()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtypes = ["f32"] if args.quick else ["f32", "bf16"]
    lines = ["| architecture | layers (simkv's model of the config) | cache | dtype | events matched / total | missing "
             "| unexpected | KV peak B (measured = predicted) | in-step increase equal | data pointers equal "
             "| gather B (fork / reorder / select) | time |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    versions = None
    for arch in ARCHS:
        path = out / f"{arch}.json"
        tiny_config(arch).to_json_file(str(path))
        for policy, ops in WORKLOADS.items():
            for dtype in dtypes:
                cfg = HFValidateConfig(workload=ops, config_path=str(path), policy=policy, dtype=dtype,
                                       clean_run=False, model_name=arch)
                t0 = time.perf_counter()
                data = run_validation(cfg)
                elapsed = time.perf_counter() - t0
                versions = data["versions"]
                (out / f"{arch}-{policy}-{dtype}.json").write_text(json.dumps(data, indent=1) + "\n")
                ap_ = data["alloc_peak"]
                peak = f"{ap_['measured_bytes']:,}" + ("" if ap_["measured_bytes"] == ap_["predicted_bytes"]
                                                        else f" vs {ap_['predicted_bytes']:,}")
                inc, ptr = data["in_step_increase"], data["observer"]["pointer_check"]
                gather = " / ".join(f"{g['measured_bytes']:,}" for g in data["beam_gather"]) or "-"
                kinds = data["scenario"]["layer_kv"].split(": ", 1)[1]
                lines.append(f"| {arch} | {kinds} | {data['scenario']['cache']} | {dtype} | "
                             f"{data['events_matched']:,} / {data['events_total']:,} | {data['events_missing']} | "
                             f"{data['events_unexpected']} | {peak} | {inc['steps_equal']} / {inc['steps']} | "
                             f"{ptr['steps_equal']} / {ptr['steps']} | {gather} | {elapsed:.1f} s |")
                print(lines[-1], flush=True)
    lines.append("")
    lines.append(f"torch {versions['torch']}, transformers {versions['transformers']}, memray {versions['memray']}, "
                 f"Python {versions['python']}, {versions['cpu_model']}; workloads: DynamicCache "
                 f"`{WORKLOADS['hf-dynamic']}`, StaticCache `{WORKLOADS['hf-static']}` (max_cache_len: the longest "
                 "history, 16).")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:2] + lines[-1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real OpenVINO GenAI continuous batching vs simkv's paged model, one row per coverage item of issue #8.

Each row is a small hand-made workload (requests with ``arrival_step``) and a ``SchedulerConfig``, run
on the real ``ContinuousBatchingPipeline`` (CPU, the toy model of ``simkv validate --paged``) and through
``simkv.serving.simulate_paged``, compared step by step (``simkv.validate.genai.runner``). Prints a markdown
table: steps matched / total, pool allocations matched / total (memray), what the row exercised
(preemptions, IGNORED requests, prefix-cache hits, pool growths, seen in the simulation), wall time.

    python experiments/paged_validation.py                 # the coverage rows (~1 min on 2 cores)
    python experiments/paged_validation.py --random 200    # plus the random row (~8 min)
    python experiments/paged_validation.py --only preempt-fixed

Each row's JSON goes to ``--out-dir`` (default ``experiments/out/paged``); rerun one with
``simkv validate --paged --trace experiments/out/paged/ROW.csv [flags printed in the table]``.
Needs ``pip install 'simkv[openvino]'``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simkv.serving.requests import Request, write_trace  # noqa: E402
from simkv.serving import SchedulerConfig  # noqa: E402
from simkv.validate.genai.runner import random_case, validate  # noqa: E402
from simkv.validate.genai.model import GenaiModelSpec  # noqa: E402


def R(i, step, prompt, new, prefix=None, ptok=0, samples=1, beam=1):
    return Request(i, prompt, new, arrival_step=step, prefix_id=prefix, prefix_tokens=ptok, samples=samples, beam=beam)


#: (id, coverage item, requests, scheduler options[, model]); the model defaults to 2 layers, 4/2 heads x 32.
ROWS = [
    ("fixed-chunked", "fixed pool (40 blocks), split-fuse, prompts chunked by max_num_batched_tokens 32",
     [R(0, 0, 100, 30), R(1, 0, 70, 25), R(2, 1, 45, 40), R(3, 3, 33, 12)],
     SchedulerConfig(num_kv_blocks=40, max_num_batched_tokens=32)),
    ("dynamic-growth", "dynamic pool (both 0): initial size, raised on arrivals, +8 blocks on growth",
     [R(0, 0, 40, 200), R(1, 0, 90, 150), R(2, 30, 120, 60), R(3, 60, 10, 100)],
     SchedulerConfig(max_num_batched_tokens=64)),
    ("cache-size", "cache_size 1 GiB (floor(2^30 / block bytes) blocks)",
     [R(0, 0, 60, 20), R(1, 2, 300, 10), R(2, 4, 5, 30)],
     SchedulerConfig(cache_size=1, max_num_batched_tokens=128)),
    ("vllm-mode", "split-fuse off (vLLM mode), max_num_seqs 2: whole prompts, generate only in prompt-free steps",
     [R(0, 0, 50, 20), R(1, 0, 80, 10), R(2, 0, 30, 15), R(3, 5, 120, 8), R(4, 6, 20, 20)],
     SchedulerConfig(num_kv_blocks=30, max_num_batched_tokens=160, max_num_seqs=2, dynamic_split_fuse=False)),
    ("preempt-fixed", "preemption by recompute (tight fixed pool, 8 blocks), split-fuse",
     [R(0, 0, 60, 80), R(1, 0, 60, 80), R(2, 1, 50, 60)],
     SchedulerConfig(num_kv_blocks=8, max_num_batched_tokens=64)),
    ("preempt-vllm", "preemption by recompute, vLLM mode (tight pool, 7 blocks)",
     [R(0, 0, 50, 70), R(1, 0, 40, 70), R(2, 2, 30, 50)],
     SchedulerConfig(num_kv_blocks=7, max_num_batched_tokens=200, max_num_seqs=4, dynamic_split_fuse=False)),
    ("ignored", "IGNORED: a prompt larger than the whole pool (4 blocks); later requests still run",
     [R(0, 0, 200, 10), R(1, 3, 20, 10), R(2, 4, 40, 30)],
     SchedulerConfig(num_kv_blocks=4, max_num_batched_tokens=64)),
    ("prefix-match", "prefix caching: shared 80-token prefix (full blocks + partial), a prompt that is the whole prefix",
     [R(0, 0, 100, 20, "sys", 80), R(1, 25, 130, 10, "sys", 80), R(2, 40, 80, 10, "sys", 80),
      R(3, 41, 90, 5, "sys", 70)],
     SchedulerConfig(num_kv_blocks=40, max_num_batched_tokens=64, enable_prefix_caching=True)),
    ("prefix-evict", "prefix caching with eviction: a filler overwrites the oldest cached block, restore stops there",
     [R(0, 0, 96, 10, "a", 96), R(1, 15, 40, 5, "a", 32), R(2, 25, 150, 20), R(3, 50, 100, 5, "a", 96)],
     SchedulerConfig(num_kv_blocks=10, max_num_batched_tokens=64, enable_prefix_caching=True)),
    ("multinomial", "multinomial sampling, num_return_sequences 3 and 2 (blocks shared copy-on-write)",
     [R(0, 0, 50, 40, samples=3), R(1, 2, 70, 30), R(2, 5, 33, 25, samples=2)],
     SchedulerConfig(num_kv_blocks=40, max_num_batched_tokens=64)),
    ("beam", "beam search, 3 beams (blocks within bounds; tokens compared at the finish)",
     [R(0, 0, 45, 40, beam=3), R(1, 1, 60, 20)],
     SchedulerConfig(num_kv_blocks=40, max_num_batched_tokens=64)),
    ("gqa-hd64", "another model: 3 layers, GQA 4/1 heads x 64 (u8 K and V blocks differ: 2,560 vs 2,304 B), "
     "dynamic pool, prefix caching",
     [R(0, 0, 70, 90, "p", 40), R(1, 4, 50, 60, "p", 40), R(2, 9, 200, 30)],
     SchedulerConfig(max_num_batched_tokens=48, enable_prefix_caching=True),
     GenaiModelSpec(layers=3, heads=4, kv_heads=1, head_dim=64)),
]


def flags(o: SchedulerConfig, model=None) -> str:
    out = []
    if model:
        out.append(f"--layers {model[0].layers} --heads {model[0].heads} --kv-heads {model[0].kv_heads} "
                   f"--head-dim {model[0].head_dim}")
    if o.num_kv_blocks:
        out.append(f"--num-kv-blocks {o.num_kv_blocks}")
    if o.cache_size:
        out.append(f"--cache-size {o.cache_size}")
    out.append(f"--max-num-batched-tokens {o.max_num_batched_tokens}")
    if o.max_num_seqs != 256:
        out.append(f"--max-num-seqs {o.max_num_seqs}")
    if not o.dynamic_split_fuse:
        out.append("--no-dynamic-split-fuse")
    if o.enable_prefix_caching:
        out.append("--prefix-caching")
    return " ".join(out)


def exercised(data: dict) -> str:
    """What the simulation of this row went through (so the row's claim is checked, not assumed)."""
    e, w = data["workloads"][0]["exercised"], data["workloads"][0]
    parts = [f"{w['comparison']['steps_total']} steps"]
    for key, label in (("preemptions", "preemptions"), ("ignored", "IGNORED"), ("prefix_hit_tokens", "prefix-hit tokens"),
                       ("pool_growths", "pool growths")):
        if e[key]:
            parts.append(f"{e[key]} {label}")
    parts.append(f"max {e['max_blocks_used']}/{e['max_blocks_total']} blocks")
    return ", ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="run one row by id")
    ap.add_argument("--random", type=int, default=0, help="add a row of N random workloads (simkv validate --paged --random N)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=str(ROOT / "experiments" / "out" / "paged"))
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in ROWS if not args.only or r[0] == args.only]
    print("| row | coverage | steps matched / total | pool allocations matched / total | exercised (simulation) | flags | time |")
    print("|---|---|---:|---:|---|---|---:|")
    failed = 0
    for rid, what, requests, opts, *model in rows:
        t0 = time.perf_counter()
        data = validate([(requests, opts)], spec=model[0] if model else None, seed=args.seed)
        dt = time.perf_counter() - t0
        write_trace(requests, out / f"{rid}.csv")
        (out / f"{rid}.json").write_text(json.dumps(data, indent=1) + "\n")
        a = data["allocations"]
        steps = f"{data['steps_matched']:,} / {data['steps_total']:,}"
        if data["bounded_steps"]:
            steps += f" ({data['bounded_steps']} within beam bounds)"
        alloc = f"{a['events_matched']} / {a['events_total']}"
        failed += data["steps_mismatched"] > 0
        print(f"| {rid} | {what} | {steps} | {alloc} | {exercised(data)} | `{flags(opts, model)}` | {dt:.1f} s |",
              flush=True)
    if args.random:
        import numpy as np

        rng = np.random.default_rng(args.seed)
        cases = [random_case(rng) for _ in range(args.random)]
        t0 = time.perf_counter()
        data = validate(cases, seed=args.seed, progress=True)
        dt = time.perf_counter() - t0
        (out / f"random-{args.random}-seed{args.seed}.json").write_text(json.dumps(data, indent=1) + "\n")
        a = data["allocations"]
        print(f"| random | {args.random} random workloads and configs (seed {args.seed}) | "
              f"{data['steps_matched']:,} / {data['steps_total']:,} | {a['events_matched']} / {a['events_total']} | "
              f"{data['workloads_matched']} of {data['workloads_total']} workloads matched | "
              f"`--random {args.random} --seed {args.seed}` | {dt:.0f} s |")
        failed += data["steps_mismatched"] > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

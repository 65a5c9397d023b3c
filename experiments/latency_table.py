"""Check the cost model against real OpenVINO CPU step times: 4 shapes x 3 contexts.

1. ``simkv calibrate`` measures this host before each shape (or ``--preset`` reuses one preset file): this
   VM's memory bandwidth drifts by up to 1.4x over tens of minutes, so a calibration is only good for the
   minutes after it;
2. for each shape (hidden 2,048, 16 query heads; 8 layers MHA, 12 layers 4 KV heads, 16 layers 8 KV heads,
   8 layers 8 KV heads) the toy stateful decoder of ``simkv validate`` runs
   one chat session on the real CPU plugin: a prompt of 512 tokens (the plugin's capacity: 1,024), then
   for each context ~1k, ~2k, ~4k a chat turn that fills the history to 24 tokens below the capacity and
   48 decode steps, the 25th of which reallocates every layer's KV (capacity -> 2 L). One prefill of
   ~4k tokens in all serves the three contexts;
3. each configuration is run ``--repeats`` times (3: the per-step median then ignores one disturbed run)
   in a clean subprocess (untracked, the plugin pins
   its threads); per step the median over runs is compared with ``simkv.cost`` on the host preset.
   Decode error: ordinary decode steps (no KV event, not the first after the prompt); realloc excess:
   the reallocating step minus the median of its ordinary neighbours, measured vs predicted.

    PYTHONPATH=. python experiments/latency_table.py                  # ~17 min on 2 idle cores
    PYTHONPATH=. python experiments/latency_table.py --quick          # one small shape, ~1 min
    PYTHONPATH=. python experiments/latency_table.py --preset host.json --repeats 3

Needs ``pip install 'simkv[openvino]'``. Writes ``--out-dir``/latency_table.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: (id, layers, heads, kv_heads, head_dim): hidden 2,048 = heads x head_dim
SHAPES = [("8L-MHA", 8, 16, 16, 128), ("12L-GQA4", 12, 16, 4, 128), ("16L-GQA8", 16, 16, 8, 128), ("8L-GQA8", 8, 16, 8, 128)]
CONTEXTS = 3  # decode runs at ~1k, ~2k, ~4k tokens of history
FIRST_PROMPT = 512
DECODE = 48
QUICK_SHAPES = [("4L-MHA-h512", 4, 8, 8, 64)]
QUICK_PROMPT, QUICK_CONTEXTS = 128, 2


def session(first_prompt: int, contexts: int, decode: int = DECODE) -> str:
    """The workload: prompt, then per context a turn to 24 tokens below the capacity and ``decode`` steps.
    The CPU plugin's rule (policies/openvino_cpu.py): capacity 2 x prompt, then 2 L when L passes it."""
    ops, length, cap = [f"prefill:{first_prompt}"], first_prompt, 2 * first_prompt
    for _ in range(contexts):
        ops += [f"prefill:{cap - 24 - length}", f"decode:{decode}"]
        length = cap - 24 + decode
        cap = 2 * (cap + 1)
    return ",".join(ops)


def _figures(host) -> str:
    return (f"weights {host.memory_bandwidth / 1e9:.2f} GB/s, KV reads {host.memory_bandwidth * host.kv_efficiency / 1e9:.2f} "
            f"GB/s, decode attention {host.decode_attention_flops / 1e9:.1f} GFLOP/s, copy "
            f"{host.copy_bandwidth / 1e9:.2f} GB/s, overhead {host.step_overhead_s * 1e3:.3f} ms + "
            f"{host.layer_overhead_s * 1e3:.3f} ms/layer")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", help="host preset file to use (default: run simkv calibrate first)")
    p.add_argument("--repeats", type=int, default=3, help="clean runs per configuration (default 3)")
    p.add_argument("--quick", action="store_true", help="one small shape, two short contexts")
    p.add_argument("--only", action="append", metavar="SHAPE", help="run only this shape (repeatable): "
                   + ", ".join(sh[0] for sh in SHAPES))
    p.add_argument("--out-dir", default=str(ROOT / "experiments" / "out" / "latency"))
    args = p.parse_args(argv)

    from simkv.cost import load_device
    from simkv.validate.openvino.calibrate import calibrate
    from simkv.validate.openvino.cleanrun import ValidateConfig
    from simkv.validate.openvino.latency import measure_and_compare

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()
    rows, hosts = [], {}
    ops = session(QUICK_PROMPT, QUICK_CONTEXTS) if args.quick else session(FIRST_PROMPT, CONTEXTS)
    shapes = QUICK_SHAPES if args.quick else [sh for sh in SHAPES if not args.only or sh[0] in args.only]
    for name, layers, heads, kv_heads, head_dim in shapes:
        preset = args.preset or str(out_dir / f"host-{name}.json")
        if not args.preset:
            calibrate(preset, progress=sys.stderr.isatty())
        host = hosts[name] = load_device(preset)
        print(f"{name}: host preset {_figures(host)}", file=sys.stderr, flush=True)
        cfg = ValidateConfig(workload=ops, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                             hidden=heads * head_dim, progress=False, device=preset)
        t = time.perf_counter()
        res = measure_and_compare(cfg, repeats=args.repeats, segments=True)
        for seg in res["segments"]:
            rows.append({"shape": name, "layers": layers, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                         "context": seg["history_tokens"], "workload": ops, "kv_precision": res["kv_precision"],
                         "seconds": time.perf_counter() - t, **seg})
            r = rows[-1]
            print(f"{name} L={r['context']}: measured {r['decode_measured_median_ms']:.2f} ms, predicted "
                  f"{r['decode_predicted_median_ms']:.2f} ms, error median {r['decode_error_median_pct']:.1f} %",
                  file=sys.stderr, flush=True)
        (out_dir / "latency_table.partial.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    summary = {"command": "PYTHONPATH=. python experiments/latency_table.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "started_utc": started, "hosts": {name: h.to_dict() for name, h in hosts.items()}, "rows": rows, "wall_s": wall, "loadavg_before": load, "loadavg_after": load_after,
               "repeats": args.repeats}
    (out_dir / "latency_table.json").write_text(json.dumps(summary, indent=1) + "\n")

    for name, h in hosts.items():
        print(f"host preset ({name}): {_figures(h)}")
    print(f"\nworkload: {ops}")
    print("\n| shape | history tokens | KV | measured decode ms | predicted ms | decode error median | p90 | steps | "
          "realloc excess measured / predicted ms | realloc error |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ex = r["realloc_excess"][0] if r["realloc_excess"] else None
        exs = f"{ex['measured_excess_ms']:.2f} / {ex['predicted_excess_ms']:.2f}" if ex else "-"
        rerr = "-" if r["realloc_excess_error_median_pct"] is None else f"{r['realloc_excess_error_median_pct']:.0f} %"
        print(f"| {r['shape']} | {r['context']:,} | {r['kv_precision']} | {r['decode_measured_median_ms']:.2f} | "
              f"{r['decode_predicted_median_ms']:.2f} | {r['decode_error_median_pct']:.1f} % | "
              f"{r['decode_error_p90_pct']:.1f} % | {r['steps_compared']} | {exs} | {rerr} |")
    ok = sum(r["decode_error_median_pct"] <= 15 for r in rows)
    print(f"\n{ok} of {len(rows)} configurations within 15 % (decode median); {args.repeats} runs each; "
          f"wall time {wall:.0f} s; load average {load[0]:.2f} before, {load_after[0]:.2f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())

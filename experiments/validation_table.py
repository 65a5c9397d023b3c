"""Rerun the validated configurations of ``simkv validate`` and print a markdown table.

Each configuration runs the real OpenVINO CPU plugin twice (memray for the events, a
clean subprocess with ``MALLOC_MMAP_THRESHOLD_=65536`` for RSS/VmSize/VmHWM/latency),
predicts it with the ``openvino-cpu`` policy and compares (see ``simkv validate --help``).
The JSON result of each row is written to ``--out-dir`` (default
``experiments/out/validation``) so a row can be inspected or plotted
(``simkv.validate.report.write_report``).

    python experiments/validation_table.py            # all rows
    python experiments/validation_table.py --quick    # the 2- and 4-layer rows only
    python experiments/validation_table.py --only u4-gqa-p1
    python experiments/validation_table.py --only none --optimum experiments/out/optimum   # exported models
    python experiments/validation_table.py --rederive  # saved rows, figures derived again (no runs)

Needs ``pip install 'simkv[openvino]'``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TOY4 = ["--layers", "4", "--heads", "8", "--head-dim", "64"]
#: (id, description, arguments of `simkv validate`, long: needs --quick off)
CONFIGS = [
    ("u8-mha-d4200", "u8, MHA 8x64, 4 layers, prompt 32, decode 4,200",
     [*TOY4, "--kv-heads", "8", "--prompt", "32", "--decode", "4200"], False),
    ("u4-gqa-p1", "u4, GQA 8/2x64, 4 layers, prompt 1, decode 4,200",
     [*TOY4, "--kv-heads", "2", "--precision", "u4", "--prompt", "1", "--decode", "4200"], False),
    ("bf16-gqa-p2000", "bf16, GQA 8/2x64, 4 layers, prompt 2,000, decode 300",
     [*TOY4, "--kv-heads", "2", "--precision", "bf16", "--prompt", "2000", "--decode", "300"], False),
    ("f32-chat-reset", "f32 (f32 inference), MHA, 4 layers, 3 chat turns, 2 resets",
     [*TOY4, "--kv-heads", "8", "--precision", "f32", "--inference-precision", "f32", "--ops",
      "prefill:100,decode:200,prefill:64,decode:150,prefill:300,decode:100,reset,prefill:50,decode:100,"
      "reset,prefill:900,decode:50"], False),
    ("f16-beam", "f16 (f32 inference), GQA 8/4x64, 4 layers, fork 4, reorder, select, fork 2",
     [*TOY4, "--kv-heads", "4", "--precision", "f16", "--inference-precision", "f32", "--ops",
      "prefill:64,decode:20,fork:4,decode:150,reorder,decode:10,reorder,select:2,decode:100,fork:2,decode:40,"
      "select:0,decode:10"], False),
    ("u8-beam-turns", "u8, GQA 8/2x64, 4 layers, --beam 4 --turns 2 (fork/decode/select per answer)",
     [*TOY4, "--kv-heads", "2", "--prompt", "200", "--decode", "300", "--beam", "4", "--turns", "2",
      "--turn-tokens", "120"], False),
    ("u4-h32", "u4, GQA 4/2x32, 2 layers (a scale buffer of 2L tokens has the bytes of data of L), prompt 16, "
     "decode 1,100",
     ["--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--precision", "u4", "--prompt", "16",
      "--decode", "1100"], False),
    ("u8-h16", "u8, GQA 4/2x16, 2 layers (same coincidence), prompt 16, decode 1,100",
     ["--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--precision", "u8", "--prompt", "16",
      "--decode", "1100"], False),
    ("u8-mha-32l", "u8, MHA 8x64, 32 layers, prompt 32, decode 2,200",
     ["--layers", "32", "--heads", "8", "--kv-heads", "8", "--head-dim", "64", "--prompt", "32", "--decode", "2200"],
     True),
    ("bf16-llama3-shape", "bf16, Llama-3-8B attention shape (32 layers, GQA 32/8x128, hidden 512), prompt 512, "
     "decode 700",
     ["--model", "llama-3-8b", "--hidden", "512", "--precision", "bf16", "--prompt", "512", "--decode", "700"], True),
]
#: Workload of the rows of models exported by optimum-intel (``--optimum DIR``).
OPTIMUM_ARGS = ["--prompt", "16", "--decode", "1100"]


def _pct(v) -> str:
    return "n/a" if v is None else f"{v:+.2f}"


def _rise(d: dict) -> str:
    r = d.get("rise")
    if not r or not r["steps"]:
        return "n/a"
    if not r["comparable_steps"]:
        return f"n/c (0 of {r['steps']})"
    return f"{_pct(r['worst_error_pct'])} ({_pct(r['median_error_pct'])}; {r['comparable_steps']} of {r['steps']})"


def _slope(d: dict) -> str:
    sl = d.get("resident_slope") or {}
    if sl.get("not_comparable"):
        if sl.get("heap_bound_pct") is None:
            return "n/c (< 1 MiB)"
        return f"n/c ({sl['heap_bound_pct']:.0f} % bound)"
    return f"{_pct(d['resident_slope_error_pct'])} ({sl.get('tokens', 0):,})"


def _rss(d: dict) -> str:
    f = (d.get("rss") or {}).get("final")
    if not f:
        return "n/a"
    if not f["comparable"]:
        if "prompt" in f["not_comparable"]:
            return "n/c (longer prompt)"
        return f"n/c ({f['heap_bound_bytes'] / 2**20:.1f} MiB heap)"
    return f"{_pct(f['error_pct'])} ({_pct(f['kv_error_pct'])})"


def rederive(cid: str, out_dir: Path) -> dict:
    """A row from its saved JSON, every figure derived again with the current comparison
    rules (``simkv.validate.compare.recompare``; no OpenVINO run)."""
    from simkv.validate.compare import recompare

    data = json.loads((out_dir / f"{cid}.json").read_text())
    fresh = recompare(data)
    fresh["_wall_s"] = data["elapsed_s"]
    return fresh


def run(cid: str, args: list[str], out_dir: Path) -> dict:
    out = out_dir / f"{cid}.json"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", *args, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{cid}: simkv validate failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    data = json.loads(out.read_text())
    data["_wall_s"] = elapsed
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the 32-layer rows")
    ap.add_argument("--only", action="append", help="run only this configuration id (repeatable)")
    ap.add_argument("--out-dir", default=str(ROOT / "experiments" / "out" / "validation"))
    ap.add_argument("--rederive", action="store_true", help="no runs: print the rows saved in --out-dir, every "
                    "figure derived again with the current comparison rules")
    ap.add_argument("--optimum", metavar="DIR", help="also validate every optimum-intel export in DIR "
                    "(experiments/export_optimum.py); --only optimum-NAME picks some")
    a = ap.parse_args()
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [c for c in CONFIGS if (not a.only or c[0] in a.only) and not (a.quick and c[3])]
    if a.optimum:
        for xml in sorted(Path(a.optimum).glob("*/openvino_model.xml")):
            name = xml.parent.name
            named = [o for o in a.only or [] if o.startswith("optimum-")]
            if not named or f"optimum-{name}" in named:
                rows.append((f"optimum-{name}", f"optimum-intel export of a random-weight {name} (stateful IR), "
                             "prompt 16, decode 1,100", ["--ir", str(xml.parent), *OPTIMUM_ARGS], False))
    t_start = time.perf_counter()
    print("| config | KV | events matched / total | missing | unexpected | in-step rise error %: worst (median; "
          "steps) | slope error % (quiet tokens) | final RSS error %: of RSS (of KV) | time |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    failed = 0
    for cid, desc, args, _long in rows:
        if a.rederive and not (out_dir / f"{cid}.json").exists():
            continue
        d = rederive(cid, out_dir) if a.rederive else run(cid, args, out_dir)
        failed += d["events_missing"] + d["events_unexpected"] > 0
        if cid.startswith("optimum-"):
            sc = d["scenario"]
            desc += f": {sc['layers']} layers, {sc['heads']}/{sc['kv_heads']}x{sc['head_dim']}"
        print(f"| {desc} | {d['effective_kv_precision']} | {d['events_matched']:,} / {d['events_total']:,} | "
              f"{d['events_missing']} | {d['events_unexpected']} | {_rise(d)} | {_slope(d)} | {_rss(d)} | "
              f"{d['_wall_s']:.0f} s |", flush=True)
    v = d["versions"] if rows else {}
    if rows:
        flags = ", ".join(k for k, on in v["cpu_flags"].items() if on)
        print(f"\nopenvino {v['openvino']}, memray {v['memray']}, Python {v['python']}, {v['cpu_model']} "
              f"({v['cpu_count']} CPUs; {flags}), MALLOC_MMAP_THRESHOLD_={v['MALLOC_MMAP_THRESHOLD_']}; "
              f"n/c: not comparable (KV buffers in glibc's heap, page rounding or prompt activations); "
              f"total {time.perf_counter() - t_start:.0f} s; JSON in {out_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

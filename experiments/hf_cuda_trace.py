"""hf-dynamic / hf-static against transformers on a CUDA GPU: torch's allocator trace vs simkv's ledger.

Needs a CUDA GPU, torch and transformers (never run in CI). The same toy models and
driver as ``simkv validate --runtime transformers`` (:mod:`simkv.validate.transformers.model`),
moved to ``cuda``; the observer is torch's own allocator history
(``torch.cuda.memory._record_memory_history(stacks="python")``): every tensor ``alloc`` and
``free_requested`` with its Python frames. KV tensors are classified by the same rule as on
the CPU (the innermost ``cache_utils.py`` line names keys or values only), layers by rank
in the operation, frees by address. Operations are cut by marker allocations of unique
sizes. The caching allocator rounds block sizes up to 512 B, so the shapes here make every
KV tensor a multiple of 512 B (kv_heads × head_dim × bytes = 512 B or more per token).

    python experiments/hf_cuda_trace.py [--out DIR]

Prints one line per configuration and writes ``hf_cuda_trace.json``.
"""

from __future__ import annotations

import argparse
import json
import linecache
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simkv.scenario import build_scenario, simulate  # noqa: E402
from simkv.validate.compare import align_events, predicted_events  # noqa: E402
from simkv.validate.transformers.model import HFValidateConfig, build_model, drive, make_cache  # noqa: E402

MARKER = 1 << 30  # marker allocations: 1 GiB + 1 KiB × (TOP - 2 seq - end), never KV-sized here
TOP = 200_000  # decreasing sizes: each marker fits the cached block of the one before


class CudaMarkers:
    """``operation(seq)`` brackets for :func:`drive`: unique-size allocations in the allocator trace."""

    def operation(self, seq: int):
        import contextlib

        import torch

        @contextlib.contextmanager
        def bracket():
            torch.empty(MARKER + 1024 * (TOP - 2 * seq), dtype=torch.uint8, device="cuda")
            try:
                yield
            finally:
                torch.empty(MARKER + 1024 * (TOP - 2 * seq - 1), dtype=torch.uint8, device="cuda")

        return bracket()


def _label(frames, cache: dict):
    key = tuple((f["filename"], f["line"]) for f in frames[:40])
    if key not in cache:
        label = None
        for f in frames:  # innermost first
            if f["filename"].endswith("cache_utils.py"):
                text = linecache.getline(f["filename"], f["line"])
                k, v = "key" in text, "value" in text
                label = (f["name"], "k" if k else "v") if k != v else None
                break
        cache[key] = label
    return cache[key]


def observe(cfg: HFValidateConfig) -> tuple[list[dict], int]:
    import torch

    model = build_model(cfg).to("cuda")
    cache = make_cache(model, cfg)
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    steps = drive(model, cache, cfg, CudaMarkers())
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    events, labels, rank, seen = [], {}, {}, {}
    current, memo = None, {}
    for e in trace:
        action, size, addr = e["action"], e["size"], e["addr"]
        if action == "alloc" and size >= MARKER:
            seq, end = divmod(TOP - (size - MARKER) // 1024, 2)
            current = None if end else seq
            continue
        if action == "alloc":
            labels.pop(addr, None)
            if current is None:
                continue
            label = _label(e.get("frames", []), memo)
            if label is None:
                continue
            n = rank.get((current, *label), 0)
            rank[(current, *label)] = n + 1
            labels[addr] = (n % cfg.layers, label[1])
            events.append({"step": current, "layer": n % cfg.layers, "tensor": label[1], "op": "alloc", "bytes": size})
        elif action == "free_requested" and addr in labels:
            layer, tensor = labels.pop(addr)
            if current is not None:
                events.append({"step": current, "layer": layer, "tensor": tensor, "op": "free", "bytes": size})
        seen[action] = seen.get(action, 0) + 1
    return events, steps


TURNS = "prefill:40,decode:60,prefill:20,decode:20"
BEAM = "prefill:24,decode:8,fork:4,decode:12,reorder,decode:4,select:1,decode:8"
RESET = "prefill:40,decode:4,reset,prefill:12,decode:2"
CASES = [  # (name, policy, window, kv_heads, dtype, workload)
    ("DynamicCache GQA", "hf-dynamic", None, 2, "bf16", TURNS),
    ("DynamicCache MHA", "hf-dynamic", None, 8, "f16", TURNS),
    ("StaticCache", "hf-static", None, 4, "f32", TURNS),
    ("sliding window 16", "hf-dynamic", 16, 2, "bf16", TURNS),
    ("beam, DynamicCache", "hf-dynamic", None, 2, "f16", BEAM),
    ("beam, StaticCache", "hf-static", None, 2, "bf16", BEAM),
    ("beam, sliding window 16", "hf-dynamic", 16, 4, "f32", BEAM),
    ("reset, DynamicCache", "hf-dynamic", None, 2, "bf16", RESET),
    ("reset, StaticCache", "hf-static", None, 2, "bf16", RESET),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "experiments" / "out"))
    args = ap.parse_args()
    import torch
    import transformers

    rows = []
    for name, policy, window, kv_heads, dtype, ops in CASES:
        cfg = HFValidateConfig(workload=ops, layers=2, heads=8, kv_heads=kv_heads, head_dim=128, vocab=128,
                               dtype=dtype, policy=policy, sliding_window=window, clean_run=False)
        t0 = time.perf_counter()
        observed, steps = observe(cfg)
        options = {"max_cache_len": cfg.cache_len} if policy == "hf-static" else {}
        result = simulate(build_scenario(model=None, layers=2, heads=8, kv_heads=kv_heads, head_dim=128,
                                         sliding_window=window or 0, precision=dtype, policy=policy,
                                         policy_options=options, ops=ops))
        aligned = align_events(observed, predicted_events(result))
        counts = {s: sum(1 for e in aligned if e["status"] == s) for s in ("matched", "missing", "unexpected")}
        row = {"case": name, "kv_heads": kv_heads, "dtype": dtype, "steps": steps, "sim_steps": len(result.steps),
               **counts, "total": len(aligned), "seconds": round(time.perf_counter() - t0, 2),
               "first_differences": [e for e in aligned if e["status"] != "matched"][:6]}
        rows.append(row)
        print(f"{name:<26} kv {kv_heads} {dtype:<4}: {counts['matched']} / {len(aligned)} matched, "
              f"{counts['missing']} missing, {counts['unexpected']} unexpected ({steps} steps)", flush=True)
    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name(0), "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf_cuda_trace.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"torch {info['torch']}, transformers {info['transformers']}, {info['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

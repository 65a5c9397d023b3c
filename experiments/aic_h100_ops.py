"""Where the H100 silicon rows' step time goes: each step priced as the SUM of the per-operation latencies NVIDIA
measured on an H100 80GB HBM3 with vLLM's own kernels (aiconfigurator-core 0.12.0's tables), beside simkv's own
price of the same step and its parts (``simkv.cost.step_cost``). A diagnostic: nothing in simkv is fitted to it.

The tables (``systems/data/h100_sxm/`` of the aiconfigurator-core 0.12.0 wheel; every row's ``device`` is
"NVIDIA H100 80GB HBM3"), each read with pyarrow and looked up by multilinear interpolation on its grid (linear in
every numeric axis between the two grid values around the point; beyond the grid's last value, the last value scaled
in proportion; the grid points used are exact where the shape is on the grid):

* ``gemm/vllm/0.24.0/gemm_perf.parquet`` (m, n, k): ``torch.nn.functional.linear`` bf16;
  ``CutlassFP8ScaledMMLinearKernel`` fp8 (per-tensor W8A8, the Llama checkpoint); fp8 128x128 block (MiniMax)
  ``DeepGemmFp8BlockScaledMMKernel`` from m = 32, ``FlashInferFp8BlockScaledMMKernel`` below (the tables' m
  ranges; the Cutlass block-scaled grid is sparse) (which of the two vLLM
  picks at each m is not read here);
* ``attention/vllm/0.24.0/{context,generation}_attention_perf.parquet`` (``vllm_flash_attn_fa3``): per layer, by
  (batch_size, isl) for a prefill, (batch_size, step) with isl 1 for decode (the generation table's one query
  attends isl + step tokens), for the heads one device holds, the KV dtype, ``window_size`` (gpt-oss's sliding layers: 128);
* ``moe/vllm/0.24.0/moe_perf.parquet`` (num_tokens), distribution ``balanced``: gpt-oss-120b
  ``vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic`` (w4a16_mxfp4: the Triton OAI kernel — the
  InferenceX recipe ran Marlin, ``VLLM_MXFP4_USE_MARLIN=1``; docs/research/latency-facts.md §9), MiniMax-M2.5
  fp8_block at the rows' layout (moe_tp 1, moe_ep 4), whichever kernel the table holds for it;
* ``comm/vllm/0.24.0/custom_allreduce_perf.parquet``: ``tensor_model_parallel_all_reduce`` (vLLM's own dispatch:
  custom all-reduce, symmetric memory, NCCL by size) per ``message_size`` in bf16 ELEMENTS (aiconfigurator
  ``collector/collect_all_reduce.py``: ``get_input_shape_and_comm_size`` shapes a tensor of that many elements;
  latency = elapsed / runs / 5 all-reduces), ``vllm_graph`` (in a CUDA graph) for steps vLLM graphs, ``vllm_eager``
  for steps beyond the largest capture size (gpt-oss's recipe 2048 tokens, the others 512).

Per layer: QKV and O projections, the dense MLP (gate/up, down) or the MoE (router GEMM in bf16 + the fused MoE
op), attention, two all-reduces; plus one all-reduce after the embedding and the LM head (bf16, one row per
sequence). Not in any table and left out of the sum: norms, rotary, activation quantization, residual adds,
sampling, host time. So the sum is a floor of what the GPU runs, from measured kernels.

simkv's side is the ``h100-sxm`` preset priced as ``simkv validate --silicon`` prices the row's model: the
checkpoint's formats (``gemm_mix``), the recipe's KV dtype, the step's tokens padded as vLLM pads them.

    python experiments/aic_h100_ops.py [--aic DIR] [--allreduce-tree CHECKOUT] [OUT.csv]

writes experiments/data/aic_h100_ops.csv (one row per model, TP, step and component) and
experiments/data/aic_h100_allreduce.csv (the all-reduce table beside simkv's NCCL fit and, with
``--allreduce-tree``, that tree's ``VllmAllreduce`` model), and prints both as tables.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

AIC = Path("/work/venvs/aic/src/core/aiconfigurator_core/systems/data/h100_sxm")
CONFIGS = Path(__file__).parent / "data" / "silicon" / "configs"
OUT = Path(__file__).parent / "data" / "aic_h100_ops.csv"
OUT_AR = Path(__file__).parent / "data" / "aic_h100_allreduce.csv"

#: (label, config, TP, GEMM dtype of the attention/MLP projections, KV dtype (the recipe's), largest CUDA-graph
#: capture size (the recipe's, else vLLM's min(2 · max_num_seqs, 512)), MoE key or None)
CASES = [
    ("Qwen3-32B bf16", "Qwen--Qwen3-32B_config.json", (2, 4, 8), "bf16", "bfloat16", 512, None),
    ("Llama-3.1-70B fp8", "nvidia--Llama-3.1-70B-Instruct-FP8_config.json", (2, 4, 8), "fp8", "fp8", 512, None),
    ("gpt-oss-120b mxfp4", "openai--gpt-oss-120b_config.json", (2, 4, 8), "bf16", "bfloat16", 2048,
     ("w4a16_mxfp4", "vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic", "tp")),
    ("MiniMax-M2.5 fp8 EP4", "MiniMaxAI--MiniMax-M2.5_config.json", (4,), "fp8_block", "bfloat16", 512,
     ("fp8_block", None, "ep")),
]
PREFILLS = (1024, 8192)
#: (batch, cached tokens per sequence): 1,023 and 8,191, the generation table's grid points (its grid stops short of
#: batch 64 at 16,383), so the decode attention is a measured point, not an interpolation
DECODES = ((4, 1023), (4, 8191), (64, 1023), (64, 8191))


class Table:
    """One parquet table as numpy columns, looked up by exact keys and interpolated on numeric axes."""

    def __init__(self, path: Path):
        import pyarrow.parquet as pq

        self.path = path
        self.cols = {k: np.asarray(v) for k, v in pq.read_table(path).to_pydict().items()}

    def lookup(self, keys: dict, axes: dict) -> tuple[float, str]:
        """Latency in ms at ``axes`` among the rows matching ``keys``, and how it was found."""
        sel = np.ones(len(self.cols["latency"]), dtype=bool)
        for k, v in keys.items():
            sel &= self.cols[k] == v
        if not sel.any():
            raise KeyError(f"{self.path.name}: no row with {keys}")
        pts = {tuple(float(self.cols[a][i]) for a in axes): float(self.cols["latency"][i]) for i in np.flatnonzero(sel)}
        brackets, how = [], []
        for j, (a, x) in enumerate(axes.items()):
            grid = sorted({p[j] for p in pts})
            if x >= grid[-1]:
                brackets.append([(grid[-1], x / grid[-1])])  # beyond the grid: the last value, scaled
                how.append(f"{a}={x:g}" + ("" if x == grid[-1] else f" (last {grid[-1]:g} scaled)"))
            elif x <= grid[0]:
                brackets.append([(grid[0], 1.0)])
                how.append(f"{a}={x:g}" + ("" if x == grid[0] else f" (first {grid[0]:g})"))
            else:
                hi = next(g for g in grid if g >= x)
                lo = max(g for g in grid if g <= x)
                f = 0.0 if hi == lo else (x - lo) / (hi - lo)
                brackets.append([(lo, 1.0 - f), (hi, f)] if hi != lo else [(lo, 1.0)])
                how.append(f"{a}={x:g}" + ("" if hi == lo else f" ({lo:g}..{hi:g})"))
        total = 0.0
        for corner in np.ndindex(*[len(b) for b in brackets]):
            point = tuple(brackets[j][c][0] for j, c in enumerate(corner))
            weight = float(np.prod([brackets[j][c][1] for j, c in enumerate(corner)]))
            if point not in pts:
                raise KeyError(f"{self.path.name}: {keys} has no grid point {point}")
            total += weight * pts[point]
        return total, ", ".join(how)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", default=str(OUT))
    parser.add_argument("--aic", default=str(AIC), help="aiconfigurator-core 0.12.0's systems/data/h100_sxm folder "
                        "(pip download aiconfigurator-core==0.12.0 --no-deps, then unzip the wheel)")
    parser.add_argument("--allreduce-tree", help="a simkv tree whose nvlink4 preset has a 'vllm' all-reduce model")
    args = parser.parse_args(argv)
    aic = Path(args.aic)
    if not (aic / "moe").is_dir():
        parser.error(f"--aic {aic}: not aiconfigurator-core's systems/data/h100_sxm folder (no moe/ in it)")

    from simkv.cost import gemm_mix, get_device, step_cost
    from simkv.cost.attention import attention_work
    from simkv.cost.cudagraphs import capture_sizes, padded_tokens
    from simkv.hfconfig import resolve_model
    from simkv.models import tp_shard, weights_bytes
    from simkv.precision import get_precision

    gemm = Table(aic / "gemm/vllm/0.24.0/gemm_perf.parquet")
    ctx = Table(aic / "attention/vllm/0.24.0/context_attention_perf.parquet")
    gen = Table(aic / "attention/vllm/0.24.0/generation_attention_perf.parquet")
    moe = Table(aic / "moe/vllm/0.24.0/moe_perf.parquet")
    ar = Table(aic / "comm/vllm/0.24.0/custom_allreduce_perf.parquet")
    device = get_device("h100-sxm")

    def gemm_ms(dtype: str, m: float, n: float, k: float) -> tuple[float, str]:
        if dtype == "bf16":
            key = {"gemm_dtype": "bfloat16", "kernel_source": "torch.nn.functional.linear"}
        elif dtype == "fp8":
            key = {"gemm_dtype": "fp8", "kernel_source": "CutlassFP8ScaledMMLinearKernel"}
        else:
            key = {"gemm_dtype": "fp8_block",
                   "kernel_source": "DeepGemmFp8BlockScaledMMKernel" if m >= 32 else "FlashInferFp8BlockScaledMMKernel"}
        t, how = gemm.lookup(key, {"m": m, "n": n, "k": k})
        return t, f"{key['kernel_source']} {key['gemm_dtype']} {how}"

    rows = []
    for label, config, tps, gdtype, kvdtype, capture_max, moe_key in CASES:
        model = resolve_model(str(CONFIGS / config))
        kv = get_precision("fp8" if kvdtype == "fp8" else "bf16")
        cfg = json.loads((CONFIGS / config).read_text())
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        heads, kv_heads, hidden, layers = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"],
                                           cfg["num_hidden_layers"])
        windows = [128 if t == "sliding_attention" else 0 for t in cfg.get("layer_types") or ["full"] * layers]
        for tp in tps:
            shard = tp_shard(model, tp)
            weights = weights_bytes(shard, "checkpoint")
            mix = gemm_mix(shard, device, "checkpoint")
            steps = [("prefill", 1, 0, t) for t in PREFILLS] + [("decode", b, c, 1) for b, c in DECODES]
            for kind, batch, context, new in steps:
                tokens = batch * new
                step = f"{kind} {tokens} tok" if kind == "prefill" else f"decode b{batch} ctx{context}"
                parts: list[tuple[str, float, str]] = []  # (component, ms per step, source)

                def add(name: str, ms_each: float, count: int, src: str) -> None:
                    parts.append((name, ms_each * count, f"{count} x {ms_each * 1e3:.1f} us; {src}"))

                # the GEMMs of attention: QKV (column-parallel), O (row-parallel)
                q = heads * head_dim // tp
                kvd = max(kv_heads // tp, 1) * head_dim
                t, how = gemm_ms(gdtype, tokens, q + 2 * kvd, hidden)
                add("gemm qkv", t, layers, how)
                t, how = gemm_ms(gdtype, tokens, hidden, q)
                add("gemm o", t, layers, how)
                if moe_key is None:
                    inter = cfg["intermediate_size"] // tp
                    t, how = gemm_ms(gdtype, tokens, 2 * inter, hidden)
                    add("gemm mlp gate_up", t, layers, how)
                    t, how = gemm_ms(gdtype, tokens, hidden, inter)
                    add("gemm mlp down", t, layers, how)
                else:
                    dtype, source, split = moe_key
                    experts = cfg.get("num_local_experts")
                    inter = cfg.get("intermediate_size")
                    t, how = gemm_ms("bf16", tokens, experts, hidden)
                    add("gemm router", t, layers, how)
                    keys = {"moe_dtype": dtype, "hidden_size": hidden, "inter_size": inter,
                            "topk": cfg["num_experts_per_tok"], "num_experts": experts, "distribution": "balanced",
                            "moe_tp_size": tp if split == "tp" else 1, "moe_ep_size": tp if split == "ep" else 1}
                    if source:
                        keys["kernel_source"] = source
                    else:  # the kernel the table holds for this shape (one)
                        sel = np.ones(len(moe.cols["latency"]), dtype=bool)
                        for k, v in keys.items():
                            sel &= moe.cols[k] == v
                        kernels = sorted(set(moe.cols["kernel_source"][sel]))
                        if len(kernels) != 1:
                            raise KeyError(f"moe_perf: {keys} has kernels {kernels}")
                        keys["kernel_source"] = kernels[0]
                    t, how = moe.lookup(keys, {"num_tokens": tokens})
                    add("moe", t, layers, f"{keys['kernel_source']} {dtype} moe_tp {keys['moe_tp_size']} "
                                          f"ep {keys['moe_ep_size']} {how}")
                # attention, per layer kind (full / sliding 128)
                h, kh = heads // tp, max(kv_heads // tp, 1)
                for window in sorted(set(windows)):
                    count = windows.count(window)
                    keys = {"num_heads": h, "num_key_value_heads": kh, "head_dim": head_dim,
                            "kv_cache_dtype": kvdtype, "window_size": window,
                            "kernel_source": "vllm_flash_attn_fa3"}
                    if kind == "prefill":
                        table, axes = ctx, {"batch_size": batch, "isl": new}
                    else:  # the generation table: isl 1, ``step`` cached tokens before it (attends isl + step)
                        table, axes = gen, {"batch_size": batch, "step": context}
                        keys["isl"] = 1
                    t, how = table.lookup(keys, axes)
                    add(f"attention {'full' if not window else f'sliding {window}'}", t, count,
                        f"{table.path.name} fa3 {h}/{kh}x{head_dim} kv {kvdtype} {how}")
                # the LM head on one row per sequence
                vocab = cfg["vocab_size"] // tp
                t, how = gemm_ms("bf16", batch, vocab, hidden)
                add("gemm lm_head", t, 1, how)
                # all-reduces: two per layer and one after the embedding, of tokens x hidden bf16 elements
                graphed = tokens <= capture_max
                t, how = ar.lookup({"num_gpus": tp, "backend": "vllm_graph" if graphed else "vllm_eager"},
                                   {"message_size": tokens * hidden})
                add("allreduce", t, 2 * layers + 1, f"custom_allreduce_perf {'graph' if graphed else 'eager'} {how}")
                aic_total = sum(p[1] for p in parts)
                # simkv's price of the same step
                work = attention_work(shard, kv, context, new, sequences=batch)
                graph = padded_tokens(tokens, capture_sizes(capture_max, 8192, capture_max))
                c = step_cost(shard, device, weights_bytes=weights, new_tokens=tokens, attended_pairs=0,
                              kv_read_bytes=work.read_bytes, kv_write_bytes=work.write_bytes, logit_tokens=batch,
                              attention_flops=work.flops, decode_flops=work.decode_flops, gemm_mix=mix,
                              graph_tokens=float(graph) if graphed else tokens)
                sim = {"matmuls": c.matmul_s * 1e3, "attention": c.attention_s * 1e3, "allreduce": c.allreduce_s * 1e3,
                       "overhead": c.overhead_s * 1e3, "total": c.seconds * 1e3}
                groups = {"matmuls": sum(p[1] for p in parts if p[0].startswith(("gemm", "moe"))),
                          "attention": sum(p[1] for p in parts if p[0].startswith("attention")),
                          "allreduce": sum(p[1] for p in parts if p[0] == "allreduce"), "overhead": 0.0,
                          "total": aic_total}
                for name, ms, src in parts:
                    rows.append({"model": label, "tp": tp, "step": step, "component": name,
                                 "aic_ms": round(ms, 4), "simkv_ms": "", "source": src})
                for g in groups:
                    rows.append({"model": label, "tp": tp, "step": step, "component": f"= {g}",
                                 "aic_ms": round(groups[g], 4), "simkv_ms": round(sim[g], 4),
                                 "source": "aic: sum of the parts above; simkv: step_cost's term"})

    out = Path(args.out)
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["model", "tp", "step", "component", "aic_ms", "simkv_ms", "source"])
        w.writeheader()
        w.writerows(rows)
    print(f"{'model':<22}{'tp':>3} {'step':<22}{'part':<10}{'aic ms':>9}{'simkv ms':>10}{'ratio':>7}")
    for r in rows:
        if r["component"].startswith("= "):
            ratio = r["simkv_ms"] / r["aic_ms"] if r["aic_ms"] else float("nan")
            print(f"{r['model']:<22}{r['tp']:>3} {r['step']:<22}{r['component'][2:]:<10}{r['aic_ms']:>9.3f}"
                  f"{r['simkv_ms']:>10.3f}{ratio:>7.2f}")
        elif r["component"] == "moe":
            print(f"{r['model']:<22}{r['tp']:>3} {r['step']:<22}{'(moe)':<10}{r['aic_ms']:>9.3f}")

    # the all-reduce table beside simkv's NCCL fit and the other tree's vLLM model
    from simkv.cost.interconnects import INTERCONNECTS

    link = INTERCONNECTS["nvlink4"]
    sizes = sorted({int(s) for s in ar.cols["message_size"]})
    other = {}
    if args.allreduce_tree:
        code = ("import json,sys;from simkv.cost.interconnects import INTERCONNECTS as I;v=I['nvlink4'].vllm;"
                "s=json.loads(sys.argv[1]);print(json.dumps({n:[float(v.seconds(2*x,n,I['nvlink4'].allreduce_s(2*x,n)))"
                " for x in s] for n in (2,4,8)}))")
        env = dict(os.environ, PYTHONPATH=str(Path(args.allreduce_tree).resolve()))
        res = subprocess.run([sys.executable, "-c", code, json.dumps(sizes)], capture_output=True, text=True, env=env,
                             cwd=args.allreduce_tree, timeout=120)
        if res.returncode:
            print(f"--allreduce-tree: {res.stderr.strip().splitlines()[-1]}", file=sys.stderr)
            return 2
        other = {int(n): v for n, v in json.loads(res.stdout).items()}
    ar_rows = []
    for i, size in enumerate(sizes):
        for n in (2, 4, 8):
            r = {"elements": size, "bytes": 2 * size, "tp": n,
                 "aic_graph_us": round(ar.lookup({"num_gpus": n, "backend": "vllm_graph"}, {"message_size": size})[0] * 1e3, 2),
                 "aic_eager_us": round(ar.lookup({"num_gpus": n, "backend": "vllm_eager"}, {"message_size": size})[0] * 1e3, 2),
                 "simkv_nccl_us": round(float(link.allreduce_s(2 * size, n)) * 1e6, 2),
                 "allreduce_branch_us": round(other[n][i] * 1e6, 2) if other else ""}
            ar_rows.append(r)
    with OUT_AR.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(ar_rows[0]))
        w.writeheader()
        w.writerows(ar_rows)
    print(f"\n{'bytes':>11}{'tp':>3}{'aic graph us':>13}{'aic eager':>10}{'simkv nccl':>11}{'allreduce br.':>14}")
    for r in ar_rows:
        print(f"{r['bytes']:>11}{r['tp']:>3}{r['aic_graph_us']:>13}{r['aic_eager_us']:>10}{r['simkv_nccl_us']:>11}"
              f"{r['allreduce_branch_us']:>14}")
    print(f"\nwrote {out} and {OUT_AR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

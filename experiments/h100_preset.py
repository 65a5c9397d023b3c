"""Check the h100-sxm preset against the real H100 measurements (experiments/data/h100.json).

Five numbers of the preset come from measurements on one H100 (see simkv/data/devices/h100-sxm.json, its sources): the
copy ceiling (KV-stream efficiency and copy bandwidth, h100.json), the weights' streaming rate of the decode GEMMs
in a CUDA graph (experiments/data/h100_serving_terms_graphs.json: per layer ``t = a + bytes / b`` fitted over the
graphed Qwen3-32B / Llama-3.1-70B layer GEMMs at 1–64 tokens, both formats), the per-layer fixed cost of a CUDA-graph
decode step (one decode point, llama-2-7b, batch 1, context 128, minus its weights and KV at those rates, over its 32
layers) and the FLOP efficiency (one prefill point, llama-2-7b, 2,048 tokens, minus its layers' fixed cost). Every
other row is held out. This script re-derives those numbers and prints predicted vs measured step time for every row.

    PYTHONPATH=. python experiments/h100_preset.py
"""

import json
import statistics
import sys
from pathlib import Path

import numpy as np

from simkv.cost import Device, forward_cost, get_device
from simkv.models import get_model, weights_bytes
from simkv.precision import get_precision

DATA = Path(__file__).parent / "data" / "h100.json"
GRAPHS = Path(__file__).parent / "data" / "h100_serving_terms_graphs.json"
USED = {("llama-2-7b", "decode", 1, 128), ("llama-2-7b", "prefill", 1, 2048)}


def streaming_fit(graphs: dict) -> tuple[float, float]:
    """(seconds per layer's GEMMs fixed, bytes/s) of ``t = a + bytes / b`` over the graphed decode GEMMs (1–64 tokens)."""
    rows = [r for r in graphs["graphed_gemm"] if r["m"] <= 64]
    x = np.array([r["weight_bytes"] for r in rows], dtype=float)
    y = np.array([r["layer_s"] for r in rows])
    slope, a = np.polyfit(x, y, 1)
    return float(a), float(1.0 / slope)


def derive(data: dict, dev: Device) -> dict:
    """The preset's measured numbers, worked out from the raw measurements."""
    bf16 = get_precision("bf16")
    eta_kv = data["hbm_achieved_Bps"] / dev.memory_bandwidth
    _, rate = streaming_fit(json.loads(GRAPHS.read_text()))
    eta_w = rate / dev.memory_bandwidth
    model = get_model("llama-2-7b")
    row = next(r for r in data["rows"] if (r["model"], r["kind"], r["batch"], r.get("context")) == ("llama-2-7b", "decode", 1, 128))
    kv = (128 + 1) * bf16.kv_bytes_per_token(model)
    fixed = row["step_s"] - weights_bytes(model, "bf16") / rate - kv / (dev.memory_bandwidth * eta_kv)
    layer = fixed / model.layers
    row = next(r for r in data["rows"] if (r["model"], r["kind"], r.get("prompt")) == ("llama-2-7b", "prefill", 2048))
    flops = forward_cost(model, dev, bf16, batch=1, context=0, new=2048, weights_precision="bf16").flops
    eta_f = flops / (row["step_s"] - model.layers * layer) / dev.peak("bf16")
    return {"kv_bandwidth_efficiency": eta_kv, "bandwidth_efficiency": eta_w, "layer_overhead_s": layer,
            "flops_efficiency": eta_f, "copy_bandwidth": data["hbm_achieved_Bps"] / 2}


def compare(data: dict, dev: Device) -> list[dict]:
    bf16 = get_precision("bf16")
    out = []
    for r in data["rows"]:
        model = get_model(r["model"])
        if r["kind"] == "decode":
            c = forward_cost(model, dev, bf16, batch=r["batch"], context=r["context"], new=1, weights_precision="bf16")
            size = r["context"]
        else:
            c = forward_cost(model, dev, bf16, batch=r["batch"], context=0, new=r["prompt"], weights_precision="bf16")
            size = r["prompt"]
        err = 100 * (c.seconds - r["step_s"]) / r["step_s"]
        used = (r["model"], r["kind"], r["batch"], size) in USED
        out.append({**r, "size": size, "predicted_s": c.seconds, "bound": c.bound, "error_pct": err, "used": used})
    return out


def main() -> int:
    data = json.loads(DATA.read_text())
    dev = get_device("h100-sxm")
    for key, value in derive(data, dev).items():
        print(f"{key:<26} derived {value:.4g}   preset {getattr(dev, key):.4g}")
    rows = compare(data, dev)
    print("\n| model | kind | batch | context/prompt | measured ms | simkv cost ms | error | bound |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        tag = " (derivation point)" if r["used"] else ""
        print(f"| {r['model']} | {r['kind']}{tag} | {r['batch']} | {r['size']:,} | {1e3 * r['step_s']:.2f} | "
              f"{1e3 * r['predicted_s']:.2f} | {r['error_pct']:+.1f} % | {r['bound']} |")
    for kind in ("decode", "prefill"):
        errs = [abs(r["error_pct"]) for r in rows if r["kind"] == kind and not r["used"]]
        print(f"\n{kind}: median absolute error {statistics.median(errs):.1f} % over {len(errs)} held-out points "
              f"(max {max(errs):.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

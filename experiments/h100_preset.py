"""Check the h100-sxm preset against the real H100 measurements (experiments/data/h100.json).

Three numbers of the preset come from this file (see data/devices/h100-sxm.json, its sources): the copy ceiling
(KV-stream efficiency and copy bandwidth), one decode point (llama-2-7b, batch 1, context 128: weight-stream
efficiency) and one prefill point (llama-2-7b, 2,048 tokens: FLOP efficiency). Every other row is held out.
This script re-derives those three numbers and prints predicted vs measured step time for every row.

    PYTHONPATH=. python experiments/h100_preset.py
"""

import json
import statistics
import sys
from pathlib import Path

from simkv.cost import Device, forward_cost, get_device
from simkv.models import get_model, weights_bytes
from simkv.precision import get_precision

DATA = Path(__file__).parent / "data" / "h100.json"
USED = {("llama-2-7b", "decode", 1, 128), ("llama-2-7b", "prefill", 1, 2048)}


def derive(data: dict, dev: Device) -> dict:
    """The preset's measured efficiencies, worked out from the raw measurements."""
    bf16 = get_precision("bf16")
    eta_kv = data["hbm_achieved_Bps"] / dev.memory_bandwidth
    model = get_model("llama-2-7b")
    row = next(r for r in data["rows"] if (r["model"], r["kind"], r["batch"], r.get("context")) == ("llama-2-7b", "decode", 1, 128))
    kv = (128 + 1) * bf16.kv_bytes_per_token(model)
    eta_w = weights_bytes(model, "bf16") / (row["step_s"] - kv / (dev.memory_bandwidth * eta_kv)) / dev.memory_bandwidth
    row = next(r for r in data["rows"] if (r["model"], r["kind"], r.get("prompt")) == ("llama-2-7b", "prefill", 2048))
    flops = forward_cost(model, dev, bf16, batch=1, context=0, new=2048, weights_precision="bf16").flops
    eta_f = flops / row["step_s"] / dev.peak("bf16")
    return {"kv_bandwidth_efficiency": eta_kv, "bandwidth_efficiency": eta_w, "flops_efficiency": eta_f,
            "copy_bandwidth": data["hbm_achieved_Bps"] / 2}


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

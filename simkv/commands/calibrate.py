"""``simkv calibrate`` (issue #13): measure this host (simkv/validate/openvino/calibrate.py) and write the ``host`` device preset."""

from __future__ import annotations

import argparse
import json
import sys

from simkv.errors import SimkvError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("calibrate", help="measure this host and write the `host` device preset",
                       description="Measure this host on the OpenVINO CPU plugin: its fixed per-inference overhead on "
                       "tiny decoders, its one-token attention (per query head and per KV head), the rate a "
                       "decode step streams weights at, matmul throughput in the precision it computes in, and "
                       "the copy rate of its own KV reallocation, and the terms OpenVINO GenAI's ContinuousBatchingPipeline "
                       "runs at (paged attention per sequence and position, per-step and per-sequence costs, "
                       "prefill chunks); write the host preset (path printed). "
                       "About a minute.")
    p.add_argument("--out", metavar="PATH.json", output=(".json",), help="where to write the preset (default: the "
                   "host preset path, $SIMKV_HOST_PRESET or ~/.config/simkv/host.json, its folder made if missing)")
    p.add_argument("--threads", type=int, help="CPU threads to measure with (default: the OpenVINO default)")
    p.add_argument("--json", action="store_true", help="print the preset as JSON")
    return p


def main(args: argparse.Namespace) -> int:
    from simkv.cost import device_summary, host_preset_path
    from simkv.validate.openvino.calibrate import calibrate, check_openvino

    if args.threads is not None and args.threads < 1:
        raise SimkvError("--threads must be positive")
    check_openvino()
    path = args.out or host_preset_path()
    device = calibrate(path, threads=args.threads, progress=not args.json)
    if args.json:
        json.dump({**device_summary(device), "path": str(path)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"host preset written to {path}")
        print(f"  {'weight streaming':<24}{device.memory_bandwidth * device.bandwidth_efficiency / 1e9:,.2f} GB/s")
        print(f"  {'matmul':<24}{device.peak() / 1e9:,.1f} GFLOP/s {device.compute_precision}")
        if device.decode_attention_flops:
            print(f"  {'decode attention':<24}{device.decode_attention_flops / 1e9:,.1f} GFLOP/s (one-token queries)"
                  + ("" if device.attention_overlap else
                     f" + KV reads at {device.memory_bandwidth * device.kv_efficiency / 1e9:,.2f} GB/s, added"))
        print(f"  {'copy bandwidth':<24}{device.copy_bandwidth / 1e9:,.2f} GB/s of KV copied by a plugin reallocation")
        print(f"  {'per-inference overhead':<24}{device.step_overhead_s * 1e3:,.3f} ms + "
              f"{device.layer_overhead_s * 1e3:,.3f} ms per layer")
        pg = device.paged
        if pg:
            print(f"  {'paged pipeline step':<24}{pg['step_overhead_s'] * 1e3:,.3f} ms + "
                  f"{pg['layer_overhead_s'] * 1e3:,.3f} ms per layer + {pg['sequence_overhead_s'] * 1e3:,.4f} ms "
                  f"per sequence + {pg.get('head_overhead_s', 0.0) * 1e6:,.2f} us per sequence, layer and query head + "
                  f"{pg.get('prompt_token_overhead_s', 0.0) * 1e6:,.3f} us per prompt token, layer and query head + "
                  f"{pg.get('vocab_overhead_s', 0.0) * 1e9:,.3f} ns per vocabulary entry of a sampling sequence")
            print(f"  {'paged decode attention':<24}{pg['decode_attention_flops'] / 1e9:,.1f} GFLOP/s + KV reads at "
                  f"{device.memory_bandwidth * pg['kv_bandwidth_efficiency'] / 1e9:,.2f} GB/s, added")
            print(f"  {'paged prefill chunks':<24}{pg['matmul_flops'] / 1e9:,.1f} GFLOP/s")
    return 0

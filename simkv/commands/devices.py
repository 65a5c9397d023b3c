"""``simkv devices`` (issue #13): the cost model's device presets, with where each number comes from."""

from __future__ import annotations

import argparse
import json
import sys

from simkv.units import format_bytes


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("devices", help="list cost-model device presets with their sources",
                       description="Device presets of the cost model: peaks, achieved efficiencies, overhead, and "
                       "where each number comes from. `host` appears after `simkv calibrate`.")
    p.add_argument("--json", action="store_true", help="print the presets as JSON")
    return p


def main(args: argparse.Namespace) -> int:
    from simkv.cost import DEVICES, device_summary, host_preset_path, load_device

    devices = list(DEVICES.values())
    if host_preset_path().exists():
        devices.append(load_device(host_preset_path()))
    if args.json:
        json.dump([device_summary(d) for d in devices], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{'device':<22}{'memory':>11}{'bandwidth':>12}{'peak':>16}{'eff bw/kv/flops':>18}{'overhead':>11}{'copy':>12}")
    for d in devices:
        peak = f"{d.peak() / 1e12:,.1f} T {d.compute_precision}"
        eff = f"{d.bandwidth_efficiency:.2f}/{d.kv_efficiency:.2f}/{d.flops_efficiency:.2f}"
        print(f"{d.name:<22}{format_bytes(d.memory_bytes):>11}{d.memory_bandwidth / 1e9:>8,.0f} GB/s{peak:>16}"
              f"{eff:>18}{d.step_overhead_s * 1e3:>8.3f} ms{d.copy_bandwidth / 1e9:>7,.0f} GB/s")
    for d in devices:
        print(f"\n{d.name}: {d.description}")
        for key, source in d.sources.items():
            print(f"    {key:<24}{source}")
    return 0

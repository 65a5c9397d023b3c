"""``simkv models``: the model presets and the KV precisions."""

from __future__ import annotations

import argparse

from simkv.units import format_bytes


def add_parser(sub) -> argparse.ArgumentParser:
    return sub.add_parser("models", help="list model presets and precisions")


def main(args: argparse.Namespace) -> int:
    from simkv.models import PRESETS
    from simkv.precision import PRECISIONS

    f16 = PRECISIONS["f16"]
    print(f"{'model':<16}{'layers':>7}{'heads':>7}{'kv_heads':>10}{'head_dim':>10}{'f16 KV/token':>15}")
    for m in PRESETS.values():
        print(f"{m.name:<16}{m.layers:>7}{m.heads:>7}{m.kv_heads:>10}{m.head_dim:>10}{format_bytes(f16.kv_bytes_per_token(m)):>15}")
    print("\nprecisions: " + ", ".join(f"{p.name} ({p.bits} bit{'; ' + p.note if p.note else ''})" for p in PRECISIONS.values()))
    return 0

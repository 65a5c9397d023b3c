"""``simkv policies``: the allocation policies and their parameters."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    return sub.add_parser("policies", help="list policies and their parameters")


def main(args: argparse.Namespace) -> int:
    from policies import REGISTRY

    for name, cls in REGISTRY.items():
        print(f"{name}: {cls.summary}")
        print(f"    default precision {cls.default_precision}; source: {cls.__module__.replace('.', '/')}.py")
        for f in cls.options():
            print(f"    {f.name + '=' + str(f.default):<30} {f.metadata.get('help', '')}")
        print()
    return 0

"""``simkv setup``: build a side environment a validator needs (today: ``vllm``, the real vLLM scheduler)."""

from __future__ import annotations

import argparse
import sys

#: The environments ``simkv setup`` builds.
ENVIRONMENTS = ("vllm",)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("setup", help="build a side environment a validator needs (vllm)",
                       description="Build a side environment: `vllm` is a venv with vLLM 0.33.0 and the torch 2.13.0 "
                       "CPU wheel, every package pinned and installed without dependency resolution, for `simkv "
                       "validate --runtime vllm`. Idempotent: an up-to-date venv is left as it is. Where: "
                       "$SIMKV_VLLM_VENV, else ~/.cache/simkv/vllm-venv (about 2.2 GB, ~2 minutes).")
    p.add_argument("environment", choices=ENVIRONMENTS, help="which environment to build")
    p.add_argument("--where", action="store_true", help="print the environment's path and whether it is built")
    return p


def main(args: argparse.Namespace) -> int:
    from simkv.validate.vllm.env import build, is_built, venv_dir

    if args.where:
        print(f"{venv_dir()} ({'built' if is_built() else 'not built'})")
        return 0
    build(log=lambda line: print(line, file=sys.stderr))
    return 0

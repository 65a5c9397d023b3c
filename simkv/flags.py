"""The command-line flags that describe a scenario, declared once, and the parser that reads them.

The ``simkv`` commands that take a scenario (``run``, ``validate``, ``sweep``, ``tune``; ``cost`` takes the
model flags) declare these (``sweep`` and ``tune`` also the executor flags); so does ``simkv run``'s whole declaration
(:func:`simkv.serving.cli.add_run_arguments`), which the dashboard's Serving view parses its command
lines with. Below both, so a line means the same to the CLI and to the dashboard, and neither
imports the other.
"""

from __future__ import annotations

import argparse

from simkv import scenario as sc
from simkv.models import WEIGHT_PRECISIONS


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit code 2)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_scenario_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that describe a scenario, shared by ``run``, ``validate``, ``sweep`` and ``tune``."""
    add_model_arguments(p)
    w = p.add_argument_group("workload (one stateful session)")
    w.add_argument("--prompt", type=int, default=sc.DEFAULT_PROMPT, help=f"prompt tokens (default {sc.DEFAULT_PROMPT})")
    w.add_argument("--decode", type=int, default=sc.DEFAULT_DECODE, help=f"generated tokens (default {sc.DEFAULT_DECODE})")
    w.add_argument("--turns", type=int, default=0, help="further chat turns after the first answer (default 0)")
    w.add_argument("--turn-tokens", type=int, default=64, help="user tokens appended per chat turn (default 64)")
    w.add_argument("--turn-decode", type=int, help="tokens generated per chat turn (default: --decode)")
    w.add_argument("--beam", type=int, default=1, help="beam width for every answer: fork, decode, select (default 1)")
    w.add_argument("--turn-divergence", type=int, default=0, metavar="D",
                   help="per chat turn, the last D stored tokens differ from the re-tokenized history: each turn "
                   "trims them (trim:D) and prefills them again (default 0)")
    w.add_argument(
        "--ops",
        help="explicit operations instead of the above, e.g. prefill:32,decode:100,fork:4,decode:50,"
        "reorder,select:0,trim:20,prefill:36,decode:10,reset",
    )


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model flags (a preset, optionally with dimensions overridden) and the KV precision."""
    m = p.add_argument_group("model (a preset or a config.json; the dimension flags reshape a uniform one)")
    m.add_argument("--model", metavar="NAME|PATH", default=sc.DEFAULT_MODEL,
                   help=f"preset name, a Hugging Face config.json or its folder, or 'custom' (default {sc.DEFAULT_MODEL}; "
                   "see `simkv models`)")
    m.add_argument("--layers", type=int, help="attention layers")
    m.add_argument("--heads", type=int, help="query heads")
    m.add_argument("--kv-heads", type=int, help="key/value heads (fewer than heads: GQA)")
    m.add_argument("--head-dim", type=int, help="head size")
    m.add_argument("--sliding-window", type=int, metavar="N",
                   help="attention window in tokens (0: none; default: the preset's, e.g. mistral-7b 4096); "
                   "used by hf-dynamic")
    m.add_argument("--precision", help="KV precision: f32 f16 bf16 u8 u4 i8 fp8 (default: the policy's runtime default)")


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """The allocation policy, its options, and the device memory it has next to the weights."""
    g = p.add_argument_group("allocation policy and device")
    g.add_argument("--policy", default=sc.DEFAULT_POLICY, help=f"policy name (default {sc.DEFAULT_POLICY}; see `simkv policies`)")
    g.add_argument("--policy-opt", action="append", metavar="KEY=VALUE", help="override a policy parameter (repeatable)")
    g.add_argument("--device-memory", default=sc.DEFAULT_DEVICE_MEMORY, help=f"device memory, e.g. 16GiB (default {sc.DEFAULT_DEVICE_MEMORY})")
    g.add_argument("--weights-memory", metavar="BYTES", help="device memory taken besides the KV cache (weights, other "
                   "models), e.g. 8GiB or 0; counts toward the headroom limit and out of memory (default: the "
                   "preset's weights at --weights-precision; 0 for a custom shape)")
    g.add_argument("--weights-precision", choices=list(WEIGHT_PRECISIONS), help="precision of the weights for the default "
                   "--weights-memory (default: what the device's usual runtime loads: serving on h100-sxm / a100-80gb the "
                   "checkpoint as stored, as vLLM does: its quantized formats ('checkpoint') or its 2-byte dtype; on "
                   "the OpenVINO presets, and for a single session, an "
                   "optimum-intel export's int8 from 1e9 parameters, else f16)")


def add_latency_arguments(p: argparse.ArgumentParser, default: str | None = None) -> None:
    """``--device``: price every step with the cost model (simkv/cost/)."""
    g = p.add_argument_group("latency (the cost model, see `simkv devices`)")
    g.add_argument("--device", metavar="NAME|host|PATH", default=default, help="cost-model device: a preset, host "
                   "(after `simkv calibrate`) or a preset file; adds predicted step times to the report"
                   + (f" (default {default})" if default else ""))


def scenario_fields(args: argparse.Namespace) -> dict:
    """The scenario and policy flags as :func:`~simkv.scenario.build_scenario`'s keywords, ``--sliding-window``
    aside: a sweep point (simkv.lab.sweep) as ``simkv sweep`` and ``simkv tune`` take it."""
    from policies import parse_policy_opts

    return {
        "model": None if args.model == "custom" else args.model, "layers": args.layers, "heads": args.heads,
        "kv_heads": args.kv_heads, "head_dim": args.head_dim, "precision": args.precision,
        "policy": args.policy, "policy_options": parse_policy_opts(args.policy_opt),
        "prompt": args.prompt, "decode": args.decode, "turns": args.turns, "turn_tokens": args.turn_tokens,
        "turn_decode": args.turn_decode, "beam": args.beam, "ops": args.ops, "device_memory": args.device_memory,
        "weights_memory": args.weights_memory, "weights_precision": args.weights_precision,
        # only when asked for: a sweep point's id hashes its keys
        **({"turn_divergence": args.turn_divergence} if getattr(args, "turn_divergence", 0) else {}),
    }


def scenario_from_args(args: argparse.Namespace):
    """The :class:`~simkv.scenario.Scenario` of ``simkv run``'s flags."""
    return sc.build_scenario(**scenario_fields(args), sliding_window=args.sliding_window)


def add_executor_arguments(p: argparse.ArgumentParser) -> None:
    """Where points run: local processes or a Dask cluster (``simkv sweep`` and ``simkv tune``)."""
    g = p.add_argument_group("where points run")
    g.add_argument("--workers", type=int, help="local processes (default: one per core; 1 = in this process)")
    g.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="run on this Dask cluster (dask.distributed) instead")

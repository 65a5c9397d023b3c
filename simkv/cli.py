"""The ``simkv`` command: the top parser, built from the command modules (simkv.commands), and dispatch.

Any error caused by input is printed as one line on stderr with exit code 2; the flags and output paths are checked
by the parser before a command starts (the contract, simkv.flags). Ctrl-C ends a command with one line and exit
code 130 (128 + SIGINT, as a shell reports it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from simkv.commands import app, calibrate, cost, devices, models, plan, policies, run, setup, sweep, tune, validate
from simkv.errors import SimkvError
from simkv.flags import Parser
from simkv.version import __version__

#: In ``simkv --help`` order.
COMMANDS = (run, policies, models, validate, app, cost, devices, calibrate, sweep, tune, plan, setup)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="simkv", description="KV-cache memory simulator and policy lab for LLM inference.")
    parser.add_argument("--version", action="version", version=f"simkv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub).set_defaults(func=command.main)
    return parser


#: Exit code of a command interrupted with Ctrl-C.
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("simkv: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else list(argv)):
        # No command: the top-level help, where argparse would say only "arguments are required: command". On
        # stderr with exit code 2, as argparse ends any usage error, so a script that lost its command still fails.
        parser.print_help(sys.stderr)
        return 2
    try:  # a usage error or a breach of the contract: one line, exit code 2 (--help and --version: 0)
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the subcommand's parser, so the error names `simkv run`, not `simkv`
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return args.func(args)
    except SimkvError as err:
        print(f"simkv {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `simkv run --json | head`
        return 0
    except OSError as err:  # an output path that cannot be written
        print(f"simkv {args.command}: error: {err.strerror or err}: {err.filename or ''}".rstrip(": "),
              file=sys.stderr)
        return 2
    except MemoryError:
        print(f"simkv {args.command}: error: out of host memory simulating this run "
              "(see docs/guide/getting-started.md, Limits)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"simkv {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

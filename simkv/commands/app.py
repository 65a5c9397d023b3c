"""``simkv app`` (issue #4): serve the interactive what-if dashboard.

The one arrow from the CLI to the dashboard: this command starts it, with the dashboard's own
flags (simkv.dashboard.server, which ``python app.py`` reads too). The dashboard imports no CLI module.
"""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    from simkv.dashboard.server import add_arguments

    p = sub.add_parser("app", help="serve the interactive what-if dashboard in the browser",
                       description="Serve the simkv what-if dashboard (Dash) on http://HOST:PORT/.")
    add_arguments(p)
    return p


def main(args: argparse.Namespace) -> int:
    from simkv.dashboard.server import serve

    serve(args.host, args.port, args.debug)  # refuses a port taken or out of range in one line (check_address)
    return 0

"""The interactive what-if dashboard (Dash): ``python app.py`` or ``simkv app``.

* :mod:`simkv.dashboard.state` — control values, limits, the URL form of a what-if;
* :mod:`simkv.dashboard.compute` — checks, cached runs and views as data (no Dash);
* :mod:`simkv.dashboard.validation` — reading ``simkv validate`` reports;
* :mod:`simkv.dashboard.components` — the controls, graphs, tables and cards every view is built from;
* :mod:`simkv.dashboard.tune_view` — the Tune view (``simkv tune`` on the sidebar's scenario);
* :mod:`simkv.dashboard.serving_view` — the Serving view (``simkv run --trace/--synthetic`` on its own form);
* :mod:`simkv.dashboard.layout` — the page; :mod:`simkv.dashboard.callbacks` — the main view's wiring.
"""

from __future__ import annotations

import argparse
from typing import Sequence

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050


def create_app():
    """A new Dash app (its Flask server is ``app.server``)."""
    from dash import Dash

    from simkv.dashboard import callbacks, layout, serving_view, tune_view

    app = Dash(__name__, title="simkv what-if", update_title=None, assets_folder="__no_assets__")
    app.index_string = layout.INDEX
    app.layout = layout.serve_layout
    callbacks.register(app)
    tune_view.register(app)
    serving_view.register(app)
    return app


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, debug: bool = False) -> None:
    """Run the dashboard on ``http://host:port/`` until interrupted."""
    create_app().run(host=host, port=port, debug=debug)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"interface to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--debug", action="store_true", help="Dash debug mode: reload on change, dev tools")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simkv app", description="Serve the simkv what-if dashboard.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.debug)
    return 0


__all__ = ["create_app", "serve", "main", "add_arguments", "DEFAULT_HOST", "DEFAULT_PORT"]

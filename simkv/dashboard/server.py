"""The Dash app: the page (simkv.dashboard.layout) and every view's callbacks, wired; and its server flags.

``python app.py`` and ``simkv app`` start it; nothing in the dashboard imports this module.
"""

from __future__ import annotations

import argparse

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050


def create_app():
    """A new Dash app (its Flask server is ``app.server``)."""
    # imported here: every `simkv` command reads this module for the `simkv app` flags, and none needs Dash
    from dash import Dash

    from simkv.dashboard import callbacks, layout, plan_view, serving_view, tune_view

    # named for the package: Flask's app name, and where Dash would look for its files
    app = Dash("simkv.dashboard", title="simkv what-if", update_title=None, assets_folder="__no_assets__")
    app.index_string = layout.INDEX
    app.layout = layout.serve_layout
    callbacks.register(app)
    tune_view.register(app)
    serving_view.register(app)
    plan_view.register(app)
    return app


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, debug: bool = False) -> None:
    """Run the dashboard on ``http://host:port/`` until interrupted."""
    create_app().run(host=host, port=port, debug=debug)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--host``, ``--port``, ``--debug``: of ``python app.py`` and ``simkv app`` alike."""
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"interface to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--debug", action="store_true", help="Dash debug mode: reload on change, dev tools")

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


def check_address(host: str, port: int) -> None:
    """Refuse, in one line (:class:`~simkv.errors.ConfigError`), an address the server could not listen on: a port
    out of range, a host that does not resolve, a port already taken. Checked by binding a socket as the server
    will — werkzeug's ``BaseWSGIServer`` (``werkzeug/serving.py``) is an ``HTTPServer``, whose
    ``allow_reuse_address`` sets ``SO_REUSEADDR`` — and closing it: without the check Dash prints its banner
    and Flask then fails with a traceback-like "Address already in use" and exit code 1."""
    import socket

    from simkv.errors import ConfigError

    if not 0 < port < 65536:
        raise ConfigError(f"--port must be in 1..65535, got {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as err:
        raise ConfigError(f"--host {host}: cannot be resolved ({getattr(err, 'strerror', None) or err})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            raise ConfigError(f"--port {port}: cannot listen on {host}:{port} ({err.strerror or err}); "
                              "give another --port") from None


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, debug: bool = False) -> None:
    """Run the dashboard on ``http://host:port/`` until interrupted (the address checked first)."""
    check_address(host, port)
    create_app().run(host=host, port=port, debug=debug)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--host``, ``--port``, ``--debug``: of ``python app.py`` and ``simkv app`` alike."""
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"interface to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--debug", action="store_true", help="Dash debug mode: reload on change, dev tools")

"""The simkv what-if dashboard: ``python app.py [--host 127.0.0.1] [--port 8050] [--debug]``."""

import argparse

from simkv.dashboard.server import add_arguments, check_address, create_app

app = create_app()
server = app.server  # for a WSGI server, e.g. gunicorn app:server

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    args = parser.parse_args()
    try:
        check_address(args.host, args.port)
    except ValueError as err:  # ConfigError: a port taken or out of range, one line
        parser.error(str(err))
    app.run(host=args.host, port=args.port, debug=args.debug)

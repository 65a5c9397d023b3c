"""``python -m simkv ...``: the same command line as the ``simkv`` script (for a venv whose scripts are not on PATH,
and to run a checkout's own code: ``PYTHONPATH=. python -m simkv run``)."""

import sys

from simkv.cli import main

sys.exit(main())

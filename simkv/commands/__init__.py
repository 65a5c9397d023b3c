"""The ``simkv`` commands, one module each: its subparser (``add_parser(sub)``, which returns it) and
the command itself (``main(args) -> exit code``). :mod:`simkv.cli` builds the top parser from them
and dispatches; the substance is in the library (scenario, serving, lab, validate, cost).

Any error caused by input is a :class:`simkv.errors.SimkvError`: :func:`simkv.cli.main` prints it as
one line on stderr, exit code 2.
"""

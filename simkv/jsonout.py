"""``json.dump(obj, fh, indent=2)``, byte for byte, fast on long lists of integers.

``simkv run --json`` lists every step where each layer's K and V were allocated: a
policy that reallocates every step writes millions of integers. With ``indent`` the
standard library encodes them one by one in Python and writes each piece on its own
(``--policy exact --decode 200000``: 16 s of CPU, 64 MB of output), or, through
``json.dumps``, builds millions of small strings first (0.95 GB RSS). Here every list
of at least :data:`LONG` plain integers is set aside, the rest is encoded by ``json``,
and each set-aside list is written in its place by joining its numbers in chunks.
"""

from __future__ import annotations

import json
from typing import IO

LONG = 1000  # shorter lists are left to json
_CHUNK = 1 << 16
_MARK = "\0simkv-list-"  # json writes it as "\u0000simkv-list-<n>"


def write_json(obj, fh: IO[str], indent: int = 2) -> None:
    """Write ``obj`` as ``json.dump(obj, fh, indent=indent)`` would, then a newline."""
    lists: list[list[int]] = []

    def set_aside(o):
        if isinstance(o, dict):
            return {k: set_aside(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            if len(o) >= LONG and all(type(x) is int for x in o):
                lists.append(o)
                return f"{_MARK}{len(lists) - 1}"
            return [set_aside(v) for v in o]
        return o

    text = json.dumps(set_aside(obj), indent=indent)
    pieces = text.split(json.dumps(_MARK)[:-1])  # the marks as json wrote them, opening quote included
    if len(pieces) != len(lists) + 1:  # a string of the data looks like a mark: no shortcut
        fh.write(json.dumps(obj, indent=indent) + "\n")
        return
    before = pieces[0]
    fh.write(before)
    for piece in pieces[1:]:
        number, after = piece.split('"', 1)
        line = before.rsplit("\n", 1)[-1]  # the mark's line: its indentation is the list's
        _write_list(fh, lists[int(number)], len(line) - len(line.lstrip(" ")), indent)
        fh.write(after)
        before = after
    fh.write("\n")


def _write_list(fh: IO[str], values: list[int], column: int, indent: int) -> None:
    """A list of integers as json writes it with ``indent`` when its line is indented by ``column``."""
    pad = " " * (column + indent)
    fh.write("[\n" + pad)
    sep = ",\n" + pad
    for start in range(0, len(values), _CHUNK):
        if start:
            fh.write(sep)
        fh.write(sep.join(map(str, values[start : start + _CHUNK])))
    fh.write("\n" + " " * column + "]")

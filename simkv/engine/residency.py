"""Resident memory under first touch (``policy.first_touch``: the CPU plugin's buffers).

An allocation takes no physical memory until its rows are written: a buffer becomes
resident as tokens are written into it (and as a copy fills it). The engine keeps each
slot's high-water mark of rows written (``FastEngine.written``); a row written below it
is resident already. Without first touch, resident memory is what is allocated.
"""

from __future__ import annotations

import numpy as np


def touch(written: np.ndarray, rows, row_bytes: np.ndarray) -> int:
    """Write every slot up to ``rows`` rows: raises the marks ``written`` (in place) and returns
    the bytes that become resident."""
    growth = np.maximum(rows - written, 0)
    np.maximum(written, rows, out=written)
    return int((growth * row_bytes).sum())


def writes_below_mark(written: np.ndarray, layout, L0: int, B: int, n: int, unit: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per step of a decode run, bytes of token rows written below a slot's high-water mark
    (already resident); ``unit``, ``k``: the run's reallocations (unit, step in the run).

    Only slots written past the history (kept across a reset) have such rows, and
    only until they are reallocated: a new buffer is written from its copy on.
    """
    high = np.flatnonzero(written > B * L0)
    out = np.zeros(n + 2, dtype=np.int64)
    if not len(high):
        return out[1 : n + 1]
    first_event = np.full(layout.units, n + 1, dtype=np.int64)
    np.minimum.at(first_event, unit, k)
    mark = written[high]
    row = layout.row_bytes[high]
    event = first_event[high // layout.unit_slots.shape[1]]
    cross = mark // B - L0 + 1  # first step whose rows pass the mark
    # Steps 1 .. cross-1 (before any reallocation) write only below the mark.
    full_until = np.minimum(cross - 1, event - 1)
    np.add.at(out, np.ones_like(high), B * row)
    np.add.at(out, np.minimum(full_until, n) + 1, -B * row)
    # The crossing step writes partly below it.
    partial = (cross < event) & (cross <= n)
    np.add.at(out, cross[partial], (mark[partial] - B * (L0 + cross[partial] - 1)) * row[partial])
    np.add.at(out, cross[partial] + 1, -(mark[partial] - B * (L0 + cross[partial] - 1)) * row[partial])
    return np.cumsum(out)[1 : n + 1]

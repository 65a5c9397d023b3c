"""Per-step memory: one row per step, what the timeline plots and the metrics reduce.

Columns (bytes unless said):

``step``, ``phase``   as in the ledger
``tokens``           tokens stored per beam after the step
``batch``            beams after the step
``allocated``        allocated at the end of the step
``peak``             highest allocated at any moment of the step
``steady``           allocated in current buffers at the end (without the old
                     buffers a reallocation keeps alive for a while)
``used``             logical bytes: tokens × beams × bytes per token, all buffers
``resident``         resident at the end (first touch: rows written)
``resident_peak``    highest resident at any moment of the step

Within a step, rows of the ledger happen in order; the step's new tokens are
written after its reallocations and before buffers freed at the end of the
step (``free_old=end_of_step``).
"""

from __future__ import annotations

import numpy as np

from simkv.ledger import drain

STEP = np.dtype(
    [
        ("step", np.int64),
        ("phase", np.int8),
        ("tokens", np.int64),
        ("batch", np.int64),
        ("allocated", np.int64),
        ("peak", np.int64),
        ("steady", np.int64),
        ("used", np.int64),
        ("resident", np.int64),
        ("resident_peak", np.int64),
    ]
)


class StepRecorder:
    """Collects step rows one at a time (event steps) or in blocks (quiet runs)."""

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._singles: list[tuple] = []

    def add(self, *values: int) -> None:
        self._singles.append(values)

    def add_block(self, block: np.ndarray) -> None:
        self._flush()
        self._chunks.append(block)

    def _flush(self) -> None:
        if self._singles:
            self._chunks.append(np.array(self._singles, dtype=STEP))
            self._singles = []

    def table(self) -> np.ndarray:
        """All rows as one array (the chunks joined into it one by one, each released once copied)."""
        self._flush()
        self._chunks = [drain(self._chunks, STEP)]
        return self._chunks[0]

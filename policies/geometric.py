"""Geometric growth: ``cap = ceil(ratio × needed)`` on overflow.

The CPU plugin's doubling (DESIGN.md §3) generalised to any ratio, like a
``std::vector`` or Python list: amortised O(1) copies per token, at the price
of up to ``ratio - 1`` of the cache reserved but unused. Mechanics default to
the CPU plugin's (old freed at once, reset keeps capacity), so
``geometric`` with ``ratio=2`` allocates exactly like ``openvino-cpu`` — except a hybrid
model's linear-attention states, which ``openvino-cpu`` double-buffers as the plugin does
(``double_buffered_states``) and ``geometric`` keeps as one buffer per state.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from policies.base import option
from policies.mechanics import CPUMechanics
from simkv.errors import ConfigError


@dataclass(frozen=True)
class Geometric(CPUMechanics):
    name = "geometric"
    summary = "cap = ceil(ratio x needed) on overflow (ratio 2 = the CPU plugin's doubling)"

    ratio: float = option(1.5, "growth ratio (> 1)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.ratio > 1:
            raise ConfigError(f"ratio must be > 1, got {self.ratio}")

    def capacity(self, needed, prim):
        # Exact rational arithmetic: a float product like 1.1 * 100 = 110.00000000000001
        # must not round up to 111.
        r = Fraction(str(self.ratio))
        needed = np.asarray(needed, dtype=np.int64)
        return -((-needed * r.numerator) // r.denominator)

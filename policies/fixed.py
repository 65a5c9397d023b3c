"""Fixed headroom: every primitive gets the same ``+N`` tokens — the un-staggered baseline.

This is the GPU plugin's rule (DESIGN.md §2, ``cap' = L + P_id``) with the
stagger removed (``P_id = N`` for every primitive): all layers run out of room
on the same step, so their reallocation spikes add up. Mechanics default to
the GPU plugin's (old buffer freed at the next inference, reset frees, two
beam tables per primitive, no headroom past 90 % of device memory) so that
comparing ``fixed`` with ``openvino-gpu`` isolates the effect of the stagger.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import option
from policies.mechanics import GPUMechanics
from simkv.errors import ConfigError


@dataclass(frozen=True)
class Fixed(GPUMechanics):
    name = "fixed"
    summary = "cap = L + N for every primitive (no stagger): the baseline the GPU stagger improves on"

    tokens: int = option(128, "headroom N in tokens added on every (re)allocation")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tokens < 0:
            raise ConfigError(f"tokens must be >= 0, got {self.tokens}")

    def capacity(self, needed, prim):
        return needed + self.tokens

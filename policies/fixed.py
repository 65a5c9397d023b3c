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

from policies.base import Policy, option
from simkv.errors import ConfigError


@dataclass(frozen=True)
class Fixed(Policy):
    name = "fixed"
    summary = "cap = L + N for every primitive (no stagger): the baseline the GPU stagger improves on"

    free_old: str = option("next_inference", "when a replaced buffer is freed: immediate | end_of_step | next_inference")
    reset: str = option("free", "what reset_state() does to KV buffers: keep | free")
    first_touch: bool = option(False, "host memory: resident only once written (else resident = allocated)")
    beam_tables: int = option(2, "i32 beam tables [B, cap] per K and per V primitive")
    headroom_limit: float = option(0.9, "no headroom once an allocation would fill this share of device memory (0 = off)")
    tokens: int = option(128, "headroom N in tokens added on every (re)allocation")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tokens < 0:
            raise ConfigError(f"tokens must be >= 0, got {self.tokens}")

    def capacity(self, needed, prim):
        return needed + self.tokens

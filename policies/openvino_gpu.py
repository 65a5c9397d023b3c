"""OpenVINO GPU plugin: staggered additive headroom per kv_cache primitive.

Source (DESIGN.md §2): openvinotoolkit/openvino
``src/plugins/intel_gpu/src/graph/kv_cache.cpp`` and ``primitive_inst.cpp``
(``do_runtime_in_place_kv_cache``, ``realloc_if_needed``), PRs #22665, #25580,
#32916, #28361.

* headroom ``P_id = 128 + kv_cache_id % 64`` per primitive (ids K0, V0, K1, V1, …),
  so layers run out of room on different steps (the stagger);
* first inference ``cap = P + P_id``; on overflow ``cap' = L0 + L1 + P_id``;
* no headroom when ``used_device + bytes >= 0.9 × device memory`` (``headroom_limit``);
* reclaim: rebuilt when ``(needed + P_id) × 10 < cap``;
* the old buffer stays referenced by ReadValue until the next inference;
* ``reset_state()`` frees the buffers (late-2025 builds, #32916); ``reset=keep``
  gives the older keep-and-reuse behaviour (#28361);
* indirect SDPA keeps two i32 beam tables per primitive, grown the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.base import Policy, option
from simkv.errors import ConfigError


@dataclass(frozen=True)
class OpenVINOGPU(Policy):
    name = "openvino-gpu"
    summary = "GPU plugin: cap = L + 128 + id % 64 per primitive (staggered), old freed next inference"
    default_precision = "f16"

    free_old: str = option("next_inference", "when a replaced buffer is freed: immediate | end_of_step | next_inference")
    reset: str = option("free", "what reset_state() does to KV buffers: keep | free")
    first_touch: bool = option(False, "host memory: resident only once written (else resident = allocated)")
    beam_tables: int = option(2, "i32 beam tables [B, cap] per K and per V primitive")
    headroom_limit: float = option(0.9, "no headroom once an allocation would fill this share of device memory (0 = off)")
    headroom_base: int = option(128, "tokens of headroom every primitive gets")
    stagger: int = option(64, "headroom modulus: primitive id adds id % stagger tokens (1 = no stagger)")
    reclaim_factor: int = option(10, "rebuild a buffer when (needed + headroom) x factor < capacity (0 = never)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.headroom_base < 0 or self.stagger < 1:
            raise ConfigError("headroom_base must be >= 0 and stagger >= 1")
        if self.reclaim_factor < 0:
            raise ConfigError("reclaim_factor must be >= 0")

    def headroom(self, prim: np.ndarray) -> np.ndarray:
        return self.headroom_base + np.asarray(prim) % self.stagger

    def capacity(self, needed, prim):
        return needed + self.headroom(prim)

    def reclaim(self, needed, prim, capacity):
        if not self.reclaim_factor:
            return super().reclaim(needed, prim, capacity)
        return (needed + self.headroom(prim)) * self.reclaim_factor < capacity

"""OpenVINO GPU plugin: staggered additive headroom per kv_cache primitive.

Rules (docs/DESIGN.md §2), as read in openvinotoolkit/openvino:

* ``kv_cache_inst::get_prealloc_iter_num()`` (``src/plugins/intel_gpu/src/graph/kv_cache.cpp``)
  returns ``128 + kv_cache_id % 64``: each primitive (K0, V0, K1, V1, …) gets its own
  headroom so that layers do not all reallocate on the same iteration — the
  *stagger*. Its comment: the original memory "will be released when the
  ReadValue is called, i.e., at the next iteration", so old and new coexist
  for one step;
* ``primitive_inst::realloc_if_needed`` (``graph/primitive_inst.cpp``) pads the
  sequence axis by that count (first inference ``cap = P + P_id``; on overflow
  ``cap' = L0 + L1 + P_id``) when ``ShapePredictor::can_preallocate``
  (``runtime/shape_predictor.cpp``) allows it: ``device_mem_usage + size <
  0.90 × max_global_mem_size`` and ``size <= max_alloc_mem_size``; else exact size;
  and it reclaims a buffer when ``(needed + P_id) × 10 < cap``;
* ``reset_state()`` frees the buffers in late-2025 builds (PR #32916); older
  builds keep them for reuse (#28361): ``reset=keep``;
* indirect SDPA (``impls/ocl/kv_cache.cpp``) keeps a prev and a new i32 beam
  table per primitive, swapped each step, grown by the same ``P_id``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.base import option
from policies.mechanics import GPUMechanics
from simkv.errors import ConfigError


@dataclass(frozen=True)
class OpenVINOGPU(GPUMechanics):
    name = "openvino-gpu"
    summary = "GPU plugin: cap = L + 128 + id % 64 per primitive (staggered), old freed next inference"
    default_precision = "f16"

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

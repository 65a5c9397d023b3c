"""OpenVINO CPU plugin: capacity doubles, all layers reallocate in the same step.

Source: openvinotoolkit/openvino ``src/plugins/intel_cpu/src/nodes/scaled_attn.cpp``
(``gatherConcatPastkv``, ``updateBeamTable``, ``updatePastkv``,
``resetBeamTablePastkv``) and ``memory_state.cpp`` (``VariableStateKVcache``);
every rule below was observed allocation by allocation on openvino 2026.4.1
(``simkv validate``, docs/DESIGN.md §3):

* per layer, K and V each own data ``[cap, B, H, S]``, for u8/u4 an f32
  scale/zero-point buffer ``[cap, B, H, 2]``, and an i32 beam table ``[B, cap]``;
* a P-token prefill gives ``cap = 2P``; the buffers grow when ``B·L`` exceeds the
  rows allocated, to ``cap = 2L``: reallocations at ``L = 2^k (P+1) - 1``;
* layer after layer: the beam tables are replaced first, then the data and scales
  (new allocated, old freed at once: ``+Kb +Vb -Vb -Kb +K +V +Ks +Vs -Ks -Vs -V -K``);
* a change of batch width rebuilds every layer at ``cap = 2L`` (data, scales, then
  beam tables); a same-width reorder allocates nothing;
* ``reset_state()`` frees nothing; the next prompt reuses the buffers if its rows
  fit, whatever its batch, and grows them in another order if not;
* one model-wide f32 ``[B, H, L0, S]`` block backs the fused node's past inputs:
  grow-only, exact size, allocated before layer 0 (address space only);
* a sliding-window layer keeps every token (the window is only in the mask); a hybrid
  model's linear-attention states are plain double-buffered variables in the inference
  precision (``state_precision``; :class:`policies.mechanics.CPUMechanics`, docs/DESIGN.md §4c).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from policies.base import option
from policies.mechanics import CPUMechanics
from simkv.errors import ConfigError


@dataclass(frozen=True)
class OpenVINOCPU(CPUMechanics):
    name = "openvino-cpu"
    summary = "CPU plugin: cap = 2 (L0 + L1) on overflow, all layers in the same step, old freed at once"
    default_precision = "u8"

    #: KV_CACHE_PRECISION values the CPU plugin accepts that simkv models (it also takes
    #: u3; i8, i4 and f8 are refused: "Supported values: u8, u4, u3, bf16, f16, f32",
    #: measured by compiling with each, openvino 2026.4.1). bf16 runs as f32 on a CPU
    #: without avx512_bf16 (``simkv validate`` reports the effective precision).
    accepted_precisions = ("u8", "u4", "bf16", "f16", "f32")

    growth: float = option(2.0, "capacity multiplier on overflow, a ratio >= 1 (the plugin uses 2)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.growth >= 1:
            raise ConfigError(f"growth must be >= 1, got {self.growth}")

    def capacity(self, needed, prim):
        # ceil(growth x needed) in exact rational arithmetic (growth 2: exactly 2 x needed).
        r = Fraction(str(self.growth))
        return -((-np.asarray(needed, dtype=np.int64) * r.numerator) // r.denominator)

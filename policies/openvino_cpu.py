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
  grow-only, exact size, allocated before layer 0 (address space only).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import option
from policies.mechanics import CPUMechanics
from simkv.errors import ConfigError


@dataclass(frozen=True)
class OpenVINOCPU(CPUMechanics):
    name = "openvino-cpu"
    summary = "CPU plugin: cap = 2 (L0 + L1) on overflow, all layers in the same step, old freed at once"
    default_precision = "u8"

    growth: int = option(2, "capacity multiplier on overflow (the plugin uses 2)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.growth < 1:
            raise ConfigError(f"growth must be >= 1, got {self.growth}")

    def capacity(self, needed, prim):
        return self.growth * needed

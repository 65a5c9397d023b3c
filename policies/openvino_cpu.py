"""OpenVINO CPU plugin: capacity doubles, all layers reallocate in the same step.

Source (DESIGN.md §3): openvinotoolkit/openvino
``src/plugins/intel_cpu/src/nodes/scaled_attn.cpp`` (``updatePastkv``,
``updateBeamTable``, ``resetBeamTablePastkv``) and ``memory_state.cpp``
(``VariableStateKVcache``); reproduced byte-exactly on this machine.

* after a P-token prefill ``cap = 2P``; whenever ``L0 + L1 > cap``,
  ``cap = 2 (L0 + L1)``: reallocations at ``L = 2^k (P+1) - 1``;
* per layer, one after another: allocate the new K, V (+ scale/zero-point)
  buffers, copy the past, free the old ones at once;
* ``reset_state()`` frees nothing; a change of batch width rebuilds every layer;
* each K and V keeps an i32 beam table ``[B, cap]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import Policy, option
from simkv.errors import ConfigError


@dataclass(frozen=True)
class OpenVINOCPU(Policy):
    name = "openvino-cpu"
    summary = "CPU plugin: cap = 2 (L0 + L1) on overflow, all layers in the same step, old freed at once"
    default_precision = "u8"
    unit = "layer"

    beam_tables: int = option(1, "i32 beam tables [B, cap] per K and per V primitive")
    growth: int = option(2, "capacity multiplier on overflow (the plugin uses 2)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.growth < 1:
            raise ConfigError(f"growth must be >= 1, got {self.growth}")

    def capacity(self, needed, prim):
        return self.growth * needed

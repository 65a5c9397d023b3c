"""OpenVINO validation of simkv: observe what the real CPU plugin allocates for its KV cache.

Modules (imported explicitly, so ``import simkv`` never pulls in OpenVINO or memray):

* :mod:`simkv.validate.ovmodel` -- build an optimum-style stateful decoder (or load an
  IR), compile it on CPU with precision hints, and check in the runtime model that every
  layer's KV cache is a fused stateful SDPA (read the effective KV precision there).
* :mod:`simkv.validate.observe` -- run a scenario (prefill, decode, chat turn, reset,
  beam fork / reorder / select) and return every allocation and free with its step,
  kind (K/V data, scale, beam table) and layer, plus RSS/VmSize/VmHWM/latency per step.
* :mod:`simkv.validate.kvclassify` -- the call-site classifier behind ``observe``.
* :mod:`simkv.validate.memtrace` -- memray recording with in-stream step markers.

What the plugin does (formulas, event order, deviations from DESIGN.md) is written up
in the facts report produced with these modules.
"""

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
* :mod:`simkv.validate.runner` -- ``simkv validate``: the memray run, a clean run in a
  subprocess with ``MALLOC_MMAP_THRESHOLD_``, the ``openvino-cpu`` prediction, the comparison.
* :mod:`simkv.validate.compare` -- event alignment (matched / missing / unexpected), resident
  slope, in-step peak, VmSize and latency comparison; pure numpy, no OpenVINO.
* :mod:`simkv.validate.report` -- plotly figures and the HTML report from the JSON result.
* :mod:`simkv.validate.genai` -- ``simkv validate --paged``: OpenVINO GenAI continuous batching vs the
  paged serving model, step by step (:mod:`.genai_model` model directory, :mod:`.genai_real` the real
  pipeline and its pool allocations, :mod:`.genai_report` the report).

What the plugin does (formulas, event order, memory signals) is written up in
docs/DESIGN.md §3; ``compare`` and ``report`` import neither OpenVINO nor memray.
"""

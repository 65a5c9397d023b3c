"""``simkv validate`` on the OpenVINO CPU plugin (stateful models), and ``simkv calibrate``.

Lowest first (each module imports only those above it):

* :mod:`.toy` -- the toy decoder's shape, as the plugin runs it and as the cost model prices it (no OpenVINO).
* :mod:`.ovmodel` -- build an optimum-style stateful decoder (or load an IR), compile it on CPU with
  precision hints, and check in the runtime model that every layer's KV cache is a fused stateful SDPA
  (read the effective KV precision there); the plugin's default inference precision.
* :mod:`.irspec` -- the model an IR keeps per layer (KV pairs, a hybrid's linear-attention states,
  windows from its ``config.json``): what ``--ir`` simulates.
* :mod:`.kvclassify` -- the call-site classifier behind ``observe``.
* :mod:`.statebufs` -- finds a hybrid model's state buffers by content and follows them back.
* :mod:`.observe` -- run a scenario (prefill, decode, chat turn, reset, beam fork / reorder / select)
  and return every allocation and free with its step, kind (K/V data, scale, beam table) and layer,
  plus RSS/VmSize/VmHWM/latency per step.
* :mod:`.cleanrun` -- what one run is (``ValidateConfig``, the compiled model, the observer's scenario)
  and the clean run: untracked, in a child process with ``MALLOC_MMAP_THRESHOLD_``.
* :mod:`.latency` -- the cost model's step times vs the clean run's.
* :mod:`.runner` -- ``simkv validate``: the memray run, the clean run, the ``openvino-cpu`` prediction,
  the comparison.
* :mod:`.calibrate` -- ``simkv calibrate``: measure this host on the toy decoders, write the ``host``
  device preset.

What the plugin does is written up in docs/DESIGN.md §3.
"""

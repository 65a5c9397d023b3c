"""OpenVINO GPU plugin: staggered additive headroom per kv_cache primitive.

Read in openvinotoolkit/openvino ``src/plugins/intel_gpu/`` as stored in the code index
(``graph/kv_cache.cpp`` at 5d057bd5, ``runtime/shape_predictor.cpp`` at 473faca3,
``plugin/transformations/kv_cache_compression.cpp`` at 6dc130de, ``graph/impls/ocl/kv_cache.cpp``
at cbce71b6, ``graph/primitive_inst.cpp`` in its newest stored version — 148,739 characters, the
index gives no commit; the older 6143f1e3 still sizes a single output; no Intel GPU
here to run them). docs/DESIGN.md §2 has the whole reading; the mechanics shared with ``fixed``
(old buffer freed next inference, reset, beam tables, the 90 % check) are in
:class:`policies.mechanics.GPUMechanics`.

* Headroom: ``kv_cache_inst::get_prealloc_iter_num()`` (``graph/kv_cache.cpp``) returns
  ``128 + kv_cache_id % 64`` — the *stagger*, so that primitives do not all reallocate on
  the same step.
* Primitive ids: the ``kv_cache_inst`` constructor sets ``kv_cache_id =
  network.get_kv_cache_ids().size()``, and ``network::allocate_primitive_instance`` appends
  each kv_cache node as ``network::allocate_primitives`` walks ``program::get_allocating_order()``
  (dynamic nodes keep the program's processing order). So ids count from 0 *per network*:
  a second model or stream compiled alongside has its own network and does not shift them.
  Which of a layer's K and V comes first is the processing order, not readable without a
  GPU run: K first is assumed (``kv_order``); ``id_offset`` shifts every id for what-ifs
  (another build, a graph with extra kv_cache nodes first).
* Size of a new buffer: ``primitive_inst::update_shape`` keeps the previous output
  padding (``padding::max`` of the old and new layouts); ``do_runtime_in_place_kv_cache``
  shrinks it by the new tokens when they fit, else leaves it; ``realloc_if_needed`` turns
  the padded dims into the shape (``update_padding``) and ``ShapePredictor::
  predict_preallocation_shape`` adds the headroom on the sequence axis. So a buffer rebuilt
  with ``p`` tokens of room left gets ``L0 + L1 + p + P_id``; the engines pass
  ``needed + p`` to :meth:`capacity` (``carry_padding``). ``update_paddings`` resets the
  padding while the variable is not set (first inference, after a reset): ``p = 0`` there.
* When ``ShapePredictor::can_preallocate`` refuses, the buffer is the padded size
  ``L0 + L1 + p`` (no ``P_id``).
* Reclaim: ``realloc_if_needed`` drops a buffer when ``(padded + P_id) × 10`` is below its
  size; with the padding counted this only happens right after a reset (``reset=keep``).
* Quantised KV: ``KVCacheCompressionMatcher`` compresses to i8 only, asymmetric, with
  scale and zero point interleaved in one buffer ``[B, H, cap, 2]`` of the query's type —
  the inference precision: 4 B per token per head at f16, 8 B at f32
  (``inference_precision``). A u4 cache on GPU (2026.2+, inner dimension halved) is not in
  the sources read: it is taken as u4 data with the same interleaved scale/zero point,
  unverified. u8 is not a GPU KV type in these sources; simkv sizes it like i8.
* Default KV precision: f16 here, as on a device with systolic arrays (XMX) or for a model whose
  runtime options ask for f16. optimum-intel writes ``KV_CACHE_PRECISION=f16`` into exported
  models but removes it when it compresses the weights (``_remove_f16_kv_cache_precision_flag``),
  which it does by default from 10^9 parameters; the plugin's own default on a device without
  systolic arrays is then i8 (``--precision i8``).
* A trim (``trim:N``, ``trim_rule = "reset_room"``; GenAI's ``utils::trim_kv_cache`` calls ``set_state``
  with the first ``L'`` tokens): ``VariableState::set_state`` (``plugin/variable_state.cpp``, 08fa3d99)
  sets the layout's padding to zero and its shape to ``L'``; ``update_device_buffer`` allocates only
  when the buffer it has is smaller (``actual_size < bytes_count``), so the device buffer is kept and
  reinterpreted, and the tensor is copied into it (``convert_and_copy``). No device memory moves; with
  the padding gone, the next append cannot be in place (``L1 <= p`` fails at ``p = 0``) and rebuilds
  at ``L' + L1 + P_id``. ``get_state`` and GenAI's cut tensor are host tensors (``create_host_tensor``),
  freed within the trim: not device memory, not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.base import option
from policies.mechanics import GPUMechanics
from simkv.errors import ConfigError

KV_ORDERS = ("kv", "vk")
INFERENCE_PRECISIONS = {"f16": 2, "f32": 4}  # bytes of one scale or zero point


@dataclass(frozen=True)
class OpenVINOGPU(GPUMechanics):
    name = "openvino-gpu"
    summary = "GPU plugin: cap = L + room left + 128 + id % 64 per primitive (staggered), old freed next inference"
    default_precision = "f16"
    trim_rule = "reset_room"  # VariableState::set_state resets the padding (docstring, "A trim")

    headroom_base: int = option(128, "tokens of headroom every primitive gets")
    stagger: int = option(64, "headroom modulus: primitive id adds id % stagger tokens (1 = no stagger)")
    reclaim_factor: int = option(10, "rebuild a buffer when (needed + room + headroom) x factor < capacity (0 = never)")
    id_offset: int = option(0, "first kv_cache id (0: ids count per network from K0; shift for what-ifs)")
    kv_order: str = option("kv", "which primitive of a layer gets the lower id: kv (K0=0, V0=1, ...) | vk")
    inference_precision: str = option("f16", "inference precision: type of i8/u4 scales and zero points (f16 | f32)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.headroom_base < 0 or self.stagger < 1:
            raise ConfigError("headroom_base must be >= 0 and stagger >= 1")
        if self.reclaim_factor < 0:
            raise ConfigError("reclaim_factor must be >= 0")
        if self.id_offset < 0:
            raise ConfigError(f"id_offset must be >= 0, got {self.id_offset}")
        if self.kv_order not in KV_ORDERS:
            raise ConfigError(f"kv_order must be kv or vk, got {self.kv_order!r}")
        if self.inference_precision not in INFERENCE_PRECISIONS:
            raise ConfigError(f"inference_precision must be f16 or f32, got {self.inference_precision!r}")

    def kv_cache_id(self, prim: np.ndarray) -> np.ndarray:
        """The plugin's kv_cache_id of simkv's primitive index (K0=0, V0=1, K1=2, …)."""
        prim = np.asarray(prim)
        return self.id_offset + (prim ^ 1 if self.kv_order == "vk" else prim)

    def headroom(self, prim: np.ndarray) -> np.ndarray:
        return self.headroom_base + self.kv_cache_id(prim) % self.stagger

    def capacity(self, needed, prim):
        return needed + self.headroom(prim)

    def reclaim(self, needed, prim, capacity):
        if not self.reclaim_factor:
            return super().reclaim(needed, prim, capacity)
        return (needed + self.headroom(prim)) * self.reclaim_factor < capacity

    def meta_bytes_per_head(self, precision) -> int:
        if precision.name in ("i8", "u8", "u4"):  # (scale, zero point) interleaved, in the inference precision
            return 2 * INFERENCE_PRECISIONS[self.inference_precision]
        return precision.meta_bytes_per_head

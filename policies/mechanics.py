"""Runtime mechanics shared by several policies: how a runtime orders, frees and sizes.

A policy's capacity rule says *how big*; these base classes say *how* the
OpenVINO plugins (re)allocate around it, so that another rule can be tried
under the same mechanics (``fixed`` is the GPU plugin without stagger,
``geometric`` the CPU plugin with another ratio).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from policies.base import Policy, option
from simkv.errors import ConfigError

_HELP = {f.name: f.metadata["help"] for f in fields(Policy)}
#: Bytes per element of a linear-attention state in each precision a plugin computes in.
STATE_PRECISIONS = {"bf16": 2, "f16": 2, "f32": 4}


@dataclass(frozen=True)
class GPUMechanics(Policy):
    """The OpenVINO GPU plugin (docs/DESIGN.md §2), read in ``src/plugins/intel_gpu/`` (files
    and commits in :mod:`policies.openvino_gpu`). K and V are separate kv_cache primitives.

    * Old buffer: stays referenced by the ReadValue and is released at the next inference
      (``kv_cache_inst::get_prealloc_iter_num`` comment, ``graph/kv_cache.cpp``):
      ``free_old=next_inference``. simkv frees them at the start of that inference; the plugin
      drops each when its layer's ReadValue runs (the same if ReadValues run first).
    * Reset: ``VariableState::reset`` (``plugin/variable_state.cpp``) calls
      ``release_variable()`` on its primitives in current builds (PR #32916): ``reset=free``;
      older builds only cleared ``m_is_set`` and kept the buffers (``reset=keep``, #28361).
    * Device memory is resident once allocated (``first_touch=False``).
    * Padding carried into a rebuilt buffer (``carry_padding``): see :mod:`policies.openvino_gpu`.
    * Headroom limit: ``ShapePredictor::can_preallocate`` (``runtime/shape_predictor.cpp``) is
      asked per output buffer of the primitive (data, scales): no headroom if the buffer alone
      is over the device's max single allocation, else headroom while all usm_device memory in
      use (KV, weights, other models: ``Scenario.weights_memory``) + the buffer < 90 % of global
      memory. simkv checks the data buffer (``headroom_buffer = "data"``) and sizes the unit's
      scale buffer with it: the plugin checks the scales separately, which differs only within
      one scale buffer of the 90 % line. Beam tables are not checked.
    * Max single allocation: ``ocl_engine::check_allocatable`` throws "Exceeded max size of
      memory object allocation" for a larger buffer (unless large allocations are enabled:
      ``max_alloc_bytes=0``). Default 4 GiB − 8 KiB, the value a Core Ultra iGPU reports
      (4,294,959,104 B in that error message); the throw ends the run like out of memory.
    * Beam tables (``impls/ocl/kv_cache.cpp``, ``kv_cache_impl::execute_impl``), owned by the
      kernel object (``kernel_beam_tables``): updated only when the present batch is > 1 or
      the past is empty (first inference, after a reset); then prev and new are swapped and
      new is regrown when its element count < B × L, to ``[B, L + P_id]`` (prev too the first
      time); the replaced table is freed at once. Greedy batch-1 decoding keeps the two
      prompt-sized tables forever; they survive ``reset`` (the kernel keeps them).
    * Linear-attention states (read in source, not run; docs/DESIGN.md §4c): a conv or recurrent state
      is a plain ReadValue/Assign variable, not a kv_cache: one ``ov::intel_gpu::VariableState``
      (``plugin/variable_state.cpp``) with **one** device buffer, allocated by
      ``update_device_buffer()`` only when the layout outgrows it (``actual_size <
      m_layout.bytes_count()``; ``predict_shape`` adds nothing to a shape that does not grow) and
      reinterpreted otherwise. ``primitive_inst::update_shape`` sets the layout from the read_value
      (its initializer's shape until the state is set); the Assign's cpu impl copies its input into
      that buffer (``impls/cpu/assign.cpp``, ``copy_from``), and the fused ``causal_conv1d`` /
      ``fused_conv`` kernels write the new conv state straight into it
      (``impls/ocl_v2/causal_conv1d_ref.cpp``, ``fused_conv_ref.cpp``: ``args.outputs[1] =
      variable.get_memory()``). So: one buffer per state, in the plugin's inference precision
      (``state_element_bytes``: f16 unless ``inference_precision`` says f32), grown only when the
      batch grows, never shrunk — simkv's state unit. ``VariableState::reset()`` sets the initial
      (dynamic) layout, whose ``update_device_buffer`` drops the buffer (``m_memory.reset()``):
      released by a reset like the KV (``reset=free``), allocated again by the next prompt.
    """

    headroom_buffer = "data"
    kernel_beam_tables = True
    mla_form = "decompressed"  # OpenVINO has no latent cache: optimum-intel exports per-head K and V (DESIGN §4c)
    mla_compute = "decompressed"

    free_old: str = option("next_inference", _HELP["free_old"])
    reset: str = option("free", _HELP["reset"])
    first_touch: bool = option(False, _HELP["first_touch"])
    beam_tables: int = option(2, _HELP["beam_tables"])
    headroom_limit: float = option(0.9, _HELP["headroom_limit"])
    max_alloc_bytes: int = option(4 * 2**30 - 8 * 2**10, _HELP["max_alloc_bytes"])
    carry_padding: bool = option(True, _HELP["carry_padding"])

    def state_element_bytes(self, precision) -> tuple[float, float]:
        """Both states in the inference precision (f16 on GPU unless a policy says f32; class docstring)."""
        size = float(STATE_PRECISIONS[getattr(self, "inference_precision", "f16")])
        return size, size


@dataclass(frozen=True)
class CPUMechanics(Policy):
    """The OpenVINO CPU plugin (docs/DESIGN.md §3), as observed allocation by allocation.

    One fused SDPA node per layer owns K and V (a *layer* unit): data, u8/u4
    scale/zero-point buffers and an i32 beam table each. Per layer, in order
    (``gatherConcatPastkv`` → ``updateBeamTable`` → ``updatePastkv``): beam
    tables replaced first, then data and scales, old freed at once (scales
    K then V, then data V then K). A batch change goes through
    ``resetBeamTablePastkv``: data and scales first, beam tables last. After
    ``reset_state()`` (which frees nothing) the next prompt reuses the buffers
    when its rows (tokens × beams) fit, whatever its batch; when it must grow,
    each pair is replaced before the next is allocated. One model-wide f32
    ``[B, H, L0, S]`` block backs the fused node's past inputs: grow-only,
    exact size, allocated then the old freed before layer 0; never written.

    ``resident`` (first touch, released on free) assumes every buffer is its own
    mapping, as glibc does for large ones: measured RSS then follows it within
    0.04 % (Llama-3-8B shape). Small scale buffers and beam tables land in
    glibc's heap, where writes to recycled memory and frees do not move RSS, so
    on small models measured RSS drifts from it (docs/results/validation.md).

    Linear-attention states (measured, a tiny optimum-intel Qwen3-Next export, openvino 2026.4.1;
    docs/DESIGN.md §4c): each conv and recurrent state is a plain ReadValue/Assign variable, not
    fused into anything that owns it (``VariableStateDoubleBuffer``, ``memory_state.cpp``; made by
    ``MemoryInput::makeState``, ``nodes/memory.cpp``). Its element type is the plugin's *inference*
    precision for both states — bf16 here, f32 under ``INFERENCE_PRECISION_HINT=f32`` — whatever the
    KV precision (``state_precision``; transformers keeps the recurrent state in f32). It holds **two**
    buffers (the ReadValue reads one, the Assign writes the other; ``commit`` swaps them), each
    ``B × state bytes``, allocated in the first inference, grown only when the batch grows (the
    written buffer in that inference, the other in the next one), never shrunk, kept by
    ``reset_state()``. ``openvino-cpu`` models the two buffers (``double_buffered_states``; the rule and
    its sources: :class:`policies.openvino_cpu.OpenVINOCPU`); a policy over these mechanics that does not
    set it (``geometric``) keeps simkv's plain state unit, one buffer per state rebuilt at a batch change.
    """

    unit = "layer"
    mla_form = "decompressed"  # OpenVINO has no latent cache: optimum-intel exports per-head K and V (DESIGN §4c)
    mla_compute = "decompressed"
    row_orders = {
        "grow": "+k_beam +v_beam =k_beam =v_beam -v_beam -k_beam "
        "+k +v +k_scale +v_scale =k =v =k_scale =v_scale -k_scale -v_scale -v -k",
        "grow_empty": "+k_beam +v_beam -k_beam -v_beam +k +v -k -v +k_scale +v_scale -k_scale -v_scale "
        "=k_beam =v_beam =k =v =k_scale =v_scale",
        "rebatch": "+k +v +k_scale +v_scale =k =v =k_scale =v_scale -k_scale -v_scale -v -k "
        "+k_beam +v_beam =k_beam =v_beam -v_beam -k_beam",
    }

    beam_tables: int = option(1, _HELP["beam_tables"])
    reset_adopts_batch: bool = option(True, _HELP["reset_adopts_batch"])
    past_view: bool = option(True, _HELP["past_view"])
    state_precision: str = option("bf16", "element type of linear-attention states (conv and recurrent): the "
                                  "plugin's inference precision, bf16 with AVX512-BF16/AMX, else f32 (bf16 | f16 | f32)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.state_precision not in STATE_PRECISIONS:
            raise ConfigError(f"state_precision must be one of {', '.join(STATE_PRECISIONS)}, got {self.state_precision!r}")

    def state_element_bytes(self, precision) -> tuple[float, float]:
        """Both states in the inference precision, whatever the KV precision (class docstring)."""
        size = float(STATE_PRECISIONS[self.state_precision])
        return size, size

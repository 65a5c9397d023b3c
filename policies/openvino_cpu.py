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
  model's linear-attention states are plain variables in the inference precision
  (``state_precision``; :class:`policies.mechanics.CPUMechanics`, docs/DESIGN.md §4c), each with
  two buffers (``double_buffered_states``, below).

Linear-attention states, double-buffered. Source (openvinotoolkit/openvino, code index):
``src/plugins/intel_cpu/src/nodes/memory.cpp``: ``MemoryInput::makeState`` gives each ReadValue/Assign
pair a ``VariableStateDoubleBuffer`` made of two ``Memory`` objects;
``src/plugins/intel_cpu/src/memory_state.cpp``: ``VariableStateDoubleBuffer`` — ``input_mem()`` (the
"prime" buffer, read) and ``output_mem()`` (the "second", written), ``commit_impl()`` swaps them
(``buffer_num ^= 0x01``) after each inference, ``reset_impl()`` only redefines both to an empty shape
(a memory block grows, never shrinks: nothing freed). In ``nodes/memory.cpp``, ``MemoryInputBase::execute``
first hands the write buffer to the Assign (``MemoryOutput::assignExtMemory`` →
``ProxyMemoryBlock::setMemBlockResize``, ``proxy_mem_blk.cpp``: resized to the size last written through
that edge), then ``MemoryInput::runDynamic`` reads the state, resizing the read buffer only when the state
was reset (the initializer's shape); the node that produces the Assign's input writes the new state into the
write buffer at this inference's shape. Measured (openvino 2026.4.1 CPU, memray, tiny Qwen3-Next exports of
4 and 8 layers, ``simkv validate --ir``; docs/DESIGN.md §4c), per state place, read buffer R, write buffer W:

* read phase, before the past block and any layer, state places in layer order (conv, then recurrent):
  W grows to the rows of the previous inference, and, in the first inference (or the first after a reset),
  R to this inference's rows;
* write phase: W grows to this inference's rows — the recurrent state's with its layer (the GatedDeltaNet
  node writes it in place), the conv state's after the last layer, in descending layer order
  (``state_writes``; the order the export's graph executes them in: another graph may order them
  differently, e.g. simkv's toy writes all of them right after the read phase; LFM2's export, whose conv
  layers keep a conv state alone, writes them as Qwen3-Next's: after the last layer, descending — measured,
  84/84 events);
* a buffer grows by a new buffer of exactly the rows needed, then the old one freed; it never shrinks
  (``MemoryBlockWithReuse::resize``, ``src/plugins/intel_cpu/src/cpu_memory.cpp``: a new block only when the
  size exceeds the one it has, which replaces — frees — the old); then R and W swap.

So: both buffers in the first inference (R then, with its layer, W), nothing while decoding, a batch growth
replaces W in its inference and the other buffer at the start of the next one, and a select, a smaller batch,
``reset_state()`` or a prompt that fits allocate nothing.

A trim (``trim:N``; ``trim_rule = "rebuild"``). GenAI's ``utils::trim_kv_cache`` (openvino.genai da1db864,
``src/cpp/src/utils.cpp``) loops over ``request.query_state()``: ``get_state()``, an ROI of the first ``L'``
tokens, a new ``ov::Tensor`` of that shape, ``copy_to``, ``set_state``. In the plugin
(``src/plugins/intel_cpu/src/memory_state.cpp``, ``VariableStateKVcache``): ``get_state`` returns a new
tensor of the whole history (``L0`` tokens) in the state's external type (dequantised from u8/u4);
``set_state_impl`` keeps the tensor it is given (``m_state = state``, "to extend the lifetime": the one it
kept before is freed), allocates a dense internal buffer of exactly ``L'`` tokens (``m_internal_mem``; the
old one freed by the assignment), re-quantises into it, leaves the scale/zero-point buffer at its capacity
(``PlainTensor::resize`` reallocates only to grow), and allocates a new beam table ``[B, L']``. Measured with
memray (openvino 2026.4.1, ``simkv validate --ops prefill:64,decode:40,trim:20,prefill:16,decode:10``;
docs/DESIGN.md §3), per state ``+read-back(L0) +kept(L') [-kept(previous)] +data(L') -data -beam... -read-back``
in the order ``query_state`` returns them — last layer first, V before K — and the next inference that
appends grows from the exact ``L'`` as any overflow does (``2 (L' + L1)``), freeing the old scales at their
own capacity. The kept f32 copy outlives ``reset_state()`` (``reset_impl`` does nothing) until the next trim.
``set_state`` on a u4 cache kills the process (SIGSEGV, or glibc's "malloc assertion failure in
_int_malloc"; measured, openvino 2026.4.1: ``get_state`` works, ``set_state_impl`` quantises only u8 and
loads anything else as is): a trim of a u4 cache is refused. The order of the states is the plugin's:
last layer first, V before K, measured for up to 5 attention layers (10 states); with more, ``query_state``
returns them in the order of the plugin's hash map of state names, which simkv does not reproduce
(``simkv validate`` then compares a trim's events state by state).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from policies.base import option
from policies.mechanics import CPUMechanics
from simkv.errors import ConfigError, PolicyError


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
    double_buffered_states = True
    state_writes = {"conv_state": "end", "recurrent_state": "unit"}
    trim_rule = "rebuild"  # VariableStateKVcache::set_state_impl (class docstring, "A trim")

    growth: float = option(2.0, "capacity multiplier on overflow, a ratio >= 1 (the plugin uses 2)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.growth >= 1:
            raise ConfigError(f"growth must be >= 1, got {self.growth}")

    def check_trim(self, model, precision) -> None:
        super().check_trim(model, precision)
        if precision.name == "u4":
            raise PolicyError("openvino-cpu: set_state on a u4 KV cache crashes the plugin (SIGSEGV, openvino "
                              "2026.4.1: set_state_impl quantises only u8); a trim needs another --precision")

    def capacity(self, needed, prim):
        # ceil(growth x needed) in exact rational arithmetic (growth 2: exactly 2 x needed).
        r = Fraction(str(self.growth))
        return -((-np.asarray(needed, dtype=np.int64) * r.numerator) // r.denominator)

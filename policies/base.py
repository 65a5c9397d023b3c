"""The policy interface: one small class per allocation rule.

A policy answers one question — *how many tokens of capacity does a buffer
get when it must be (re)allocated* — through :meth:`Policy.capacity`, and a
few optional hooks. Everything else (copying, freeing, ledger rows) is done
by the engine, steered by the *mechanics* options every policy carries:

``free_old``
    when a replaced buffer is released: ``immediate`` (right after its copy,
    CPU plugin), ``end_of_step`` (after the whole inference: stateless
    concat, both caches alive for the step) or ``next_inference`` (the GPU
    plugin's ReadValue keeps it until the next inference).
``reset``
    ``keep`` (capacity survives ``reset_state()``) or ``free``.
``first_touch``
    memory is resident only once written (host RAM); otherwise resident =
    allocated (device memory).
``beam_tables``
    i32 beam tables ``[B, cap]`` each K and each V primitive keeps.
``headroom_limit``
    no headroom for an allocation that would bring the device (KV cache, other
    buffers and ``Scenario.weights_memory``) to this share of its memory (GPU
    plugin: 0.9): it gets exactly the tokens it needs. 0 = off. What is checked
    is the whole unit, or only its data buffer (:attr:`Policy.headroom_buffer`).
``max_alloc_bytes``
    a buffer larger than this gets no headroom either, and a buffer that is still
    larger at its exact size cannot be allocated: the run stops as out of memory
    (the GPU plugin throws "Exceeded max size of memory object allocation"). 0 = no limit.
``carry_padding``
    a buffer rebuilt while it still had room keeps that room on top of the new
    size: the policy sizes ``needed + room left`` (GPU plugin: padding is carried
    into the reallocation).
``reset_adopts_batch``
    capacity is a budget of rows (tokens × beams) and the first inference after
    a reset takes its batch without a rebuild when it fits (CPU plugin).
``beam_gather``
    a step with a ``beam_idx`` (fork, reorder, select) first gathers every layer's
    buffers into new ones at the new batch (Hugging Face ``reorder_cache``:
    ``index_select``, old freed at once), then runs the inference.
``past_view``
    the runtime keeps one model-wide f32 ``[B, H_kv, L0, S]`` block, grown to
    the exact size before each inference that needs more (CPU plugin).

A *trim* (workload ``trim:N``: GenAI's stateful chat cutting the cache back to the part of
the history that still matches, ``utils::trim_kv_cache``) does what :attr:`Policy.trim_rule`
says: nothing at all (``keep``), an exact-size rebuild of every K and V state (``rebuild``,
the CPU plugin's ``set_state``), or nothing until the next append, which then rebuilds with
no room carried (``reset_room``, the GPU plugin's ``set_state`` resets the padding).

A linear-attention state is a unit of one buffer per state place (conv, recurrent),
rebuilt like any unit, unless the policy says :attr:`Policy.double_buffered_states`:
then each state place has two buffers, sized outside the units by their own rule
(:mod:`simkv.engine.state_buffers`).

The order of a unit's rows within a step follows :attr:`Policy.row_orders`
when a policy sets it (templates like ``"+k +v =k =v -v -k"``: ``+`` alloc,
``=`` copy, ``-`` free), else allocs, copies, frees, each in slot order.

Policies are frozen dataclasses: their fields are the parameters a user can
override with ``--policy-opt key=value``; each field's ``metadata["help"]``
documents it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from simkv.errors import ConfigError

if TYPE_CHECKING:
    from simkv.kvspec import LayerKV
    from simkv.models import ModelSpec
    from simkv.precision import Precision
    from simkv.workload import Workload

FREE_TIMINGS = ("immediate", "end_of_step", "next_inference")
RESET_MODES = ("keep", "free")


def option(default, help: str):
    """A policy parameter with its documentation."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Policy:
    #: Registry name (``--policy``).
    name: ClassVar[str]
    #: One line for ``simkv policies``.
    summary: ClassVar[str]
    #: Which KV precision the runtime picks when none is asked for.
    default_precision: ClassVar[str] = "f16"
    #: KV precisions the real runtime accepts (None: any); others are refused.
    accepted_precisions: ClassVar[tuple[str, ...] | None] = None
    #: ``layer``: K and V of a layer are (re)allocated together, rows grouped per
    #: layer (CPU plugin's fused SDPA node). ``primitive``: K and V are separate
    #: primitives with their own capacity (GPU plugin's kv_cache primitives).
    unit: ClassVar[str] = "primitive"
    #: Row order of a unit per situation: ``grow`` (also first allocation and reclaim),
    #: ``grow_empty`` (buffers kept across a reset, nothing stored), ``rebatch``
    #: (batch width changed), ``gather`` (``beam_gather``). ``None`` or a missing key: allocs, copies, frees.
    row_orders: ClassVar[dict[str, str] | None] = None
    #: What the headroom limits look at: ``unit`` (all of a unit's buffers together) or
    #: ``data`` (the K or V data buffer alone, as the GPU plugin checks each buffer).
    headroom_buffer: ClassVar[str] = "unit"
    #: Beam tables owned by the attention kernel (GPU plugin): not slots of a unit but a
    #: prev/new pair per primitive, updated only while beams > 1 or on an empty cache
    #: (see :mod:`policies.mechanics`). False: ``beam_tables`` slots inside each unit.
    kernel_beam_tables: ClassVar[bool] = False
    #: Nothing is kept between steps: each step recomputes the whole history into buffers
    #: of exactly its size (no copy) and frees them all at the end of the step (policies/stateless.py).
    stateless: ClassVar[bool] = False
    #: How the runtime caches an MLA layer (simkv.kvspec.MLA_FORMS): the compressed ``latent``
    #: (transformers 5.x, vLLM) or ``decompressed`` per-head K and V (an optimum-intel export).
    mla_form: ClassVar[str] = "latent"
    #: How its attention computes over an MLA cache, for the cost model (simkv.cost.MLA_COMPUTE): ``latent``
    #: (vLLM absorbs the up-projections for one-token queries), ``latent-expand`` (transformers 5.x
    #: decompresses every cached token each step), ``decompressed``.
    mla_compute: ClassVar[str] = "latent"
    #: The cache is kept in the model's own dtype (transformers: the tensors the layers compute): with no
    #: precision asked for, a model whose config names its dtype runs in it (ModelSpec.dtype), else
    #: :attr:`default_precision`.
    kv_in_model_dtype: ClassVar[bool] = False
    #: A reset under ``reset="free"`` keeps linear-attention states (zeroed in place, as transformers'
    #: ``LinearAttentionCacheLayerMixin.reset`` does) instead of freeing them with the KV buffers.
    reset_keeps_states: ClassVar[bool] = False
    #: Each linear-attention state place (conv, recurrent) has *two* buffers, one read and one written per
    #: inference and swapped after it (the OpenVINO CPU plugin's ``VariableStateDoubleBuffer``), sized by
    #: their own rule instead of a state unit's (:mod:`simkv.engine.state_buffers`): grown only, to the rows
    #: of the previous inference when read and to this inference's rows when written; never shrunk; a
    #: replaced buffer is freed at once whatever :attr:`free_old` says; a reset keeps them unless ``reset="free"``.
    double_buffered_states: ClassVar[bool] = False
    #: With :attr:`double_buffered_states`, where in a step a state's write buffer grows, per state tensor:
    #: ``unit`` (at its layer's unit, among the units' rows) or ``end`` (after the last unit, in descending
    #: layer order). A tensor not named: ``unit``.
    state_writes: ClassVar[dict[str, str]] = {}
    #: What a trim (``set_state`` with the history cut to its first ``L'`` tokens; workload ``trim:N``)
    #: does to the buffers. ``keep``: nothing is allocated or freed, the buffers hold fewer tokens
    #: (transformers' ``DynamicLayer.crop`` keeps a view, NPUW lowers ``num_stored_tokens``, a static
    #: cache is only written further). ``rebuild``: each K and V state, last layer first and V before
    #: K, gets its history read back (a copy of ``L0`` tokens in :attr:`trim_io_bytes` per element),
    #: a copy of the kept ``L'`` tokens that the state then keeps (the previous one freed), new data
    #: and beam-table buffers of exactly ``L'`` (the old freed; scale buffers kept as they are), then
    #: the read-back freed (the CPU plugin, policies/openvino_cpu.py). ``reset_room``: nothing now,
    #: and the next inference rebuilds every unit with no room carried (the GPU plugin,
    #: policies/openvino_gpu.py). ``refuse``: the runtime cannot crop this cache.
    trim_rule: ClassVar[str] = "keep"
    #: With ``trim_rule = "rebuild"``: bytes per element of the tensors a trim reads back and sets
    #: (``get_state`` / ``set_state``: the model's state variable type).
    trim_io_bytes: ClassVar[int] = 4
    #: The NPU pipeline (policies/openvino_npu.py): besides the units (its generate model's past KV) the engines
    #: book its models' present outputs, the prefill-to-generate copy and the prefix-cache blocks, as the
    #: policy's ``plan(workload)`` says step by step (:mod:`simkv.engine.npu`).
    npu_pipeline: ClassVar[bool] = False

    free_old: str = option("immediate", "when a replaced buffer is freed: " + " | ".join(FREE_TIMINGS))
    reset: str = option("keep", "what reset_state() does to KV buffers: keep | free")
    first_touch: bool = option(True, "host memory: resident only once written (else resident = allocated)")
    beam_tables: int = option(0, "i32 beam tables [B, cap] per K and per V primitive")
    headroom_limit: float = option(0.0, "no headroom once an allocation would fill this share of device memory (0 = off)")
    max_alloc_bytes: int = option(0, "largest single buffer: no headroom above it, out of memory if still above at exact size (0 = no limit)")
    reset_adopts_batch: bool = option(False, "after reset_state(), the next prompt's batch reuses buffers whose rows fit")
    past_view: bool = option(False, "one model-wide f32 [B, H_kv, L0, S] block, grown to exact size (CPU plugin)")
    carry_padding: bool = option(False, "a rebuilt buffer keeps its unused room on top of the new size (GPU plugin)")
    beam_gather: bool = option(False, "a beam_idx step first copies every layer into new buffers at the new batch (HF reorder_cache)")

    def __post_init__(self) -> None:
        if self.free_old not in FREE_TIMINGS:
            raise ConfigError(f"free_old must be one of {', '.join(FREE_TIMINGS)}, got {self.free_old!r}")
        if self.reset not in RESET_MODES:
            raise ConfigError(f"reset must be keep or free, got {self.reset!r}")
        if self.beam_tables not in (0, 1, 2):
            raise ConfigError(f"beam_tables must be 0, 1 or 2, got {self.beam_tables!r}")
        if not 0 <= self.headroom_limit <= 1:
            raise ConfigError(f"headroom_limit must be in [0, 1], got {self.headroom_limit}")
        if self.max_alloc_bytes < 0:
            raise ConfigError(f"max_alloc_bytes must be >= 0, got {self.max_alloc_bytes}")
        if self.kernel_beam_tables and self.beam_tables == 1:
            raise ConfigError("this runtime keeps beam tables in pairs (prev and new): beam_tables must be 0 or 2")

    # -- hooks -------------------------------------------------------------

    def capacity(self, needed: np.ndarray, prim: np.ndarray) -> np.ndarray:
        """Capacity in tokens for buffers that must hold ``needed`` tokens (≥ ``needed``).

        Vectorised: one entry per unit to (re)allocate; ``prim`` is the unit's
        primitive id (K0=0, V0=1, K1=2, …; the K id for a layer unit). A pure
        function of its arguments, so engines may evaluate it ahead of time.
        """
        raise NotImplementedError

    def reclaim(self, needed: np.ndarray, prim: np.ndarray, capacity: np.ndarray) -> np.ndarray:
        """Which buffers that still fit are so oversized that the runtime rebuilds them.

        Must be false right after :meth:`capacity` sized a buffer, and may not
        turn true as ``needed`` grows with the capacity unchanged (engines
        check it on the first step after each change only) — unless it is
        always true: a runtime that rebuilds every buffer every step.
        """
        return np.zeros(np.shape(needed), dtype=bool)

    def meta_bytes_per_head(self, precision: Precision) -> int:
        """Bytes of scale/zero-point metadata per token per KV head this runtime stores for a precision."""
        return precision.meta_bytes_per_head
    def kept_tokens(self, layer: LayerKV) -> int | None:
        """Tokens a layer's buffers keep between inferences (a sliding window), or None: the whole history.

        With a limit (>= 1), a step appending ``L1`` tokens needs ``min(stored, kept) + L1``. The default
        keeps everything, windows included: OpenVINO's stateful caches do (docs/DESIGN.md §4c)."""
        return None

    def ring_tokens(self, layer: LayerKV) -> int | None:
        """Tokens of the fixed *ring* buffer a layer keeps (transformers' ``StaticSlidingWindowLayer``:
        ``min(W, max_cache_len)``), or None. A ring is allocated at exactly that size whatever
        :meth:`capacity` says, keeps its last tokens, and each inference that appends to a full ring
        rebuilds it at the same size (the roll's copy: new buffers, old freed)."""
        return None

    def orders(self, layer: LayerKV) -> dict[str, str] | None:
        """The row orders (:attr:`row_orders`) for a layer of this kind."""
        return self.row_orders

    def state_element_bytes(self, precision: Precision) -> tuple[float, float]:
        """Bytes per element of a linear-attention layer's conv and recurrent state. transformers keeps
        the conv state in the model's dtype (the KV precision) and the recurrent state in f32
        (docs/DESIGN.md §3c); a quantised KV precision does not quantise states (its conv state: f16)."""
        conv = precision.bits / 8 if precision.bits >= 16 else 2.0
        return conv, 4.0

    def check(self, model: ModelSpec, workload: Workload) -> None:
        """Raise :class:`simkv.errors.PolicyError` if this policy cannot run the workload."""

    def check_trim(self, model: ModelSpec, precision: Precision) -> None:
        """Raise :class:`simkv.errors.PolicyError` if a workload with a trim cannot run on this model.

        No runtime trims a linear-attention state: GenAI resets a hybrid model's whole state and
        prefills its history again instead (``CacheState::needs_reset``, openvino.genai ``utils.hpp``),
        transformers' ``LinearAttentionLayer.crop`` needs ``activate_past_recording``. A sliding window
        that dropped tokens cannot give them back either (``DynamicSlidingWindowLayer.crop``, same)."""
        from simkv.errors import PolicyError

        if self.trim_rule == "refuse":
            raise PolicyError(f"{self.name}: this cache cannot be trimmed")
        if any(layer.kind == "linear" for layer in model.kv_layers):
            raise PolicyError(f"{self.name}: a trim of a model with linear-attention states is not modelled "
                              "(GenAI resets the whole state and prefills the history again: CacheState::needs_reset)")
        if any(layer.caches_tokens and (self.kept_tokens(layer) is not None or self.ring_tokens(layer) is not None)
               for layer in model.kv_layers):
            raise PolicyError(f"{self.name}: a sliding window that dropped tokens cannot be trimmed back "
                              "(transformers' DynamicSlidingWindowLayer.crop needs activate_past_recording)")

    # -- helpers -----------------------------------------------------------

    @classmethod
    def options(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls))

    def describe(self) -> str:
        changed = [
            f"{f.name}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        ]
        return self.name + (f" ({', '.join(changed)})" if changed else "")


def parse_value(f: dataclasses.Field, text: str):
    """Convert ``--policy-opt`` text to the field's type."""
    kind = type(f.default) if f.default is not None else int
    try:
        if kind is bool:
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        return kind(text)
    except ValueError:
        raise ConfigError(f"policy option {f.name}: {text!r} is not a valid {kind.__name__}") from None

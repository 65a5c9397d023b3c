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
    no headroom for an allocation that would bring the device to this share of
    its memory (GPU plugin: 0.9): it gets exactly the tokens it needs. 0 = off.
``max_alloc_bytes``
    a buffer larger than this gets no headroom either (0 = no limit).
``reset_adopts_batch``
    capacity is a budget of rows (tokens × beams) and the first inference after
    a reset takes its batch without a rebuild when it fits (CPU plugin).
``past_view``
    the runtime keeps one model-wide f32 ``[B, H_kv, L0, S]`` block, grown to
    the exact size before each inference that needs more (CPU plugin).

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
    from simkv.models import ModelSpec
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
    #: ``layer``: K and V of a layer are (re)allocated together, rows grouped per
    #: layer (CPU plugin's fused SDPA node). ``primitive``: K and V are separate
    #: primitives with their own capacity (GPU plugin's kv_cache primitives).
    unit: ClassVar[str] = "primitive"
    #: Row order of a unit per situation: ``grow`` (also first allocation and reclaim),
    #: ``grow_empty`` (buffers kept across a reset, nothing stored), ``rebatch``
    #: (batch width changed). ``None`` or a missing key: allocs, copies, frees.
    row_orders: ClassVar[dict[str, str] | None] = None
    #: Nothing is kept between steps: each step recomputes the whole history into buffers
    #: of exactly its size (no copy) and frees them all at the end of the step (policies/stateless.py).
    stateless: ClassVar[bool] = False

    free_old: str = option("immediate", "when a replaced buffer is freed: " + " | ".join(FREE_TIMINGS))
    reset: str = option("keep", "what reset_state() does to KV buffers: keep | free")
    first_touch: bool = option(True, "host memory: resident only once written (else resident = allocated)")
    beam_tables: int = option(0, "i32 beam tables [B, cap] per K and per V primitive")
    headroom_limit: float = option(0.0, "no headroom once an allocation would fill this share of device memory (0 = off)")
    max_alloc_bytes: int = option(0, "no headroom for a unit larger than this many bytes (0 = no limit)")
    reset_adopts_batch: bool = option(False, "after reset_state(), the next prompt's batch reuses buffers whose rows fit")
    past_view: bool = option(False, "one model-wide f32 [B, H_kv, L0, S] block, grown to exact size (CPU plugin)")

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
        check it on the first step after each change only).
        """
        return np.zeros(np.shape(needed), dtype=bool)

    def check(self, model: ModelSpec, workload: Workload) -> None:
        """Raise :class:`simkv.errors.PolicyError` if this policy cannot run the workload."""

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

"""Runtime mechanics shared by several policies: how a runtime orders, frees and sizes.

A policy's capacity rule says *how big*; these base classes say *how* the
OpenVINO plugins (re)allocate around it, so that another rule can be tried
under the same mechanics (``fixed`` is the GPU plugin without stagger,
``geometric`` the CPU plugin with another ratio).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from policies.base import Policy, option

_HELP = {f.name: f.metadata["help"] for f in fields(Policy)}


@dataclass(frozen=True)
class GPUMechanics(Policy):
    """The OpenVINO GPU plugin (docs/DESIGN.md §2): K and V are separate kv_cache
    primitives; the old buffer lives until the next inference (ReadValue still holds
    it); reset frees; device memory is resident once allocated; indirect SDPA keeps a
    prev and a new beam table per primitive; no headroom past 90 % of device memory."""

    free_old: str = option("next_inference", _HELP["free_old"])
    reset: str = option("free", _HELP["reset"])
    first_touch: bool = option(False, _HELP["first_touch"])
    beam_tables: int = option(2, _HELP["beam_tables"])
    headroom_limit: float = option(0.9, _HELP["headroom_limit"])


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
    on small models measured RSS drifts from it (README, Validation).
    """

    unit = "layer"
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

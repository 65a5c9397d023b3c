"""Tell which raw allocations of an OpenVINO CPU run hold a hybrid model's linear-attention states.

A conv or recurrent state of a linear-attention layer is a plain ReadValue/Assign variable: the CPU plugin
keeps it in a ``VariableStateDoubleBuffer`` (two buffers of ``B × state bytes``, swapped after every
inference; docs/DESIGN.md §4c). Neither its size (a recurrent state of B = 1 has the bytes of a pooled
activation) nor its call site (the buffer that grows in a batch change comes from whichever node writes it
first) names it, and the order within a step is what is being validated, so it must not be assumed. What
does name it is its **content**: after the run, the buffers still alive are read and compared with each
state's value (``query_state()``), and the run's history is walked back from them.

* :func:`identify` takes the run's records (:class:`~simkv.validate.memtrace.RawRecord`, stream order),
  the states (:class:`StateVar`) and a *matcher* that says which states a live buffer's bytes equal
  (the observer reads them with ``ctypes`` after two extra, untracked inferences: one buffer then holds
  the latest value, the other the one before).
* A buffer found that way is followed back through its **replacements**: a state grows by allocating the
  new buffer and freeing the old one right after it (the next record), so an allocation immediately
  followed by the free of a buffer from an earlier operation, whose size is a whole number of the same
  state's rows, hands its identity to that older buffer; the chain ends at the buffer's first allocation.

Pure logic on records (no OpenVINO), unit-tested on synthetic traces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..memtrace import RawRecord

__all__ = ["STATE_KINDS", "StateVar", "StateLabels", "identify", "value_signature", "buffer_signature"]

#: Event kinds of state buffers (simkv's ledger tensor names).
STATE_KINDS = ("conv_state", "recurrent_state")


@dataclass(frozen=True)
class StateVar:
    """One linear-attention state variable as the plugin runs it."""

    name: str  # the variable id
    layer: int  # model layer
    kind: str  # conv_state | recurrent_state
    row_bytes: int  # bytes of one batch row in the plugin's element type


@dataclass
class StateLabels:
    """Per record index (into the records given to :func:`identify`): ``(kind, layer)`` of state buffers."""

    labels: dict[int, tuple[str, int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    live_found: int = 0  # live buffers identified by content


def value_signature(values, precision: str) -> bytes:
    """Order-free signature of a state's value (an f32 array from ``query_state()``) as the plugin stores
    it in ``precision`` (bf16 / f16 values are exact in f32, so the conversion back is exact)."""
    import numpy as np

    a = np.ascontiguousarray(values, dtype=np.float32).ravel()
    if precision == "bf16":
        bits = (a.view(np.uint32) >> 16).astype(np.uint16)
    elif precision == "f16":
        bits = a.astype(np.float16).view(np.uint16)
    elif precision == "f32":
        bits = a.view(np.uint32)
    else:
        raise ValueError(f"states in {precision!r} are not read")
    return np.sort(bits).tobytes()


def buffer_signature(raw: bytes, precision: str) -> bytes:
    """:func:`value_signature` of raw buffer bytes in the plugin's element type (layout-free: sorted)."""
    import numpy as np

    bits = np.frombuffer(raw, dtype=np.uint32 if precision == "f32" else np.uint16)
    return np.sort(bits).tobytes()


def identify(records: Sequence[RawRecord], states: Sequence[StateVar],
             matcher: Callable[[int, int], set[str]]) -> StateLabels:
    """Label the state buffers among ``records`` (module docstring).

    ``matcher(address, size)`` returns the names of the states whose current or previous value the live
    buffer at ``address`` holds (an empty set: none). Only allocations never freed in ``records`` and
    whose size is a whole number of some state's rows are offered to it.
    """
    out = StateLabels()
    if not states:
        return out
    by_name = {s.name: s for s in states}
    rows = sorted({s.row_bytes for s in states})
    freed: dict[int, int] = {}  # alloc record index -> its free record index
    alloc_of: dict[int, int] = {}  # free record index -> alloc record index
    open_at: dict[int, int] = {}
    for i, rec in enumerate(records):
        if rec.op == "alloc":
            open_at[rec.address] = i
        else:
            j = open_at.pop(rec.address, None)
            if j is not None:
                freed[j] = i
                alloc_of[i] = j
    found: dict[str, list[int]] = {s.name: [] for s in states}
    for address, i in open_at.items():
        rec = records[i]
        if rec.allocator != "POSIX_MEMALIGN" or not any(rec.size % r == 0 for r in rows):
            continue
        names = {n for n in matcher(address, rec.size) if n in by_name and rec.size % by_name[n].row_bytes == 0}
        if len(names) > 1:
            out.warnings.append(f"buffer of {rec.size} B (op {rec.seq}) matches states {sorted(names)}")
            continue
        if names:
            found[names.pop()].append(i)
    for name, idx in found.items():
        if len(idx) != 2:
            out.warnings.append(f"state {name}: {len(idx)} live buffers hold its values (the plugin keeps 2)")
        state = by_name[name]
        for i in idx:
            out.live_found += 1
            _label_chain(records, i, state, freed, alloc_of, out)
    return out


def _label_chain(records: Sequence[RawRecord], i: int, state: StateVar, freed: dict[int, int],
                 alloc_of: dict[int, int], out: StateLabels) -> None:
    """Label allocation ``i`` and, back through its replacements, the buffers it took over."""
    label = (state.kind, state.layer)
    while True:
        if i in out.labels and out.labels[i] != label:
            out.warnings.append(f"record {i} labelled {out.labels[i]} and {label}")
            return
        out.labels[i] = label
        if i in freed:
            out.labels[freed[i]] = label
        nxt = i + 1
        if nxt >= len(records) or records[nxt].op != "free" or nxt not in alloc_of:
            return
        old = alloc_of[nxt]
        if records[old].seq >= records[i].seq or records[old].size % state.row_bytes:
            return
        i = old

"""Record allocator calls with memray and cut the stream into scenario operations.

Why memray, and how step boundaries are found
---------------------------------------------
``memray.Tracker(path, native_traces=True)`` intercepts ``malloc``/``posix_memalign``/
``free``/``mmap`` through the PLT of every loaded library, including the OpenVINO CPU
plugin, and writes each call -- requested size, address, thread, native stack id -- in
the order it happened.  It has no notion of "inference 17", so this module writes
*markers* into the same stream: right before and right after each scenario operation
the Python side allocates (and frees) a numpy buffer of a unique, absurd size
``MARKER_BASE + 2*seq`` (begin) / ``+1`` (end).  ``numpy.empty`` calls ``malloc`` with
exactly that size, so the markers sit at the precise place in the record order; no
timestamps (memray records carry none) and no thread heuristics are needed.  Anything
between an end marker and the next begin marker (building inputs, reading
/proc/self/status, the progress bar) is outside every operation and dropped.

The marker buffers are never touched, so they cost address space for a microsecond,
not RSS.  An LD_PRELOAD logger would see the same calls; it is not needed because
memray reports exact sizes and a per-call-site id (``native_stack_id``), which is all
the classifier uses (symbol names are unavailable: the plugin is stripped).
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

__all__ = ["MARKER_BASE", "RawRecord", "Recorder", "TraceSummary", "read_segments"]

#: Size of the begin marker of operation 0 (~187 MiB of untouched address space).
MARKER_BASE = 0x0BAD_0000

_ALLOC = {"MALLOC", "CALLOC", "REALLOC", "POSIX_MEMALIGN", "ALIGNED_ALLOC", "MEMALIGN", "VALLOC", "PVALLOC", "MMAP"}
_FREE = {"FREE", "MUNMAP"}


def _marker(size: int) -> None:
    buf = np.empty(size, dtype=np.uint8)  # malloc(size) recorded by memray, never touched
    del buf


class Recorder:
    """Context manager around ``memray.Tracker`` that writes operation markers.

    Use ``with rec.operation(seq): ...`` around exactly the call being observed.
    ``enabled=False`` gives the same interface without tracking (for clean latency
    and RSS, which memray's unwinding and buffers would distort).
    """

    def __init__(self, path: str | Path | None = None, enabled: bool = True, native_traces: bool = True) -> None:
        self.enabled = enabled
        self.native_traces = native_traces  # False: Python stacks only (enough for torch; much faster)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if path is None and enabled:
            self._tmp = tempfile.TemporaryDirectory(prefix="simkv_memray_")
            path = Path(self._tmp.name) / "trace.bin"
        self.path = Path(path) if path is not None else None
        self._tracker = None

    def __enter__(self) -> "Recorder":
        if self.enabled:
            import memray

            assert self.path is not None
            if self.path.exists():
                self.path.unlink()
            self._tracker = memray.Tracker(str(self.path), native_traces=self.native_traces)
            self._tracker.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._tracker is not None:
            self._tracker.__exit__(*exc)
            self._tracker = None

    @contextlib.contextmanager
    def operation(self, seq: int) -> Iterator[None]:
        if self.enabled:
            _marker(MARKER_BASE + 2 * seq)
        try:
            yield
        finally:
            if self.enabled:
                _marker(MARKER_BASE + 2 * seq + 1)

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


@dataclass(frozen=True)
class RawRecord:
    """One allocator call inside an operation, in stream order."""

    seq: int
    op: str  # "alloc" | "free"
    size: int
    address: int
    site: int  # memray native_stack_id of the allocation (frees: of their allocation), or ``site_of``'s name
    allocator: str  # memray AllocatorType name of the allocation
    thread: int


@dataclass
class TraceSummary:
    """Book-keeping of one trace read, to judge its completeness."""

    total_records: int = 0
    operations_seen: int = 0
    untracked_frees: int = 0  # frees inside operations of memory allocated elsewhere
    frees_outside: int = 0  # operation-allocated memory freed between operations
    dropped_small: int = 0  # small non-posix_memalign allocations not returned


def read_segments(
    path: str | Path, n_ops: int, keep_min_bytes: int = 0, always_keep: frozenset[str] = frozenset({"POSIX_MEMALIGN"}),
    site_of=None, keep_all_in: frozenset[int] = frozenset(),
) -> tuple[list[RawRecord], TraceSummary]:
    """Read a memray capture and return the allocator calls made inside operations.

    Frees are matched to their allocation by address (memray does not store the size
    or stack of a free); frees of memory allocated before tracking or between
    operations are counted, not returned.

    To keep long runs small (a decode step makes thousands of small Python/oneDNN
    calls), only allocations made with an allocator in ``always_keep`` (the CPU
    plugin allocates every tensor buffer with ``posix_memalign``, and the KV
    classifier needs all of them to see adjacency) or of at least ``keep_min_bytes``
    bytes are returned, with their frees.

    ``site_of(record)`` names an allocation's call site (default: memray's
    ``native_stack_id``; the transformers validator reads the Python stack instead).
    ``keep_all_in``: operations (``seq``) whose every allocation is returned, whatever its
    allocator and size (a trim's kept copy is an ``ov::Tensor``, allocated with ``malloc``).
    """
    import memray

    names = {int(a): a.name for a in memray.AllocatorType}
    reader = memray.FileReader(str(path))
    summary = TraceSummary()
    out: list[RawRecord] = []
    live: dict[int, tuple[int, int, str]] = {}
    current: int | None = None
    expected = 0
    lo, hi = MARKER_BASE, MARKER_BASE + 2 * n_ops
    for rec in reader.get_allocation_records():
        summary.total_records += 1
        alloc = names[int(rec.allocator)]
        if alloc == "MALLOC" and lo <= rec.size < hi:
            seq, is_end = divmod(rec.size - MARKER_BASE, 2)
            if is_end:
                if current != seq:
                    raise RuntimeError(f"end marker of op {seq} while inside op {current}")
                current = None
            else:
                if current is not None or seq != expected:
                    raise RuntimeError(f"begin marker of op {seq}, expected {expected} (inside {current})")
                current = seq
                expected += 1
                summary.operations_seen += 1
            continue
        if alloc in _FREE:
            known = live.pop(rec.address, None)
            if current is None:
                if known is not None:
                    summary.frees_outside += 1
                continue
            if known is None:
                summary.untracked_frees += 1  # allocated before tracking, outside ops, or dropped
                continue
            size, site, kind = known
            out.append(RawRecord(current, "free", size, rec.address, site, kind, rec.tid))
        elif alloc in _ALLOC and current is not None:
            if alloc not in always_keep and rec.size < keep_min_bytes and current not in keep_all_in:
                live.pop(rec.address, None)  # address reused by an untracked allocation
                summary.dropped_small += 1
                continue
            site = rec.native_stack_id if site_of is None else site_of(rec)
            live[rec.address] = (rec.size, site, alloc)
            out.append(RawRecord(current, "alloc", rec.size, rec.address, site, alloc, rec.tid))
    reader.close()
    if summary.operations_seen != n_ops:
        raise RuntimeError(f"trace holds {summary.operations_seen} operations, expected {n_ops}")
    return out, summary



def proc_status() -> dict[str, int]:
    """VmRSS, VmSize and VmHWM of this process in bytes (/proc/self/status)."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmSize", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (``echo 5 > /proc/self/clear_refs``); False if not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False

"""Buffers and the allocator that hands them out, one event at a time.

This is the slow, obviously-correct memory model: the reference engine drives
it row by row, and :func:`replay` uses it to check any ledger's accounting
(every free matches a live allocation of the same size, nothing goes
negative, nothing exceeds the device). The fast engine does the same
arithmetic on whole arrays and is tested against it.

*Resident* memory follows first touch on host RAM: a buffer costs RAM only for
the rows written into it (its high-water mark), not for its capacity. On a
device without first touch (a GPU), resident = allocated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simkv.errors import SimkvError
from simkv.ledger import ALLOC, COPY, FREE, ROW, Ledger
from simkv.units import format_bytes


class OutOfMemory(SimkvError):
    """An allocation that does not fit in device memory."""

    def __init__(self, step: int, layer: int, requested: int, allocated: int, device_memory: int, weights: int = 0) -> None:
        self.step, self.layer, self.requested = step, layer, requested
        self.allocated, self.device_memory, self.weights = allocated, device_memory, weights
        besides = f" KV + {format_bytes(weights)} weights" if weights else ""
        super().__init__(
            f"out of memory at step {step}, layer {layer}: {format_bytes(requested)} requested with "
            f"{format_bytes(allocated)}{besides} of {format_bytes(device_memory)} allocated"
        )


class AllocationTooLarge(OutOfMemory):
    """One buffer larger than the device's largest single allocation (``max_alloc_bytes``)."""

    def __init__(self, step: int, layer: int, requested: int, allocated: int, device_memory: int, weights: int = 0) -> None:
        super().__init__(step, layer, requested, allocated, device_memory, weights)
        SimkvError.__init__(
            self, f"allocation too large at step {step}, layer {layer}: one buffer of {format_bytes(requested)} "
            "is over the device's largest single allocation (max_alloc_bytes)"
        )


class AccountingError(AssertionError):
    """A ledger that breaks conservation of memory (a simulator bug, never user input)."""


@dataclass(eq=False)
class Buffer:
    """One allocation. Sized in *rows* (token positions × beams) so that a buffer can be
    reinterpreted for another batch width without changing its bytes (the CPU plugin
    reuses its buffers across a reset that way); its capacity in tokens follows."""

    id: int
    layer: int
    tensor: int
    rows: int  # token rows allocated: capacity × batch at allocation
    batch: int  # beams it holds now
    row_bytes: int  # per token per beam
    used: int = 0  # tokens stored
    written: int = 0  # high-water mark of rows ever written (first touch; L-major layout)

    @property
    def capacity(self) -> int:
        return self.rows // self.batch

    @property
    def bytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def resident_bytes(self) -> int:
        return self.written * self.row_bytes


@dataclass
class Allocator:
    device_memory: int
    first_touch: bool = True
    weights: int = 0  # device memory taken besides the KV cache (Scenario.weights_memory)
    max_alloc: int = 0  # largest single buffer (policy.max_alloc_bytes); 0 = no limit
    live: dict[int, Buffer] = field(default_factory=dict)
    allocated: int = 0
    resident: int = 0
    peak: int = 0  # running maxima, reset by the caller at each step
    resident_peak: int = 0
    next_id: int = 0
    log: list[tuple] = field(default_factory=list)

    def _record(self, step, phase, request, buf: Buffer, op: int, nbytes: int, used: int) -> None:
        self.log.append((step, phase, request, buf.layer, buf.tensor, op, nbytes, buf.capacity, used, buf.id))
        self.peak = max(self.peak, self.allocated)
        self.resident_peak = max(self.resident_peak, self.resident)

    def alloc(self, step, phase, request, *, layer, tensor, capacity, batch, row_bytes, holds) -> Buffer:
        buf = Buffer(self.next_id, layer, tensor, capacity * batch, batch, row_bytes)
        if self.max_alloc and buf.bytes > self.max_alloc:
            raise AllocationTooLarge(step, layer, buf.bytes, self.allocated, self.device_memory, self.weights)
        if self.allocated + self.weights + buf.bytes > self.device_memory:
            raise OutOfMemory(step, layer, buf.bytes, self.allocated, self.device_memory, self.weights)
        self.next_id += 1
        self.live[buf.id] = buf
        self.allocated += buf.bytes
        if not self.first_touch:
            self.resident += buf.bytes
        self._record(step, phase, request, buf, ALLOC, buf.bytes, holds)
        return buf

    def copy(self, step, phase, request, src: Buffer, dst: Buffer, tokens: int) -> None:
        """Copy the first ``tokens`` positions of every destination row (a beam gather)."""
        if src.id not in self.live or dst.id not in self.live:
            raise AccountingError("copy between buffers that are not live")
        if tokens > min(src.capacity, dst.capacity):
            raise AccountingError("copy larger than a buffer")
        nbytes = tokens * dst.batch * dst.row_bytes
        self.write(dst, tokens)
        dst.used = tokens
        self._record(step, phase, request, dst, COPY, nbytes, tokens)

    def write(self, buf: Buffer, tokens: int) -> None:
        """Token positions up to ``tokens`` of every beam now hold data (first touch)."""
        self.write_rows(buf, tokens * buf.batch)

    def write_rows(self, buf: Buffer, rows: int) -> None:
        """The first ``rows`` rows of a buffer now hold data (first touch)."""
        if rows > buf.written:
            if self.first_touch:
                self.resident += (rows - buf.written) * buf.row_bytes
            buf.written = rows

    def free(self, step, phase, request, buf: Buffer) -> None:
        if self.live.pop(buf.id, None) is not buf:
            raise AccountingError(f"free of buffer {buf.id}, which is not live")
        self.allocated -= buf.bytes
        self.resident -= buf.resident_bytes if self.first_touch else buf.bytes
        if self.allocated < 0 or self.resident < 0:
            raise AccountingError("negative memory")
        self._record(step, phase, request, buf, FREE, buf.bytes, buf.used)

    def take_rows(self) -> np.ndarray:
        rows = np.array(self.log, dtype=ROW) if self.log else np.empty(0, dtype=ROW)
        self.log = []
        return rows


def replay(ledger: Ledger, device_memory: int | None = None) -> dict[int, int]:
    """Check a ledger's accounting; return the live buffers at the end (id → bytes).

    Raises :class:`AccountingError` if a buffer is freed twice or with a size
    other than its allocation, copied while dead or past its size, if memory
    goes negative or over ``device_memory``, or if the order of steps goes back.
    """
    live: dict[int, tuple[int, int]] = {}  # id -> (bytes, capacity)
    allocated = 0
    last_step = -1
    for step, op, buf, nbytes, cap in zip(
        ledger.rows["step"].tolist(),
        ledger.rows["op"].tolist(),
        ledger.rows["buffer"].tolist(),
        ledger.rows["bytes"].tolist(),
        ledger.rows["capacity_tokens"].tolist(),
    ):
        if step < last_step:
            raise AccountingError(f"step {step} after step {last_step}")
        last_step = step
        if nbytes < 0:
            raise AccountingError(f"negative size in a row of step {step}")
        if op == ALLOC:
            if buf in live:
                raise AccountingError(f"buffer {buf} allocated twice")
            live[buf] = (nbytes, cap)
            allocated += nbytes
            if device_memory is not None and allocated > device_memory:
                raise AccountingError(f"step {step}: {allocated} B allocated > device {device_memory} B")
        elif op == FREE:
            if live.pop(buf, (None,))[0] != nbytes:
                raise AccountingError(f"step {step}: free of buffer {buf} does not match a live allocation")
            allocated -= nbytes
        elif op == COPY:
            if buf not in live or nbytes > live[buf][0]:
                raise AccountingError(f"step {step}: copy into buffer {buf} that is dead or too small")
        if allocated < 0:
            raise AccountingError(f"step {step}: allocated memory went negative")
    return {buf: size for buf, (size, _) in live.items()}

"""Memory limits: the device's memory, its largest single allocation, the policy's headroom limit.

An allocation that does not fit the device (KV bytes plus the weights over
``device_memory``) or is larger than ``policy.max_alloc_bytes`` ends the run: the rows before
it are kept, the step is recorded as it stood, and the engine stops with
:class:`~simkv.memory.OutOfMemory` (:class:`~simkv.memory.AllocationTooLarge`). Near the limit a
policy with ``headroom_limit`` (the GPU plugin's 90 %) sizes new buffers exactly instead
(:func:`limit_headroom`; :class:`ExactSizes` when a decode run is planned past it).
"""

from __future__ import annotations

import numpy as np

from simkv.ledger import ALLOC
from simkv.memory import AllocationTooLarge, OutOfMemory


def limit_headroom(policy, needed, caps, unit_bytes, running_before, device_memory, weights=0, alloc_bytes=None):
    """Apply the headroom limits (``headroom_limit``, ``max_alloc_bytes``) to one step's units.

    ``unit_bytes(i, cap)`` gives unit i's bytes at a capacity; ``running_before(i, chosen)``
    the allocated bytes just before unit i allocates, given the total bytes chosen for
    units 0..i-1. Units are decided in order, as the runtime allocates them; one pass
    (a running total, not a sum per unit), so 100,000 layers cost no more than linear.
    ``weights``: device memory in use besides the KV cache, counted toward the limit.
    ``needed`` may be one value per unit (needs with carried padding); ``alloc_bytes(i, cap)``
    gives what unit i allocates in all when only part of it is checked (default ``unit_bytes``).
    """
    if not policy.headroom_limit and not policy.max_alloc_bytes:
        return caps
    caps = np.array(caps)
    limit = policy.headroom_limit * device_memory - weights
    chosen = 0
    exact = np.broadcast_to(needed, caps.shape)
    for i in range(len(caps)):
        nbytes = unit_bytes(i, caps[i])
        over_limit = policy.headroom_limit and running_before(i, chosen) + nbytes >= limit
        if over_limit or (policy.max_alloc_bytes and nbytes > policy.max_alloc_bytes):
            caps[i] = exact[i]
            nbytes = unit_bytes(i, caps[i])
        chosen += alloc_bytes(i, caps[i]) if alloc_bytes else nbytes
    return caps


class ExactSizes:
    """The sizes the headroom limit gives (``Policy.headroom_limit``): exactly the tokens needed."""

    name = "headroom limit"

    @staticmethod
    def capacity(needed, prim):
        return needed


def over_device(running: np.ndarray, scenario) -> np.ndarray:
    """Positions where the allocated KV bytes ``running`` and the weights pass the device's memory."""
    return np.flatnonzero(running + scenario.weights_memory > scenario.device_memory)


def too_large(policy, nbytes):
    """Where buffers of ``nbytes`` bytes (a value or an array) are larger than the device's largest
    allocation, ``policy.max_alloc_bytes``: a mask like ``nbytes``, or False where there is no such limit."""
    return nbytes > policy.max_alloc_bytes if policy.max_alloc_bytes else False


def first_failure(rows: np.ndarray, running: np.ndarray, policy, scenario) -> int | None:
    """Index of the first of a step's ``rows`` that cannot be allocated (``running``: allocated
    bytes after each row), or None if all of them can."""
    over = over_device(running, scenario)
    big = too_large(policy, rows["bytes"])
    big = over[:0] if big is False else np.flatnonzero((rows["op"] == ALLOC) & big)
    if not len(over) and not len(big):
        return None
    return min(int(over[0]) if len(over) else len(rows), int(big[0]) if len(big) else len(rows))


def failure(row, step: int, allocated: int, policy, scenario) -> OutOfMemory:
    """The error of the allocation ``row`` that failed, with ``allocated`` bytes of KV cache at the failure."""
    nbytes = int(row["bytes"])
    cause = AllocationTooLarge if 0 < policy.max_alloc_bytes < nbytes else OutOfMemory
    return cause(step, int(row["layer"]), nbytes, allocated, scenario.device_memory, scenario.weights_memory)

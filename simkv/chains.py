"""Each unit's chain of reallocations over a run of one-token decode steps.

A unit whose buffers hold ``cap`` tokens overflows on the step that needs ``cap + 1``;
the policy sizes the new buffers (:meth:`policies.base.Policy.capacity`), which overflow
in turn, and so on: a chain of links per unit. :func:`chains` follows every chain one
*wave* (one ``capacity`` call for all units) per link — cheap when units reallocate
rarely (doubling), but one Python round per step for a policy that reallocates on every
step (``exact``, ``hf-dynamic``: 33,000 waves for 33,000 steps).

Hence a shortcut for the common case of a policy that gives a constant
headroom per unit (``cap = needed + pad``: ``exact`` and ``hf-dynamic`` pad 0, ``fixed``
N, ``openvino-gpu`` its staggered P): such a chain is arithmetic (links every
``pad + 1`` steps). It reads each unit's ``pad`` off the first wave, builds the
arithmetic chain, and checks it with one ``capacity`` call on every link it predicts.
If the policy returns exactly ``needed + pad`` at each predicted link, the wave loop
would have visited exactly those links (by induction: a confirmed link's capacity
puts the next overflow where the prediction put it), so the result is the same;
otherwise the prediction is dropped and the waves go on. Nothing is asked of the
policy but what :meth:`~policies.base.Policy.capacity` already promises: a pure
function, so it may be evaluated ahead of time.
"""

from __future__ import annotations

import numpy as np

from simkv.errors import SimkvError

_NONE = np.empty(0, dtype=np.int64)


def chains(policy, prim, budget, L0, B, n, shortcut_links=0):
    """The links of every unit's chain over decode steps ``k = 1..n`` (``L0 + k`` tokens
    needed at step k, ``B`` beams), one ``capacity`` call per wave.

    ``prim``: each unit's primitive id; ``budget``: each unit's rows (tokens × beams) now.
    Returns ``(unit, k, old_rows, new_cap)``, one entry per link (in no particular order), and
    each unit's rows after the run. ``shortcut_links`` > 0: after the first wave, try the
    arithmetic chain (module docstring) when it predicts at most that many links (the engine
    passes its plan size: a bigger plan is cut anyway); 0: waves only, the reference the
    shortcut is tested against.
    """
    budget = budget.copy()
    links = []  # (unit, k, old rows, new capacity) per wave, or the confirmed arithmetic rest
    k_next = budget // B + 1 - L0
    active = np.flatnonzero(k_next <= n)
    while len(active):
        k = k_next[active]
        new = np.asarray(policy.capacity(L0 + k, prim[active]), dtype=np.int64)
        if (new < L0 + k).any():
            raise SimkvError(f"policy {policy.name} returned a capacity below the tokens needed")
        links.append((active, k, budget[active], new))  # fancy indexing: already a copy
        budget[active] = new * B
        k_next[active] = new + 1 - L0
        again = k_next[active] <= n
        if shortcut_links and len(links) == 1 and again.any():
            rest = _arithmetic_links(policy, prim, active[again], k_next[active[again]], (new - L0 - k)[again],
                                     L0, B, n, shortcut_links)
            if rest is not None:
                links.append(rest)
                last = np.r_[rest[0][1:] != rest[0][:-1], True]  # links of a unit are consecutive
                budget[rest[0][last]] = rest[3][last] * B
                break
        active = active[again]
    if not links:
        return _NONE, _NONE, _NONE, _NONE, budget
    unit, k, old_rows, new_cap = (np.concatenate(c) for c in zip(*links))
    return unit, k, old_rows, new_cap, budget


def _arithmetic_links(policy, prim, units, k_first, pad, L0, B, n, max_links):
    """Links of ``units`` from ``k_first`` on if each keeps its headroom ``pad``: at steps
    ``k_first + j (pad + 1)`` up to n, capacity ``L0 + k + pad``; each replaces the
    previous link's ``L0 + k - 1`` tokens. None unless the policy confirms every link."""
    count = (n - k_first) // (pad + 1) + 1
    total = int(count.sum())
    if total > max_links:
        return None
    starts = np.cumsum(count) - count
    j = np.arange(total, dtype=np.int64) - np.repeat(starts, count)
    unit = np.repeat(units, count)
    pad_of = np.repeat(pad, count)
    k = np.repeat(k_first, count) + j * (pad_of + 1)
    cap = L0 + k + pad_of
    if not np.array_equal(np.asarray(policy.capacity(L0 + k, prim[unit]), dtype=np.int64), cap):
        return None
    return unit, k, (L0 + k - 1) * B, cap

"""Summary metrics, as defined in DESIGN.md §5, reduced from the ledger and the step table.

* peak allocated / resident: highest value at any moment (inside steps too);
* mean allocated: time-weighted over steps (every step lasts one time unit);
* used: logical bytes (tokens × bytes per token) at the end;
* waste = allocated − used at the end, split into *reserved* (headroom of current
  buffers) and *transient* (old buffers still alive after a reallocation);
* reallocations: allocations that replace a live K or V data buffer;
* spike height of a step: its peak − its steady allocation (current buffers only).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from simkv.ledger import ALLOC, COPY, TENSOR_CODE, TENSORS, Ledger


@dataclass(frozen=True)
class Metrics:
    peak_allocated_bytes: int
    peak_resident_bytes: int
    final_allocated_bytes: int
    mean_allocated_bytes: int
    used_bytes: int
    peak_used_bytes: int
    waste_bytes: int
    waste_reserved_bytes: int
    waste_transient_bytes: int
    realloc_count: int
    bytes_copied: int
    max_spike_bytes: int
    max_spike_step: int | None
    steps: int
    oom_step: int | None

    @property
    def waste_pct(self) -> float:
        """Share of the final allocation that holds no token."""
        return 100.0 * self.waste_bytes / self.final_allocated_bytes if self.final_allocated_bytes else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["waste_pct"] = round(self.waste_pct, 3)
        return out


def compute(ledger: Ledger, steps: np.ndarray, oom_step: int | None = None) -> Metrics:
    rows = ledger.rows
    if not len(steps):
        raise ValueError("no steps to measure")
    spikes = steps["peak"] - steps["steady"]
    final = steps[-1]
    spike_at = int(np.argmax(spikes))
    return Metrics(
        peak_allocated_bytes=int(steps["peak"].max()),
        peak_resident_bytes=int(steps["resident_peak"].max()),
        final_allocated_bytes=int(final["allocated"]),
        mean_allocated_bytes=int(round(float(steps["allocated"].mean()))),
        used_bytes=int(final["used"]),
        peak_used_bytes=int(steps["used"].max()),
        waste_bytes=int(final["allocated"] - final["used"]),
        waste_reserved_bytes=int(final["steady"] - final["used"]),
        waste_transient_bytes=int(final["allocated"] - final["steady"]),
        realloc_count=_replacing_allocations(rows),
        bytes_copied=int(rows["bytes"][rows["op"] == COPY].sum()),
        max_spike_bytes=int(spikes[spike_at]),
        max_spike_step=int(steps["step"][spike_at]) if spikes[spike_at] > 0 else None,
        steps=len(steps),
        oom_step=oom_step,
    )


def _replacing_allocations(rows: np.ndarray) -> int:
    """Allocations of K/V data made while that (request, layer, tensor) still had a live buffer."""
    data = rows[np.isin(rows["tensor"], [TENSOR_CODE["k"], TENSOR_CODE["v"]]) & (rows["op"] != COPY)]
    if not len(data):
        return 0
    key = (data["request"].astype(np.int64) * (1 << 32) + data["layer"]) * len(TENSORS) + data["tensor"]
    order = np.argsort(key, kind="stable")
    key, delta = key[order], np.where(data["op"][order] == ALLOC, 1, -1)
    live_after = np.cumsum(delta)
    group_start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    offset = np.repeat(live_after[group_start] - delta[group_start], np.diff(np.r_[group_start, len(key)]))
    live_before = live_after - delta - offset
    return int(((delta == 1) & (live_before > 0)).sum())


def per_layer(ledger: Ledger, layers: int) -> list[dict]:
    """Per layer and data tensor: the steps where it reallocated and its final capacity.

    One sort of the K/V allocations by (layer, tensor), then one slice each: linear in
    layers (a filter per layer made 100,000 layers take minutes)."""
    rows = ledger.rows
    allocs = rows[(rows["op"] == ALLOC) & np.isin(rows["tensor"], [TENSOR_CODE["k"], TENSOR_CODE["v"]])]
    key = allocs["layer"].astype(np.int64) * 2 + (allocs["tensor"] == TENSOR_CODE["v"])
    order = np.argsort(key, kind="stable")
    allocs = allocs[order]
    bounds = np.searchsorted(key[order], np.arange(2 * layers + 1))
    out = []
    for layer in range(layers):
        for j, name in enumerate(("k", "v")):
            sel = allocs[bounds[2 * layer + j] : bounds[2 * layer + j + 1]]
            out.append(
                {
                    "layer": layer,
                    "tensor": name,
                    "alloc_steps": sel["step"].tolist(),
                    "capacities": sel["capacity_tokens"].tolist(),
                    "final_capacity_tokens": int(sel["capacity_tokens"][-1]) if len(sel) else 0,
                }
            )
    return out


__all__ = ["Metrics", "compute", "per_layer"]

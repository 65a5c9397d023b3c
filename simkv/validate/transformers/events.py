"""KV events of a transformers run, read from memray's Python stacks (step 3 of :mod:`.runner`'s docstring).

An allocation is a K (or V) cache tensor when the innermost frame of ``transformers/cache_utils.py`` on its
stack is a line that names keys (or values) only; its layer is its rank among the operation's allocations
from the same function and tensor; a free is matched to its allocation by address.
"""

from __future__ import annotations

import linecache

__all__ = ["kv_site_of", "kv_events"]


def kv_site_of(cache: dict):
    """memray record -> ``(function, "k" | "v")`` for a KV tensor allocation, else None (cached per stack)."""

    def site(rec):
        key = rec.stack_id
        if key not in cache:
            label = None
            for function, filename, lineno in rec.stack_trace():  # innermost frame first
                if filename.endswith("cache_utils.py"):
                    text = linecache.getline(filename, lineno)
                    k, v = "key" in text, "value" in text
                    label = (function, "k" if k else "v") if k != v else None
                    break
            cache[key] = label
        return cache[key]

    return site


def kv_events(records, layers: int) -> tuple[list[dict], list[str]]:
    """The KV allocations and frees among a trace's records, with layer and tensor, in stream order."""
    events, warnings = [], []
    labels: dict[int, tuple[int, str]] = {}  # live KV tensor address -> (layer, tensor)
    rank: dict[tuple[int, str, str], int] = {}
    for r in records:
        if r.op == "alloc":
            labels.pop(r.address, None)
            if r.site is None:
                continue
            function, tensor = r.site
            n = rank.get((r.seq, function, tensor), 0)
            rank[(r.seq, function, tensor)] = n + 1
            if n >= layers:
                warnings.append(f"step {r.seq}: more {tensor} allocations in {function} than layers")
            labels[r.address] = (n % layers, tensor)
            events.append({"step": r.seq, "layer": n % layers, "tensor": tensor, "op": "alloc", "bytes": r.size,
                           "via": function})
        elif r.address in labels:
            layer, tensor = labels.pop(r.address)
            events.append({"step": r.seq, "layer": layer, "tensor": tensor, "op": "free", "bytes": r.size})
    return events, warnings

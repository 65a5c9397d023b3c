"""Cache events of a transformers run, read from memray's Python stacks (step 3 of :mod:`.runner`'s docstring).

An allocation is a cache tensor when the innermost frame of ``transformers/cache_utils.py`` on its stack
is a line that names one tensor of a cache layer:

* keys or values only (not both): ``k`` / ``v`` — the ``torch.cat`` / ``torch.zeros`` / ``index_select`` /
  ``roll`` lines of ``DynamicLayer``, ``DynamicSlidingWindowLayer``, ``StaticLayer``,
  ``StaticSlidingWindowLayer`` and ``reorder_cache``;
* ``conv_states`` or ``recurrent_states`` in ``lazy_initialization`` or ``reorder_cache``: a linear-attention
  layer's ``conv_state`` / ``recurrent_state``. The pad and ``cat`` of the conv state in
  ``update_conv_state`` are temporaries the model convolves, not the cache.

Index tensors, ``cache_position`` and the 8-byte ``cumulative_length`` / ``_sliding_window_tensor``
counters name neither (the counters are also allocated with the cache, before the first operation).
Its layer is the cache layer whose method made it: :func:`label_layers` wraps every method of each
``cache.layers[i]`` in a function named ``simkv_cache_layer_<i>``, which memray's stack shows (a model
without it falls back to the allocation's rank among the operation's allocations from the same function
and tensor). A free is matched to its allocation by address. :func:`pointer_check` holds the result
against the storages the cache object holds after each operation (data pointers).
"""

from __future__ import annotations

import inspect
import linecache

__all__ = ["LAYER_FRAME", "tensor_of", "kv_site_of", "kv_events", "label_layers", "cache_storages", "pointer_check"]

#: Name prefix of the per-layer wrapper frames (:func:`label_layers`).
LAYER_FRAME = "simkv_cache_layer_"
#: Functions of ``LinearAttentionLayer`` whose conv / recurrent state allocations are the cache.
STATE_FUNCTIONS = ("lazy_initialization", "reorder_cache")


def tensor_of(function: str, text: str) -> str | None:
    """The cache tensor a ``cache_utils.py`` line allocates in ``function``, or None (a temporary)."""
    conv, recurrent = "conv_states" in text, "recurrent_states" in text
    if conv or recurrent:
        if function in STATE_FUNCTIONS and conv != recurrent:
            return "conv_state" if conv else "recurrent_state"
        return None
    k, v = "key" in text, "value" in text
    return ("k" if k else "v") if k != v else None


def kv_site_of(cache: dict):
    """memray record -> ``(function, tensor, layer | None)`` for a cache tensor allocation, else None
    (cached per stack: the wrapper frames make a layer's stacks its own)."""

    def site(rec):
        key = rec.stack_id
        if key not in cache:
            label = layer = None
            for function, filename, lineno in rec.stack_trace():  # innermost frame first
                if label is None and filename.endswith("cache_utils.py"):
                    tensor = tensor_of(function, linecache.getline(filename, lineno))
                    if tensor is None:
                        break
                    label = (function, tensor)
                elif label is not None and function.startswith(LAYER_FRAME):
                    layer = int(function[len(LAYER_FRAME):])
                    break
            cache[key] = None if label is None else (*label, layer)
        return cache[key]

    return site


def kv_events(records, layers: int) -> tuple[list[dict], list[str]]:
    """The cache allocations and frees among a trace's records, with layer and tensor, in stream order."""
    events, warnings = [], []
    labels: dict[int, tuple[int, str]] = {}  # live cache tensor address -> (layer, tensor)
    rank: dict[tuple[int, str, str], int] = {}
    for r in records:
        if r.op == "alloc":
            labels.pop(r.address, None)
            if r.site is None:
                continue
            function, tensor = r.site[:2]
            layer = r.site[2] if len(r.site) > 2 else None
            if layer is None:  # no wrapper frame: the rank among the operation's allocations of this kind
                n = rank.get((r.seq, function, tensor), 0)
                rank[(r.seq, function, tensor)] = n + 1
                if n >= layers:
                    warnings.append(f"step {r.seq}: more {tensor} allocations in {function} than layers")
                layer = n % layers
            labels[r.address] = (layer, tensor)
            events.append({"step": r.seq, "layer": layer, "tensor": tensor, "op": "alloc", "bytes": r.size,
                           "via": function})
        elif r.address in labels:
            layer, tensor = labels.pop(r.address)
            events.append({"step": r.seq, "layer": layer, "tensor": tensor, "op": "free", "bytes": r.size})
    return events, warnings


def label_layers(cache) -> None:
    """Wrap every method of each ``cache.layers[i]`` (on the instance) in a function named
    ``simkv_cache_layer_<i>`` that calls it: allocations made under it carry their layer on the stack."""
    for i, layer in enumerate(cache.layers):
        for name in dir(type(layer)):
            if name.startswith("__") or not inspect.isfunction(inspect.getattr_static(layer, name)):
                continue
            scope = {"method": getattr(layer, name)}
            exec(f"def {LAYER_FRAME}{i}(*args, **kwargs):\n    return method(*args, **kwargs)\n", scope)  # noqa: S102
            setattr(layer, name, scope[f"{LAYER_FRAME}{i}"])


def cache_storages(cache) -> dict[int, tuple[int, str, int]]:
    """The storages a cache object holds: data pointer -> (layer, tensor, bytes); views count their whole
    storage (a sliding layer's kept view pins its cat buffer). Empty tensors and the counters are left out."""
    import torch

    out: dict[int, tuple[int, str, int]] = {}

    def add(layer: int, tensor: str, t) -> None:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            if storage.nbytes():
                out[storage.data_ptr()] = (layer, tensor, storage.nbytes())

    for i, layer in enumerate(cache.layers):
        add(i, "k", getattr(layer, "keys", None))
        add(i, "v", getattr(layer, "values", None))
        for tensor, attr in (("conv_state", "conv_states"), ("recurrent_state", "recurrent_states")):
            for t in (getattr(layer, attr, None) or {}).values():
                add(i, tensor, t)
    return out


def pointer_check(records, snapshots: list[dict]) -> dict:
    """After each operation, the cache tensors the stacks say are live (address, layer, tensor, bytes) against
    the storages the cache object holds (:func:`cache_storages`, one snapshot per operation)."""
    live: dict[int, tuple[int, str, int]] = {}
    by_seq: dict[int, list] = {}
    for r in records:
        by_seq.setdefault(r.seq, []).append(r)
    equal, first = 0, None
    for seq, held in enumerate(snapshots):
        for r in by_seq.get(seq, []):
            if r.op == "alloc":
                live.pop(r.address, None)
                if r.site is not None and len(r.site) > 2 and r.site[2] is not None:
                    live[r.address] = (r.site[2], r.site[1], r.size)
            else:
                live.pop(r.address, None)
        if live == held:
            equal += 1
        elif first is None:
            extra = sorted(set(live.items()) - set(held.items()))[:3]
            lacking = sorted(set(held.items()) - set(live.items()))[:3]
            first = f"step {seq}: traced but not held {extra}, held but not traced {lacking}"
    return {"steps_equal": equal, "steps": len(snapshots), "first_difference": first}

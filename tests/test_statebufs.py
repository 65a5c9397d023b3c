"""The linear-attention state classifier (simkv/validate/openvino/statebufs.py) on synthetic allocator traces.

The traces follow what the CPU plugin does with a hybrid model's states (docs/DESIGN.md §4c): two buffers
per state in the first inference, a pooled activation of the same size beside them, and on a batch growth
the written buffer replaced in that inference (new allocated, old freed right after) and the other one in
the next. Only the buffers alive at the end are named by content (the matcher); the rest follows.
"""

from __future__ import annotations

import numpy as np
import pytest

from simkv.validate.memtrace import RawRecord
from simkv.validate.openvino.statebufs import StateVar, buffer_signature, identify, value_signature

CONV = StateVar("conv.0", 0, "conv_state", 2048)  # 1,024 bf16 elements per row
REC = StateVar("ssm.0", 0, "recurrent_state", 8192)  # 4,096 bf16 elements per row


def _trace(events):
    """``(seq, op, size, name)`` -> records; a name is an address, reused for alloc and free."""
    addresses: dict[str, int] = {}
    out = []
    for seq, op, size, name in events:
        address = addresses.setdefault(name, 0x1000 * (len(addresses) + 1))
        out.append(RawRecord(seq, op, size, address, 7, "POSIX_MEMALIGN", 1))
    return out, addresses


def test_two_buffers_found_by_content_and_followed_back_through_a_batch_growth():
    records, addr = _trace([
        (0, "alloc", 2048, "convA"), (0, "alloc", 8192, "recA"), (0, "alloc", 8192, "act"),  # pooled activation
        (0, "alloc", 8192, "recB"), (0, "alloc", 2048, "convB"),
        (3, "alloc", 24576, "recA2"), (3, "free", 8192, "recA"),   # fork to 3: the written buffers grow
        (3, "alloc", 6144, "convA2"), (3, "free", 2048, "convA"),
        (3, "free", 8192, "act"), (3, "alloc", 24576, "act2"),     # the activation grows too, not adjacent
        (4, "alloc", 6144, "convB2"), (4, "free", 2048, "convB"),  # the other buffers, next inference
        (4, "alloc", 24576, "recB2"), (4, "free", 8192, "recB"),
    ])
    live = {addr["convA2"]: {"conv.0"}, addr["convB2"]: {"conv.0"}, addr["recA2"]: {"ssm.0"},
            addr["recB2"]: {"ssm.0"}}
    found = identify(records, [CONV, REC], lambda a, size: live.get(a, set()))
    assert found.warnings == [] and found.live_found == 4
    named = [(r.seq, r.op, r.size, found.labels.get(i)) for i, r in enumerate(records)]
    assert [n for n in named if n[3] is None] == [(0, "alloc", 8192, None), (3, "free", 8192, None),
                                                  (3, "alloc", 24576, None)]  # the activation stays "other"
    assert sum(n[3] == ("conv_state", 0) for n in named) == 6  # 2 first buffers, each replaced once (+new -old)
    assert sum(n[3] == ("recurrent_state", 0) for n in named) == 6


def test_a_state_without_two_live_buffers_and_an_ambiguous_buffer_are_reported():
    records, addr = _trace([(0, "alloc", 2048, "a"), (0, "alloc", 2048, "b")])
    found = identify(records, [CONV, StateVar("conv.1", 1, "conv_state", 2048)],
                     lambda a, size: {"conv.0", "conv.1"} if a == addr["a"] else set())
    assert found.labels == {}
    assert any("matches states" in w for w in found.warnings)
    assert any("conv.1: 0 live buffers" in w for w in found.warnings)


def test_a_free_of_a_buffer_from_the_same_operation_is_not_a_replacement():
    records, addr = _trace([(0, "alloc", 4096, "tmp"), (0, "alloc", 2048, "conv"), (0, "free", 4096, "tmp")])
    found = identify(records, [CONV], lambda a, size: {"conv.0"} if a == addr["conv"] else set())
    assert found.labels == {1: ("conv_state", 0)}


@pytest.mark.parametrize("precision", ["bf16", "f16", "f32"])
def test_a_value_and_the_buffer_holding_it_have_one_signature_whatever_the_layout(precision):
    rng = np.random.default_rng(0)
    dtype = {"bf16": np.float32, "f16": np.float16, "f32": np.float32}[precision]
    value = rng.standard_normal((1, 4, 8)).astype(dtype).astype(np.float32)
    if precision == "bf16":  # values the plugin stored in bf16 are exact in f32
        value = ((value.view(np.uint32) >> 16) << 16).view(np.float32)
        raw = (value.view(np.uint32) >> 16).astype(np.uint16)
    else:
        raw = value.astype(dtype)
    blocked = np.ascontiguousarray(raw.transpose(0, 2, 1)).tobytes()  # another layout, same elements
    assert buffer_signature(blocked, precision) == value_signature(value, precision)
    other = value.copy()
    other[0, 0, 0] += 1.0
    assert value_signature(other, precision) != value_signature(value, precision)

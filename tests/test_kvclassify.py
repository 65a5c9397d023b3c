"""The KV classifier of ``simkv validate`` on synthetic allocation traces (no OpenVINO).

A trace is the allocator stream the CPU plugin produces: the ``openvino-cpu`` ledger's
allocations and frees in the plugin's order (that order is the one ``simkv validate``
matches event by event on real runs, docs/DESIGN.md §3), one call site per buffer kind,
plus unrelated allocations between layers.  The classifier is given only sizes, call
sites and the shape of each operation, never the ledger: it must name every buffer and
its layer and capacity for every head size and precision, including those where a
scale buffer and a data buffer have equal bytes (u4 head 32: scale of 2L tokens = data
of L tokens; u4 head 16 and u8 head 8: scale and data of one capacity are equal).
"""

from __future__ import annotations


import pytest

from simkv import build_scenario, simulate
from simkv.ledger import OPS, PHASES, TENSORS
from simkv.validate.memtrace import RawRecord
from simkv.validate.openvino.kvclassify import KVDims, OpContext, classify

OPS_STR = "prefill:5,decode:40,fork:2,decode:12,reorder,select:1,decode:3,reset,prefill:30,decode:3,prefill:7"
SITES = {name: 100 + i for i, name in enumerate(TENSORS)}  # one call site per buffer kind


def _trace(result, separators: bool):
    """(records, contexts) of a plugin-like allocator stream for ``result``'s ledger."""
    rows = result.ledger.rows
    rows = rows[rows["op"] != OPS.index("copy")]
    records, expected = [], []
    other = 0

    def scratch(seq):  # an unrelated allocation and its free (odd size: no KV layout)
        nonlocal other
        other += 1
        addr = 10**9 + other * 4096
        records.append(RawRecord(seq, "alloc", 4099, addr, 7, "POSIX_MEMALIGN", 1))
        records.append(RawRecord(seq, "free", 4099, addr, 7, "POSIX_MEMALIGN", 1))
        expected.extend([("other", None, None)] * 2)

    last = (None, None)
    for r in rows.tolist():
        step, _phase, _req, layer, tensor, op, nbytes, cap, _used, buffer = r
        name = TENSORS[tensor]
        if separators and (step, layer) != last and last[0] == step:
            scratch(step)
        last = (step, layer)
        records.append(RawRecord(step, OPS[op], nbytes, 4096 * (buffer + 1), SITES[name], "POSIX_MEMALIGN", 1))
        expected.append((name, None if layer < 0 else layer, None if name == "past_view" else cap))
    contexts, stored, batch = [], 0, 1
    for s in result.steps.tolist():
        step, phase, total, new_batch = s[0], PHASES[s[1]], s[2], s[3]  # tokens: stored after the step
        if phase == "reset":
            contexts.append(OpContext(step, batch, stored, 0, batch))
        else:
            contexts.append(OpContext(step, new_batch, stored, total, batch))
            batch = new_batch
        stored = total
    return records, contexts, expected


HEAD_SIZES = (16, 32, 48, 64, 96, 128, 256)
PRECISIONS = ("u4", "u8", "f16", "bf16", "f32")
SHAPES = {"mha": (4, 4), "gqa": (8, 2)}


@pytest.mark.parametrize("separators", [True, False], ids=["separated", "back-to-back"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_buffer_named_over_head_sizes(precision, shape, separators):
    heads, kv_heads = SHAPES[shape]
    for head_dim in HEAD_SIZES:
        sc = build_scenario(model=None, layers=3, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                            precision=precision, policy="openvino-cpu", ops=OPS_STR)
        records, contexts, expected = _trace(simulate(sc), separators)
        dims = KVDims(layers=3, kv_heads=kv_heads, head_dim=head_dim, precision=precision)
        got = classify(records, contexts, dims)
        assert got.warnings == [], (head_dim, got.warnings[:3])
        assert list(zip(got.kinds, got.layers, got.capacities)) == expected, head_dim
        kinds = {label.kind for label in got.sites.values()}
        assert kinds == {"k", "v", "k_beam", "v_beam"} | ({"k_scale", "v_scale"} if precision in ("u4", "u8") else set())


def test_u4_head_32_scale_is_not_read_as_data():
    """The issue's case, by hand: u4, 1 KV head x 32, batch 1, prompt 3 -> capacity 6.

    data unit = 1*1*32*4/8 = 16 B/token, scale unit = 1*1*2*4 = 8 B/token, beam 4 B/token.
    K/V data of 6 tokens = 96 B; K/V scale of 6 tokens = 48 B, which is also u4 data of
    3 tokens (>= L = 3, so a valid data reading); beam of 6 tokens = 24 B.  The group
    beam(24) data(96) scale(48) has one common capacity, 6, only with scale read as scale."""
    dims = KVDims(layers=1, kv_heads=1, head_dim=32, precision="u4")
    sizes = [24, 24, 96, 96, 48, 48]
    recs = [RawRecord(0, "alloc", n, 4096 * i, 10 + i, "POSIX_MEMALIGN", 1) for i, n in enumerate(sizes)]
    got = classify(recs, [OpContext(0, 1, 0, 3)], dims)
    assert got.kinds == ["k_beam", "v_beam", "k", "v", "k_scale", "v_scale"]
    assert got.capacities == [6] * 6 and got.layers == [0] * 6


def test_equal_data_and_scale_bytes_are_told_apart_by_order():
    """u4 head 16: data unit = 16*4/8 = 8 B/token = scale unit; capacity 10 -> both 80 B.
    The plugin allocates a layer's data pair before its scale pair (docs/DESIGN.md §3)."""
    dims = KVDims(layers=2, kv_heads=1, head_dim=16, precision="u4")
    sizes = [40, 40, 80, 80, 80, 80] * 2
    recs = [RawRecord(0, "alloc", n, 4096 * i, 10 + i % 6, "POSIX_MEMALIGN", 1) for i, n in enumerate(sizes)]
    got = classify(recs, [OpContext(0, 1, 0, 5)], dims)
    assert got.kinds == ["k_beam", "v_beam", "k", "v", "k_scale", "v_scale"] * 2
    assert got.layers == [0] * 6 + [1] * 6 and got.capacities == [10] * 12

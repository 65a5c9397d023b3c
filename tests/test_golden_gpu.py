"""The OpenVINO GPU plugin's rules, pinned to DESIGN.md §2.

There is no Intel GPU on this machine, so these formulas cannot be validated
against a real run here; they are pinned to the rules DESIGN.md §2 reads in
openvinotoolkit/openvino ``src/plugins/intel_gpu/src/graph/kv_cache.cpp`` and
``primitive_inst.cpp`` (``do_runtime_in_place_kv_cache``, ``realloc_if_needed``).
Each test quotes the rule it pins.
"""

import pytest

from conftest import rows_of, run

GPU = dict(layers=40, kv_heads=2, head_dim=16, precision="f16", policy="openvino-gpu")


def _alloc_steps(result, layer, tensor):
    return [(a[0], a[5]) for a in rows_of(result, op="alloc", tensor=tensor, layer=layer)]


@pytest.mark.parametrize(
    "layer, tensor, headroom",
    [(0, "k", 128), (0, "v", 129), (1, "v", 131), (31, "v", 191), (32, "k", 128), (39, "v", 143)],
)
def test_staggered_additive_growth(layer, tensor, headroom):
    """§2: "P_id = 128 + kv_cache_id % 64 (ids K0, V0, K1, V1, …)"; "First inference with P prompt
    tokens: cap = P + P_id"; "Else → new buffer cap' = L0 + L1 + P_id"; "For 1-token decode a
    primitive reallocates every P_id + 1 tokens"."""
    prompt, decode = 100, 1000
    result = run(**GPU, prompt=prompt, decode=decode)
    expected, cap, stored = [(0, prompt + headroom)], prompt + headroom, prompt
    for step in range(1, decode + 1):
        if stored + 1 > cap:
            cap = stored + 1 + headroom
            expected.append((step, cap))
        stored += 1
    assert _alloc_steps(result, layer, tensor) == expected
    gaps = {b[0] - a[0] for a, b in zip(expected[1:], expected[2:])}
    assert gaps == {headroom + 1}


def test_primitive_131_reallocates_every_132_tokens():
    result = run(**GPU, prompt=50, decode=600)
    # V1 is primitive id 3: P_id = 131; cap = 50 + 131, then a new buffer every 132 steps.
    assert _alloc_steps(result, 1, "v") == [(0, 181), (132, 313), (264, 445), (396, 577), (528, 709)]


def test_old_buffer_freed_at_next_inference():
    """§2: "The old buffer stays referenced by the ReadValue until the next inference"."""
    result = run(**{**GPU, "layers": 1}, prompt=10, decode=200)
    k = rows_of(result, tensor="k")
    assert k[1:4] == [
        # Buffers 0-2 are K0 and its two beam tables, 3-5 V0's; the new K0 is 6.
        (129, 0, "k", "alloc", 267 * 64, 267, 139, 6),
        (129, 0, "k", "copy", 138 * 64, 267, 138, 6),
        (130, 0, "k", "free", 138 * 64, 138, 138, 0),
    ]
    # For step 129 the primitive holds old + new: that is its spike.
    assert result.steps[129]["allocated"] - result.steps[129]["steady"] == 138 * (64 + 2 * 4)


def test_i8_scales_share_the_headroom():
    """§2: i8 keeps an f16 (scale, zero-point) pair per (batch, head, token), [B,H,cap,2], same headroom:
    bytes/token/layer for K = H_kv × (S + 4)."""
    result = run(layers=1, kv_heads=4, head_dim=64, precision="i8", policy="openvino-gpu", prompt=10, decode=1)
    allocs = rows_of(result, op="alloc", step=0)
    assert [(a[2], a[4], a[5]) for a in allocs if a[2] in ("k", "k_scale")] == [
        ("k", 138 * 4 * 64, 138), ("k_scale", 138 * 4 * 4, 138)
    ]


def test_beam_tables_two_per_primitive_grow_with_headroom():
    """§2: "each K and V primitive keeps two i32 beam tables [B, cap_bt] … grown with the same +P_id"."""
    result = run(layers=1, kv_heads=1, head_dim=16, policy="openvino-gpu", prompt=10, decode=1)
    beams = [a for a in rows_of(result, op="alloc", step=0) if a[2] == "k_beam"]
    assert [(a[4], a[5]) for a in beams] == [(138 * 4, 138), (138 * 4, 138)]


def test_no_headroom_near_90_percent_of_device_memory():
    """§2: "No headroom when used_device + bytes ≥ 0.9 × global device memory: allocate exactly"."""
    unit = 32 + 2 * 4  # one primitive per token: 1 head × 16 f16 + two i32 beam tables
    result = run(layers=1, kv_heads=1, head_dim=16, policy="openvino-gpu", prompt=200, decode=1,
                 device_memory=25_000)
    caps = [a[5] for a in rows_of(result, op="alloc", step=0) if a[2] in ("k", "v")]
    # K: 0 + 328 × 40 = 13,120 B < 22,500 → headroom. V: 13,120 + 329 × 40 ≥ 22,500 → exactly 200.
    assert caps == [328, 200]
    assert result.steps[0]["allocated"] == (328 + 200) * unit


def test_reset_frees_and_reclaim_rebuilds_oversized_buffers():
    """§2: reset_state() frees KV buffers (#32916); with the older keep behaviour (#28361) a kept
    buffer is rebuilt when (needed + P_id) × 10 < cap."""
    ops = "prefill:3000,decode:1,reset,prefill:10,decode:1"
    freed = run(layers=1, kv_heads=1, head_dim=16, policy="openvino-gpu", ops=ops)
    assert [a[3] for a in rows_of(freed, step=2, tensor="k")] == ["free"]
    kept = run(layers=1, kv_heads=1, head_dim=16, policy="openvino-gpu", ops=ops, policy_options={"reset": "keep"})
    assert rows_of(kept, step=2) == []
    # 10 + 128 = 138 tokens × 10 < 3128: rebuilt at 138 (nothing to copy after a reset).
    assert [(a[3], a[5]) for a in rows_of(kept, step=3, tensor="k")] == [("alloc", 138)]
    assert [(a[3], a[5]) for a in rows_of(kept, step=4, tensor="k")] == [("free", 3128)]


def test_batch_change_copies_everything():
    """§2: "A change of batch width disables in-place for that step (full copy)"."""
    result = run(layers=1, kv_heads=1, head_dim=16, policy="openvino-gpu", ops="prefill:10,fork:4")
    k = rows_of(result, step=1, tensor="k")
    assert k == [(1, 0, "k", "alloc", 139 * 4 * 32, 139, 11, 6), (1, 0, "k", "copy", 10 * 4 * 32, 139, 10, 6)]

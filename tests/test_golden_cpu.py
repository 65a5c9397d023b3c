"""The OpenVINO CPU plugin's schedule, pinned to the values DESIGN.md §3 reports measured.

DESIGN.md §3: "after a P-token prefill cap = 2P; whenever L0 + L1 > cap,
cap = 2 (L0 + L1). Reallocations at L = 2^k (P+1) − 1. Measured, P = 32, u8,
8 kv heads × 64: steps 33, 99, 231, 495, 1023, 2079, 4191 with caps 130, 262,
526, 1054, 2110, 4222, 8446 and data buffers 66,560 … 4,324,352 B".
"""

from conftest import rows_of, run

CPU_U8 = dict(layers=2, kv_heads=8, head_dim=64, precision="u8", policy="openvino-cpu", prompt=32, decode=4200)
STEPS = [0, 33, 99, 231, 495, 1023, 2079, 4191]
CAPS = [64, 130, 262, 526, 1054, 2110, 4222, 8446]


def test_reallocation_steps_and_capacities():
    result = run(**CPU_U8)
    for layer in range(2):
        for tensor in ("k", "v"):
            allocs = rows_of(result, op="alloc", tensor=tensor, layer=layer)
            assert [a[0] for a in allocs] == STEPS
            assert [a[5] for a in allocs] == CAPS


def test_data_and_scale_buffer_bytes():
    result = run(**CPU_U8)
    data = [a[4] for a in rows_of(result, op="alloc", tensor="k", layer=0)]
    scales = [a[4] for a in rows_of(result, op="alloc", tensor="k_scale", layer=0)]
    beams = [a[4] for a in rows_of(result, op="alloc", tensor="k_beam", layer=0)]
    assert data == [32768, 66560, 134144, 269312, 539648, 1080320, 2161664, 4324352]
    # f32 (scale, zero-point) per token per head: 8 heads × 8 B.
    assert scales == [4096, 8320, 16768, 33664, 67456, 135040, 270208, 540544]
    assert beams == [4 * c for c in CAPS]  # i32 [B=1, cap]


def test_reallocation_formula_for_other_prompts():
    for prompt in (1, 7, 100):
        result = run(**{**CPU_U8, "prompt": prompt, "decode": 3000})
        steps = [a[0] for a in rows_of(result, op="alloc", tensor="k", layer=0)][1:]
        expected = [2**k * (prompt + 1) - 1 - prompt for k in range(1, 20) if 2**k * (prompt + 1) - 1 - prompt <= 3000]
        assert steps == expected


def test_exact_rows_of_a_reallocation_step():
    """Per layer, one after another: allocate new K, V, scales, beam tables; copy; free the old."""
    result = run(layers=2, kv_heads=8, head_dim=64, precision="u8", policy="openvino-cpu", prompt=32, decode=40)
    expected = []
    for layer, (old, new) in enumerate([(0, 12), (6, 18)]):
        tensors = ("k", "v", "k_scale", "v_scale", "k_beam", "v_beam")
        row = dict(k=512, v=512, k_scale=64, v_scale=64, k_beam=4, v_beam=4)
        expected += [(33, layer, t, "alloc", 130 * row[t], 130, 65, new + i) for i, t in enumerate(tensors)]
        expected += [(33, layer, t, "copy", 64 * row[t], 130, 64, new + i) for i, t in enumerate(tensors)]
        expected += [(33, layer, t, "free", 64 * row[t], 64, 64, old + i) for i, t in enumerate(tensors)]
    assert rows_of(result, step=33) == expected


def test_in_step_peak_is_all_new_plus_one_layers_old():
    layers = 32
    result = run(**{**CPU_U8, "layers": layers})
    per_token = 2 * (512 + 64 + 4)  # K and V: data, scales, beam table
    new, old = 8446 * per_token, 4222 * per_token
    step = result.steps[4191]
    assert step["peak"] == layers * new + old
    assert step["allocated"] == step["steady"] == layers * new
    assert result.metrics.max_spike_bytes == old
    assert result.metrics.max_spike_step == 4191


def test_reset_keeps_capacity_and_batch_change_rebuilds():
    result = run(layers=1, kv_heads=2, head_dim=16, precision="f32", policy="openvino-cpu",
                 ops="prefill:10,decode:5,reset,prefill:8,fork:3,decode:2,select:1")
    # reset: nothing freed, resident memory stays; the 8-token prompt fits the kept capacity (20).
    assert rows_of(result, step=6) == [] and rows_of(result, step=7) == []
    assert result.steps[6]["resident"] == result.steps[5]["resident"] and result.steps[6]["used"] == 0
    # fork at step 8: every buffer rebuilt at cap = 2 * 9 for 3 beams, 8 tokens gathered.
    fork = rows_of(result, step=8, tensor="k")
    # (f32 has no scale buffers: per layer K, V, K beam table, V beam table = ids 0-3.)
    assert fork == [(8, 0, "k", "alloc", 18 * 3 * 128, 18, 9, 4), (8, 0, "k", "copy", 8 * 3 * 128, 18, 8, 4),
                    (8, 0, "k", "free", 20 * 128, 20, 8, 0)]
    # select shrinks back to one beam: the only time CPU memory shrinks.
    select = rows_of(result, step=11, tensor="k", op="alloc")
    assert select == [(11, 0, "k", "alloc", 24 * 128, 24, 12, 8)]
    assert result.steps[11]["allocated"] < result.steps[10]["allocated"]


def test_reorder_at_same_width_allocates_nothing():
    result = run(layers=2, kv_heads=2, head_dim=16, policy="openvino-cpu", ops="prefill:10,fork:2,reorder,reorder")
    assert rows_of(result, step=2) == [] and rows_of(result, step=3) == []

"""The OpenVINO GPU plugin's rules, pinned to DESIGN.md §2.

There is no Intel GPU on this machine, so these formulas cannot be validated
against a real run here; they are pinned to the rules read in openvinotoolkit/openvino
``src/plugins/intel_gpu/`` (files, functions and commits in policies/openvino_gpu.py and
policies/mechanics.py). Each test quotes the rule it pins and derives its numbers by hand.
"""

import pytest

from conftest import assert_same_run, rows_of, run
from simkv.memory import AllocationTooLarge

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
    # Ids in allocation order: K0 data 0, its kernel's two beam tables 1-2, V0 data 3, tables 4-5;
    # the new K0 is 6. K0 (P_id 128) is full at 138 tokens: step 129 needs 139 → 139 + 128 = 267.
    assert k[1:4] == [
        (129, 0, "k", "alloc", 267 * 64, 267, 139, 6),
        (129, 0, "k", "copy", 138 * 64, 267, 138, 6),
        (130, 0, "k", "free", 138 * 64, 138, 138, 0),
    ]
    # For step 129 the primitive holds old + new data (its beam tables are not rebuilt at batch 1).
    assert result.steps[129]["allocated"] - result.steps[129]["steady"] == 138 * 64


def test_i8_scales_share_the_headroom():
    """§2: i8 keeps (scale, zero point) interleaved per (batch, head, token), [B,H,cap,2], in the
    inference precision (f16: 2 × 2 B), same headroom: K bytes/token = H_kv × (S + 4)."""
    result = run(layers=1, kv_heads=4, head_dim=64, precision="i8", policy="openvino-gpu", prompt=10, decode=1)
    allocs = rows_of(result, op="alloc", step=0)
    assert [(a[2], a[4], a[5]) for a in allocs if a[2] in ("k", "k_scale")] == [
        ("k", 138 * 4 * 64, 138), ("k_scale", 138 * 4 * 4, 138)
    ]


def test_i8_with_f32_inference_has_f32_scales():
    """KVCacheCompressionMatcher: scale_dt = zp_dt = the query's type; with f32 inference a
    (scale, zero point) pair is 2 × 4 B per token per head: K scales = 138 × 4 heads × 8 B."""
    result = run(layers=1, kv_heads=4, head_dim=64, precision="i8", policy="openvino-gpu", prompt=10, decode=1,
                 policy_options={"inference_precision": "f32"})
    allocs = rows_of(result, op="alloc", step=0)
    assert [(a[2], a[4]) for a in allocs if a[2] in ("k", "k_scale")] == [("k", 138 * 4 * 64), ("k_scale", 138 * 4 * 8)]


def test_u4_on_gpu_halves_the_data_and_keeps_f16_scales():
    """u4 KV on GPU (2026.2+, unverified here): 4 bits per element → S/2 bytes per head per token,
    plus the interleaved f16 (scale, zero point): K = 138 × 4 × 32 B, K scales = 138 × 4 × 4 B."""
    result = run(layers=1, kv_heads=4, head_dim=64, precision="u4", policy="openvino-gpu", prompt=10, decode=1)
    allocs = rows_of(result, op="alloc", step=0)
    assert [(a[2], a[4]) for a in allocs if a[2] in ("k", "k_scale")] == [("k", 138 * 4 * 32), ("k_scale", 138 * 4 * 4)]


def test_reset_frees_and_reclaim_rebuilds_oversized_buffers():
    """§2: reset_state() frees KV buffers (#32916); with the older keep behaviour (#28361) a kept
    buffer is rebuilt when (needed + P_id) × 10 < cap (the padding is reset with the variable)."""
    ops = "prefill:3000,decode:1,reset,prefill:10,decode:1"
    freed = run(layers=1, kv_heads=1, head_dim=16, policy="openvino-gpu", ops=ops)
    assert [a[3] for a in rows_of(freed, step=2, tensor="k")] == ["free"]
    kept = run(layers=1, kv_heads=1, head_dim=16, policy="openvino-gpu", ops=ops, policy_options={"reset": "keep"})
    assert rows_of(kept, step=2) == []
    # 10 + 128 = 138 tokens × 10 < 3128: rebuilt at 138 (nothing to copy after a reset).
    assert [(a[3], a[5]) for a in rows_of(kept, step=3, tensor="k")] == [("alloc", 138)]
    assert [(a[3], a[5]) for a in rows_of(kept, step=4, tensor="k")] == [("free", 3128)]


TINY = dict(layers=1, kv_heads=1, head_dim=16, precision="f16", policy="openvino-gpu")  # K0/V0 data: 32 B a token


def test_chat_turn_that_overflows_with_room_left_carries_the_room():
    """update_shape keeps the old padding (padding::max), do_runtime_in_place_kv_cache leaves it when
    the new tokens do not fit, realloc_if_needed sizes from the padded dims + P_id:
    cap' = L0 + L1 + p + P_id."""
    result = run(**TINY, ops="prefill:100,decode:20,prefill:150")
    # K0 (P_id 128): 100 + 128 = 228. After 20 decode steps 120 stored, p = 108 left.
    # The 150-token turn needs 270 > 228: 120 + 150 + 108 + 128 = 506 (not 270 + 128 = 398).
    assert [(a[0], a[5], a[6]) for a in rows_of(result, op="alloc", tensor="k")] == [(0, 228, 100), (21, 506, 270)]
    # A turn that fits in the room is appended in place: no allocation.
    fits = run(**TINY, ops="prefill:100,decode:20,prefill:100")
    assert [a[0] for a in rows_of(fits, op="alloc", tensor="k")] == [0]


def test_fork_reallocation_carries_the_prompt_headroom():
    """The issue's example: 32 layers, 8 KV heads, K0 with P_id 128, prompt 10 then fork to 4 beams.
    A batch change is never in place (prev batch ≠ beam size); the padding (128 unused tokens) is
    carried: 10 + 1 + 128 + 128 = 267 tokens × 4 beams; next reallocation when 10 + s > 267: step 258."""
    result = run(layers=32, kv_heads=8, head_dim=16, policy="openvino-gpu", ops="prefill:10,fork:4,decode:300")
    row = 8 * 16 * 2  # bytes per token per beam: 8 heads × 16 × f16
    k0 = [(a[0], a[4], a[5]) for a in rows_of(result, op="alloc", tensor="k", layer=0)]
    # After step 258: 268 stored, no room: 268 + 128 = 396 tokens × 4 beams.
    assert k0 == [(0, 138 * row, 138), (1, 267 * 4 * row, 267), (258, 396 * 4 * row, 396)]
    # V31 is primitive 63: P_id = 128 + 63 = 191 → 10 + 191 = 201, then 11 + 191 + 191 = 393, and
    # 10 + s > 393 only at step 384, after the run.
    v31 = [(a[0], a[5]) for a in rows_of(result, op="alloc", tensor="v", layer=31)]
    assert v31 == [(0, 201), (1, 393)]


def test_select_carries_the_room_of_the_beam_buffer():
    """Select (4 beams → 1) is a batch change: rebuilt with the room left carried over."""
    result = run(**TINY, ops="prefill:10,fork:4,decode:5,select:0,decode:3")
    # K0: 138; fork: 267 × 4 beams; after 5 decode steps 16 stored, 251 left; select needs 17:
    # 17 + 251 + 128 = 396 = old capacity + 1 + P_id, for one beam.
    k0 = [(a[0], a[4], a[5]) for a in rows_of(result, op="alloc", tensor="k")]
    assert k0 == [(0, 138 * 32, 138), (1, 267 * 4 * 32, 267), (7, 396 * 32, 396)]


def test_refused_headroom_still_carries_the_padding():
    """can_preallocate refused → the buffer is the padded layout L0 + L1 + p, without P_id."""
    opts = {"beam_tables": 0}
    # Prompt 10: K0 138 × 32 = 4,416 B, V0 139 × 32 = 4,448 B; 8,864 B in use. 0.9 × 46,000 = 41,400.
    # Fork: K0 asks (11 + 128 + 128) × 4 × 32 = 34,176 B; 8,864 + 34,176 ≥ 41,400 → exact padded
    # 11 + 128 = 139 tokens (17,792 B). V0 asks (11 + 129 + 129) × 128 = 34,432 B;
    # 8,864 + 17,792 + 34,432 ≥ 41,400 → 11 + 129 = 140 tokens (17,920 B); 44,576 B ≤ 46,000.
    result = run(**TINY, ops="prefill:10,fork:4", device_memory=46_000, policy_options=opts)
    assert [(a[2], a[5]) for a in rows_of(result, op="alloc", step=1)] == [("k", 139), ("v", 140)]
    assert result.oom is None and result.steps[1]["allocated"] == 44_576


def test_beam_tables_greedy_batch_1_are_sized_once():
    """impls/ocl/kv_cache.cpp: tables are updated only when the present batch > 1 or the past is
    empty. Batch 1: two tables sized at the prompt ([1, 10 + P_id]), never regrown, and kept
    across a reset (the kernel object owns them); the next prompt (empty past) fits in them."""
    result = run(**TINY, ops="prefill:10,decode:1000,reset,prefill:5,decode:2")
    k_beam = [(a[0], a[3], a[4], a[5]) for a in rows_of(result, tensor="k_beam")]
    assert k_beam == [(0, "alloc", 138 * 4, 138), (0, "alloc", 138 * 4, 138)]  # i32, 1 beam
    assert len(rows_of(result, tensor="v_beam")) == 2
    # After the reset only the tables remain: K0 2 × 552 B + V0 2 × 139 × 4 = 2,216 B.
    assert result.steps[1001]["allocated"] == 2 * 552 + 2 * 556


def test_beam_tables_after_a_fork_grow_one_per_step():
    """Fork to 4: the 138-element table is reused until 4 · L > 138 (L = 35, step 25), then
    [4, 35 + 128] = 652 elements; the next step swaps to the other 138-element table and grows
    it to [4, 36 + 128] = 656 elements. The replaced table is freed at once."""
    result = run(**TINY, ops="prefill:10,fork:4,decode:40")
    k_beam = [(a[0], a[3], a[4], a[5]) for a in rows_of(result, tensor="k_beam")]
    assert k_beam == [
        (0, "alloc", 552, 138), (0, "alloc", 552, 138),
        (25, "alloc", 652 * 4, 163), (25, "free", 552, 138),
        (26, "alloc", 656 * 4, 164), (26, "free", 552, 138),
    ]
    # V0 (P_id 129, 139 elements): 4 · 35 = 140 > 139 at step 25 too: [4, 164], then [4, 165].
    v_beam = [(a[0], a[5]) for a in rows_of(result, op="alloc", tensor="v_beam")]
    assert v_beam == [(0, 139), (0, 139), (25, 164), (26, 165)]
    assert_same_run(result, run(engine="reference", **TINY, ops="prefill:10,fork:4,decode:40"))
    # Every step swaps the pair, grown or not: split runs (7 is odd) keep the same schedule.
    split = run(**TINY, ops="prefill:10,fork:4,decode:7,decode:33")
    assert [(a[0], a[3], a[5]) for a in rows_of(split, tensor="k_beam")] == [(r[0], r[1], r[3]) for r in k_beam]


def test_90_percent_check_per_data_buffer_with_weights():
    """ShapePredictor::can_preallocate per buffer: usm_device in use (KV, beam tables, weights) +
    the buffer < 0.9 × global memory; beam tables are not checked."""
    # Prompt 200: K0 data 328 × 32 = 10,496 B, its tables 2 × 328 × 4 = 2,624 B; V0 data
    # 329 × 32 = 10,528 B. 0.9 × 30,000 = 27,000.
    # No weights: V0 check 13,120 + 10,528 = 23,648 < 27,000 → headroom.
    free = run(**TINY, ops="prefill:200", device_memory=30_000)
    assert [(a[2], a[5]) for a in rows_of(free, op="alloc", step=0)] == [
        ("k", 328), ("k_beam", 328), ("k_beam", 328), ("v", 329), ("v_beam", 329), ("v_beam", 329)]
    # 5,000 B of weights: K0 5,000 + 10,496 < 27,000 → headroom; V0 5,000 + 13,120 + 10,528 =
    # 28,648 ≥ 27,000 → exactly 200 tokens; its tables, unchecked, still get 200 + 129 = 329.
    loaded = run(**TINY, ops="prefill:200", device_memory=30_000, weights_memory=5_000)
    assert [(a[2], a[5]) for a in rows_of(loaded, op="alloc", step=0)] == [
        ("k", 328), ("k_beam", 328), ("k_beam", 328), ("v", 200), ("v_beam", 329), ("v_beam", 329)]
    assert loaded.oom is None  # 13,120 + 6,400 + 2,632 + 5,000 = 27,152 ≤ 30,000


def test_buffer_over_the_max_single_allocation():
    """can_preallocate refuses a buffer over max_alloc_mem_size (exact size instead);
    ocl_engine::check_allocatable throws when the exact buffer is still larger."""
    result = run(**TINY, prompt=100, decode=100, policy_options={"max_alloc_bytes": 5_000})
    # Prompt: K0 would be 228 × 32 = 7,296 B > 5,000 → exactly 100 tokens (3,200 B); so is V0.
    # Then every step rebuilds exactly (no room is ever left): step s holds 100 + s tokens.
    # 157 × 32 = 5,024 > 5,000: step 57 throws at K0 ("Exceeded max size of memory object allocation").
    k = [(a[0], a[5]) for a in rows_of(result, op="alloc", tensor="k")]
    assert k[:3] == [(0, 100), (1, 101), (2, 102)] and k[-1] == (56, 156)
    assert isinstance(result.oom, AllocationTooLarge) and (result.oom.step, result.oom.layer) == (57, 0)
    assert result.oom.requested == 157 * 32 and "largest single allocation" in str(result.oom)


@pytest.mark.parametrize("options, caps", [
    ({}, [138, 139, 140, 141]),
    # ids 62, 63, 64, 65 → 128 + id % 64 = 190, 191, 128, 129.
    ({"id_offset": 62}, [200, 201, 138, 139]),
    # V gets the lower id: K0 = 1, V0 = 0, K1 = 3, V1 = 2.
    ({"kv_order": "vk"}, [139, 138, 141, 140]),
])
def test_id_offset_and_kv_order_shift_the_stagger(options, caps):
    """kv_cache_id = network.get_kv_cache_ids().size() (per network, in allocating order)."""
    result = run(**{**TINY, "layers": 2}, prompt=10, decode=1, policy_options=options)
    assert [a[5] for a in rows_of(result, op="alloc", step=0) if a[2] in ("k", "v")] == caps


@pytest.mark.parametrize("kwargs", [
    dict(ops="prefill:100,decode:20,prefill:150"),
    dict(ops="prefill:10,fork:4,decode:5,select:0,decode:3"),
    dict(ops="prefill:10,fork:4", device_memory=46_000, policy_options={"beam_tables": 0}),
    dict(ops="prefill:200", device_memory=30_000, weights_memory=5_000),
    dict(prompt=100, decode=100, policy_options={"max_alloc_bytes": 5_000}),
    dict(ops="prefill:10,decode:1000,reset,prefill:5,decode:2"),
])
def test_golden_scenarios_agree_on_both_engines(kwargs):
    assert_same_run(run(**TINY, **kwargs), run(engine="reference", **TINY, **kwargs))

"""The OpenVINO CPU plugin's schedule, pinned to the values DESIGN.md §3 reports measured.

DESIGN.md §3: "after a P-token prefill cap = 2P; whenever L0 + L1 > cap,
cap = 2 (L0 + L1). Reallocations at L = 2^k (P+1) − 1. Measured, P = 32, u8,
8 kv heads × 64: steps 33, 99, 231, 495, 1023, 2079, 4191 with caps 130, 262,
526, 1054, 2110, 4222, 8446 and data buffers 66,560 … 4,324,352 B".
"""

from conftest import assert_same_run, rows_of, run

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
    """Observed order (docs/DESIGN.md §3): the past-view block first, then per layer the beam
    tables, then data and scales; old scales freed K then V, old data V then K."""
    result = run(layers=2, kv_heads=8, head_dim=64, precision="u8", policy="openvino-cpu", prompt=32, decode=40)
    per_token = dict(k=512, v=512, k_scale=64, v_scale=64, k_beam=4, v_beam=4)
    # Buffers 0-11: prefill (per layer kb, vb, k, v, ks, vs); 12-43: one past view per step 1-32.
    expected = [
        (33, -1, "past_view", "alloc", 1 * 8 * 64 * 64 * 4, 64, 0, 44),
        (33, -1, "past_view", "free", 1 * 8 * 63 * 64 * 4, 63, 0, 43),
    ]
    for layer in range(2):
        old = dict(zip(("k_beam", "v_beam", "k", "v", "k_scale", "v_scale"), range(6 * layer, 6 * layer + 6)))
        new = {t: 45 + 6 * layer + (b - 6 * layer) for t, b in old.items()}
        for token in ("+k_beam +v_beam =k_beam =v_beam -v_beam -k_beam +k +v +k_scale +v_scale "
                      "=k =v =k_scale =v_scale -k_scale -v_scale -v -k").split():
            op, t = token[0], token[1:]
            if op == "+":
                expected.append((33, layer, t, "alloc", 130 * per_token[t], 130, 65, new[t]))
            elif op == "=":
                expected.append((33, layer, t, "copy", 64 * per_token[t], 130, 64, new[t]))
            else:
                expected.append((33, layer, t, "free", 64 * per_token[t], 64, 64, old[t]))
    assert rows_of(result, step=33) == expected


def test_in_step_peak_is_all_new_plus_the_last_layers_old_data():
    """All layers' new buffers + the last layer's old K, V and scales (its old beam tables are
    already freed) + the new past view: measured 11,004,608 B of KV at step 1023 (4 layers)."""
    four = run(**{**CPU_U8, "layers": 4, "decode": 1100})
    view = 1 * 8 * (32 + 1022) * 64 * 4
    assert four.steps[1023]["peak"] - view == 11_004_608
    layers = 32
    result = run(**{**CPU_U8, "layers": layers})
    step = result.steps[4191]
    view = 8 * (32 + 4190) * 64 * 4
    per_token = 2 * (512 + 64 + 4)  # K and V: data, scales, beam table
    assert step["allocated"] == step["steady"] == layers * 8446 * per_token + view
    assert step["peak"] == step["allocated"] + 4222 * 2 * (512 + 64)


def test_past_view_grows_every_step_and_is_never_resident():
    """One model-wide f32 [B, H, L0, S] block, exact size, new allocated before the old is freed."""
    result = run(**{**CPU_U8, "decode": 50})
    views = rows_of(result, tensor="past_view")
    assert [(v[0], v[3], v[4]) for v in views[:3]] == [
        (1, "alloc", 32 * 2048), (2, "alloc", 33 * 2048), (2, "free", 32 * 2048),
    ]
    assert len(views) == 2 * 50 - 1
    steps = result.steps
    assert steps[50]["resident"] == 2 * (32 + 50) * 2 * (512 + 64 + 4)  # written KV rows only


def test_reset_keeps_capacity_and_batch_change_rebuilds():
    result = run(layers=1, kv_heads=2, head_dim=16, precision="f32", policy="openvino-cpu",
                 ops="prefill:10,decode:5,reset,prefill:8,fork:3,decode:2,select:1")
    kv = lambda step: [r for r in rows_of(result, step=step) if r[2] != "past_view"]  # noqa: E731
    # reset: nothing freed, resident memory stays; the 8-token prompt fits the kept capacity (20).
    assert kv(6) == [] and kv(7) == []
    assert result.steps[6]["resident"] == result.steps[5]["resident"] and result.steps[6]["used"] == 0
    # fork at step 8: every buffer rebuilt at cap = 2 * 9 for 3 beams, 8 tokens gathered, data
    # before beam tables. Buffers 0-3: prefill (kb, vb, k, v); 4-8: past views of steps 1-5.
    assert [(r[2], r[3], r[4], r[7]) for r in kv(8)] == [
        ("k", "alloc", 18 * 3 * 128, 9), ("v", "alloc", 18 * 3 * 128, 10),
        ("k", "copy", 8 * 3 * 128, 9), ("v", "copy", 8 * 3 * 128, 10),
        ("v", "free", 20 * 128, 3), ("k", "free", 20 * 128, 2),
        ("k_beam", "alloc", 18 * 3 * 4, 11), ("v_beam", "alloc", 18 * 3 * 4, 12),
        ("k_beam", "copy", 8 * 3 * 4, 11), ("v_beam", "copy", 8 * 3 * 4, 12),
        ("v_beam", "free", 20 * 4, 1), ("k_beam", "free", 20 * 4, 0),
    ]
    # select shrinks back to one beam: the only time CPU memory shrinks.
    assert [r for r in kv(11) if r[3] == "alloc" and r[2] == "k"] == [(11, 0, "k", "alloc", 24 * 128, 24, 12, 16)]
    assert result.steps[11]["steady"] < result.steps[10]["steady"]


def test_prompt_after_reset_adopts_its_batch_when_rows_fit():
    """The capacity is a budget of rows: after a reset during beam search (4 beams × cap 22 =
    88 rows), a one-beam prompt of up to 88 tokens reuses the buffers; a longer one grows them
    with each pair replaced in turn (+Kb +Vb -Kb -Vb +K +V -K -V)."""
    ops = "prefill:10,fork:4,decode:8,reset,prefill:{},decode:2"
    fits = run(layers=1, kv_heads=1, head_dim=16, precision="f32", policy="openvino-cpu", ops=ops.format(88))
    assert [r for r in rows_of(fits, step=11) if r[2] != "past_view"] == []
    assert fits.steps[11]["batch"] == 1 and fits.steps[11]["tokens"] == 88
    grows = run(layers=1, kv_heads=1, head_dim=16, precision="f32", policy="openvino-cpu", ops=ops.format(89))
    assert [(r[2], r[3], r[5]) for r in rows_of(grows, step=11)] == [
        ("k_beam", "alloc", 178), ("v_beam", "alloc", 178), ("k_beam", "free", 88), ("v_beam", "free", 88),
        ("k", "alloc", 178), ("v", "alloc", 178), ("k", "free", 88), ("v", "free", 88),
    ]


def test_reorder_at_same_width_allocates_nothing():
    result = run(layers=2, kv_heads=2, head_dim=16, policy="openvino-cpu", ops="prefill:10,fork:2,reorder,reorder")
    assert [r for r in rows_of(result, step=2) + rows_of(result, step=3) if r[2] != "past_view"] == []


def test_double_buffered_states_hand_worked():
    """A hybrid model's linear-attention states under the CPU plugin (docs/DESIGN.md §4c, policies/openvino_cpu.py):
    two buffers per state, the read ones sized before the past block and any layer (conv, recurrent per layer),
    the written ones where the export's graph writes them (recurrent with its layer, conv after the last layer,
    descending), grown only, swapped after every inference. Layers: linear, full, linear, full; states in bf16
    (conv 8 elements: 16 B, recurrent 16: 32 B per sequence), KV f32 1 head x 4 (16 B per token; beam tables 4 B),
    past block 16 B per row. Every byte below is worked out by hand."""
    from policies import get_policy
    from simkv.kvspec import LayerKV
    from simkv.models import ModelSpec
    from simkv.precision import get_precision
    from simkv.scenario import Scenario, simulate
    from simkv.workload import parse_ops

    linear, full = LayerKV("linear", conv_elements=8, recurrent_elements=16), LayerKV("full", 1, 4, 4)
    model = ModelSpec("hybrid-tiny", 4, 1, 1, 4, layer_kv=(linear, full, linear, full))
    ops = "prefill:2,decode:1,fork:2,decode:1,select:1,reset,prefill:1"  # steps 0 … 6
    scenario = Scenario(model, get_precision("f32"), get_policy("openvino-cpu"), parse_ops(ops))
    result = simulate(scenario)
    assert_same_run(result, simulate(scenario, engine="reference"))
    def rows(step):  # (layer, tensor, op, bytes, buffer) of every allocation and free
        return [(r[1], r[2], r[3], r[4], r[7]) for r in rows_of(result, step=step) if r[3] != "copy"]

    # Step 0, the prompt (2 tokens, cap 4): the read buffers (ids 0-3), then per layer: layer 0's written
    # recurrent state, layer 1's KV (beam tables, data), layer 2's recurrent state, layer 3's KV, then the
    # written conv states of layers 2 and 0. No past block yet (nothing stored).
    assert rows(0) == [
        (0, "conv_state", "alloc", 16, 0), (0, "recurrent_state", "alloc", 32, 1),
        (2, "conv_state", "alloc", 16, 2), (2, "recurrent_state", "alloc", 32, 3),
        (0, "recurrent_state", "alloc", 32, 4),
        (1, "k_beam", "alloc", 16, 5), (1, "v_beam", "alloc", 16, 6),
        (1, "k", "alloc", 64, 7), (1, "v", "alloc", 64, 8),
        (2, "recurrent_state", "alloc", 32, 9),
        (3, "k_beam", "alloc", 16, 10), (3, "v_beam", "alloc", 16, 11),
        (3, "k", "alloc", 64, 12), (3, "v", "alloc", 64, 13),
        (2, "conv_state", "alloc", 16, 14), (0, "conv_state", "alloc", 16, 15),
    ]
    # Step 1, decode: only the past block (2 rows of 16 B); the states swapped, nothing allocated.
    assert rows(1) == [(-1, "past_view", "alloc", 32, 16)]
    # Step 2, fork to 2 beams: the past block (3 rows: it holds the stored batch); the buffers written in this
    # step (since step 1's swap: ids 4, 9 recurrent; 14, 15 conv) grow to 2 rows, each at its place among the
    # KV layers' rebuilds (cap 2 x 4 = 8 tokens x 2 beams).
    assert rows(2) == [
        (-1, "past_view", "alloc", 48, 17), (-1, "past_view", "free", 32, 16),
        (0, "recurrent_state", "alloc", 64, 18), (0, "recurrent_state", "free", 32, 4),
        (1, "k", "alloc", 256, 19), (1, "v", "alloc", 256, 20), (1, "v", "free", 64, 8), (1, "k", "free", 64, 7),
        (1, "k_beam", "alloc", 64, 21), (1, "v_beam", "alloc", 64, 22),
        (1, "v_beam", "free", 16, 6), (1, "k_beam", "free", 16, 5),
        (2, "recurrent_state", "alloc", 64, 23), (2, "recurrent_state", "free", 32, 9),
        (3, "k", "alloc", 256, 24), (3, "v", "alloc", 256, 25), (3, "v", "free", 64, 13), (3, "k", "free", 64, 12),
        (3, "k_beam", "alloc", 64, 26), (3, "v_beam", "alloc", 64, 27),
        (3, "v_beam", "free", 16, 11), (3, "k_beam", "free", 16, 10),
        (2, "conv_state", "alloc", 32, 28), (2, "conv_state", "free", 16, 14),
        (0, "conv_state", "alloc", 32, 29), (0, "conv_state", "free", 16, 15),
    ]
    # In-step peak: 544 B before (states 2 x (16 + 32) x 2 buffers, KV 2 x 160, past block 32), 1,616 B after;
    # the peak is the last conv state's new buffer beside its old one: 1,632 B.
    assert (result.steps[1]["allocated"], result.steps[2]["allocated"], result.steps[2]["peak"]) == (544, 1616, 1632)
    # Step 3, decode at 2 beams: the other buffers (ids 0-3, read in step 2) grow to 2 rows at the start, in
    # read order, before the past block (2 x 4 rows).
    assert rows(3) == [
        (0, "conv_state", "alloc", 32, 30), (0, "conv_state", "free", 16, 0),
        (0, "recurrent_state", "alloc", 64, 31), (0, "recurrent_state", "free", 32, 1),
        (2, "conv_state", "alloc", 32, 32), (2, "conv_state", "free", 16, 2),
        (2, "recurrent_state", "alloc", 64, 33), (2, "recurrent_state", "free", 32, 3),
        (-1, "past_view", "alloc", 128, 34), (-1, "past_view", "free", 48, 17),
    ]
    # Allocated = steady = every live buffer: states 2 x 2 x (32 + 64), KV 2 x 640, past block 128.
    assert result.steps[3]["allocated"] == result.steps[3]["steady"] == 384 + 1280 + 128
    # The states are held once (the read buffer's 2 rows) in `used`: 2 x (16 + 32) x 2 beams = 192 B beside the
    # KV's 5 tokens x 2 beams x 40 B x 2 layers.
    assert result.steps[3]["used"] == 192 + 800
    # Select (step 4: the KV shrinks to one beam), reset (5) and a prompt that fits (6): no state event.
    assert not [r for step in (4, 5, 6) for r in rows(step) if r[1] in ("conv_state", "recurrent_state")]
    assert rows(5) == rows(6) == []
    # Never shrunk: after the select, the reset and the prompt the states keep their 384 B beside the KV
    # rebuilt for one beam (cap 2 x 6 = 12: 2 x (192 + 192 + 48 + 48)) and the past block (2 x 5 rows).
    assert result.steps[6]["allocated"] == result.steps[6]["steady"] == 384 + 960 + 160


def test_double_buffered_conv_states_without_recurrent_hand_worked():
    """LFM2's short-conv layers under the CPU plugin: a conv state alone (``cache_params.past.conv.N``
    ``[B, hidden_size, conv_L_cache]``, no recurrent variable), double-buffered like Qwen3-Next's
    (docs/DESIGN.md §4c). The measured export (``simkv validate --ir`` on the tiny LFM2 export,
    docs/results/validation.md "Exported models per layer kind") writes its conv states where Qwen3-Next's graph does, after the last layer in
    descending order, so ``state_writes`` is unchanged; the state unit's recurrent place is an absent slot
    that never emits a row. Layers: conv, full, conv, full; conv 8 elements in bf16 (16 B per sequence), KV
    f32 1 head x 4 (16 B per token; beam tables 4 B), past block 16 B per row. Worked out by hand."""
    from policies import get_policy
    from simkv.kvspec import LayerKV
    from simkv.models import ModelSpec
    from simkv.precision import get_precision
    from simkv.scenario import Scenario, simulate
    from simkv.workload import parse_ops

    conv, full = LayerKV("linear", conv_elements=8), LayerKV("full", 1, 4, 4)
    model = ModelSpec("lfm2-tiny", 4, 1, 1, 4, layer_kv=(conv, full, conv, full))
    ops = "prefill:2,decode:1,fork:2,decode:1,select:1,reset,prefill:1"  # steps 0 … 6
    scenario = Scenario(model, get_precision("f32"), get_policy("openvino-cpu"), parse_ops(ops))
    result = simulate(scenario)
    assert_same_run(result, simulate(scenario, engine="reference"))

    def rows(step):  # (layer, tensor, op, bytes, buffer) of every allocation and free
        return [(r[1], r[2], r[3], r[4], r[7]) for r in rows_of(result, step=step) if r[3] != "copy"]

    assert all(r[2] != "recurrent_state" for step in range(7) for r in rows(step))
    # Step 0, the prompt (2 tokens, cap 4): the read buffers of both conv layers, the KV layers (beam tables
    # 4 x 4 B, data 4 x 16 B), then the written conv states of layers 2 and 0. 4 x 16 + 2 x 160 = 384 B.
    assert rows(0) == [
        (0, "conv_state", "alloc", 16, 0), (2, "conv_state", "alloc", 16, 1),
        (1, "k_beam", "alloc", 16, 2), (1, "v_beam", "alloc", 16, 3), (1, "k", "alloc", 64, 4), (1, "v", "alloc", 64, 5),
        (3, "k_beam", "alloc", 16, 6), (3, "v_beam", "alloc", 16, 7), (3, "k", "alloc", 64, 8), (3, "v", "alloc", 64, 9),
        (2, "conv_state", "alloc", 16, 10), (0, "conv_state", "alloc", 16, 11),
    ]
    assert rows(1) == [(-1, "past_view", "alloc", 32, 12)]  # decode: the past block only (2 rows)
    # Step 2, fork to 2 beams (as the export's step 61): the KV rebuilt at cap 8 x 2 beams, then the buffers
    # written in this step (ids 10, 11) grow to 2 rows, layer 2 then layer 0.
    assert rows(2)[-4:] == [(2, "conv_state", "alloc", 32, 22), (2, "conv_state", "free", 16, 10),
                            (0, "conv_state", "alloc", 32, 23), (0, "conv_state", "free", 16, 11)]
    # states 16 + 16 + 32 + 32, KV 2 x (256 + 256 + 64 + 64), past block 48; the peak is the last new conv
    # buffer beside its old one.
    assert (result.steps[2]["allocated"], result.steps[2]["peak"]) == (96 + 1280 + 48, 1424 + 16)
    # Step 3 (the export's step 62): the other buffers grow at the start, in layer order, before the past block.
    assert rows(3) == [(0, "conv_state", "alloc", 32, 24), (0, "conv_state", "free", 16, 0),
                       (2, "conv_state", "alloc", 32, 25), (2, "conv_state", "free", 16, 1),
                       (-1, "past_view", "alloc", 128, 26), (-1, "past_view", "free", 48, 13)]
    # Select, reset, a prompt that fits: no state event; never shrunk (4 x 32 B kept beside the one-beam KV
    # at cap 12: 2 x (192 + 192 + 48 + 48), and the past block of 2 x 5 rows).
    assert not [r for step in (4, 5, 6) for r in rows(step) if r[1] == "conv_state"]
    assert result.steps[6]["allocated"] == result.steps[6]["steady"] == 128 + 960 + 160

"""Models whose layers differ (simkv.kvspec): the fast engine equals the reference, memory is conserved, and
hand-worked sequences of the per-layer rules.

Random stacks of full, sliding, chunked, MLA, linear-attention and cache-less layers under every policy,
with the random stateful workloads of test_properties (prefill, decode, chat turns, reset, beam fork /
reorder / select) and random mechanics options.
"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from conftest import assert_same_run, rows_of
from policies import get_policy
from simkv.errors import SimkvError
from simkv.kvspec import LayerKV
from simkv.memory import replay
from simkv.models import ModelSpec
from simkv.precision import get_precision
from simkv.scenario import Scenario, simulate
from simkv.units import parse_bytes
from simkv.workload import parse_ops
from test_properties import SETTINGS, workloads

POLICIES = ["openvino-gpu", "openvino-cpu", "fixed", "geometric", "exact", "static", "stateless", "hf-dynamic"]


@st.composite
def layer_specs(draw):
    kind = draw(st.sampled_from(["full", "full", "sliding", "chunked", "mla", "linear", "none"]))
    heads = draw(st.sampled_from([1, 2, 4]))
    dim = draw(st.sampled_from([16, 32]))
    if kind == "mla":
        return LayerKV("full", 4, 24, 16, latent=(draw(st.sampled_from([16, 32])), 8))
    if kind == "linear":
        conv = draw(st.integers(1, 200))  # recurrent 0: LFM2's conv-only state (the recurrent slot absent)
        return LayerKV("linear", conv_elements=conv, recurrent_elements=draw(st.sampled_from([0, 1, 17, 300])))
    if kind == "none":
        return LayerKV("none")
    window = draw(st.integers(1, 40)) if kind in ("sliding", "chunked") else None
    return LayerKV(kind, heads, dim, dim, window, sinks=draw(st.booleans()))


@st.composite
def scenarios(draw):
    layers = draw(st.lists(layer_specs(), min_size=1, max_size=5).filter(lambda ls: any(x.kind != "none" for x in ls)))
    model = ModelSpec("mixed", len(layers), 4, 4, 16, layer_kv=tuple(layers))
    policy = draw(st.sampled_from(POLICIES))
    opts = {}
    if policy == "static":
        opts = {"max_prompt_len": 2048, "min_response_len": draw(st.integers(500, 4000))}
    if draw(st.booleans()):
        opts["free_old"] = draw(st.sampled_from(["immediate", "end_of_step", "next_inference"]))
    if draw(st.booleans()):
        opts["reset"] = draw(st.sampled_from(["keep", "free"]))
    if draw(st.integers(0, 4)) == 0 and policy != "hf-dynamic":
        opts["beam_tables"] = draw(st.integers(0, 2)) if policy not in ("openvino-gpu", "fixed") else 2
    # transformers keeps its cache in the model's dtype: no scale buffers in its row orders.
    precision = draw(st.sampled_from(["f32", "f16"] if policy == "hf-dynamic" else ["f32", "f16", "u8", "u4", "i8"]))
    try:
        pol = get_policy(policy, opts)
        prec = get_precision(precision)
        if pol.accepted_precisions and prec.name not in pol.accepted_precisions:
            return draw(st.nothing())
        return Scenario(model, prec, pol, parse_ops(draw(workloads())),
                        parse_bytes(draw(st.sampled_from(["16GiB", "4MiB", "1MiB"]))), 0)
    except SimkvError:
        return draw(st.nothing())


@SETTINGS
@given(scenarios())
def test_fast_engine_equals_reference_per_layer(scenario):
    assert_same_run(simulate(scenario), simulate(scenario, engine="reference"))


@SETTINGS
@given(scenarios())
def test_memory_is_conserved_per_layer(scenario):
    result = simulate(scenario)
    rows, steps = result.ledger.rows, result.steps
    live = replay(result.ledger, scenario.device_memory)
    assert sum(live.values()) == steps["allocated"][-1]
    assert (rows["bytes"] > 0).all()  # an absent slot never writes a row
    assert (steps["used"] <= steps["steady"]).all()
    assert (steps["steady"] <= steps["allocated"]).all()
    assert (steps["allocated"] <= steps["peak"]).all()
    allocs = rows[rows["op"] == 0]
    assert len(np.unique(allocs["buffer"])) == len(allocs)  # every buffer id allocated once


def _hf(layers, ops, precision="f32"):
    model = ModelSpec("mixed", len(layers), 4, 2, 16, layer_kv=tuple(layers))
    return Scenario(model, get_precision(precision), get_policy("hf-dynamic"), parse_ops(ops), parse_bytes("16GiB"), 0)


SLIDING = LayerKV("sliding", 2, 16, 16, 4)  # Gemma-3 tiny: W 4, 2 kv heads x 16, f32: 128 B per token per K
FULL = LayerKV("full", 2, 16, 16)


def test_sliding_layer_crossing_its_window_hf_dynamic():
    # transformers 5.23 DynamicSlidingWindowLayer (docs/DESIGN.md §3c): prefill P = 6 -> cat of 6 tokens
    # (768 B) each for K and V; decode cats min(c, W-1) + 1 = 4 tokens (512 B): +K +V -K_old -V_old.
    result = simulate(_hf([SLIDING, FULL], "prefill:6,decode:3"))
    assert [(s, t, o, b) for s, _, t, o, b, *_ in rows_of(result, layer=0) if o != "copy"] == [
        (0, "k", "alloc", 768), (0, "v", "alloc", 768),
        (1, "k", "alloc", 512), (1, "v", "alloc", 512), (1, "k", "free", 768), (1, "v", "free", 768),
        (2, "k", "alloc", 512), (2, "v", "alloc", 512), (2, "k", "free", 512), (2, "v", "free", 512),
        (3, "k", "alloc", 512), (3, "v", "alloc", 512), (3, "k", "free", 512), (3, "v", "free", 512),
    ]
    # The full layer: +K[c+1] -K[c] +V[c+1] -V[c], 128 B per token.
    assert [(s, t, o, b) for s, _, t, o, b, *_ in rows_of(result, layer=1, step=2) if o != "copy"] == [
        (2, "k", "alloc", 1024), (2, "k", "free", 896), (2, "v", "alloc", 1024), (2, "v", "free", 896),
    ]


def test_chunked_layer_is_a_sliding_layer_at_its_chunk_boundary():
    # Llama-4 chunked layers are DynamicSlidingWindowLayer with W = attention_chunk_size: crossing the chunk
    # boundary at position 8 (C = 4) changes nothing: every decode step allocates 4 tokens (§3c), the
    # 3 kept tokens copied (384 B) into it.
    chunked = LayerKV("chunked", 2, 16, 16, 4)
    result = simulate(_hf([chunked], "prefill:6,decode:6"))
    allocs = [(s, b) for s, _, t, o, b, *_ in rows_of(result, op="alloc", tensor="k")]
    assert allocs == [(0, 768)] + [(s, 512) for s in range(1, 7)]
    assert {b for _, _, t, o, b, *_ in rows_of(result, op="copy", tensor="k")} == {384}


def test_linear_state_allocated_once_and_gathered_on_reorder():
    # Qwen3-Next tiny: conv [1, 2*2*8 + 4*12 = 80, 4] f32 = 1280 B, recurrent [1, 4, 8, 12] f32 = 1536 B,
    # allocated at prefill, updated in place while decoding; reorder_cache gathers both (+new -old each).
    linear = LayerKV("linear", conv_elements=80 * 4, recurrent_elements=4 * 8 * 12)
    result = simulate(_hf([linear, FULL], "prefill:6,decode:3,fork:2,decode:1,reorder"))
    state_rows = [(s, t, o, b) for s, _, t, o, b, *_ in rows_of(result, layer=0)]
    assert state_rows[:2] == [(0, "conv_state", "alloc", 1280), (0, "recurrent_state", "alloc", 1536)]
    assert all(s != step for s, *_ in state_rows for step in (1, 2, 3))  # nothing while decoding
    fork = [(t, o, b) for s, t, o, b in state_rows if s == 4]
    assert fork == [("conv_state", "alloc", 2560), ("conv_state", "copy", 2560), ("conv_state", "free", 1280),
                    ("recurrent_state", "alloc", 3072), ("recurrent_state", "copy", 3072),
                    ("recurrent_state", "free", 1536)]


def test_mla_latent_versus_decompressed():
    # DeepSeek-V3 tiny: kv_lora_rank 32, qk_rope 8, 4 heads of nope 16 + rope 8 = 24 (K) and v 12.
    # transformers 5.23 caches the latent: K [B,1,L,32] = 128 B/token f32, V [B,1,L,8] = 32 B;
    # an OpenVINO export caches per-head K 4*24*4 = 384 B and V 4*12*4 = 192 B per token.
    mla = LayerKV("full", 4, 24, 12, latent=(32, 8))
    latent = simulate(_hf([mla], "prefill:10"))
    assert [(t, b) for _, _, t, _, b, *_ in rows_of(latent)] == [("k", 1280), ("v", 320)]
    model = ModelSpec("mla", 1, 4, 4, 24, layer_kv=(mla,))
    ov = simulate(Scenario(model, get_precision("f32"), get_policy("exact"), parse_ops("prefill:10"),
                           parse_bytes("16GiB"), 0))
    assert [(t, b) for _, _, t, o, b, *_ in rows_of(ov, op="alloc")] == [("k", 1280), ("v", 320)]
    cpu = simulate(Scenario(model, get_precision("f32"), get_policy("openvino-cpu"), parse_ops("prefill:10"),
                            parse_bytes("16GiB"), 0))
    # The CPU plugin doubles: cap 2P = 20 tokens of the decompressed rows.
    data = [(t, b) for _, _, t, o, b, *_ in rows_of(cpu, op="alloc") if t in ("k", "v")]
    assert data == [("k", 20 * 384), ("v", 20 * 192)]

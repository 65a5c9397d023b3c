"""hf-dynamic and hf-static: golden ledgers worked out by hand from transformers' cache_utils.py.

Source (transformers 5.23.0, ``src/transformers/cache_utils.py``): ``DynamicLayer.update`` is
``self.keys = torch.cat([self.keys, key_states])`` then the same for values (new tensor,
old dropped at once); ``DynamicSlidingWindowLayer.update`` does both cats before keeping a
view of the last ``W - 1`` tokens; ``StaticLayer.lazy_initialization`` allocates
``max_cache_len`` K then V on the first forward; ``CacheLayerMixin.reorder_cache`` is
``index_select`` of K then V; ``DynamicLayer.reset`` drops K then V.

Shape used throughout unless said otherwise: 2 layers, 2 KV heads x 16, f16, so one K (or V)
token of one beam costs 2 x 16 x 2 = 64 B.
"""

import subprocess
import sys

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from conftest import assert_same_run, rows_of
from test_properties import workloads
from simkv import build_scenario, simulate
from simkv.errors import PolicyError, SimkvError
from simkv.memory import replay

SMALL = dict(model=None, layers=2, heads=4, kv_heads=2, head_dim=16, precision="f16")
T = 64  # bytes per token per beam of one K (or V) tensor


def run(ops, policy="hf-dynamic", engine="fast", **kw):
    return simulate(build_scenario(**{**SMALL, **kw}, policy=policy, ops=ops), engine=engine)


def events(result, step):
    """(layer, tensor, op, bytes) of a step's allocs and frees (copies are not allocations)."""
    return [(la, t, op, b) for _, la, t, op, b, *_ in rows_of(result, step=step) if op != "copy"]


def per_layer(layers, pattern):
    return [(la, t, op, b) for la in range(layers) for t, op, b in pattern]


def test_dynamic_cat_replaces_one_tensor_at_a_time():
    r = run("prefill:8,decode:2")
    # Prefill: the cat of an empty tensor and 8 tokens allocates 8 x 64 = 512 B, K then V.
    assert events(r, 0) == per_layer(2, [("k", "alloc", 512), ("v", "alloc", 512)])
    # Decode 1: cat -> 9 tokens (576 B), the assignment frees the 8-token tensor: +K -K +V -V.
    assert events(r, 1) == per_layer(2, [("k", "alloc", 576), ("k", "free", 512), ("v", "alloc", 576), ("v", "free", 512)])
    assert events(r, 2) == per_layer(2, [("k", "alloc", 640), ("k", "free", 576), ("v", "alloc", 640), ("v", "free", 576)])
    # Step 2 starts at 4 x 576 = 2304 B; each replacement adds 640 - 576 = 64 net, so the last
    # alloc (layer 1 V, after three replacements) peaks at 2304 + 3 x 64 + 640 = 3136 = final 2560 + 576.
    assert r.steps["allocated"][2] == 4 * 640
    assert r.steps["peak"][2] == 3136
    # The copy is the past only (the new token is written by the cat itself).
    assert [c[4] for c in rows_of(r, op="copy", step=2, layer=0)] == [9 * T, 9 * T]


def test_dynamic_reset_frees_k_then_v_layer_by_layer_and_starts_over():
    r = run("prefill:4,decode:1,reset,prefill:3")
    assert events(r, 2) == per_layer(2, [("k", "free", 5 * T), ("v", "free", 5 * T)])
    assert events(r, 3) == per_layer(2, [("k", "alloc", 3 * T), ("v", "alloc", 3 * T)])
    assert r.steps["allocated"][2] == 0


def test_dynamic_beam_step_gathers_then_concatenates():
    r = run("prefill:8,decode:1,fork:3,reorder,select:2")
    # fork:3 at 9 tokens: reorder_cache index_select -> 3 beams x 9 = 27 tokens (1728 B), old freed,
    # per layer K then V; then the forward's cat -> 3 x 10 tokens (1920 B).
    gather = per_layer(2, [("k", "alloc", 1728), ("k", "free", 576), ("v", "alloc", 1728), ("v", "free", 576)])
    forward = per_layer(2, [("k", "alloc", 1920), ("k", "free", 1728), ("v", "alloc", 1920), ("v", "free", 1728)])
    assert events(r, 2) == gather + forward
    # reorder at the same width still copies every layer: 3 x 10 = 1920 B, then 3 x 11 = 2112 B.
    assert events(r, 3) == (
        per_layer(2, [("k", "alloc", 1920), ("k", "free", 1920), ("v", "alloc", 1920), ("v", "free", 1920)])
        + per_layer(2, [("k", "alloc", 2112), ("k", "free", 1920), ("v", "alloc", 2112), ("v", "free", 1920)])
    )
    # select: index_select of one beam (11 tokens, 704 B), then cat -> 12 tokens (768 B).
    assert events(r, 4) == (
        per_layer(2, [("k", "alloc", 704), ("k", "free", 2112), ("v", "alloc", 704), ("v", "free", 2112)])
        + per_layer(2, [("k", "alloc", 768), ("k", "free", 704), ("v", "alloc", 768), ("v", "free", 704)])
    )


def test_sliding_window_keeps_w_minus_1_and_allocates_w_every_step():
    # --sliding-window 6: the layer keeps a view of the last 5 tokens of each cat.
    r = run("prefill:8,decode:3,fork:3", sliding_window=6)
    assert r.scenario.model.sliding_window == 6
    # The 8-token prefill cat stays alive behind the view: 512 B.
    assert events(r, 0) == per_layer(2, [("k", "alloc", 512), ("v", "alloc", 512)])
    # Next: cat of the 5 kept tokens + 1 = 6 tokens (384 B); both cats before either old
    # tensor is dropped: +K +V -K -V.
    assert events(r, 1) == per_layer(2, [("k", "alloc", 384), ("v", "alloc", 384), ("k", "free", 512), ("v", "free", 512)])
    assert events(r, 3) == per_layer(2, [("k", "alloc", 384), ("v", "alloc", 384), ("k", "free", 384), ("v", "free", 384)])
    # fork: index_select of the 5-token view x 3 beams = 960 B (+K -K +V -V), then cat 3 x 6 = 1152 B.
    assert events(r, 4) == (
        per_layer(2, [("k", "alloc", 960), ("k", "free", 384), ("v", "alloc", 960), ("v", "free", 384)])
        + per_layer(2, [("k", "alloc", 1152), ("v", "alloc", 1152), ("k", "free", 960), ("v", "free", 960)])
    )
    # Used = the 5 kept tokens x 3 beams x (K+V) x 2 layers.
    assert r.steps["used"][4] == 5 * 3 * 2 * 2 * T


def test_sliding_window_longer_than_the_session_is_plain_dynamic_growth():
    a = run("prefill:8,decode:20", sliding_window=100)
    b = run("prefill:8,decode:20")
    assert [e for s in range(21) for e in events(a, s) if e[2] == "alloc"] == [
        e for s in range(21) for e in events(b, s) if e[2] == "alloc"]


def test_static_allocates_max_cache_len_once():
    r = run("prefill:8,decode:5,fork:3,decode:2,select:0,reset,prefill:4", policy="hf-static",
            policy_options={"max_cache_len": 40})
    # lazy_initialization: torch.zeros of 40 tokens = 2560 B, K then V, per layer.
    assert events(r, 0) == per_layer(2, [("k", "alloc", 2560), ("v", "alloc", 2560)])
    assert all(events(r, s) == [] for s in range(1, 6))
    # fork: index_select of the whole 40-token tensors at 3 beams = 7680 B; the forward writes in place.
    assert events(r, 6) == per_layer(2, [("k", "alloc", 7680), ("k", "free", 2560), ("v", "alloc", 7680), ("v", "free", 2560)])
    assert events(r, 7) == events(r, 8) == []
    assert events(r, 9) == per_layer(2, [("k", "alloc", 2560), ("k", "free", 7680), ("v", "alloc", 2560), ("v", "free", 7680)])
    # reset zeroes and keeps; the next prompt writes in place.
    assert events(r, 10) == events(r, 11) == []
    assert r.steps["allocated"][-1] == 4 * 2560


def test_static_refuses_what_transformers_cannot_run():
    with pytest.raises(PolicyError, match="max_cache_len"):
        run("prefill:30,decode:20", policy="hf-static", policy_options={"max_cache_len": 40})
    # A chat turn overflowing a non-empty StaticSlidingWindowLayer concatenates temporaries (not modelled).
    with pytest.raises(PolicyError, match="StaticSlidingWindowLayer"):
        run("prefill:3,prefill:2", policy="hf-static", sliding_window=4, policy_options={"max_cache_len": 40})
    with pytest.raises(PolicyError, match="select one beam"):
        run("prefill:8,fork:2,reset,prefill:4", policy="hf-static", policy_options={"max_cache_len": 40})


@pytest.mark.parametrize("kv_heads,precision,token_bytes", [(4, "f32", 4 * 16 * 4), (1, "bf16", 1 * 16 * 2)])
def test_bytes_follow_shape_and_precision(kv_heads, precision, token_bytes):
    r = run("prefill:5,decode:1", kv_heads=kv_heads, precision=precision)
    assert events(r, 1)[:2] == [(0, "k", "alloc", 6 * token_bytes), (0, "k", "free", 5 * token_bytes)]


def test_issue_example_in_step_increase_is_one_tensor():
    """Llama-2-7B, 2,048 + 24 tokens: the last step's peak is the cache plus one old K tensor
    (2,071 tokens x 32 heads x 128 x 2 B = 16,965,632 B), not a second cache as under ``exact``."""
    r = simulate(build_scenario(model="llama-2-7b", policy="hf-dynamic", prompt=2048, decode=24))
    last = r.steps[-1]
    assert last["allocated"] == 2072 * 32 * 2 * 32 * 128 * 2
    assert last["peak"] - last["allocated"] == 2071 * 32 * 128 * 2
    exact = simulate(build_scenario(model="llama-2-7b", policy="exact", prompt=2048, decode=24))
    assert exact.steps[-1]["peak"] > 1.99 * last["allocated"]


@st.composite
def hf_scenarios(draw):
    policy = draw(st.sampled_from(["hf-dynamic", "hf-static", "exact", "openvino-cpu", "fixed"]))
    ops = [draw(workloads())]
    opts = {"beam_gather": True} if policy in ("exact", "openvino-cpu", "fixed") and draw(st.booleans()) else {}
    if policy == "hf-static":
        opts["max_cache_len"] = 4096
    elif draw(st.booleans()):
        opts["free_old"] = draw(st.sampled_from(["immediate", "end_of_step", "next_inference"]))
    if draw(st.booleans()):
        opts["first_touch"] = draw(st.booleans())
    window = draw(st.sampled_from([None, 1, 2, 7, 30, 200]))
    try:
        return build_scenario(model=None, layers=draw(st.integers(1, 3)), kv_heads=draw(st.sampled_from([1, 2])),
                              head_dim=16, precision=draw(st.sampled_from(["f32", "f16", "bf16"])), policy=policy,
                              policy_options=opts, ops=",".join(ops), sliding_window=window,
                              device_memory=draw(st.sampled_from(["16GiB", "64KiB"])))
    except SimkvError:
        return draw(st.nothing())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hf_scenarios())
def test_fast_engine_equals_reference_with_windows_and_gathers(scenario):
    fast = simulate(scenario)
    assert_same_run(fast, simulate(scenario, engine="reference"))
    live = replay(fast.ledger, scenario.device_memory)
    assert sum(live.values()) == fast.steps["allocated"][-1]
    assert (fast.steps["used"] <= fast.steps["steady"]).all()


def test_cli_sliding_window_flag():
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "run", "--model", "custom", "--layers", "2", "--kv-heads", "2",
                          "--head-dim", "16", "--precision", "f16", "--policy", "hf-dynamic", "--sliding-window", "6",
                          "--ops", "prefill:8,decode:3", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    import json

    data = json.loads(out.stdout)
    assert data["scenario"]["sliding_window"] == 6
    assert data["final_allocated_bytes"] == 2 * 2 * 384
    bad = subprocess.run([sys.executable, "-m", "simkv.cli", "run", "--sliding-window", "-3"], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1

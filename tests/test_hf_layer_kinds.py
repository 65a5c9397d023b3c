"""hf-dynamic and hf-static per layer kind: golden ledgers worked out by hand from transformers 5.23's
cache_utils.py and the measurements of experiments/hf_layer_kinds/README.md (docs/DESIGN.md §3c).

Models are the tiny configs ``simkv validate --runtime transformers --arch`` runs (built here by hand as
per-layer specs, no transformers needed): attention layers of 2 KV heads x 16, so one K (or V) token of
one beam costs 2 x 16 x 4 = 128 B in f32 (64 B in bf16). The 8-byte ``_sliding_window_tensor`` /
``cumulative_length`` counters transformers allocates with the cache are not KV and not in these ledgers.
"""

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from conftest import assert_same_run, rows_of
from policies import get_policy
from simkv.errors import PolicyError, SimkvError
from simkv.kvspec import LayerKV, token_bytes
from simkv.models import ModelSpec
from simkv.precision import get_precision
from simkv.scenario import Scenario, simulate
from simkv.workload import parse_ops

T = 128  # f32 bytes per token per beam of one K (or V) tensor: 2 heads x 16 x 4 B
ATT = dict(kv_heads=2, k_dim=16, v_dim=16)
FULL = LayerKV("full", **ATT)
SLIDING = LayerKV("sliding", **ATT, window=4)
CHUNKED = LayerKV("chunked", **ATT, window=4)
# Qwen3-Next Gated DeltaNet: conv state [B, 2*2*8 + 4*12 = 80, K = 4] = 320 elements (model dtype),
# recurrent state [B, 4, 8, 12] = 384 elements (f32 whatever the model's dtype).
LINEAR = LayerKV("linear", conv_elements=80 * 4, recurrent_elements=4 * 8 * 12)
# LFM2 short conv (modeling_lfm2.py Lfm2ShortConv): conv state [B, hidden 64, conv_L_cache 3] = 192 elements
# (model dtype), no recurrent state.
CONV = LayerKV("linear", conv_elements=64 * 3)
# DeepSeek-V3 MLA: latent kv_lora_rank 32 + rope 8; decompressed 4 heads x K (16 nope + 8 rope) / V 12.
MLA = LayerKV("full", kv_heads=4, k_dim=24, v_dim=12, latent=(32, 8))

GEMMA3 = (SLIDING,) * 5 + (FULL,)  # sliding_window_pattern 6
LLAMA4 = (CHUNKED,) * 3 + (FULL,)  # every 4th layer full (NoPE)
QWEN3_NEXT = (LINEAR,) * 3 + (FULL,)  # full_attention_interval 4
DEEPSEEK_V3 = (MLA,) * 3
LFM2 = (CONV, FULL) * 2  # layer_types conv, full_attention, conv, full_attention


def model(layers, name="tiny"):
    return ModelSpec(name, layers=len(layers), heads=4, kv_heads=2, head_dim=16, layer_kv=tuple(layers))


def run(layers, ops, policy="hf-dynamic", precision="f32", engine="fast", **opts):
    sc = Scenario(model(layers), get_precision(precision), get_policy(policy, opts), parse_ops(ops), weights_memory=0)
    return simulate(sc, engine=engine)


def checked(layers, ops, policy="hf-dynamic", precision="f32", **opts):
    """The fast engine's run, held equal to the reference engine's."""
    fast = run(layers, ops, policy, precision, **opts)
    assert_same_run(fast, run(layers, ops, policy, precision, engine="reference", **opts))
    return fast


def events(result, step, layer=None):
    """(layer, tensor, op, bytes) of a step's allocs and frees (copies are not allocations)."""
    return [(la, t, op, b) for _, la, t, op, b, *_ in rows_of(result, step=step, layer=layer) if op != "copy"]


def layer_events(layer, pattern):
    return [(layer, t, op, b) for t, op, b in pattern]


# --------------------------------------------------------------------------- sliding windows (hf-dynamic)


def test_sliding_group_crossing_its_window_prompt_shorter_than_window():
    """Gemma-3, W = 4, P = 2. DynamicSlidingWindowLayer.update cats the kept min(c, W - 1) tokens with the
    new one (both K and V before either old tensor is dropped) and keeps a view of the last W - 1, which pins
    the whole cat buffer."""
    r = checked(GEMMA3, "prefill:2,decode:4")
    # prefill: cat of an empty tensor and 2 tokens = 2 x 128 = 256 B, K then V, in every layer.
    assert events(r, 0, layer=0) == layer_events(0, [("k", "alloc", 256), ("v", "alloc", 256)])
    # d1: c = 2, k = min(2, 3) = 2, +1 -> 3 tokens = 384 B.
    assert events(r, 1, layer=0) == layer_events(0, [("k", "alloc", 384), ("v", "alloc", 384),
                                                     ("k", "free", 256), ("v", "free", 256)])
    # d2: k = min(3, 3) = 3, +1 -> 4 tokens = 512 B: the window is reached.
    assert events(r, 2, layer=0) == layer_events(0, [("k", "alloc", 512), ("v", "alloc", 512),
                                                     ("k", "free", 384), ("v", "free", 384)])
    # d3, d4: k = W - 1 = 3, +1 -> 4 tokens again: W tokens held per step, not W - 1.
    for step in (3, 4):
        assert events(r, step, layer=2) == layer_events(2, [("k", "alloc", 512), ("v", "alloc", 512),
                                                            ("k", "free", 512), ("v", "free", 512)])
    # The full layer grows one token per step, one tensor at a time: d3 holds 5 tokens (640 B).
    assert events(r, 3, layer=5) == layer_events(5, [("k", "alloc", 640), ("k", "free", 512),
                                                     ("v", "alloc", 640), ("v", "free", 512)])
    # Allocated after d2 on: 5 sliding layers x 2 x 512 + the full layer's 2 x 128 x (2 + n).
    assert r.steps["allocated"][2:].tolist() == [5 * 1024 + 2 * T * (2 + n) for n in (2, 3, 4)]


def test_sliding_group_crossing_its_window_prompt_longer_than_window():
    """Gemma-3, W = 4, P = 6: the prefill's 6-token cat stays alive behind the view until the next step
    (README §3: 1544 / 1032 per sliding layer with the 8 B counter; 9256 -> 6952 -> 7208 in all)."""
    r = checked(GEMMA3, "prefill:6,decode:3")
    assert events(r, 0, layer=1) == layer_events(1, [("k", "alloc", 768), ("v", "alloc", 768)])  # all 6 kept
    # d1: k = min(6, 3) = 3, +1 = 4 tokens (512 B); the 6-token buffers go only now.
    assert events(r, 1, layer=1) == layer_events(1, [("k", "alloc", 512), ("v", "alloc", 512),
                                                     ("k", "free", 768), ("v", "free", 768)])
    assert events(r, 2, layer=1) == layer_events(1, [("k", "alloc", 512), ("v", "alloc", 512),
                                                     ("k", "free", 512), ("v", "free", 512)])
    # 6 layers x 2 x 768 = 9216; then 5 x 1024 + 2 x 896 = 6912; then 5 x 1024 + 2 x 1024 = 7168.
    assert r.steps["allocated"][:3].tolist() == [9216, 6912, 7168]
    # d1's peak: layer 0's two new 512 B tensors beside the old 768 B ones, 9216 + 1024 = 10240 (measured
    # 10280 with the five 8 B counters); every later layer frees more than it allocates.
    assert r.steps["peak"][1] == 10240


# --------------------------------------------------------------------------- chunked attention


def test_chunked_group_at_a_chunk_boundary_nothing_happens():
    """Llama-4, C = 4, P = 6, 12 decode steps: positions 8, 12 and 16 start new chunks, but chunked layers are
    DynamicSlidingWindowLayers with W = C (chunking lives in the mask): the same 4-token cat every step."""
    r = checked(LLAMA4, "prefill:6,decode:12")
    steady = [("k", "alloc", 512), ("v", "alloc", 512), ("k", "free", 512), ("v", "free", 512)]
    for step in range(2, 13):  # d2 ... d12 (tokens 8 .. 18), boundaries included
        assert events(r, step, layer=0) == layer_events(0, steady)
    # Chunked layers hold 3 x 1024 B from d1 on; the full layer 2 x 128 x (6 + n) (README §3: 1032 constant).
    assert r.steps["allocated"][1:].tolist() == [3 * 1024 + 2 * T * (6 + n) for n in range(1, 13)]
    # StaticSlidingWindowLayer likewise ignores the boundary: a 4-token ring rolled on every full step.
    s = checked(LLAMA4, "prefill:6,decode:12", "hf-static", max_cache_len=24)
    assert all(events(s, step, layer=1) == layer_events(1, steady) for step in range(1, 13))


# --------------------------------------------------------------------------- hf-static rings


def test_static_sliding_ring_lazy_then_rolled_once_full():
    """Gemma-3 under StaticCache(max_cache_len=24): sliding layers are rings of min(W, M) = 4 tokens (W, one
    more than the dynamic view), allocated at the first update; full layers hold M = 24 tokens."""
    r = checked(GEMMA3, "prefill:2,decode:4,fork:2,decode:1", "hf-static", max_cache_len=24)
    # prefill: zeros of 4 tokens (512 B) in a sliding layer although 2 arrive; 24 tokens (3072 B) in the full one.
    assert events(r, 0, layer=0) == layer_events(0, [("k", "alloc", 512), ("v", "alloc", 512)])
    assert events(r, 0, layer=5) == layer_events(5, [("k", "alloc", 3072), ("v", "alloc", 3072)])
    # d1 (2 -> 3 tokens), d2 (3 -> 4): index_copy_ into the ring, nothing allocated.
    assert events(r, 1) == events(r, 2) == []
    # d3: the ring is full (4 stored): roll(-1) copies of K and V (+512 +512) freed when update returns.
    roll = [("k", "alloc", 512), ("v", "alloc", 512), ("k", "free", 512), ("v", "free", 512)]
    assert events(r, 3) == [e for layer in range(5) for e in layer_events(layer, roll)]
    # Allocated stays 5 x 1024 + 2 x 3072 = 11264 (README §3: 1032 / 6152 with the counters); a roll step
    # peaks one layer's pair of copies higher.
    assert set(r.steps["allocated"].tolist()[:5]) == {11264}
    assert r.steps["peak"][3] == 11264 + 1024
    # fork:2: index_select of each whole tensor at 2 beams (+K -K +V -V), then the forward rolls the full
    # rings at the new batch.
    gather_ring = [("k", "alloc", 1024), ("k", "free", 512), ("v", "alloc", 1024), ("v", "free", 512)]
    gather_full = [("k", "alloc", 6144), ("k", "free", 3072), ("v", "alloc", 6144), ("v", "free", 3072)]
    roll2 = [("k", "alloc", 1024), ("v", "alloc", 1024), ("k", "free", 1024), ("v", "free", 1024)]
    assert events(r, 5) == ([e for layer in range(5) for e in layer_events(layer, gather_ring)]
                            + layer_events(5, gather_full)
                            + [e for layer in range(5) for e in layer_events(layer, roll2)])


def test_static_ring_prompt_longer_than_ring_and_refusals():
    # P = 6 > 4 on an empty ring: the last 4 tokens are copied in (no temporary); the roll starts at d1.
    r = checked(GEMMA3, "prefill:6,decode:1,reset,prefill:9,decode:1", "hf-static", max_cache_len=16)
    assert events(r, 0, layer=0) == layer_events(0, [("k", "alloc", 512), ("v", "alloc", 512)])
    assert len(events(r, 1, layer=0)) == 4
    # reset zeroes and keeps; a 9-token prompt into the empty ring is copied in place: nothing.
    assert events(r, 2) == events(r, 3) == []
    # A chat turn that fits the ring is index_copy_; one that overflows a non-empty ring concatenates
    # temporaries (not modelled): refused.
    checked(GEMMA3, "prefill:1,prefill:3,decode:2", "hf-static", max_cache_len=16)
    with pytest.raises(PolicyError, match="overflows"):
        run(GEMMA3, "prefill:3,prefill:2", "hf-static", max_cache_len=16)


# --------------------------------------------------------------------------- linear attention


def test_hybrid_state_allocated_once_and_gathered_on_reorder():
    """Qwen3-Next in bf16: linear layers' conv state 320 x 2 = 640 B (model dtype) and recurrent state
    384 x 4 = 1536 B (f32), allocated at the first update (torch.zeros, zeros_like) and updated in place;
    the full layer 64 B per token per K (README §3: 2176 B per linear layer constant, 768 + 128 n)."""
    r = checked(QWEN3_NEXT, "prefill:6,decode:3,fork:2,reorder,select:0,decode:1,reset,prefill:2", precision="bf16")
    state = [("conv_state", "alloc", 640), ("recurrent_state", "alloc", 1536)]
    assert events(r, 0) == [e for layer in range(3) for e in layer_events(layer, state)] + layer_events(
        3, [("k", "alloc", 384), ("v", "alloc", 384)])
    for step in (1, 2, 3):  # decode: only the full layer
        assert {e[0] for e in events(r, step)} == {3}
    assert r.steps["allocated"][:4].tolist() == [3 * 2176 + 768 + 128 * n for n in range(4)]
    # fork:2: reorder_cache index_selects each state at 2 beams, conv then recurrent, old freed at once.
    gather = [("conv_state", "alloc", 1280), ("conv_state", "free", 640),
              ("recurrent_state", "alloc", 3072), ("recurrent_state", "free", 1536)]
    assert events(r, 4, layer=1) == layer_events(1, gather)  # then the forward: in place
    # reorder at the same width copies them again; select:0 back to one row.
    assert events(r, 5, layer=2) == layer_events(2, [("conv_state", "alloc", 1280), ("conv_state", "free", 1280),
                                                     ("recurrent_state", "alloc", 3072),
                                                     ("recurrent_state", "free", 3072)])
    assert events(r, 6, layer=0) == layer_events(0, [("conv_state", "alloc", 640), ("conv_state", "free", 1280),
                                                     ("recurrent_state", "alloc", 1536),
                                                     ("recurrent_state", "free", 3072)])
    # reset (after 6 + 3 + 4 = 13 tokens): DynamicLayer drops K and V; LinearAttentionLayer zeroes its
    # states and keeps them.
    assert events(r, 8) == layer_events(3, [("k", "free", 13 * 64), ("v", "free", 13 * 64)])
    assert r.steps["allocated"][8] == 3 * 2176
    # The next prompt allocates only the full layer's K and V (2 tokens).
    assert events(r, 9) == layer_events(3, [("k", "alloc", 128), ("v", "alloc", 128)])
    # Kept states keep their batch: a reset with 2 beams live is refused.
    with pytest.raises(PolicyError, match="select one beam"):
        run(QWEN3_NEXT, "prefill:4,fork:2,reset,prefill:2")
    # StaticCache uses the same LinearAttentionLayer: f32 states 1280 + 1536 = 2816 B (README §3).
    s = checked(QWEN3_NEXT, "prefill:6,decode:2", "hf-static", max_cache_len=24)
    assert events(s, 0, layer=0) == layer_events(0, [("conv_state", "alloc", 1280), ("recurrent_state", "alloc", 1536)])
    assert s.steps["allocated"].tolist() == [3 * 2816 + 2 * 24 * T] * 3


def test_lfm2_conv_state_alone():
    """LFM2 in bf16 (the tiny config of ``--arch lfm2``): each conv layer's state 192 x 2 = 384 B, allocated by
    ``LinearAttentionLayer.lazy_initialization`` at the first ``update_conv_state`` and updated in place (decode:
    ``causal_conv1d_update`` writes it in place); no recurrent state, so no recurrent row ever (the state unit's
    recurrent slot is absent). Full layers: 64 B per token per K."""
    r = checked(LFM2, "prefill:5,decode:2,fork:3,prefill:2,reorder,select:1,reset,prefill:3", precision="bf16")
    assert events(r, 0) == [(0, "conv_state", "alloc", 384), (1, "k", "alloc", 320), (1, "v", "alloc", 320),
                            (2, "conv_state", "alloc", 384), (3, "k", "alloc", 320), (3, "v", "alloc", 320)]
    assert "recurrent_state" not in {e[1] for step in range(10) for e in events(r, step)}
    for step in (1, 2):  # decode: only the full layers
        assert {e[0] for e in events(r, step)} == {1, 3}
    # 2 x 384 B of states + 2 layers x 2 x 64 B x n tokens
    assert r.steps["allocated"][:3].tolist() == [768 + 256 * n for n in (5, 6, 7)]
    # fork:3 (7 tokens stored): reorder_cache index_selects the conv state at 3 rows, old freed at once.
    assert events(r, 3, layer=2) == [(2, "conv_state", "alloc", 1152), (2, "conv_state", "free", 384)]
    # a chat turn of 2 (cat of the state and the new columns: a temporary, not the cache): nothing for the state
    assert events(r, 4, layer=0) == []
    # reorder at the same width copies it again; select:1 back to one row
    assert events(r, 5, layer=0) == [(0, "conv_state", "alloc", 1152), (0, "conv_state", "free", 1152)]
    assert events(r, 6, layer=0) == [(0, "conv_state", "alloc", 384), (0, "conv_state", "free", 1152)]
    # reset: the states zeroed and kept, the full layers' K and V freed (5 + 2 + 1 + 2 + 1 + 1 = 12 tokens); the
    # next prompt allocates only the full layers.
    assert events(r, 7) == [(1, "k", "free", 12 * 64), (1, "v", "free", 12 * 64),
                            (3, "k", "free", 12 * 64), (3, "v", "free", 12 * 64)]
    assert r.steps["allocated"][7] == 768
    assert {e[0] for e in events(r, 8)} == {1, 3}
    # StaticCache: the same LinearAttentionLayer, f32 192 x 4 = 768 B.
    s = checked(LFM2, "prefill:3,decode:2", "hf-static", max_cache_len=16)
    assert events(s, 0, layer=0) == [(0, "conv_state", "alloc", 768)]
    assert s.steps["allocated"].tolist() == [2 * 768 + 2 * 2 * 16 * T] * 3


# --------------------------------------------------------------------------- MLA


def test_mla_latent_vs_decompressed_bytes():
    """DeepSeek-V3: transformers 5.x caches the latent — keys [B, 1, L, kv_lora_rank = 32], values
    [B, 1, L, qk_rope_head_dim = 8] — not per-head K (16 nope + 8 rope) and V (12) of 4 heads."""
    f32, bf16 = get_precision("f32"), get_precision("bf16")
    # Per token per layer: latent (32 + 8) x 4 = 160 B; decompressed 4 x (24 + 12) x 4 = 576 B (x 3.6).
    assert token_bytes(DEEPSEEK_V3, f32, mla="latent") == 3 * 160
    assert token_bytes(DEEPSEEK_V3, f32, mla="decompressed") == 3 * 576
    assert token_bytes(DEEPSEEK_V3, bf16, mla="latent") == 3 * 80  # README §3: 480 + 80 n per layer
    r = checked(DEEPSEEK_V3, "prefill:6,decode:1", precision="bf16")
    # prefill: K 6 x 32 x 2 = 384 B, V 6 x 8 x 2 = 96 B per layer; d1: +K[7] -K[6] +V[7] -V[6].
    assert events(r, 0, layer=2) == layer_events(2, [("k", "alloc", 384), ("v", "alloc", 96)])
    assert events(r, 1, layer=2) == layer_events(2, [("k", "alloc", 448), ("k", "free", 384),
                                                     ("v", "alloc", 112), ("v", "free", 96)])
    assert r.steps["allocated"].tolist() == [3 * 480, 3 * 560]
    # StaticCache: [1, 1, 24, 32] + [1, 1, 24, 8] in f32 = 3072 + 768 = 3840 B per layer (README §3: 3848).
    s = checked(DEEPSEEK_V3, "prefill:6,decode:1", "hf-static", max_cache_len=24)
    assert events(s, 0, layer=0) == layer_events(0, [("k", "alloc", 3072), ("v", "alloc", 768)])
    assert s.steps["allocated"][0] == 3 * 3840


# --------------------------------------------------------------------------- fast = reference


KINDS = {"full": FULL, "sliding": SLIDING, "wide": LayerKV("sliding", **ATT, window=9), "chunked": CHUNKED,
         "linear": LINEAR, "conv": CONV, "mla": MLA, "none": LayerKV("none")}


@st.composite
def mixed_runs(draw):
    layers = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=5))
    if all(k == "none" for k in layers):
        layers.append("full")
    policy = draw(st.sampled_from(["hf-dynamic", "hf-static"]))
    ops, width = [f"prefill:{draw(st.integers(1, 12))}"], 1
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["decode", "decode", "turn", "reset", "beam", "reorder"]))
        if kind == "decode":
            ops.append(f"decode:{draw(st.integers(1, 12))}")
        elif kind == "turn":
            ops.append(f"prefill:{draw(st.integers(1, 3 if policy == 'hf-static' else 8))}")
        elif kind == "reset" and width == 1:
            ops += ["reset", f"prefill:{draw(st.integers(1, 12))}"]
        elif kind == "beam" and width == 1:
            width = draw(st.integers(2, 3))
            ops.append(f"fork:{width}")
        elif kind == "beam":
            ops.append(f"select:{draw(st.integers(0, width - 1))}")
            width = 1
        elif kind == "reorder":
            ops.append("reorder")
    opts = {"max_cache_len": 200} if policy == "hf-static" else {}
    opts["first_touch"] = draw(st.booleans())  # resident memory followed through rings and states too
    try:
        return Scenario(model([KINDS[k] for k in layers]), get_precision(draw(st.sampled_from(["f32", "bf16"]))),
                        get_policy(policy, opts), parse_ops(",".join(ops)), weights_memory=0)
    except SimkvError:  # a turn that overflows a static ring
        return draw(st.nothing())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(mixed_runs())
def test_fast_engine_equals_reference_on_mixed_layer_kinds(scenario):
    fast = simulate(scenario)
    assert_same_run(fast, simulate(scenario, engine="reference"))
    assert (fast.steps["used"] <= fast.steps["steady"]).all()

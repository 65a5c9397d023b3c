"""The cost model: golden values worked out by hand from the formula in simkv/cost/ (its package docstring)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simkv.cost import DEVICES, Device, attended_pairs, forward_cost, get_device, matmul_params, step_cost
from simkv.errors import ConfigError
from simkv.models import ModelSpec, get_model
from simkv.precision import get_precision

TOY = ModelSpec("toy", layers=2, heads=4, kv_heads=2, head_dim=8, hidden=32, intermediate=64, vocab=100)
DEV = Device(
    name="toy-dev", description="", memory_bytes=10**9, memory_bandwidth=1000.0,
    peak_flops={"f32": 10_000.0}, bandwidth_efficiency=0.5, flops_efficiency=0.25,
    step_overhead_s=0.1, copy_bandwidth=100.0, compute_precision="f32",
)


def test_matmul_params_by_hand():
    # per layer: q,o 2*32*4*8 = 2048; k,v 2*32*2*8 = 1024; mlp 3*32*64 = 6144 -> 9216; x2 layers = 18432
    # + LM head 100*32 = 3200 (the input embedding, a lookup, is left out)
    assert matmul_params(TOY) == 18432 + 3200


def test_step_cost_golden():
    # bytes 1000+300+200 = 1500 at 1000*0.5 B/s -> 3.0 s
    # flops 2*21632*1 + 4*2*4*8*10 = 43264 + 2560 = 45824 at 10000*0.25 -> 18.3296 s (compute bound)
    # copy 50 / 100 = 0.5 s; overhead 0.1 s
    c = step_cost(TOY, DEV, weights_bytes=1000, new_tokens=1, attended_pairs=10,
                  kv_read_bytes=300, kv_write_bytes=200, copy_bytes=50)
    assert c.bound == "compute"
    assert c.memory_s == pytest.approx(3.0) and c.compute_s == pytest.approx(18.3296)
    assert c.flops == 45824 and c.bytes == 1500
    assert c.seconds == pytest.approx(18.3296 + 0.5 + 0.1)
    assert isinstance(c.seconds, float)


def test_two_rooflines_add_and_one_token_queries_have_their_own_rate():
    # The matmuls and attention are separate kernels, each bounded by its own roofline, and the step is their sum.
    # matmuls: weights 1000 B at 500 B/s = 2.0 s vs 2*21632*1 = 43264 FLOP at 2500 FLOP/s = 17.3056 s -> 17.3056
    # attention: KV 4000+0 B at 500 B/s = 8.0 s vs 4*2*4*8 = 256 FLOP/pair * 10 pairs = 2560 FLOP:
    #   all pairs from a one-token query at 320 FLOP/s = 8.0 s ... at 256 FLOP/s = 10.0 s -> 10.0 (compute)
    # copy 0, overhead 0.1 -> 17.3056 + 10.0 + 0.1; the longer roofline (matmuls) is compute-bound
    from dataclasses import replace

    dev = replace(DEV, decode_attention_flops=256.0)
    c = step_cost(TOY, dev, weights_bytes=1000, new_tokens=1, attended_pairs=10, decode_pairs=10,
                  kv_read_bytes=4000, kv_write_bytes=0)
    assert c.matmul_s == pytest.approx(17.3056) and c.attention_s == pytest.approx(10.0)
    assert c.seconds == pytest.approx(27.4056) and c.bound == "compute"
    # the same pairs from a multi-token query run at the matmul rate: 2560 / 2500 = 1.024 s < 8.0 s of KV bytes
    c = step_cost(TOY, dev, weights_bytes=1000, new_tokens=1, attended_pairs=10, kv_read_bytes=4000, kv_write_bytes=0)
    assert c.attention_s == pytest.approx(8.0) and c.seconds == pytest.approx(17.3056 + 8.0 + 0.1)
    # forward_cost counts a decode step's pairs (new = 1) as one-token queries, a prefill's not
    assert forward_cost(TOY, dev, get_precision("f16"), batch=1, context=9, new=1).attention_s > 9.0
    # a prefill of 4 tokens: 1+2+3+4 = 10 pairs, 2560 FLOP at the matmul rate 2500 = 1.024 s (10 s at the decode rate)
    assert forward_cost(TOY, dev, get_precision("f16"), batch=1, context=0, new=4).attention_s == pytest.approx(1.024)



def test_attention_without_overlap_adds_its_reads_and_its_arithmetic():
    # The same decode step as above on a device whose attention loop reads and computes in turn:
    # attention = KV 8.0 s + 2560 FLOP at 256 FLOP/s 10.0 s = 18.0 s (the roofline took the larger, 10.0 s)
    from dataclasses import replace

    dev = replace(DEV, decode_attention_flops=256.0, attention_overlap=False)
    c = step_cost(TOY, dev, weights_bytes=1000, new_tokens=1, attended_pairs=10, decode_pairs=10,
                  kv_read_bytes=4000, kv_write_bytes=0)
    assert c.attention_s == pytest.approx(18.0) and c.seconds == pytest.approx(17.3056 + 18.0 + 0.1)
    assert c.terms[2] == pytest.approx(8.0) and c.terms[3] == pytest.approx(10.0)
    # the matmuls still take the larger of their two terms
    assert c.matmul_s == pytest.approx(17.3056) and c.bound == "compute"
    with pytest.raises(ConfigError, match="attention_overlap"):
        replace(DEV, attention_overlap="false")

def test_step_cost_vectorised_matches_scalar():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 50, 200)
    pairs = rng.integers(1, 5000, 200)
    kr = rng.integers(0, 10**6, 200)
    cb = rng.integers(0, 10**4, 200)
    v = step_cost(TOY, DEV, weights_bytes=1000, new_tokens=n, attended_pairs=pairs, kv_read_bytes=kr,
                  kv_write_bytes=7, copy_bytes=cb)
    for i in range(0, 200, 17):
        s = step_cost(TOY, DEV, weights_bytes=1000, new_tokens=int(n[i]), attended_pairs=int(pairs[i]),
                      kv_read_bytes=int(kr[i]), kv_write_bytes=7, copy_bytes=int(cb[i]))
        assert v.seconds[i] == pytest.approx(s.seconds) and v.bound[i] == s.bound
        assert v.copy_s[i] == pytest.approx(s.copy_s)


@settings(max_examples=60, deadline=None)
@given(context=st.integers(0, 10_000), new=st.integers(0, 300), window=st.one_of(st.none(), st.integers(1, 5000)))
def test_attended_pairs_matches_a_loop(context, new, window):
    model = ModelSpec("w", layers=1, heads=1, kv_heads=1, head_dim=8, sliding_window=window)
    cap = window or 10**9
    assert attended_pairs(model, context, new) == sum(min(context + i + 1, cap) for i in range(new))


def test_decode_is_memory_bound_and_prefill_compute_bound_on_h100():
    model, dev, kv = get_model("llama-2-7b"), get_device("h100-sxm"), get_precision("bf16")
    assert forward_cost(model, dev, kv, batch=1, context=1024, new=1, weights_precision="bf16").bound == "memory"
    assert forward_cost(model, dev, kv, batch=1, context=0, new=4096, weights_precision="bf16").bound == "compute"


def test_device_file_round_trip_and_errors(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(DEV.to_dict()))
    assert get_device(str(path)) == DEV
    path.write_text("{")
    with pytest.raises(ConfigError):
        get_device(str(path))
    with pytest.raises(ConfigError):
        get_device("no-such-device")
    with pytest.raises(ConfigError):
        step_cost(TOY, DEV, weights_bytes=1, new_tokens=1, attended_pairs=1, kv_read_bytes=0,
                  kv_write_bytes=0, precision="bf16")


def test_every_preset_names_its_sources():
    for dev in DEVICES.values():
        for key in ("memory_bandwidth", "peak_flops", "bandwidth_efficiency", "flops_efficiency", "step_overhead_s"):
            assert dev.sources.get(key), (dev.name, key)


def test_h100_preset_is_the_derivation_from_the_real_measurements():
    # The measured efficiencies of h100-sxm are worked out from experiments/data/h100.json, not typed in freely.
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "experiments" / "h100_preset.py"
    spec = importlib.util.spec_from_file_location("h100_preset", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    dev = get_device("h100-sxm")
    for key, value in mod.derive(json.loads(mod.DATA.read_text()), dev).items():
        assert getattr(dev, key) == pytest.approx(value, rel=2e-3), key


def test_lm_head_only_for_logit_tokens():
    # toy: layer params 18432, head 100*32 = 3200. 5 new tokens, logits for 1:
    # 2*18432*5 + 2*3200*1 = 184320 + 6400 = 190720 (no attention pairs)
    c = step_cost(TOY, DEV, weights_bytes=0, new_tokens=5, attended_pairs=0, kv_read_bytes=0,
                  kv_write_bytes=0, logit_tokens=1)
    assert c.flops == 190720


def test_a_quantized_checkpoints_gemms_at_their_kernels_peaks():
    # TOY's layers multiply a token by 18,432 parameters, its LM head by 3,200. With 10,000 of the layers' stored
    # in a format whose kernel runs at an f8 peak of 40,000 (x 0.25) and the rest at f32 (10,000 x 0.25): one token
    # costs 2 x 3,200 / 2,500 (LM head, f32) + 2 x 10,000 / 10,000 + 2 x 8,432 / 2,500 = 2.56 + 2.0 + 6.7456 s
    # of matmul arithmetic, against 2 x 21,632 / 2,500 = 17.3056 s all at f32.
    from dataclasses import replace

    dev = replace(DEV, peak_flops={"f32": 10_000.0, "f8": 40_000.0}, step_overhead_s=0.0)
    kw = dict(weights_bytes=0, new_tokens=1, attended_pairs=0, kv_read_bytes=0, kv_write_bytes=0)
    assert step_cost(TOY, dev, **kw).compute_s == pytest.approx(17.3056)
    c = step_cost(TOY, dev, gemm_mix=(("f8", 10_000), ("f32", 8_432)), **kw)
    assert c.matmul_s == pytest.approx(2.56 + 2.0 + 6.7456) and c.seconds == pytest.approx(11.3056)
    with pytest.raises(ConfigError, match="gemm_mix holds 10,000 parameters"):
        step_cost(TOY, dev, gemm_mix=(("f8", 10_000),), **kw)

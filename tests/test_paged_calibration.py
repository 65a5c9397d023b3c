"""The host preset's paged terms (simkv calibrate, simkv.validate.genai.calibrate): the derivation's arithmetic
(golden), how the cost model applies them (Device.paged_kernel, the per-sequence overhead in step_cost and the
serving engine's StepTimer), refusals, and a seconds-long smoke run of one probe on the real pipeline."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from simkv.cost import get_device, step_cost
from simkv.cost.devices import Device
from simkv.errors import ConfigError
from simkv.models import custom_model
from simkv.validate.genai.calibrate import ATT_BATCH, derive

# The golden round. Chosen terms: a = 1e-8 s per query head and position, b = 4e-8 s per KV head and position,
# per step s = 1e-4, per layer l = 5e-5, per sequence q = 2e-5; weights streamed at 1e10 B/s (tiny1 1e5 B:
# w1 = 1e-5 s; tiny9 9e5 B: w9 = 9e-5 s); prefill 4e10 FLOPs more in 0.3 s more.
A, B, S, L, Q = 1e-8, 4e-8, 1e-4, 5e-5, 2e-5
# per sequence, layer and query head h = 1e-6 s; the matmul probe at 1 row 4e10 FLOP/s, at 16 rows 3.2e11.
H, ROWS_RATE = 1e-6, {1: 4e10, 16: 3.2e11}
# per prompt token, layer and query head PT = 2e-7 s.
PT = 2e-7
# per vocabulary entry of a sampling sequence VE = 1e-9 s: the tiny decoders' 512 entries 5.12e-7 s per sequence;
# the vocab probe's LM head matmul stack at 1 row 2e10 FLOP/s, at 16 rows 1e11.
VE, VOCAB_RATE = 1e-9, {1: 2e10, 16: 1e11}


def _golden_raw() -> dict:
    # attention probes: 4 layers, batch 4, contexts 67 and 579 (512 apart): per sequence, layer and position
    # x8 = 32a + 8b = 6.4e-7 s, x32 = 32a + 32b = 1.6e-6 s; long - short = 4 x 4 x 512 x x.
    raw = {"attention8_short": (0.010, 67.0), "attention8_long": (0.010 + 8192 * 6.4e-7, 579.0),
           "attention32_short": (0.020, 67.0), "attention32_long": (0.020 + 8192 * 1.6e-6, 579.0)}
    # tiny decoders (head 64, half the probes' 128): attention per position (a + b) x 64/128 = 2.5e-8 s, context 70
    pos = 2.5e-8
    # and their one head pays h per sequence and layer: 1, 16 and 9 (sequences x layers) of it; their sampler
    # 512 x VE = 5.12e-7 s per sequence
    raw["tiny1_b1"] = (S + L + Q + 1e-5 + 1 * 70 * pos + 1 * H + 512 * VE, 70.0)           # 1.83262e-4
    raw["tiny1_bS"] = (S + L + 16 * Q + 1e-5 + 16 * 70 * pos + 16 * H + 16 * 512 * VE, 70.0)  # 5.32192e-4
    raw["tiny9_b1"] = (S + 9 * L + Q + 9e-5 + 9 * 70 * pos + 9 * H + 512 * VE, 70.0)       # 6.85262e-4
    # the vocab probe: tiny1 with 32,768 entries, 32,256 more: its LM head has 64 x 32,256 = 2,064,384 parameters
    # more, 2 x 2,064,384 x n / rate_n s more (2.064384e-4 s at 1 row, 6.6060288e-4 s at 16), and its sampler
    # 32,256 x VE = 3.2256e-5 s more per sequence
    extra = 2 * 64 * 32_256
    raw["vocab_b1"] = (raw["tiny1_b1"][0] + extra / VOCAB_RATE[1] + 32_256 * VE, 70.0)
    raw["vocab_bS"] = (raw["tiny1_bS"][0] + extra * 16 / VOCAB_RATE[16] + 16 * 32_256 * VE, 70.0)
    raw["vocab_rows"] = dict(VOCAB_RATE)
    raw["prefill"] = {128: 0.1, 512: 0.4}
    # head probes (16 query / 8 KV heads x 128 on hidden 64, context 70): attention per position
    # xh = 16a + 8b = 4.8e-7 s; a layer's matmuls P = 2 x 64 x (16 + 8) x 128 = 393,216 parameters run n rows in
    # 2 P n / rate_n: 1.96608e-5 s at 1 row, 3.93216e-5 s at 16. A step: 2e-3 s fixed + n q + per layer
    # n (70 xh + 16 h) + 2 P n / rate_n.
    xh, p = 16 * A + 8 * B, 393_216
    for layers in (1, 9):
        for n, key in ((1, "b1"), (16, "bS")):
            t = 2e-3 + n * Q + layers * (n * (70 * xh + 16 * H) + 2 * p * n / ROWS_RATE[n])
            raw[f"heads{layers}_{key}"] = (t, 70.0)
    raw["rows"] = dict(ROWS_RATE)
    # prompt tokens: PT = 2e-7 s per prompt token, layer and query head. The prefill probe (2 layers x 16 heads)
    # pays it on the 384 tokens between its chunks: 384 x 32 x PT = 2.4576e-3 s on top of the 0.3 s its 4e10 FLOPs
    # take at F = 4e10 / 0.3 FLOP/s.
    raw["prefill"] = {128: 0.1, 512: 0.4 + 384 * 32 * PT}
    # a 128-token prompt on the head probes costs per layer: l + 16 h (the one sampling sequence) + matmuls
    # 2 P 128 / 2e11 = 5.0331648e-4 + KV writes 128 x 8 x b = 4.096e-5 + causal attention 128 x 129 / 2 x 4 x 128
    # x 16 = 67,633,152 FLOPs / F = 5.0724864e-4 + 128 x 16 x PT = 4.096e-4 s; the fixed rest (3e-3 s) cancels.
    raw["heads_rows"] = 2e11
    per_layer = L + 16 * H + 2 * p * 128 / 2e11 + 128 * 8 * B + 67_633_152 * 0.3 / 4e10 + 128 * 16 * PT
    for layers in (1, 9):
        raw[f"heads{layers}_prompt"] = 3e-3 + layers * per_layer
    return raw


def test_derive_golden():
    assert ATT_BATCH == 4
    got = derive(_golden_raw(), kv_bytes_per_head=272.0, weights_rate=1e10, prefill_flops={128: 1e10, 512: 5e10},
                 tiny_weights_bytes={"tiny1": 1e5, "tiny9": 9e5})
    # b = (x32 - x8) / 24 = 9.6e-7 / 24 = 4e-8; a = (x8 - 8b) / 32 = 3.2e-7 / 32 = 1e-8
    assert got["decode_attention_flops"] == pytest.approx(4 * 128 / A, rel=1e-9)   # 5.12e10 FLOP/s
    assert got["kv_rate"] == pytest.approx(272.0 / B, rel=1e-9)                     # 6.8e9 B/s
    # per head: each probe's slope sigma = layers (16 h + (3.93216e-5 - 1.96608e-5) / 15) + q; (sigma9 - sigma1) / 8
    # less the matmuls' growth 2 P (16 / 3.2e11 - 1 / 4e10) / 15 = 16 h; over 16 query heads: h
    assert got["head_overhead_s"] == pytest.approx(H, rel=1e-9)
    # per vocabulary entry: the slopes differ by (6.6060288e-4 - 2.064384e-4) / 15 + 32,256 VE; less the matmuls'
    # growth 2 x 2,064,384 x (16 / 1e11 - 1 / 2e10) / 15 (the same first part), over 32,256 entries: VE
    assert got["vocab_overhead_s"] == pytest.approx(VE, rel=1e-9)
    # the tiny decoders' one head and their 512-entry sampler are taken out of q, l and s
    assert got["sequence_overhead_s"] == pytest.approx(Q, rel=1e-9)
    assert got["layer_overhead_s"] == pytest.approx(L, rel=1e-9)
    assert got["step_overhead_s"] == pytest.approx(S, rel=1e-9)
    # prompt tokens: the head probes' 8 extra layers less their priced parts leave 128 x 16 x PT per layer, the
    # prefill probe's slope less 384 x 32 x PT its FLOPs at 4e10 / 0.3 (solved together)
    assert got["prompt_token_overhead_s"] == pytest.approx(PT, rel=1e-9)
    assert got["matmul_flops"] == pytest.approx(4e10 / 0.3, rel=1e-9)             # 1.333e11 FLOP/s


def test_derive_without_prompt_work_keeps_the_plain_slope():
    # the head probes' prompt costs no more than its priced parts (at the plain slope's rate): no prompt term,
    # matmul_flops = delta FLOPs / delta t = 4e10 / 0.3024576
    raw = _golden_raw()
    raw["heads9_prompt"] = raw["heads1_prompt"]  # nine layers no slower than one: nothing left per token
    got = derive(raw, kv_bytes_per_head=272.0, weights_rate=1e10, prefill_flops={128: 1e10, 512: 5e10},
                 tiny_weights_bytes={"tiny1": 1e5, "tiny9": 9e5})
    assert got["prompt_token_overhead_s"] == 0.0
    assert got["matmul_flops"] == pytest.approx(4e10 / (0.3 + 384 * 32 * PT), rel=1e-12)


def test_derive_clamps_noise_at_zero():
    raw = _golden_raw()
    raw["tiny9_b1"] = (raw["tiny1_b1"][0] * 0.5, 70.0)  # a noisy round: nine layers faster than one
    got = derive(raw, kv_bytes_per_head=272.0, weights_rate=1e10, prefill_flops={128: 1e10, 512: 5e10},
                 tiny_weights_bytes={"tiny1": 1e5, "tiny9": 9e5})
    assert got["layer_overhead_s"] == 0.0 and got["step_overhead_s"] > 0


def _host(**paged) -> Device:
    base = get_device("xeon-8480").to_dict()
    return Device.from_dict({**base, "name": "host", "paged": paged})


def test_paged_kernel_applies_terms():
    d = _host(step_overhead_s=1e-3, layer_overhead_s=2e-4, sequence_overhead_s=3e-5, decode_attention_flops=5e9,
              kv_bandwidth_efficiency=0.5, matmul_flops=1e11)
    p = d.paged_kernel()
    assert (p.step_overhead_s, p.layer_overhead_s, p.sequence_overhead_s) == (1e-3, 2e-4, 3e-5)
    assert p.peak() == 1e11 and p.flops_efficiency == 1.0 and p.kv_efficiency == 0.5 and not p.paged
    assert get_device("h100-sxm").paged_kernel() is get_device("h100-sxm")  # no paged terms: itself


def test_paged_memory_bandwidth_prices_a_one_row_step():
    # the paged weight-streaming rate replaces the stateful one: a batch-1 decode step of 1e8 B of weights is
    # bound by streaming them: 1e8 / 5e10 = 2e-3 s (at the stateful 4e10 B/s it was 2.5e-3 s); the KV
    # efficiency is a fraction of it
    d = _host(memory_bandwidth=5e10, kv_bandwidth_efficiency=0.5, matmul_flops=1e14)
    base = replace(d, memory_bandwidth=4e10, bandwidth_efficiency=1.0, paged={"matmul_flops": 1e14})
    model = custom_model(layers=4, heads=8, kv_heads=8, head_dim=64)
    p, b = d.paged_kernel(), base.paged_kernel()
    assert p.memory_bandwidth == 5e10 and p.kv_efficiency == 0.5
    args = dict(weights_bytes=1e8, new_tokens=1, attended_pairs=0, kv_read_bytes=0, kv_write_bytes=0)
    assert p.bandwidth_efficiency == 1.0  # an achieved rate, as matmul_flops is
    assert math.isclose(step_cost(model, p, **args).matmul_s, 2e-3, rel_tol=1e-12)
    assert math.isclose(step_cost(model, b, **args).matmul_s, 2.5e-3, rel_tol=1e-12)


def test_sequence_overhead_golden():
    # overhead = s + layers x l + q x sequences: 1e-3 + 4 x 2e-4 + 8 x 3e-5 = 2.04e-3 s
    model = custom_model(layers=4, heads=8, kv_heads=8, head_dim=64)
    dev = _host(step_overhead_s=1e-3, layer_overhead_s=2e-4, sequence_overhead_s=3e-5).paged_kernel()
    c = step_cost(model, dev, weights_bytes=0, new_tokens=8, attended_pairs=0, kv_read_bytes=0, kv_write_bytes=0,
                  logit_tokens=8)
    assert math.isclose(c.overhead_s, 2.04e-3, rel_tol=1e-12)


def _overhead(model, dev, new_tokens, logit_tokens) -> float:
    """step_cost's fixed part of a step of ``new_tokens`` tokens, ``logit_tokens`` of them sampling."""
    return step_cost(model, dev, weights_bytes=0, new_tokens=new_tokens, attended_pairs=0, kv_read_bytes=0,
                     kv_write_bytes=0, logit_tokens=logit_tokens).overhead_s


def test_head_overhead_golden():
    # per sequence, layer and query head: 8 sequences x 4 layers x 8 heads x 2e-6 = 5.12e-4 s on top of the
    # 2.04e-3 s above = 2.552e-3 s; a prefill chunk of 64 tokens sampling one token pays it once per layer and head
    model = custom_model(layers=4, heads=8, kv_heads=2, head_dim=64)
    dev = _host(step_overhead_s=1e-3, layer_overhead_s=2e-4, sequence_overhead_s=3e-5,
                head_overhead_s=2e-6).paged_kernel()
    assert dev.head_overhead_s == 2e-6
    assert math.isclose(_overhead(model, dev, 8, 8), 2.552e-3, rel_tol=1e-12)
    # 1e-3 + 8e-4 + 3e-5 + 4 x 8 x 2e-6 = 1.894e-3 s
    assert math.isclose(_overhead(model, dev, 64, 1), 1.894e-3, rel_tol=1e-12)
    assert get_device("xeon-8480").head_overhead_s == 0.0  # presets: not measured, not charged


def test_prompt_token_overhead_golden():
    # per prompt token, layer and query head: a 64-token chunk sampling one token has 63 prompt tokens that sample
    # none: 63 x 4 layers x 8 heads x 1e-7 = 2.016e-4 s on top of the chunk's 1.894e-3 s (test above) = 2.0956e-3 s;
    # a decode step (every new token samples) pays none of it
    model = custom_model(layers=4, heads=8, kv_heads=2, head_dim=64)
    dev = _host(step_overhead_s=1e-3, layer_overhead_s=2e-4, sequence_overhead_s=3e-5, head_overhead_s=2e-6,
                prompt_token_overhead_s=1e-7).paged_kernel()
    assert dev.prompt_token_overhead_s == 1e-7
    assert math.isclose(_overhead(model, dev, 64, 1), 2.0956e-3, rel_tol=1e-12)
    assert math.isclose(_overhead(model, dev, 8, 8), 2.552e-3, rel_tol=1e-12)   # as without the term
    # a mixed step: 8 decode tokens and a 64-token chunk that does not finish its prompt: 64 prompt tokens,
    # 2.552e-3 + 64 x 32 x 1e-7 = 2.7568e-3 s
    assert math.isclose(_overhead(model, dev, 72, 8), 2.7568e-3, rel_tol=1e-12)
    assert get_device("xeon-8480").prompt_token_overhead_s == 0.0  # presets: not measured, not charged


def test_vocab_overhead_golden():
    # per vocabulary entry of each sampling sequence: 8 sequences x 1,000 entries x 1e-9 = 8e-6 s on top of the
    # decode step's 2.552e-3 s (test_head_overhead_golden) = 2.56e-3 s; a 64-token chunk sampling one token pays
    # it once: 1.894e-3 + 1e-6 = 1.895e-3 s
    model = replace(custom_model(layers=4, heads=8, kv_heads=2, head_dim=64), vocab=1000)
    dev = _host(step_overhead_s=1e-3, layer_overhead_s=2e-4, sequence_overhead_s=3e-5, head_overhead_s=2e-6,
                vocab_overhead_s=1e-9).paged_kernel()
    assert dev.vocab_overhead_s == 1e-9
    assert math.isclose(_overhead(model, dev, 8, 8), 2.56e-3, rel_tol=1e-12)
    assert math.isclose(_overhead(model, dev, 64, 1), 1.895e-3, rel_tol=1e-12)
    # a model of 151,936 entries (Qwen3): 151,936 x 1e-9 = 1.51936e-4 s per sampling sequence
    big = replace(model, vocab=151_936)
    assert math.isclose(_overhead(big, dev, 8, 8) - _overhead(model, dev, 8, 8), 8 * 150_936 * 1e-9, rel_tol=1e-9)
    assert get_device("xeon-8480").vocab_overhead_s == 0.0  # presets: not measured, not charged


def _timer_estimates(model, dev, steps) -> np.ndarray:
    """The serving engine's StepTimer estimates of ``steps`` (each its six loop inputs) on ``dev``, checked equal to
    step_cost's price of them (``official``)."""
    from simkv.serving.engine.costing import StepTimer

    timer = StepTimer(model, dev, 10**8, 4096)
    est = np.array([timer.step(*x) for x in steps])
    seconds, _ = timer.official(est)
    assert np.allclose(seconds, est, rtol=1e-9)
    return est


def test_step_timer_prices_prompt_tokens_like_step_cost():
    model = custom_model(layers=4, heads=8, kv_heads=2, head_dim=64)
    dev = _host(step_overhead_s=1e-3, layer_overhead_s=2e-4, sequence_overhead_s=3e-5, head_overhead_s=2e-6,
                prompt_token_overhead_s=1e-7).paged_kernel()
    # (new tokens, logit tokens): a prefill chunk, a decode batch, a mixed step
    steps = [(n, n * 50, n * 50, 0, lg, 0) for n, lg in ((64, 1), (8, 8), (72, 8))]
    est = _timer_estimates(model, dev, steps)
    # against the same device without the term: the chunk's 63 prompt tokens x 4 layers x 8 heads x 1e-7 s, the
    # mixed step's 64 of them, the decode step nothing
    base = _timer_estimates(model, replace(dev, prompt_token_overhead_s=0.0), steps)
    assert np.allclose(est - base, [63 * 32 * 1e-7, 0.0, 64 * 32 * 1e-7], rtol=1e-9, atol=1e-15)


def test_step_timer_prices_vocabulary_entries_like_step_cost():
    model = replace(custom_model(layers=4, heads=8, kv_heads=2, head_dim=64), vocab=1000)
    dev = _host(step_overhead_s=1e-3, layer_overhead_s=2e-4, sequence_overhead_s=3e-5,
                vocab_overhead_s=1e-9).paged_kernel()
    steps = [(n, n * 50, n * 50, 0, lg, 0) for n, lg in ((64, 1), (8, 8), (72, 8))]
    # against the same device without the term: 1, 8 and 8 sampling sequences x 1,000 entries x 1e-9 s
    est = _timer_estimates(model, dev, steps) - _timer_estimates(model, replace(dev, vocab_overhead_s=0.0), steps)
    assert np.allclose(est, [1e-6, 8e-6, 8e-6], rtol=1e-9, atol=1e-15)


def test_step_timer_prices_sequences_like_step_cost():
    model = custom_model(layers=4, heads=8, kv_heads=8, head_dim=64)
    dev = _host(step_overhead_s=1e-3, layer_overhead_s=2e-4, sequence_overhead_s=3e-5,
                head_overhead_s=2e-6).paged_kernel()
    est = _timer_estimates(model, dev, [(n, n * 50, n * 50, 0, n, n * 50) for n in (1, 5, 32)])
    # four more sequences pay four more per-sequence overheads and 4 x 4 layers x 8 heads head overheads
    assert est[1] - est[0] > 4 * 3e-5 + 4 * 4 * 8 * 2e-6


@pytest.mark.parametrize("paged, msg", [({"warp": 1.0}, "paged takes"), ({"step_overhead_s": -1.0}, ">= 0"),
                                        ({"head_overhead_s": "1e-6"}, ">= 0"), ({"head_overhead_s": 1e308}, "at most"),
                                        ({"prompt_token_overhead_s": True}, ">= 0"),
                                        ({"vocab_overhead_s": -1e-9}, ">= 0"), ({"vocab_overhead_s": 1e308}, "at most"),
                                        ({"memory_bandwidth": 0.0}, "positive"), ({"memory_bandwidth": "x"}, ">= 0")])
def test_bad_paged_terms_refused(paged, msg):
    with pytest.raises(ConfigError, match=msg) as err:
        _host(**paged)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", [None, "x", True, -1e-6, 1e308, float("nan")])
def test_bad_per_work_overhead_refused(value):
    # a device file's head_overhead_s / prompt_token_overhead_s / vocab_overhead_s: a number of seconds in [0, MAX_OVERHEAD_S], else
    # one line (times a step's tokens, layers and heads, 1e308 s would price a step at inf)
    base = get_device("xeon-8480").to_dict()
    for name in ("step_overhead_s", "layer_overhead_s", "head_overhead_s", "prompt_token_overhead_s",
                 "vocab_overhead_s"):
        with pytest.raises(ConfigError, match="numbers >= 0") as err:
            Device.from_dict({**base, "name": "t", name: value})
        assert "\n" not in str(err.value)


def test_smoke_one_probe_on_the_pipeline():
    """Seconds: the tiny 1-layer probe decoded at batch 1 on the real ContinuousBatchingPipeline."""
    pytest.importorskip("openvino_genai")
    from simkv.validate.genai.calibrate import _decode, _model

    path, model, kv = _model("tiny1")
    t, ctx = _decode(path, 1, 16)
    assert 0 < t < 1.0 and ctx > 16 and model.layers == 1 and kv


# Matmuls at few rows (Device.matmul_rows_flops). Chosen points 1e10 FLOP/s at 1 row, 4e10 at 4, 8e10 at 16;
# peak 6e10 (matmul_flops, efficiency 1). Linear in log2(rows): rows 2 is halfway from 0 to 2 -> 2.5e10; rows 8
# halfway from 2 to 4 -> 6e10 = the peak; rows 16 and beyond: 8e10 capped at the peak; below 1 row: 1e10.
ROWS = [[1, 1e10], [4, 4e10], [16, 8e10]]


def test_matmul_rate_golden():
    dev = _host(matmul_flops=6e10, matmul_rows_flops=ROWS).paged_kernel()
    assert dev.matmul_rows_flops == ((1, 1e10), (4, 4e10), (16, 8e10))
    got = dev.matmul_rate(np.array([0, 1, 2, 4, 8, 16, 64]), 6e10)
    assert np.allclose(got, [1e10, 1e10, 2.5e10, 4e10, 6e10, 6e10, 6e10], rtol=1e-12)


# Past 64 rows the plugin's brgemm runs 64-row blocks and the rows left over as a block of their own
# (simkv.cost.devices.MATMUL_ROW_BLOCK, oneDNN's get_os_block). A curve that does not reach the peak (1e12):
# 1e10 at 1 row, 4e10 at 4, 16e10 at 64 and 128 (held beyond). Interpolated in log2(rows): 2 rows halfway from 0
# to 2 -> 2.5e10; 8 rows at 3 of 2..6 -> 4e10 + 12e10/4 = 7e10; 16 rows at 4 -> 10e10. Time per row-FLOP:
#   64 = one block -> 16e10;  128 = 2 full blocks, no rows left -> the curve at 128 = 16e10;
#   65 = 64/16e10 + 1/1e10 = 4e-10 + 1e-10 = 5e-10 s -> 65/5e-10 = 13e10;
#   68 = 64/16e10 + 4/4e10 = 4e-10 + 1e-10 = 5e-10 -> 68/5e-10 = 13.6e10;
#   80 = 64/16e10 + 16/10e10 = 4e-10 + 1.6e-10 = 5.6e-10 -> 80/5.6e-10 = 14.285714...e10;
#   132 = 128/16e10 + 4/4e10 = 8e-10 + 1e-10 = 9e-10 -> 132/9e-10 = 14.666...e10;
#   200 = 192/16e10 + 8/7e10 = 1.2e-9 + 1.142857e-10 -> 200/1.3142857e-9 = 15.217391...e10.
# With the peak at 12e10 each part is capped first: 68 = 64/12e10 + 4/4e10 = 6.3333e-10 -> 10.736842...e10.
BLOCK_ROWS = [[1, 1e10], [4, 4e10], [64, 16e10], [128, 16e10]]


def test_matmul_rate_past_a_row_block_golden():
    dev = _host(matmul_flops=1e12, matmul_rows_flops=BLOCK_ROWS).paged_kernel()
    rows = np.array([1, 2, 4, 8, 16, 63, 64, 65, 68, 80, 128, 132, 200])
    got = dev.matmul_rate(rows, 1e12)
    below = dev.matmul_rate(np.array([1, 2, 4, 8, 16, 63]), 1e12)  # up to one block: the curve itself
    assert np.allclose(below, [1e10, 2.5e10, 4e10, 7e10, 10e10, 4e10 + 12e10 * np.log2(63 / 4) / 4], rtol=1e-12)
    want = [*below, 16e10, 13e10, 13.6e10, 80 / 5.6e-10, 16e10, 132 / 9e-10, 200 / (1.2e-9 + 8 / 7e10)]
    assert np.allclose(got, want, rtol=1e-12)
    for r, w in zip(rows, want):  # scalars as arrays
        assert math.isclose(float(dev.matmul_rate(int(r), 1e12)), w, rel_tol=1e-12)
    assert math.isclose(float(dev.matmul_rate(68, 12e10)), 68 / (64 / 12e10 + 4 / 4e10), rel_tol=1e-12)
    assert math.isclose(68 / (64 / 12e10 + 4 / 4e10), 10.736842105263158e10, rel_tol=1e-12)


def test_step_cost_prices_matmuls_at_their_rows_golden():
    # The toy decoder: 2 layers x (Q, K, V, O of hidden 256 = 4 x 256^2) = 524,288 layer parameters, LM head
    # 512 x 256 = 131,072. A decode step of 2 sequences (2 rows, 2 logit rows): (2 x 524,288 x 2 + 2 x 131,072 x 2)
    # = 2,621,440 FLOPs at 2.5e10 FLOP/s = 1.048576e-4 s; a chunk of 64 tokens with 64 logit rows:
    # 83,886,080 FLOPs at the peak 6e10 = 1.398101333e-3 s, as without rates.
    from simkv.validate.openvino.toy import toy_model_spec

    model = toy_model_spec(custom_model(layers=2, heads=4, kv_heads=4, head_dim=64), 256, 512)
    dev = _host(matmul_flops=6e10, matmul_rows_flops=ROWS).paged_kernel()
    plain = _host(matmul_flops=6e10).paged_kernel()
    for n, want in ((2, 1.048576e-4), (64, 83886080 / 6e10)):
        c, p = (step_cost(model, d, weights_bytes=0, new_tokens=n, attended_pairs=0, kv_read_bytes=0,
                          kv_write_bytes=0) for d in (dev, plain))
        assert math.isclose(c.terms[1], want, rel_tol=1e-12)
        assert math.isclose(p.terms[1], 83886080 / 64 * n / 6e10, rel_tol=1e-12)
    # Past a row block (BLOCK_ROWS above): 68 tokens, 68 logit rows = 68 x 1,310,720 = 89,128,960 FLOPs at
    # 13.6e10 FLOP/s (64 rows at 16e10 + 4 at 4e10) = 6.5536e-4 s; 64 tokens: 83,886,080 at 16e10 = 5.24288e-4 s.
    blocked = _host(matmul_flops=1e12, matmul_rows_flops=BLOCK_ROWS).paged_kernel()
    for n, want in ((68, 6.5536e-4), (64, 5.24288e-4)):
        c = step_cost(model, blocked, weights_bytes=0, new_tokens=n, attended_pairs=0, kv_read_bytes=0,
                      kv_write_bytes=0)
        assert math.isclose(c.terms[1], want, rel_tol=1e-12)


def test_presets_have_no_rows_rates_and_price_as_before():
    """Only a calibrated host has matmul_rows_flops: every preset's matmul term is its FLOPs over peak x
    efficiency, exactly as before."""
    from simkv.cost.devices import DEVICES
    from simkv.cost.weights import matmul_params

    model = custom_model(layers=4, heads=8, kv_heads=8, head_dim=64)
    head = float(model.vocab * model.hidden) if model.weight_params else 0.0
    for dev in DEVICES.values():
        for d in (dev, dev.paged_kernel()):
            assert d.matmul_rows_flops == () and "matmul_rows_flops" not in d.paged
            c = step_cost(model, d, weights_bytes=0, new_tokens=8, attended_pairs=0, kv_read_bytes=0,
                          kv_write_bytes=0)
            flops = 2.0 * (matmul_params(model) - head) * 8 + 2.0 * head * 8
            assert c.terms[1] == flops / (d.peak() * d.flops_efficiency)


@pytest.mark.parametrize("curve, peak", [(ROWS, 6e10), (BLOCK_ROWS, 1e12)])
def test_step_timer_follows_rows_rates(curve, peak):
    """The serving engine's StepTimer prices steps as step_cost does (official() refuses beyond 1e-9), also past a
    row block (65, 68, 132, 300 rows: full blocks and the rows left over)."""
    from simkv.serving.engine.costing import StepTimer

    model = custom_model(layers=4, heads=8, kv_heads=8, head_dim=64)
    dev = _host(matmul_flops=peak, matmul_rows_flops=curve, sequence_overhead_s=3e-5).paged_kernel()
    timer = StepTimer(model, dev, 10**8, 4096)
    counts = (1, 2, 5, 32, 64, 65, 68, 132, 300)
    est = np.array([timer.step(n, n * 50, n * 50, 0, n, n * 50) for n in counts])
    seconds, _ = timer.official(est)
    assert np.allclose(seconds, est, rtol=1e-12, atol=0)  # official() itself refuses beyond 1e-9
    n = np.array(counts)
    many = timer.steps(n, n * 50, n * 50, n, n * 50)
    assert np.allclose(many, est, rtol=1e-12, atol=0)


def test_rows_rates_round_trip_and_refusals():
    dev = _host(matmul_flops=6e10, matmul_rows_flops=ROWS)
    assert Device.from_dict(dev.to_dict()).paged_kernel().matmul_rows_flops == dev.paged_kernel().matmul_rows_flops
    for bad in ([[4, 1e10], [2, 2e10]], [[0, 1e10]], [[1, -1.0]], [[1.5, 1e10]], "x", [[1]]):
        with pytest.raises(ConfigError, match="matmul_rows_flops") as err:
            _host(matmul_rows_flops=bad)
        assert "\n" not in str(err.value)

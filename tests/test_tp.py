"""Tensor parallelism (`--tp N`, issue #21 point 2): one device's share of the weights and the KV, the all-reduces
each step adds, the weights precision each device preset loads by default — golden values worked out by hand."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from simkv.cost import INTERCONNECTS, allreduce_s, allreduces_per_step, get_device, step_cost
from simkv.errors import ConfigError
from simkv.kvspec import LayerKV, tp_kv_heads, tp_layers
from simkv.models import ModelSpec, get_model, tp_shard, weights_bytes
from simkv.precision import get_precision
from simkv.scenario import resolve_weights_memory
from simkv.serving import Request, SchedulerConfig, ServingSpec, serve
from simkv.serving.engine.core import PagedServing

H100 = get_device("h100-sxm")
F16 = get_precision("f16")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "simkv.cli", "run", *args], capture_output=True, text=True,
                          timeout=120)


# -- weights and KV per device ---------------------------------------------------------------------------

def test_tp2_halves_llama3_8b_weights_and_kv_per_device():
    # llama-3-8b: 32 layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336, vocab 128256 (= 64 x 2004).
    # One device (TP=1), per layer: q 4096·32·128 = 16,777,216; k+v 4096·8·256 = 8,388,608; o 16,777,216;
    #   MLP 3·4096·14336 = 176,160,768  -> 218,103,808; x 32 = 6,979,321,856; embedding + LM head 128256·4096·2
    #   = 1,050,673,152  -> 8,029,995,008 parameters.
    # TP=2, per device: q 4096·16·128 = 8,388,608; k+v 4096·4·256 = 4,194,304; o 8,388,608; MLP 3·4096·7168 =
    #   88,080,384 -> 109,051,904; x 32 = 3,489,660,928; vocab padded to 64 (128,256 already is) / 2 = 64,128 rows,
    #   64128·4096·2 = 525,336,576 -> 4,014,997,504 = exactly half.
    model = get_model("llama-3-8b")
    share = tp_shard(model, 2)
    assert model.weight_params == 8_029_995_008
    assert (share.heads, share.kv_heads, share.vocab, share.intermediate, share.hidden) == (16, 4, 64_128, 7168, 4096)
    assert share.weight_params == 4_014_997_504 == model.weight_params // 2
    # h100-sxm loads the checkpoint's 2-byte weights (vLLM --dtype auto): 16,059,990,016 B whole, 8,029,995,008 B
    # per device
    assert resolve_weights_memory(model, None, None, H100) == 16_059_990_016
    assert resolve_weights_memory(share, None, None, H100) == 8_029_995_008
    # KV per token, f16: whole model 32 layers x (K + V) 2 x 8 heads x 128 x 2 B = 131,072 B; per device 4 heads:
    # 65,536 B
    assert F16.kv_bytes_per_token(model) == 131_072 and F16.kv_bytes_per_token(share) == 65_536
    # The KV budget per device follows (the H100's 85,017,493,504 B, measured): - 8,029,995,008 = 76,987,498,496 B;
    # blocks of 16 tokens x 65,536 B = 1,048,576 B -> 76,987,498,496 // 1,048,576 = 73,421 blocks (exactly). One
    # device: 85,017,493,504 - 16,059,990,016 = 68,957,503,488 B // 2,097,152 B = 32,881 blocks (32,881 x 2,097,152 =
    # 68,956,454,912; 1,048,576 B left): more than twice the tokens per device, since the weights halved too.
    cfg = SchedulerConfig(block_size=16)
    one = PagedServing([], model, F16, cfg, device=H100, weights_bytes=16_059_990_016, device_memory=H100.memory_bytes)
    two = PagedServing([], share, F16, cfg, device=H100, weights_bytes=8_029_995_008, device_memory=H100.memory_bytes)
    assert (one.block_bytes, one.max_blocks) == (2_097_152, 32_881)
    assert (two.block_bytes, two.max_blocks) == (1_048_576, 73_421)


def test_two_kv_heads_are_replicated_at_tp4():
    # 8 query heads, 2 KV heads of 64, 2 layers, hidden 512, MLP 1024, vocab 1000. At TP=4 each device gets
    # 8/4 = 2 query heads and max(1, 2 // 4) = 1 KV head: each KV head lives on 2 devices (vLLM replicates).
    toy = ModelSpec("toy", layers=2, heads=8, kv_heads=2, head_dim=64, hidden=512, intermediate=1024, vocab=1000)
    share = tp_shard(toy, 4)
    assert (share.heads, share.kv_heads) == (2, 1)
    # KV per token, f16: whole 2 layers x 2 (K, V) x 2 heads x 64 x 2 B = 1,024 B; per device 1 head: 512 B —
    # a half, not a quarter
    assert F16.kv_bytes_per_token(toy) == 1024 and F16.kv_bytes_per_token(share) == 512
    # weights per device: q 512·2·64 = 65,536; k+v 512·1·128 = 65,536 (replicated: half of the whole 131,072, not a
    # quarter); o 2·64·512 = 65,536; MLP 3·512·256 = 393,216 -> 589,824 per layer, 1,179,648 for 2; vocab 1000
    # padded to 1024, / 4 = 256 rows: 256·512·2 = 262,144 -> 1,441,792.
    # Whole: (262,144 + 131,072 + 262,144 + 1,572,864) x 2 = 4,456,448 + 1000·512·2 = 1,024,000 -> 5,480,448.
    assert share.weight_params == 1_441_792 and toy.weight_params == 5_480_448
    # per layer kind (kvspec): an attention layer's heads replicate, an MLA latent is not divided, linear states
    # split by heads
    full = LayerKV("full", 2, 64, 64)
    mla = LayerKV("full", 8, 192, 128, latent=(512, 64))
    linear = LayerKV("linear", conv_elements=8 * 3, recurrent_elements=8 * 64 * 64)
    got = tp_layers((full, mla, linear), 4)
    assert got[0].kv_heads == 1 and got[0].cached() == (1, 64, 64)
    assert got[1].cached("latent") == (1, 512, 64) and got[1].kv_heads == 2
    assert (got[2].conv_elements, got[2].recurrent_elements) == (6, 2 * 64 * 64)
    assert tp_layers((full,), 1) == (full,)


def test_tp_refuses_what_vllm_refuses():
    assert tp_kv_heads(8, 2) == 4 and tp_kv_heads(2, 4) == 1 and tp_kv_heads(8, 8) == 1
    with pytest.raises(ConfigError, match="does not split 6 KV heads"):
        tp_kv_heads(6, 4)
    with pytest.raises(ConfigError, match="attention heads \\(14\\)"):
        tp_shard(get_model("qwen2.5-0.5b"), 4)
    with pytest.raises(ConfigError, match="positive integer"):
        tp_shard(get_model("llama-3-8b"), 0)
    assert tp_shard(get_model("llama-3-8b"), 1) is get_model("llama-3-8b")


# -- the all-reduces --------------------------------------------------------------------------------

def test_allreduce_time_added_per_step_at_tp2_on_h100():
    # llama-3-8b at TP=2 on h100-sxm (NVLink 4; Vidur h100_dgx n=2 fit: α = 24.00 µs, busbw = 305.0 GB/s).
    # A decode step of 64 tokens: each all-reduce moves 64 x 4096 x 2 B = 524,288 B:
    #   24.00e-6 + 2(2-1)/2 x 524,288 / 305.0e9 = 24.00e-6 + 1.718977e-6 = 25.718977e-6 s;
    # 2 x 32 + 1 = 65 of them: 1.671733e-3 s added to the step.
    share = tp_shard(get_model("llama-3-8b"), 2)
    assert INTERCONNECTS[H100.interconnect].fit(2) == (24.00e-6, 305.0e9)
    assert allreduces_per_step(share) == 65
    assert allreduce_s(share, H100, 64) == pytest.approx(65 * (24.00e-6 + 524_288 / 305.0e9), rel=1e-12)
    assert allreduce_s(share, H100, 64) == pytest.approx(1.671733e-3, abs=1e-9)
    kv = 64 * 1024 * 65_536
    args = dict(weights_bytes=8_029_995_008, new_tokens=64, attended_pairs=64 * 1024, kv_read_bytes=kv,
                kv_write_bytes=64 * 65_536, logit_tokens=64)
    with_reduce = step_cost(share, H100, **args)
    without = step_cost(replace(share, tp=1), H100, **args)  # the same device's work, no all-reduces
    assert with_reduce.seconds - without.seconds == pytest.approx(1.671733e-3, abs=1e-9)
    assert with_reduce.allreduce_s == allreduce_s(share, H100, 64) and without.allreduce_s == 0.0
    # a prefill chunk of 256 tokens: 2 MiB per all-reduce, 24e-6 + 2,097,152 / 305e9 = 30.8759e-6 s, x 65
    assert allreduce_s(share, H100, 256) == pytest.approx(65 * (24e-6 + 2_097_152 / 305.0e9), rel=1e-12)
    # A100 (NVLink 3, a100_dgx n=4: 54.42 µs, 182.6 GB/s) at TP=4, one token: 65 x (54.42e-6 + 1.5 x 8192 / 182.6e9)
    a100, share4 = get_device("a100-80gb"), tp_shard(get_model("llama-3-8b"), 4)
    assert allreduce_s(share4, a100, 1) == pytest.approx(65 * (54.42e-6 + 1.5 * 8192 / 182.6e9), rel=1e-12)


def test_a_step_at_tp1_is_unchanged():
    # the time step_cost gave before tensor parallelism existed (simkv at 89ad80c), to the last bit
    model = get_model("llama-3-8b")
    h100 = replace(H100, bandwidth_efficiency=0.694, flops_efficiency=0.561, layer_overhead_s=0.0)  # (the preset then)
    c = step_cost(model, h100, weights_bytes=weights_bytes(model, "bf16"), new_tokens=64, attended_pairs=64 * 1024,
                  kv_read_bytes=64 * 1024 * 131_072, kv_write_bytes=64 * 131_072, logit_tokens=64)
    assert c.seconds == 0.009785245305440593 and c.allreduce_s == 0.0
    assert tp_shard(model, 1) is model


# -- serving at TP=2 -------------------------------------------------------------------------------

def _requests():
    return [Request(i, prompt=200 + 37 * i, max_new_tokens=20 + 5 * i, arrival_s=0.05 * i) for i in range(12)]


def test_serving_tp2_planned_runs_equal_the_reference_and_pay_the_allreduces():
    model = get_model("llama-3-8b")
    share = tp_shard(model, 2)
    weights = resolve_weights_memory(share, None, None, H100)

    def run(tp, engine, w):
        return serve(ServingSpec(_requests(), model, F16, device="h100-sxm", weights_bytes=w, tp=tp, engine=engine,
                                 max_context=0))

    fast, ref = run(2, "fast", weights), run(2, "reference", weights)
    assert np.array_equal(fast.steps, ref.steps)  # single steps and planned runs: the same times
    # every step that ran a forward pass took its all-reduces: the same run without them is shorter by exactly that
    from simkv.serving.engine.costing import Work  # noqa: F401 (the timer under test)
    from simkv.serving.engine.core import PagedServing as Engine

    eng = Engine(_requests(), share, F16, SchedulerConfig(), device=H100, weights_bytes=weights,
                 device_memory=H100.memory_bytes)
    plain = Engine(_requests(), replace(share, tp=1), F16, SchedulerConfig(), device=H100, weights_bytes=weights,
                   device_memory=H100.memory_bytes)
    x = (64, 64 * 500, 64 * 500, 0, 64, 64 * 500)
    assert eng.timer.step(*x) - plain.timer.step(*x) == pytest.approx(float(allreduce_s(share, H100, 64)), rel=1e-9)
    out = fast.summary()
    assert out["scenario"]["tp"] == 2 and out["scenario"]["kv_bytes_per_token"] == 65_536
    assert out["scenario"]["weights_memory_bytes"] == 8_029_995_008
    assert "tp" not in run(1, "fast", resolve_weights_memory(model, None, None, H100)).summary()["scenario"]


def test_cli_tp_and_its_refusals(tmp_path):
    ok = cli("--synthetic", "--requests", "3", "--rate", "5", "--device", "h100-sxm", "--tp", "2", "--json")
    assert ok.returncode == 0, ok.stderr
    for args, words in ((("--device", "h100-sxm", "--pp", "2"), "pipeline parallelism is not modelled"),
                        (("--device", "xeon-8480", "--tp", "2"), "runs OpenVINO"),
                        (("--device", "arc-a770", "--tp", "2"), "runs OpenVINO"),
                        (("--device", "h100-sxm", "--tp", "3"), "no all-reduce figures for 3 devices"),
                        (("--device", "h100-sxm", "--tp", "4", "--model", "qwen2.5-0.5b"), "attention heads (14)"),
                        (("--device", "h100-sxm", "--tp", "0"), "positive integer")):
        res = cli("--synthetic", "--requests", "3", *args)
        assert res.returncode == 2 and words in res.stderr and res.stderr.count("\n") == 1, (args, res.stderr)
    single = cli("--device", "h100-sxm", "--tp", "2")
    assert single.returncode == 2 and "--tp applies to serving" in single.stderr


# -- default weights precision per device -----------------------------------------------------------

def test_default_weights_precision_follows_the_device_runtime():
    llama2 = get_model("llama-2-7b")  # 6,738,149,376 parameters (config.json torch_dtype float16)
    for name in ("h100-sxm", "a100-80gb"):  # vLLM --dtype auto: the checkpoint's 2 B per parameter
        dev = get_device(name)
        assert dev.default_weights_precision(llama2) == "f16"
        assert resolve_weights_memory(llama2, None, None, dev) == 13_476_298_752  # 12.55 GiB
    for name in ("xeon-8480", "arc-a770", "core-ultra-155h-igpu"):  # optimum-intel: int8 from 1e9 parameters
        dev = get_device(name)
        assert dev.default_weights_precision(llama2) == "int8"
        assert resolve_weights_memory(llama2, None, None, dev) == 6_738_149_376  # 6.28 GiB
        assert dev.default_weights_precision(get_model("qwen2.5-0.5b")) == "f16"
    assert resolve_weights_memory(llama2, None, None) == 6_738_149_376  # no device: as before
    assert get_device("h100-sxm").default_weights_precision(replace(llama2, dtype="bfloat16")) == "bf16"
    assert resolve_weights_memory(llama2, None, "int8", get_device("h100-sxm")) == 6_738_149_376  # a flag wins

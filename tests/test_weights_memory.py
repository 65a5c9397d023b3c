"""Device memory besides the KV cache (``weights_memory``): defaults, out of memory, the CLI."""

import json
import subprocess
import sys

import pytest

from conftest import assert_same_run, rows_of, run
from simkv import build_scenario, simulate


def test_default_weights_follow_optimum_intel_export():
    # llama-3-8b (config.json: hidden 4096, 32 layers, 32 heads x 128, 8 KV heads, MLP 14336, vocab 128256,
    # untied embeddings), per layer: q,o 2·4096·4096 = 33,554,432; k,v 2·4096·8·128 = 8,388,608;
    # MLP 3·4096·14336 = 176,160,768 → 218,103,808 × 32 = 6,979,321,856; embeddings 2·128256·4096 =
    # 1,050,673,152 → 8,029,995,008 parameters ≥ 10^9: optimum-intel compresses them to int8, 1 B each.
    assert build_scenario().weights_memory == 8_029_995_008
    # gpt2: per layer 4·768·768 (q,k,v,o) = 2,359,296 + MLP 2·768·3072 = 4,718,592 → 7,077,888 × 12 =
    # 84,934,656; tied embeddings 50257·768 = 38,597,376 → 123,532,032 < 10^9: kept f16, 2 B each.
    assert build_scenario(model="gpt2").weights_memory == 247_064_064
    assert build_scenario(model="gpt2", weights_precision="int4").weights_memory == 61_766_016
    assert build_scenario(model=None, layers=2, kv_heads=1, head_dim=16).weights_memory == 0  # custom shape
    assert build_scenario(weights_memory="1GiB").weights_memory == 2**30
    assert build_scenario(weights_memory=0).weights_memory == 0


def test_weights_count_toward_out_of_memory():
    """KV allocated + weights > device memory is out of memory."""
    tiny = dict(layers=1, kv_heads=1, head_dim=16, precision="f16", policy="exact", decode=1)
    # Exact size: prompt 10 → K and V 10 tokens × 32 B = 320 B each; every decode step allocates
    # new K (+32 B a token) and V before the old ones go at the end of the step.
    # Step 0: 640 B. Step 1: 640 + 352 + 352 = 1,344 B at its peak.
    fits = run(**tiny, prompt=10, device_memory=1_344 + 1_000, weights_memory=1_000)
    assert fits.oom is None
    short = run(**tiny, prompt=10, device_memory=1_343 + 1_000, weights_memory=1_000)
    assert short.oom.step == 1 and short.oom.weights == 1_000
    # Step 1 got its K (640 + 352 = 992 B, + 1,000 ≤ 2,343); its V (1,344) does not fit.
    assert [r[3] for r in rows_of(short, step=1)] == ["alloc", "copy"]
    assert "KV + 1,000 B weights of" in str(short.oom)
    for weights in (1_000, 5_000):
        scenario = build_scenario(model=None, **tiny, prompt=10, device_memory=6_000, weights_memory=weights)
        assert_same_run(simulate(scenario), simulate(scenario, engine="reference"))


def test_weights_count_toward_the_headroom_limit():
    """GPU plugin: no headroom once weights + KV in use + the allocation reach 90 % of device memory."""
    gpu = dict(layers=1, kv_heads=1, head_dim=16, precision="f16", policy="openvino-gpu", prompt=10, decode=1,
               policy_options={"beam_tables": 0})
    # K0 asks 10 + 128 = 138 tokens × 32 B = 4,416 B, V0 139 × 32 = 4,448 B.
    # Without weights, 0.9 × 10,000 = 9,000 > 4,416 + 4,448 = 8,864: both get headroom.
    free = run(**gpu, device_memory=10_000)
    assert [r[5] for r in rows_of(free, op="alloc", step=0)] == [138, 139]
    # 1,000 B of weights: K0 1,000 + 4,416 < 9,000 → 138; V0 1,000 + 4,416 + 4,448 = 9,864 ≥ 9,000 → exact 10.
    loaded = run(**gpu, device_memory=10_000, weights_memory=1_000)
    assert [r[5] for r in rows_of(loaded, op="alloc", step=0)] == [138, 10]


def simkv(*args):
    return subprocess.run([sys.executable, "-m", "simkv.cli", *args], capture_output=True, text=True)


def test_cli_weights_flags():
    data = json.loads(simkv("run", "--model", "gpt2", "--weights-precision", "f32", "--decode", "10", "--json").stdout)
    assert data["scenario"]["weights_memory_bytes"] == 4 * 123_532_032
    data = json.loads(simkv("run", "--weights-memory", "15GiB", "--decode", "10", "--json").stdout)
    assert data["scenario"]["weights_memory_bytes"] == 15 * 2**30
    assert data["oom"] is None
    proc = simkv("run", "--weights-memory", "1GiB", "--weights-precision", "f16")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not both" in proc.stderr


@pytest.mark.parametrize("bad", ["-1GiB", "lots"])
def test_cli_bad_weights_memory(bad):
    proc = simkv("run", f"--weights-memory={bad}")
    assert proc.returncode == 2 and "cannot read" in proc.stderr and "Traceback" not in proc.stderr

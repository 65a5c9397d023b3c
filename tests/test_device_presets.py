"""The device and interconnect presets as data: one file each, every number with its source, the datasheet-only
presets (h200-sxm, b200, b300) priced by hand, and every GPU's memory as CUDA reports it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simkv.cost import DEVICE_DIR, DEVICES, INTERCONNECTS, PRESET_NAMES, forward_cost, get_device, load_device
from simkv.cost.interconnects import INTERCONNECT_DIR, INTERCONNECT_NAMES
from simkv.cost.step import step_cost
from simkv.cost.weights import matmul_params
from simkv.models import get_model, weights_bytes
from simkv.precision import get_precision
from simkv.serving.engine.core import memory_path
from simkv.serving.sched.vllm import batch_defaults
from simkv.validate.silicon import SYSTEMS

ROOT = Path(__file__).resolve().parent.parent


def test_every_preset_file_is_listed_and_loads():
    # the folder holds the presets and device files that are no preset (--device PATH); every one loads
    assert set(PRESET_NAMES) <= {p.stem for p in DEVICE_DIR.glob("*.json")}
    for path in DEVICE_DIR.glob("*.json"):
        assert load_device(path).name == path.stem
    assert list(DEVICES) == list(PRESET_NAMES)
    assert sorted(p.stem for p in INTERCONNECT_DIR.glob("*.json")) == sorted(INTERCONNECT_NAMES)
    for name in PRESET_NAMES:  # a preset file is also a --device PATH.json, and says the same
        assert load_device(DEVICE_DIR / f"{name}.json") == get_device(name)
        assert DEVICES[name].interconnect in INTERCONNECTS


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_number_has_a_source(name):
    data = json.loads((DEVICE_DIR / f"{name}.json").read_text())
    numbers = [k for k, v in data.items() if k != "sources" and isinstance(v, (int, float, dict))
               and not isinstance(v, bool)]
    assert "peak_flops" in numbers and "memory_bandwidth" in numbers
    missing = [k for k in numbers if not data["sources"].get(k, "").strip()]
    assert not missing, f"{name}: no source for {missing}"
    unknown = set(data["sources"]) - set(data)
    assert not unknown, f"{name}: sources for fields it does not have: {unknown}"


@pytest.mark.parametrize("name", INTERCONNECT_NAMES)
def test_every_interconnect_has_a_source(name):
    data = json.loads((INTERCONNECT_DIR / f"{name}.json").read_text())
    assert data["source"].strip() and data["fits"]


def test_h200_and_b200_from_their_datasheets():
    h200, b200 = get_device("h200-sxm"), get_device("b200")
    assert (h200.memory_bandwidth, h200.peak("bf16"), h200.peak("f8")) == (4.8e12, 989.5e12, 1979e12)
    assert (b200.memory_bandwidth, b200.peak("bf16"), b200.peak("f8"), b200.peak("f4")) == (7.7e12, 2.25e15, 4.5e15, 9e15)
    # NVLink 5: twice NVLink 4's bus bandwidth at every n, its latency
    nv4, nv5 = INTERCONNECTS["nvlink4"], INTERCONNECTS["nvlink5"]
    for n in (2, 4, 8):
        assert nv5.fit(n) == (nv4.fit(n)[0], pytest.approx(2 * nv4.fit(n)[1]))


def test_gpu_memory_is_what_cuda_reports_not_the_datasheet():
    """vLLM's KV pool is gpu_memory_utilization x torch.cuda total_memory (Worker.determine_available_memory), so a
    GPU preset holds the total CUDA reports, from published outputs (docs/research/latency-facts.md §6):
    torch prints total_memory as totalGlobalMem // 2**20 'MB' — H200 143156MB, B200 182642MB (ai-bot-pro/achatbot
    deploy/modal/src/llm/vllm/vlm/skywork_r1v.py @ 859e2161); CUDA deviceQuery on an A100-SXM4-80GB prints
    85,100,068,864 bytes (thamada/nvidia-smi gls/A100SXMx4_deviceQuery.py @ b09ef139); the H100's was measured."""
    assert get_device("h200-sxm").memory_bytes == 143_156 * 2**20 == 150_109_945_856  # datasheet "141 GB": 141e9
    assert get_device("b200").memory_bytes == 182_642 * 2**20 == 191_514_017_792      # datasheet "180 GB": 180e9
    assert get_device("a100-80gb").memory_bytes == 85_100_068_864                    # datasheet "80 GB": 80e9
    assert get_device("h100-sxm").memory_bytes == 81_079 * 2**20 == 85_017_493_504
    # each sits below nvidia-smi's total by what the driver keeps (published listings: H200 143,771 MiB,
    # B200 183,359 MiB, A100 81,920 MiB with 763 MiB reserved; the H100 here 81,559 MiB) and above the datasheet
    for name, smi_mib, datasheet in (("h200-sxm", 143_771, 141e9), ("b200", 183_359, 180e9),
                                     ("a100-80gb", 81_920, 80e9), ("h100-sxm", 81_559, 80e9)):
        reserved_mib = smi_mib - get_device(name).memory_bytes / 2**20
        assert 400 < reserved_mib < 800 and get_device(name).memory_bytes > datasheet, name
    # vLLM's server defaults for a device read the same total: the B200 stays at >= 160 GiB, the H200 below it
    assert batch_defaults("b200", get_device("b200").memory_bytes) == (16384, 1024)
    assert batch_defaults("h200-sxm", get_device("h200-sxm").memory_bytes) == (8192, 1024)
    assert batch_defaults("a100-80gb", get_device("a100-80gb").memory_bytes) == (2048, 256)


def test_h200_decode_step_by_hand():
    # llama-3-8b (bf16 weights), batch 1, context 1,024, f16 KV: a memory-bound decode step on the H200
    #   weights: every weight once at 4.8 TB/s x 0.877;  KV: 32 layers x 8 kv heads x 128 x 2 (K, V) x 2 B = 131,072 B
    #   per token, 1,024 read + 1 written, at 4.8 TB/s x 0.892 (attention's arithmetic is far below its bytes);
    #   the layers' fixed cost 32 x 37.7 us
    model = get_model("llama-3-8b")
    w = weights_bytes(model, "bf16")
    kv = 131072 * (1024 + 1)
    expected = w / (4.8e12 * 0.877) + kv / (4.8e12 * 0.892) + 32 * 3.77e-5
    c = forward_cost(model, get_device("h200-sxm"), get_precision("f16"), batch=1, context=1024, new=1,
                     weights_precision="bf16")
    assert c.seconds == pytest.approx(expected, rel=1e-12)
    # the same step on the H100: its bytes 4.8 / 3.35 times slower, the same fixed cost
    h100 = forward_cost(model, get_device("h100-sxm"), get_precision("f16"), batch=1, context=1024, new=1,
                        weights_precision="bf16")
    assert h100.seconds == pytest.approx((c.seconds - 32 * 3.77e-5) * 4.8 / 3.35 + 32 * 3.77e-5, rel=1e-12)


def test_b300_from_the_blackwell_ultra_datasheet():
    """The HGX B300 per-GPU column of NVIDIA's Blackwell Ultra datasheet, dense (half the sparse figures), as
    aiconfigurator-core 0.12.0 systems/b300_sxm.yaml transcribes it (docs/research/latency-facts.md §6): BF16 2,250,
    FP8 4,500, FP4 14,000 TFLOPS; INT8 cut to 307 / 2 = 153.5 TOPS (the B200: 4,500); TF32 18 PFLOPS sparse for
    8 GPUs / 16 = 1,125; FP32 600 / 8 = 75; 7.7 TB/s HBM3e; NVLink 5."""
    b300 = get_device("b300")
    assert b300.memory_bandwidth == 7.7e12
    assert dict(b300.peak_flops) == {"bf16": 2.25e15, "f16": 2.25e15, "f8": 4.5e15, "int8": 153.5e12, "f4": 14e15,
                                     "tf32": 1.125e15, "f32": 75e12}
    assert b300.peak("int8") * 29 < get_device("b200").peak("int8") < b300.peak("int8") * 30  # Blackwell Ultra's cut
    assert (b300.runtime, b300.interconnect, b300.compute_precision) == ("vllm", "nvlink5", "bf16")
    # the terms no B300 measurement gives are the B200's, taken by the same rule (the H100's measured fractions and
    # per-layer cost, a copy reading and writing each byte): nothing fitted to B300 rows
    b200 = get_device("b200")
    for term in ("bandwidth_efficiency", "kv_bandwidth_efficiency", "flops_efficiency", "step_overhead_s",
                 "layer_overhead_s", "copy_bandwidth"):
        assert getattr(b300, term) == getattr(b200, term), term
    assert b300.copy_bandwidth == pytest.approx(0.892 * 7.7e12 / 2, rel=1e-12)
    # memory: nvidia-smi's 275,040 MiB (every published B300 SXM6 AC listing; aiconfigurator-core's mem_capacity
    # 288,400,343,040 B) less the B200's driver reserve, 183,359 - 182,642 = 717 MiB (derived: no CUDA total published)
    assert b300.memory_bytes == (275_040 - (183_359 - 182_642)) * 2**20 == 287_648_514_048
    assert 270e9 < b300.memory_bytes < 275_040 * 2**20 == 288_400_343_040
    assert "DERIVED" in b300.sources["memory_bytes"]
    # vLLM's server defaults: >= 160 GiB; KV memory on the GPU path; AIC's system name maps to it
    assert batch_defaults("b300", b300.memory_bytes) == (16384, 1024)
    assert memory_path(b300) == "gpu"
    assert SYSTEMS["b300_sxm"] == "b300"


def test_b300_gemm_kernels_on_sm103():
    """vLLM on SM103 (the SM100 family, docs/research/latency-facts.md §4): fp8 W8A8 and nvfp4 W4A4 on their tensor
    cores, mxfp4 experts through FlashInfer's MXFP4 x BF16 kernel and int4 Marlin in bf16, int8 W8A8 on the cut int8
    cores. A prefill of 4,096 tokens of llama-3-8b's layers priced per kernel, compute bound: the layers' GEMMs
    2 · P · 4,096 FLOPs at peak x 0.575, the LM head's one logit row at bf16, worked out here by hand."""
    b300 = get_device("b300")
    assert {f: b300.gemm_precision(f) for f in ("fp8", "fp8-block", "mxfp8", "nvfp4", "mxfp4", "int4-g128", "int8")} \
        == {"fp8": "f8", "fp8-block": "f8", "mxfp8": "f8", "nvfp4": "f4", "mxfp4": "bf16", "int4-g128": "bf16",
            "int8": "int8"}
    model = get_model("llama-3-8b")
    head = model.vocab * model.hidden
    layers = matmul_params(model) - head
    n = 4096
    times = {}
    for key, peak in (("f4", 14e15), ("f8", 4.5e15), ("bf16", 2.25e15), ("int8", 153.5e12)):
        c = step_cost(model, b300, weights_bytes=layers, new_tokens=n, attended_pairs=0, kv_read_bytes=0,
                      kv_write_bytes=0, logit_tokens=1, gemm_mix=((key, layers),))
        expected = 2 * head / (2.25e15 * 0.575) + 2 * layers * n / (peak * 0.575)
        assert c.matmul_s == pytest.approx(expected, rel=1e-12), key
        times[key] = c.matmul_s
    # fp4 runs 14 / 4.5 = 3.1x fp8's rate, int8 4,500 / 153.5 = 29.3x slower (the LM head's one row is < 0.1 %)
    assert times["f8"] / times["f4"] == pytest.approx(14 / 4.5, rel=1e-3)
    assert times["int8"] / times["f8"] == pytest.approx(4500 / 153.5, rel=1e-3)


def test_b300_decode_step_by_hand_and_on_the_cli():
    """A memory-bound decode step on the B300 is the B200's (the same 7.7 TB/s and assumed fractions): llama-3-8b
    bf16, batch 1, context 1,024, f16 KV — weights at 7.7 TB/s x 0.877, KV (131,072 B a token, 1,024 read + 1
    written) at 7.7 TB/s x 0.892, 32 layers x 37.7 us; `simkv cost --device b300` prints that step."""
    model = get_model("llama-3-8b")
    w = weights_bytes(model, "bf16")
    expected = w / (7.7e12 * 0.877) + 131072 * 1025 / (7.7e12 * 0.892) + 32 * 3.77e-5
    c = forward_cost(model, get_device("b300"), get_precision("f16"), batch=1, context=1024, new=1,
                     weights_precision="bf16")
    assert c.seconds == pytest.approx(expected, rel=1e-12)
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "cost", "--device", "b300", "--model", "llama-3-8b",
                          "--weights-precision", "bf16"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "on b300" in out.stdout
    assert f"decode step           {expected * 1e3:.3f} ms (memory bound)" in out.stdout

"""The device and interconnect presets as data: one file each, every number with its source, and the datasheet-only
presets (h200-sxm, b200) priced by hand."""

import json

import pytest

from simkv.cost import DEVICE_DIR, DEVICES, INTERCONNECTS, PRESET_NAMES, forward_cost, get_device, load_device
from simkv.cost.interconnects import INTERCONNECT_DIR, INTERCONNECT_NAMES
from simkv.models import get_model, weights_bytes
from simkv.precision import get_precision


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
    assert (h200.memory_bytes, h200.memory_bandwidth, h200.peak("bf16"), h200.peak("f8")) == (
        141e9, 4.8e12, 989.5e12, 1979e12)
    assert (b200.memory_bytes, b200.memory_bandwidth, b200.peak("bf16"), b200.peak("f8"), b200.peak("f4")) == (
        180e9, 7.7e12, 2.25e15, 4.5e15, 9e15)
    # NVLink 5: twice NVLink 4's bus bandwidth at every n, its latency
    nv4, nv5 = INTERCONNECTS["nvlink4"], INTERCONNECTS["nvlink5"]
    for n in (2, 4, 8):
        assert nv5.fit(n) == (nv4.fit(n)[0], pytest.approx(2 * nv4.fit(n)[1]))


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

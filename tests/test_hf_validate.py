"""simkv validate --runtime transformers: event extraction (pure), and real runs on torch CPU when installed."""

import importlib.util
import json
import subprocess
import sys

import pytest

from simkv.validate.memtrace import RawRecord
from simkv.validate.transformers.events import kv_events
from simkv.validate.transformers.model import HFValidateConfig

HAVE_HF = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "memray"))
needs_hf = pytest.mark.skipif(not HAVE_HF, reason="needs pip install -e '.[transformers]'")


def rec(seq, op, size, address, site):
    return RawRecord(seq, op, size, address, site, "POSIX_MEMALIGN", 1)


def test_kv_events_rank_layers_per_function_and_tensor_and_match_frees_by_address():
    upd_k, upd_v, reo_k = ("update", "k"), ("update", "v"), ("reorder_cache", "k")
    records = [
        rec(0, "alloc", 512, 0x10, upd_k), rec(0, "alloc", 512, 0x20, upd_v),
        rec(0, "alloc", 64, 0x30, None),  # an activation: not KV
        rec(0, "alloc", 512, 0x40, upd_k), rec(0, "alloc", 512, 0x50, upd_v),
        rec(0, "free", 64, 0x30, None),
        rec(1, "alloc", 900, 0x60, reo_k), rec(1, "free", 512, 0x10, upd_k),
        rec(1, "alloc", 900, 0x70, reo_k), rec(1, "free", 512, 0x40, upd_k),
        rec(1, "alloc", 960, 0x80, upd_k), rec(1, "free", 900, 0x60, reo_k),
    ]
    events, warnings = kv_events(records, layers=2)
    assert [e["via"] for e in events if e["op"] == "alloc"] == ["update"] * 4 + ["reorder_cache"] * 2 + ["update"]
    assert [(e["step"], e["layer"], e["tensor"], e["op"], e["bytes"]) for e in events] == [
        (0, 0, "k", "alloc", 512), (0, 0, "v", "alloc", 512), (0, 1, "k", "alloc", 512), (0, 1, "v", "alloc", 512),
        # step 1: reorder_cache ranks its own allocations, the frees carry their allocation's layer
        (1, 0, "k", "alloc", 900), (1, 0, "k", "free", 512), (1, 1, "k", "alloc", 900), (1, 1, "k", "free", 512),
        (1, 0, "k", "alloc", 960), (1, 0, "k", "free", 900),
    ]
    assert warnings == []


def test_config_refuses_what_the_runtime_does_not_have():
    from simkv.errors import ConfigError

    with pytest.raises(ConfigError, match="dtype"):
        HFValidateConfig(workload="prefill:4", dtype="u8")
    with pytest.raises(ConfigError, match="hf-dynamic or hf-static"):
        HFValidateConfig(workload="prefill:4", policy="openvino-cpu")


def test_cli_without_the_extra_says_how_to_install():
    code = ("import sys; sys.modules['torch'] = None; from simkv.cli import main; "
            "sys.exit(main(['validate', '--runtime', 'transformers', '--prompt', '4', '--decode', '2']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "simkv validate: error: transformers validation needs torch, transformers and memray: "
        "pip install 'simkv[transformers]'"]


def test_cli_rejects_bad_input_in_one_line():
    for argv in (["--runtime", "transformers", "--precision", "u8"],
                 ["--runtime", "transformers", "--policy", "hf-static", "--policy-opt", "max_cache_len=10"],
                 ["--sliding-window", "8"],
                 ["--runtime", "transformers", "--prompt", "100000"],
                 ["--runtime", "transformers", "--model", "llama-3-70b", "--prompt", "4000"],
                 ["--runtime", "transformers", "--arch", "gemma3", "--layers", "3"],  # the config gives the shape
                 ["--runtime", "transformers", "--model", "no/such/config.json"],
                 ["--arch", "gemma3"]):
        out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--prompt", "4", "--decode", "20", *argv],
                             capture_output=True, text=True)
        assert out.returncode == 2, argv
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.fixture(scope="module")
def hf():
    if not HAVE_HF:
        pytest.skip("needs pip install -e '.[transformers]'")
    from simkv.validate.transformers import runner as hfv

    return hfv


OPS = "prefill:7,decode:6,fork:3,decode:2,reorder,select:2,decode:1,reset,prefill:3,decode:1"


@pytest.mark.transformers
@needs_hf
@pytest.mark.parametrize("policy,window,kv_heads,dtype", [
    ("hf-dynamic", None, 2, "f16"),  # GQA 4/2
    ("hf-dynamic", 5, 4, "bf16"),  # sliding window shorter than the session
    ("hf-static", None, 4, "f32"),
    ("hf-static", 5, 4, "bf16"),  # StaticSlidingWindowLayer: a 5-token ring, rolled once full
])
def test_real_run_matches_event_by_event(hf, policy, window, kv_heads, dtype):
    cfg = HFValidateConfig(workload=OPS, layers=2, heads=4, kv_heads=kv_heads, head_dim=8, vocab=64, dtype=dtype,
                           policy=policy, sliding_window=window, clean_run=False)
    data = hf.run_validation(cfg)
    assert data["events_missing"] == data["events_unexpected"] == 0
    assert data["events_matched"] == data["events_total"] > 0
    assert data["alloc_peak"]["measured_bytes"] == data["alloc_peak"]["predicted_bytes"]
    inc = data["in_step_increase"]
    assert inc["steps_equal"] == inc["steps"] == 16
    assert data["scenario"]["layer_classes"] == [("Static" if policy == "hf-static" else "Dynamic")
                                                 + ("SlidingWindowLayer" if window else "Layer")]


@pytest.mark.transformers
@needs_hf
def test_cli_end_to_end_json_and_report(tmp_path):
    report = tmp_path / "r.html"
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--runtime", "transformers", "--layers", "1",
                          "--heads", "2", "--head-dim", "8", "--vocab", "32", "--precision", "f16", "--ops",
                          "prefill:5,decode:3,fork:2,select:1", "--json", "--report", str(report)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in ("events_total", "events_matched", "events_missing", "events_unexpected", "steps", "events", "versions"):
        assert key in data
    assert data["events_matched"] == data["events_total"] == 2 + 4 * 3 + 8 + 8
    assert data["versions"]["transformers"] and data["steps"][-1]["measured_rss_bytes"] > 0
    assert "transformers" in report.read_text()


# Today's architectures (the tiny configs of experiments/hf_layer_kinds; window / chunk 4): prefills shorter
# and longer than the window, decode across window and chunk boundaries, a chat turn, beam fork / reorder /
# select, reset. StaticCache: a turn that fits the sliding rings (one that overflows them is refused).
ARCH_OPS = {
    "hf-dynamic": "prefill:6,decode:7,prefill:5,decode:2,fork:3,decode:2,reorder,select:1,decode:1,reset,prefill:2,decode:4",
    "hf-static": "prefill:1,prefill:2,decode:7,fork:3,decode:2,reorder,select:1,decode:1,reset,prefill:6,decode:4",
}
ARCH_CLASSES = {
    "gemma3": {"DynamicSlidingWindowLayer", "DynamicLayer"}, "gpt_oss": {"DynamicSlidingWindowLayer", "DynamicLayer"},
    "llama4": {"DynamicSlidingWindowLayer", "DynamicLayer"}, "qwen3_next": {"LinearAttentionLayer", "DynamicLayer"},
    "deepseek_v3": {"DynamicLayer"}, "lfm2": {"LinearAttentionLayer", "DynamicLayer"},
}


@pytest.mark.transformers
@needs_hf
@pytest.mark.parametrize("policy", ["hf-dynamic", "hf-static"])
@pytest.mark.parametrize("arch", ["gemma3", "gpt_oss", "llama4", "qwen3_next", "deepseek_v3", "lfm2"])
def test_tiny_architectures_match_event_by_event(hf, arch, policy, tmp_path):
    """Six architectures x DynamicCache / StaticCache: every cache allocation and free (K, V, linear-attention
    conv and recurrent states; LFM2's conv state alone) matched in order and size. hf-dynamic reads the config from a config.json (what
    --model PATH does), hf-static from the tiny config object (--arch)."""
    from simkv.validate.transformers.archs import tiny_config

    source = {"arch": arch}
    if policy == "hf-dynamic":
        path = tmp_path / f"{arch}.json"
        tiny_config(arch).to_json_file(str(path))
        source = {"config_path": str(path)}
    cfg = HFValidateConfig(workload=ARCH_OPS[policy], policy=policy, clean_run=False, model_name=arch, **source)
    data = hf.run_validation(cfg)
    assert data["events_missing"] == data["events_unexpected"] == 0
    assert data["events_matched"] == data["events_total"] > 0
    assert data["alloc_peak"]["measured_bytes"] == data["alloc_peak"]["predicted_bytes"]
    inc, pointers = data["in_step_increase"], data["observer"]["pointer_check"]
    assert inc["steps_equal"] == inc["steps"] == pointers["steps_equal"] == pointers["steps"]
    classes = {c.replace("Dynamic", "Static") if policy == "hf-static" and c != "LinearAttentionLayer" else c
               for c in ARCH_CLASSES[arch]}
    assert set(data["scenario"]["layer_classes"]) == classes
    assert data["observer"]["warnings"] == []


@pytest.mark.transformers
@needs_hf
def test_cli_model_path_of_a_config(tmp_path):
    """--model PATH: a config.json, read by transformers, run and predicted per layer; a bad one is one line."""
    from simkv.validate.transformers.archs import tiny_config

    path = tmp_path / "config.json"
    tiny_config("qwen3_next").to_json_file(str(path))
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--runtime", "transformers", "--model",
                          str(tmp_path), "--precision", "bf16", "--ops", "prefill:3,decode:2,fork:2,select:1,reset,prefill:2",
                          "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    # 3 linear layers x (conv + recurrent), allocated once, gathered at fork and select (4 events each);
    # the full layer: prefill 2, decode 2 x 4, fork 8, select 8, reset 2, prefill 2.
    assert data["events_matched"] == data["events_total"] == 3 * (2 + 4 + 4) + 2 + 8 + 8 + 8 + 2 + 2
    assert "3 x linear state" in data["scenario"]["layer_kv"] and data["scenario"]["config"] == str(tmp_path)
    (tmp_path / "bad.json").write_text('{"model_type": "no_such_model"}')
    bad = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--runtime", "transformers", "--model",
                          str(tmp_path / "bad.json")], capture_output=True, text=True)
    assert bad.returncode == 2
    [line] = bad.stderr.strip().splitlines()
    # simkv's own loader reads the config first (simkv/hfconfig.py) and names what is missing.
    assert line == (f"simkv validate: error: model config {tmp_path / 'bad.json'}: missing hidden_size, "
                    "num_hidden_layers, num_attention_heads (model_type no_such_model)")

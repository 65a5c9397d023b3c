"""Workload parsing and the metric definitions (DESIGN.md §5) on hand-checked cases."""

import doctest

import pytest

import simkv
from conftest import run
from simkv.errors import ConfigError
from simkv.models import custom_model, get_model
from simkv.precision import get_precision
from simkv.units import format_bytes, parse_bytes
from simkv.workload import Decode, Fork, Prefill, Reset, Select, chat_session, parse_ops


def test_docstring_examples_run():
    assert doctest.testmod(simkv).failed == 0


def test_parse_ops_round_trip():
    w = parse_ops("prefill:32, decode:100,fork:4,decode:10,reorder,select:2,reset,prefill:5")
    assert str(w) == "prefill:32,decode:100,fork:4,decode:10,reorder,select:2,reset,prefill:5"
    assert w.steps == 1 + 100 + 1 + 10 + 1 + 1 + 1 + 1
    assert w.max_tokens == 32 + 100 + 1 + 10 + 1 + 1
    phases = [inf.phase for inf in w.inferences()]
    assert phases[0] == "prefill" and phases[101] == "fork" and phases[-2:] == ["reset", "prefill"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "workload is empty"),
        ("decode:5", "needs a prompt first"),
        ("prefill:0", "must be a positive integer"),
        ("prefill:-4", "must be a positive integer"),
        ("prefill:x", "is not an integer"),
        ("prefill", "needs a number"),
        ("explode:3", "unknown operation"),
        ("prefill:5,fork:1", "at least 2 beams"),
        ("prefill:5,select:3", "beam 3 does not exist"),
        ("prefill:5,reset:2", "takes no argument"),
        ("prefill:5,reset,decode:3", "needs a prompt first"),
    ],
)
def test_bad_workloads(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_ops(text)


def test_chat_session_shape():
    w = chat_session(100, 20, turns=2, turn_tokens=10, turn_decode=5, beam=3)
    assert w.ops == (
        Prefill(100), Fork(3), Decode(18), Select(0),
        Prefill(10), Fork(3), Decode(3), Select(0),
        Prefill(10), Fork(3), Decode(3), Select(0),
    )
    with pytest.raises(ConfigError, match="at least 3 decode steps"):
        chat_session(10, 2, beam=2)
    assert chat_session(5, 5, turns=1).ops == (Prefill(5), Decode(5), Prefill(64), Decode(5))
    assert Reset() not in chat_session(5, 5).ops


def test_models_and_precisions():
    llama = get_model("llama-2-7b")
    # DESIGN.md §1: Llama-2-7B in f16 holds 512 KiB per token; 2,048 tokens = 1 GiB.
    assert get_precision("f16").kv_bytes_per_token(llama) == 512 * 1024
    # GPU i8: H_kv × (S + 4) per K per layer.
    assert get_precision("i8").kv_bytes_per_token(llama) == 2 * 32 * 32 * (128 + 4)
    assert custom_model(llama, kv_heads=8).kv_heads == 8
    assert custom_model(None, layers=2, heads=4, head_dim=8).kv_heads == 4
    for bad, message in [
        (dict(layers=0, heads=1, head_dim=8), "layers must be a positive integer"),
        (dict(layers=2, heads=6, kv_heads=4, head_dim=8), "multiple of kv_heads"),
        (dict(layers=2), "a custom model needs"),
    ]:
        with pytest.raises(ConfigError, match=message):
            custom_model(None, **bad)
    with pytest.raises(ConfigError, match="unknown model"):
        get_model("gpt-5")
    with pytest.raises(ConfigError, match="fill whole bytes"):
        get_precision("u4").check(custom_model(None, layers=1, heads=1, head_dim=3))


def test_units():
    assert parse_bytes("16GiB") == 16 * 2**30 and parse_bytes("1.5 GB") == 1_500_000_000 and parse_bytes("4096") == 4096
    for bad in ("-1GiB", "lots", "0", "5 parsecs"):
        with pytest.raises(ConfigError):
            parse_bytes(bad)
    assert format_bytes(512) == "512 B" and format_bytes(1536) == "1.50 KiB" and format_bytes(3 * 2**30) == "3.00 GiB"


def test_metrics_of_a_hand_checked_run():
    # One layer, one f32 head of 16 (64 B/token per tensor), CPU doubling without beam tables
    # nor the past-view block.
    result = run(layers=1, kv_heads=1, head_dim=16, precision="f32", policy="geometric",
                 policy_options={"ratio": 2, "beam_tables": 0, "past_view": False}, prompt=4, decode=6)
    per_token = 2 * 64
    m = result.metrics
    # Steps 0-4 hold cap 8 (1,024 B); step 5 needs 9 → cap 18; alloc new, copy 8 tokens, free old.
    assert result.steps["allocated"].tolist() == [8 * per_token] * 5 + [18 * per_token] * 2
    assert m.peak_allocated_bytes == (8 + 18) * per_token
    assert m.max_spike_bytes == 8 * per_token and m.max_spike_step == 5
    assert m.final_allocated_bytes == 18 * per_token
    assert m.used_bytes == 10 * per_token and m.waste_bytes == 8 * per_token
    assert m.waste_reserved_bytes == 8 * per_token and m.waste_transient_bytes == 0
    assert m.mean_allocated_bytes == round((5 * 8 + 2 * 18) * per_token / 7)
    assert m.realloc_count == 2 and m.bytes_copied == 8 * per_token
    # First touch: resident = rows written; peak while the copy and the old buffer coexist.
    assert result.steps["resident"].tolist() == [t * per_token for t in (4, 5, 6, 7, 8, 9, 10)]
    assert m.peak_resident_bytes == 16 * per_token
    assert m.steps == 7 and m.oom_step is None


def test_out_of_memory_stops_the_run_and_says_where():
    result = run(layers=2, kv_heads=1, head_dim=16, precision="f32", policy="geometric",
                 policy_options={"ratio": 2}, prompt=4, decode=100, device_memory=4000)
    assert result.oom is not None and result.metrics.oom_step == result.oom.step
    assert "out of memory at step" in str(result.oom)
    assert result.metrics.peak_allocated_bytes <= 4000
    assert len(result.steps) == result.oom.step + 1

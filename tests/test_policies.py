"""Each policy's rule, option handling, and the relations between policies."""

import numpy as np
import pytest

from conftest import assert_same_run, rows_of, run
from policies import REGISTRY, get_policy, parse_policy_opts
from simkv.errors import ConfigError, PolicyError

SMALL = dict(layers=3, kv_heads=2, head_dim=16, precision="f16")


def test_registry_has_the_builtin_policies():
    assert set(REGISTRY) == {"openvino-gpu", "openvino-cpu", "openvino-npu", "fixed", "geometric", "exact", "static",
                             "stateless", "hf-dynamic", "hf-static"}
    for cls in REGISTRY.values():
        assert cls.__doc__ and cls.summary, cls.name
        assert all(f.metadata.get("help") for f in cls.options()), cls.name


def test_fixed_is_the_gpu_rule_without_stagger():
    gpu = run(**SMALL, policy="openvino-gpu", policy_options={"stagger": 1, "headroom_base": 50}, prompt=20, decode=300)
    fixed = run(**SMALL, policy="fixed", policy_options={"tokens": 50}, prompt=20, decode=300)
    assert_same_run(gpu, fixed)
    # Without stagger every layer reallocates on the same steps.
    steps = {tuple(a[0] for a in rows_of(fixed, op="alloc", tensor="k", layer=la)) for la in range(3)}
    assert steps == {(0, 51, 102, 153, 204, 255)}


def test_geometric_ratio_2_is_the_cpu_plugin():
    cpu = run(**SMALL, policy="openvino-cpu", prompt=17, decode=500)
    geo = run(**SMALL, policy="geometric", policy_options={"ratio": 2, "beam_tables": 1}, prompt=17, decode=500)
    assert_same_run(cpu, geo)


def test_geometric_rounds_up_exactly():
    pol = get_policy("geometric", {"ratio": "1.1"})
    assert pol.capacity(np.array([100, 101, 10]), np.zeros(3)).tolist() == [110, 112, 11]


def test_exact_copies_every_step_and_holds_both_caches_for_the_step():
    result = run(layers=1, kv_heads=1, head_dim=16, precision="f32", policy="exact", prompt=4, decode=3)
    assert [(a[0], a[3], a[5]) for a in rows_of(result, tensor="k")] == [
        (0, "alloc", 4),
        (1, "alloc", 5), (1, "copy", 5), (1, "free", 4),
        (2, "alloc", 6), (2, "copy", 6), (2, "free", 5),
        (3, "alloc", 7), (3, "copy", 7), (3, "free", 6),
    ]
    step = result.steps[2]
    assert step["peak"] == (5 + 6) * 2 * 64 and step["allocated"] == 6 * 2 * 64


def test_static_allocates_once():
    result = run(**SMALL, policy="static", policy_options={"max_prompt_len": 100, "min_response_len": 50,
                                                            "prefill_chunk": 64}, prompt=90, decode=30)
    allocs = rows_of(result, op="alloc")
    assert {a[0] for a in allocs} == {0} and {a[5] for a in allocs} == {128 + 50}
    assert result.metrics.bytes_copied == 0


@pytest.mark.parametrize(
    "opts, kwargs, message",
    [
        ({}, dict(prompt=2000, decode=10), "does not fit max_prompt_len=1024"),
        ({}, dict(prompt=1000, decode=500), "reaches 1500 tokens but the cache holds 1152"),
        ({"min_response_len": 5000}, dict(prompt=100, decode=10, beam=4), "beam search"),
    ],
)
def test_static_refuses_what_does_not_fit(opts, kwargs, message):
    with pytest.raises(PolicyError, match=message):
        run(**SMALL, policy="static", policy_options=opts, **kwargs)


@pytest.mark.parametrize(
    "name, opts, message",
    [
        ("nope", {}, "unknown policy 'nope'"),
        ("fixed", {"colour": "1"}, "has no option 'colour'"),
        ("fixed", {"tokens": "many"}, "not a valid int"),
        ("fixed", {"tokens": "-3"}, "tokens must be >= 0"),
        ("geometric", {"ratio": "1"}, "ratio must be > 1"),
        ("openvino-gpu", {"free_old": "later"}, "free_old must be one of"),
        ("openvino-gpu", {"first_touch": "maybe"}, "not a valid bool"),
        ("openvino-gpu", {"headroom_limit": "1.5"}, "headroom_limit must be in"),
    ],
)
def test_bad_options_are_clear_errors(name, opts, message):
    with pytest.raises(ConfigError, match=message):
        get_policy(name, opts)


def test_policy_opt_parsing():
    assert parse_policy_opts(["a=1", " b = x "]) == {"a": "1", "b": "x"}
    for bad in (["a"], ["=1"], ["a="]):
        with pytest.raises(ConfigError, match="KEY=VALUE"):
            parse_policy_opts(bad)


def test_free_timing_is_a_mechanics_option_for_every_policy():
    immediate = run(**SMALL, policy="fixed", policy_options={"free_old": "immediate"}, prompt=10, decode=200)
    deferred = run(**SMALL, policy="fixed", prompt=10, decode=200)
    assert immediate.metrics.realloc_count == deferred.metrics.realloc_count
    assert immediate.metrics.max_spike_bytes < deferred.metrics.max_spike_bytes

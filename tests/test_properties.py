"""Invariants on random scenarios (hypothesis), and fast engine = reference engine.

For any model, precision, policy (with random mechanics options), device size
and stateful workload (prefill, decode, chat turns, reset, beam fork / reorder /
select):

* the fast engine's ledger and step table equal the reference engine's, byte for byte;
* replaying the ledger balances: every free matches a live allocation, allocated
  memory never goes negative nor over the device, and what stays live at the end
  is exactly the final allocation;
* used ≤ capacity in every row; used ≤ steady ≤ allocated ≤ peak at every step;
  resident ≤ allocated; nothing is negative;
* the same scenario gives the same output.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_same_run, workloads
from simkv import build_scenario, simulate
from simkv.errors import SimkvError
from simkv.ledger import ALLOC
from simkv.memory import replay


@st.composite
def scenarios(draw):
    policy = draw(st.sampled_from(["openvino-gpu", "openvino-cpu", "fixed", "geometric", "exact", "static", "stateless"]))
    opts = {}
    if policy == "static":
        opts = {"max_prompt_len": 2048, "min_response_len": draw(st.integers(500, 4000))}
    if draw(st.booleans()):
        opts["free_old"] = draw(st.sampled_from(["immediate", "end_of_step", "next_inference"]))
    if draw(st.booleans()):
        opts["reset"] = draw(st.sampled_from(["keep", "free"]))
    if draw(st.booleans()):
        opts["first_touch"] = draw(st.booleans())
    if draw(st.integers(0, 4)) == 0:
        opts["headroom_limit"] = draw(st.sampled_from([0.5, 0.9, 1.0]))
    if draw(st.integers(0, 9)) == 0:
        opts["max_alloc_bytes"] = draw(st.integers(10_000, 2_000_000))
    if draw(st.integers(0, 4)) == 0:
        opts["beam_tables"] = draw(st.integers(0, 2))
    if policy != "openvino-cpu" and draw(st.integers(0, 4)) == 0:
        opts["past_view"] = True
    if draw(st.integers(0, 4)) == 0:
        opts["carry_padding"] = draw(st.booleans())
    if policy == "openvino-gpu" and draw(st.booleans()):
        opts["id_offset"] = draw(st.integers(0, 100))
        opts["kv_order"] = draw(st.sampled_from(["kv", "vk"]))
        opts["inference_precision"] = draw(st.sampled_from(["f16", "f32"]))
    try:
        return build_scenario(
            model=None,
            layers=draw(st.integers(1, 4)),
            kv_heads=draw(st.sampled_from([1, 2, 4])),
            head_dim=draw(st.sampled_from([16, 64])),
            precision=draw(st.sampled_from(["f32", "f16", "bf16", "u8", "u4", "i8"])),
            policy=policy,
            policy_options=opts,
            ops=draw(workloads()),
            device_memory=draw(st.sampled_from(["16GiB", "64MiB", "8MiB", "2MiB"])),
            weights_memory=draw(st.sampled_from([None, 0, 100_000, 1_500_000])),
        )
    except SimkvError:  # e.g. a workload a static cache cannot hold
        return draw(st.nothing())


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(scenarios())
def test_fast_engine_equals_reference(scenario):
    assert_same_run(simulate(scenario), simulate(scenario, engine="reference"))


@SETTINGS
@given(scenarios())
def test_memory_is_conserved(scenario):
    result = simulate(scenario)
    rows, steps = result.ledger.rows, result.steps
    live = replay(result.ledger, scenario.device_memory - scenario.weights_memory)
    assert sum(live.values()) == steps["allocated"][-1]
    assert (rows["bytes"] >= 0).all()
    allocs = rows[rows["op"] == ALLOC]
    assert (allocs["used_tokens"] <= allocs["capacity_tokens"]).all()
    for column in ("allocated", "peak", "steady", "used", "resident", "resident_peak"):
        assert (steps[column] >= 0).all(), column
    assert (steps["used"] <= steps["steady"]).all()
    assert (steps["steady"] <= steps["allocated"]).all()
    assert (steps["allocated"] <= steps["peak"]).all()
    assert (steps["resident"] <= steps["allocated"]).all()
    assert (steps["resident"] <= steps["resident_peak"]).all()
    assert (steps["peak"] <= scenario.device_memory).all()
    assert np.array_equal(steps["step"], np.arange(len(steps)))


@settings(max_examples=30, deadline=None)
@given(scenarios())
def test_deterministic(scenario):
    a, b = simulate(scenario), simulate(scenario)
    assert_same_run(a, b)
    assert a.metrics == b.metrics

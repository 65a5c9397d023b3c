"""Huge and odd inputs to the engine finish fast and bounded (issue #10, items 6-7).

* A decode run is planned in chunks (``simkv.engine``): whatever the chunk sizes, the
  fast engine still equals the reference engine byte for byte.
* A run that meets the device-memory limit stops at that step without planning the rest.
* The headroom limit walks the units once (linear in layers).
"""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

import simkv.engine as engine
from conftest import assert_same_run
from simkv import build_scenario, simulate
from test_properties import scenarios


@settings(max_examples=25, deadline=None)
@given(scenarios(), st.integers(1, 9), st.sampled_from([8, 64, 1 << 20]))
def test_chunked_plans_equal_the_reference(scenario, first, rows):
    with mock.patch.object(engine, "FIRST_PLAN_STEPS", first), mock.patch.object(engine, "PLAN_ROWS", rows):
        fast = simulate(scenario)
    assert_same_run(fast, simulate(scenario, engine="reference"))


def test_a_limit_inside_a_chunk_stops_at_its_step():
    """exact, 2 layers x 1 head x 16, f16: 2*2*16*2 = 128 B per token for K+V of all layers,
    and ``exact`` holds old and new buffers for the step: 2*128*L bytes at step L-1.
    Device 1 MiB = 1,048,576 B: 256*L > 1,048,576 first at L = 4,097 tokens (prompt 1 +
    4,096 decode steps), i.e. step 4,096. A chunk of 4,096 steps (1..4,096) holds it."""
    sc = build_scenario(model=None, layers=2, heads=1, kv_heads=1, head_dim=16, precision="f16", policy="exact",
                        prompt=1, decode=10**8, device_memory="1MiB")
    result = simulate(sc)
    assert result.oom is not None and result.oom.step == 4096
    assert len(result.steps) == 4097
    ref = simulate(build_scenario(model=None, layers=2, heads=1, kv_heads=1, head_dim=16, precision="f16",
                                  policy="exact", prompt=1, decode=5000, device_memory="1MiB"), engine="reference")
    assert_same_run(result, ref)


def test_headroom_limit_is_linear_in_units():
    """limit_headroom is given the running total: each call of running_before gets the
    bytes chosen so far (one number), so the work is one pass over the units."""
    from policies import get_policy

    policy = get_policy("openvino-gpu")
    seen = []
    caps = engine.limit_headroom(policy, 5, [10, 10, 10, 10], unit_bytes=lambda i, cap: int(cap) * 100,
                                 running_before=lambda i, chosen: seen.append(chosen) or 1000 + chosen,
                                 device_memory=1000 + 2500)
    # limit 0.9 * 3500 = 3150: unit 0: 1000 + 1000 < 3150 keeps 10; unit 1: 2000 + 1000 = 3000 keeps 10;
    # unit 2: 3000 + 1000 >= 3150 -> needed 5 (500 B); unit 3: 3500 + 1000 -> 5.
    assert seen == [0, 1000, 2000, 2500] and caps.tolist() == [10, 10, 5, 5]

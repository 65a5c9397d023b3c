"""Closed-loop load (``--concurrency C``, simkv/serving/closed_loop.py): which request is sent when, worked out by
hand from the rule (C sent at t = 0; each request that ends sends the next in order, arriving just after the step it
ended in, so it joins the step after the next one), and the fast engine equal to the step-by-step reference."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simkv.cost import Device
from simkv.errors import ConfigError
from simkv.kvspec import LayerKV
from simkv.models import ModelSpec, custom_model
from simkv.precision import get_precision
from simkv.serving import Request, ServingSpec, serve
from simkv.serving.closed_loop import ClosedLoop
from simkv.serving.sched.config import SchedulerConfig
from simkv.serving.sched.group import FINISHED, IGNORED, REJECTED

MODEL = custom_model(layers=2, heads=2, head_dim=8)
#: Sliding-window layers (W 32) and a full one: several block tables under the vLLM manager.
LAYERED = ModelSpec("sliding-full", 3, 2, 2, 8, layer_kv=(LayerKV("sliding", 2, 8, 8, 32),) * 2 + (LayerKV("full", 2, 8, 8),))
F16 = get_precision("f16")
#: Every step takes exactly 1 s: its only term that counts is the fixed overhead (every other term is below
#: 1e-20 s, under half a unit in the last place of 1.0, so 1.0 + it is 1.0 and a step's end is a whole second).
CLOCK = Device(name="clock", description="1 s per step", memory_bytes=10**12, memory_bandwidth=1e30,
               peak_flops={"f16": 1e30}, bandwidth_efficiency=1.0, flops_efficiency=1.0, step_overhead_s=1.0,
               copy_bandwidth=1e30, compute_precision="f16")
#: The device as a preset file (a serving spec names its device).
CLOCK_FILE = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
json.dump(CLOCK.to_dict(), CLOCK_FILE)
CLOCK_FILE.close()


def run(requests, concurrency, engine="fast", model=MODEL, lag=1, scheduler="continuous", warmup=0, **cfg):
    spec = ServingSpec(requests, model, F16, async_scheduling=lag == 2, scheduler=scheduler, paged=SchedulerConfig(**{"block_size": 4, "max_num_batched_tokens": 64,
                                                                      **cfg}),
                       device=CLOCK_FILE.name, device_memory=10**12, concurrency=concurrency, engine=engine, warmup=warmup)
    return serve(spec)


def test_who_is_sent_when_by_hand():
    # C = 2; prompts of 4 tokens; outputs 3, 1, 2, 2, 1 tokens. Steps take 1 s: step s runs [s, s + 1).
    #  step 0 @0: requests 0 and 1 (sent at 0) prefill, a token each; 1 (1 token) ends at 1 -> sends 2 at 1+
    #  step 1 @1: 2 arrived after the step started: not in it; 0 decodes (token 2)
    #  step 2 @2: 2 joins: its prompt and first token (ends 3); 0's last token: it ends at 3 -> sends 3 at 3+
    #  step 3 @3: 2 decodes its last token, ends at 4 -> sends 4 at 4+; 3 waits (arrived after 3)
    #  step 4 @4: 3 prefills (first token at 5); 4 waits (arrived after 4)
    #  step 5 @5: 3's last token, ends at 6; 4 prefills, its only token: ends at 6
    reqs = [Request(i, 4, g, arrival_s=0.0) for i, g in enumerate([3, 1, 2, 2, 1])]
    res = run(reqs, 2)
    rows = {r[0]: r for r in res.request_rows()}  # id, arrival_s, prompt, G, generated, status, ttft, tpot, e2e
    sent = [rows[i][1] for i in range(5)]
    assert sent == [0.0, 0.0, math.nextafter(1.0, 2.0), math.nextafter(3.0, 4.0), math.nextafter(4.0, 5.0)]
    first_token = [rows[i][1] + rows[i][6] for i in range(5)]
    assert first_token == pytest.approx([1.0, 1.0, 3.0, 5.0, 6.0], abs=1e-12)
    ended = [rows[i][1] + rows[i][8] for i in range(5)]
    assert ended == pytest.approx([3.0, 1.0, 4.0, 6.0, 6.0], abs=1e-12)
    assert all(rows[i][5] == FINISHED for i in range(5))
    assert len(res.steps) == 6 and list(res.steps["scheduled_requests"]) == [2, 1, 2, 1, 1, 2]


def test_async_scheduling_makes_the_next_request_wait_for_two_steps_in_flight():
    # The same load under vLLM's async scheduling: a request sent at t (when another ended) arrives only after the
    # step after next was scheduled, i.e. just after the end of the step that started at t; latencies count from t.
    #  step 0 @0: 0 and 1 prefill; 1 ends at 1 -> sends 2 at 1 (it arrives after step 1, at 2+)
    #  step 1 @1: 0 decodes
    #  step 2 @2: 2 arrived after the step started; 0's last token: ends at 3 -> sends 3 at 3 (arrives at 4+)
    #  step 3 @3: 2 prefills (first token at 4)
    #  step 4 @4: 2's last token, ends at 5 -> sends 4 at 5 (arrives at 6+); 3 arrived after 4: waits
    #  step 5 @5: 3 prefills (first token at 6)
    #  step 6 @6: 3's last token, ends at 7; 4 arrived after 6: waits
    #  step 7 @7: 4 prefills, its only token: ends at 8
    reqs = [Request(i, 4, g, arrival_s=0.0) for i, g in enumerate([3, 1, 2, 2, 1])]
    for engine in ("reference", "fast"):
        res = run(reqs, 2, engine, lag=2)
        rows = {r[0]: r for r in res.request_rows()}
        assert [rows[i][1] for i in range(5)] == [0.0, 0.0, 1.0, 3.0, 5.0]  # sent
        assert [rows[i][6] for i in range(5)] == pytest.approx([1.0, 1.0, 3.0, 3.0, 3.0], abs=1e-12)  # TTFT
        assert [rows[i][1] + rows[i][8] for i in range(5)] == pytest.approx([3.0, 1.0, 5.0, 7.0, 8.0], abs=1e-12)
        assert len(res.steps) == 8 and list(res.steps["scheduled_requests"]) == [2, 1, 1, 1, 1, 1, 1, 1]


def test_simultaneous_completions_send_the_next_requests_in_order_and_an_idle_engine_waits_for_them():
    # C = 3, every request 2 prompt tokens and 2 output tokens: 0, 1, 2 end together at 2 (steps 0, 1); they send
    # 3, 4, 5 at 2+ (3 for the lowest index). Nobody else is present: the engine waits for them (no step at 2) and
    # their first step starts at 2+; the same again for 6 at 4+.
    reqs = [Request(i, 2, 2, arrival_s=0.0) for i in range(7)]
    res = run(reqs, 3)
    rows = {r[0]: r for r in res.request_rows()}
    after2, after4 = math.nextafter(2.0, 3.0), math.nextafter(4.0, 5.0)
    assert [rows[i][1] for i in range(7)] == [0.0] * 3 + [after2] * 3 + [after4]
    assert [round(rows[i][6], 9) for i in range(7)] == [1.0] * 7  # each waits for no step: TTFT one step
    assert list(res.steps["time_s"]) == pytest.approx([1, 2, after2 + 1, after2 + 2, after4 + 1, after4 + 2])


def test_requests_that_end_without_finishing_send_the_next_too():
    # on_oom reject, a pool of 4 blocks of 4 tokens, C = 2: request 0 (4 + 3 tokens) and request 1 (a 20-token prompt,
    # 5 blocks: it never fits) share step 0, which fills the pool; at step 1 request 0's next token needs a block
    # there is none of: rejected, at the step's end (2); step 2 schedules nothing (request 1 alone cannot fit): every
    # present request is IGNORED (GenAI's rule), at 2. Each sent the next: request 2 at 2+, and none is left for the
    # other. Request 2 then runs alone (one step: its prompt and its only token).
    reqs = [Request(0, 4, 3, arrival_s=0.0), Request(1, 20, 1, arrival_s=0.0), Request(2, 4, 1, arrival_s=0.0)]
    res = run(reqs, 2, num_kv_blocks=4, on_oom="reject")
    rows = {r[0]: r for r in res.request_rows()}
    assert [rows[i][5] for i in range(3)] == [REJECTED, IGNORED, FINISHED]
    assert rows[2][1] == math.nextafter(2.0, 3.0) and rows[2][6] == pytest.approx(1.0)


def test_the_client_alone():
    reqs = [Request(i, 3, 2, arrival_s=5.0 * i) for i in range(4)]
    loop = ClosedLoop(reqs, 3)
    assert [r.arrival_s for r in loop.first()] == [0.0, 0.0, 0.0]  # the trace's own arrivals are not used
    [(req, tokens)] = loop.completed(1.5)
    assert (req.id, req.arrival_s, tokens) == (3, math.nextafter(1.5, 2.0), None)
    assert loop.completed(2.0) == []
    with pytest.raises(ConfigError, match="positive integer"):
        ClosedLoop(reqs, 0)
    with pytest.raises(ConfigError, match="session"):
        ClosedLoop([Request(0, 3, 2, arrival_s=0.0, session="s")], 1)


@st.composite
def loads(draw):
    n = draw(st.integers(1, 40))
    reqs = [Request(i, draw(st.integers(1, 90)), draw(st.integers(1, 40)), arrival_s=0.0) for i in range(n)]
    cfg = dict(block_size=draw(st.sampled_from([4, 16])), num_kv_blocks=draw(st.sampled_from([0, 20, 60, 400])),
               max_num_batched_tokens=draw(st.sampled_from([16, 64, 256])),
               max_num_seqs=draw(st.sampled_from([2, 8, 256])), on_oom=draw(st.sampled_from(["preempt", "wait"])),
               kv_manager=draw(st.sampled_from(["genai", "vllm"])))
    cfg["enable_prefix_caching"] = cfg["kv_manager"] == "genai" and draw(st.booleans())
    return (reqs, draw(st.integers(1, 12)), cfg, draw(st.sampled_from([MODEL, LAYERED])), draw(st.sampled_from([1, 2])),
            draw(st.integers(0, n)))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loads())
def test_fast_equals_reference_under_a_closed_loop(case):
    reqs, concurrency, cfg, model, lag, warmup = case
    ref = run(reqs, concurrency, "reference", model, lag, warmup=warmup, **cfg)
    fast = run(reqs, concurrency, "fast", model, lag, warmup=warmup, **cfg)
    assert np.array_equal(ref.steps, fast.steps)
    assert _rows(ref) == _rows(fast)
    assert ref.ledger == fast.ledger
    # the first C (no more than the warm-up's) are sent at 0, the rest later; never more than C present at a step
    rows = sorted(ref.request_rows())
    sent = sorted(r[1] for r in rows)
    c = min(concurrency, warmup or len(sent), len(sent))
    assert sent[:c] == [0.0] * c and all(t > 0 for t in sent[c:])
    assert (ref.steps["requests"] <= concurrency).all()
    if 0 < warmup < len(rows):  # the warm-up drains: no measured request is sent before the last warm-up ended
        ends = [r[1] + r[8] for r in rows[:warmup] if not math.isnan(r[8])]  # (one that ended unfinished has none)
        assert min(r[1] for r in rows[warmup:]) >= max(ends, default=0.0)  # (sent at the end: lag 2 shows t)


def _rows(result):
    return [tuple(None if isinstance(v, float) and np.isnan(v) else v for v in row) for row in result.request_rows()]


def test_planned_runs_end_where_a_request_ends(planned_runs):
    # 16 clients, 200 requests of varied lengths (a completion every ~15 steps): the fast engine plans runs, each
    # ending with the step in which a request ends (which sends the next), and equals the reference.
    rng = np.random.default_rng(3)
    reqs = [Request(i, int(rng.integers(20, 200)), int(rng.integers(100, 400)), arrival_s=0.0) for i in range(200)]
    for lag in (1, 2):
        planned_runs.clear()
        ref = run(reqs, 16, "reference", lag=lag, max_num_batched_tokens=256)
        fast = run(reqs, 16, "fast", lag=lag, max_num_batched_tokens=256)
        assert np.array_equal(ref.steps, fast.steps) and _rows(ref) == _rows(fast)
        lengths = [planned.K for planned in planned_runs]
        assert sum(lengths) > 0.5 * len(fast.steps) and max(lengths) >= 4


def test_cli_refuses_what_it_cannot_drive():
    for extra, message in ((["--concurrency", "0"], "positive integer"),
                           (["--concurrency", "2", "--replicas", "2"], "one engine"),
                           (["--concurrency", "2", "--memory", "contiguous"], "paged")):
        out = subprocess.run([sys.executable, "-m", "simkv.cli", "run", "--model", "gpt2", "--synthetic",
                              "--requests", "5", *extra], capture_output=True, text=True)
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr


@pytest.mark.parametrize("lag", [1, 2])
def test_closed_loop_under_vllms_scheduler_fast_equals_reference(lag):
    # vLLM's scheduler (--scheduler vllm) in the same engine: the closed loop sends the same requests at the same
    # times whichever path takes the steps
    rng = np.random.default_rng(4)
    reqs = [Request(i, int(rng.integers(10, 120)), int(rng.integers(5, 60)), arrival_s=0.0) for i in range(60)]
    kw = dict(scheduler="vllm", num_kv_blocks=80, max_num_batched_tokens=128, max_num_seqs=16)
    ref = run(reqs, 8, "reference", lag=lag, **kw)
    fast = run(reqs, 8, "fast", lag=lag, **kw)
    assert np.array_equal(ref.steps, fast.steps) and _rows(ref) == _rows(fast)
    assert (ref.steps["requests"] <= 8).all() and all(r[5] == FINISHED for r in ref.request_rows())


def test_a_drained_warmup_holds_the_measured_requests_until_its_last_request_ended():
    # aiperf (closed_loop docstring): C = 2, a warm-up of W = 3 requests, then 3 measured ones; prompts of 4
    # tokens, outputs 1, 2, 1, 1, 1, 1 tokens. Steps take 1 s.
    #  t = 0: the clients send 0 and 1 (min(C, W) = 2 warm-up requests)
    #  step 0 @0: 0 and 1 prefill, a token each; 0 (1 token) ends at 1 -> sends 2 (the last warm-up request) at 1+
    #  step 1 @1: 2 arrived after the step started: not in it; 1 decodes its last token, ends at 2 -> all 3
    #             warm-up requests are sent but 2 has not ended: nothing is sent (a plain closed loop would send 3)
    #  step 2 @2: 2 prefills, its only token: ends at 3, the warm-up's last -> the profiling phase sends 3 and 4
    #             together at 3+
    #  idle until 3+; step 3 @3+: 3 and 4 prefill, one token each: both end at 4+ -> 3 sends 5 at (4+)+, 4 nothing
    #  step 4: 5 prefills, ends one second later
    reqs = [Request(i, 4, g, arrival_s=0.0) for i, g in enumerate([1, 2, 1, 1, 1, 1])]
    after3 = math.nextafter(3.0, 4.0)
    after4 = math.nextafter(after3 + 1.0, math.inf)
    for engine in ("reference", "fast"):
        res = run(reqs, 2, engine, warmup=3)
        rows = {r[0]: r for r in res.request_rows()}
        assert [rows[i][1] for i in range(6)] == [0.0, 0.0, math.nextafter(1.0, 2.0), after3, after3, after4]
        assert [rows[i][6] for i in range(6)] == pytest.approx([1.0, 1.0, 2.0, 1.0, 1.0, 1.0], abs=1e-12)  # TTFT
        assert all(rows[i][5] == FINISHED for i in range(6))
        assert list(res.steps["scheduled_requests"]) == [2, 1, 1, 2, 1]
    plain = {r[0]: r for r in run(reqs, 2).request_rows()}
    assert plain[3][1] == math.nextafter(2.0, 3.0)  # without the warm-up phase, 1's end at 2 sends 3


def test_the_client_alone_with_a_warmup():
    # C = 3, W = 1: one warm-up request at t = 0; its end sends the next 3 at once; then one per completion.
    reqs = [Request(i, 3, 2, arrival_s=0.0) for i in range(6)]
    loop = ClosedLoop(reqs, 3, warmup=1)
    assert [r.id for r in loop.first()] == [0]
    assert [(r.id, r.arrival_s) for r, _ in loop.completed(2.0)] == [(1, math.nextafter(2.0, 3.0)),
                                                                    (2, math.nextafter(2.0, 3.0)),
                                                                    (3, math.nextafter(2.0, 3.0))]
    assert [r.id for r, _ in loop.completed(4.0)] == [4]
    assert [r.id for r, _ in loop.completed(4.0)] == [5]
    assert loop.completed(5.0) == []
    # W = 4 warm-up requests over C = 2 clients: ends 1 and 2 send warm-ups 2 and 3, ends 3 and 4 send nothing
    # until the 4th (the warm-up's last) sends measured 4 and 5 together
    loop = ClosedLoop(reqs, 2, warmup=4)
    assert [len(loop.completed(t)) for t in (1.0, 1.0, 2.0)] == [1, 1, 0]
    assert [r.id for r, _ in loop.completed(3.0)] == [4, 5]
    for bad in (-1, 7, True, 1.5):
        with pytest.raises(ConfigError, match="warm-up"):
            ClosedLoop(reqs, 2, warmup=bad)

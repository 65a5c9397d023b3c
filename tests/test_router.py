"""Replicas behind a router (simkv.serving.router): golden assignments worked out by hand, the incremental
engine (advance to a time, add a request mid-run) equal to a whole run, planned runs equal to the reference.

The rules (docs/research/plan-facts.md §1.4, docs/guide/serving.md "Replicas and routers"): requests are routed
in trace order at their arrival t; a replica has taken every step starting before t and the router sees the steps
that ended by t; counts are updated after each assignment (simultaneous arrivals see each other); ties go to the
lowest index.

The hand derivations lean on one bound only: llama-2-7b on the H100 preset streams its 6.28 GiB of int8 weights
every step (3.35 TB/s), so no step takes less than ~2 ms — a request generating 1,000 tokens runs for more than
2 s, at most ~500 decode steps fit in the first second, and a one-token request alone on a replica (one prompt
step) has ended long before 0.1 s. The tests check these bounds on the runs themselves.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simkv.errors import ConfigError
from simkv.models import custom_model, get_model
from simkv.precision import get_precision
from simkv.scenario import resolve_weights_memory
from simkv.serving import Request, ServingSpec, serve
from simkv.serving.run import REQUEST_COLUMNS, ReplicasResult
from simkv.serving.sched.config import SchedulerConfig
from simkv.serving.sched.group import FINISHED

LLAMA = get_model("llama-2-7b")
U8 = get_precision("u8")


def spec(requests, replicas, router, **kw):
    return ServingSpec(list(requests), LLAMA, U8, device="h100-sxm", weights_bytes=resolve_weights_memory(LLAMA, None, None),
                       max_context=0, replicas=replicas, router=router, **kw)


def req(i, t, P, G, **kw):
    return Request(i, P, G, arrival_s=t, **kw)


#: Trace A (3 replicas). Four requests at t=0, three at t=1.0 s.
#:   0: P=3200 G=1000 (100 blocks of 32 tokens; runs > 2 s)     1: P=32 G=1 (one prompt step: ends within ms)
#:   2: P=640  G=1000 (20 blocks; runs > 2 s)                   3: P=32 G=1000 (runs > 2 s)
#:   4, 5, 6: P=32 G=1 at t=1.0
TRACE_A = [req(0, 0.0, 3200, 1000), req(1, 0.0, 32, 1), req(2, 0.0, 640, 1000), req(3, 0.0, 32, 1000),
           req(4, 1.0, 32, 1), req(5, 1.0, 32, 1), req(6, 1.0, 32, 1)]


def check_bounds_a(res):
    """The bounds the derivations of trace A use, read off the run."""
    t = {int(i): (s, e) for i, s, e in zip(res.request_table["id"], res.request_table["arrival_s"],
                                          res.request_table["e2e_s"])}
    assert t[1][1] < 0.1  # request 1 ended long before t=1.0
    for i in (0, 2, 3):
        assert t[i][1] > 2.0  # the long requests still run at t=1.0


def test_round_robin_trace_a():
    # k-th request to k mod 3, whatever the state: 0 1 2 0 1 2 0
    res = serve(spec(TRACE_A, 3, "round-robin"))
    assert res.assignment.tolist() == [0, 1, 2, 0, 1, 2, 0]
    check_bounds_a(res)


def test_least_outstanding_trace_a():
    # t=0, outstanding (queued + running) starts [0,0,0], updated after each assignment:
    #   req 0 -> r0 (tie, lowest) [1,0,0]; req 1 -> r1 [1,1,0]; req 2 -> r2 [1,1,1]; req 3 -> r0 (tie) [2,1,1]
    # t=1.0: request 1 ended (one step of ms), 0, 2, 3 still run: [2,0,1]
    #   req 4 -> r1 [2,1,1]; req 5 -> r1 (tie r1/r2: lowest) [2,2,1]; req 6 -> r2 [2,2,2]
    res = serve(spec(TRACE_A, 3, "least-outstanding"))
    assert res.assignment.tolist() == [0, 1, 2, 0, 1, 1, 2]
    check_bounds_a(res)


def test_least_outstanding_two_replicas_trace_a():
    # t=0: req 0 -> r0 [1,0]; req 1 -> r1 [1,1]; req 2 -> r0 (tie) [2,1]; req 3 -> r1 [2,2]
    # t=1.0: request 1 (on r1) ended: [2,1]; req 4 -> r1 [2,2]; req 5 -> r0 (tie) [3,2]; req 6 -> r1 [3,3]
    res = serve(spec(TRACE_A, 2, "least-outstanding"))
    assert res.assignment.tolist() == [0, 1, 0, 1, 1, 0, 1]


def test_least_kv_trace_a():
    # KV in blocks of 32 tokens (every block the same bytes). t=0: no step has ended, so each replica counts the
    # prompt blocks of the requests sent to it (the optimistic increment): [0,0,0]
    #   req 0 (100 blocks) -> r0 [100,0,0]; req 1 (1) -> r1 (tie r1/r2) [100,1,0]; req 2 (20) -> r2 [100,1,20];
    #   req 3 (1) -> r1 [100,2,20]
    # t=1.0: the last step each replica finished reports: r0 >= 100 blocks (request 0), r2 >= 21 (request 2's
    # 640 tokens and its first answer token), r1 <= 17 (request 1 freed; request 3's 32 + at most 500 tokens).
    #   req 4 (1 block) -> r1 (<= 18); req 5 -> r1 (<= 19 < 21); req 6 -> r1 (<= 20 < 21)
    res = serve(spec(TRACE_A, 3, "least-kv"))
    assert res.assignment.tolist() == [0, 1, 2, 1, 1, 1, 1]
    check_bounds_a(res)
    r1 = res.replicas[1].steps
    before = r1[r1["time_s"] <= 1.0]
    assert before["blocks_used"][-1] <= 17  # the bound used above


def test_session_sticky_trace():
    # 3 replicas; first turns placed by least-outstanding, then pinned (session, else prefix).
    #   t=0: req 0 (session a) -> r0 [1,0,0], pins a; req 1 (session b, G=1) -> r1 [1,1,0], pins b;
    #        req 2 (prefix sys) -> r2 [1,1,1], pins sys; req 3 (no key) -> r0 (tie) [2,1,1]
    #   t=1.0 (request 1 ended: [2,0,1]): req 4 (session a, 2nd turn) -> r0, pinned, though r0 has the most;
    #        req 5 (prefix sys) -> r2; req 6 (new session c, prefix sys) -> r2 through its prefix, pins c;
    #        req 7 (no key) -> least-outstanding [3,0,3] -> r1
    trace = [req(0, 0.0, 32, 1000, session="a"), req(1, 0.0, 32, 1, session="b"),
             req(2, 0.0, 32, 1000, prefix_id="sys", prefix_tokens=16), req(3, 0.0, 32, 1000),
             req(4, 1.0, 32, 8, session="a"), req(5, 1.0, 32, 8, prefix_id="sys", prefix_tokens=16),
             req(6, 1.0, 32, 8, session="c", prefix_id="sys", prefix_tokens=16), req(7, 1.0, 32, 1)]
    res = serve(spec(trace, 3, "session"))
    assert res.assignment.tolist() == [0, 1, 2, 0, 0, 2, 2, 1]
    # the second turn of session a carries its history wherever it runs: 32 + 1000 + 32 tokens
    assert res.request_table["prompt"][4] == 1064


def test_session_keeps_prefix_cache_hits():
    # With prefix caching, requests sharing a system prompt hit it when the session router keeps them together,
    # and round-robin spreads them so that the second of each pair misses: 4 requests with a 64-token prefix,
    # arriving 1 s apart (each ended before the next), 2 replicas.
    trace = [req(i, float(i), 96, 4, prefix_id="sys", prefix_tokens=64) for i in range(4)]
    cfg = SchedulerConfig(enable_prefix_caching=True)
    sticky = serve(spec(trace, 2, "session", paged=cfg))
    rr = serve(spec(trace, 2, "round-robin", paged=cfg))
    assert sticky.assignment.tolist() == [0, 0, 0, 0] and rr.assignment.tolist() == [0, 1, 0, 1]
    # 64 tokens = 2 full blocks hit, for every request after the first on its replica
    assert sticky.request_table["prefix_hit_tokens"].tolist() == [0, 64, 64, 64]
    assert rr.request_table["prefix_hit_tokens"].tolist() == [0, 0, 64, 64]


def test_a_step_in_flight_is_not_seen():
    # 2 replicas, least-outstanding. t=0: req 0 (G=1) -> r0; req 1 -> r1; req 2 -> r0 (tie) => [2,1].
    # t=0.0001 s: r0's first step (which ends request 0) is still running (>= 2 ms): [2,1] -> req 3 to r1.
    #   (Seeing the step before it ends would make it [1,1] and send req 3 to r0.)
    # t=0.1 s: that step ended: [1,2] -> req 4 to r0.
    trace = [req(0, 0.0, 32, 1), req(1, 0.0, 32, 1000), req(2, 0.0, 32, 1000), req(3, 0.0001, 32, 1000),
             req(4, 0.1, 32, 1)]
    res = serve(spec(trace, 2, "least-outstanding"))
    assert res.assignment.tolist() == [0, 1, 0, 1, 0]
    assert 0.0001 < res.request_table["e2e_s"][0] < 0.1


def test_one_replica_is_todays_run():
    from simkv.serving.run import _serve_replicas, check_spec

    from simkv.serving import load_trace
    from simkv.lab.traces import AZURE_CONV

    reqs = load_trace(AZURE_CONV, limit=300)
    one = serve(spec(reqs, 1, "least-kv"))
    assert not isinstance(one, ReplicasResult)
    for router in ("round-robin", "least-kv"):  # the router's path with one replica: the same run
        sp = spec(reqs, 1, router)
        via = _serve_replicas(sp, check_spec(sp), None)
        assert via.assignment.tolist() == [0] * 300
        r = via.replicas[0]
        assert np.array_equal(r.steps, one.steps) and r.ledger == one.ledger
        assert r.request_rows() == one.request_rows()
        assert via.metrics["ttft_p99_s"] == one.metrics["ttft_p99_s"]


def test_bad_input_one_line():
    for kw, msg in ((dict(replicas=0), "--replicas must be in"), (dict(replicas=2, router="random"), "unknown router")):
        with pytest.raises(ConfigError, match=msg):
            serve(spec(TRACE_A, kw.get("replicas"), kw.get("router", "session")))
    steps = [Request(i, 8, 2, arrival_step=i) for i in range(3)]
    with pytest.raises(ConfigError, match="arrivals in seconds"):
        serve(spec(steps, 2, "round-robin"))


def test_cli_replicas_outputs(tmp_path, capsys):
    import json

    from simkv.cli import main
    from simkv.serving import write_trace

    trace = tmp_path / "t.csv"
    write_trace(TRACE_A, trace)
    args = ["run", "--trace", str(trace), "--model", "llama-2-7b", "--device", "h100-sxm", "--max-context", "0",
            "--replicas", "3", "--router", "least-outstanding"]
    assert main(args + ["--json", "--steps", str(tmp_path / "s.csv"), "--requests", str(tmp_path / "r.csv")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests_finished"] == 7 and out["scenario"]["router"] == "least-outstanding"
    assert [r["requests_total"] for r in out["replicas"]] == [2, 3, 2]
    req_lines = (tmp_path / "r.csv").read_text().splitlines()
    assert req_lines[0].split(",") == list(REQUEST_COLUMNS) + ["replica"]
    assert [line.split(",")[-1] for line in req_lines[1:]] == ["0", "1", "2", "0", "1", "1", "2"]
    step_lines = (tmp_path / "s.csv").read_text().splitlines()
    assert step_lines[0].endswith(",replica") and {line.rsplit(",", 1)[1] for line in step_lines[1:]} == {"0", "1", "2"}
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "3 replicas, router least-outstanding" in text and "replica  requests" in text
    assert main(args + ["--ledger", str(tmp_path / "l.csv")]) == 2
    assert "--ledger applies to one device (no --replicas above 1), not replicas" in capsys.readouterr().err


# -- properties: conservation, each replica = its share run alone, planned = reference ------------------

TINY = custom_model(layers=2, heads=2, head_dim=8)
F16 = get_precision("f16")


@st.composite
def routed(draw):
    n = draw(st.integers(1, 12))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.0002, 0.0007, 0.004, 0.02]))
        key = draw(st.sampled_from([None, None, "a", "b"]))
        prefix = draw(st.booleans())
        P = draw(st.integers(1, 90))
        reqs.append(Request(i, P, draw(st.integers(1, 50)), arrival_s=t, session=key,
                            samples=draw(st.sampled_from([1, 1, 1, 2])), prefix_id="sys" if prefix else None,
                            prefix_tokens=min(P, 9) if prefix else 0))
    memory = draw(st.sampled_from(["paged", "paged", "contiguous"]))
    cfg = dict(block_size=draw(st.sampled_from([4, 8, 32])), num_kv_blocks=draw(st.sampled_from([0, 6, 12, 400])),
               max_num_batched_tokens=draw(st.sampled_from([16, 64, 256])), on_oom=draw(st.sampled_from(["preempt", "wait"])),
               enable_prefix_caching=draw(st.booleans()))
    if memory == "contiguous":
        cfg["num_kv_blocks"] = 0
        cfg["enable_prefix_caching"] = False
    return reqs, draw(st.integers(1, 3)), draw(st.sampled_from(["round-robin", "least-outstanding", "least-kv",
                                                                  "session"])), memory, cfg


def tiny_spec(reqs, replicas, router, memory, cfg, engine="fast"):
    return ServingSpec(list(reqs), TINY, F16, memory=memory, paged=SchedulerConfig(**cfg), device="xeon-8480",
                       device_memory=10**9 if memory == "paged" else 2 * 10**5, block_bytes=1000 if memory == "paged"
                       else None, policy="openvino-cpu", replicas=replicas, router=router, engine=engine, max_context=0)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(routed())
def test_replicas_conserve_and_equal_their_share_alone(case):
    from simkv.serving.engine.core import session_prompts

    reqs, n, router, memory, cfg = case
    res = serve(tiny_spec(reqs, n, router, memory, cfg))
    if n == 1:
        return
    assert sorted(res.request_table["id"].tolist()) == [r.id for r in reqs]  # every request exactly once
    assert res.metrics["requests_finished"] == sum(r.metrics["requests_finished"] for r in res.replicas)
    assert sum(len(r.spec.requests) for r in res.replicas) == len(reqs)
    prompts = dict(zip([r.id for r in reqs], session_prompts(reqs)))
    for k, rep in enumerate(res.replicas):
        assert [r.id for r in rep.spec.requests] == [r.id for r, w in zip(reqs, res.assignment) if w == k]
        # each replica's ledger is conserved: paged, it leaves exactly the final pool allocated; contiguous,
        # every request's buffers are freed when it ends
        rows = rep.ledger.rows
        if len(rep.steps):
            net = int(rows["bytes"][rows["op"] == 0].sum() - rows["bytes"][rows["op"] == 2].sum())
            assert net == (rep.steps["blocks_total"][-1] * 1000 if memory == "paged" else 0)
        # the replica equals its share served alone (its prompts: the sessions' histories of the whole trace)
        # (with prefix caching a turn's token ids hold its session's earlier answers: not a request of its own)
        share = [replace(r, session=None, prompt=prompts[r.id]) for r in rep.spec.requests]
        if share and not (cfg["enable_prefix_caching"] and any(r.session for r in reqs)):
            alone = serve(tiny_spec(share, 1, router, memory, cfg))
            assert np.array_equal(alone.steps, rep.steps) and alone.ledger == rep.ledger
            assert repr([row[1:] for row in alone.request_rows()]) == repr([row[1:] for row in rep.request_rows()])
    if memory == "paged":  # planned runs = the step-by-step reference, routing included
        ref = serve(tiny_spec(reqs, n, router, memory, cfg, engine="reference"))
        assert ref.assignment.tolist() == res.assignment.tolist()
        for a, b in zip(ref.replicas, res.replicas):
            assert np.array_equal(a.steps, b.steps) and a.ledger == b.ledger


def test_fast_equals_reference_on_a_trace_slice_with_replicas():
    from simkv.lab.traces import AZURE_CONV
    from simkv.serving import load_trace

    reqs = load_trace(AZURE_CONV, limit=150)
    for router in ("least-outstanding", "least-kv"):
        a, b = serve(spec(reqs, 3, router)), serve(spec(reqs, 3, router, engine="reference"))
        assert a.assignment.tolist() == b.assignment.tolist()
        assert all(np.array_equal(x.steps, y.steps) and x.ledger == y.ledger for x, y in zip(a.replicas, b.replicas))
        assert a.metrics["requests_finished"] == 150

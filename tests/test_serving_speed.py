"""Planned runs in the regimes the serving bench measures (experiments/bench_serving.py) equal the step-by-step
reference: an overloaded fixed pool (a long queue no step reaches), prefix caching, a small pool that preempts.
Each case compares the step tables, the ledgers and every request's outcome, and checks that the fast path did
plan runs there (else the comparison would prove nothing)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simkv.cost import get_device
from simkv.models import custom_model
from simkv.precision import get_precision
from simkv.serving import Request
from simkv.serving.engine.core import PagedServing
from simkv.serving.sched.config import SchedulerConfig

MODEL = custom_model(layers=2, heads=2, head_dim=8)
PREC = get_precision("f16")
DEVICE = get_device("xeon-8480")
FIELDS = ("status", "P", "G", "processed", "maxc", "generated", "preemptions", "prefix_hit", "first_token_s",
          "finish_s", "added_s", "added_step", "first_token_step", "finish_step")


def served(requests, fast, **cfg):
    eng = PagedServing(list(requests), MODEL, PREC, SchedulerConfig(**cfg), device=DEVICE, weights_bytes=0,
                       device_memory=10**12, block_bytes=1000, stall_steps=400)
    groups, steps, _, _ = eng.run(fast=fast)
    return eng, groups, steps


def same(requests, **cfg):
    """Planned runs = the reference; returns the fast engine (to check that it planned runs)."""
    a, ga, sa = served(requests, False, **cfg)
    b, gb, sb = served(requests, True, **cfg)
    assert np.array_equal(sa, sb)
    assert a.ledger == b.ledger
    assert [tuple(getattr(g, f) for f in FIELDS) for g in ga] == [tuple(getattr(g, f) for f in FIELDS) for g in gb]
    assert a.pool.touched == b.pool.touched and a.pool.total == b.pool.total
    # the pool itself: free list, references, the prefix cache (hashes, stamps, the store, its eviction order)
    pa, pb = a.pool, b.pool
    assert list(pa.free) == list(pb.free) and pa.ref == pb.ref and pa.hash_of == pb.hash_of
    if pa.prefix_caching:  # (stamps only order the store's evictions: kept with prefix caching only)
        assert pa.stamp == pb.stamp and pa.clock == pb.clock
    assert pa.cached == pb.cached and pa.stored == pb.stored
    assert sorted(e for e in pa.lru if pa.stored.get(e[2]) == e[1] and pa.stamp[e[1]] == e[0]) == \
        sorted(e for e in pb.lru if pb.stored.get(e[2]) == e[1] and pb.stamp[e[1]] == e[0])
    assert [(g.tables, g.seq_tokens) for g in ga] == [(g.tables, g.seq_tokens) for g in gb]
    return b


def planned_steps(eng) -> int:
    return len(eng.finish()[1]) - eng.slow_steps


def test_overloaded_fixed_pool_queue_without_rows(planned_runs):
    # 400 requests arrive far faster than they are served: the queue grows to hundreds, most of it untouched,
    # and planned runs carry that tail without a row per request (planned_run._present)
    rng = np.random.default_rng(5)
    t, reqs = 0.0, []
    for i in range(400):
        t += float(rng.exponential(0.0004))
        reqs.append(Request(i, int(rng.integers(1, 120)), int(rng.integers(1, 60)), arrival_s=t))
    eng = same(reqs, block_size=8, num_kv_blocks=300, max_num_batched_tokens=64)
    assert planned_steps(eng) > 0.8 * len(eng.finish()[1])
    assert max(run.passive for run in planned_runs) > 100


@st.composite
def queued(draw):
    """Bursts of arrivals in seconds onto fixed pools of every size (from preempting every step to ample)."""
    n = draw(st.integers(5, 60))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.0001, 0.0005, 0.003, 0.05]))
        reqs.append(Request(i, draw(st.integers(1, 100)), draw(st.integers(1, 40)), arrival_s=t,
                            samples=draw(st.sampled_from([1] * 9 + [2]))))
    cfg = dict(block_size=draw(st.sampled_from([4, 8, 16])), num_kv_blocks=draw(st.sampled_from([12, 30, 80, 400])),
               max_num_batched_tokens=draw(st.sampled_from([16, 32, 64])),
               on_oom=draw(st.sampled_from(["preempt", "preempt", "wait"])))
    return reqs, cfg


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queued())
def test_fast_equals_reference_with_queues(case):
    reqs, cfg = case
    same(reqs, **cfg)


def test_prefix_caching_plans_runs_and_keeps_the_cache():
    # unique prompts (the conversation trace's case: every request alone in its family) on a fixed pool small
    # enough that the overwritable store's blocks are overwritten, with a shared system prompt and a session
    # among them (whose requests the reference takes step by step)
    rng = np.random.default_rng(11)
    t, reqs = 0.0, []
    for i in range(150):
        t += float(rng.exponential(0.004))
        kw = {}
        if i % 40 == 3:
            kw = dict(prefix_id="sys", prefix_tokens=20)
        elif i % 50 == 7:
            kw = dict(session=f"s{i % 2}")
        reqs.append(Request(i, int(rng.integers(21, 90)), int(rng.integers(1, 70)), arrival_s=t, **kw))
    for blocks in (0, 60, 400):
        eng = same(reqs, block_size=8, num_kv_blocks=blocks, max_num_batched_tokens=64, enable_prefix_caching=True)
        assert planned_steps(eng) > 0.3 * len(eng.finish()[1])
    assert eng.pool.stored  # finished requests' blocks stay restorable


@st.composite
def prefix_workloads(draw):
    n = draw(st.integers(2, 30))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0002, 0.001, 0.004, 0.02]))
        P = draw(st.integers(1, 80))
        kind = draw(st.sampled_from(["own"] * 6 + ["prefix", "session", "ids", "samples"]))
        kw = {}
        if kind == "prefix":
            kw = dict(prefix_id=draw(st.sampled_from(["a", "b"])), prefix_tokens=min(P, draw(st.integers(1, 20))))
        elif kind == "session":
            kw = dict(session=draw(st.sampled_from(["s", "u"])))
        elif kind == "ids":
            kw = dict(token_ids=tuple(draw(st.integers(0, 3)) for _ in range(P)))
        elif kind == "samples":
            kw = dict(samples=2)
        reqs.append(Request(i, P, draw(st.integers(1, 40)), arrival_s=t, **kw))
    cfg = dict(block_size=draw(st.sampled_from([4, 8, 16])), num_kv_blocks=draw(st.sampled_from([0, 10, 25, 60, 300])),
               max_num_batched_tokens=draw(st.sampled_from([16, 32, 64])), enable_prefix_caching=True,
               on_oom=draw(st.sampled_from(["preempt", "wait"])))
    return reqs, cfg


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix_workloads())
def test_fast_equals_reference_with_prefix_caching(case):
    reqs, cfg = case
    same(reqs, **cfg)


def squeezes(monkeypatch) -> list:
    """Record the squeezed runs an engine carries out: (steps, preemptions)."""
    from simkv.serving.engine import squeezed

    seen = []
    original = squeezed.run

    def spy(eng, live, pending):
        out = original(eng, live, pending)
        if out is not None:
            seen.append((out[0]["_n"], int(out[0]["preemptions"].sum())))
        return out

    monkeypatch.setattr(squeezed, "run", spy)
    return seen


def small_pool_trace(n=300, seed=2, gap=0.002):
    rng = np.random.default_rng(seed)
    t, reqs = 0.0, []
    for i in range(n):
        t += float(rng.exponential(gap))
        reqs.append(Request(i, int(rng.integers(1, 150)), int(rng.integers(1, 80)), arrival_s=t))
    return reqs


def test_small_pool_squeezed_runs_take_the_preemptions(monkeypatch):
    # a pool of 40 blocks of 8 tokens under a queue: decoders keep taking the tail prompt's last block
    seen = squeezes(monkeypatch)
    eng = same(small_pool_trace(), block_size=8, num_kv_blocks=40, max_num_batched_tokens=64)
    steps = eng.finish()[1]
    assert steps["preemptions"].sum() > 200
    assert sum(n for n, _ in seen) > 0.8 * len(steps)
    assert sum(p for _, p in seen) > 0.7 * steps["preemptions"].sum()


def test_small_pool_with_a_preemption_bound():
    # the run stops after the step that passes max_preemptions, inside a squeezed run or not
    reqs = small_pool_trace(200)
    out = []
    for fast in (False, True):
        eng = PagedServing(list(reqs), MODEL, PREC, SchedulerConfig(block_size=8, num_kv_blocks=40,
                                                                    max_num_batched_tokens=64),
                           device=DEVICE, weights_bytes=0, device_memory=10**12, block_bytes=1000, max_preemptions=57)
        groups, steps, _, _ = eng.run(fast=fast)
        out.append((steps, eng.ledger, [tuple(getattr(g, f) for f in FIELDS) for g in groups], eng.stopped))
    (sa, la, ga, ea), (sb, lb, gb, eb) = out
    assert np.array_equal(sa, sb) and la == lb and ga == gb and ea == eb and ea is not None


@st.composite
def routed_small(draw):
    n = draw(st.integers(4, 40))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0001, 0.0005, 0.002, 0.01]))
        reqs.append(Request(i, draw(st.integers(1, 100)), draw(st.integers(1, 50)), arrival_s=t))
    cfg = dict(block_size=draw(st.sampled_from([4, 8])), num_kv_blocks=draw(st.sampled_from([10, 20, 40])),
               max_num_batched_tokens=draw(st.sampled_from([16, 32, 64])))
    return reqs, draw(st.integers(2, 3)), draw(st.sampled_from(["least-outstanding", "least-kv"])), cfg


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(routed_small())
def test_fast_equals_reference_with_replicas_on_small_pools(case):
    # the routers read the replicas in lockstep: squeezed runs stop before a step starting at the next arrival
    from simkv.serving import ServingSpec, serve

    reqs, n, router, cfg = case

    def spec(engine):
        return ServingSpec(list(reqs), MODEL, PREC, paged=SchedulerConfig(**cfg), device="xeon-8480",
                           device_memory=10**9, block_bytes=1000, replicas=n, router=router, engine=engine,
                           max_context=0)

    a, b = serve(spec("reference")), serve(spec("fast"))
    assert a.assignment.tolist() == b.assignment.tolist()
    for x, y in zip(a.replicas, b.replicas):
        assert np.array_equal(x.steps, y.steps) and x.ledger == y.ledger
        assert repr(x.request_rows()) == repr(y.request_rows())


def test_planned_runs_stop_at_the_step_limit():
    # the reference stops after max_steps steps: a planned or squeezed run must not go past it
    reqs = small_pool_trace(60)
    for blocks in (40, 400):
        out = []
        for fast in (False, True):
            eng = PagedServing(list(reqs), MODEL, PREC, SchedulerConfig(block_size=8, num_kv_blocks=blocks,
                                                                        max_num_batched_tokens=64),
                               device=DEVICE, weights_bytes=0, device_memory=10**12, block_bytes=1000, max_steps=200)
            groups, steps, _, _ = eng.run(fast=fast)
            out.append((steps, eng.ledger, [tuple(getattr(g, f) for f in FIELDS) for g in groups], eng.stopped))
        (sa, la, ga, ea), (sb, lb, gb, eb) = out
        assert len(sa) == 200 and np.array_equal(sa, sb) and la == lb and ga == gb and ea == eb


def test_long_runs_keep_their_step_table_in_blocks(monkeypatch):
    # every SOLID_STEPS steps the rows become one block of the step table and their costs are checked: the same
    # table, ledger and requests (a router reads the blocks like planned runs), the table built block by block
    from simkv.serving import ServingSpec, serve
    from simkv.serving.engine import core as engine

    reqs = small_pool_trace(120)
    cfg = dict(block_size=8, num_kv_blocks=40, max_num_batched_tokens=64)
    whole = [served(reqs, fast, **cfg) for fast in (False, True)]
    monkeypatch.setattr(engine, "SOLID_STEPS", 50)
    for fast, (eng0, groups0, steps0) in zip((False, True), whole):
        eng, groups, steps = served(reqs, fast, **cfg)
        assert np.array_equal(steps, steps0) and eng.ledger == eng0.ledger
        assert [tuple(getattr(g, f) for f in FIELDS) for g in groups] == \
            [tuple(getattr(g, f) for f in FIELDS) for g in groups0]
        assert len(eng.rows) == 1 and eng.rows[0] is steps  # the blocks, copied into the table
        assert np.array_equal(eng.finish()[3], eng0.finish()[3])  # step_cost's seconds, checked block by block
        assert np.allclose(eng.finish()[3], steps["step_s"], rtol=1e-9)

    def spec(engine_kind):
        return ServingSpec(list(reqs), MODEL, PREC, paged=SchedulerConfig(**cfg), device="xeon-8480",
                           device_memory=10**9, block_bytes=1000, replicas=2, router="least-kv", engine=engine_kind,
                           max_context=0)

    a, b = serve(spec("reference")), serve(spec("fast"))
    assert a.assignment.tolist() == b.assignment.tolist()
    assert all(np.array_equal(x.steps, y.steps) and x.ledger == y.ledger for x, y in zip(a.replicas, b.replicas))

"""``--scheduler vllm`` in the serving engine: the engine's steps are simkv's vLLM scheduler's steps (itself step-exact
against the real vLLM: tests/test_vllm_scheduler.py, tests/test_vllm_real.py), the reference path is the one taken,
and ``simkv run --scheduler vllm`` end to end."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simkv.cost import get_device
from simkv.errors import ConfigError
from simkv.hfconfig import resolve_model
from simkv.precision import get_precision
from simkv.serving.engine.core import PagedServing, prompt_token_ids, takes_fast_paths
from simkv.serving.kv.groups import paged_kv
from simkv.serving.requests import Request
from simkv.serving.sched.config import SchedulerConfig
from simkv.serving.sched.vllm import (UNBOUNDED_MODEL_LEN, VllmSettings, batch_defaults, group_specs,
                                      num_gpu_blocks, simulate_steps)

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "simkv" / "data" / "configs" / "tiny"
GIB = 1024**3


def workload(seed: int, n: int = 30, prefix: bool = False) -> list[Request]:
    rng = random.Random(seed)
    reqs, step = [], 0
    for i in range(n):
        step += rng.randint(0, 3)
        kw = {"prefix_id": f"p{rng.randint(0, 2)}", "prefix_tokens": 32} if prefix else {}
        reqs.append(Request(i, rng.randint(33 if prefix else 1, 120), rng.randint(1, 40), arrival_step=step, **kw))
    return reqs


def engine(model, reqs, blocks: int, prefix: bool = False, **kw) -> PagedServing:
    kw = {"max_num_batched_tokens": 64, "max_num_seqs": 8, **kw}
    cfg = SchedulerConfig(block_size=16, num_kv_blocks=blocks, enable_prefix_caching=prefix, scheduler="vllm", **kw)
    return PagedServing(reqs, model, get_precision("f16"), cfg, device=get_device("h100-sxm"),
                        weights_bytes=0, device_memory=80 * GIB)


@pytest.mark.parametrize("shape,blocks,prefix", [("uniform", 14, False), ("uniform", 14, True),
                                                 ("gemma3", 40, False), ("gemma3", 40, True),
                                                 ("llama4", 24, True), ("qwen3_next", 12, False),
                                                 ("qwen3_next", 16, True)])
def test_engine_steps_are_the_vllm_schedulers(shape, blocks, prefix):
    """Every step of the engine under ``--scheduler vllm`` is the step :func:`simulate_steps` takes on the same
    workload (tokens scheduled, preemptions, blocks in use after scheduling), tight pools with preemptions included:
    the engine adds nothing to vLLM's rules and drops nothing."""
    model = (resolve_model("custom", layers=2, heads=4, kv_heads=2, head_dim=16) if shape == "uniform"
             else resolve_model(str(TINY / f"{shape}.json")))
    reqs = workload(7, prefix=prefix)
    eng = engine(model, reqs, blocks, prefix)
    groups, steps, _, _ = eng.run(fast=False)
    kv = paged_kv(model, get_precision("f16"), 16, "vllm", prefix_caching=prefix)
    settings = VllmSettings(num_blocks=blocks, block_size=kv.block_size, max_num_batched_tokens=64, max_num_seqs=8,
                            max_model_len=UNBOUNDED_MODEL_LEN, enable_prefix_caching=prefix)
    tokens = prompt_token_ids(reqs) if prefix else [range(r.prompt) for r in reqs]
    ref = simulate_steps(group_specs(kv, UNBOUNDED_MODEL_LEN, prefix), settings, reqs, tokens)
    assert len(steps) == len(ref)
    assert list(steps["scheduled_tokens"]) == [sum(s["scheduled"].values()) for s in ref]
    assert list(steps["preemptions"]) == [len(s["preempted"]) for s in ref]
    assert list(steps["blocks_used"]) == [blocks - 1 - s["free_after_schedule"] for s in ref]
    assert all(g.status == "FINISHED" for g in groups)
    assert sum(steps["preemptions"]) > 0 or shape in ("gemma3", "llama4")  # the tight pools preempt (windows free)
    assert (steps["used_bytes"] <= steps["allocated_bytes"]).all()


def test_vllm_fast_paths_only_where_planned_runs_model_the_rules():
    """core.takes_fast_paths: vLLM's planned runs cover full-attention and MLA groups, prefix caching on or off
    (:mod:`simkv.serving.engine.vllm_run`); a sliding group takes every step the reference way, fast or not, and
    the result is the reference's."""
    uniform = resolve_model("custom", layers=2, heads=4, kv_heads=2, head_dim=16)
    assert takes_fast_paths(engine(uniform, workload(3), 14).sched)
    assert takes_fast_paths(engine(uniform, workload(3, prefix=True), 14, True).sched)
    gemma = resolve_model(str(TINY / "gemma3.json"))
    fast, ref = engine(gemma, workload(3), 40), engine(gemma, workload(3), 40)
    assert not takes_fast_paths(fast.sched)
    a, b = fast.run(fast=True), ref.run(fast=False)
    assert a[1].tobytes() == b[1].tobytes() and list(a[3]) == list(b[3])
    assert fast.slow_steps == len(a[1])
    assert not takes_fast_paths(engine(gemma, workload(3, prefix=True), 40, True).sched)  # prefix hits in a window


def test_vllm_pool_from_gpu_memory_utilization():
    """``num_gpu_blocks``: (0.9 × 80 GiB − 16 GiB weights − 1 GiB activations) // 2 MiB = 55 GiB / 2 MiB = 28,160;
    one byte less of room, 28,159."""
    assert num_gpu_blocks(2 * 1024**2, 80 * GIB, 16 * GIB, GIB, 0.9) == 28_160
    assert num_gpu_blocks(2 * 1024**2, 80 * GIB, 16 * GIB, GIB + 1, 0.9) == 28_159
    with pytest.raises(ConfigError):
        num_gpu_blocks(2 * 1024**2, 80 * GIB, 80 * GIB, GIB, 0.9)
    assert batch_defaults("h100-sxm", 80 * 10**9) == (8192, 1024)
    assert batch_defaults("a100-80gb", 80 * GIB) == (2048, 256)
    assert batch_defaults("h200", 141 * 10**9) == (8192, 1024)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simkv.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_cli_run_scheduler_vllm_azure_conv():
    """``simkv run --trace azure-conv --limit 200 --device h100-sxm --scheduler vllm``: vLLM's defaults (block 16,
    8192 tokens / 1024 sequences on an H100, f16 KV), every request finished; a tight pool preempts, and the fast
    engine's JSON is byte-identical to the reference engine's."""
    p = cli("run", "--trace", "azure-conv", "--limit", "200", "--device", "h100-sxm", "--scheduler", "vllm")
    assert p.returncode == 0, p.stderr
    assert "f16 KV; vllm scheduler; paged, block 16, pool of gpu_memory_utilization 0.9" in p.stdout
    assert "200: 200 finished" in p.stdout
    base = ["run", "--trace", "azure-conv", "--limit", "200", "--device", "h100-sxm", "--scheduler", "vllm",
            "--num-kv-blocks", "400", "--json"]
    fast, ref = cli(*base), cli(*base, "--engine", "reference")
    assert fast.returncode == 0 and ref.returncode == 0, fast.stderr + ref.stderr
    assert fast.stdout == ref.stdout
    out = json.loads(fast.stdout)
    assert out["preemptions"] > 0 and out["requests_finished"] == 200
    paged = out["scenario"]["paged"]
    assert paged["scheduler"] == "vllm" and paged["max_num_batched_tokens"] == 8192 and paged["block_size"] == 16


def test_cli_scheduler_vllm_bad_input_one_line():
    p = cli("run", "--trace", "azure-conv", "--limit", "5", "--scheduler", "vllm", "--scheduling-policy", "lifo",
            "--device", "h100-sxm")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "lifo" in p.stderr


from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.test_serving_speed import FIELDS  # noqa: E402

#: Shapes of the property test: uniform, sliding + full, chunked + full, MLA, Mamba hybrid, each with prefix
#: caching off and on.
SHAPES = {"uniform": (False, True), "gemma3": (False, True), "llama4": (False, True), "deepseek_v3": (False, True),
          "qwen3_next": (False, True)}


def shape_model(shape):
    return (resolve_model("custom", layers=2, heads=4, kv_heads=2, head_dim=16) if shape == "uniform"
            else resolve_model(str(TINY / f"{shape}.json")))


@st.composite
def vllm_cases(draw):
    # the full-attention shapes twice: the plain allocation shortcut is theirs
    shape = draw(st.sampled_from(sorted(SHAPES) + ["uniform", "deepseek_v3"]))
    prefix = draw(st.sampled_from(SHAPES[shape]))
    n = draw(st.integers(1, 24))
    # arrivals in steps, or in seconds (then the planned runs end at the step that starts at or after the arrival)
    seconds = draw(st.booleans())
    reqs, step = [], 0
    for i in range(n):
        step += draw(st.integers(0, 4 if not seconds else 40))
        # with prefix caching, shared prefixes (hits) beside requests of their own (planned runs take those)
        family = draw(st.integers(0, 3)) if prefix else 3
        kw = {"prefix_id": f"p{family}", "prefix_tokens": 32} if family < 3 else {}
        when = {"arrival_s": step * 1e-4} if seconds else {"arrival_step": step}
        reqs.append(Request(i, draw(st.integers(33 if prefix else 1, 150)), draw(st.integers(1, 50)),
                            priority=draw(st.integers(0, 2)), **when, **kw))
    # tight pools (preemptions) to roomy ones; a pool must hold the longest whole prompt (vLLM's admission)
    blocks = draw(st.integers(8, 48))
    policy = draw(st.sampled_from(("fcfs", "priority")))
    # the token budget (a prompt split over steps, a decode past it) and max_num_seqs (a head that waits for a seat)
    batch = {"max_num_batched_tokens": draw(st.sampled_from((16, 64, 200))),
             "max_num_seqs": draw(st.sampled_from((1, 4, 8, 64)))}
    return shape, prefix, reqs, blocks, policy, batch


#: The token budget and max_num_seqs of the explicit examples (:func:`engine`'s defaults).
BATCH = {"max_num_batched_tokens": 64, "max_num_seqs": 8}


def shared(i: int, prompt: int, new_tokens: int, step: int = 0, family: str = "p0") -> Request:
    """A request of an explicit example: a 32-token prefix shared with its family, arriving at ``step``."""
    return Request(i, prompt, new_tokens, arrival_step=step, prefix_id=family, prefix_tokens=32)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vllm_cases())
# A waiting head that may hit the prefix cache, tried where its whole prompt does not fit without the hit: 7 blocks;
# step 0 request 0 takes its 64 tokens (4 blocks, its first two cached), request 1 (33 tokens: 3 blocks whole)
# waits for budget; step 1 request 0 decodes (5 blocks held), and request 1's lookup hits 2 blocks (32 tokens), so
# it needs 1 new block of the 2 free and is admitted — the planned run had tried it without the hit (3 > 2).
@example(("deepseek_v3", True, [shared(0, 64, 3), shared(1, 33, 1)], 8, "fcfs", BATCH))
def test_vllm_fast_path_equals_reference(case):
    """``--engine fast`` under vLLM's rules (arithmetic data bytes per table, ``allocate_slots`` of full/MLA groups
    as a block count) gives byte-identical step tables, request tables and ledgers to the reference (the block walk
    and vLLM's whole ``allocate_slots``), on random workloads, every shape, tight pools, prefix caching on and off,
    FCFS and priorities, token budgets and ``max_num_seqs`` from one request to many;
    at every reference step the arithmetic data bytes equal the walk's."""
    shape, prefix, reqs, blocks, policy, batch = case
    model = shape_model(shape)
    walked = []

    def observe(step, eng, live):  # the reference engine's data bytes both ways, after every step's sampling
        part = eng.sched
        part.lean = True
        fast_b = part.data_bytes(live)
        part.lean = False
        walked.append(fast_b == part.data_bytes(live))

    out = []
    for fast in (True, False):
        eng = engine(model, [Request(r.id, r.prompt, r.max_new_tokens, arrival_step=r.arrival_step,
                                     arrival_s=r.arrival_s, priority=r.priority, prefix_id=r.prefix_id,
                                     prefix_tokens=r.prefix_tokens)
                             for r in reqs],
                     blocks, prefix, scheduling_policy=policy, **batch)
        if not fast:
            eng.observe = observe
        try:
            groups, steps, _, seconds = eng.run(fast=fast)
        except ConfigError as e:  # a prompt the pool can never admit: the same one-line outcome both ways
            out.append(str(e))
            continue
        v = eng.sched.v  # vLLM's pool after the run: its free queue in order, references, every table
        out.append((steps.tobytes(), eng.ledger.rows.tobytes(), list(seconds),
                    [tuple(getattr(g, f) for f in FIELDS) for g in groups],
                    list(v.pool.free_queue), v.pool.ref, v.pool.touched, [gt.tables for gt in v.groups],
                    v.pool.hash_of, {k: list(b) for k, b in v.pool.cached.items()}))
    assert out[0] == out[1]
    assert all(walked)


def fast_equals_reference(model, reqs, blocks: int, **kw):
    """The workload through ``--engine fast`` and the reference (fresh requests each); asserts the two equal byte
    for byte — step table, request table, ledger, vLLM's pool after it (free queue order, references) — and returns
    the fast engine and its step table. With prefix caching, the cache too (each block's hash, each hash's blocks)."""
    out, engines = [], []
    for fast in (True, False):
        eng = engine(model, [Request(r.id, r.prompt, r.max_new_tokens, arrival_step=r.arrival_step,
                                     arrival_s=r.arrival_s, priority=r.priority, prefix_id=r.prefix_id,
                                     prefix_tokens=r.prefix_tokens) for r in reqs], blocks, **kw)
        groups, steps, _, seconds = eng.run(fast=fast)
        v = eng.sched.v
        out.append((steps.tobytes(), eng.ledger.rows.tobytes(), list(seconds),
                    [tuple(getattr(g, f) for f in FIELDS) for g in groups],
                    list(v.pool.free_queue), v.pool.ref, v.pool.touched, v.pool.hash_of, v.pool.cached))
        engines.append((eng, steps))
    assert out[0] == out[1]
    return engines[0]


@pytest.mark.parametrize("shape,blocks,seqs,policy,gap", [("uniform", 2000, 64, "fcfs", 0.02),
                                                          ("deepseek_v3", 2000, 64, "fcfs", 0.02),
                                                          ("uniform", 60, 6, "priority", 2e-7)])
def test_vllm_planned_runs_are_taken(shape, blocks, seqs, policy, gap):
    """``--engine fast`` under vLLM's rules plans quiet runs (:mod:`simkv.serving.engine.vllm_run`) for most steps
    of a workload arriving in seconds — a roomy pool, and a tight one whose queue waits (``max_num_seqs``, the
    whole prompt not fitting the free blocks) —, and the result is the reference's, byte for byte: step table,
    request table, ledger, and vLLM's pool after it (free queue order, references, tables)."""
    rng = np.random.default_rng(3)
    t, reqs = 0.0, []
    for i in range(150):
        t += float(rng.exponential(gap))
        reqs.append(Request(i, int(rng.integers(1, 300)), int(rng.integers(1, 120)), arrival_s=t,
                            priority=int(rng.integers(0, 3))))
    fast_eng, steps = fast_equals_reference(shape_model(shape), reqs, blocks, max_num_seqs=seqs,
                                            scheduling_policy=policy)
    planned = len(steps) - fast_eng.slow_steps
    assert planned > 0.6 * len(steps), (planned, len(steps))
    if blocks == 60:  # the queue waited (and a tight pool preempted) inside this workload
        assert steps["preemptions"].sum() > 0 and (steps["requests"] > steps["scheduled_requests"]).sum() > 100


@pytest.mark.parametrize("shape,blocks,policy", [("uniform", 2000, "fcfs"), ("deepseek_v3", 2000, "fcfs"),
                                                 ("uniform", 60, "fcfs"), ("uniform", 60, "priority")])
def test_vllm_arrivals_join_planned_runs(shape, blocks, policy, monkeypatch):
    """Arrivals inside a planned run under vLLM's rules (:func:`simkv.serving.engine.vllm_run._join`) join it where
    vLLM's waiting loop admits them at their step, or wait through it where the try fails (a tight pool: the whole
    prompt does not fit the free blocks), and the result is the reference's byte for byte; the runs are taken
    (arrivals every ~20 steps, ~20 running at once: most arrivals land inside a run)."""
    from simkv.serving.engine import vllm_run

    counts = {"admitted": 0, "waiting": 0}
    join = vllm_run._join

    def counting(*args, **kwargs):
        joiners, admits = join(*args, **kwargs)
        for j in joiners:
            counts["admitted" if j.row is not None else "waiting"] += 1
        return joiners, admits

    monkeypatch.setattr(vllm_run, "_join", counting)
    rng = np.random.default_rng(3)
    t, reqs = 0.0, []
    for i in range(150):
        t += float(rng.exponential(20))
        reqs.append(Request(i, int(rng.integers(1, 300)), int(rng.integers(1, 120)), arrival_step=int(t),
                            priority=int(rng.integers(0, 3))))
    fast_eng, steps = fast_equals_reference(shape_model(shape), reqs, blocks, max_num_seqs=64,
                                            scheduling_policy=policy)
    assert fast_eng.slow_steps < 0.15 * len(steps), (fast_eng.slow_steps, len(steps))
    assert counts["admitted"] > 50, counts
    if blocks == 60 and policy == "fcfs":  # the queue waited inside runs
        assert counts["waiting"] > 10, counts


@pytest.mark.parametrize("shape,blocks,seqs,policy", [("uniform", 4000, 16, "fcfs"), ("uniform", 400, 64, "fcfs"),
                                                      ("deepseek_v3", 4000, 16, "fcfs"),
                                                      ("uniform", 4000, 16, "priority")])
def test_vllm_waiting_queue_admitted_inside_planned_runs(shape, blocks, seqs, policy, monkeypatch):
    """An overloaded queue (150 requests arriving in the first steps; ``max_num_seqs`` or the pool holding most of
    them back): the waiting queue's head is admitted inside a planned run at the step vLLM's waiting loop admits it
    (a running request finished, or blocks freed), then the next head tried in the same step
    (:func:`simkv.serving.engine.vllm_run._join`), and the result is the reference's byte for byte; the runs are
    taken (most admissions from the queue happen inside runs)."""
    from simkv.serving.engine import vllm_run

    counts = {"queue": 0, "arrivals": 0}
    join = vllm_run._join

    def counting(*args, **kwargs):
        joiners, admits = join(*args, **kwargs)
        for _, _, j in admits:
            counts["queue" if j is None else "arrivals"] += 1
        return joiners, admits

    monkeypatch.setattr(vllm_run, "_join", counting)
    rng = np.random.default_rng(5)
    reqs = [Request(i, int(rng.integers(1, 300)), int(rng.integers(1, 120)), arrival_step=i // 50,
                    priority=int(rng.integers(0, 3))) for i in range(150)]
    fast_eng, steps = fast_equals_reference(shape_model(shape), reqs, blocks, max_num_seqs=seqs,
                                            scheduling_policy=policy)
    assert fast_eng.slow_steps < 0.3 * len(steps), (fast_eng.slow_steps, len(steps))
    assert counts["queue"] > 60, counts


@pytest.mark.parametrize("shape,blocks", [("uniform", 120), ("deepseek_v3", 120), ("uniform", 2000)])
def test_vllm_planned_runs_with_prefix_caching(shape, blocks):
    """Prefix caching inside planned runs (:mod:`simkv.serving.engine.vllm_run`): blocks hashed as they fill, freed
    cached blocks at the free queue's tail, evicted from its front when the pool is short (120 blocks for ~1,500
    blocks' worth of requests; 2,000: nothing evicted), a request of its own admitted inside a run (its lookup cannot
    hit), one sharing a prefix (a third of them: 48 tokens, 3 whole blocks) ending the run at its first try (the hit
    is the step-by-step path's). The result is the reference's byte for byte (step table, request table, ledger, free
    queue, every block's hash and the cache); the runs are taken, prefix hits happen, and cached blocks were evicted
    (a short pool)."""
    rng = np.random.default_rng(11)
    t, reqs = 0.0, []
    for i in range(150):
        t += float(rng.exponential(0.02))
        shared = {"prefix_id": "p0", "prefix_tokens": 48} if i % 3 == 0 else {}
        reqs.append(Request(i, int(rng.integers(49, 300)), int(rng.integers(1, 120)), arrival_s=t, **shared))
    fast_eng, steps = fast_equals_reference(shape_model(shape), reqs, blocks, prefix=True, max_num_seqs=64)
    planned = len(steps) - fast_eng.slow_steps
    assert planned > 0.5 * len(steps), (planned, len(steps))
    assert sum(1 for g in fast_eng.groups if g.prefix_hit) > 20
    pool = fast_eng.sched.v.pool
    filled = sum((g.P + g.generated - 1) // 16 for g in fast_eng.groups)  # full blocks computed, at least
    if blocks == 120:  # a short pool: every block handed out, most cached blocks evicted again
        assert pool.touched == pool.num_blocks and len(pool.cached) < filled // 4
    else:  # a roomy one: every full block still cached
        assert len(pool.cached) >= filled - len(fast_eng.groups)

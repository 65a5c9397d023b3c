"""GenAI's cache eviction in paged serving (simkv/serving/sched/eviction.py, docs/DESIGN.md §4d): golden
step sequences worked out by hand from the rule, the planned runs held to the reference, GenAI's refusals.

The rule (openvino.genai ``pipeline_impl.cpp`` ``_maybe_evict_cache_blocks``, ``cache_eviction.cpp``
``evict_logical_blocks``): after the forward of a step, a sequence that had completed its prompt before the step,
holding ``T`` tokens, drops ``floor(T / B) - max / B`` blocks once ``T >= max + B`` (KVCrush with budget ``b``
keeps ``b`` of them when at least ``b`` would go). Blocks in use are read at scheduling, so a drop shows at the
next step. The golden sequences at ``B = 32`` were also measured on the real pipeline (openvino-genai 2026.4.1,
``simkv validate --paged``'s toy model): the same blocks, step for step.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simkv.cost import get_device
from simkv.errors import ConfigError
from simkv.models import custom_model
from simkv.precision import get_precision
from simkv.serving import Request
from simkv.serving.engine.core import PagedServing
from simkv.serving.sched.config import SchedulerConfig
from simkv.serving.sched.eviction import CacheEviction

ROOT = Path(__file__).resolve().parent.parent
MODEL = custom_model(layers=2, heads=2, head_dim=8)
PREC = get_precision("f16")
DEVICE = get_device("xeon-8480")
EV = CacheEviction(32, 32, 96)  # B = 32: max / B = 3, fires at T >= 128
FIELDS = ("status", "P", "G", "processed", "maxc", "generated", "preemptions", "first_token_s", "finish_s",
          "first_token_step", "finish_step", "evicted", "scores", "snap")


def engine(requests, **cfg) -> PagedServing:
    return PagedServing([Request(i, p, g, arrival_step=a) if isinstance(p, int) else p
                         for i, (a, p, g) in enumerate(requests)] if requests and isinstance(requests[0], tuple)
                        else list(requests), MODEL, PREC, SchedulerConfig(**cfg), device=DEVICE, weights_bytes=0,
                        device_memory=10**12, block_bytes=None if cfg.get("kv_manager") == "vllm" else 1000,
                        stall_steps=400)


def blocks(requests, fast=False, **cfg):
    eng = engine(requests, **cfg)
    groups, steps, _, _ = eng.run(fast=fast)
    return steps["blocks_used"].tolist(), eng, groups


# --------------------------------------------------------------------------- golden sequences, by hand


def test_a_request_crossing_max_plus_a_block():
    # P = 100, 80 tokens, dynamic pool (min(2P, P + 80) = 180 tokens: 6 blocks). Step s >= 1 computes token
    # 100 + s: T = 100 + s at its forward. T reaches 128 = max + B at step 28: floor(128/32) - 3 = 1 block goes
    # (96 left), so step 29 holds 97 tokens in 4 blocks, not 129 in 5. Again at step 60 (96 + 32 = 128). Every step
    # holds 4 blocks; without eviction 4 (steps 0-28), 5 (29-60), 6 (61-79).
    used, eng, groups = blocks([(0, 100, 80)], cache_eviction=EV)
    assert used == [4] * 80
    assert eng.sched.evicted_blocks == 2 and groups[0].evicted == 64
    assert set(eng.finish()[1]["blocks_total"].tolist()) == {6}
    plain, _, _ = blocks([(0, 100, 80)])
    assert plain == [4] * 29 + [5] * 32 + [6] * 19


def test_prompt_steps_do_not_evict_not_even_the_one_that_completes_it():
    # P = 300 in chunks of 64: steps 0-4 hold 64, 128, 192, 256, 300 tokens (2, 4, 6, 8, 10 blocks); step 4 completes
    # the prompt with T = 300 >= 128 but the request could not generate before it (can_generate_tokens): nothing
    # goes. Step 5 (its first decode, T = 301) still holds 10 blocks at scheduling; after its forward
    # floor(301/32) - 3 = 6 blocks go, 109 tokens stay: step 6 holds 110 in 4 blocks.
    used, eng, _ = blocks([(0, 300, 5)], cache_eviction=EV, max_num_batched_tokens=64)
    assert used == [2, 4, 6, 8, 10, 10, 4, 4, 4]
    assert eng.sched.evicted_blocks == 6


def test_the_kvcrush_cap():
    # KVCrush b = 2 keeps 2 of the n blocks the scores drop when n >= 2. P = 300 in one 256 + 44 split: steps 0, 1
    # hold 8, 10 blocks; step 2 (T = 301) 10, then n = 9 - 3 = 6 >= 2: 4 go, 173 tokens stay (6 blocks). At
    # T = 192 (step 21) n = 6 - 3 = 3: 1 goes (160 stay); so it holds max/B + b + 1 = 6 blocks from step 3 on.
    used, _, _ = blocks([(0, 300, 40)], cache_eviction=CacheEviction(32, 32, 96, kvcrush=2))
    assert used == [8, 10, 10] + [6] * 38
    # b = 1 from below: at T = 128 n = 1 >= 1, KVCrush keeps it; at T = 160 n = 2: 1 goes (128 stay): 5 blocks
    used, _, _ = blocks([(0, 100, 100)], cache_eviction=CacheEviction(32, 32, 96, kvcrush=1))
    assert used == [4] * 29 + [5] * 71
    # b = 2 from below: n = 1 < 2, KVCrush does not apply, the block goes: as without KVCrush
    used, _, _ = blocks([(0, 100, 100)], cache_eviction=CacheEviction(32, 32, 96, kvcrush=2))
    assert used == [4] * 100


def test_a_victim_that_evicted_is_preempted_whole_and_recomputed_whole():
    # B = 4, start 4, recent 4, max 12 (fires at T >= 16), SnapKV off, a fixed pool of 7 blocks.
    # A: P 4, 40 tokens; V: P 19, 30 tokens, both at step 0.
    # step 0: both prompts (1 + 5 blocks) = 6. step 1: A T=5 (2 blocks), V T=20 (5 blocks, no new one) = 7; V
    #   drops floor(20/4) - 3 = 2 blocks (12 tokens, 3 blocks). steps 2-4: A 2 + V 4 (T 13..15) = 6.
    # step 5: A T=9 (3) + V T=16 (4) = 7; V drops 1 (12). steps 6-8: A 3 + V 4 = 7.
    # step 9: A T=13 needs a 4th block, none free: V (after A, holding tokens) is the victim, and having evicted
    #   it is preempted whole (was_evicted_from): all 4 blocks freed, processed 0, evicted 0. A alone: 4.
    # steps 9-39: A holds T 13..16, 4 blocks (it drops one at 16); V would need ceil(27/4) = 7 blocks (its 27
    #   tokens computed so far, all of them again: evicted ones too) and never fits until A ends at step 39.
    # step 40: V recomputes 27 tokens, 7 blocks; its scores span 15 tokens from step 8, 27 >= 15: no assertion;
    #   then it drops floor(27/4) - 3 = 3 blocks (15 stay). steps 41-61: T 16, 13, 14, 15, ...: 4 blocks; its 21
    #   tokens left are sampled at steps 41-61.
    ev = CacheEviction(4, 4, 12, snapkv=0)
    for fast in (False, True):
        used, eng, groups = blocks([(0, 4, 40), (0, 19, 30)], fast=fast, block_size=4, num_kv_blocks=7,
                                   cache_eviction=ev)
        assert used == [6, 7, 6, 6, 6, 7, 7, 7, 7] + [4] * 31 + [7] + [4] * 21
        steps = eng.finish()[1]
        assert steps["preemptions"].tolist() == [0] * 9 + [1] + [0] * 52
        assert steps["scheduled_tokens"][40] == 27
        assert [g.status for g in groups] == ["FINISHED", "FINISHED"] and groups[1].finish_step == 61


def test_a_recompute_shorter_than_the_scores_stops_step():
    # As above at GenAI's block (32), start 32, recent 32, max 96, SnapKV off, 7 blocks, 64 tokens a step: V is
    # preempted whole at step 65 and recomputes in 64-token chunks; its scores span more than 64 tokens, so GenAI's
    # _accumulate_layer_scores_to asserts (new_size_in_tokens >= old_size_in_tokens) after the forward of step 66.
    # Measured: the real pipeline throws there (simkv validate --paged, tests/test_validate_genai.py).
    eng = engine([(0, 32, 80), (0, 152, 100)], num_kv_blocks=7, max_num_batched_tokens=64,
                 cache_eviction=CacheEviction(32, 32, 96, snapkv=0))
    groups, steps, _, _ = eng.run()
    assert len(steps) == 66 and eng.runtime_stop["step"] == 66
    assert eng.runtime_stop["check"] == "new_size_in_tokens >= old_size_in_tokens"
    assert "GenAI's step() throws at step 66" in eng.stopped and {g.status for g in groups} == {"UNFINISHED"}


def test_a_prompt_just_past_start_stops_step_unless_snapkv_is_off():
    # P = 35 with start 32 and GenAI's SnapKV window 8: the prompt's one chunk is its first registration, spanning
    # 35 - 32 = 3 tokens past start but holding 8 SnapKV scores: _accumulate_initial_scores asserts
    # (new_scores_size >= num_snapkv_scores) after the forward of step 0 (measured: P 33, 35, 39 throw; 40 runs).
    eng = engine([(0, 35, 5)], cache_eviction=EV)
    _, steps, _, _ = eng.run()
    assert len(steps) == 0 and eng.runtime_stop["check"] == "new_scores_size >= num_snapkv_scores"
    for p in (40, 31):
        eng = engine([(0, p, 5)], cache_eviction=EV)
        eng.run()
        assert eng.runtime_stop is None
    eng = engine([(0, 35, 5)], cache_eviction=CacheEviction(32, 32, 96, snapkv=0))
    _, steps, _, _ = eng.run()
    assert eng.runtime_stop is None and len(steps) == 5


# --------------------------------------------------------------------------- what GenAI cannot run


@pytest.mark.parametrize("cfg, requests, message", [
    (dict(enable_prefix_caching=True), [(0, 40, 5)], "blocks across layers must be freed simultaneously"),
    ({}, [Request(0, 40, 5, arrival_step=0, samples=2)], "2 sequences (samples or beams)"),
    ({}, [Request(0, 40, 5, arrival_step=0, beam=3)], "3 sequences (samples or beams)"),
    (dict(kv_manager="vllm"), [(0, 40, 5)], "GenAI's KV manager"),
    (dict(block_size=16, cache_eviction=CacheEviction(32, 40, 96)), [(0, 40, 5)], "multiple of the block size 16"),
])
def test_what_genai_cannot_run_is_refused_in_one_line(cfg, requests, message):
    with pytest.raises(ConfigError) as err:
        engine(requests, **{"cache_eviction": EV, **cfg})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_cli_runs_with_eviction_and_refuses_bad_values():
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "simkv.cli", "run", "--model", "custom", "--layers", "2",
                               "--heads", "2", "--head-dim", "8", "--synthetic", "--requests", "20",
                               "--prompt-dist", "uniform:100:300", "--output-dist", "uniform:50:200", "--rate", "50",
                               *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})

    ok = cli("--cache-eviction", "start=32,recent=32,max=96")
    assert ok.returncode == 0, ok.stderr
    assert "cache eviction start=32,recent=32,max=96" in ok.stdout and "blocks dropped" in ok.stdout
    for flag, message in (("recent=32,max=100", "multiple of the block size 32"),
                          ("max=64", "larger than start + recent"), ("start=32,middle=3", "takes start=N"),
                          ("start=32", None)):
        bad = cli("--cache-eviction", flag, "--prefix-caching")
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
        assert (message or "blocks across layers must be freed simultaneously") in bad.stderr
    two = cli("--cache-eviction", "start=32,recent=32,max=96", "--replicas", "2", "--json")
    out = json.loads(two.stdout)
    assert out["evicted_blocks"] == sum(r["evicted_blocks"] for r in out["replicas"]) > 0
    assert out["scenario"]["paged"]["cache_eviction"] == "start=32,recent=32,max=96"
    bad = cli("--cache-eviction", "on", "--memory", "contiguous")
    assert bad.returncode == 2 and "use --memory paged --scheduler continuous" in bad.stderr


# --------------------------------------------------------------------------- planned runs = the reference


@st.composite
def evicting_workloads(draw):
    bs = draw(st.sampled_from([4, 8, 16, 32]))
    start, recent = bs * draw(st.integers(1, 2)), bs * draw(st.integers(1, 2))
    ev = CacheEviction(start, recent, start + recent + bs * draw(st.integers(1, 3)),
                       draw(st.sampled_from([0, 0, 1, 2])), draw(st.sampled_from([0, 8, 8])))
    n = draw(st.integers(1, 30))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0002, 0.001, 0.004, 0.02]))
        reqs.append(Request(i, draw(st.integers(1, 6 * ev.max // 4)), draw(st.integers(1, 2 * ev.max)), arrival_s=t))
    cfg = dict(block_size=bs, num_kv_blocks=draw(st.sampled_from([0, 10, 25, 60, 300])),
               max_num_batched_tokens=draw(st.sampled_from([16, 32, 64, 256])),
               dynamic_split_fuse=draw(st.booleans()), cache_eviction=ev)
    return reqs, cfg


def _same(reqs, **cfg):
    a = engine(reqs, **cfg)
    ga, sa, _, _ = a.run(fast=False)
    b = engine(reqs, **cfg)
    gb, sb, _, _ = b.run(fast=True)
    assert np.array_equal(sa, sb)
    assert a.ledger == b.ledger and a.stopped == b.stopped and a.runtime_stop == b.runtime_stop
    assert [tuple(getattr(g, f) for f in FIELDS) for g in ga] == [tuple(getattr(g, f) for f in FIELDS) for g in gb]
    assert [g.tables for g in ga] == [g.tables for g in gb]
    assert list(a.pool.free) == list(b.pool.free) and a.pool.touched == b.pool.touched
    assert a.sched.evicted_blocks == b.sched.evicted_blocks
    return b


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(evicting_workloads())
def test_fast_equals_reference_with_eviction(case):
    reqs, cfg = case
    _same(reqs, **cfg)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(evicting_workloads())
def test_blocks_held_follow_from_lengths(case):
    # After every step's sampling: a running request holds ceil((processed - evicted) / B) blocks (GenAI's
    # get_num_logical_blocks), a decoding one that evicted at most max/B + 1 + kvcrush, and the pool's blocks in use
    # are the tables'.
    reqs, cfg = case
    ev, bs = cfg["cache_eviction"], cfg["block_size"]

    def observe(step, eng, live):
        held = 0
        for g in live:
            held += len(g.tables[0])  # (a request that finished in this step still holds its blocks here)
            if g.status != "RUNNING":
                continue
            assert len(g.tables[0]) == -(-(g.processed - g.evicted) // bs)
            if g.evicted and g.processed >= g.maxc:
                assert len(g.tables[0]) <= ev.max // bs + 1 + ev.kvcrush
        assert eng.pool.used() == held

    eng = engine(reqs, **cfg)
    eng.observe = observe
    eng.run(fast=False)


def test_planned_runs_carry_evicting_decoders():
    # 64 requests decoding past max at once: every step one of them drops a block; the planned runs take them
    rng = np.random.default_rng(3)
    reqs = [Request(i, int(rng.integers(100, 400)), int(rng.integers(200, 600)), arrival_s=0.001 * i)
            for i in range(64)]
    eng = _same(reqs, cache_eviction=EV)
    assert eng.sched.evicted_blocks > 500
    assert eng.slow_steps < 0.2 * len(eng.finish()[1])

"""``simkv validate --paged``: comparison, bounds, token ids, random cases, CLI errors, and one real run.

The pure parts run everywhere; the last test drives the real OpenVINO GenAI pipeline (marker ``openvino``,
skipped without openvino-genai) on a workload small enough to finish in seconds, building the model
directory inside the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simkv.serving import SchedulerConfig
from simkv.serving.requests import Request
from simkv.serving.sched.eviction import CacheEviction
from simkv.validate.genai.runner import (
    beam_bounds,
    check_scheduler,
    compare_steps,
    compare_stops,
    prompt_token_ids,
    random_case,
)
from simkv.validate.genai.model import PROMPT_ID_END, PROMPT_ID_START

ROOT = Path(__file__).resolve().parents[1]


def _step(k, requests=1, scheduled=1, used=1, total=4, generated=None, status=None):
    return {"step": k, "requests": requests, "scheduled_requests": scheduled, "blocks_used": used,
            "blocks_total": total, "generated": generated or {"0": k}, "status": status or {"0": "RUNNING"}}


# --------------------------------------------------------------------------- comparison


def test_identical_steps_all_match():
    steps = [_step(0), _step(1), _step(2, used=2)]
    out = compare_steps(steps, [dict(s) for s in steps])
    assert out == {"steps_total": 3, "steps_matched": 3, "steps_mismatched": 0, "first_mismatches": []}


def test_a_differing_field_is_reported_with_both_values():
    real = [_step(0), _step(1, used=2), _step(2, status={"0": "FINISHED"})]
    sim = [_step(0), _step(1, used=3), _step(2, status={"0": "RUNNING"})]
    out = compare_steps(real, sim)
    assert out["steps_matched"] == 1 and out["steps_mismatched"] == 2
    assert out["first_mismatches"] == [
        {"step": 1, "fields": {"blocks_used": {"real": 2, "simulated": 3}}},
        {"step": 2, "fields": {"status[0]": {"real": "FINISHED", "simulated": "RUNNING"}}},
    ]


def test_unobservable_tokens_are_skipped_but_observed_ones_compared():
    # Real None = not streamed (samples > 1 or beam before the finish): not compared.
    real = [_step(0, generated={"0": None}), _step(1, generated={"0": 5})]
    sim = [_step(0, generated={"0": 1}), _step(1, generated={"0": 4})]
    out = compare_steps(real, sim)
    assert out["steps_matched"] == 1
    assert out["first_mismatches"] == [{"step": 1, "fields": {"generated[0]": {"real": 5, "simulated": 4}}}]


def test_a_step_missing_on_one_side_mismatches():
    out = compare_steps([_step(0), _step(1)], [_step(0)])
    assert out["steps_total"] == 2 and out["steps_mismatched"] == 1
    assert out["first_mismatches"][0] == {"step": 1, "fields": {"step": {"real": 1, "simulated": None}}}


def test_bounded_steps_compare_blocks_against_the_bounds_inclusive():
    real = [_step(0, used=5), _step(1, used=7), _step(2, used=8)]
    sim = [_step(0, used=7), _step(1, used=7), _step(2, used=7)]
    out = compare_steps(real, sim, exempt_blocks={0, 1, 2}, bounds={0: (5, 7), 1: (5, 7), 2: (5, 7)})
    assert out["steps_matched"] == 2
    assert out["first_mismatches"] == [
        {"step": 2, "fields": {"blocks_used": {"real": 8, "simulated": 7, "bounds": [5, 7]}}}]


def test_beam_bounds_by_hand():
    # Prompt phase (nothing generated): one sequence, 33 tokens -> ceil(33/32) = 2 blocks exactly.
    assert beam_bounds(45, 33, 3, 0) == (2, 2)
    # Prompt 45, context 46, 3 beams: ceil(46/32) = 2 blocks at least (one lineage); the prompt's
    # floor(45/32) = 1 full block is shared, so at most 1 + 3 * (2 - 1) = 4.
    assert beam_bounds(45, 46, 3, 1) == (2, 4)
    # Prompt 64 (2 full blocks), context 100, 4 beams: at least ceil(100/32) = 4; at most 2 + 4 * (4 - 2) = 10.
    assert beam_bounds(64, 100, 4, 36) == (4, 10)


# --------------------------------------------------------------------------- token ids


def _lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


requests_st = st.lists(
    st.tuples(st.integers(1, 120), st.sampled_from([None, "a", "b"]), st.integers(0, 120)), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(rows=requests_st, seed=st.integers(0, 3))
def test_prompts_share_only_their_declared_prefix(rows, seed):
    reqs = [Request(i, p, 3, arrival_step=0, prefix_id=pid if pid else None, prefix_tokens=min(t, p) if pid else 0)
            for i, (p, pid, t) in enumerate(rows)]
    ids = prompt_token_ids(reqs, seed)
    assert ids == prompt_token_ids(reqs, seed)  # deterministic
    for r, t in zip(reqs, ids):
        assert len(t) == r.prompt
        assert all(PROMPT_ID_START <= x < PROMPT_ID_END for x in t)
    for i, a in enumerate(reqs):
        for j, b in enumerate(reqs[:i]):
            declared = min(a.prefix_tokens, b.prefix_tokens) if a.prefix_id and a.prefix_id == b.prefix_id else 0
            common = _lcp(ids[i], ids[j])
            # The declared prefix is shared; past it at most the first of the two position-code ids
            # agrees (never a whole block), unless one prompt ends inside the shared part.
            assert common >= min(declared, a.prompt, b.prompt)
            assert common <= declared + 1


def test_explicit_token_ids_are_kept():
    r = Request(0, 3, 2, arrival_step=0, token_ids=(7, 8, 9))
    assert prompt_token_ids([r]) == [(7, 8, 9)]


# --------------------------------------------------------------------------- random cases


def test_random_cases_are_deterministic_and_runnable():
    a = [random_case(np.random.default_rng(5)) for _ in range(3)]
    b = [random_case(np.random.default_rng(5)) for _ in range(3)]
    assert a == b
    rng = np.random.default_rng(0)
    for _ in range(300):
        reqs, opts = random_case(rng)
        steps = [r.arrival_step for r in reqs]
        assert steps == sorted(steps)
        assert all(r.prefix_tokens <= r.prompt for r in reqs)
        assert all(r.beam == 1 for r in reqs)
        if not opts.dynamic_split_fuse:  # GenAI asserts that every sequence fits one batch in vLLM mode
            assert opts.max_num_batched_tokens >= max(r.prompt + r.max_new_tokens for r in reqs)
            assert opts.max_num_batched_tokens >= opts.max_num_seqs


def test_a_stop_in_step_is_one_more_step_compared():
    # step() threw in both runs at the same step on the same check: one more matched step
    out = compare_steps([_step(0)], [_step(0)])
    real = {"step": 1, "check": "cache_eviction.cpp:205: Check 'new_size_in_tokens >= old_size_in_tokens'"}
    compare_stops(out, real, {"step": 1, "check": "new_size_in_tokens >= old_size_in_tokens"})
    assert out["steps_matched"] == out["steps_total"] == 2 and out["stop"]["matched"]
    # at another step, or only in the simulation: a mismatch naming both
    for sim_stop, real_stop in (({"step": 2, "check": "new_size_in_tokens >= old_size_in_tokens"}, real),
                                ({"step": 1, "check": "new_size_in_tokens >= old_size_in_tokens"}, None)):
        out = compare_steps([_step(0)], [_step(0)])
        compare_stops(out, real_stop, sim_stop)
        assert out["steps_mismatched"] == 1 and out["first_mismatches"][-1]["fields"]["stop"]["simulated"] == sim_stop
    # only the real pipeline stopped: the workload fails as an error of the real run
    with pytest.raises(RuntimeError, match="step\\(\\) threw at step 1"):
        compare_stops(compare_steps([_step(0)], [_step(0)]), real, None)
    out = compare_steps([_step(0)], [_step(0)])
    compare_stops(out, None, None)
    assert "stop" not in out and out["steps_total"] == 1


def test_random_eviction_cases_are_runnable_by_genai():
    ev = CacheEviction(32, 32, 96, kvcrush=1)
    a = [random_case(np.random.default_rng(4), ev) for _ in range(3)]
    assert a == [random_case(np.random.default_rng(4), ev) for _ in range(3)]
    rng = np.random.default_rng(0)
    for _ in range(300):
        reqs, opts = random_case(rng, ev)
        check_scheduler(opts)  # (GenAI runs it: no prefix caching, sizes multiples of 32)
        assert opts.cache_eviction == ev and not opts.enable_prefix_caching
        assert all(r.sequences == 1 and r.prompt <= ev.max + 128 for r in reqs)
        if not opts.dynamic_split_fuse:
            assert opts.max_num_batched_tokens >= max(r.prompt + r.max_new_tokens for r in reqs)


def test_scheduler_config_checks_reject_nonsense():
    from simkv.errors import ConfigError

    with pytest.raises(ConfigError):
        check_scheduler(SchedulerConfig(num_kv_blocks=-1))
    with pytest.raises(ConfigError):
        check_scheduler(SchedulerConfig(max_num_batched_tokens=0))
    with pytest.raises(ConfigError, match="whole number"):  # GenAI's cache_size is an integer
        check_scheduler(SchedulerConfig(cache_size=1.5))
    with pytest.raises(ConfigError, match="block_size"):  # the CPU plugin's blocks are 32 tokens
        check_scheduler(SchedulerConfig(block_size=16))
    check_scheduler(SchedulerConfig(cache_size=2.0))
    assert SchedulerConfig().dynamic and not SchedulerConfig(num_kv_blocks=3).dynamic
    # what GenAI is given: its own field names, cache_size an int; the JSON of simkv run keeps cache_size_gib
    assert SchedulerConfig(cache_size=2.0).genai() == {
        "num_kv_blocks": 0, "cache_size": 2, "max_num_batched_tokens": 256, "max_num_seqs": 256,
        "dynamic_split_fuse": True, "enable_prefix_caching": False}
    assert list(SchedulerConfig().summary())[:3] == ["block_size", "num_kv_blocks", "cache_size_gib"]


# --------------------------------------------------------------------------- CLI errors


def _cli(*args, env=None, pre=""):
    code = pre + "import sys; from simkv.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "validate", "--paged", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.parametrize("args, message", [
    ([], "exactly one of --trace"),
    (["--random", "2", "--trace", "x.csv"], "exactly one of --trace"),
    (["--random", "0"], "--random must be in"),
    (["--trace", "/nonexistent.csv"], "no such trace file"),
    (["--random", "1", "--vocab", "100"], "vocab must exceed"),
    (["--random", "1", "--layers", "0"], "must be positive"),
    (["--random", "1", "--model", "llama-3-8b"], "--model applies to the OpenVINO CPU plugin"),
    (["--random", "1", "--heads", "6", "--kv-heads", "4"], "multiple of kv heads"),
    (["--random", "1", "--layers", "1000", "--heads", "64", "--head-dim", "256"], "weights; a real validation"),
    (["--random", "1", "--cache-eviction", "start=16,recent=32,max=96"], "start (16) must be a multiple"),
    (["--random", "1", "--cache-eviction", "max=2"], "must be larger than start + recent"),
    (["--random", "1", "--cache-eviction", "max=96,recent=32,bogus=1"], "takes start=N"),
])
def test_cli_errors_are_one_line_exit_2(args, message, capsys):
    from simkv.cli import main

    assert main(["validate", "--paged", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_trace_needs_arrival_steps(tmp_path):
    w = tmp_path / "w.csv"
    w.write_text("id,arrival,prompt,max_new_tokens\n0,0.0,10,5\n")
    proc = _cli("--trace", str(w))  # end to end, as a user runs it
    assert proc.returncode == 2 and "needs arrival_step" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_without_openvino_genai_says_how_to_install(monkeypatch, capsys):
    from simkv.cli import main

    monkeypatch.setitem(sys.modules, "openvino_genai", None)  # import openvino_genai -> ImportError
    assert main(["validate", "--paged", "--random", "1"]) == 2
    assert capsys.readouterr().err.strip() == ("simkv validate: error: paged validation needs openvino-genai: "
                                               "pip install 'simkv[openvino]'")


# --------------------------------------------------------------------------- one real run


REAL = """id,arrival_step,prompt,max_new_tokens,prefix_id,prefix_tokens,samples,beam
0,0,40,12,sys,40,1,1
1,1,70,8,,,2,1
2,3,50,6,sys,40,1,1
"""


@pytest.mark.openvino
def test_real_pipeline_matches_step_by_step(tmp_path):
    pytest.importorskip("openvino_genai")
    pytest.importorskip("memray")
    w, out, report = tmp_path / "w.csv", tmp_path / "r.json", tmp_path / "r.html"
    w.write_text(REAL)
    # Dynamic pool, chunked prompts (32-token batches), prefix caching with a fully matched prompt
    # (request 0 is the whole prefix), multinomial n = 2.
    proc = _cli("--trace", str(w), "--max-num-batched-tokens", "32", "--prefix-caching", "--json", "--out", str(out),
                "--report", str(report), env={"SIMKV_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1 = a difference, shown by the asserts below
    data = json.loads(proc.stdout)
    assert json.loads(out.read_text()) == data
    assert data["steps_mismatched"] == 0, data["first_mismatches"]
    assert data["steps_matched"] == data["steps_total"] > 10
    assert data["kv_precision"] == "u8"
    # u8 blocks of the 2-layer, 2-kv-head x 32 toy: K [2, 32+8, 32] and V [2, 32, 32+8] bytes per layer
    # (by-channel key scales, by-token value scales) = 2 * 2 * 2 * 40 * 32 = 10,240 B.
    assert data["block_bytes"] == 10_240
    w0 = data["workloads"][0]
    assert w0["exercised"]["prefix_hit_tokens"] > 0 and w0["exercised"]["pool_growths"] >= 1
    final_status, final_tokens = {}, {}  # each request's last appearance (records hold live requests only)
    for s in w0["steps"]:
        final_status.update(s["real"]["status"])
        final_tokens.update(s["real"]["generated"])
    assert final_status == {"0": "FINISHED", "1": "FINISHED", "2": "FINISHED"}
    assert final_tokens == {"0": 12, "1": 8, "2": 6}
    # Pool tensors and the plugin's transients, every one in order and size (2 layers x K, V at the first
    # step: 4 tensors + 4 transients, each allocated, the transients freed at once).
    a = data["allocations"]
    assert a["compared"] and a["events_total"] >= 12 and a["plugin_transients"] >= 4
    assert a["events_matched"] == a["events_total"] and a["events_missing"] == a["events_unexpected"] == 0
    assert {"openvino", "openvino-genai", "openvino-tokenizers"} <= set(data["versions"])
    assert proc.returncode == 0
    assert "simkv validate --paged" in report.read_text()


# A hand-made workload with preemption under cache eviction (docs/guide/cache-eviction.md): A (32 tokens, 80 to
# generate) and V (152, 100) in 7 blocks, start 32, recent 32, max 96, SnapKV off. V drops its first block at its
# first decode step and settles at 4 blocks; A grows to its 4th block at step 65, and V, which evicted, is
# preempted whole. With 256 tokens a step V is recomputed whole (216 tokens, 7 blocks) once A has finished, then
# evicts again; with 64 a step its first 64-token chunk spans fewer tokens than its scores, and GenAI's step()
# throws at step 66 (cache_eviction.cpp _accumulate_layer_scores_to).
EVICTION = """id,arrival_step,prompt,max_new_tokens
0,0,32,80
1,0,152,100
"""


@pytest.mark.openvino
@pytest.mark.parametrize("batched, steps, stop", [("256", 116, None), ("64", 67, 66)])
def test_real_pipeline_with_cache_eviction_matches_step_by_step(tmp_path, batched, steps, stop):
    pytest.importorskip("openvino_genai")
    pytest.importorskip("memray")
    w = tmp_path / "w.csv"
    w.write_text(EVICTION)
    proc = _cli("--trace", str(w), "--num-kv-blocks", "7", "--max-num-batched-tokens", batched,
                "--cache-eviction", "start=32,recent=32,max=96,snapkv=0", "--json",
                env={"SIMKV_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["steps_mismatched"] == 0, data["first_mismatches"]
    assert data["steps_matched"] == data["steps_total"] == steps  # (a stop counts as the step it threw at)
    w0 = data["workloads"][0]
    assert w0["exercised"]["preemptions"] == 1 and w0["exercised"]["evicted_blocks"] > 0
    assert w0["scheduler"]["cache_eviction"] == "start=32,recent=32,max=96,snapkv=0"
    if stop is None:
        assert "stop" not in w0["comparison"]
    else:
        assert w0["comparison"]["stop"]["matched"] and w0["comparison"]["stop"]["real"]["step"] == stop
        assert "new_size_in_tokens >= old_size_in_tokens" in w0["comparison"]["stop"]["real"]["check"]
    a = data["allocations"]
    assert a["compared"] and a["events_matched"] == a["events_total"] > 0
    assert proc.returncode == 0

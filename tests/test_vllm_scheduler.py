"""simkv's vLLM V1 scheduler (``simkv.serving.sched.vllm``) on the hand-worked cases of tests/test_vllm_real.py:
the same derivations (docs/research/vllm-scheduler.md, S1–S9, K1–K8) and the same expected steps, checked against
simkv's scheduler with no side venv. tests/test_vllm_real.py holds each derivation in full; the comments here name
the rule each expectation comes from. A hypothesis test checks block conservation, the pool bound and determinism.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from simkv.errors import ConfigError
from simkv.hfconfig import resolve_model
from simkv.serving.requests import Request
from simkv.serving.sched.vllm import VllmScheduler, VllmSettings, simulate_steps
from simkv.validate.genai.runner import prompt_token_ids
from simkv.validate.vllm.compare import simulate, specs_of
from simkv.validate.vllm.real import SchedulerSettings

TINY = Path(__file__).resolve().parents[1] / "simkv" / "data" / "configs" / "tiny"


def uniform():
    return resolve_model("custom", layers=2, heads=4, kv_heads=2, head_dim=16)


def run(model, requests, **kw):
    return simulate(model, requests, prompt_token_ids(requests, 0), SchedulerSettings(**kw))


def column(steps, name):
    return [s[name] for s in steps]


def test_chunked_prefill_across_two_steps_under_the_budget():
    """Budget 32: request 0's 40-token prompt is cut to 32 (S3), its 8 left go first at step 1 (S2), then request
    1 whole; block ids from the free queue's head, 1, 2, … (K1)."""
    steps = run(uniform(), [Request(0, 40, 3, arrival_step=0), Request(1, 10, 2, arrival_step=0)],
                num_blocks=20, block_size=16, max_num_batched_tokens=32, max_num_seqs=4)
    assert column(steps, "scheduled") == [{"0": 32}, {"0": 8, "1": 10}, {"0": 1, "1": 1}, {"0": 1}]
    assert column(steps, "blocks")[:2] == [{"0": [[1, 2]]}, {"0": [[1, 2, 3]], "1": [[4]]}]
    assert column(steps, "free") == [17, 15, 16, 19]
    assert column(steps, "finished") == [[], [], ["1"], ["0"]]


def test_preemption_and_its_recompute():
    """4 usable blocks: at step 17 request 0 needs a 3rd block; the last running request (1) is preempted (S6),
    its blocks [2, 4] go back reversed to the queue's front (K3: [4, 2]); no admission that step (S2); request 1
    is re-admitted only once its 33 tokens fit whole (S4), at step 20, into [4, 3, 1] (request 0's reversed)."""
    steps = run(uniform(), [Request(0, 16, 20, arrival_step=0), Request(1, 16, 20, arrival_step=0)],
                num_blocks=5, block_size=16, max_num_batched_tokens=64, max_num_seqs=4)
    sched = column(steps, "scheduled")
    assert sched[0] == {"0": 16, "1": 16} and sched[1] == {"0": 1, "1": 1}
    assert steps[1]["blocks"] == {"0": [[1, 3]], "1": [[2, 4]]}
    assert [s["step"] for s in steps if s["preempted"]] == [17] and steps[17]["preempted"] == ["1"]
    assert sched[17:20] == [{"0": 1}] * 3 and steps[17]["blocks"] == {"0": [[1, 3, 4]]}
    assert steps[19]["finished"] == ["0"]
    assert sched[20] == {"1": 33} and steps[20]["resumed"] == ["1"] and steps[20]["blocks"] == {"1": [[4, 3, 1]]}
    assert sched[21:] == [{"1": 1}, {"1": 1}] and steps[22]["finished"] == ["1"] and len(steps) == 23


def test_sliding_group_frees_blocks_to_the_null_block():
    """gpt-oss: a sliding group (W = 4) then a full one (K6). At step 1, 32 − 4 + 1 = 29 skipped tokens: block 1
    becomes the null block and goes to the queue's front (K4, K3), and the sliding table takes it back."""
    assert specs_of(resolve_model(str(TINY / "gpt_oss.json")), SchedulerSettings()) == [("sliding", 16, 4),
                                                                                          ("full", 16, 0)]
    steps = run(resolve_model(str(TINY / "gpt_oss.json")), [Request(0, 40, 3, arrival_step=0)],
                num_blocks=12, block_size=16, max_num_batched_tokens=32, max_num_seqs=4)
    assert column(steps, "scheduled") == [{"0": 32}, {"0": 8}, {"0": 1}, {"0": 1}]
    assert column(steps, "blocks") == [{"0": [[1, 2], [3, 4]]}, {"0": [[0, 2, 1], [3, 4, 5]]},
                                       {"0": [[0, 0, 1], [3, 4, 5]]}, {"0": [[0, 0, 1], [3, 4, 5]]}]
    assert column(steps, "free") == [7, 6, 7, 11]


def test_mamba_group_keeps_one_state_page():
    """Qwen3-Next: three Mamba groups (block = max_model_len, K5) and a full group of 32-token blocks (K7): one
    state block per Mamba group for the request's life, the full group growing beside them."""
    model = resolve_model(str(TINY / "qwen3_next.json"))
    assert specs_of(model, SchedulerSettings(max_model_len=512)) == [("mamba", 512, 0)] * 3 + [("full", 32, 0)]
    steps = run(model, [Request(0, 40, 3, arrival_step=0)], num_blocks=12, block_size=16,
                max_num_batched_tokens=32, max_num_seqs=4, max_model_len=512)
    assert column(steps, "blocks") == [{"0": [[1], [2], [3], [4]]}] + [{"0": [[1], [2], [3], [4, 5]]}] * 3
    assert column(steps, "free") == [7, 6, 6, 11]


def test_prefix_hit_and_the_eviction_order_of_cached_blocks():
    """Request 0's freed blocks: 3 (no hash) to the front, 2 and 1 (cached) to the tail (K3); request 1 hits 1
    and 2 (32 tokens, S5), touches them out of the queue and takes block 3 from the head."""
    reqs = [Request(0, 40, 2, arrival_step=0, prefix_id="a", prefix_tokens=32),
            Request(1, 40, 2, arrival_step=2, prefix_id="a", prefix_tokens=32)]
    steps = run(uniform(), reqs, num_blocks=10, block_size=16, max_num_batched_tokens=64, max_num_seqs=4,
                enable_prefix_caching=True)
    assert column(steps, "scheduled") == [{"0": 40}, {"0": 1}, {"1": 8}, {"1": 1}]
    assert column(steps, "hits") == [{"0": 0}, {}, {"1": 32}, {}]
    assert column(steps, "blocks") == [{"0": [[1, 2, 3]]}] * 2 + [{"1": [[1, 2, 3]]}] * 2 and column(steps, "free") == [6, 9, 6, 9]


def test_sliding_group_prefix_hit():
    """gpt-oss, prefix caching (tests/test_vllm_real.py ``test_sliding_group_prefix_hit`` holds the derivation):
    the sliding group caches only block 2, the one ending at the replay boundary (retention 0); request 1's hit is
    32 tokens: full [4, 5], sliding [null, 2] (scanned from the right, one block covers the window − 1 tokens)."""
    reqs = [Request(0, 40, 2, arrival_step=0, prefix_id="a", prefix_tokens=32),
            Request(1, 40, 2, arrival_step=2, prefix_id="a", prefix_tokens=32)]
    steps = run(resolve_model(str(TINY / "gpt_oss.json")), reqs, num_blocks=12, block_size=16,
                max_num_batched_tokens=64, max_num_seqs=4, enable_prefix_caching=True)
    assert column(steps, "scheduled") == [{"0": 40}, {"0": 1}, {"1": 8}, {"1": 1}]
    assert column(steps, "hits") == [{"0": 0}, {}, {"1": 32}, {}]
    assert column(steps, "blocks") == [{"0": [[1, 2, 3], [4, 5, 6]]}, {"0": [[0, 0, 3], [4, 5, 6]]},
                                       {"1": [[0, 2, 6], [4, 5, 3]]}, {"1": [[0, 0, 6], [4, 5, 3]]}]
    assert column(steps, "free") == [5, 11, 6, 11]


def test_mamba_group_prefix_hit_and_its_aligned_chunk():
    """Qwen3-Next, prefix caching (``mamba_cache_mode="align"``; tests/test_vllm_real.py
    ``test_mamba_group_prefix_hit_and_its_aligned_chunk`` holds the derivation): request 0's 70-token prompt is cut
    at the last cacheable boundary, 64; request 1's hit on the state cached in that step waits a step, then hits
    64 tokens (Mamba [null, state], full [4, 5]); each table keeps one live state block, null blocks behind it."""
    reqs = [Request(0, 70, 2, arrival_step=0, prefix_id="a", prefix_tokens=64),
            Request(1, 70, 2, arrival_step=0, prefix_id="a", prefix_tokens=64)]
    steps = run(resolve_model(str(TINY / "qwen3_next.json")), reqs, num_blocks=20, block_size=16,
                max_num_batched_tokens=128, max_num_seqs=4, max_model_len=512, enable_prefix_caching=True)
    assert column(steps, "scheduled") == [{"0": 64}, {"0": 6, "1": 6}, {"0": 1, "1": 1}]
    assert column(steps, "hits") == [{"0": 0}, {"1": 64}, {}]
    assert column(steps, "blocks") == [
        {"0": [[0, 1], [0, 2], [0, 3], [4, 5]]},
        {"0": [[0, 1, 6], [0, 2, 7], [0, 3, 8], [4, 5, 9]], "1": [[0, 1, 10], [0, 2, 11], [0, 3, 12], [4, 5, 13]]},
        {"0": [[0, 0, 6], [0, 0, 7], [0, 0, 8], [4, 5, 9]], "1": [[0, 0, 10], [0, 0, 11], [0, 0, 12], [4, 5, 13]]}]
    assert column(steps, "free_after_schedule") == [14, 6, 9]
    assert column(steps, "free") == [14, 6, 19]


def test_a_request_that_can_never_be_admitted_stops_with_one_line():
    """Gemma-3: 3 full + 5 × 3 sliding blocks for a 40-token prompt > 15 usable (S4): one line, as the driver."""
    with pytest.raises(ConfigError, match="can never be admitted"):
        run(resolve_model(str(TINY / "gemma3.json")), [Request(0, 40, 6, arrival_step=0)],
            num_blocks=16, block_size=16, max_num_batched_tokens=32, max_num_seqs=4, max_model_len=512)


SPECS = {"uniform": [("full", 16, 0)], "sliding": [("sliding", 16, 20), ("full", 16, 0)],
         "chunked": [("chunked", 16, 32), ("full", 16, 0)], "mamba": [("mamba", 512, 0), ("full", 32, 0)]}


@settings(max_examples=60, deadline=None)
@given(shape=st.sampled_from(sorted(SPECS)), caching=st.booleans(), priority=st.booleans(),
       blocks=st.integers(24, 60), budget=st.sampled_from([16, 32, 64]), seqs=st.integers(1, 6),
       reqs=st.lists(st.tuples(st.integers(1, 100), st.integers(1, 30), st.integers(0, 20), st.integers(0, 2)),
                     min_size=1, max_size=8))
def test_random_workloads_conserve_blocks_and_are_deterministic(shape, caching, priority, blocks, budget, seqs, reqs):
    """Every step: free blocks + blocks held (each distinct block once, its ref count = its tables) = usable
    blocks; never more held than the pool; the null block never free; same inputs, same steps."""
    # under prefix caching vLLM's Mamba block is the attention block ("align"), and a shared prefix spans one
    specs = [("mamba", 32, 0), ("full", 32, 0)] if caching and shape == "mamba" else SPECS[shape]
    share = 40 if shape == "mamba" else 20
    cfg = VllmSettings(num_blocks=blocks, max_num_batched_tokens=budget, max_num_seqs=seqs, max_model_len=512,
                       policy="priority" if priority else "fcfs", enable_prefix_caching=caching)
    requests = [SimpleNamespace(id=i, max_new_tokens=g, arrival_step=a, priority=pr)
                for i, (p, g, a, pr) in enumerate(reqs)]
    ids = [[7] * min(p, share) + [1000 + i] * max(p - share, 0) for i, (p, *_rest) in enumerate(reqs)]

    def checked(sched: VllmScheduler) -> None:
        held: dict[int, int] = {}
        for g in sched.groups:
            for table in g.tables.values():
                for b in table:
                    if b:
                        held[b] = held.get(b, 0) + 1
        pool = sched.pool
        assert 0 not in pool.free_queue and not set(held) & set(pool.free_queue)
        assert all(pool.ref[b] == n for b, n in held.items())
        cached_free = [b for b in pool.free_queue if pool.ref[b]]
        assert not cached_free
        assert len(held) + pool.num_free() == blocks - 1

    try:
        first = simulate_steps(specs, cfg, requests, ids, max_steps=5_000, check=checked)
    except ConfigError as err:
        assert "never be admitted" in str(err)
        return
    assert first == simulate_steps(specs, cfg, requests, ids, max_steps=5_000)
    assert first[-1]["free"] == blocks - 1 and not first[-1]["running"] and not first[-1]["waiting"]


@pytest.mark.parametrize("argv, message", [
    ([], "exactly one of --trace W.csv and --random N"),
    (["--random", "100000"], "--random must be in 1..500"),
    (["--random", "3"], "run `simkv setup vllm`"),
])
def test_validate_runtime_vllm_bad_input_is_one_line_exit_2(argv, message, tmp_path):
    """Bad input and a missing side venv: one line on stderr, exit 2, nothing on stdout."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "SIMKV_VLLM_VENV": str(tmp_path / "none"), "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--runtime", "vllm", *argv], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2 and not done.stdout
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr

"""The real vLLM V1 scheduler (0.33.0, side venv built by ``simkv setup vllm``) on hand-made cases whose every step
was worked out beforehand from vLLM's source (docs/research/vllm-scheduler.md, rules S1–S9, K1–K8).

Each test's docstring is the derivation; the test runs the real scheduler through :mod:`simkv.validate.vllm`
and compares every step. Skipped, with the reason, where the side venv is not built. The setup command and
the missing-venv error are tested without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simkv.errors import ConfigError
from simkv.hfconfig import resolve_model
from simkv.serving.requests import Request
from simkv.validate.genai.runner import prompt_token_ids
from simkv.validate.vllm.compare import random_workload
from simkv.validate.vllm.env import SETUP_COMMAND, is_built
from simkv.validate.vllm.real import SchedulerSettings, job, run_jobs

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "simkv" / "data" / "configs" / "tiny"

needs_vllm = pytest.mark.skipif(not is_built(), reason=f"the vLLM side venv is not built (`{SETUP_COMMAND}`)")
pytestmark = pytest.mark.vllm


def uniform():
    return resolve_model("custom", layers=2, heads=4, kv_heads=2, head_dim=16)


#: Every case that runs the real scheduler, by name: (model, requests, settings, token-id seed). They all run in
#: one start of the side venv's Python (:func:`run_jobs`: vLLM imported once, not once per case).
CASES: dict = {}


def case(name, model, requests, seed=0, **settings):
    CASES[name] = (model, requests, SchedulerSettings(**settings), seed)


@pytest.fixture(scope="module")
def real_runs():
    names = list(CASES)
    jobs = [job(m, reqs, prompt_token_ids(reqs, seed), st) for m, reqs, st, seed in (CASES[n] for n in names)]
    return dict(zip(names, run_jobs(jobs)))


def run(real_runs, name):
    answer = real_runs[name]
    if isinstance(answer, Exception):
        raise answer
    return answer


def column(real, name):
    return [s[name] for s in real.steps]


case("chunked", uniform(), [Request(0, 40, 3, arrival_step=0), Request(1, 10, 2, arrival_step=0)],
     num_blocks=20, block_size=16, max_num_batched_tokens=32, max_num_seqs=4)


@needs_vllm
def test_chunked_prefill_across_two_steps_under_the_budget(real_runs):
    """Budget 32 tokens, blocks of 16, 19 usable blocks (block 0 is the null block); request 0 (prompt 40, 3 new)
    and request 1 (prompt 10, 2 new) both arrive at step 0.

    * step 0: running is empty; the waiting loop takes request 0: ``num_new = 40``, capped by the budget to 32
      (S3: chunked prefill); ``allocate_slots`` gives ceil(32/16) = 2 blocks from the free queue's head: [1, 2].
      The budget is 0, so request 1 waits. A partial chunk samples nothing (free 19 − 2 = 17).
    * step 1: running first (S2): request 0 gets the rest, 8 tokens, and a third block [3]; budget 24 left;
      request 1 is admitted whole (10 tokens, block [4]). Both reach their prompt's end and sample (free 15).
    * step 2: one token each; request 1 has its 2 tokens and finishes: block 4 back (free 16).
    * step 3: request 0's third token; it finishes (free 19).
    """
    real = run(real_runs, "chunked")
    assert column(real, "scheduled") == [{"0": 32}, {"0": 8, "1": 10}, {"0": 1, "1": 1}, {"0": 1}]
    assert column(real, "blocks")[:2] == [{"0": [[1, 2]]}, {"0": [[1, 2, 3]], "1": [[4]]}]
    assert column(real, "free") == [17, 15, 16, 19]
    assert column(real, "finished") == [[], [], ["1"], ["0"]]
    assert real.free_at_end == 19


case("preemption", uniform(), [Request(0, 16, 20, arrival_step=0), Request(1, 16, 20, arrival_step=0)],
     num_blocks=5, block_size=16, max_num_batched_tokens=64, max_num_seqs=4)


@needs_vllm
def test_preemption_and_its_recompute(real_runs):
    """4 usable blocks of 16; two requests (prompt 16, 20 new) at step 0; FCFS; budget 64.

    * step 0: both admitted whole (S4: the whole prompt must fit, ``scheduler_reserve_full_isl``): [1] and [2];
      each samples its first token.
    * steps 1–16: at step 1 each needs slots for 17 tokens: a second block, [3] and [4] (free 0); then decode
      to 32 tokens per request.
    * step 17: request 0 needs a slot for token 33: no free block, so the scheduler preempts the last running
      request (S6: ``self.running.pop()``), request 1: its blocks go back in reverse order to the queue's front
      (K3, no prefix caching: LIFO) — [4, 2] — and request 0 takes block 4. Request 1 is back at the waiting
      queue's head with 0 computed tokens (recompute); no waiting request is admitted in a step that preempted.
    * steps 18–19: request 0 decodes to its 20th token and finishes at step 19. Request 1 (16 + 17 = 33 tokens)
      needs 3 blocks to be admitted whole; 1 is free, so it waits.
    * step 20: request 0's blocks [1, 3, 4] went back as [4, 3, 1] before [2]: request 1 resumes (S8), recomputes
      its 33 tokens in one chunk into [4, 3, 1] and samples its 18th token; it finishes at step 22.
    """
    real = run(real_runs, "preemption")
    sched = column(real, "scheduled")
    assert sched[0] == {"0": 16, "1": 16} and sched[1] == {"0": 1, "1": 1}
    assert column(real, "blocks")[1] == {"0": [[1, 3]], "1": [[2, 4]]}
    preempted = [s["step"] for s in real.steps if s["preempted"]]
    assert preempted == [17] and real.steps[17]["preempted"] == ["1"]
    assert sched[17:20] == [{"0": 1}] * 3
    assert real.steps[17]["blocks"] == {"0": [[1, 3, 4]]}
    assert real.steps[19]["finished"] == ["0"]
    assert sched[20] == {"1": 33} and real.steps[20]["resumed"] == ["1"]
    assert real.steps[20]["blocks"] == {"1": [[4, 3, 1]]}
    assert sched[21:] == [{"1": 1}, {"1": 1}] and real.steps[22]["finished"] == ["1"]
    assert len(real.steps) == 23 and real.free_at_end == 4


case("sliding", resolve_model(str(TINY / "gpt_oss.json")), [Request(0, 40, 3, arrival_step=0)],
     num_blocks=12, block_size=16, max_num_batched_tokens=32, max_num_seqs=4)


@needs_vllm
def test_sliding_group_frees_blocks_to_the_null_block(real_runs):
    """gpt-oss's tiny shape: layers 0, 2 sliding (window 4), 1, 3 full, equal pages: group size 2, so one sliding
    group and one full group (K6), blocks of 16; 11 usable blocks; one request, prompt 40, 3 new, budget 32.

    * step 0: 32 tokens; the sliding group gets [1, 2], then the full group [3, 4] (groups in order; free 7).
    * step 1: ``allocate_slots`` first drops the blocks the window left (K4): after 32 computed tokens
      ``32 − 4 + 1 = 29`` tokens are skipped, 29 // 16 = 1 block: block 1 becomes the null block 0 and goes to
      the queue's front (no prefix caching); the 8 new tokens need a third entry in each table: the sliding group
      takes block 1 again, the full group block 5 → sliding [0, 2, 1], full [3, 4, 5] (free 6).
    * step 2: 40 computed: 37 skipped → 2 blocks: block 2 → null (free 7); the table needs 3 entries for 41
      tokens and has them.
    * step 3: the third token; the request finishes; all 11 free.
    """
    real = run(real_runs, "sliding")
    assert [(g["spec"], g["layers"]) for g in real.groups] == [("SlidingWindowSpec", [0, 2]),
                                                                ("FullAttentionSpec", [1, 3])]
    assert column(real, "scheduled") == [{"0": 32}, {"0": 8}, {"0": 1}, {"0": 1}]
    assert column(real, "blocks") == [{"0": [[1, 2], [3, 4]]}, {"0": [[0, 2, 1], [3, 4, 5]]},
                                      {"0": [[0, 0, 1], [3, 4, 5]]}, {"0": [[0, 0, 1], [3, 4, 5]]}]
    assert column(real, "free") == [7, 6, 7, 11]


case("sliding-prefix", resolve_model(str(TINY / "gpt_oss.json")),
     [Request(0, 40, 2, arrival_step=0, prefix_id="a", prefix_tokens=32),
      Request(1, 40, 2, arrival_step=2, prefix_id="a", prefix_tokens=32)],
     num_blocks=12, block_size=16, max_num_batched_tokens=64, max_num_seqs=4, enable_prefix_caching=True)


@needs_vllm
def test_sliding_group_prefix_hit(real_runs):
    """gpt-oss's tiny shape with prefix caching: group 0 sliding (window 4), group 1 full, blocks of 16, 11 usable;
    two 40-token prompts sharing their first 32 tokens (hashes h0, h1), 2 new tokens each, request 1 at step 2.

    * step 0: request 0 admitted, no hit; sliding [1, 2, 3], full [4, 5, 6] (free 5). ``cache_blocks`` up to
      40 → 32 tokens (``get_num_cacheable_tokens``: the scheduler block's multiple), two full blocks. The full group
      caches 4 (h0) and 5 (h1). The sliding group caches only the ``cdiv(4 − 1, 16) = 1`` block ending at the
      replay boundary ``39 // 16 = 2`` (``reachable_block_mask``, retention 0): block 2 (h1); block 1 stays unhashed.
    * step 1: 40 computed → 37 skipped tokens → 2 blocks leave the window: freed as [2, 1] (walking back): 2 is
      cached → the queue's tail, 1 → its front; sliding [0, 0, 3]. The request samples its 2nd token and finishes:
      sliding [3] (null head trimmed) to the front, full [6, 5, 4]: 6 to the front, 5 and 4 (cached) to the tail →
      queue 6, 3, 1, 7 … 11, 2, 5, 4 (free 11).
    * step 2: request 1's lookup, max 39 tokens (``HybridKVCacheCoordinator.find_longest_cache_hit``, full first):
      full hits h0 → 4, h1 → 5: 32 tokens; the sliding group, max 32 tokens = 2 blocks, scans from the right: h1 →
      block 2, one contiguous block is enough → [null, 2], 32 tokens; one pass (one full + one other spec). Hit 32
      tokens, 8 scheduled. ``add_local_computed_blocks``: 32 − 4 + 1 = 29 skipped tokens = 1 block: the sliding
      table is [0, 2] (block 2 touched out of the queue), the full one [4, 5]; one new block each from the queue's
      head: 6 (sliding), 3 (full) → sliding [0, 2, 6], full [4, 5, 3] (free 6).
    * step 3: 40 computed: block 2 leaves the window again (to the tail: cached); the request finishes (free 11).
    """
    real = run(real_runs, "sliding-prefix")
    assert column(real, "scheduled") == [{"0": 40}, {"0": 1}, {"1": 8}, {"1": 1}]
    assert column(real, "hits") == [{"0": 0}, {}, {"1": 32}, {}]
    assert column(real, "blocks") == [{"0": [[1, 2, 3], [4, 5, 6]]}, {"0": [[0, 0, 3], [4, 5, 6]]},
                                      {"1": [[0, 2, 6], [4, 5, 3]]}, {"1": [[0, 0, 6], [4, 5, 3]]}]
    assert column(real, "free") == [5, 11, 6, 11]
    assert_step_exact(real_runs, "sliding-prefix")


case("mamba", resolve_model(str(TINY / "qwen3_next.json")), [Request(0, 40, 3, arrival_step=0)],
     num_blocks=12, block_size=16, max_num_batched_tokens=32, max_num_seqs=4, max_model_len=512)


@needs_vllm
def test_mamba_group_keeps_one_state_page(real_runs):
    """Qwen3-Next's tiny shape: 3 linear-attention layers and 1 full layer. The Mamba page (conv state with
    kernel − 1 columns + recurrent state, fp16) is larger than a 16-token attention page, so the attention block
    grows to 32 tokens and the Mamba page is padded to it (K7). Group size = 1 (3 ≥ 1.5 × 1): three Mamba groups
    and one full group. Without prefix caching the Mamba block size is ``max_model_len`` (512) and
    ``MambaManager`` keeps one block per request (K5). One request, prompt 40, 3 new, budget 32, 11 usable.

    * step 0: 32 tokens: one state block per Mamba group, [1], [2], [3], and ceil(32/32) = 1 full block [4].
    * step 1: 8 tokens: the Mamba tables need ceil(40/512) = 1 entry, have it; the full group a 2nd block [5].
    * steps 2–3: decode to 42 tokens: nothing new; the request finishes at step 3.
    """
    real = run(real_runs, "mamba")
    assert [(g["spec"], g["layers"], g["block_size"]) for g in real.groups] == [
        ("MambaSpec", [0], 512), ("MambaSpec", [1], 512), ("MambaSpec", [2], 512), ("FullAttentionSpec", [3], 32)]
    assert len({g["page_size_bytes"] for g in real.groups}) == 1  # the Mamba page padded to the attention page
    assert column(real, "scheduled") == [{"0": 32}, {"0": 8}, {"0": 1}, {"0": 1}]
    assert column(real, "blocks") == [{"0": [[1], [2], [3], [4]]}] + [{"0": [[1], [2], [3], [4, 5]]}] * 3
    assert column(real, "free") == [7, 6, 6, 11]


case("mamba-prefix", resolve_model(str(TINY / "qwen3_next.json")),
     [Request(0, 70, 2, arrival_step=0, prefix_id="a", prefix_tokens=64),
      Request(1, 70, 2, arrival_step=0, prefix_id="a", prefix_tokens=64)],
     num_blocks=20, block_size=16, max_num_batched_tokens=128, max_num_seqs=4, max_model_len=512,
     enable_prefix_caching=True)


@needs_vllm
def test_mamba_group_prefix_hit_and_its_aligned_chunk(real_runs):
    """Qwen3-Next's tiny shape with prefix caching: vLLM sets ``mamba_cache_mode="align"`` and the Mamba block to
    the attention block (``MambaModelConfig.verify_and_update_config``), 32 tokens (K7): groups g0–g2 Mamba, g3
    full, blocks of 32, 19 usable. Two 70-token prompts sharing their first 64 tokens (h0, h1), both at step 0,
    2 new each, budget 128.

    * step 0: request 0, no hit, 70 tokens asked. ``_mamba_block_aligned_split``: the last cacheable boundary
      ``(70 − 1) // 32 × 32 = 64`` lies inside the chunk → 64 tokens. Admission counts ≤ 1 new block per Mamba
      group (``get_num_blocks_to_allocate``, "align"). ``allocate_new_blocks`` for 64 tokens: 2 entries, a null
      then one new block: g0 [0, 1], g1 [0, 2], g2 [0, 3]; g3 [4, 5] (free 14). ``cache_blocks`` up to 64: g3
      caches 4, 5; a Mamba group only the state block ending at the replay boundary ``69 // 32 × 32 = 64``
      (``reachable_block_mask``, retention 0): block index 1 → 1, 2, 3, recorded in ``cached_blocks_this_step``.
      Request 1 looks up 69 tokens: g3 hits h0, h1 (64); the Mamba groups scan from the right: h1 → [0, 1],
      [0, 2], [0, 3] (64). Hit 64, 6 to schedule, but the hit's state was cached this step: vLLM counts
      ``num_gpu_blocks + 1`` blocks → not admitted (the state is written by this step's forward).
    * step 1: ``new_step_starts`` clears that set. Request 0: 6 tokens (starts on a boundary, ends the prompt: no
      cut); ``remove_skipped_blocks(64)`` retires index 0 (a null); a 3rd entry: g0 [0, 1, 6], g1 [0, 2, 7],
      g2 [0, 3, 8], g3 [4, 5, 9]; ``last_state_block_idx`` = 1. Request 1: the same hit of 64 (blocks 1, 2, 3 and
      4, 5 touched, now shared), 6 tokens: g0 [0, 1, 10], g1 [0, 2, 11], g2 [0, 3, 12], g3 [4, 5, 13] (free 6).
      Both sample their 1st token.
    * step 2: one token each. ``remove_skipped_blocks(70)`` retires index 1: request 0's release of 1, 2, 3 only
      drops a reference; request 1's frees them (hashed → the queue's tail): free 9 after scheduling. Both
      finish: 6, 7, 8, 9 and 10, 11, 12, 13 (unhashed) to the front, 4 and 5 (hashed) to the tail once the
      second table lets go (free 19).
    """
    real = run(real_runs, "mamba-prefix")
    assert [(g["spec"], g["block_size"]) for g in real.groups] == [("MambaSpec", 32)] * 3 + [("FullAttentionSpec", 32)]
    assert column(real, "scheduled") == [{"0": 64}, {"0": 6, "1": 6}, {"0": 1, "1": 1}]
    assert column(real, "hits") == [{"0": 0}, {"1": 64}, {}]
    assert column(real, "blocks") == [
        {"0": [[0, 1], [0, 2], [0, 3], [4, 5]]},
        {"0": [[0, 1, 6], [0, 2, 7], [0, 3, 8], [4, 5, 9]], "1": [[0, 1, 10], [0, 2, 11], [0, 3, 12], [4, 5, 13]]},
        {"0": [[0, 0, 6], [0, 0, 7], [0, 0, 8], [4, 5, 9]], "1": [[0, 0, 10], [0, 0, 11], [0, 0, 12], [4, 5, 13]]}]
    assert column(real, "free_after_schedule") == [14, 6, 9]
    assert column(real, "free") == [14, 6, 19]
    assert_step_exact(real_runs, "mamba-prefix")


case("prefix", uniform(), [Request(0, 40, 2, arrival_step=0, prefix_id="a", prefix_tokens=32),
                           Request(1, 40, 2, arrival_step=2, prefix_id="a", prefix_tokens=32)],
     num_blocks=10, block_size=16, max_num_batched_tokens=64, max_num_seqs=4, enable_prefix_caching=True)


@needs_vllm
def test_prefix_hit_and_the_eviction_order_of_cached_blocks(real_runs):
    """Prefix caching on, blocks of 16, 9 usable; requests 0 (arrives at step 0) and 1 (step 2) share their first
    32 prompt tokens, then differ; prompt 40, 2 new each; budget 64.

    * step 0: request 0 whole: [1, 2, 3]; blocks 1 and 2 are full and get their hashes (K2: cached when full).
    * step 1: its 2nd token; it finishes. Freed in reverse order (K3): block 3 has no hash → the queue's front;
      2 and 1 are cached → the tail, in that order. Free 9: [3, 4, …, 9, 2, 1].
    * step 2: request 1 looks up its block hashes (S5): blocks 1 and 2 hit (32 tokens; at most 39 = prompt − 1
      could); they leave the free queue (``touch``), and the 8 new tokens take the queue's head, block 3:
      [1, 2, 3]; free 9 − 3 = 6.
    * step 3: its 2nd token; it finishes (free 9).
    """
    real = run(real_runs, "prefix")
    assert column(real, "scheduled") == [{"0": 40}, {"0": 1}, {"1": 8}, {"1": 1}]
    assert column(real, "hits") == [{"0": 0}, {}, {"1": 32}, {}]
    assert column(real, "blocks") == [{"0": [[1, 2, 3]]}, {"0": [[1, 2, 3]]}, {"1": [[1, 2, 3]]}, {"1": [[1, 2, 3]]}]
    assert column(real, "free") == [6, 9, 6, 9]


case("never-admitted", resolve_model(str(TINY / "gemma3.json")), [Request(0, 40, 6, arrival_step=0)],
     num_blocks=16, block_size=16, max_num_batched_tokens=32, max_num_seqs=4, max_model_len=512)


@needs_vllm
def test_a_request_that_can_never_be_admitted_stops_with_one_line(real_runs):
    """Gemma-3's tiny shape: 5 sliding groups of one layer and a full one; a 40-token prompt needs 3 full blocks
    + 5 × 3 sliding blocks to be admitted whole (S4) > 15: vLLM would wait forever; the driver stops."""
    with pytest.raises(ConfigError, match="can never be admitted"):
        run(real_runs, "never-admitted")


def test_the_job_maps_simkv_specs_to_vllm_specs():
    """Per-layer specs (no venv needed): MLA as its latent, sliding with its window, Mamba padded to the page."""
    ids = [[5] * 10]
    reqs = [Request(0, 10, 1, arrival_step=0)]
    ds = job(resolve_model(str(TINY / "deepseek_v3.json")), reqs, ids, SchedulerSettings())
    assert {layer["kind"] for layer in ds["layers"]} == {"mla"}
    assert ds["layers"][0]["num_kv_heads"] == 1 and ds["layers"][0]["head_size"] == 32 + 8
    oss = job(resolve_model(str(TINY / "gpt_oss.json")), reqs, ids, SchedulerSettings())
    assert [layer["kind"] for layer in oss["layers"]] == ["sliding", "full", "sliding", "full"]
    assert oss["layers"][0]["window"] == 4
    qn = job(resolve_model(str(TINY / "qwen3_next.json")), reqs, ids, SchedulerSettings(max_model_len=512))
    mamba = [layer for layer in qn["layers"] if layer["kind"] == "mamba"]
    assert qn["block_size"] == 32 and all(m["block_size"] == 512 for m in mamba)
    assert all(m["page_size_padded"] == 32 * 2 * 2 * 16 * 2 for m in mamba)  # 32 tokens × K+V × 2 heads × 16 × fp16
    with pytest.raises(ConfigError, match="arrival_step"):
        job(uniform(), [Request(0, 10, 1)], ids, SchedulerSettings())


def test_missing_venv_is_one_line_naming_the_setup_command(tmp_path):
    """Without the side venv, using it is one line naming ``simkv setup vllm``; ``--where`` says where it goes."""
    env = {**os.environ, "SIMKV_VLLM_VENV": str(tmp_path / "none"), "PYTHONPATH": str(ROOT)}
    code = ("from simkv.validate.vllm.env import require\n"
            "try:\n    require()\nexcept Exception as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip()
    assert len(out.splitlines()) == 1 and f"run `{SETUP_COMMAND}`" in out and str(tmp_path / "none") in out
    where = subprocess.run([sys.executable, "-m", "simkv.cli", "setup", "vllm", "--where"], env=env,
                           capture_output=True, text=True)
    assert where.returncode == 0 and where.stdout.strip() == f"{tmp_path / 'none'} (not built)"


SHAPES = ["custom", "gpt_oss", "llama4", "deepseek_v3", "qwen3_next"]


def compared_case(name, model, reqs, **settings):
    """A random workload's case, its pool twice the longest request's blocks (requests preempt each other)."""
    from simkv.validate.vllm.compare import fitting_pool

    base = SchedulerSettings(**{"num_blocks": 2, "block_size": 16, "max_num_batched_tokens": 32, "max_num_seqs": 4,
                                "max_model_len": 512, **settings})
    case(name, model, reqs, seed=5, **{**base.__dict__, "num_blocks": fitting_pool(model, reqs, base)})


def shape_model(shape):
    return uniform() if shape == "custom" else resolve_model(str(TINY / f"{shape}.json"))


for _shape in SHAPES:
    compared_case(f"random-{_shape}", shape_model(_shape), random_workload(8, 5, False))
# The priority policy (random priorities 0..3: preemption takes the lowest-priority running request, the waiting
# queue is a heap) and the long-prefill threshold (prompt chunks of at most 24 tokens while several prefill).
compared_case("random-priority", uniform(), random_workload(12, 7, False, priorities=True), policy="priority")
compared_case("random-long-prefill", shape_model("gpt_oss"), random_workload(12, 8, False),
              long_prefill_token_threshold=24)
# Prefix caching beside sliding, chunked and Mamba groups (two shared prefixes: hits, the sliding group's sparse
# caching at the replay boundary and the shared-prefix junction, the Mamba groups' block-aligned chunks).
#: Workload seed per shape: one whose two prefixes do hit (with 32-token blocks, Qwen3-Next's seed 9 never hits).
PREFIX_SHAPES = {"gpt_oss": 9, "llama4": 9, "qwen3_next": 10}
for _shape, _seed in PREFIX_SHAPES.items():
    compared_case(f"random-prefix-{_shape}", shape_model(_shape), random_workload(12, _seed, True),
                  enable_prefix_caching=True)


def assert_step_exact(real_runs, name):
    from simkv.validate.vllm.compare import compare_steps, simulate

    model, reqs, settings, seed = CASES[name]
    result = compare_steps(run(real_runs, name).steps, simulate(model, reqs, prompt_token_ids(reqs, seed), settings))
    assert result["steps_total"] > 0 and result["steps_mismatched"] == 0, result["first_mismatches"][:2]
    return result


@needs_vllm
@pytest.mark.parametrize("shape", SHAPES)
def test_simkv_scheduler_matches_the_real_one_step_by_step(real_runs, shape):
    """A small random workload per model shape (full, sliding + full, chunked + full, MLA, Mamba hybrid) through
    the real scheduler and simkv's ``--scheduler vllm``: every step equal (tokens, preemptions, block ids per group,
    free blocks, finished, queues). A pool of twice the longest request's blocks makes requests preempt."""
    assert_step_exact(real_runs, f"random-{shape}")


@needs_vllm
@pytest.mark.parametrize("shape", list(PREFIX_SHAPES))
def test_prefix_caching_beside_window_groups_matches_the_real_one(real_runs, shape):
    """Prefix caching beside a sliding group (gpt-oss), chunked groups (Llama-4) and Mamba groups (Qwen3-Next,
    ``mamba_cache_mode="align"``): step-exact, hits included, and the case does hit the cache."""
    assert_step_exact(real_runs, f"random-prefix-{shape}")
    assert any(n for s in run(real_runs, f"random-prefix-{shape}").steps for n in s["hits"].values())


@needs_vllm
def test_priority_policy_matches_the_real_one_step_by_step(real_runs):
    """``policy="priority"`` with priorities 0..3: step-exact, and the case does exercise the policy (some step
    preempts, and some request is admitted ahead of an earlier-arrived one of a larger priority value)."""
    assert_step_exact(real_runs, "random-priority")
    steps = run(real_runs, "random-priority").steps
    assert sum(len(s["preempted"]) for s in steps) > 0
    reqs = {str(r.id): r for r in CASES["random-priority"][1]}
    admitted = [rid for s in steps for rid in s["new"]]
    assert any(reqs[a].priority < reqs[b].priority and reqs[a].arrival_step > reqs[b].arrival_step
               for i, a in enumerate(admitted) for b in admitted[i + 1:])


@needs_vllm
def test_long_prefill_threshold_matches_the_real_one_step_by_step(real_runs):
    """``long_prefill_token_threshold=24`` on the sliding + full shape: step-exact, and the threshold binds (some
    step gives a prefilling request exactly 24 tokens while the budget of 32 had room for more)."""
    assert_step_exact(real_runs, "random-long-prefill")
    steps = run(real_runs, "random-long-prefill").steps
    assert any(24 in s["scheduled"].values() and sum(s["scheduled"].values()) < 32 for s in steps)


def test_max_model_len_refuses_a_prompt_as_vllms_input_processor_does():
    """``InputProcessor._validate_prompt_len`` (vLLM 0.33.0): a prompt longer than ``max_model_len`` is refused, and
    one of exactly ``max_model_len`` tokens too (no room for an output token); 511 tokens with 100 new is
    admitted (the scheduler stops it at 512). No venv needed: the job is refused before the driver starts."""
    for prompt in (512, 600):
        with pytest.raises(ConfigError, match="longer than the maximum model length of 512"):
            job(uniform(), [Request(0, prompt, 1, arrival_step=0)], [[5] * prompt], SchedulerSettings(max_model_len=512))
    ok = job(uniform(), [Request(0, 511, 100, arrival_step=0)], [[5] * 511], SchedulerSettings(max_model_len=512))
    assert ok["requests"][0]["max_new_tokens"] == 100

"""Paged serving (GenAI continuous batching): golden block ids/counts derived by hand, invariants,
fast planned runs = the step-by-step reference.

Rules (DESIGN §4b; openvino.genai scheduler.hpp / block_manager.hpp, cited in simkv/serving):
decode tokens first, then prompt chunks within max_num_batched_tokens; blocks from a FIFO free
list (ids 0..N-1 in order, freed blocks to the back, a sequence's blocks freed first to last);
blocks_used read after scheduling, before finished requests are freed; preemption by recompute
of the last request holding processed tokens; a step that schedules nothing ignores everyone.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simkv.cost import get_device
from simkv.lab.traces import AZURE_CONV
from simkv.models import custom_model
from simkv.precision import get_precision
from simkv.serving import Request
from simkv.serving.engine.core import PagedServing
from simkv.serving.sched.config import SchedulerConfig
from simkv.serving.sched.group import FINISHED, IGNORED, REJECTED, UNFINISHED

MODEL = custom_model(layers=2, heads=2, head_dim=8)
PREC = get_precision("f16")
DEVICE = get_device("xeon-8480")


def run(requests, fast=False, observe=None, block_bytes=1000, device=DEVICE, **cfg):
    eng = PagedServing(requests, MODEL, PREC, SchedulerConfig(**cfg), device=device, weights_bytes=0,
                       device_memory=10**12, block_bytes=block_bytes, observe=observe, stall_steps=200)
    groups, steps, _, _ = eng.run(fast=fast)
    return eng, {g.req.id: g for g in groups}, steps


def tables_by_step(requests, **cfg):
    seen = {}

    def observe(step, eng, live):
        seen[step] = {g.req.id: [list(t) for t in g.tables] for g in live}

    eng, groups, steps = run(requests, observe=observe, **cfg)
    return eng, groups, steps, seen


def test_fifo_block_ids_and_counts():
    # Pool of 6 blocks of 4 tokens. A: P=6, G=3; B: P=3, G=2 at step 0; C: P=5, G=2 at step 2.
    # step 0: prompts A (6 tok -> blocks 0,1), B (3 tok -> 2); used 3; both sample their 1st token.
    # step 1: A ctx 7 (2 blocks), B ctx 4 (1 block); used 3; B has 2 tokens -> FINISHED, frees 2:
    #         free list 3,4,5,2.
    # step 2: C added; A ctx 8 (2 blocks); C prompt 5 tok -> pops 3,4; used 4; A FINISHED, frees 0,1
    #         (first to last): free list 5,2,0,1.
    # step 3: C ctx 6 (2 blocks); used 2; C FINISHED: free list 5,2,0,1,3,4.
    reqs = [Request(0, 6, 3, arrival_step=0), Request(1, 3, 2, arrival_step=0), Request(2, 5, 2, arrival_step=2)]
    eng, groups, steps, seen = tables_by_step(reqs, block_size=4, num_kv_blocks=6)
    assert steps["blocks_used"].tolist() == [3, 3, 4, 2]
    assert steps["requests"].tolist() == [2, 2, 2, 1]
    assert steps["scheduled_requests"].tolist() == [2, 2, 2, 1]
    assert seen[0] == {0: [[0, 1]], 1: [[2]]}
    assert seen[2] == {0: [[0, 1]], 2: [[3, 4]]}
    assert list(eng.pool.free) == [5, 2, 0, 1, 3, 4]
    assert all(g.status == FINISHED and g.generated == g.G for g in groups.values())


def test_preemption_partial_then_full_then_ignored():
    # Pool of 4 blocks of 4 tokens. A: P=8, G=10; B: P=7, G=10, both at step 0.
    # step 0: A -> blocks 0,1; B -> 2,3 (used 4).
    # step 1: A ctx 9 needs a 3rd block, none free: victim = last request with processed tokens = B;
    #         B holds 2 blocks > 1 needed -> partial: its last block (3) freed, 7 % 4 = 3 tokens
    #         preempted (processed 7 -> 4); A takes block 3.  B waits this step. used 4.
    # steps 2-4: B (can generate: it had processed its prompt) wants 3 tokens -> 2 blocks, 0 free;
    #         the only victim with tokens after it is itself -> not scheduled.
    # step 5: A ctx 13 needs a 4th block: victim B holds 1 block, not more than the 1 needed ->
    #         full preemption (block 2 freed, processed 0); A takes block 2.
    # steps 6-8: A decodes (ctx 14..16, 4 blocks); B needs 2 blocks, victim search finds A (earlier) -> no.
    # step 9: A ctx 17 needs a 5th block: no victim after it; B cannot fit either: nothing scheduled ->
    #         both IGNORED. A has generated 9 tokens (steps 0..8), B 1.
    reqs = [Request(0, 8, 10, arrival_step=0), Request(1, 7, 10, arrival_step=0)]
    eng, groups, steps, seen = tables_by_step(reqs, block_size=4, num_kv_blocks=4)
    assert len(steps) == 10
    assert steps["blocks_used"].tolist() == [4] * 10
    assert steps["scheduled_requests"].tolist() == [2] + [1] * 8 + [0]
    assert steps["preemptions"].tolist() == [0, 1, 0, 0, 0, 1, 0, 0, 0, 0]
    assert seen[1] == {0: [[0, 1, 3]], 1: [[2]]}
    assert seen[5] == {0: [[0, 1, 3, 2]], 1: [[]]}
    a, b = groups[0], groups[1]
    assert (a.status, a.generated, b.status, b.generated, b.preemptions) == (IGNORED, 9, IGNORED, 1, 2)


def test_prefix_caching_restores_full_blocks_of_a_finished_request():
    # Blocks of 4, pool 8. A: ids 1..10, G=2 at step 0: blocks 0,1,2 (hashes of 1-4, 1-8, 1-10).
    # step 1: A ctx 11 -> FINISHED; its blocks keep their hashes in the overwritable store (free).
    # step 2: idle (nothing live): used 0.
    # step 3: B (ids 1..8, 20, 21) restores 1-4 and 1-8 (blocks 0, 1); 1..9/1..10 with 20 are not
    #         cached -> processed 8, prefix hit 8; its chunk of 2 tokens needs a 3rd block: the
    #         free list's front, 3. used 3.  step 4: B ctx 11, FINISHED.
    ids_a = tuple(range(1, 11))
    ids_b = tuple(range(1, 9)) + (20, 21)
    reqs = [Request(0, 10, 2, arrival_step=0, token_ids=ids_a), Request(1, 10, 2, arrival_step=3, token_ids=ids_b)]
    eng, groups, steps, seen = tables_by_step(reqs, block_size=4, num_kv_blocks=8, enable_prefix_caching=True)
    assert steps["blocks_used"].tolist() == [3, 3, 0, 3, 3]
    assert seen[0] == {0: [[0, 1, 2]]}
    assert seen[3] == {1: [[0, 1, 3]]}
    assert groups[1].prefix_hit == 8
    assert steps["scheduled_tokens"].tolist() == [10, 1, 0, 2, 1]


def test_prefix_caching_fully_matched_prompt_recomputes_its_last_token():
    # Same 8-token prompt twice (blocks of 4): the second restores both blocks (8 tokens = the whole
    # prompt) and recomputes token 8 (processed 7): 1 scheduled token, no new block.
    ids = tuple(range(100, 108))
    reqs = [Request(0, 8, 1, arrival_step=0, token_ids=ids), Request(1, 8, 1, arrival_step=2, token_ids=ids)]
    eng, groups, steps, seen = tables_by_step(reqs, block_size=4, num_kv_blocks=8, enable_prefix_caching=True)
    assert groups[1].prefix_hit == 8
    assert steps["scheduled_tokens"].tolist() == [8, 0, 1]
    assert seen[2] == {1: [[0, 1]]}


def test_samples_share_the_prompt_blocks():
    # DESIGN §4b: multinomial n samples use floor(P/32) + n*(ceil((P+g)/32) - floor(P/32)) blocks.
    # P=40, n=3, blocks of 32: step 0 prompt (one sequence, 2 blocks); after it the 3 sequences
    # share blocks 0,1; step 1 each writes token 41 into the shared partial block 1 -> 2 copies
    # (copy-on-write): 1 + 3*(2-1) = 4 blocks, and so on while ceil((40+g)/32) = 2.
    reqs = [Request(0, 40, 5, arrival_step=0, samples=3)]
    eng, groups, steps, seen = tables_by_step(reqs, block_size=32, num_kv_blocks=10)
    assert steps["blocks_used"].tolist() == [2, 4, 4, 4, 4]
    assert seen[1] == {0: [[0, 2], [0, 3], [0, 1]]} or seen[1] == {0: [[0, 1], [0, 2], [0, 3]]} \
        or sorted(t[1] for t in seen[1][0]) == [1, 2, 3]
    assert steps["copy_bytes"].tolist()[1] == 2 * 1000  # two 1000-byte blocks copied


def test_dynamic_pool_initial_size_and_growth_by_eight_blocks():
    # Dynamic pool, blocks of 32: first sized ceil(min(2*40, 40+60)/32) = ceil(80/32) = 3 blocks.
    # Decode: ctx at step k is 40+k; a 4th block is needed when 40+k > 96, k = 57: the pool grows
    # by 256/32 = 8 blocks to 11 (one reallocation: 2 tensors per layer copied).
    reqs = [Request(0, 40, 60, arrival_step=0)]
    eng, groups, steps, _ = tables_by_step(reqs, block_size=32)
    total = steps["blocks_total"]
    assert total[:57].tolist() == [3] * 57 and total[57:].tolist() == [11] * 3
    rows = eng.ledger.rows
    copies = rows[rows["op"] == 1]
    assert set(copies["step"].tolist()) == {57}
    assert len(copies) == 2 * MODEL.layers
    assert int(copies["bytes"].sum()) == 3 * 1000
    assert steps["copy_bytes"][57] == 3 * 1000
    # the copy is in the step's time: step 57 is slower than its neighbours
    assert steps["step_s"][57] > steps["step_s"][56]


def test_vllm_mode_whole_prompts_within_max_num_seqs():
    # dynamic_split_fuse off: whole prompts while fewer than max_num_seqs (2) can generate;
    # a step that schedules prompts runs no decode.  A, B, C: P=10, G=3 at step 0, budget 64.
    # step 0: A, B prompts (2 running -> C must wait).  steps 1, 2: A, B decode; finish at step 2.
    # step 3: C's prompt; steps 4, 5: C decodes.
    reqs = [Request(i, 10, 3, arrival_step=0) for i in range(3)]
    eng, groups, steps, _ = tables_by_step(reqs, block_size=4, num_kv_blocks=20, dynamic_split_fuse=False,
                                           max_num_seqs=2, max_num_batched_tokens=64)
    assert steps["scheduled_tokens"].tolist() == [20, 2, 2, 10, 1, 1]
    assert groups[2].first_token_step == 3


# -- invariants --------------------------------------------------------------------------------------

@st.composite
def workloads(draw):
    n = draw(st.integers(1, 6))
    reqs, step = [], 0
    for i in range(n):
        step += draw(st.integers(0, 3))
        prefix = draw(st.booleans())
        P = draw(st.integers(1, 60))
        reqs.append(Request(i, P, draw(st.integers(1, 40)), arrival_step=step,
                            samples=draw(st.sampled_from([1, 1, 2, 3])),
                            prefix_id="sys" if prefix else None, prefix_tokens=min(P, 9) if prefix else 0))
    cfg = dict(block_size=draw(st.sampled_from([4, 8, 32])),
               num_kv_blocks=draw(st.sampled_from([0, 3, 6, 12, 40])),
               max_num_batched_tokens=draw(st.sampled_from([16, 64, 256])),
               dynamic_split_fuse=draw(st.booleans()),
               enable_prefix_caching=draw(st.booleans()),
               on_oom=draw(st.sampled_from(["preempt", "wait", "reject"])))
    if not cfg["dynamic_split_fuse"]:
        cfg["max_num_batched_tokens"] = 256
    return reqs, cfg


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_paged_invariants(case):
    reqs, cfg = case

    def observe(step, eng, live):
        eng.pool.check()  # every block exactly one of: free list, overwritable store, referenced
        held = set()
        for g in live:
            for t in g.tables:
                held.update(t)
        assert all(eng.pool.ref[b] > 0 for b in held)
        assert eng.pool.used() + eng.pool.num_free() == eng.pool.total

    eng, groups, steps = run(reqs, observe=observe, **cfg)
    # UNFINISHED: requests that preempt each other forever (a sample group larger than a fixed pool;
    # the real pipeline never finishes them either) are stopped after 200 steps without a token here
    ok = {FINISHED, IGNORED, UNFINISHED} | ({REJECTED} if cfg["on_oom"] == "reject" else set())
    assert all(g.status in ok for g in groups.values())
    assert all(g.generated == g.G for g in groups.values() if g.status == FINISHED)
    assert (steps["blocks_used"] <= steps["blocks_total"]).all()
    # byte conservation: the pool's ledger leaves exactly the final pool allocated
    rows = eng.ledger.rows
    net = int(rows["bytes"][rows["op"] == 0].sum() - rows["bytes"][rows["op"] == 2].sum())
    assert net == steps["allocated_bytes"][-1] == eng.pool.total * 1000
    # used + reserved + internal account for the allocation
    assert (steps["used_bytes"] + steps["reserved_bytes"] + steps["internal_bytes"] == steps["allocated_bytes"]).all()
    # determinism, and the planned runs equal the reference
    eng2, groups2, steps2 = run(reqs, fast=True, **cfg)
    assert np.array_equal(steps, steps2)
    assert eng.ledger == eng2.ledger
    assert [(g.status, g.generated, g.first_token_s, g.finish_s) for g in groups.values()] == \
        [(g.status, g.generated, g.first_token_s, g.finish_s) for g in groups2.values()]


@st.composite
def timed_workloads(draw):
    """Arrivals in seconds (a step is ~0.5 ms here), so they join planned runs at steps found from the times."""
    n = draw(st.integers(1, 14))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0002, 0.0007, 0.0013, 0.004, 0.02]))
        reqs.append(Request(i, draw(st.integers(1, 90)), draw(st.integers(1, 50)), arrival_s=t,
                            samples=draw(st.sampled_from([1, 1, 1, 2]))))
    cfg = dict(block_size=draw(st.sampled_from([4, 8, 32])), num_kv_blocks=draw(st.sampled_from([0, 6, 12, 40, 400])),
               max_num_batched_tokens=draw(st.sampled_from([16, 64, 256])), on_oom=draw(st.sampled_from(["preempt", "wait"])))
    return reqs, cfg


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timed_workloads())
def test_fast_equals_reference_with_timed_arrivals(case):
    reqs, cfg = case
    a, ga, sa = run(reqs, fast=False, **cfg)
    b, gb, sb = run(reqs, fast=True, **cfg)
    assert np.array_equal(sa, sb) and a.ledger == b.ledger
    assert [(g.status, g.generated, g.added_step, g.first_token_s, g.finish_s) for g in ga.values()] == \
        [(g.status, g.generated, g.added_step, g.first_token_s, g.finish_s) for g in gb.values()]


def test_fast_equals_reference_when_arrivals_join_runs():
    # Arrivals join planned runs (many per run), and a run must stop before an arrival that cannot join
    # even where steps are longer than the bound that sized the run: llama-2-7b on an H100, where prefill
    # chunks take twice the weights' streaming time (a bug here once added request 69 ten steps late).
    from simkv.cost import get_device as device_named
    from simkv.models import get_model
    from simkv.scenario import resolve_weights_memory
    from simkv.serving import load_trace

    reqs, model, dev = load_trace(AZURE_CONV, limit=300), get_model("llama-2-7b"), device_named("h100-sxm")
    out = []
    for fast in (False, True):
        eng = PagedServing(reqs, model, get_precision("u8"), SchedulerConfig(), device=dev,
                           weights_bytes=resolve_weights_memory(model, None, None), device_memory=dev.memory_bytes)
        groups, steps, _, _ = eng.run(fast=fast)
        out.append((steps, [(g.added_step, g.first_token_step, g.finish_step) for g in groups], eng))
    (a, ga, _), (b, gb, eng) = out
    assert np.array_equal(a, b) and ga == gb
    assert a[0].tolist() == b[0].tolist() and eng.pool.used() == 0
    assert sum(1 for r in eng.rows if not isinstance(r, tuple)) < 150  # arrivals joined runs: fewer runs than arrivals


@pytest.mark.parametrize("decode_attention, overlap", [(None, True), (1e9, True), (1e9, False)])
def test_fast_equals_reference_on_a_trace_slice(decode_attention, overlap):
    # also with one-token queries at a rate of their own (a CPU's decode attention: simkv.cost), and with
    # attention's reads and arithmetic added rather than overlapped (the CPU plugin's loop)
    from dataclasses import replace

    from simkv.serving import load_trace

    device = DEVICE if decode_attention is None else replace(DEVICE, decode_attention_flops=decode_attention,
                                                             attention_overlap=overlap)
    reqs = load_trace(AZURE_CONV, limit=60)
    a = run(reqs, fast=False, block_size=32, num_kv_blocks=400, device=device)
    b = run(reqs, fast=True, block_size=32, num_kv_blocks=400, device=device)
    assert np.array_equal(a[2], b[2]) and a[0].ledger == b[0].ledger
    assert len(b[2]) > 1000
    if decode_attention is not None:  # the slower decode attention shows in the times
        assert b[2]["time_s"][-1] > run(reqs, fast=True, block_size=32, num_kv_blocks=400)[2]["time_s"][-1]


def test_sliding_window_blocks_genai_keeps_all_vllm_frees_behind_the_window():
    # Window 64, blocks of 16: P=40, G=60; the context after step k is 40 + k.
    # GenAI (docs/DESIGN.md §4c: no freeing behind a window): ceil((40 + k) / 16) blocks, 3 .. 7.
    # vLLM (SlidingWindowManager): after step k the blocks before max(0, c - 64 + 1) // 16 are freed, c = 40 + k;
    # so at step k: ceil((40 + k) / 16) - max(0, k - 24) // 16 blocks: k 0..8 -> 3, k 9..24 -> 4 (ctx 49..64),
    # then with k = 24 + m: 4 + (1 if m % 16 else 0) -> 5, except 4 at m = 16, 32 (k = 40, 56): the window's
    # 63 kept tokens and the new one span 4 blocks exactly when the new token starts a block.
    from dataclasses import replace

    model = replace(MODEL, sliding_window=64)
    out = {}
    for manager in ("genai", "vllm"):
        eng = PagedServing([Request(0, 40, 60, arrival_step=0)], model, PREC,
                           SchedulerConfig(block_size=16, num_kv_blocks=20, kv_manager=manager),
                           device=DEVICE, weights_bytes=0, device_memory=10**12, block_bytes=1000 if manager == "genai" else None)
        _, steps, _, _ = eng.run(fast=False)
        _, fast, _, _ = PagedServing([Request(0, 40, 60, arrival_step=0)], model, PREC,
                                     SchedulerConfig(block_size=16, num_kv_blocks=20, kv_manager=manager), device=DEVICE,
                                     weights_bytes=0, device_memory=10**12,
                                     block_bytes=1000 if manager == "genai" else None).run(fast=True)
        assert np.array_equal(steps, fast)
        assert eng.pool.used() == 0
        out[manager] = steps["blocks_used"].tolist()
    assert out["genai"] == [-(-(40 + k) // 16) for k in range(60)]
    assert out["vllm"] == [3] * 9 + [4] * 16 + [5] * 15 + [4] + [5] * 15 + [4] + [5] * 3


def test_vllm_prompt_in_a_shared_restored_block_waits_for_its_copy():
    """Found by hypothesis in CI: vLLM mode, prefix caching, 3 blocks of 4. Request 3's 2-token prompt is
    the cached 'sys' prefix; its last block is restored, shared with request 2, and has room, so
    can_allocate_tokens counts 0 new blocks — but append_slots must copy the shared block and the pool is
    empty. The request waits for a free block instead of allocating from an exhausted pool."""
    def req(i, prompt, new, step, prefix=None, prefix_tokens=0):
        return Request(id=i, prompt=prompt, max_new_tokens=new, arrival_step=step, prefix_id=prefix,
                       prefix_tokens=prefix_tokens)

    reqs = [req(0, 1, 2, 0), req(1, 1, 2, 0), req(2, 1, 2, 0, "sys", 1), req(3, 2, 1, 1, "sys", 2),
            req(4, 1, 1, 1), req(5, 1, 1, 1)]
    cfg = dict(block_size=4, num_kv_blocks=3, max_num_batched_tokens=256, dynamic_split_fuse=False,
               enable_prefix_caching=True, on_oom="preempt")
    _, groups, _ = run(reqs, **cfg)
    assert {g.status for g in groups.values()} == {FINISHED}

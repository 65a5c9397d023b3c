"""The NPU pipeline (``openvino-npu``: GenAI's stateful pipeline over NPUW's LLMCompiledModel), from its source
(policies/openvino_npu.py). Golden sequences worked out by hand from the rules cited there."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import get_policy
from policies.openvino_npu import PrefixCache
from simkv.cost import get_device
from simkv.errors import ConfigError, PolicyError, SimkvError
from simkv.latency import session_times
from simkv.ledger import OPS, TENSORS
from simkv.memory import replay
from simkv.scenario import build_scenario, simulate
from simkv.shipped import DEVICE_DIR

from conftest import assert_same_run, workloads

NPU_DEVICE = str(DEVICE_DIR / "core-ultra-155h-npu.json")
CHAT = "prefill:700,decode:100,prefill:300,decode:1"


def events(result, step):
    rows = result.ledger.rows
    return [(TENSORS[r["tensor"]], OPS[r["op"]], int(r["bytes"])) for r in rows if r["step"] == step]


def chat(prefix_caching: bool, ops: str = CHAT):
    return build_scenario(model=None, layers=1, heads=4, kv_heads=2, head_dim=64, policy="openvino-npu", ops=ops,
                          policy_options={"max_prompt_len": 2048, "prefill_chunk_size": 512,
                                          "prefix_caching": prefix_caching})


def test_one_chat_turn_with_a_prefix_hit_golden():
    """1 layer, 2 KV heads x 64, f16: 256 B per token of K (and of V).

    MAX_PROMPT_LEN 2048 (aligned to 64: 2048; chunk 512 < 2048: chunked, 2048 is a multiple of it),
    MIN_RESPONSE_LEN 128, G = 1: total 2176, the generate past 2175 tokens: K and V 2175*256 = 556800 B.
    Presents: the generate model's 1 token (256 B), the prefill model's one chunk, 512 tokens (131072 B).
    Prefix blocks of 256 tokens (256 divides 512): 256*256 = 65536 B per K or V.

    Step 0, prefill 700: chunks 512 + 188; only the full chunk is stored: blocks [0, 256) and [256, 512),
    each K then V allocated and filled from the present output.
    Step 1, the first generate step: copy_kvcache — the 512 tokens of the earlier chunk through a staging
    tensor of the prefill past's shape, 2048 - 512 = 1536 tokens (393216 B), the last 188 from the present
    output (48128 B); K, then V.
    Step 101, the turn: GenAI prefills the whole history, 700 + 100 + 300 = 1100 tokens. Blocks 1 and 2 hit,
    the third (ending at token 768) is not cached: 512 tokens restored (a whole chunk: kept), copied into the
    past per block (K, V: 65536 B each); the rest, 588 tokens, in chunks 512 + 76; the full one stored as
    blocks [512, 768) and [768, 1024).
    Step 102: the staged copy of 1100 - 76 = 1024 tokens (262144 B) and the last chunk's 76 (19456 B)."""
    result = simulate(chat(True))
    assert events(result, 0) == [
        ("k", "alloc", 556800), ("v", "alloc", 556800), ("k_present", "alloc", 256), ("v_present", "alloc", 256),
        ("k_present", "alloc", 131072), ("v_present", "alloc", 131072),
        *[(t, op, 65536) for _ in range(2) for t in ("k_block", "v_block") for op in ("alloc", "copy")]]
    staged = lambda past, last, t: [(f"{t}_copy", "alloc", 393216), (f"{t}_copy", "copy", 393216),  # noqa: E731
                                    (t, "copy", past * 256), (f"{t}_copy", "free", 393216), (t, "copy", last * 256)]
    assert events(result, 1) == staged(512, 188, "k") + staged(512, 188, "v")
    assert events(result, 101) == [("k", "copy", 65536), ("v", "copy", 65536)] * 2 + [
        (t, op, 65536) for _ in range(2) for t in ("k_block", "v_block") for op in ("alloc", "copy")]
    assert events(result, 102) == staged(1024, 76, "k") + staged(1024, 76, "v")
    steps = result.steps
    fixed = 2 * 556800 + 2 * 256 + 2 * 131072
    assert steps["steady"][0] == fixed + 4 * 65536 and steps["steady"][101] == fixed + 8 * 65536
    assert steps["peak"][1] == steps["allocated"][1] + 393216  # one staging tensor at a time
    assert steps["used"][101] == 1100 * 512


def test_the_same_turn_without_prefix_caching():
    """No blocks: the turn's 1100 tokens in chunks 512 + 512 + 76, nothing allocated; the first generate step
    stages the 1024 tokens of the earlier chunks as above."""
    result = simulate(chat(False))
    assert events(result, 101) == []
    assert [e for e in events(result, 0) if "block" in e[0]] == []
    assert events(result, 102)[2] == ("k", "copy", 1024 * 256)
    hit, miss = (chat(True).policy.plan(chat(True).workload)[101], chat(False).policy.plan(chat(False).workload)[101])
    assert (hit.calls, len(hit.restored), miss.calls) == (2, 2, 3)


def test_a_hit_saves_prefill_chunks_in_ttft():
    """The turn with a hit runs 2 chunk calls instead of 3 (each the same fixed shape) plus 4 block copies."""
    device = get_device(NPU_DEVICE)
    with_hit = session_times(simulate(chat(True)), device).step_s[101]
    without = session_times(simulate(chat(False)), device).step_s[101]
    assert with_hit < without
    assert with_hit == pytest.approx(without * 2 / 3, rel=0.01)  # the copies are a small part


def test_sizes_npuw_derives():
    default = get_policy("openvino-npu")
    assert (default.chunked, default.prompt_size, default.total, default.presents()) == (False, 1024, 1152, (1, 1024))
    p = get_policy("openvino-npu", {"max_prompt_len": 1000, "min_response_len": 100, "prefill_chunk_size": 256,
                                    "prefix_caching": True, "prefix_block_size": 100, "max_generation_token_len": 3})
    # 1000 -> 1024 (64), a multiple of 256; 100 -> 128; block 100 does not divide 256: the chunk; G 3 -> 8
    assert (p.prompt_size, p.total, p.block, p.generate_tokens, p.presents()) == (1024, 1152, 256, 8, (8, 256))
    assert p.capacity(np.array([5]), np.array([0]))[0] == 1152 - 8
    assert get_policy("openvino-npu", {"max_prompt_len": 2000, "prefill_chunk_size": 1024}).prompt_size == 2048
    with pytest.raises(ConfigError, match="power of 2"):
        get_policy("openvino-npu", {"max_prompt_len": 4096, "prefill_chunk_size": 300})
    with pytest.raises(ConfigError, match="chunked prefill"):
        get_policy("openvino-npu", {"prefix_caching": True})  # 1024-token chunk = the prompt: no chunks
    with pytest.raises(ConfigError, match="BLOCK_BASED"):
        get_policy("openvino-npu", {"block_based_kv_cache": True})


def test_prefix_cache_lru():
    """Two chains A-B and C: full at 3 blocks; storing D (after C) evicts the least recently used leaf."""
    cache = PrefixCache(3)
    assert cache.put(1, 0) == (True, None) and cache.put(2, 1) == (True, None) and cache.put(3, 0) == (True, None)
    assert cache.put(9, 7) == (False, None)  # its parent was never stored
    assert cache.get(3)  # C most recent; the evictable leaves are B (older) and C
    kept, victim = cache.put(4, 3)  # C gets a child: D evicts B, and A becomes a leaf
    assert (kept, victim) == (True, 2) and 2 not in cache and list(cache.evictable) == [1, 4]
    assert cache.put(4, 3) == (False, None)  # already cached: the new copy is dropped


def test_refusals():
    with pytest.raises(PolicyError, match="beam"):
        build_scenario(model="llama-3-8b", policy="openvino-npu", ops="prefill:10,fork:2,decode:3,select:0")
    with pytest.raises(PolicyError, match="MAX_PROMPT_LEN"):
        build_scenario(model="llama-3-8b", policy="openvino-npu", ops="prefill:1000,decode:10,prefill:100")
    with pytest.raises(PolicyError, match="generate model holds"):
        build_scenario(model="llama-3-8b", policy="openvino-npu", ops="prefill:1000,decode:200")
    with pytest.raises(PolicyError, match="full-attention"):
        build_scenario(model="mistral-7b", policy="openvino-npu", ops="prefill:10")


@st.composite
def npu_scenarios(draw):
    ops = draw(workloads(kinds=("decode", "turn", "trim", "reset"), prompt=900, turn=600, decode=200))
    options = {"max_prompt_len": 2048, "min_response_len": 2048, "prefill_chunk_size": draw(st.sampled_from([256, 512, 4096])),
               "prefix_caching": draw(st.booleans()), "prefix_block_size": draw(st.sampled_from([64, 128, 100])),
               "prefix_max_blocks": draw(st.integers(1, 12)), "prefill_hint": draw(st.sampled_from(["dynamic", "static"]))}
    try:
        return build_scenario(model=None, layers=draw(st.integers(1, 3)), heads=4, kv_heads=draw(st.sampled_from([1, 2])),
                              head_dim=16, policy="openvino-npu", policy_options=options, ops=ops,
                              device_memory=draw(st.sampled_from(["16GiB", "2MiB"])))
    except SimkvError:  # over MAX_PROMPT_LEN, prefix caching without chunks
        return draw(st.nothing())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(npu_scenarios())
def test_fast_engine_equals_reference_and_memory_is_conserved(scenario):
    result = simulate(scenario)
    assert_same_run(result, simulate(scenario, engine="reference"))
    live = replay(result.ledger, scenario.device_memory)
    assert sum(live.values()) == result.steps["allocated"][-1]
    assert (result.steps["used"] <= result.steps["steady"]).all()


def test_cli_run_npu_with_a_device_file():
    proc = subprocess.run([sys.executable, "-m", "simkv.cli", "run", "--model", "llama-3-8b", "--policy", "openvino-npu",
                           "--policy-opt", "max_prompt_len=4096", "--policy-opt", "prefix_caching=true",
                           "--ops", "prefill:1500,decode:100,prefill:600,decode:50", "--device", NPU_DEVICE],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout and "openvino-npu" in proc.stdout

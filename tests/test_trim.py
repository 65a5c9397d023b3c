"""A trim (``trim:N``): GenAI's stateful chat cutting the cache back to the history that still matches
(openvino.genai ``align_cache_and_history`` + ``utils::trim_kv_cache``: ``set_state`` with the first L'
tokens), as each runtime does it (``Policy.trim_rule``). Golden sequences worked out by hand from the
rules cited in policies/openvino_cpu.py and policies/openvino_gpu.py; the CPU one is what
``simkv validate --ops prefill:64,decode:40,trim:20,prefill:16,decode:10`` measures on the plugin."""

import subprocess
import sys

import pytest

from simkv.errors import ConfigError, PolicyError
from simkv.ledger import OPS, PHASES, TENSORS
from simkv.scenario import build_scenario, simulate
from simkv.workload import Prefill, Trim, chat_session, parse_ops


def events(result, steps):
    """(step, tensor, op, bytes) of the allocations and frees of ``steps``."""
    rows = result.ledger.rows
    return [(int(r["step"]), TENSORS[r["tensor"]], OPS[r["op"]], int(r["bytes"]))
            for r in rows if r["step"] in steps and OPS[r["op"]] != "copy"]


def scenario(policy, ops, precision="u8", **kw):
    return build_scenario(model=None, layers=1, heads=4, kv_heads=2, head_dim=64, precision=precision,
                          policy=policy, ops=ops, **kw)


def test_cpu_trim_then_prefill_golden():
    """openvino-cpu, 1 layer, 2 KV heads x 64, u8: per token K data 2*64 = 128 B, scales 2*2*4 = 16 B,
    beam table 4 B, an f32 read-back 2*64*4 = 512 B.

    prefill:64 -> cap 2*64 = 128; decode:40 -> 104 tokens, still in 128.
    trim:20 (step 41): L0 = 104, L' = 84. States V then K (query_state order: last layer first, V before
    K), each: read-back 104*512 = 53248, the kept cut 84*512 = 43008, new data 84*128 = 10752, the old
    data 128*128 = 16384 freed, a beam table 84*4 = 336, the old 128*4 = 512 freed, the read-back freed.
    The scales stay at 128 tokens (2048 B).
    prefill:16 (step 42): 84 + 16 = 100 > 84 -> cap 2*100 = 200, the plugin's grow order
    +Kb +Vb -Vb -Kb +K +V +Ks +Vs -Ks -Vs -V -K: beam 800, data 25600, scales 3200; the frees at the old
    sizes — beam 336, scales 2048 (still cap 128), data 10752. The past block (f32 [1, 2, L0, 64]) is 103
    tokens from the decode and 84 <= 103: not grown."""
    result = simulate(scenario("openvino-cpu", "prefill:64,decode:40,trim:20,prefill:16"))
    per_state = lambda t: [(41, f"{t}_copy", "alloc", 53248), (41, f"{t}_copy", "alloc", 43008),  # noqa: E731
                           (41, t, "alloc", 10752), (41, t, "free", 16384),
                           (41, f"{t}_beam", "alloc", 336), (41, f"{t}_beam", "free", 512),
                           (41, f"{t}_copy", "free", 53248)]
    assert events(result, {41}) == per_state("v") + per_state("k")
    assert events(result, {42}) == [
        (42, "k_beam", "alloc", 800), (42, "v_beam", "alloc", 800), (42, "v_beam", "free", 336),
        (42, "k_beam", "free", 336), (42, "k", "alloc", 25600), (42, "v", "alloc", 25600),
        (42, "k_scale", "alloc", 3200), (42, "v_scale", "alloc", 3200), (42, "k_scale", "free", 2048),
        (42, "v_scale", "free", 2048), (42, "v", "free", 10752), (42, "k", "free", 10752)]
    steps = result.steps
    assert PHASES[steps["phase"][41]] == "trim" and steps["tokens"][41] == 84 and steps["tokens"][42] == 100
    # after the trim: data 2*10752, scales 2*2048, beams 2*336, the kept copies 2*43008, the past block 103*512
    assert steps["steady"][41] == 2 * 10752 + 2 * 2048 + 2 * 336 + 2 * 43008 + 103 * 512
    assert steps["used"][41] == 84 * (2 * 128 + 2 * 16 + 2 * 4)


def test_cpu_second_trim_frees_the_kept_copy():
    """A state keeps the tensor set_state got until it gets the next one: the second trim frees the first
    cut (84*512 = 43008) right after allocating its own (98 tokens: 50176)."""
    result = simulate(scenario("openvino-cpu", "prefill:64,decode:40,trim:20,prefill:16,decode:3,trim:5"))
    assert events(result, {46})[:3] == [(46, "v_copy", "alloc", 103 * 512), (46, "v_copy", "alloc", 98 * 512),
                                        (46, "v_copy", "free", 84 * 512)]


def test_gpu_trim_keeps_buffers_and_the_next_append_rebuilds():
    """openvino-gpu, f16: K id 0, V id 1 -> headroom 128 and 129. prefill:64 -> K 192, V 193 tokens; no growth
    up to 104. trim:20 allocates nothing (set_state keeps the device buffer, resets the padding); the next
    append cannot be in place: K 84 + 16 + 128 = 228 tokens (228*256 = 58368 B), V 229 (58624 B); the old
    buffers are freed at the next inference (step 43)."""
    result = simulate(scenario("openvino-gpu", "prefill:64,decode:40,trim:20,prefill:16,decode:1", precision="f16"))
    assert events(result, {41}) == []
    assert events(result, {42, 43}) == [(42, "k", "alloc", 58368), (42, "v", "alloc", 58624),
                                        (43, "k", "free", 192 * 256), (43, "v", "free", 193 * 256)]


@pytest.mark.parametrize("policy", ["static", "hf-dynamic", "exact", "fixed", "geometric"])
def test_keep_trims_allocate_nothing(policy):
    """A view (transformers' DynamicLayer.crop), a count (a static cache) or a what-if rule: nothing moves."""
    result = simulate(scenario(policy, "prefill:64,decode:40,trim:20", precision="f16"))
    assert events(result, {41}) == []
    assert result.steps["tokens"][41] == 84


def test_hf_dynamic_cat_after_a_crop():
    """DynamicLayer.crop keeps a view of 84 of 104 tokens; the next update's torch.cat allocates 84 + 16 = 100
    tokens (f16, 2*64*2 = 256 B/token: 25600 B) and drops the 104-token tensor."""
    result = simulate(scenario("hf-dynamic", "prefill:64,decode:40,trim:20,prefill:16", precision="f16"))
    assert events(result, {42}) == [(42, "k", "alloc", 25600), (42, "k", "free", 104 * 256),
                                    (42, "v", "alloc", 25600), (42, "v", "free", 104 * 256)]


def test_refusals():
    with pytest.raises(PolicyError, match="cannot be trimmed"):
        scenario("hf-static", "prefill:4,trim:1", precision="f16")
    with pytest.raises(PolicyError, match="u4"):
        scenario("openvino-cpu", "prefill:4,trim:1", precision="u4")
    with pytest.raises(PolicyError, match="linear-attention"):
        build_scenario(model="qwen3-next-80b-a3b", policy="openvino-cpu", ops="prefill:4,trim:1")
    with pytest.raises(ConfigError, match="keep at least one"):
        parse_ops("prefill:4,trim:4")
    with pytest.raises(ConfigError, match="one sequence"):
        parse_ops("prefill:4,fork:2,trim:1")


def test_chat_divergence_trims_and_prefills_again():
    """Each further turn cuts the D diverging tokens and prefills them with its own."""
    work = chat_session(100, 10, turns=2, turn_tokens=30, turn_divergence=5)
    assert str(work) == "prefill:100,decode:10,trim:5,prefill:35,decode:10,trim:5,prefill:35,decode:10"
    assert [op for op in work.ops if isinstance(op, (Trim, Prefill))][1:3] == [Trim(5), Prefill(35)]


def test_cli_trim_and_bad_trim():
    ok = subprocess.run([sys.executable, "-m", "simkv.cli", "run", "--model", "llama-3-8b", "--policy",
                         "openvino-cpu", "--ops", "prefill:64,decode:40,trim:20,prefill:16,decode:10"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "simkv.cli", "run", "--ops", "prefill:4,trim:9"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "trim:9" in bad.stderr


def test_a_trim_takes_the_time_of_its_copies():
    """No model runs in a trim: its time is its copies (read-back, kept copy, rebuilt data) at the device's copy
    bandwidth; a keep-trim (static) moves nothing and takes none."""
    from simkv.cost import get_device
    from simkv.latency import copy_bytes_per_step, session_times

    device = get_device("xeon-8480")
    cpu = simulate(scenario("openvino-cpu", "prefill:64,decode:40,trim:20,prefill:16"))
    times = session_times(cpu, device)
    assert times.step_s[41] == times.copy_s[41] == pytest.approx(copy_bytes_per_step(cpu)[41] / device.copy_bandwidth)
    assert copy_bytes_per_step(cpu)[41] == 2 * (104 * 512 + 84 * 512 + 84 * 128)
    assert session_times(simulate(scenario("static", "prefill:64,decode:40,trim:20", precision="f16")), device).step_s[41] == 0

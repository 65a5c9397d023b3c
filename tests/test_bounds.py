"""Huge and odd inputs to the engine finish fast and bounded (issue #10, items 6-7).

* A decode run is planned in chunks (``simkv.engine``): whatever the chunk sizes, the
  fast engine still equals the reference engine byte for byte.
* A run that meets the device-memory limit stops at that step without planning the rest.
* The headroom limit walks the units once (linear in layers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

import simkv.engine.session as engine
from simkv.engine.oom import limit_headroom
from conftest import assert_same_run
from simkv import build_scenario, simulate
from test_properties import scenarios


@settings(max_examples=25, deadline=None)
@given(scenarios(), st.integers(1, 9), st.sampled_from([8, 64, 1 << 20]))
def test_chunked_plans_equal_the_reference(scenario, first, rows):
    with mock.patch.object(engine, "FIRST_PLAN_STEPS", first), mock.patch.object(engine, "PLAN_ROWS", rows):
        fast = simulate(scenario)
    assert_same_run(fast, simulate(scenario, engine="reference"))


def test_a_limit_inside_a_chunk_stops_at_its_step():
    """exact, 2 layers x 1 head x 16, f16: 2*2*16*2 = 128 B per token for K+V of all layers,
    and ``exact`` holds old and new buffers for the step: 2*128*L bytes at step L-1.
    Device 1 MiB = 1,048,576 B: 256*L > 1,048,576 first at L = 4,097 tokens (prompt 1 +
    4,096 decode steps), i.e. step 4,096. A chunk of 4,096 steps (1..4,096) holds it."""
    sc = build_scenario(model=None, layers=2, heads=1, kv_heads=1, head_dim=16, precision="f16", policy="exact",
                        prompt=1, decode=10**8, device_memory="1MiB")
    result = simulate(sc)
    assert result.oom is not None and result.oom.step == 4096
    assert len(result.steps) == 4097
    ref = simulate(build_scenario(model=None, layers=2, heads=1, kv_heads=1, head_dim=16, precision="f16",
                                  policy="exact", prompt=1, decode=5000, device_memory="1MiB"), engine="reference")
    assert_same_run(result, ref)


def test_headroom_limit_is_linear_in_units():
    """limit_headroom is given the running total: each call of running_before gets the
    bytes chosen so far (one number), so the work is one pass over the units."""
    from policies import get_policy

    policy = get_policy("openvino-gpu")
    seen = []
    caps = limit_headroom(policy, 5, [10, 10, 10, 10], unit_bytes=lambda i, cap: int(cap) * 100,
                                 running_before=lambda i, chosen: seen.append(chosen) or 1000 + chosen,
                                 device_memory=1000 + 2500)
    # limit 0.9 * 3500 = 3150: unit 0: 1000 + 1000 < 3150 keeps 10; unit 1: 2000 + 1000 = 3000 keeps 10;
    # unit 2: 3000 + 1000 >= 3150 -> needed 5 (500 B); unit 3: 3500 + 1000 -> 5.
    assert seen == [0, 1000, 2000, 2500] and caps.tolist() == [10, 10, 5, 5]


# --------------------------------------------------------------------------- simkv run on odd input


def run(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "simkv.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_out_of_memory_exits_3_with_the_oom_line_first_and_figures_up_to_the_failure():
    """Llama-3-8B, f16, openvino-gpu, 16 GiB: a 100,000,000-token prompt makes layer 0's K
    (8 KV heads x 128 x 2 B = 2 KiB per token) ask for (100,000,000 + 128) x 2 KiB =
    190.73 GiB, over the GPU plugin's largest single allocation (max_alloc_bytes, 4 GiB - 8 KiB):
    the first allocation fails, so nothing is allocated at the failure."""
    proc = run("run", "--prompt", "100000000")
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("simkv: OUT OF MEMORY: allocation too large at step 0, layer 0: one buffer of 190.73 GiB")
    assert "steps                 1 (0 completed, step 0 failed)" in proc.stdout
    assert "at failure allocated  0 B" in proc.stdout and "final" not in proc.stdout
    assert "layer 0 K allocs at   none (no allocation completed)" in proc.stdout


def test_huge_decode_plans_only_up_to_the_out_of_memory_step():
    """--decode 100,000,000 plans in chunks and stops where memory runs out (a 1-layer toy:
    K+V f16 = 2 x 64 x 2 B = 256 B per token; 16 MiB / 256 B = 65,536 tokens, and the CPU
    doubling overflows before that), not after planning 10^8 steps: the steps planned in
    all, failed plans included, stay within a few times the steps the run took."""
    planned = []
    real = engine.FastEngine._decode_run

    def counting(self, first, n, *sizes):
        planned.append(n)
        return real(self, first, n, *sizes)

    sc = build_scenario(model=None, layers=1, heads=1, kv_heads=1, head_dim=64, precision="f16",
                        policy="openvino-cpu", prompt=1024, decode=10**8, device_memory="16MiB")
    with mock.patch.object(engine.FastEngine, "_decode_run", counting):
        result = simulate(sc)
    assert result.oom is not None and len(result.steps) == result.oom.step + 1 < 70_000
    assert sum(planned) < 4 * len(result.steps)
    proc = run("run", "--model", "custom", "--layers", "1", "--kv-heads", "1", "--head-dim", "64", "--policy",
               "openvino-cpu", "--precision", "f16", "--device-memory", "16MiB", "--decode", "100000000", "--json")
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["oom_step"] == result.oom.step


@pytest.mark.parametrize("args, message", [
    (["--ops", ""], "--ops is empty"),
    (["--ops", " , "], "--ops is empty"),
    (["--ledger", "/etc/hostname/x.csv"], "/etc/hostname is not a directory"),
    (["--ledger", "/nonexistent/dir/x.csv"], "directory /nonexistent/dir does not exist"),
    (["--timeline", "out.txt"], "--timeline out.txt: the file name must end in .html or .htm"),
    (["--ledger", "x"], "must end in .csv or .parquet"),
    (["--layers", "100001"], "--layers 100,001 is over the limit of 100,000"),
    (["--turns", "1000000000"], "--turns 1,000,000,000 is over the limit of 100,000"),
    (["--beam", "5000"], "--beam 5,000 is over the limit of 4,096"),
    (["--decode", "-1"], "decode must be a non-negative integer"),
    (["--ops", "prefill:1,decode:200000000"], "200,000,000 tokens is over the limit"),
    (["--device-memory", "1125899906842625"], "over the limit of 1 PiB"),
    (["--model", "custom", "--layers", "1", "--kv-heads", "1", "--head-dim", "1", "--policy", "exact",
      "--device-memory", "1125899906842624", "--decode", "20000000"], "20,000,001 steps before memory runs out"),
    (["--policy", "openvino-cpu", "--precision", "i8"], "does not accept i8 for the KV cache (it takes u8, u4"),
    (["--frobnicate"], "simkv run: error: unrecognized arguments: --frobnicate"),
    # a file with no size to check first is read only up to the limit (it read on without end)
    (["--model", "/dev/zero"], "model config /dev/zero: more than 16,777,216 bytes, over the limit of 16,777,216"),
    (["--device", "/dev/zero"], "device file /dev/zero: more than 16,777,216 bytes, over the limit of 16,777,216"),
    (["--policy-opt", "growth=x", "--policy", "openvino-cpu"], "not a valid float"),
])
def test_odd_input_is_one_line_exit_2(args, message, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "simkv.cli", "run", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simkv run: error:") and message in lines[0], proc.stderr
    assert not list(tmp_path.iterdir())  # nothing written, no directory created


def test_version_prompt_only_and_float_growth():
    from simkv import __version__

    assert run("--version").stdout.strip() == f"simkv {__version__}"
    data = json.loads(run("run", "--prompt", "10", "--decode", "0", "--json").stdout)
    assert data["steps"] == 1 and data["scenario"]["workload"] == "prefill:10"
    # growth 1.5 on a 10-token prompt: ceil(1.5 x 10) = 15 tokens; the default 2 gives 20
    for growth, cap in (("1.5", 15), ("2", 20)):
        out = json.loads(run("run", "--policy", "openvino-cpu", "--policy-opt", f"growth={growth}", "--prompt", "10",
                             "--decode", "0", "--json").stdout)
        assert out["per_layer"][0]["capacities"] == [cap]


def test_output_files_are_written_in_an_existing_directory(tmp_path):
    proc = run("run", "--decode", "5", "--ledger", str(tmp_path / "l.csv"), "--timeline", str(tmp_path / "t.html"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "l.csv").read_text().startswith("step,") and (tmp_path / "t.html").stat().st_size > 1000


# --------------------------------------------------------------------------- policies that reallocate every step


def test_exact_decode_200000_ends_out_of_memory_at_its_step():
    """The issue's command. Llama-3-8B, f16: K or V of one layer is 8 KV heads x 128 x 2 B =
    2,048 B per token, all 64 K/V buffers 131,072 B. Device 16 GiB = 17,179,869,184 B less the
    int8 weights, 8,029,995,008 B: 9,149,874,176 B for the KV cache. ``exact`` frees at the end
    of the step, so decode step s (1,023 + s tokens stored) allocates the 64 new buffers of
    1,024 + s tokens, layer 0 K, 0 V, 1 K, ..., on top of all the old ones: after the j-th,
    (1,023 + s) x 131,072 + j x (1,024 + s) x 2,048. All 64 fit while (2,047 + 2s) x 131,072
    <= 9,149,874,176, i.e. s <= 33,880; at s = 33,881 the old ones take 4,574,937,088 B, each new
    one 71,485,440 B (68.17 MiB), and 64 of them need 4,575,068,160 B, over the 4,574,937,088 B
    left: the 64th (layer 31 V) fails, with 4,574,937,088 + 63 x 71,485,440 = 9,078,519,808 B
    (8.46 GiB) of KV allocated."""
    kv_room = 17_179_869_184 - 8_029_995_008
    s = next(s for s in range(1, 10**6) if (2047 + 2 * s) * 131_072 > kv_room)
    assert s == 33_881
    proc = run("run", "--policy", "exact", "--decode", "200000", "--device-memory", "16GiB")  # the device
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == ("simkv: OUT OF MEMORY: out of memory at step 33881, layer 31: 68.17 MiB requested with "
                        "8.46 GiB KV + 7.48 GiB weights of 16.00 GiB allocated")
    assert "  steps                 33,882 (33,881 completed, step 33,881 failed)" in lines
    assert "  reallocations         2,168,383 (K/V data buffers replaced)" in lines  # 64 x 33,880 + 63


def test_a_run_over_the_ledger_limit_stops_with_one_line():
    """The same on an 80 GiB device fits all 200,000 steps, but would record 38 million rows.
    Its ledger: 64 allocations at the prompt, then per step 64 x (alloc, copy, free) = 192 rows,
    so 64 + 192 s rows after step s; row 8,000,001 (past the limit) is written at the first s
    with 64 + 192 s > 8,000,000: s = 41,667. The run stops there: one line, exit 2."""
    from simkv.limits import MAX_LEDGER_ROWS

    assert MAX_LEDGER_ROWS == 8_000_000 and next(s for s in range(10**6) if 64 + 192 * s > 8_000_000) == 41_667
    proc = run("run", "--policy", "exact", "--decode", "200000", "--device-memory", "80GiB")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [(
        "simkv run: error: this run would record more than 8,000,000 ledger events (allocations, copies, frees), "
        "the limit, at step 41,667 (see docs/guide/getting-started.md, Limits): simulate fewer steps, layers or "
        "requests")]


@settings(max_examples=25, deadline=None)
@given(scenarios(), st.floats(0.05, 0.95))
def test_the_ledger_limit_stops_both_engines_at_the_same_step(scenario, share):
    """With a limit under a run's ledger, both engines stop at the step that writes the row past it."""
    from simkv.ledger import TooManyEvents

    full = simulate(scenario).ledger.rows
    limit = int(share * len(full))
    if limit == 0:
        return
    steps = []
    for name in ("fast", "reference"):
        with mock.patch.object(engine, "MAX_LEDGER_ROWS", limit), \
                mock.patch("simkv.reference.MAX_LEDGER_ROWS", limit), pytest.raises(TooManyEvents) as err:
            simulate(scenario, engine=name)
        steps.append(err.value.step)
    assert steps == [int(full["step"][limit])] * 2


def test_stateless_plans_are_sized_by_their_rows():
    """A stateless plan writes 4 rows per step here (1 layer: alloc K, V; free K, V); plans are
    resized to about PLAN_ROWS rows, so none after the first (the prompt appends its allocs and
    frees, 2 rows each) writes more than twice that."""
    sizes = []
    real = engine.Ledger.append

    def counting(self, rows):
        sizes.append(len(rows))
        return real(self, rows)

    sc = build_scenario(model=None, layers=1, heads=1, kv_heads=1, head_dim=8, precision="f16",
                        policy="stateless", prompt=1, decode=200_000)
    with mock.patch.object(engine, "PLAN_ROWS", 1 << 12), mock.patch.object(engine.Ledger, "append", counting):
        simulate(sc)
    assert sum(sizes) == 4 + 4 * 200_000 and max(sizes[3:]) <= 2 << 12


# --------------------------------------------------------------------------- the chains' shortcut


class _Stepped:
    """A policy whose headroom changes every ``period`` tokens (the shortcut must notice)."""

    name = "stepped"

    def __init__(self, pad, period):
        self.pad, self.period = pad, period

    def capacity(self, needed, prim):
        needed = np.asarray(needed, dtype=np.int64)
        return needed + self.pad + (needed // self.period) % 2 + prim % 3


def _policies():
    from policies import get_policy

    fixed = st.integers(0, 40).map(lambda n: get_policy("fixed", {"tokens": n}))
    gpu = st.builds(lambda base, stagger: get_policy("openvino-gpu", {"headroom_base": base, "stagger": stagger}),
                    st.integers(0, 20), st.integers(1, 9))
    growth = st.sampled_from([get_policy("geometric"), get_policy("openvino-cpu"), get_policy("geometric", {"ratio": 1.1})])
    plain = st.sampled_from([get_policy("exact"), get_policy("hf-dynamic"), get_policy("static", {"max_prompt_len": 64})])
    return st.one_of(fixed, gpu, growth, plain, st.builds(_Stepped, st.integers(0, 5), st.integers(1, 50)))


@settings(max_examples=200, deadline=None)
@given(_policies(), st.lists(st.integers(0, 300), min_size=1, max_size=8), st.integers(0, 200), st.integers(1, 3),
       st.integers(1, 400), st.sampled_from([0, 5, 50, 10**6]))
def test_chain_shortcut_equals_the_waves(policy, caps, L0, B, n, shortcut):
    """simkv.chains: with the constant-headroom shortcut (any size it may take) the links and
    final budgets are those of the plain wave loop, for policies with and without a constant
    headroom, and the same error for a capacity below the tokens needed (a static cache)."""
    from simkv.chains import chains
    from simkv.errors import SimkvError

    prim = np.arange(len(caps), dtype=np.int64)
    budget = np.array(caps, dtype=np.int64) * B

    def outcome(links):
        try:
            unit, k, old_rows, new_cap, after = chains(policy, prim, budget, L0, B, n, links)
        except SimkvError as err:
            return str(err)
        order = np.lexsort((k, unit))
        return [a[order].tolist() for a in (unit, k, old_rows, new_cap)] + [after.tolist()]

    assert outcome(shortcut) == outcome(0)


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.one_of(st.integers(-10**20, 10**20), st.booleans(), st.none(), st.text(max_size=5),
                              st.floats(allow_nan=False, allow_infinity=False)),
                    lambda inner: st.one_of(st.lists(inner, max_size=6), st.lists(st.integers(), max_size=9),
                                            st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                    max_leaves=40))
def test_json_writer_equals_json_dump(obj):
    """simkv.jsonout writes json.dump's bytes (lists of integers from 2 entries on set aside here)."""
    import io

    from simkv import jsonout

    expected = io.StringIO()
    json.dump(obj, expected, indent=2)
    out = io.StringIO()
    with mock.patch.object(jsonout, "LONG", 2):
        jsonout.write_json(obj, out)
    assert out.getvalue() == expected.getvalue() + "\n"


def test_beam_tables_read_the_layout_once_per_step():
    """The GPU kernels' beam tables are built unit by unit; the per-unit tensor codes are an array of
    all units, built once per layout (a property that built it on every read, once per unit, made
    100,000 layers take 90 s of CPU): the builds do not grow with layers."""
    from functools import cached_property

    from simkv.layout import Layout

    reads = []
    real = Layout.unit_table_tensor

    def counted(self):
        reads.append(1)
        return real.func(self)

    def count(layers):
        reads.clear()
        prop = cached_property(counted)
        prop.__set_name__(Layout, "unit_table_tensor")
        with mock.patch.object(Layout, "unit_table_tensor", prop):
            simulate(build_scenario(model=None, layers=layers, heads=1, kv_heads=1, head_dim=2, policy="openvino-gpu",
                                    prompt=1, decode=1))
        return len(reads)

    assert count(3) == count(30) > 0


@pytest.mark.parametrize("policy, options, exact_sized", [
    ("fixed", {"tokens": 0}, True), ("exact", {"headroom_limit": 0.5}, True),
    ("openvino-gpu", {"headroom_base": 0, "stagger": 1}, True),  # P = 0 + id % 1 = 0
    ("fixed", {"tokens": 3}, False), ("openvino-gpu", {}, False),
])
def test_past_the_headroom_limit_plans_go_on_with_exact_sizes(policy, options, exact_sized):
    """Past the headroom limit a reallocation gets exactly the tokens it needs; the fast engine
    plans on with those sizes where the limit's rule gives them (every reallocation over the
    limit, or sized exactly by the policy anyway), instead of stepping through the rest of the
    run one step at a time: few single steps, and the same ledger as the reference."""
    steps, plans = [], []
    real_step, real_plan = engine.FastEngine._step, engine.FastEngine._decode_run

    def counting(self, step, inf):
        steps.append(step)
        return real_step(self, step, inf)

    def planning(self, first, n, exact_sizes=False):
        done = real_plan(self, first, n, exact_sizes)
        plans.append((n, exact_sizes, done))
        return done

    sc = build_scenario(model=None, layers=1, heads=1, kv_heads=1, head_dim=16, precision="f16", policy=policy,
                        policy_options=options, prompt=16, decode=10**6, device_memory="256KiB")
    with mock.patch.object(engine.FastEngine, "_step", counting), \
            mock.patch.object(engine.FastEngine, "_decode_run", planning):
        fast = simulate(sc)
    assert fast.oom is not None
    ref = simulate(build_scenario(model=None, layers=1, heads=1, kv_heads=1, head_dim=16, precision="f16",
                                  policy=policy, policy_options=options, prompt=16, decode=fast.oom.step + 5,
                                  device_memory="256KiB"), engine="reference")
    assert_same_run(fast, ref)
    planned_exact = sum(n for n, exact_sizes, done in plans if exact_sizes and done)
    if exact_sized:  # the policy's sizes are exact: the zone is planned
        assert len(steps) < 10 and planned_exact > 100, (len(steps), planned_exact)
    # else buffers under the limit keep their headroom, and the zone goes (mostly) step by step


def test_stateless_plan_stops_where_a_buffer_exceeds_the_largest_allocation():
    # Found by hypothesis: a stateless plan did not check max_alloc_bytes. f32, head 16: a K buffer is
    # 64 B a token, so at 157 tokens (step 156: prompt 1 + 156 decode steps) it is 10,048 B > 10,000 B.
    from dataclasses import replace

    from simkv.scenario import build_scenario, simulate

    s = build_scenario(model=None, layers=1, heads=1, kv_heads=1, head_dim=16, precision="f32", policy="stateless",
                       ops="prefill:1,decode:156", device_memory=16 * 2**30, weights_memory=0)
    s = replace(s, policy=replace(s.policy, max_alloc_bytes=10_000))
    fast, ref = simulate(s), simulate(s, engine="reference")
    assert str(fast.oom) == str(ref.oom) and "at step 156" in str(fast.oom)
    assert fast.ledger == ref.ledger


# --------------------------------------------------------------------------- simkv validate: a real runtime's bounds


@pytest.mark.parametrize("args, message", [
    # prompt 32 + 100,000,000 generated tokens: 100,000,032 token rows, over 16,384
    (["--decode", "100000000"], "computes 100,000,032 tokens at 4 layers: a real run takes at most 16,384 tokens"),
    # 9,032 rows fit 16,384, but 32 layers x 9,032 = 289,024 layer-tokens pass 2 x 32 x 4,200 = 268,800
    (["--layers", "32", "--decode", "9000"], "computes 9,032 tokens at 32 layers"),
    # prefill 10, then fork:4 (one inference of 4 rows), 5,000 steps of 4 beams: 10 + 4 + 20,000 = 20,014
    (["--ops", "prefill:10,fork:4,decode:5000"], "computes 20,014 tokens"),
    # --ir's dimensions come from the file: the workload is bounded before the file is even read
    (["--ir", "no-such-model.xml", "--decode", "100000000"], "computes 100,000,032 tokens"),
    (["--layers", "129"], "129 layers: a real validation run builds at most 128"),
    # 2 x 1,000 x 10^8 embedding and output weights alone: 2 x 10^11
    (["--hidden", "100000000", "--decode", "1"], "the toy model would hold 1,019,200,000,000 weights"),
    (["--paged", "--random", "1001"], "--random must be in 1..1,000"),
    (["--runtime", "transformers", "--decode", "100000000"], "a real transformers run is limited to"),
    (["--serving", "--requests", "100000"], "--requests must be in 1..500"),
    (["--runtime", "vllm", "--random", "100000"], "--random must be in 1..500"),
])
def test_validate_refuses_a_run_past_its_bounds_before_the_runtime_starts(args, message, tmp_path):
    """Every validate mode that runs a real runtime refuses a run past the validation bounds (simkv.limits:
    MAX_VALIDATE_*) in one line, exit code 2, before anything runs: such a run would take hours or fill memory."""
    proc = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simkv validate: error:") and message in lines[0], proc.stderr
    assert not list(tmp_path.iterdir())


def test_validation_tokens_count_every_row_a_real_run_computes():
    """Worked by hand from simkv/workload.py's operations: prefill:32 (32 rows), decode:10 (10), fork:4 (one
    inference at width 4: 4), reorder (4), decode:5 at width 4 (20), select:1 (one inference at width 1: 1),
    trim:3 (no inference), prefill:7 (7), reset (none), prefill:2 (2): 80."""
    from simkv.limits import validation_tokens
    from simkv.workload import parse_ops

    ops = "prefill:32,decode:10,fork:4,reorder,decode:5,select:1,trim:3,prefill:7,reset,prefill:2"
    assert validation_tokens(parse_ops(ops)) == 32 + 10 + 4 + 4 + 20 + 1 + 7 + 2

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

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

import simkv.engine as engine
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
    caps = engine.limit_headroom(policy, 5, [10, 10, 10, 10], unit_bytes=lambda i, cap: int(cap) * 100,
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

    def counting(self, first, n):
        planned.append(n)
        return real(self, first, n)

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

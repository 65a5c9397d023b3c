"""Defaults that fit (docs/guide/cli.md): one default device for every command, a single session on its memory
and its runtime's precisions, weights that leave no room refused before running with the fix, every preset run on
the default device, over-long requests rejected one by one, and contiguous serving never past the device."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from simkv.cost import DEFAULT_DEVICE, DEVICES, get_device
from simkv.errors import ConfigError
from simkv.hfconfig import all_presets, resolve_model
from simkv.models import custom_model, weights_bytes
from simkv.precision import get_precision
from simkv.scenario import build_scenario, simulate
from simkv.serving import Request, SchedulerConfig, ServingSpec, serve
from simkv.serving.cli import run_parser, spec_from_args

ROOT = Path(__file__).resolve().parent.parent
XEON = DEVICES[DEFAULT_DEVICE]


def simkv(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "simkv.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


# -- one default device ----------------------------------------------------------------------------------------


def test_every_command_defaults_to_the_same_device():
    from simkv.cli import build_parser
    from simkv.dashboard.serving_view import FIELDS
    from simkv.flags import scenario_from_args
    from simkv.lab.tune_serving import build_target
    from simkv.scenario import DEFAULT_DEVICE_MEMORY

    assert DEFAULT_DEVICE == "xeon-8480"
    top = build_parser()
    # a single session: the device's memory and its runtime's weights (OpenVINO: optimum-intel's int8)
    session = scenario_from_args(top.parse_args(["run"]))
    model = session.model
    assert session.device_memory == XEON.memory_bytes == 512 * 2**30 and DEFAULT_DEVICE_MEMORY == "512GiB"
    assert session.weights_memory == weights_bytes(model, "int8") == 8_029_995_008
    # serving, cost, tune --serving and the dashboard's Serving view
    assert spec_from_args(run_parser().parse_args(["--synthetic"])).device == DEFAULT_DEVICE
    assert top.parse_args(["cost"]).device == DEFAULT_DEVICE
    target = build_target(trace="azure-code", limit=5, model="llama-3-8b", precision=None,
                          device=None, device_memory=None, weights_memory=None, weights_precision=None,
                          max_context=None, max_preemptions=None)
    assert target.template.device == DEFAULT_DEVICE
    assert next(f for f in FIELDS if f.key == "sv_device").default == DEFAULT_DEVICE
    # validate compares a real run on this machine with its prediction: the device is this host
    assert top.parse_args(["validate"]).device == "host"


def test_a_single_session_takes_its_memory_and_weights_from_the_device():
    """--device sets a session's memory and its runtime's weights precision (vLLM on an H100: the checkpoint's 2-byte
    dtype); --device-memory and --weights-precision still override them."""
    h100 = build_scenario(model="gemma-3-27b", prompt=64, decode=16, device="h100-sxm")
    gemma = resolve_model("gemma-3-27b")
    assert h100.device_memory == DEVICES["h100-sxm"].memory_bytes == 85_017_493_504  # as CUDA reports it
    assert h100.weights_memory == weights_bytes(gemma, "bf16")
    assert simulate(h100).oom is None
    small = build_scenario(model="gemma-3-27b", prompt=64, decode=16, device="h100-sxm", device_memory="60GiB",
                           weights_precision="int8")
    assert small.device_memory == 60 * 2**30 and small.weights_memory == weights_bytes(gemma, "int8")


def test_the_latency_of_a_session_prices_the_weights_the_memory_holds():
    out = simkv("run", "--model", "llama-3-8b", "--decode", "8", "--device", "arc-a770", "--json")
    data = json.loads(out.stdout)
    assert data["latency"]["weights_precision"] == "int8" == get_device("arc-a770").default_weights_precision(
        resolve_model("llama-3-8b"))
    assert data["scenario"]["weights_memory_bytes"] == 8_029_995_008


# -- weights that do not fit -------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    # 624.94 GiB of int8 weights on the 512 GiB default device: only lighter weights (int4: 312.47 GiB) fit
    (["run", "--model", "deepseek-v3"], "deepseek-v3's weights take 624.94 GiB at int8, no less than xeon-8480's "
     "512.00 GiB: no room for the KV cache; give --weights-precision int4 or --weights-memory 0 (the KV cache alone)"),
    # 131.41 GiB of bf16 on one H100 (79.18 GiB): the smallest preset that holds them is h200-sxm (139.80 GiB, the
    # total CUDA reports; its datasheet's 141 GB = 131.32 GiB would be just short), so do two H100s (serving), so does
    # int8
    (["run", "--synthetic", "--model", "llama-3-70b", "--device", "h100-sxm"], "llama-3-70b's weights take 131.41 GiB "
     "at f16, no less than h100-sxm's 79.18 GiB: no room for the KV cache; give --device h200-sxm, --tp 2, "
     "--weights-precision int8 or --weights-memory 0 (the KV cache alone)"),
    # vLLM's scheduler fills only gpu_memory_utilization 0.9 of a device: 0.9 x 139.80 = 125.82 GiB of an H200 is
    # short of the 131.41 GiB, 0.9 x 178.36 = 160.52 GiB of a B200 holds them; two H200s hold 65.70 GiB each
    (["run", "--synthetic", "--model", "llama-3-70b", "--device", "h200-sxm", "--scheduler", "vllm"], "llama-3-70b's "
     "weights take 131.41 GiB at f16, no less than 0.9 of h200-sxm's 139.80 GiB (125.82 GiB, vLLM's "
     "--gpu-memory-utilization): no room for the KV cache; give --device b200, --tp 2, --weights-precision int8 or "
     "--weights-memory 0 (the KV cache alone)"),
    (["run", "--model", "llama-3-8b", "--device-memory", "4GiB"], "llama-3-8b's weights take 7.48 GiB at int8, no "
     "less than 4.00 GiB of device memory: no room for the KV cache; give --weights-precision int4 or "
     "--weights-memory 0 (the KV cache alone)"),
    (["run", "--weights-memory", "600GiB"], "--weights-memory 600.00 GiB is no less than xeon-8480's 512.00 GiB: no "
     "room for the KV cache"),
    # a single session and a policy tuned for one take the same device and the same refusal (no --tp: one device)
    (["run", "--model", "llama-3-70b", "--device", "h100-sxm"], "llama-3-70b's weights take 131.41 GiB at f16, no "
     "less than h100-sxm's 79.18 GiB: no room for the KV cache; give --device h200-sxm, --weights-precision int8 or "
     "--weights-memory 0 (the KV cache alone)"),
    (["tune", "--model", "llama-3-70b", "--device", "h100-sxm"], "llama-3-70b's weights take 131.41 GiB at f16, no "
     "less than h100-sxm's 79.18 GiB: no room for the KV cache; give --device h200-sxm, --weights-precision int8 or "
     "--weights-memory 0 (the KV cache alone)"),
    (["tune", "--model", "gemma-3-27b", "--device-memory", "16GiB"], "gemma-3-27b's weights take 25.15 GiB at int8, "
     "no less than 16.00 GiB of device memory: no room for the KV cache; give --weights-precision int4 or "
     "--weights-memory 0 (the KV cache alone)"),
])
def test_weights_that_leave_no_room_are_refused_before_running_with_the_fix(args, says):
    out = simkv(*args)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.strip() == f"simkv {args[0]}: error: {says}"


def test_the_fix_a_refusal_names_runs():
    assert simkv("run", "--model", "deepseek-v3", "--weights-precision", "int4", "--decode", "8").returncode == 0
    assert simkv("run", "--synthetic", "--requests", "3", "--model", "llama-3-70b", "--device", "h100-sxm",
                 "--tp", "2").returncode == 0
    assert simkv("run", "--synthetic", "--requests", "3", "--model", "llama-3-70b", "--device", "b200",
                 "--scheduler", "vllm").returncode == 0


@pytest.mark.parametrize("name", sorted(all_presets()))
def test_every_preset_runs_on_the_default_device(name):
    """A single session and a few served requests of every preset on the default device, its defaults otherwise:
    they run (no out of memory). deepseek-v3's int8 weights (625 GiB) exceed every preset's memory: refused with the
    fix, which then runs."""
    model = resolve_model(name)
    fix = {}
    if name == "deepseek-v3":
        with pytest.raises(ConfigError, match="--weights-precision int4"):
            build_scenario(model=name, prompt=64, decode=16)
        fix = {"weights_precision": "int4"}
    session = build_scenario(model=name, prompt=64, decode=16, **fix)
    assert session.device_memory == XEON.memory_bytes
    assert session.weights_memory == weights_bytes(model, fix.get("weights_precision", "int8" if
                                                                   model.weight_params >= 1e9 else "f16"))
    assert simulate(session).oom is None
    argv = ["--synthetic", "--requests", "3", "--prompt-dist", "fixed:64", "--output-dist", "fixed:8", "--model", name]
    argv += ["--weights-precision", "int4"] if fix else []
    result = serve(spec_from_args(run_parser().parse_args(argv)))
    assert result.metrics["requests_finished"] == 3 and result.oom is None


# -- a policy tuned on the device it will serve on ---------------------------------------------------------------

#: A search of two configurations on one session (grid: both run, the defaults' headroom_base 128 among them).
TUNE = ("tune", "--model", "gemma-3-27b", "--prompt", "16", "--decode", "300", "--search", "grid", "--budget", "2",
        "--param", "headroom_base=64,128", "--workers", "1")


def tune_json(*device):
    out = simkv(*TUNE, *device, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def peak(candidate):
    return candidate["objectives"]["peak:max"]


def test_tune_takes_the_session_s_device_from_device(tmp_path):
    """``simkv tune --device`` is ``simkv run --device``: the device's memory and the weights its runtime loads
    (OpenVINO on the Xeon: optimum-intel's int8; vLLM on the H100: the checkpoint's bf16) set the room a candidate's
    worst peak must fit in, the reproduce line carries the device, and that line run gives the recommendation's
    peak. The device changes the candidates' runs too, not only the bound: on a device whose room beside the
    weights lies between the two candidates' H100 peaks, the GPU plugin's headroom limit (openvino-gpu's
    ``headroom_limit`` × device memory, simkv/engine/decode_run.py) drops the preallocation near the limit, so the
    defaults reallocate at every step and run out of memory: nothing is feasible, the defaults are kept."""
    gemma = resolve_model("gemma-3-27b")
    xeon, h100 = tune_json(), tune_json("--device", "h100-sxm")
    assert xeon["weights_memory_bytes"] == weights_bytes(gemma, "int8")
    assert h100["weights_memory_bytes"] == weights_bytes(gemma, "bf16")
    assert xeon["constraints"][1] == f"peak:max<={XEON.memory_bytes - weights_bytes(gemma, 'int8')}"
    assert h100["constraints"][1] == f"peak:max<={DEVICES['h100-sxm'].memory_bytes - weights_bytes(gemma, 'bf16')}"
    assert "--device" not in xeon["command"] and "--device h100-sxm" in h100["command"]
    # the recommendation's line, run, is the same session on the same device (one workload: its peak is peak:max)
    run = simkv(*h100["command"].split()[1:], "--json")
    assert run.returncode == 0 and json.loads(run.stdout)["peak_allocated_bytes"] == peak(h100["recommendation"])
    # both fit on the H100: the defaults (128) stay, the smaller headroom peaks lower and reallocates more
    small, default = sorted(h100["pareto"], key=peak)
    assert (small["params"], h100["recommendation"]["params"]) == ({"headroom_base": 64}, {})
    assert peak(small) < peak(default) == peak(h100["baseline"])
    # the same H100 with room for the smaller peak only (a device preset file, as `simkv run --device PATH` takes)
    spec = json.loads((ROOT / "simkv/data/devices/h100-sxm.json").read_text())
    spec["name"] = "h100-tight"
    spec["memory_bytes"] = weights_bytes(gemma, "bf16") + (peak(small) + peak(default)) // 2
    tight = tmp_path / "h100-tight.json"
    tight.write_text(json.dumps(spec))
    result = tune_json("--device", str(tight))
    assert result["weights_memory_bytes"] == weights_bytes(gemma, "bf16")  # the device's runtime: still vLLM's
    assert result["constraints"][1] == f"peak:max<={spec['memory_bytes'] - weights_bytes(gemma, 'bf16')}"
    base = result["baseline"]
    assert base["feasible"] is False and "out of memory on 1 of 1 workloads" in base["violations"]
    assert base["objectives"]["reallocs:mean"] > 100 * h100["baseline"]["objectives"]["reallocs:mean"]
    assert result["pareto"] == [] and f"--device {tight}" in result["command"]
    run = simkv(*result["command"].split()[1:])
    assert run.returncode == 3 and run.stdout.startswith("simkv: OUT OF MEMORY")  # simkv run agrees


def test_tune_names_the_device_it_tunes_on():
    out = simkv(*TUNE, "--device", "h100-sxm")
    assert out.returncode == 0
    assert out.stdout.splitlines()[0].endswith("peak:max <= 28.87 GiB free on h100-sxm")
    assert simkv(*TUNE).stdout.splitlines()[0].endswith(" GiB free on xeon-8480")


# -- the KV precision of a device ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device, model, precision", [
    ("h100-sxm", "llama-3.1-8b", "bf16"), ("h100-sxm", "llama-2-7b", "f16"), ("a100-80gb", "qwen3-8b", "bf16"),
    ("xeon-8480", "llama-3.1-8b", "u8"), ("arc-a770", "llama-3.1-8b", "f16")])
def test_serving_and_plan_keep_the_kv_cache_in_the_same_precision_on_a_device(device, model, precision):
    """vLLM (h100-sxm, a100-80gb) keeps the model's dtype (kv_cache_dtype auto); GenAI u8 on a CPU, f16 on a GPU."""
    from simkv.lab import plan

    spec = spec_from_args(run_parser().parse_args(["--synthetic", "--requests", "2", "--device", device,
                                                   "--model", model]))
    deployments, _ = plan.candidates(plan.Space((device,), max_devices=1, tp=(1,)), resolve_model(model))
    assert spec.precision.name == precision == deployments[0]["precision"]
    cost = json.loads(simkv("cost", "--device", device, "--model", model, "--json").stdout)
    assert cost["kv_precision"] == precision


# -- over-long requests ---------------------------------------------------------------------------------------

#: gpt2's context is 1,024 tokens: request 1's prompt is at it (no token can follow), request 2's above it.
TRACE = "id,arrival,prompt,max_new_tokens\n0,0.0,100,10\n1,0.5,1024,10\n2,1.0,2000,5\n3,1.5,1023,1\n"


def test_over_long_requests_are_rejected_one_by_one_and_the_rest_served(tmp_path):
    (tmp_path / "t.csv").write_text(TRACE)
    out = simkv("run", "--trace", "t.csv", "--model", "gpt2", "--requests", "r.csv", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "  requests                4: 2 finished, 0 ignored, 2 rejected; 0 preemptions" in lines
    assert ("  rejected on arrival     2: prompt at or above the context of 1,024 tokens (served the rest; "
            "--strict-context refuses the run)") in lines
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [(r["id"], r["status"]) for r in rows] == [("0", "FINISHED"), ("1", "REJECTED"), ("2", "REJECTED"),
                                                      ("3", "FINISHED")]
    # rejected on arrival: no token, no latency, at its arrival time
    assert [(r["arrival_s"], r["generated"], r["ttft_s"], r["e2e_s"]) for r in rows[1:3]] == [
        ("0.5", "0", "", ""), ("1.0", "0", "", "")]
    # the others are served as if the rejected had never come (the front end refused them)
    (tmp_path / "kept.csv").write_text("id,arrival,prompt,max_new_tokens\n0,0.0,100,10\n3,1.5,1023,1\n")
    assert simkv("run", "--trace", "kept.csv", "--model", "gpt2", "--requests", "k.csv", cwd=tmp_path).returncode == 0
    kept = list(csv.DictReader((tmp_path / "k.csv").open()))
    assert [rows[0], rows[3]] == kept
    data = json.loads(simkv("run", "--trace", "t.csv", "--model", "gpt2", "--json", cwd=tmp_path).stdout)
    assert data["requests_rejected"] == 2 and data["requests_finished"] == 2
    assert data["rejected_reasons"] == {"prompt at or above the context of 1,024 tokens": 2}


def test_strict_context_keeps_the_refusal(tmp_path):
    (tmp_path / "t.csv").write_text(TRACE)
    out = simkv("run", "--trace", "t.csv", "--model", "gpt2", "--strict-context", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip() == (
        "simkv run: error: request 1: prompt of 1,024 tokens is at or above the model's context of 1,024: no token "
        "can follow it (raise it with --max-context)")


def test_rejected_requests_take_no_replica(tmp_path):
    (tmp_path / "t.csv").write_text(TRACE)
    out = simkv("run", "--trace", "t.csv", "--model", "gpt2", "--replicas", "2", "--requests", "r.csv", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    # round-robin over the requests served: 0 -> replica 0, 3 -> replica 1; the rejected ones: none (-1)
    assert [(r["id"], r["status"], r["replica"]) for r in rows] == [
        ("0", "FINISHED", "0"), ("1", "REJECTED", "-1"), ("2", "REJECTED", "-1"), ("3", "FINISHED", "1")]


def test_the_shipped_trace_serves_on_an_h100():
    """The issue's command: request 5442's prompt (14,050 tokens) is over llama-3-8b's 8,192; it is rejected and the
    other 19,365 requests are served."""
    out = simkv("run", "--trace", "azure-conv", "--device", "h100-sxm", "--json")
    data = json.loads(out.stdout)
    assert out.returncode == 0 and data["requests_total"] == 19_366 and data["requests_rejected"] == 1
    assert data["requests_finished"] == 19_365


# -- contiguous memory never past the device ----------------------------------------------------------------------


def test_the_issue_s_contiguous_run_stays_within_the_room_left_by_the_weights():
    """llama-3-8b on arc-a770 (16 GiB, int8 weights 8,029,995,008 B: 9,149,874,176 B for the KV cache), 300 requests,
    openvino-gpu buffers: the largest in-step bytes fit that room (they passed it by 2.4 MiB when a request's
    fit check ignored a larger spike taken earlier in the step), and no note about a pool or the CPU plugin."""
    args = ("run", "--trace", "azure-conv", "--limit", "300", "--memory", "contiguous",
            "--policy", "openvino-gpu", "--device", "arc-a770", "--max-context", "0")
    data = json.loads(simkv(*args, "--json").stdout)
    room = 16 * 2**30 - 8_029_995_008
    assert data["peak_pool_bytes"] == data["peak_allocated_bytes"] <= room == 9_149_874_176
    assert data["oom"] is None and data["requests_finished"] == 300
    text = simkv(*args).stdout
    assert "scratch" not in text and "pool" not in text


TOY = custom_model(layers=2, heads=4, head_dim=16)


@settings(max_examples=40, deadline=None)
@given(policy=hst.sampled_from(["openvino-gpu", "openvino-cpu", "exact", "fixed"]),
       scheduler=hst.sampled_from(["continuous", "static", "sequential"]),
       on_oom=hst.sampled_from(["preempt", "wait", "reject"]),
       room=hst.integers(200, 4000),
       lengths=hst.lists(hst.tuples(hst.integers(1, 300), hst.integers(1, 300)), min_size=1, max_size=8))
def test_contiguous_steps_never_pass_the_device(policy, scheduler, on_oom, room, lengths):
    """Whatever the policy, scheduler and reaction to memory: every step's in-step peak (its allocated bytes and the
    largest spike of old buffers beside new ones) stays within the device memory left after the weights."""
    per_token = get_precision("f16").kv_bytes_per_token(TOY)
    reqs = [Request(i, p, g, arrival_step=i) for i, (p, g) in enumerate(lengths)]
    spec = ServingSpec(reqs, TOY, get_precision("f16"), scheduler=scheduler, memory="contiguous",
                       paged=SchedulerConfig(on_oom=on_oom, max_num_seqs=4), device="h100-sxm",
                       device_memory=per_token * room, weights_bytes=0, policy=policy, static_batch=3, max_context=0)
    result = serve(spec)
    assert int(result.steps["peak_bytes"].max(initial=0)) <= per_token * room
    assert result.metrics["peak_pool_bytes"] <= per_token * room
    ended = {"FINISHED", "REJECTED", "IGNORED"}
    assert {g.status for g in result.groups} <= ended
    assert not math.isnan(result.metrics["sim_time_s"])
    assert np.all(np.diff(result.steps["time_s"]) >= 0)

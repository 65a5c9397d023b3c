"""Serving workloads, contiguous memory, metrics and the CLI (`simkv run --trace/--synthetic`)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from simkv.errors import ConfigError
from simkv.lab.traces import AZURE_CONV
from simkv.models import custom_model, get_model
from simkv.precision import get_precision
from simkv.serving import Request, SchedulerConfig, ServingSpec, load_trace, serve, synthetic, write_trace
from simkv.serving.engine.core import STEP_COLUMNS
from simkv.serving.run import REQUEST_COLUMNS

AZURE = str(AZURE_CONV)
TOY = custom_model(layers=2, heads=4, head_dim=16)


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "simkv.cli", "run", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def azure_slice(tmp_path):
    path = tmp_path / "azure.csv"
    with open(AZURE) as src:
        path.write_text("".join(next(src) for _ in range(41)))
    return path


# -- workloads ---------------------------------------------------------------------------------------

def test_azure_loader(azure_slice):
    reqs = load_trace(azure_slice)
    assert len(reqs) == 40
    # first rows of the trace: 18:15:46.6805900 374/44, 18:15:50.9951690 396/109
    assert (reqs[0].prompt, reqs[0].max_new_tokens, reqs[0].arrival_s) == (374, 44, 0.0)
    assert reqs[1].arrival_s == pytest.approx(4.314579)
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))


def test_our_csv_and_jsonl_round_trip(tmp_path):
    reqs = [Request(0, 10, 5, arrival_s=0.0, prefix_id="sys", prefix_tokens=4),
            Request(1, 12, 3, arrival_s=0.5, session="u1", samples=2),
            Request(2, 3, 1, arrival_s=0.5, token_ids=(7, 8, 9), priority=-2)]
    write_trace(reqs, tmp_path / "w.csv")
    assert load_trace(tmp_path / "w.csv") == reqs
    (tmp_path / "w.jsonl").write_text("\n".join(json.dumps(
        {"id": r.id, "arrival": r.arrival_s, "prompt": r.prompt, "max_new_tokens": r.max_new_tokens,
         "prefix_id": r.prefix_id, "prefix_tokens": r.prefix_tokens, "session": r.session, "samples": r.samples,
         "token_ids": list(r.token_ids) if r.token_ids else None, "priority": r.priority}) for r in reqs) + "\n")
    assert load_trace(tmp_path / "w.jsonl") == reqs


def test_synthetic_is_seeded():
    a = synthetic(50, 4.0, "lognormal:500:1", "uniform:10:20", seed=3)
    assert a == synthetic(50, 4.0, "lognormal:500:1", "uniform:10:20", seed=3)
    assert a != synthetic(50, 4.0, "lognormal:500:1", "uniform:10:20", seed=4)
    assert all(10 <= r.max_new_tokens <= 20 for r in a)
    fixed = synthetic(5, 2.0, "fixed:7", "fixed:3", arrivals="fixed")
    assert [r.arrival_s for r in fixed] == [0.0, 0.5, 1.0, 1.5, 2.0]


BAD = {
    "missing_column": ("id,arrival,prompt\n0,0,10\n", "missing max_new_tokens"),
    "zero_length": ("id,arrival,prompt,max_new_tokens\n0,0,0,5\n", "prompt must be positive"),
    "negative": ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,-3\n", "must be positive"),
    "unsorted": ("id,arrival,prompt,max_new_tokens\n0,1.0,10,5\n1,0.5,10,5\n", "not sorted"),
    "empty": ("", "is empty"),
    "not_numbers": ("id,arrival,prompt,max_new_tokens\n0,zero,10,5\n", "should be a number"),
    "long_prompt": ("id,arrival,prompt,max_new_tokens\n0,0,5000,5\n", "is at or above the model's context of 4,096"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_traces_exit_2_with_one_line(tmp_path, case):
    text, message = BAD[case]
    path = tmp_path / f"{case}.csv"
    path.write_text(text)
    out = cli("--trace", str(path), "--model", "llama-2-7b")
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert message in out.stderr


def test_bad_options_exit_2(azure_slice):
    for args, message in ((("--scheduler", "fifo"), "unknown scheduler"), (("--memory", "virtual"), "unknown memory"),
                          (("--on-oom", "explode"), "unknown --on-oom"),
                          (("--memory", "paged", "--scheduler", "static"), "use --scheduler continuous"),
                          (("--num-kv-blocks", "100000000"), "does not fit")):
        out = cli("--trace", str(azure_slice), "--model", "llama-2-7b", *args)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1


# -- CLI end to end ------------------------------------------------------------------------------------

def test_cli_json_and_tables(tmp_path, azure_slice):
    steps, table = tmp_path / "steps.csv", tmp_path / "req.csv"
    out = cli("--trace", str(azure_slice), "--model", "llama-2-7b", "--device", "h100-sxm", "--json",
              "--steps", str(steps), "--requests", str(table), "--ledger", str(tmp_path / "l.csv"))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in ("peak_allocated_bytes", "mean_allocated_bytes", "waste_bytes", "realloc_count", "bytes_copied",
                "steps", "requests_total", "requests_finished", "requests_ignored", "preemptions", "prefix_hit_rate",
                "waste_internal_bytes", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                "throughput_tokens_per_s", "sim_time_s", "scenario"):
        assert key in data
    assert data["requests_total"] == data["requests_finished"] == 40
    with open(steps) as fh:
        rows = list(csv.reader(fh))
    assert tuple(rows[0]) == STEP_COLUMNS and len(rows) - 1 == data["steps"]
    with open(table) as fh:
        rows = list(csv.reader(fh))
    assert tuple(rows[0]) == REQUEST_COLUMNS and len(rows) == 41
    assert {r[5] for r in rows[1:]} == {"FINISHED"}


def test_cli_synthetic_human_report():
    out = cli("--synthetic", "--requests", "20", "--rate", "5", "--prompt-dist", "fixed:100", "--output-dist",
              "fixed:20", "--model", "llama-3-8b", "--device", "h100-sxm", "--memory", "contiguous",
              "--policy", "openvino-gpu")
    assert out.returncode == 0, out.stderr
    assert "20 finished" in out.stdout and "contiguous, policy openvino-gpu" in out.stdout


def test_deterministic_output(tmp_path):
    args = ("--synthetic", "--requests", "30", "--rate", "20", "--model", "llama-2-7b", "--device", "h100-sxm",
            "--num-kv-blocks", "300", "--json")
    a, b = cli(*args), cli(*args)
    assert a.returncode == 0 and a.stdout == b.stdout


# -- contiguous memory ------------------------------------------------------------------------------------

def spec(reqs, **kw):
    base = dict(model=TOY, precision=get_precision("f16"), device="h100-sxm", weights_bytes=0, max_context=0)
    base.update(kw)
    return ServingSpec(list(reqs), **base)


def test_contiguous_request_uses_the_single_session_mechanics():
    # One request through contiguous serving allocates exactly what `simkv run` allocates for the
    # same prompt and answer under the same policy (the same FastEngine, not a copy).
    from simkv import build_scenario, simulate

    r = serve(spec([Request(0, 300, 400, arrival_step=0)], memory="contiguous", scheduler="continuous",
                   policy="openvino-gpu"))
    single = simulate(build_scenario(model=None, layers=2, heads=4, head_dim=16, precision="f16",
                                     policy="openvino-gpu", prompt=300, decode=399))
    rows = r.ledger.rows
    ref = single.ledger.rows
    kept = rows[: len(ref)]
    for col in ("layer", "tensor", "op", "bytes", "capacity_tokens", "step"):
        assert np.array_equal(kept[col], ref[col]), col
    # and the request's buffers are freed when it finishes: allocs - frees = 0
    net = rows["bytes"][rows["op"] == 0].sum() - rows["bytes"][rows["op"] == 2].sum()
    assert net == 0
    # a reallocation's copy is in its step's time: a TPOT spike
    s = r.steps
    spikes = s["step_s"][s["copy_bytes"] > 0]
    quiet = s["step_s"][1:][s["copy_bytes"][1:] == 0]
    assert len(spikes) and spikes.min() > np.median(quiet)


def test_a_serving_run_over_the_ledger_limit_stops_with_one_line(monkeypatch, capsys):
    # Serving's ledger has a limit too (simkv.limits.MAX_SERVING_LEDGER_ROWS; here lowered to 100): contiguous
    # memory records each layer's buffers of each request, so a long trace would otherwise grow it without bound.
    import simkv.serving.contiguous as contiguous
    from simkv.cli import main
    from simkv.ledger import TooManyEvents

    monkeypatch.setattr(contiguous, "MAX_SERVING_LEDGER_ROWS", 100)
    with pytest.raises(TooManyEvents, match="more than 100 ledger events"):
        serve(spec([Request(0, 300, 400, arrival_step=0)], memory="contiguous", scheduler="continuous", policy="exact"))
    code = main(["run", "--trace", str(AZURE_CONV), "--limit", "20", "--memory", "contiguous", "--policy", "exact",
                 "--model", "llama-2-7b", "--device", "h100-sxm"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "more than 100 ledger events" in err[0] and "requests" in err[0]

def test_contiguous_sequential_runs_one_at_a_time():
    reqs = [Request(i, 50, 10, arrival_step=0) for i in range(3)]
    r = serve(spec(reqs, memory="contiguous", scheduler="sequential", policy="openvino-cpu"))
    # 3 requests x (1 prompt step + 9 decode steps), never two at once
    assert len(r.steps) == 30 and (r.steps["scheduled_requests"] == 1).all()
    first = [g.first_token_step for g in sorted(r.groups, key=lambda g: g.index)]
    assert first == [0, 10, 20]


def test_static_batch_pads_and_holds_memory_until_the_longest_ends():
    # A batch of 2: 10 and 30 tokens to generate. Both run 30 steps (padded); the short one's
    # latency ends at its 10th token, its memory at the batch's end.
    reqs = [Request(0, 20, 10, arrival_step=0), Request(1, 40, 30, arrival_step=0)]
    r = serve(spec(reqs, memory="contiguous", scheduler="static", static_batch=2, policy="openvino-cpu"))
    g0, g1 = sorted(r.groups, key=lambda g: g.index)
    assert (g0.finish_step, g1.finish_step) == (9, 29)
    assert (r.steps["scheduled_requests"] == 2).all() and len(r.steps) == 30


def test_contiguous_oom_preempt_wait_reject_never_crash():
    # max-length reservation (static policy, 1,024 + 128 tokens per request) on a device that holds two.
    per_request = get_precision("f16").kv_bytes_per_token(TOY) * 1152
    reqs = [Request(i, 100, 50, arrival_step=0) for i in range(5)]
    for oom in ("preempt", "wait", "reject"):
        r = serve(spec(reqs, memory="contiguous", scheduler="continuous", policy="static",
                       device_memory=2 * per_request + 1000, paged=SchedulerConfig(on_oom=oom)))
        assert r.steps["allocated_bytes"].max() <= 2 * per_request
        assert r.metrics["requests_finished"] == 5  # admission waits for room; nobody is dropped


def test_paged_pool_larger_than_device_is_a_config_error():
    with pytest.raises(ConfigError, match="does not fit"):
        serve(spec([Request(0, 10, 5, arrival_step=0)], paged=SchedulerConfig(num_kv_blocks=10**9)))


def test_sliding_window_model_runs():
    # mistral-7b (4,096-token window): an 8,000-token prompt runs; the window caps its attention cost
    m = get_model("mistral-7b")
    r = serve(spec([Request(0, 8000, 3, arrival_step=0)], model=m, max_context=0, weights_bytes=0,
                   precision=get_precision("u8")))
    assert r.metrics["requests_finished"] == 1


def test_cli_reference_engine_gives_the_same_report(azure_slice):
    args = ("--trace", str(azure_slice), "--model", "llama-2-7b", "--device", "h100-sxm", "--json")
    fast, ref = cli(*args), cli(*args, "--engine", "reference")
    assert fast.returncode == ref.returncode == 0
    assert json.loads(fast.stdout) == json.loads(ref.stdout)


def test_serving_json_has_every_single_session_key():
    single = cli("--json", "--decode", "10", "--prompt", "10")
    serving = cli("--synthetic", "--requests", "5", "--rate", "5", "--device", "h100-sxm", "--json")
    assert single.returncode == serving.returncode == 0
    missing = set(json.loads(single.stdout)) - set(json.loads(serving.stdout))
    assert not missing, missing


def test_contiguous_wait_deadlock_ends_with_ignored():
    # Two requests whose growth cannot both fit, `wait`: each waits for memory only the other could free.
    # Nothing can ever step, so both are IGNORED (GenAI's rule for a step that schedules nothing).
    from simkv.serving.contiguous import Trajectory

    pol = __import__("policies").get_policy("openvino-cpu")
    t = Trajectory(TOY, get_precision("f16"), pol, 64, 100, 10**12)  # cap 128 tokens, then 258 at token 129
    budget = int(t.peak.max())  # one request alone fits, growth included
    first = int(t.allocated[0])
    assert 2 * first <= budget < first + int(t.peak.max())  # both prompts fit; neither can grow beside the other
    reqs = [Request(0, 64, 100, arrival_step=0), Request(1, 64, 100, arrival_step=0)]
    r = serve(spec(reqs, memory="contiguous", scheduler="continuous", policy="openvino-cpu",
                   device_memory=budget, paged=SchedulerConfig(on_oom="wait")))
    assert [g.status for g in r.groups] == ["IGNORED", "IGNORED"]
    rows = r.ledger.rows
    assert rows["bytes"][rows["op"] == 0].sum() == rows["bytes"][rows["op"] == 2].sum()


def test_contiguous_preempted_request_does_not_step_in_the_step_that_preempted_it():
    # Growing requests (openvino-cpu doubles) on a device that holds ~1,500 tokens: later requests preempt
    # the last admitted. A victim comes after its preemptor in admission order; it used to take its own step
    # anyway (status still RUNNING, already back in the queue), allocating bytes the step table never counted.
    # At the end of every step in which no request finished, the step table's allocated bytes must be the
    # ledger's live bytes (the table is measured before finished requests are freed).
    from simkv.ledger import ALLOC, FREE

    per_token = get_precision("f16").kv_bytes_per_token(TOY)
    reqs = [Request(i, 40 + 7 * i, 300, arrival_step=i) for i in range(6)]
    r = serve(spec(reqs, memory="contiguous", scheduler="continuous", policy="openvino-cpu",
                   device_memory=per_token * 1500, paged=SchedulerConfig(on_oom="preempt")))
    assert r.metrics["preemptions"] > 0 and r.metrics["requests_finished"] == 6
    rows = r.ledger.rows
    delta = np.where(rows["op"] == ALLOC, rows["bytes"], 0) - np.where(rows["op"] == FREE, rows["bytes"], 0)
    live = np.cumsum(np.bincount(rows["step"], weights=delta, minlength=len(r.steps))).astype(np.int64)
    quiet = np.ones(len(r.steps), dtype=bool)
    quiet[[g.finish_step for g in r.groups]] = False
    assert np.array_equal(live[quiet], r.steps["allocated_bytes"][quiet])
    assert r.steps["allocated_bytes"].max() <= per_token * 1500

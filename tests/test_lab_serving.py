"""The lab's serving parts: `simkv tune --serving`, the preemption bound, contiguous waste split, beam rows."""

from __future__ import annotations

import importlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simkv.models import custom_model, get_model
from simkv.precision import get_precision
from simkv.serving import Request, ServingSpec, serve

ROOT = Path(__file__).resolve().parents[1]
TOY = ["--model", "custom", "--layers", "2", "--heads", "2", "--kv-heads", "2", "--head-dim", "32"]


def simkv(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "simkv.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def write_trace(path: Path, rows) -> Path:
    path.write_text("id,arrival,prompt,max_new_tokens\n" + "".join(f"{i},{a},{p},{g}\n" for i, (a, p, g) in
                                                                   enumerate(rows)))
    return path


def tune_grid(trace: Path, *args) -> dict:
    """``simkv tune --serving`` on the toy model, a grid search in one process: its JSON."""
    res = simkv("tune", "--serving", "--trace", str(trace), *TOY, "--device-memory", "1GiB", *args,
                "--search", "grid", "--workers", "1", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_tune_serving_golden_pool_size(tmp_path):
    # One request, prompt 64, 1 new token; toy model (2 layers, 2 kv heads x 32), u8 KV, block 32.
    # Block bytes (DESIGN §4b, CPU u8 layout) = L * H_kv * (40*S + 32*(S+8)) = 2*2*(1280 + 1280) = 10,240 B.
    # The prompt needs ceil(64/32) = 2 blocks. The CPU plugin's scratch copies make the step-0 peak twice the pool.
    #   num_kv_blocks 1: the prompt never fits -> not served -> infeasible;
    #   num_kv_blocks 2: pool 20,480 B, peak 40,960 B;  3: 61,440;  4: 81,920.
    #   baseline (dynamic pool): sized ceil(min(2P, P + max_new)/32) = ceil(65/32) = 3 blocks -> peak 61,440 B.
    # Objective peak:max -> recommendation num_kv_blocks=2 (-33.3 %).
    trace = write_trace(tmp_path / "t.csv", [(0.0, 64, 1)])
    out = tune_grid(trace, "--param", "num_kv_blocks=1:4:1", "--objective", "peak:max", "--objective", "pool:max")
    assert out["baseline"]["objectives"] == {"peak:max": 61440.0, "pool:max": 30720.0}
    assert out["recommendation"]["params"] == {"num_kv_blocks": 2}
    assert out["recommendation"]["objectives"] == {"peak:max": 40960.0, "pool:max": 20480.0}
    assert out["improved"] is True
    assert [p["params"] for p in out["pareto"]] == [{"num_kv_blocks": 2}]
    assert out["evaluated"] == 4
    assert "--num-kv-blocks 2" in out["command"] and out["command"].startswith("simkv run --trace ")
    # Optuna's sampler on the same grid: whatever it tries, what it recommends beats the defaults or is them
    res = simkv("tune", "--serving", "--trace", str(trace), *TOY, "--device-memory", "1GiB",
                "--param", "num_kv_blocks=1:4:1", "--objective", "peak:max", "--budget", "3", "--workers", "1",
                "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["search"] == "optuna" and out["recommendation"]["feasible"]
    assert out["recommendation"]["objectives"]["peak:max"] <= 61440.0


def test_tune_serving_searches_cache_eviction(tmp_path):
    # One request: prompt 150, 400 new tokens; toy model, u8 KV, block 32 (10,240 B).
    #   no eviction, dynamic pool: sized min(2P, P + 400) = 300 tokens (10 blocks), grown by 256 tokens (8 blocks)
    #     when the 11th is needed: 18 blocks = 184,320 B (the baseline);
    #   eviction at max 192: the request keeps at most 192/32 + 1 = 7 blocks (its prompt's 5 are never dropped);
    #     a dynamic pool still reserves the 10 (GenAI reserves as without eviction): 102,400 B;
    #   a fixed pool of 7: enough with eviction (71,680 B); without, the request needs an 8th block no one can
    #     free, the step schedules nothing, it is IGNORED: infeasible.
    trace = write_trace(tmp_path / "t.csv", [(0.0, 150, 400)])
    out = tune_grid(trace, "--param", "cache_eviction_max=0,192", "--param", "num_kv_blocks=0,7",
                    "--objective", "pool:max")
    assert out["baseline"]["objectives"] == {"pool:max": 18 * 10240.0}
    assert out["recommendation"]["params"] == {"cache_eviction_max": 192, "num_kv_blocks": 7}
    assert out["recommendation"]["objectives"] == {"pool:max": 7 * 10240.0}
    assert out["command"].endswith("--num-kv-blocks 7 --cache-eviction start=32,recent=128,max=192")
    assert out["evaluated"] == 4


def test_tune_serving_front_and_reproducing_command(tmp_path):
    # A bursty toy trace; the recommendation must be feasible, no worse than GenAI's defaults on every
    # objective, the front mutually non-dominated, and the printed `simkv run` line must give its numbers.
    rng = np.random.default_rng(3)
    rows = [(round(i * 0.002, 4), int(p), int(g)) for i, (p, g) in
            enumerate(zip(rng.integers(20, 300, 40), rng.integers(2, 60, 40)))]
    trace = write_trace(tmp_path / "t.csv", rows)
    res = simkv("tune", "--serving", "--trace", str(trace), *TOY, "--device-memory", "1GiB", "--device", "h100-sxm",
                "--param", "block_size=16,32", "--param", "num_kv_blocks=0,8,24,64",
                "--param", "max_num_batched_tokens=64,256", "--search", "grid", "--workers", "2", "--json",
                "--figure", str(tmp_path / "front.html"))
    assert res.returncode == 0, res.stderr
    assert "p99 TPOT (ms)" in (tmp_path / "front.html").read_text()
    out = json.loads(res.stdout)
    names = out["objectives"]
    assert names == ["peak:max", "tpot_p99:max", "ttft_p99:max"]
    rec, base = out["recommendation"], out["baseline"]
    assert rec["feasible"] and base["feasible"]
    assert all(rec["objectives"][n] <= base["objectives"][n] for n in names)
    front = out["pareto"]
    assert front and all(c["feasible"] for c in front)
    for a in front:
        for b in front:
            assert not (all(a["objectives"][n] <= b["objectives"][n] for n in names)
                        and any(a["objectives"][n] < b["objectives"][n] for n in names))
    # the pool too small for the longest request (8 blocks of 16 < 300 + 60 tokens) is never recommended
    assert all(c["params"].get("num_kv_blocks") != 8 for c in front)
    words = shlex.split(out["command"])
    assert words[:2] == ["simkv", "run"]
    run = simkv(*words[1:], "--json")
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["requests_finished"] == len(rows)
    assert float(got["peak_allocated_bytes"]) == rec["objectives"]["peak:max"]
    assert got["tpot_p99_s"] == pytest.approx(rec["objectives"]["tpot_p99:max"], rel=1e-12)
    assert got["ttft_p99_s"] == pytest.approx(rec["objectives"]["ttft_p99:max"], rel=1e-12)


@pytest.mark.parametrize("args, message", [
    (["--objective", "tpot_p99:max"], "not measured by a session tune"),
    (["--limit", "5"], "--limit applies to tuning serving settings (--serving)"),
    (["--serving"], "--serving needs --trace"),
    (["--serving", "--trace", "TRACE", "--objective", "reallocs:mean"], "not measured by a serving tune"),
    (["--serving", "--trace", "TRACE", "--param", "headroom_base=1,2"], "not one of block_size"),
    (["--serving", "--trace", "TRACE", "--limit", "0"], "--limit must be in"),
    (["--serving", "--trace", "TRACE", "--constraint", "tpot_p99:max<=fast"], "is not a number"),
])
def test_tune_serving_errors_are_one_line(tmp_path, args, message):
    trace = str(write_trace(tmp_path / "t.csv", [(0.0, 64, 4)]))
    res = simkv("tune", *[trace if a == "TRACE" else a for a in args], *TOY, "--workers", "1")
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_constraint_in_milliseconds():
    from simkv.lab.tune import Constraint

    c = Constraint.parse("tpot_p99:max<=12.5ms")
    assert c.limit == pytest.approx(0.0125) and c.name == "tpot_p99:max<=12.500 ms"
    assert Constraint.parse("ttft_p99<=2").limit == 2.0


def test_max_preemptions_stops_a_run():
    # Eight requests of 100 + 40 tokens in a pool of 6 blocks of 32 (one request needs 5): they preempt each
    # other. Without a limit every request finishes after some preemptions; with a limit below that count the
    # run stops there and the rest are UNFINISHED.
    model = custom_model(None, layers=2, heads=2, kv_heads=2, head_dim=32)
    reqs = [Request(id=i, prompt=100, max_new_tokens=40, arrival_step=0) for i in range(8)]
    from simkv.serving import SchedulerConfig

    def run(limit):
        return serve(ServingSpec(reqs, model, get_precision("u8"), paged=SchedulerConfig(num_kv_blocks=6),
                                 max_context=0, max_preemptions=limit))

    free = run(None)
    assert free.metrics["requests_finished"] == 8 and free.metrics["preemptions"] > 2
    capped = run(2)
    assert capped.metrics["preemptions"] == 3  # stops once the count passes the limit
    assert capped.metrics["requests_unfinished"] > 0 and "more than 2 preemptions" in capped.stopped


@pytest.mark.parametrize("policy, options", [("static", {"max_prompt_len": 512, "min_response_len": 0,
                                                         "prefill_chunk": 1}),
                                             ("openvino-cpu", None), ("openvino-gpu", None)])
@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_contiguous_waste_split_is_conserved(policy, options, scheduler):
    # used + reserved (headroom the request's later tokens fill) + internal (never filled) = allocated, each >= 0;
    # for a max-length reservation the never-filled part is exactly the room past each request's final length.
    rng = np.random.default_rng(7)
    reqs = [Request(id=i, prompt=int(p), max_new_tokens=int(g), arrival_s=float(i) * 0.01)
            for i, (p, g) in enumerate(zip(rng.integers(10, 300, 12), rng.integers(1, 150, 12)))]
    model = custom_model(None, layers=2, heads=4, kv_heads=2, head_dim=32)
    res = serve(ServingSpec(reqs, model, get_precision("f16"), scheduler=scheduler, memory="contiguous",
                            policy=policy, policy_options=options, static_batch=4, max_context=0))
    s = res.steps
    assert (s["reserved_bytes"] >= 0).all() and (s["internal_bytes"] >= 0).all()
    assert (s["used_bytes"] + s["reserved_bytes"] + s["internal_bytes"] == s["allocated_bytes"]).all()
    assert res.metrics["requests_finished"] == len(reqs)
    if policy == "static" and scheduler == "continuous":
        # step 0 holds request 0 alone, after its prompt: a 512-token buffer of 2 layers x (K, V) x 2 kv heads
        # x 32 x 2 B = 512 B per token; it will hold P + G - 1 tokens at most (the last token is not stored),
        # so the rest is never filled.
        kv = get_precision("f16").kv_bytes_per_token(model)
        assert kv == 512
        p0, g0 = reqs[0].prompt, reqs[0].max_new_tokens
        assert s["allocated_bytes"][0] == 512 * kv
        assert s["internal_bytes"][0] == (512 - (p0 + g0 - 1)) * kv


def test_beam_experiment_paged_rows_follow_the_block_rule():
    # DESIGN §4b: n sequences over a prompt of P tokens and G new share floor(P/32) full prompt blocks and own
    # ceil((P+G)/32) - floor(P/32) each; the partly filled last prompt block is copied once per extra sequence.
    sys.path.insert(0, str(ROOT))
    beam = importlib.import_module("experiments.beam_memory")
    block = 2 * 32 * get_model("llama-3-8b").layers * 8 * 128 * 2  # K+V x 32 tokens x L x 8 kv heads x 128 x f16
    for width in (1, 2, 3, 5):
        row = beam.paged_row(100, 24, width)  # stores P + D = 124 positions per beam
        blocks = 100 // 32 + width * (-(-124 // 32) - 100 // 32)
        assert row["peak_allocated_bytes"] == blocks * block, width
        assert row["cow_blocks"] == width - 1 and row["bytes_copied"] == (width - 1) * block
    assert beam.beam_ops(10, 5, 3) == "prefill:10,fork:3,reorder,reorder,reorder,select:0"

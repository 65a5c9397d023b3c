"""simkv.lab.tune, simkv.lab.traces and `simkv tune`."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simkv import build_scenario, simulate
from simkv.errors import ConfigError
from simkv.lab import traces, tune
from simkv.lab.tune import Candidate, Constraint, Objective, Param, TuneSpec

BASE = {"model": "tinyllama-1.1b", "policy": "openvino-gpu", "prompt": 64, "decode": 100}


def write_trace(path, pairs):
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"t,{p},{d}\n" for p, d in pairs))
    return path


# --- objectives, constraints, traces --------------------------------------------------------------


def test_objective_and_constraint_parsing():
    assert Objective.parse("peak") == Objective("peak", "mean")
    assert Objective.parse("reallocs:max").name == "reallocs:max"
    c = Constraint.parse("spike:max<=64MiB")
    assert (c.objective, c.limit) == (Objective("spike", "max"), 64 * 2**20)
    assert Constraint.parse("reallocs:mean <= 12.5").limit == 12.5
    for bad in ("peak:median", "speed", ""):
        with pytest.raises(ConfigError, match="expected METRIC"):
            Objective.parse(bad)
    with pytest.raises(ConfigError, match="expected METRIC"):
        Constraint.parse("peak>=1")
    with pytest.raises(ConfigError, match="not a number"):
        Constraint.parse("reallocs<=lots")


def test_objective_aggregates_over_workloads():
    rows = [{"peak_allocated_bytes": 10, "realloc_count": 1}, {"peak_allocated_bytes": 30, "realloc_count": 4}]
    assert Objective("peak", "mean").of(rows) == 20.0
    assert Objective("peak", "max").of(rows) == 30.0
    assert Objective("reallocs", "mean").of(rows) == 2.5


def test_trace_sampling_is_seeded_and_in_file_order(tmp_path):
    path = write_trace(tmp_path / "t.csv", [(10 + i, 100 + i) for i in range(50)])
    p1, d1 = traces.sample(path, 7, seed=3)
    p2, d2 = traces.sample(path, 7, seed=3)
    assert p1.tolist() == p2.tolist() and d1.tolist() == d2.tolist()
    assert p1.tolist() == sorted(p1.tolist()) and (d1 - p1 == 90).all()  # rows kept whole, in file order
    assert traces.sample(path, 7, seed=4)[0].tolist() != p1.tolist()
    assert len(traces.sample(path, 500, seed=0)[0]) == 50  # fewer rows than asked: all of them
    assert traces.sample(path, traces.ALL, seed=9)[0].tolist() == list(range(10, 60))  # every row, in file order


def test_holdout_rows_are_disjoint_and_do_not_change_the_sample(tmp_path):
    path = write_trace(tmp_path / "t.csv", [(i, 1000 + i) for i in range(1, 41)])
    (p, _), (hp, hd) = traces.split(path, 10, 15, seed=7)
    assert p.tolist() == traces.sample(path, 10, seed=7)[0].tolist()
    assert len(hp) == 15 and not set(p.tolist()) & set(hp.tolist()) and (hd - hp == 1000).all()
    with pytest.raises(ConfigError, match="none left to hold out"):
        traces.split(path, 40, 5, seed=7)


@pytest.mark.parametrize("content, message", [
    ("a,b\n1,2\n", "no ContextTokens or prompt column"),
    ("prompt,decode\n", "has no rows"),
    ("prompt,decode\n5,x\n", "row 2 is not two whole numbers"),
    ("prompt,decode\n5,0\n", "must be >= 1"),
])
def test_trace_errors(tmp_path, content, message):
    path = tmp_path / "t.csv"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        traces.read_trace(path)


def test_shipped_azure_trace():
    prompts, decodes = traces.read_trace(traces.AZURE_CONV)
    # simkv/data/traces/README.md: 19,366 requests, generated tokens at most 1,000, prompts at most 14,050.
    assert len(prompts) == 19_366 and decodes.max() == 1000 and prompts.max() == 14_050


# --- the Pareto front -----------------------------------------------------------------------------


def cand(a, b, feasible=True, **params):
    return Candidate(params, {"a": a, "b": b}, [] if feasible else ["x"])


def test_pareto_front_by_hand():
    cands = [cand(1, 5, p=1), cand(2, 2, p=2), cand(3, 1, p=3), cand(2, 3, p=4), cand(0, 0, False, p=5), cand(3, 3, p=6)]
    # (2,3) is dominated by (2,2); (3,3) by (2,2); (0,0) is infeasible; the rest trade a against b.
    assert [c.params["p"] for c in tune.pareto_front(cands, ["a", "b"])] == [1, 2, 3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.booleans()), min_size=1, max_size=25))
def test_pareto_front_properties(points):
    cands = [cand(a, b, f, i=i) for i, (a, b, f) in enumerate(points)]
    front = tune.pareto_front(cands, ["a", "b"])
    feasible = [c for c in cands if c.feasible]
    for c in front:  # nothing feasible beats a front member
        assert c.feasible and not any(tune._dominates(o, c, ["a", "b"]) for o in feasible)
    for c in feasible:  # every other feasible point is beaten by, or ties with, a front member
        assert c in front or any(tune._dominates(f, c, ["a", "b"]) or f.objectives == c.objectives for f in front)


# --- tuning -------------------------------------------------------------------------------------


def small_spec(**kw):
    values = dict(base=dict(BASE, policy_options={}),
                  params=[Param.parse("headroom_base=0:256:64", "openvino-gpu"), Param.parse("stagger=1,64", "openvino-gpu")],
                  workloads=[(64, 30), (64, 150), (64, 400)], search="grid", budget=50)
    values.update(kw)
    return TuneSpec(**values)


def test_grid_tune_scores_every_configuration_from_real_runs():
    res = tune.run_tune(small_spec(), workers=1)
    assert len(res.evaluated) == 5 * 2
    # Independently: run the recommended configuration on every workload and aggregate by hand.
    peaks, reallocs = [], []
    for prompt, decode in [(64, 30), (64, 150), (64, 400)]:
        m = simulate(build_scenario(model="tinyllama-1.1b", policy="openvino-gpu", policy_options=res.recommendation.params,
                                    prompt=prompt, decode=decode)).metrics
        peaks.append(m.peak_allocated_bytes)
        reallocs.append(m.realloc_count)
    assert res.recommendation.objectives == {"peak:max": max(peaks), "reallocs:mean": float(np.mean(reallocs))}
    names = ["peak:max", "reallocs:mean"]
    if res.improved:  # no worse than the defaults on every objective, better on the first
        assert all(res.recommendation.objectives[n] <= res.baseline.objectives[n] for n in names)
        assert res.recommendation.objectives["peak:max"] < res.baseline.objectives["peak:max"]
        assert res.recommendation in res.pareto


def test_recommendation_is_the_baseline_when_nothing_beats_it():
    # One candidate only, the defaults themselves: nothing can beat them.
    spec = small_spec(params=[Param.parse("headroom_base=128", "openvino-gpu"), Param.parse("stagger=64", "openvino-gpu")])
    res = tune.run_tune(spec, workers=1)
    assert not res.improved and res.recommendation is res.baseline


def test_constraints_make_configurations_infeasible():
    spec = small_spec(constraints=[Constraint.parse("reallocs:mean<=0")])
    res = tune.run_tune(spec, workers=1)
    for c in res.evaluated:
        assert c.feasible == (c.objectives["reallocs:mean"] <= 0)
    assert all(c.feasible for c in res.pareto)


def test_optuna_search_is_deterministic_for_a_seed():
    pytest.importorskip("optuna")
    spec = dict(search="optuna", budget=6, seed=5)
    a = tune.run_tune(small_spec(**spec), workers=1)
    b = tune.run_tune(small_spec(**spec), workers=1)
    assert [c.params for c in a.evaluated] == [c.params for c in b.evaluated]
    assert a.evaluated[0].params == {"headroom_base": 128, "stagger": 64}  # the defaults are tried first


def test_spec_errors():
    with pytest.raises(ConfigError, match="more than --budget"):
        small_spec(budget=3)
    with pytest.raises(ConfigError, match="nothing to tune"):
        small_spec(params=[])
    with pytest.raises(ConfigError, match="--search must be"):
        small_spec(search="annealing")


# --- the command ----------------------------------------------------------------------------------


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "simkv.cli", *args], capture_output=True, text=True, timeout=180)


def test_cli_tune_json_contract_and_reproduce_command(tmp_path):
    trace = write_trace(tmp_path / "t.csv", [(500, d) for d in (20, 90, 160, 230, 300, 370)])
    r = run_cli("tune", "--model", "tinyllama-1.1b", "--prompt", "64", "--trace", str(trace), "--samples", "4",
                "--holdout", "2", "--search", "random", "--budget", "6", "--workers", "1", "--json",
                "--figure", str(tmp_path / "front.html"), "--out", str(tmp_path / "rows.parquet"))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    for key in ("baseline", "recommendation"):
        assert set(data[key]) >= {"params", "objectives"}
    assert data["pareto"] and all(set(p) >= {"params", "objectives"} for p in data["pareto"])
    assert data["workloads"]["count"] == 4 and data["workloads"]["prompt"]["max"] == 64  # prompts from --prompt
    assert data["holdout"]["count"] == 2
    assert set(data["holdout"]["recommendation"]["objectives"]) == set(data["recommendation"]["objectives"])
    assert data["command"].startswith("simkv run ")
    words = shlex.split(data["command"])[2:]
    rerun = run_cli("run", *words, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["scenario"]["policy_options"] | data["recommendation"]["params"] == \
        json.loads(rerun.stdout)["scenario"]["policy_options"]
    assert (tmp_path / "front.html").exists() and (tmp_path / "rows.parquet").exists()


def test_the_reproduce_line_of_a_one_workload_tune_gives_the_tables_numbers(tmp_path):
    """A tune over one workload (here one trace row: prompt 500 from the trace, decode 90) prints ``reproduce:`` with
    that workload's --prompt and --decode, and that line run gives exactly the recommendation's peak and
    reallocations; over two workloads the line is labelled ``apply`` (the table is a mean over both, which no single
    run shows), with the count, and "workloads" in the plural where the header says "1 workload"."""
    trace = write_trace(tmp_path / "t.csv", [(500, 90), (500, 300)])
    common = ("tune", "--model", "tinyllama-1.1b", "--policy", "openvino-gpu", "--trace", str(trace), "--trace-prompts",
              "--search", "random", "--budget", "4", "--workers", "1", "--seed", "3")
    one = run_cli(*common, "--samples", "1", "--json")
    assert one.returncode == 0, one.stderr
    data = json.loads(one.stdout)
    assert data["command_reproduces"] is True and data["workloads"]["count"] == 1
    words = shlex.split(data["command"])
    (prompt, decode), = [(data["workloads"]["prompt"]["max"], data["workloads"]["decode"]["max"])]
    assert words[words.index("--prompt") + 1] == str(prompt) and words[words.index("--decode") + 1] == str(decode)
    rerun = json.loads(run_cli(*words[1:], "--json").stdout)
    assert rerun["peak_allocated_bytes"] == data["recommendation"]["objectives"]["peak:max"]
    assert rerun["realloc_count"] == data["recommendation"]["objectives"]["reallocs:mean"]
    text = run_cli(*common, "--samples", "1").stdout
    assert "openvino-gpu over 1 workload from" in text and text.splitlines()[-1].startswith("reproduce: simkv run ")
    two = run_cli(*common, "--samples", "2")
    assert two.returncode == 0, two.stderr
    assert "openvino-gpu over 2 workloads from" in two.stdout
    assert two.stdout.splitlines()[-1].startswith(
        "apply (the numbers above are over 2 workloads; a simkv run runs one): simkv run ")
    assert json.loads(run_cli(*common, "--samples", "2", "--json").stdout)["command_reproduces"] is False


@pytest.mark.parametrize("args, message", [
    (["--objective", "speed"], "expected METRIC"),
    (["--policy", "exact"], "nothing to tune"),
    (["--trace", "/nonexistent.csv"], "cannot read trace"),
    (["--figure", "x.txt"], "--figure x.txt: the file name must end in .html or .png or .svg"),
    (["--samples", "0", "--trace", "simkv/data/traces/azure_llm_2023_conv.csv"], "must be at least 1 (or all)"),
    (["--samples", "all", "--holdout", "5", "--trace", "simkv/data/traces/azure_llm_2023_conv.csv"], "no rows to hold out"),
    (["--holdout", "5"], "--holdout applies to session workloads drawn from --trace"),
])
def test_cli_tune_errors_are_one_line(args, message):
    r = run_cli("tune", *args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_serving_tune_searches_vllms_settings_under_its_scheduler(tmp_path, capsys):
    """``--serving-scheduler vllm``: the candidates are vLLM's settings served under ``--scheduler vllm``; the
    baseline is vLLM's server defaults for an H100 (8192 batched tokens, 1024 sequences: ``batch_defaults``), and
    the reproduce line serves the chosen settings with ``simkv run --scheduler vllm`` (every vLLM value written:
    its run defaults are the device's). GenAI-only parameters are refused in one line."""
    import shlex

    from simkv.cli import main

    path = tmp_path / "t.csv"
    path.write_text("id,arrival,prompt,max_new_tokens\n" + "".join(f"{i},{i * 0.05},{200 + 10 * i},{20 + i}\n"
                                                                     for i in range(12)))
    args = ["tune", "--serving", "--serving-scheduler", "vllm", "--trace", str(path), "--model", "llama-3.1-8b",
            "--device", "h100-sxm", "--search", "grid", "--budget", "2", "--workers", "1",
            "--param", "max_num_batched_tokens=2048,8192"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    line = out["command"]
    assert "--scheduler vllm" in line and "--gpu-memory-utilization 0.9" in line and "--block-size 16" in line
    assert "--max-num-seqs 1024" in line  # the device's default, not GenAI's 256
    assert out["evaluated"] == 2 and out["baseline"]["feasible"]
    assert main(shlex.split(line)[1:] + ["--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["scenario"]["scheduler"] == "vllm" and run["requests_finished"] == 12
    assert main(args[:-1] + ["cache_size=2,4"]) == 2
    assert "--param cache_size: not one of block_size, gpu_memory_utilization" in capsys.readouterr().err

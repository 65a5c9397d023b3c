"""The dashboard's Serving view: what `simkv run --trace/--synthetic --json` prints, bounded, and never a traceback."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dash import no_update
from hypothesis import given, settings
from hypothesis import strategies as hst

from simkv.cost import DEFAULT_DEVICE
from simkv.dashboard import serving_view as sv
from simkv.dashboard import state as st

ROOT = Path(__file__).resolve().parent.parent

#: A pool of 60 blocks for the first 40 Azure requests: some are preempted, some ignored (prompt > pool).
SMALL_POOL = {"sv_requests": "40", "sv_pool": "blocks", "sv_pool_size": "60"}
#: Contiguous buffers, a synthetic workload, the static scheduler.
SYNTHETIC = {"sv_workload": "synthetic", "sv_requests": "30", "sv_rate": "3", "sv_prompt_dist": "uniform:64:900",
             "sv_output_dist": "lognormal:120:0.8", "sv_seed": "7", "sv_memory": "contiguous",
             "sv_policy": "openvino-cpu", "sv_scheduler": "static", "sv_static_batch": "4", "sv_device": "a100-80gb"}


def form(**over) -> dict:
    return {**sv.DEFAULTS, **over}


def cli(argv: list[str], tmp_path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """`simkv run ARGV --json --requests table.csv` in a subprocess, from the repository root (the shown line)."""
    table = tmp_path / "requests.csv"
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "run", *argv, "--json", "--requests", str(table)],
                         cwd=ROOT, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    with table.open() as fh:
        rows = list(csv.DictReader(fh))
    cols = {k: np.array([float(r[k]) if r[k] not in ("", "nan") else np.nan for r in rows])
            for k in ("ttft_s", "tpot_s", "e2e_s", "preemptions")}
    cols["status"] = np.array([r["status"] for r in rows])
    return json.loads(out.stdout), cols


#: vLLM's scheduler over its block pool (the form's empty block size and batch limits: vLLM's defaults for the device).
VLLM = {"sv_requests": "40", "sv_scheduler": "vllm"}


@pytest.mark.parametrize("over", [SMALL_POOL, SYNTHETIC, VLLM], ids=["paged-small-pool", "contiguous-synthetic-static",
                                                                      "vllm"])
def test_the_view_shows_what_simkv_run_prints(over, tmp_path):
    view = sv.serving_view(form(**over))
    assert view["ok"], view["status"]
    argv = sv.command(form(**over))
    assert view["cli"] == sv.cli_line(argv)
    metrics, table = cli(argv, tmp_path)
    lat = view["latency"]
    # p50 and p99 of TTFT and TPOT: exactly the --json keys.
    assert [lat["TTFT"][0], lat["TTFT"][2], lat["TPOT"][0], lat["TPOT"][2]] == [
        metrics["ttft_p50_s"], metrics["ttft_p99_s"], metrics["tpot_p50_s"], metrics["tpot_p99_s"]]
    # p90, and e2e: numpy's percentiles of the request table `simkv run --requests` writes (requests that have one).
    for name, col in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("e2e", "e2e_s")):
        values = table[col][~np.isnan(table[col])]
        assert lat[name] == pytest.approx([np.percentile(values, q) for q in (50, 90, 99)], rel=1e-12)
        assert lat[name][0] <= lat[name][1] <= lat[name][2]
    cards = {c["key"]: c["value"] for c in view["cards"]}
    assert cards["sv_finished"] == f"{metrics['requests_finished']:,} / {metrics['requests_total']:,}"
    assert cards["sv_preemptions"] == f"{metrics['preemptions']:,}"
    # The waste bars add up to the mean allocated memory (+ the transient peak on top); a bar of a byte or two
    # (the rounding of three separately rounded time-weighted means) is left out.
    bars = {t.name: t.y[0] * 2**30 for t in view["waste"].data}
    transient = bars.pop("transient (in-step peak above allocated)", 0.0)
    assert sum(bars.values()) == pytest.approx(metrics["mean_allocated_bytes"], abs=4)
    assert bars["used (tokens' KV)"] == pytest.approx(metrics["mean_allocated_bytes"] - metrics["waste_bytes"], abs=1e-3)
    assert transient == pytest.approx(metrics["waste_transient_bytes"], abs=1e-3)
    # Marked in the request timeline: exactly the preempted and the ignored/rejected requests of the table.
    marks = {t.name.split(" (")[0]: len(t.x) for t in view["requests"].data if t.mode == "markers" and t.showlegend is not False}
    assert marks.get("preempted", 0) == int((table["preemptions"] > 0).sum())
    assert marks.get("ignored / rejected", 0) == int(np.isin(table["status"], ("IGNORED", "REJECTED")).sum())
    if over is SMALL_POOL:  # the case is chosen to show both marks, and the fixed pool's line
        assert marks["preempted"] > 0 and marks["ignored / rejected"] > 0
        pool = [t for t in view["memory"].data if (t.name or "").startswith("pool")]
        assert pool and pool[0].name == "pool (fixed, 60 blocks)"


@pytest.mark.parametrize("over, key, message", [
    ({"sv_requests": "abc"}, "sv_requests", "'abc' is not a number"),
    ({"sv_requests": "5000"}, "sv_requests", "at most 1,000 in the dashboard"),
    ({"sv_requests": "0"}, "sv_requests", "must be at least 1"),
    ({"sv_workload": "synthetic", "sv_rate": "0"}, "sv_rate", "must be above 0"),
    ({"sv_pool": "gib", "sv_pool_size": "-1"}, "sv_pool_size", "must be above 0"),
    ({"sv_requests": "2.5"}, "sv_requests", "not a whole number"),
    ({"sv_workload": "synthetic", "sv_prompt_dist": "trace:/etc/passwd"}, "sv_prompt_dist", "use fixed:N"),
    ({"sv_workload": "synthetic", "sv_output_dist": "lognormal:200:9"}, "sv_output_dist", "sigma must be in 0..2"),
    ({"sv_workload": "synthetic", "sv_rate": "inf"}, "sv_rate", "not a finite number"),
    ({"sv_scheduler": "static"}, "sv_scheduler", "choose continuous or vllm, or contiguous memory"),
    ({"sv_pool": "blocks", "sv_pool_size": ""}, "sv_pool_size", "enter a number"),
    ({"sv_memory": "contiguous", "sv_policy_opts": "bogus=3"}, "sv_policy_opts", "'bogus' is not an option"),
    ({"sv_memory": "contiguous", "sv_policy_opts": "tokens"}, "sv_policy_opts", "expected KEY=VALUE"),
    ({"sv_device": "mainframe"}, "sv_device", "choose one of"),
    ({"sv_cache_eviction": "max=abc"}, "sv_cache_eviction", "--cache-eviction max must be a whole number"),
    ({"sv_cache_eviction": "max=64"}, "sv_cache_eviction", "must be larger than start + recent"),
])
def test_bad_input_is_one_line_next_to_its_field(over, key, message):
    out = sv.serving_callback(form(**over), "serving")
    errors = dict(zip(sv.KEYS, out["errors"]))
    assert message in errors[key]
    assert [k for k, v in errors.items() if v] == [key]
    # the message once, next to its field; the status names the field
    assert out["status"] == f"Invalid input: {sv.LABELS[key]} — see the message in red on the left."
    assert out["status_class"] == "status invalid"
    assert out["memory"]["layout"]["annotations"][0]["text"].startswith("No result: fix the input marked in red")
    assert out["cards"] == [] and out["cli"] == ""


@pytest.mark.parametrize("over, message", [
    # The library's own one-line errors, with the shown command line.
    ({"sv_model": "llama-3-70b", "sv_device": "arc-a770"},
     "Cannot serve this: llama-3-70b's weights take 65.71 GiB at int8, no less than arc-a770's 16.00 GiB"),
    ({"sv_memory": "contiguous", "sv_policy": "static"}, "does not fit max_prompt_len=1024"),
    # The dashboard's limits: tokens, contiguous ledger rows (estimated before running), scheduler rounds.
    ({"sv_workload": "synthetic", "sv_requests": "1000", "sv_prompt_dist": "fixed:4000"},
     "prompt and output tokens in all: at most 2,000,000 in the dashboard"),
    ({"sv_memory": "contiguous", "sv_policy": "exact"}, "ledger rows (estimated)"),
    ({"sv_requests": "300", "sv_memory": "contiguous", "sv_policy": "fixed", "sv_scheduler": "sequential"},
     "stopped after 8,000 scheduler rounds (the dashboard's limit)"),
])
def test_what_cannot_be_shown_says_why_and_how_to_run_it(over, message):
    out = sv.serving_callback(form(**over), "serving")
    shown = [out["status"], *out["errors"]]
    assert sum(message in line for line in shown) == 1 and out["status_class"] == "status invalid", shown
    assert out["cli"].startswith("simkv run --") and out["cards"] == []
    if not message in out["status"]:  # a limit of a field: the status names it and gives the line to run
        assert out["status"].startswith("Over the dashboard's limits: ") and out["status"].endswith(out["cli"])


def test_the_round_limit_stops_a_paged_run(monkeypatch):
    # 300 requests on a 100-block pool preempt all along: 206 scheduler rounds since squeezed runs plan a full
    # pool's steps (simkv/serving/engine/squeezed.py); a limit of 50 stops it
    monkeypatch.setitem(sv.MAX_ROUNDS, "paged", 50)
    out = sv.serving_callback(form(sv_requests="300", sv_pool="blocks", sv_pool_size="100", sv_device="h100-sxm",
                                   sv_precision="u8"), "serving")
    assert "stopped after 50 scheduler rounds (the dashboard's limit); requests keep waiting for memory" in out["status"]
    assert out["status_class"] == "status invalid" and out["cards"] == []


def test_nothing_runs_while_another_workspace_is_open():
    out = sv.serving_callback(form(sv_requests="abc"), "session")
    assert out["status"] is no_update and out["errors"] == [no_update] * len(sv.KEYS)


def test_the_command_line_follows_the_form():
    # the block size, max_num_seqs and max_num_batched_tokens left empty: the scheduler's own defaults
    assert sv.command(form()) == [
        "--trace", "azure-conv", "--limit", "100", "--model", "llama-3-8b",
        "--memory", "paged", "--scheduler", "continuous", "--device", DEFAULT_DEVICE]  # every command's default
    assert sv.command(form(sv_block_size="16", sv_max_num_seqs="64", sv_max_num_batched_tokens="512"))[-8:] == [
        "--block-size", "16", "--max-num-seqs", "64", "--max-num-batched-tokens", "512", "--device", DEFAULT_DEVICE]
    argv = sv.command(form(sv_memory="contiguous", sv_policy="static", sv_scheduler="sequential",
                           sv_policy_opts="max_prompt_len=4096, min_response_len=0", sv_precision="f16",
                           sv_pool="gib", sv_pool_size="2", sv_max_num_seqs="8", sv_max_num_batched_tokens="64"))
    # the pool and the batch limits do not apply (a sequential run of contiguous buffers): not on the line, which
    # `simkv run` would refuse
    assert argv[argv.index("--policy"):argv.index("--device")] == [
        "--policy", "static", "--policy-opt", "max_prompt_len=4096", "--policy-opt", "min_response_len=0"]
    assert argv[argv.index("--precision") + 1] == "f16"
    # GenAI's cache eviction: its flag form on the line under GenAI's scheduler only (vLLM's has none)
    assert sv.command(form(sv_cache_eviction="max=256"))[-4:] == [
        "--cache-eviction", "start=32,recent=128,max=256", "--device", DEFAULT_DEVICE]
    assert "--cache-eviction" not in sv.command(form(sv_cache_eviction="on", sv_scheduler="vllm"))


def test_the_view_runs_with_cache_eviction():
    # the form's default pool and trace, with GenAI's default budget: blocks are dropped, and fewer are in use
    plain, evicting = (sv.serving_view(form(sv_requests="40", **over)) for over in ({}, {"sv_cache_eviction": "on"}))
    assert plain["ok"] and evicting["ok"], evicting["status"]
    assert "--cache-eviction start=32,recent=128,max=672" in evicting["cli"]
    used = {name: [t for t in view["memory"].data if (t.name or "").startswith("used")][0]
            for name, view in (("plain", plain), ("evicting", evicting))}
    assert max(used["evicting"].y) < max(used["plain"].y)


TEXT = hst.text(alphabet="0123456789.-:e,= abcfxnilu", max_size=12)


@settings(max_examples=150, deadline=None)
@given(values=hst.fixed_dictionaries({k: TEXT for k in sv.KEYS}),
       choices=hst.fixed_dictionaries({"sv_workload": hst.sampled_from(["trace", "synthetic"]),
                                       "sv_memory": hst.sampled_from(["paged", "contiguous", "x"]),
                                       "sv_pool": hst.sampled_from(["dynamic", "blocks", "gib"]),
                                       "sv_scheduler": hst.sampled_from(["continuous", "static", "sequential", "vllm"])}))
def test_any_form_is_a_valid_command_line_or_one_line_per_field(values, choices):
    """Whatever is typed: either a command line that `simkv run`'s own parser accepts, or messages per field."""
    from simkv.cli import build_parser

    values = {**form(), **values, **choices, "sv_model": "tinyllama-1.1b", "sv_device": "h100-sxm",
              "sv_precision": "default", "sv_policy": "fixed"}
    try:
        argv = sv.command(values)
    except st.Invalid as err:
        assert err.errors and set(err.errors) <= set(sv.KEYS)
        assert all(m and "\n" not in m for m in err.errors.values())
        return
    args = build_parser().parse_args(["run", *argv])
    assert (args.limit or 0) >= 1 or args.synthetic


def test_the_view_parses_its_lines_as_simkv_run_does():
    """One declaration of `simkv run`'s flags: the view's parser (no CLI import) reads a line as the command does."""
    from simkv.cli import build_parser
    from simkv.serving.cli import run_parser

    for values in (form(), form(**SMALL_POOL), form(**SYNTHETIC)):
        argv = sv.command(values)
        expected = vars(build_parser().parse_args(["run", *argv]))
        del expected["command"], expected["func"]
        assert vars(run_parser().parse_args(argv)) == expected

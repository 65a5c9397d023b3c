"""``simkv plan`` (simkv.lab.plan): SLO parsing, the guard's bound, and a plan worked out by hand.

The hand-worked plan uses a device whose every step takes 0.1 s (a fixed step overhead; bandwidth and FLOP/s
so large that the model's work adds under a nanosecond) and a trace of ten requests arriving at t = 0, each
with a 16-token prompt and 2 new tokens, served one at a time (``max_num_seqs`` 1): a request takes its prompt
step (the first token at the step's end) and one decode step, so on one device the k-th request's first token
comes at the end of step 2k: TTFT_k = (2k + 1) × 0.1 s, 0.1 … 1.9 s; numpy's p99 of ten values sits at position
0.99 × 9 = 8.91: 1.7 + 0.91 × (1.9 − 1.7) = 1.882 s. Two replicas (round-robin or least-outstanding: both
alternate, ties to replica 0) serve five each: TTFTs 0.1, 0.1, 0.3, 0.3, … 0.9, 0.9 → p99 0.9 s. Tensor
parallelism over two devices only adds all-reduce time to each step: its TTFTs are a little over one device's.
TPOT is the decode step, 0.1 s, everywhere.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simkv.cli import main
from simkv.errors import ConfigError
from simkv.lab import plan

STEP_S = 0.1


@pytest.fixture()
def slow_device(tmp_path):
    path = tmp_path / "tenth.json"
    path.write_text(json.dumps({
        "name": "tenth", "description": "every step 0.1 s", "memory_bytes": 80 * 10**9,
        "memory_bandwidth": 1e24, "peak_flops": {"bf16": 1e27, "f16": 1e27, "int8": 1e27, "f32": 1e27},
        "bandwidth_efficiency": 1.0, "flops_efficiency": 1.0, "step_overhead_s": STEP_S, "copy_bandwidth": 1e24,
        "runtime": "vllm", "interconnect": "nvlink4"}))
    return str(path)


@pytest.fixture()
def ten_at_once(tmp_path):
    path = tmp_path / "ten.csv"
    path.write_text("id,arrival,prompt,max_new_tokens\n" + "".join(f"{k},0,16,2\n" for k in range(10)))
    return str(path)


def _target(trace, slo="ttft_p99=1s,tpot_p99=150ms"):
    return plan.Target({"trace": trace, "limit": None}, "llama-3.1-8b", plan.parse_slo(slo), max_num_seqs=1,
                       dynamic_split_fuse=False)


def test_parse_slo():
    slo = plan.parse_slo("ttft_p99=2s, tpot_p50=50ms,e2e_p90=1.5min")
    assert [(s.name, s.limit_s) for s in slo] == [("ttft_p99", 2.0), ("tpot_p50", 0.05), ("e2e_p90", 90.0)]
    assert str(slo[1]) == "tpot_p50 <= 50 ms"
    stored = plan.Target({"requests": 1}, None, slo).key()["slo"]  # what a row keeps, read back by the worker
    assert stored == "ttft_p99=2.0,tpot_p50=0.05,e2e_p90=90.0" and plan._slo_of_key(stored) == slo
    for bad, words in (("ttft=2s", "METRIC_pQ"), ("ttft_p98=2s", "percentile 98"), ("ttft_p99=2", "unit"),
                       ("ttft_p99=0s", "positive"), ("ttft_p99=1s,ttft_p99=2s", "twice"), ("", "at least one"),
                       ("latency_p99=1s", "METRIC_pQ")):
        with pytest.raises(ConfigError, match=words):
            plan.parse_slo(bad)


def test_parse_prices():
    assert plan.parse_prices(["h100-sxm=4.25,a100-80gb=$2.21"], ["h100-sxm", "a100-80gb"]) == \
        {"h100-sxm": 4.25, "a100-80gb": 2.21}
    assert plan.parse_prices(None, ["h100-sxm"]) is None
    with pytest.raises(ConfigError, match="no price for a100-80gb"):
        plan.parse_prices(["h100-sxm=4"], ["h100-sxm", "a100-80gb"])
    with pytest.raises(ConfigError, match="not one of the plan's devices"):
        plan.parse_prices(["xeon-8480=1"], ["h100-sxm"])
    with pytest.raises(ConfigError, match="positive number"):
        plan.parse_prices(["h100-sxm=free"], ["h100-sxm"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=300), st.sampled_from(plan.QUANTILES),
       st.floats(0.01, 10.0))
def test_more_values_over_the_limit_than_allowed_put_the_percentile_over_it(values, q, limit):
    slo = plan.Slo("ttft", q, limit)
    over = sum(v > limit for v in values)
    if over > slo.allowed_over(len(values)):
        assert np.percentile(values, q) > limit


def test_allowed_over_by_hand():
    # p99 of 100 values sits at 98.01: with 2 above the limit, v[98] is above it
    assert plan.Slo("ttft", 99, 1.0).allowed_over(100) == 1
    assert plan.Slo("ttft", 50, 1.0).allowed_over(10) == 5  # position 4.5: v[4] decides
    assert plan.Slo("ttft", 99, 1.0).allowed_over(10) == 1  # position 8.91


def test_candidates_in_search_order():
    from simkv.hfconfig import resolve_model

    space = plan.Space(("h100-sxm", "xeon-8480"), max_devices=2, tp=(1, 2), routers=("round-robin",),
                       max_num_batched_tokens=(256,))
    cands, skipped = plan.candidates(space, resolve_model("llama-3.1-8b"))
    got = [(c["devices"], c["device"], c["tp"], c["replicas"], c["router"], c["precision"], c["block_size"], c["pool"])
           for c in cands]
    assert got == [(1, "h100-sxm", 1, 1, "-", "bf16", 16, "0.9"), (1, "xeon-8480", 1, 1, "-", "u8", 32, "dynamic"),
                   (2, "h100-sxm", 1, 2, "round-robin", "bf16", 16, "0.9"), (2, "h100-sxm", 2, 1, "-", "bf16", 16, "0.9"),
                   (2, "xeon-8480", 1, 2, "round-robin", "u8", 32, "dynamic")]
    assert len(skipped) == 1 and skipped[0].startswith("xeon-8480 tp 2: ") and "OpenVINO" in skipped[0]
    # each device's runtime's scheduler: vLLM's on the vLLM preset, GenAI's on the OpenVINO one
    assert [c["scheduler"] for c in cands] == ["vllm", "continuous", "vllm", "vllm", "continuous"]
    # vLLM's pool is fixed: a dynamic pool on the H100 is left out with a line; one scheduler for all on request
    dyn = plan.Space(("h100-sxm", "xeon-8480"), max_devices=1, tp=(1,), pools=("dynamic",),
                     max_num_batched_tokens=(256,))
    cands, skipped = plan.candidates(dyn, resolve_model("llama-3.1-8b"))
    assert [c["device"] for c in cands] == ["xeon-8480"] and skipped == [
        "h100-sxm pool dynamic: vLLM's pool is fixed (gpu_memory_utilization)"]
    cands, _ = plan.candidates(space, resolve_model("llama-3.1-8b"), scheduler="continuous")
    assert {c["scheduler"] for c in cands} == {"continuous"}


def test_the_plan_worked_out_by_hand(slow_device, ten_at_once):
    space = plan.Space((slow_device,), max_devices=4, tp=(1, 2, 4), max_num_batched_tokens=(256,))
    result = plan.run_plan(_target(ten_at_once), space, workers=1)
    got = [(r["devices"], r["tp"], r["replicas"], r["router"], r["status"]) for r in result.rows]
    # one device: the guard stops it at t = 1.1 s (four requests, r6..r9, have waited over 1 s for a first token;
    # one may); two devices: both routers meet the SLO, tp 2 misses it like one device does
    assert got == [(1, 1, 1, "-", "slo-guard"), (2, 1, 2, "round-robin", "ok"), (2, 1, 2, "least-outstanding", "ok"),
                   (2, 2, 1, "-", "slo-guard")]
    assert "4 requests waited longer for a first token (stopped at 1 s simulated; at most 1 may)" in result.rows[0]["reason"]
    ok = result.rows[1]
    assert ok["ttft_p99_s"] == pytest.approx(0.9, rel=1e-9)
    assert ok["ttft_p50_s"] == pytest.approx(0.5, rel=1e-9)
    assert ok["tpot_p99_s"] == pytest.approx(STEP_S, rel=1e-9)
    assert result.rows[2]["ttft_p99_s"] == pytest.approx(0.9, rel=1e-9)
    rec = result.recommended
    assert (rec["devices"], rec["tp"], rec["replicas"], rec["router"]) == (2, 1, 2, "round-robin")
    # every deployment of 3 and 4 devices is pruned: tp1 x 3 and x 4 (two routers each), tp2 x 2 (two), tp4 x 1
    assert len(result.pruned) == 7
    assert all("meets the SLO with 2 devices" in why for _, why in result.pruned)
    assert [r["devices"] for r in result.fronts["ttft_p99"]] == [2]


def test_whole_runs_confirm_what_the_guard_stopped(slow_device, ten_at_once):
    # without the guard (an SLO it cannot check: TPOT only), one device runs to the end: TTFT p99 1.882 s, and
    # tp 2 a little more (all-reduces make every step longer)
    def alone(tp):
        space = plan.Space((slow_device,), max_devices=tp, tp=(tp,), max_num_batched_tokens=(256,))
        (row,) = plan.run_plan(_target(ten_at_once, "tpot_p99=150ms"), space, workers=1).rows
        assert row["status"] == "ok" and (row["devices"], row["tp"], row["replicas"]) == (tp, tp, 1)
        return row["ttft_p99_s"]

    one = alone(1)
    assert one == pytest.approx(1.882, rel=1e-9)
    # each step of llama-3.1-8b adds 2 x 32 + 1 = 65 all-reduces of about 24 us (the NVLink 4 fit's latency for two
    # devices; the messages are small): about 1.6 ms on every 100 ms step
    assert 1.882 * (1 + 65 * 20e-6 / STEP_S) < alone(2) < 1.882 * (1 + 65 * 30e-6 / STEP_S)


@pytest.mark.parametrize("router", ["round-robin", "least-outstanding", "least-kv"])
def test_guard_never_stops_a_run_that_meets_the_slo(router):
    """On a real preset and an overloaded synthetic stream: wherever the guard stops a run, the whole run
    (no guard) misses the same target."""
    target = plan.Target({"requests": 300, "rate": 12.0, "arrivals": "poisson", "prompt_dist": "lognormal:1024:1.0",
                          "output_dist": "lognormal:200:1.0", "seed": 3}, "llama-3.1-8b",
                         plan.parse_slo("ttft_p99=1s,e2e_p90=20s"))
    space = plan.Space(("a100-80gb",), max_devices=3, tp=(1,), routers=(router,), max_num_batched_tokens=(256,),
                       pools=("0.3",))
    guarded = plan.run_plan(target, space, workers=1)
    whole = plan.run_plan(plan.Target(target.workload, target.model, plan.parse_slo("tpot_p99=10s")), space, workers=1)
    stopped = 0
    for g, w in zip(guarded.rows, whole.rows):
        assert w["status"] in ("ok", "slo", "unfinished")
        if g["status"] == "slo-guard":
            stopped += 1
            name = g["reason"].split(" > ")[0]
            assert w[name + "_s"] > dict((s.name, s.limit_s) for s in target.slo)[name]
        elif w["status"] == "ok":
            assert g["status"] in ("ok", "slo") and g["ttft_p99_s"] == w["ttft_p99_s"]
    assert stopped  # the case exercises the guard


def test_resume_and_dask_give_the_same_rows(slow_device, ten_at_once, tmp_path, kept_environ):
    pytest.importorskip("distributed")
    from distributed import LocalCluster

    space = plan.Space((slow_device,), max_devices=3, tp=(1, 2), max_num_batched_tokens=(256, 512))
    local = tmp_path / "local.parquet"
    first = plan.run_plan(_target(ten_at_once), space, out=local, workers=2)
    again = plan.run_plan(_target(ten_at_once), space, out=local, workers=2)
    assert again.computed == 0 and again.stored == len(first.rows) and again.rows == first.rows
    on_dask = tmp_path / "dask.parquet"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        plan.run_plan(_target(ten_at_once), space, out=on_dask, scheduler=cluster.scheduler_address)
    assert on_dask.read_bytes() == local.read_bytes()


def test_cli_text_json_and_errors(slow_device, ten_at_once, tmp_path, capsys):
    args = ["plan", "--trace", ten_at_once, "--devices", slow_device, "--max-devices", "2", "--tp", "1",
            "--routers", "round-robin", "--max-num-batched-tokens", "256", "--max-num-seqs", "1", "--no-dynamic-split-fuse",
            "--slo", "ttft_p99=1s,tpot_p99=150ms", "--workers", "1"]
    assert main(args + ["--price", f"{slow_device}=2.5"]) == 0
    text = capsys.readouterr().out
    assert "RECOMMENDED   2 x " in text and "cost $5.00/h" in text and "ttft_p99 900.0 ms" in text
    assert "--replicas 2 --router round-robin" in text
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["recommended"]["devices"] == 2 and out["cost_unit"] == "device-hours per hour"
    assert [d["status"] for d in out["deployments"]] == ["slo-guard", "ok"]
    for extra, words in ((["--slo", "ttft_p99=fast"], "duration"), (["--out", str(tmp_path / "x.csv")], ".parquet"),
                         (["--max-devices", "0"], "--max-devices"), (["--routers", "random"], "unknown router"),
                         (["--pools", "1.5"], "fraction"), (["--price", "h100-sxm=1"], "not one of")):
        assert main(args + extra) == 2
        assert words in capsys.readouterr().err
    assert main(["plan", "--devices", "h100-sxm"]) == 2
    assert "--trace PATH or --synthetic" in capsys.readouterr().err


def test_figure(slow_device, ten_at_once, tmp_path):
    from simkv.lab.plan_figure import plan_figure

    space = plan.Space((slow_device,), max_devices=2, tp=(1,), routers=("round-robin",), max_num_batched_tokens=(256,))
    fig = plan_figure(plan.run_plan(_target(ten_at_once), space, workers=1))
    names = [t.name for t in fig.data]
    assert names.count("recommended") == 2 and "Pareto front" in names  # one panel per SLO


@pytest.mark.parametrize("scheduler, pool_flag", [("auto", "--gpu-memory-utilization 0.5"),
                                                   ("continuous", "--cache-size")])
def test_the_reproduce_line_serves_the_same_run(slow_device, ten_at_once, capsys, scheduler, pool_flag):
    """The device's runtime is vLLM: by default its deployments run vLLM's scheduler, whose pool is vLLM's
    ``gpu_memory_utilization``; ``--serving-scheduler continuous`` serves them with GenAI's and a fixed cache size."""
    import shlex
    from dataclasses import replace

    space = plan.Space((slow_device,), max_devices=2, tp=(1,), routers=("least-outstanding",),
                       max_num_batched_tokens=(256,), pools=("0.5",))
    rec = plan.run_plan(replace(_target(ten_at_once), scheduler=scheduler), space, workers=1).recommended
    line = plan.command(rec)
    assert "--replicas 2 --router least-outstanding" in line and pool_flag in line
    assert ("--scheduler vllm" in line) == (scheduler == "auto")
    assert ("vLLM scheduler" if scheduler == "auto" else "GenAI scheduler") in plan.describe(rec)
    assert main(shlex.split(line)[1:] + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ttft_p99_s"] == rec["ttft_p99_s"] and out["tpot_p99_s"] == rec["tpot_p99_s"]


def test_contiguous_deployments_have_no_blocks_or_pool(ten_at_once):
    from simkv.hfconfig import resolve_model

    space = plan.Space(("h100-sxm",), max_devices=1, tp=(1,), block_sizes=(16, 32), pools=("dynamic", "0.9"),
                       max_num_batched_tokens=(256,), policies=("openvino-cpu", "fixed"))
    cands, _ = plan.candidates(space, resolve_model("llama-3.1-8b"), "contiguous")
    assert [(c["block_size"], c["pool"], c["policy"]) for c in cands] == [(0, "-", "openvino-cpu"), (0, "-", "fixed")]
    target = plan.Target({"trace": ten_at_once, "limit": None}, "llama-3.1-8b", plan.parse_slo("ttft_p99=5s"),
                         memory="contiguous")
    result = plan.run_plan(target, space, workers=1)
    assert [r["status"] for r in result.rows] == ["ok", "ok"]
    assert "contiguous, policy openvino-cpu" in plan.describe(result.rows[0])
    assert "--memory contiguous --policy openvino-cpu" in plan.command(result.rows[0])
    assert "--block-size" not in plan.command(result.rows[0])


def test_a_bad_precision_is_one_line_before_any_run(capsys):
    assert main(["plan", "--synthetic", "--requests", "20", "--devices", "h100-sxm", "--max-devices", "1",
                 "--precisions", "bf16,xyz", "--workers", "1"]) == 2
    assert "unknown precision 'xyz'" in capsys.readouterr().err


def test_cache_eviction_reaches_every_deployment_and_the_reproduce_line(slow_device, tmp_path, capsys):
    # one request decoding past GenAI's default max (672 + 32): with eviction its KV stops growing, and the
    # reproduce line carries the flag; plans without eviction keep their point ids (the key only has it when set)
    trace = tmp_path / "long.csv"
    trace.write_text("id,arrival,prompt,max_new_tokens\n0,0,600,300\n")
    space = plan.Space((slow_device,), max_devices=1, tp=(1,), max_num_batched_tokens=(1024,), pools=("0.5",))
    base = plan.Target({"trace": str(trace), "limit": None}, "llama-3.1-8b", plan.parse_slo("tpot_p99=1s"),
                       scheduler="continuous")
    assert "cache_eviction" not in base.key()
    ev = plan.Target(base.workload, base.model, base.slo, scheduler="continuous",
                     cache_eviction="start=32,recent=128,max=672")
    plain, evicting = (plan.run_plan(t, space, workers=1).recommended for t in (base, ev))
    assert "--cache-eviction start=32,recent=128,max=672" in plan.command(evicting)
    assert "--cache-eviction" not in plan.command(plain)
    assert plan.spec_of(evicting).paged.cache_eviction.max == 672
    assert main(["plan", "--trace", str(trace), "--devices", slow_device, "--max-devices", "1",
                 "--memory", "contiguous", "--cache-eviction", "on"]) == 2
    assert "use --memory paged" in capsys.readouterr().err


# -- traffic: the trace's rates, steady sizing, closed loops ---------------------------------------

def test_traffic_rates_by_hand():
    from simkv.serving import Request

    # 61 arrivals: one a second for 0..49 s, then 11 within the second from 50 s (50.0, 50.1, ..., 51.0):
    # span 51 s -> mean 60 / 51 = 1.176/s; the window is min(60 s, the span) = 51 s, and the one starting at 0 holds
    # the arrivals before 51 s: 50 + 10 = 60 -> 60 / 51 (no later start holds more)
    times = [float(i) for i in range(50)] + [50.0 + i / 10 for i in range(11)]
    reqs = [Request(i, 10, 5, arrival_s=t) for i, t in enumerate(times)]
    tr = plan.traffic(reqs)
    assert tr["requests"] == 61 and tr["span_s"] == 51.0 and tr["window_s"] == 51.0
    assert tr["mean_rate"] == pytest.approx(60 / 51) and tr["peak_rate"] == pytest.approx(60 / 51)
    # over a longer span the window is a minute: 20 arrivals in one second at 100 s among one a second for 200 s
    times = sorted([float(i) for i in range(200)] + [100.0 + (i + 1) / 21 for i in range(20)])
    reqs = [Request(i, 10, 5, arrival_s=t) for i, t in enumerate(times)]
    tr = plan.traffic(reqs)
    # the window from 41 s holds 41..100 (60 ones a second) + the 20 of the burst (100 < t < 101): 80 / 60
    assert tr["window_s"] == 60.0 and tr["peak_rate"] == pytest.approx(80 / 60) and tr["peak_at_s"] == 41.0
    assert plan.traffic(reqs[:1]) is None
    # steady traffic at a rate: the same requests, one every 1/rate seconds
    even = plan.steady(reqs[:3], 4.0)
    assert [r.arrival_s for r in even] == [0.0, 0.25, 0.5] and [r.prompt for r in even] == [10, 10, 10]


def test_plan_reports_the_traffic_and_sizes_it_steady(capsys):
    args = ["plan", "--synthetic", "--requests", "300", "--rate", "20", "--model", "llama-3.1-8b", "--devices",
            "h100-sxm", "--max-devices", "1", "--tp", "1", "--max-num-batched-tokens", "2048", "--traffic-report",
            "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    tr = out["traffic"]
    assert tr["requests"] == 300 and tr["peak_rate"] >= tr["mean_rate"] > 0
    assert set(tr) >= {"steady_mean", "steady_peak"}
    assert tr["steady_mean"] is None or tr["steady_mean"]["devices"] == 1


def test_plan_under_a_closed_loop_searches_one_engine_per_deployment(capsys):
    args = ["plan", "--synthetic", "--requests", "60", "--concurrency", "4", "--model", "llama-3.1-8b", "--devices",
            "h100-sxm", "--max-devices", "2", "--tp", "1,2", "--max-num-batched-tokens", "2048", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["traffic"] is None  # a closed loop has no arrival rate of its own
    assert all(d["replicas"] == 1 for d in out["deployments"])
    assert "--concurrency 4" in out["recommended"]["command"]
    assert main(["plan", "--synthetic", "--concurrency", "4", "--traffic-report"]) == 2
    assert "closed loop" in capsys.readouterr().err

"""``simkv validate --serving``: the comparison's arithmetic (pure), its refusals, and a seconds-long smoke run of
the real pipeline (marker ``openvino``). The timing itself is an experiment (experiments/genai_serving.py), never
asserted here."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simkv.serving.requests import Request
from simkv.validate.genai.serving import compare_requests, real_metrics, workload

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "simkv.cli", "validate", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=600)


def test_workload_is_deterministic_and_scales_arrivals_only():
    a, b = workload(20, 2.0, 7), workload(20, 4.0, 7)
    assert a == workload(20, 2.0, 7)
    assert [(r.prompt, r.max_new_tokens) for r in a] == [(r.prompt, r.max_new_tokens) for r in b]
    assert a[0].arrival_s == 0.0
    # Arrivals are cumulative gaps / rate: twice the rate, half the time (to the 6 decimals they are rounded to).
    assert all(abs(x.arrival_s - 2 * y.arrival_s) <= 2e-6 for x, y in zip(a, b))
    assert all(32 <= r.prompt <= 256 and 16 <= r.max_new_tokens <= 64 for r in a)


def test_real_metrics_follow_the_request_table_definitions():
    # Request 0 arrives at 1.0 s; its first token leaves at 1.5 s, its 5th and last at 2.3 s:
    # TTFT 0.5, TPOT (2.3 - 1.5) / 4 = 0.2, e2e 1.3. Request 1 got 2 of its 3 tokens: TTFT only.
    reqs = [Request(0, 10, 5, arrival_s=1.0), Request(1, 10, 3, arrival_s=2.0)]
    live = {"requests": [{"id": 0, "generated": 5, "first_s": 1.5, "last_s": 2.3},
                         {"id": 1, "generated": 2, "first_s": 2.25, "last_s": 2.5}]}
    m = real_metrics(reqs, live)
    assert m["ttft_s"] == pytest.approx([0.5, 0.25])
    assert m["tpot_s"][0] == pytest.approx(0.2) and math.isnan(m["tpot_s"][1])
    assert m["e2e_s"][0] == pytest.approx(1.3) and math.isnan(m["e2e_s"][1])


def test_compare_requests_judges_beyond_the_spread_only():
    # Two real runs of 3 requests; TTFT p50 per run = 2.0 and 2.4 -> median 2.2, spread (2.4 - 2.0) / 2.2 = 18.2 %.
    # The simulation's p50 is 1.9: error 1.9 / 2.2 - 1 = -13.6 %, beyond the 10 % bound but within the spread.
    real = [{"ttft_s": [1.0, 2.0, 3.0], "tpot_s": [1.0] * 3, "e2e_s": [1.0] * 3},
            {"ttft_s": [1.4, 2.4, 3.4], "tpot_s": [1.0] * 3, "e2e_s": [1.0] * 3}]
    sim = {"ttft_s": [0.9, 1.9, 2.9], "tpot_s": [1.0] * 3, "e2e_s": [1.25] * 3}
    out = compare_requests(real, sim, judged=True)
    p50 = out["ttft_s"]["p50"]
    assert p50["real_s"] == pytest.approx(2.2) and p50["spread_pct"] == pytest.approx(100 * 0.4 / 2.2)
    assert p50["error_pct"] == pytest.approx(100 * (1.9 / 2.2 - 1)) and p50["within"] is True
    # Paired ratios: sim / per-request median of the runs = 0.9/1.2, 1.9/2.2, 2.9/3.2.
    assert out["ttft_s"]["paired_ratio"]["median"] == pytest.approx(1.9 / 2.2)
    # e2e: no spread (identical runs), 25 % high: outside; TPOT exact: within.
    assert out["e2e_s"]["p50"]["within"] is False and out["tpot_s"]["p90"]["within"] is True
    assert compare_requests(real, sim, judged=False)["e2e_s"]["p50"]["within"] is None


def test_mixed_step_is_one_step_of_both_parts_work():
    """A mixed step of b decodes at context C beside a c-token prompt chunk is priced as ONE step: the fixed step
    cost and the weights once, the matmuls over b + c rows, b + 1 logit rows, attention work added. So (the toy
    shape on the xeon-8480 preset): with b = 0 it is the chunk's own prefill (forward_cost, batch 1, context 0);
    it costs less than the pure decode step plus the pure prefill step by at least the per-step overhead the two
    separate steps pay twice (step_overhead_s + layers * layer_overhead_s); and it grows with each decode."""
    from simkv.cost import forward_cost, get_device
    from simkv.precision import get_precision
    from simkv.validate.genai.serving import LiveConfig, cost_model, mixed_step_s

    model, dev, kv = cost_model(LiveConfig().spec()), get_device("xeon-8480"), get_precision("bf16")
    args = dict(weights_precision="bf16", precision="bf16")
    alone = forward_cost(model, dev, kv, batch=1, context=0, new=64, **args).seconds
    assert float(mixed_step_s(model, dev, kv, "bf16", batch=0, context=64, chunk=64)) == pytest.approx(alone, rel=1e-12)
    both = float(mixed_step_s(model, dev, kv, "bf16", batch=16, context=64, chunk=64))
    apart = alone + forward_cost(model, dev, kv, batch=16, context=64, new=1, **args).seconds
    assert both <= apart - (dev.step_overhead_s + model.layers * dev.layer_overhead_s) + 1e-15
    steps = mixed_step_s(model, dev, kv, "bf16", batch=np.arange(5), context=64, chunk=64)
    assert np.all(np.diff(steps) > 0)


@pytest.mark.parametrize("args, message", [
    (["--requests", "0"], "--requests must be in 1..500"),
    (["--busy", "0.3,x"], "--busy takes a comma-separated list"),
    (["--repeats", "11"], "--repeats must be in 1..10"),
    (["--layers", "400"], "weights"),
    (["--device", "no-such-device"], "no-such-device"),
    (["--mixed-batches", "4x64x2"], "--mixed-batches takes a comma-separated list of DECODESxCHUNK"),
    (["--mixed-batches", "0x64"], "mixed batches are DECODESxCHUNK"),
])
def test_bad_flags_are_one_line_errors(args, message):
    r = _cli("--serving", *args)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr


def test_missing_host_preset_is_one_line(tmp_path):
    r = _cli("--serving", env={"SIMKV_HOST_PRESET": str(tmp_path / "none.json")})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "calibrate" in r.stderr


@pytest.mark.openvino
def test_smoke_real_pipeline_both_stages():
    """A 1-layer model, two fixed batches, 3 requests served once: every row and request measured and compared."""
    pytest.importorskip("openvino_genai")
    r = _cli("--serving", "--device", "xeon-8480", "--layers", "1", "--heads", "2", "--kv-heads", "1",
             "--head-dim", "32", "--hidden", "64", "--decode-batches", "1,2", "--prefill-chunks", "16,32",
             "--mixed-batches", "2x16", "--step-repeats", "2", "--requests", "3", "--busy", "0.5", "--repeats", "1", "--cpu", "-1", "--json")
    assert r.returncode in (0, 1), r.stderr
    data = json.loads(r.stdout)
    rows = data["steps"]["rows"]
    assert [(x["kind"], x["size"]) for x in rows] == [("decode", 1), ("decode", 2), ("prefill", 16), ("prefill", 32),
                                                     ("mixed", "2x16")]
    assert all(x["measured_ms"] > 0 and x["predicted_ms"] > 0 for x in rows)
    (load,) = data["serving"]["loads"]
    for m in ("ttft_s", "tpot_s", "e2e_s"):
        assert load["metrics"][m]["paired_ratio"]["requests"] == 3  # every request finished, every token seen

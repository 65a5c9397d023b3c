"""``simkv validate`` without OpenVINO: the comparison logic, the report, the CLI's refusal.

The real end-to-end run is in tests/test_validate_real.py (marked ``openvino``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from simkv import build_scenario, simulate
from simkv.validate.compare import (
    STATUSES,
    align,
    align_events,
    common_slope,
    compare,
    predicted_events,
    quiet_stretches,
    slope_comparison,
    summary_lines,
)

TOP_KEYS = {
    "events_total": int, "events_matched": int, "events_missing": int, "events_unexpected": int,
    "effective_kv_precision": str, "fused": bool, "scenario": dict, "versions": dict, "steps": list, "events": list,
}
STEP_KEYS = {"step", "phase", "measured_rss_bytes", "measured_vmsize_bytes", "measured_hwm_bytes",
             "predicted_resident_bytes", "predicted_allocated_bytes", "predicted_peak_bytes", "latency_ms", "realloc"}
EVENT_KEYS = {"step", "layer", "tensor", "op", "bytes", "status"}


def _sim(ops="prefill:8,decode:40,fork:2,decode:5,reorder,select:1,decode:3,reset,prefill:30,decode:4", layers=2,
         kv_heads=2, head_dim=64):
    return simulate(build_scenario(model=None, layers=layers, heads=kv_heads, kv_heads=kv_heads, head_dim=head_dim,
                                   precision="u8", policy="openvino-cpu", ops=ops))


def _big():
    """A model whose KV growth over a quiet stretch is many pages (slopes are comparable):
    8 layers x 8 KV heads x 128, u8 (17,472 B per token), prompt 32, decode 1,200 (quiet
    stretch 496..1,054), every reallocation step's rise over 1 MiB."""
    return _sim("prefill:32,decode:1200", layers=8, kv_heads=8, head_dim=128)


# --------------------------------------------------------------------------- alignment


def test_identical_sequences_all_match():
    seq = [("alloc", "k", 0, 64), ("alloc", "v", 0, 64), ("free", "k", 0, 32)]
    assert align(seq, list(seq)) == [("matched", k) for k in seq]


def test_missing_and_unexpected_are_placed_in_order():
    pred = [("alloc", "k_beam", 0, 8), ("alloc", "k", 0, 64), ("alloc", "v", 0, 64), ("free", "v", 0, 32)]
    obs = [("alloc", "k_beam", 0, 8), ("alloc", "k", 0, 64), ("alloc", "x", None, 5), ("free", "v", 0, 32)]
    out = align(obs, pred)
    assert [s for s, _ in out].count("matched") == 3
    assert ("missing", ("alloc", "v", 0, 64)) in out
    assert ("unexpected", ("alloc", "x", None, 5)) in out
    # order of the matched events is kept
    matched = [k for s, k in out if s == "matched"]
    assert matched == [pred[0], pred[1], pred[3]]


def test_swapped_order_is_one_match_one_missing_one_unexpected():
    a, b = ("free", "k", 0, 8), ("free", "v", 0, 8)
    out = align([a, b], [b, a])
    assert sorted(s for s, _ in out) == ["matched", "missing", "unexpected"]


def test_a_wrong_size_is_missing_plus_unexpected():
    out = align([("alloc", "k", 0, 100)], [("alloc", "k", 0, 104)])
    assert sorted(out) == [("missing", ("alloc", "k", 0, 104)), ("unexpected", ("alloc", "k", 0, 100))]


def test_empty_sides():
    assert align([], []) == []
    assert align([], [("alloc", "k", 0, 1)]) == [("missing", ("alloc", "k", 0, 1))]
    assert align([("alloc", "k", 0, 1)], []) == [("unexpected", ("alloc", "k", 0, 1))]


def test_alignment_is_a_longest_common_subsequence():
    rng = np.random.default_rng(1)
    for _ in range(200):
        o = [("alloc", "k", 0, int(x)) for x in rng.integers(0, 4, size=rng.integers(0, 9))]
        p = [("alloc", "k", 0, int(x)) for x in rng.integers(0, 4, size=rng.integers(0, 9))]
        out = align(o, p)
        # brute-force LCS length
        n, m = len(o), len(p)
        t = [[0] * (m + 1) for _ in range(n + 1)]
        for i in range(n):
            for j in range(m):
                t[i + 1][j + 1] = t[i][j] + 1 if o[i] == p[j] else max(t[i][j + 1], t[i + 1][j])
        assert sum(s == "matched" for s, _ in out) == t[n][m]
        assert [k for s, k in out if s != "missing"] == o  # observed order preserved
        assert [k for s, k in out if s != "unexpected"] == p  # predicted order preserved


def test_align_events_groups_by_step_and_counts():
    pred = [{"step": 0, "layer": 0, "tensor": "k", "op": "alloc", "bytes": 8},
            {"step": 2, "layer": None, "tensor": "past_view", "op": "alloc", "bytes": 4}]
    obs = [{"step": 0, "layer": 0, "tensor": "k", "op": "alloc", "bytes": 8},
           {"step": 1, "layer": 0, "tensor": "v", "op": "free", "bytes": 8}]
    out = align_events(obs, pred)
    assert [(e["step"], e["status"]) for e in out] == [(0, "matched"), (1, "unexpected"), (2, "missing")]
    assert set(out[0]) == EVENT_KEYS


def test_predicted_events_drop_copies_and_mark_the_view_layer_none():
    res = _sim()
    ev = predicted_events(res)
    assert ev and all(e["op"] in ("alloc", "free") for e in ev)
    assert all(e["layer"] is None for e in ev if e["tensor"] == "past_view")
    assert all(isinstance(e["layer"], int) for e in ev if e["tensor"] != "past_view")
    # the reset is its own step (52: prefill 0, decode 1-40, fork 41, decode 42-46, reorder 47,
    # select 48, decode 49-51) and allocates nothing
    assert res.steps["phase"][52] == 6  # "reset"
    assert not [e for e in ev if e["step"] == 52]


# --------------------------------------------------------------------------- slopes


def test_common_slope_recovers_the_slope_despite_different_intercepts():
    x1, x2 = np.arange(0, 50), np.arange(100, 300)
    y1, y2 = 7.0 * x1 + 1000, 7.0 * x2 - 55555
    assert common_slope([x1, x2], [y1, y2]) == pytest.approx(7.0)
    assert np.isnan(common_slope([np.array([1])], [np.array([2])]))


def test_quiet_stretches_split_at_events_phases_and_batch():
    phases = ["prefill"] + ["decode"] * 9 + ["fork"] + ["decode"] * 4 + ["reset", "prefill", "decode"]
    batch = [1] * 10 + [2] * 5 + [1, 1, 1]
    out = quiet_stretches(phases, batch, event_steps=[0, 5])
    assert [(s.start, s.end) for s in out] == [(1, 4), (6, 9), (11, 14), (17, 17)]


def test_slope_comparison_uses_long_stretches_or_the_longest():
    x = np.arange(100, dtype=np.int64)
    pred = 10 * x
    meas = 11 * x + 5
    st = quiet_stretches(["decode"] * 100, [1] * 100, event_steps=[50])
    full = slope_comparison(x, meas, pred, st, min_tokens=40)
    assert full["error_pct"] == pytest.approx(10.0) and full["tokens"] == 99
    fallback = slope_comparison(x, meas, pred, st, min_tokens=500)
    assert fallback["tokens"] == 50 and "longest" in fallback["rule"]
    none = slope_comparison(x[:5], meas[:5], pred[:5], quiet_stretches(["decode"] * 5, [1] * 5, []), min_tokens=500)
    assert none["error_pct"] is None


# --------------------------------------------------------------------------- compare


def _fake_observation(res, drop=None, extra=None):
    """Observed events = predicted ones (a perfect runtime), optionally perturbed."""
    obs = [dict(e) for e in predicted_events(res)]
    if drop is not None:
        del obs[drop]
    if extra is not None:
        obs.insert(extra[0], extra[1])
    return obs


def _fake_samples(res, base_rss=100 << 20, base_vms=600 << 20, noise=0):
    st = res.steps
    rng = np.random.default_rng(0)
    return [
        {"seq": i, "rss_bytes": int(base_rss + st["resident"][i] + (rng.integers(0, noise) if noise else 0)),
         "vmsize_bytes": int(base_vms + st["allocated"][i]), "hwm_bytes": int(base_rss + st["resident_peak"][i]),
         "latency_s": 0.001 * (3 if i in (0, 33) else 1)}
        for i in range(len(st))
    ]


def test_perfect_runtime_compares_exactly():
    res = _big()
    data = compare(_fake_observation(res), _fake_samples(res), res, min_tokens=300, mmap_threshold=0)
    assert data["events_missing"] == data["events_unexpected"] == 0
    assert data["events_matched"] == data["events_total"] == len(predicted_events(res))
    assert data["resident_slope_error_pct"] == pytest.approx(0.0, abs=1e-9)
    assert data["rise_error_pct"] == pytest.approx(0.0, abs=1e-9) and data["rss_error_pct"] == 0.0
    # on the CPU plugin a step rises by about one layer's KV (its old buffers are still alive
    # when its new ones are written): 2 x 8 x 128 x 1 B + scales + beams = 2,184 B per token,
    # so only steps 495 (527 tokens: 1.15 MB) and 1,023 (1,055 tokens) reach the 1 MiB floor
    big = [r["step"] for r in data["rises"] if r["predicted_rise_bytes"] >= 1 << 20]
    assert big == [495, 1023] and data["rise"]["comparable_steps"] == 2
    assert data["alloc_peak_error_pct"] == pytest.approx(0.0)
    assert data["baseline"]["rss_bytes"] == 100 << 20 and data["baseline"]["step"] == 1
    assert data["vmsize_step_error_pct"] == pytest.approx(0.0)
    st = data["steps"]
    assert len(st) == len(res.steps) and set(st[0]) >= STEP_KEYS
    assert st[0]["realloc"] is False and st[33]["realloc"] is True and st[34]["realloc"] is False
    assert st[5]["predicted_resident_bytes"] == st[5]["measured_rss_bytes"]
    assert {e["status"] for e in data["events"]} == {"matched"}
    assert any("PASS" in line for line in summary_lines(data))


def test_a_missing_and_an_unexpected_event_are_counted():
    res = _sim()
    stray = {"step": 3, "layer": 1, "tensor": "k", "op": "alloc", "bytes": 12345}
    data = compare(_fake_observation(res, drop=0, extra=(5, stray)), None, res)
    assert data["events_missing"] == 1 and data["events_unexpected"] == 1
    assert data["events_matched"] == len(predicted_events(res)) - 1
    bad = [e for e in data["events"] if e["status"] != "matched"]
    assert {e["status"] for e in bad} == {"missing", "unexpected"}
    assert any(e["bytes"] == 12345 and e["status"] == "unexpected" for e in bad)
    assert any("FAIL" in line for line in summary_lines(data))
    assert data["rise_error_pct"] is None and data["steps"][0]["measured_rss_bytes"] is None


def test_measured_slope_error_is_reported_not_hidden():
    res = _big()
    samples = _fake_samples(res)
    for i, s in enumerate(samples):  # 5 % more RSS per token than predicted
        s["rss_bytes"] += int(0.05 * res.steps["resident"][i])
    data = compare(_fake_observation(res), samples, res, min_tokens=300, mmap_threshold=0)
    assert data["resident_slope_error_pct"] == pytest.approx(5.0, abs=0.1)


def test_in_step_rise_error_is_measured_at_every_reallocation_step():
    """The measured rise is VmHWM(s) - RSS(s-1): nothing predicted enters it, so a
    runtime that peaks 10 % higher in one step shows +10 % there and 0 elsewhere."""
    res = _big()
    samples = _fake_samples(res)
    st = res.steps
    realloc = [r["step"] for r in compare(_fake_observation(res), samples, res, mmap_threshold=0)["rises"]]
    # prompt 32 -> cap 2*32 = 64; step s stores 32+s tokens, so step 33 (65 tokens) grows to
    # 2*(64+1) = 130, step 99 (131) to 262, step 231 (263) to 526, step 495 (527) to 1,054,
    # step 1,023 (1,055) to 2,110
    assert realloc == [33, 99, 231, 495, 1023]
    s = 1023
    rise = int(st["resident_peak"][s] - st["resident"][s - 1])
    samples[s]["hwm_bytes"] += rise // 10
    data = compare(_fake_observation(res), samples, res, mmap_threshold=0)
    errs = {r["step"]: r["error_pct"] for r in data["rises"]}
    assert errs[s] == pytest.approx(100 * (rise // 10) / rise) and errs[495] == 0.0
    assert errs[33] is errs[99] is errs[231] is None  # rises under 1 MiB are not compared
    assert data["rise_error_pct"] == errs[s] and data["rise"]["worst_step"] == s
    assert data["rise"]["median_error_pct"] == pytest.approx(errs[s] / 2)


def test_absolute_rss_error_uses_one_baseline():
    """+1 MiB of RSS from step 200 on: the final step is 1 MiB above baseline + KV."""
    res = _big()
    samples = _fake_samples(res)
    for s in samples[200:]:
        s["rss_bytes"] += 1 << 20
    data = compare(_fake_observation(res), samples, res, mmap_threshold=0)
    final = data["rss"]["final"]
    predicted = (100 << 20) + int(res.steps["resident"][-1])
    assert final["deviation_bytes"] == 1 << 20 and final["predicted_bytes"] == predicted
    assert data["rss_error_pct"] == pytest.approx(100 * (1 << 20) / predicted)
    assert final["kv_error_pct"] == pytest.approx(100 * (1 << 20) / int(res.steps["resident"][-1]))
    assert data["rss"]["worst"]["deviation_bytes"] == 1 << 20 and data["rss"]["worst"]["step"] >= 200


def test_heap_bounds_by_hand():
    """1 layer, 1 KV head x 64, u8, prompt 10 -> capacity 2*10 = 20 tokens:
    K/V data 20*64 = 1,280 B each, K/V scale 20*8 = 160 B, K/V beam 20*4 = 80 B (3,040 B).
    Threshold 1,000 B: only the data buffers get their own mapping, so the small ones
    are 2*(160+80) = 480 B, and 2*(8+4) = 24 of the 2*(64+8+4) = 152 B per token."""
    from simkv.validate.compare import heap_bounds

    res = simulate(build_scenario(model=None, layers=1, heads=1, kv_heads=1, head_dim=64, precision="u8",
                                  policy="openvino-cpu", ops="prefill:10"))
    hb = heap_bounds(res, 1000)
    assert hb["small_alloc_bytes"].tolist() == [480] and hb["small_cum_bytes"].tolist() == [480]
    assert hb["small_row_bytes"].tolist() == [24] and hb["row_bytes"].tolist() == [152]
    assert heap_bounds(res, 65536)["small_alloc_bytes"].tolist() == [3040]


def test_small_models_are_marked_not_comparable():
    """A 3-layer toy, 2 KV heads x 64, u8: at the last growth (cap 1,054) K data is
    1,054*2*64 = 134,912 B (own mapping at MALLOC_MMAP_THRESHOLD_=65536) but a scale
    buffer is 1,054*2*8 = 16,864 B and a beam table 4,216 B: 2*(16+4) = 40 of the
    2*(128+16+4) = 296 bytes of each token (13.5 %) land in the glibc heap, so no
    memory number is printed."""
    res = _sim("prefill:32,decode:700", layers=3)
    samples = _fake_samples(res)
    for i, s in enumerate(samples):
        s["rss_bytes"] += int(0.3 * res.steps["resident"][i])  # would be a +30 % slope error
    data = compare(_fake_observation(res), samples, res, min_tokens=300, mmap_threshold=65536)
    assert data["resident_slope_error_pct"] is None and "heap" in data["resident_slope"]["not_comparable"]
    # its longest quiet stretch (232..494: 263 steps x 888 B = 233,544 B) is under the 1 MiB floor
    assert data["resident_slope"]["heap_bound_pct"] is None
    assert data["rss_error_pct"] is None and data["rss"]["final"]["comparable"] is False
    assert data["rise"]["comparable_steps"] == 0 and data["rise_error_pct"] is None
    text = "\n".join(summary_lines(data))
    assert "not comparable" in text and "+30" not in text


def test_summary_reports_a_failed_clean_run():
    res = _sim()
    data = compare(_fake_observation(res), None, res)
    data["clean_run_error"] = "clean run (MALLOC_MMAP_THRESHOLD_=65536) crashed (SIGSEGV)"
    text = "\n".join(summary_lines(data))
    assert "(SIGSEGV): memory and latency not compared" in text and "PASS" in text


def test_compare_rejects_a_clean_run_of_another_length():
    res = _sim()
    with pytest.raises(ValueError):
        compare(_fake_observation(res), _fake_samples(res)[:-1], res)


# --------------------------------------------------------------------------- report


def _full_dict():
    res = _sim("prefill:32,decode:300,fork:2,decode:10,select:0", layers=2)
    data = compare(_fake_observation(res, drop=3), _fake_samples(res, noise=4096), res, min_tokens=100)
    head = {k: data.pop(k) for k in ("events_total", "events_matched", "events_missing", "events_unexpected",
                                      "rise_error_pct", "resident_slope_error_pct", "rss_error_pct")}
    head.update({"effective_kv_precision": "u8", "fused": True,
                 "scenario": {"layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 64, "workload": str(res.scenario.workload)},
                 "versions": {"openvino": "test", "cpu_flags": {"avx512_bf16": True}, "MALLOC_MMAP_THRESHOLD_": "65536"}})
    head.update(data)
    return head


def test_report_is_self_contained_and_deterministic(tmp_path):
    from simkv.validate.report import DIV_IDS, figures, write_report

    data = _full_dict()
    json.dumps(data)  # JSON-ready
    a, b = write_report(data, tmp_path / "a.html"), write_report(data, tmp_path / "b.html")
    text = a.read_text()
    assert text == b.read_text()
    assert all(f'id="{div}"' in text for div in DIV_IDS.values())
    assert "<script src=" not in text and "avx512_bf16=yes" in text and "MALLOC_MMAP_THRESHOLD_" in text
    assert "FAIL" in text and "missing" in text
    assert set(figures(data)) == set(DIV_IDS)


def test_json_shape_types():
    data = _full_dict()
    for key, kind in TOP_KEYS.items():
        assert isinstance(data[key], kind), key
    for key in ("rise_error_pct", "resident_slope_error_pct", "rss_error_pct"):
        assert data[key] is None or isinstance(data[key], float)
    for s in data["steps"]:
        assert STEP_KEYS <= set(s)
        assert isinstance(s["realloc"], bool)
        assert s["measured_hwm_bytes"] is None or isinstance(s["measured_hwm_bytes"], int)
    for e in data["events"]:
        assert set(e) == EVENT_KEYS and e["status"] in STATUSES


# --------------------------------------------------------------------------- without OpenVINO

_BLOCK = "import sys; sys.modules['openvino'] = None; sys.modules['memray'] = None; "


def _py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _BLOCK + code], capture_output=True, text=True, timeout=120)


def test_without_openvino_validate_fails_with_one_line():
    proc = _py("from simkv.cli import main; sys.exit(main(['validate', '--decode', '10']))")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'simkv[openvino]'" in lines[0]
    assert proc.stdout == ""


def test_without_openvino_simkv_and_run_still_work():
    proc = _py("import simkv, simkv.validate, simkv.validate.compare, simkv.validate.report; "
               "from simkv.cli import main; sys.exit(main(['run', '--model', 'custom', '--layers', '2', "
               "'--kv-heads', '2', '--head-dim', '64', '--prompt', '8', '--decode', '20', '--policy', 'openvino-cpu', '--json']))")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["steps"] == 21


def test_validate_rejects_bad_input_before_running(tmp_path):
    for args, needle in (
        (["--ir", str(tmp_path / "m.xml"), "--layers", "3"], "--ir takes the dimensions"),
        (["--heads", "6", "--kv-heads", "4"], "multiple"),
        (["--ops", "decode:3"], "prefill"),
        (["--vocab", "0"], "positive"),
    ):
        proc = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", *args], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2, (args, proc.stderr)
        assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_prompt_steps_are_not_compared_as_kv():
    """A chat turn of 900 tokens after a 32-token prompt: it reallocates (cap 2*(632+900)),
    but its VmHWM also holds the prompt's activations, and afterwards glibc keeps them in
    RSS: that rise and every RSS figure from then on are marked, not printed."""
    res = _sim("prefill:32,decode:600,prefill:900,decode:50", layers=8, kv_heads=8, head_dim=128)
    data = compare(_fake_observation(res), _fake_samples(res), res, mmap_threshold=0)
    turn = 601
    rise = {r["step"]: r for r in data["rises"]}[turn]
    assert rise["phase"] == "turn" and rise["error_pct"] is None and "prompt" in rise["not_comparable"]
    assert data["rss"]["final"]["comparable"] is False and "longer than the first" in data["rss"]["final"]["not_comparable"]
    assert data["rss"]["worst"]["step"] < turn and data["rss_error_pct"] is None

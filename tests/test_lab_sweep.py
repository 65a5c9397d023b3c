"""simkv.lab.sweep and `simkv sweep`: grids, rows, resuming, local processes and Dask give the same rows."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simkv import build_scenario, simulate
from simkv.errors import ConfigError
from simkv.lab import sweep
from conftest import default_sigint

BASE = {"model": "tinyllama-1.1b", "policy": "openvino-gpu", "prompt": 64, "decode": 100}


def points(decodes=(40, 90, 170), bases=(0, 96)):
    return [sweep.make_point(BASE, {"headroom_base": b, "decode": d}) for b in bases for d in decodes]


def test_parse_param_ranges_and_lists():
    assert sweep.parse_param("headroom_base=0:256:64", "openvino-gpu") == ("headroom_base", [0, 64, 128, 192, 256])
    # STOP is included only when it is on the grid: 0, 100, 200 (250 is not a multiple of 100 from 0).
    assert sweep.parse_param("decode=0:250:100", "fixed") == ("decode", [0, 100, 200])
    # Decimal arithmetic: 1.1 + 2 x 0.2 is 1.5 exactly, not 1.5000000000000002.
    assert sweep.parse_param("ratio=1.1:1.5:0.2", "geometric") == ("ratio", [1.1, 1.3, 1.5])
    assert sweep.parse_param("model=llama-3-8b,qwen2.5-7b", "fixed") == ("model", ["llama-3-8b", "qwen2.5-7b"])
    assert sweep.parse_param("first_touch=yes,off", "fixed") == ("first_touch", [True, False])
    assert sweep.parse_param("kv-heads=1,2", "fixed") == ("kv_heads", [1, 2])


@pytest.mark.parametrize("spec, message", [
    ("nonsense=1", "not an option of policy openvino-gpu"),
    ("stagger=1:10:0", "STEP > 0"),
    ("stagger=10:1:1", "STOP >= START"),
    ("stagger=1.5,2", "not a valid int"),
    ("stagger=0:5:0.5", "whole numbers"),
    ("stagger=0:10000000:1", "more than 100,000"),
    ("model=a:b:c", "a range is START:STOP:STEP of numbers"),
    ("stagger", "KEY=START:STOP:STEP"),
])
def test_parse_param_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        sweep.parse_param(spec, "openvino-gpu")


def test_grid_order_and_bound():
    g = sweep.grid(["headroom_base=0,1", "decode=5,6,7"], "openvino-gpu")
    assert g == [{"headroom_base": 0, "decode": 5}, {"headroom_base": 0, "decode": 6}, {"headroom_base": 0, "decode": 7},
                 {"headroom_base": 1, "decode": 5}, {"headroom_base": 1, "decode": 6}, {"headroom_base": 1, "decode": 7}]
    with pytest.raises(ConfigError, match="more than 100,000"):
        sweep.grid(["headroom_base=0:999:1", "stagger=1:999:1"], "openvino-gpu")  # 1e6 points, refused before building


def test_row_has_every_scenario_field_and_the_run_metrics():
    p = sweep.make_point(BASE, {"stagger": 3})
    row = sweep.run_point(p)
    res = simulate(build_scenario(**p))
    summary = res.summary()
    for key, value in summary.items():
        if key != "scenario":
            assert row[key] == value, key
    for key, value in summary["scenario"].items():
        if key == "policy_options":
            assert all(row[f"policy.{k}"] == v for k, v in value.items())
        else:
            assert row[key] == value, key
    assert row["policy.stagger"] == 3 and row["decode"] == 100 and row["prompt"] == 64
    spikes = sorted(res.steps["peak"] - res.steps["steady"])
    # p99 with method="higher" over n steps: the value at sorted index ceil(0.99 (n - 1)).
    import math
    assert row["spike_p99_bytes"] == spikes[math.ceil(0.99 * (len(spikes) - 1))]
    assert row["mean_waste_bytes"] == round(float((res.steps["allocated"] - res.steps["used"]).mean()))


def test_repeated_points_run_once_and_give_one_row_each(tmp_path, monkeypatch):
    pts = points(decodes=(40, 90, 40), bases=(0,))
    calls = []
    real = sweep.run_point
    monkeypatch.setattr(sweep, "run_point", lambda p: calls.append(1) or real(p))
    res = sweep.run_sweep(pts, tmp_path / "d.parquet", workers=1, progress=False)
    assert len(calls) == 2 and (res.computed, res.skipped) == (2, 0)
    assert [r["decode"] for r in res.rows] == [40, 90, 40]  # one row per point, in order
    assert [r["decode"] for r in sweep.read_rows(tmp_path / "d.parquet")] == [40, 90]  # stored once


def test_bad_point_fails_before_any_work(tmp_path):
    bad = [sweep.make_point(BASE, {"kv_heads": 3})]  # 32 heads are not a multiple of 3
    with pytest.raises(ConfigError, match="point .*kv_heads=3"):
        sweep.run_sweep(bad, tmp_path / "x.parquet", workers=1, progress=False)
    assert not (tmp_path / "x.parquet").exists()


def test_interrupted_sweep_resumes_without_recomputing(tmp_path, monkeypatch):
    out = tmp_path / "s.parquet"
    pts = points()
    calls = []
    real = sweep.run_point

    def dies_on_fourth(p):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(sweep.point_id(p))
        return real(p)

    monkeypatch.setattr(sweep, "run_point", dies_on_fourth)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(pts, out, workers=1, progress=False)
    assert [r["point_id"] for r in sweep.read_rows(out)] == [sweep.point_id(p) for p in pts[:3]]

    calls.clear()
    monkeypatch.setattr(sweep, "run_point", lambda p: calls.append(sweep.point_id(p)) or real(p))
    res = sweep.run_sweep(pts, out, workers=1, progress=False)
    assert calls == [sweep.point_id(p) for p in pts[3:]]  # only the missing points ran
    assert (res.computed, res.skipped) == (3, 3)
    monkeypatch.setattr(sweep, "run_point", real)
    fresh = sweep.run_sweep(pts, tmp_path / "fresh.parquet", workers=1, progress=False)
    assert sweep.read_rows(out) == fresh.rows == res.rows


def test_processes_and_dask_give_the_local_rows(tmp_path, kept_environ):
    distributed = pytest.importorskip("distributed")
    pts = points()
    inline = sweep.run_sweep(pts, tmp_path / "inline.parquet", workers=1, progress=False)
    procs = sweep.run_sweep(pts, tmp_path / "procs.parquet", workers=2, progress=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        dask = sweep.run_sweep(pts, tmp_path / "dask.parquet", scheduler=cluster.scheduler_address, progress=False)
    assert procs.rows == inline.rows == dask.rows
    files = [(tmp_path / f"{k}.parquet").read_bytes() for k in ("inline", "procs", "dask")]
    assert files[0] == files[1] == files[2]  # rows stored in point order, whatever finished first


def test_unreachable_scheduler_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(sweep, "CONNECT_TIMEOUT", "1s")
    with pytest.raises(ConfigError, match="cannot reach the Dask scheduler"):
        sweep.run_sweep(points()[:2], None, scheduler="tcp://127.0.0.1:9", progress=False)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "simkv.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_sweep_end_to_end_and_rerun_skips(tmp_path):
    out = tmp_path / "s.parquet"
    args = ["sweep", "--model", "tinyllama-1.1b", "--prompt", "64", "--param", "headroom_base=0:128:64",
            "--param", "decode=50,150", "--out", str(out), "--workers", "1"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert "6 points (6 run, 0 already in" in first.stdout
    again = run_cli(*args)
    assert "6 points (0 run, 6 already in" in again.stdout
    rows = sweep.read_rows(out)
    assert [(r["policy.headroom_base"], r["decode"]) for r in rows] == [(0, 50), (0, 150), (64, 50), (64, 150),
                                                                        (128, 50), (128, 150)]


@pytest.mark.parametrize("args, message", [
    (["--param", "x=1", "--out", "o.parquet"], "not an option of policy openvino-gpu"),
    (["--param", "stagger=1", "--out", "o.csv"], "--out o.csv: the file name must end in .parquet"),
    (["--param", "stagger=1", "--out", "/nonexistent/dir/o.parquet"], "directory /nonexistent/dir does not exist"),
])
def test_cli_sweep_errors_are_one_line(tmp_path, args, message):
    r = run_cli("sweep", *args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_cli_sweep_not_parquet_file(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    r = run_cli("sweep", "--param", "stagger=1", "--out", str(bad), "--workers", "1")
    assert r.returncode == 2 and "not a readable Parquet file" in r.stderr, r.stderr


def test_cli_sweep_ctrl_c_keeps_the_rows_done(tmp_path):
    import signal
    import time

    out = tmp_path / "big.parquet"
    proc = subprocess.Popen([sys.executable, "-m", "simkv.cli", "sweep", "--param", "headroom_base=0:3000:1",
                             "--param", "decode=4000", "--out", str(out), "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    deadline = time.monotonic() + 120
    while not out.exists() and proc.poll() is None and time.monotonic() < deadline:  # the first flush (~2 s)
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    kept = len(sweep.read_rows(out))
    assert 0 < kept < 3001 and f"interrupted; {kept:,} rows kept" in err and "Traceback" not in err

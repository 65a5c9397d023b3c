"""python -m experiments: discovery, every experiment in --quick mode, byte-identical CSVs, missing packages."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simkv.lab import output

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
runner = importlib.import_module("experiments.__main__")

MINE = ("beam_memory", "frontier", "npu_chat", "precision", "serving_waste", "simcost", "stagger")


def run_experiments(*args, env=None):
    return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_discovery_by_convention(tmp_path):
    found = runner.discover()
    assert set(MINE) <= set(found)
    assert not any(name.startswith("bench_") for name in found)  # no run(out, quick): not experiments
    (tmp_path / "a.py").write_text('"""Title A.\n\nMore."""\ndef run(out, quick):\n    pass\n')
    (tmp_path / "b.py").write_text('def run(out_dir):\n    pass\n')  # other signature: not an experiment
    (tmp_path / "_c.py").write_text('def run(out, quick):\n    pass\n')  # private
    assert runner.discover(tmp_path) == {"a": "Title A."}


def test_quick_suite_writes_everything_and_csvs_are_byte_identical(tmp_path):
    first = run_experiments("--quick", "--out", str(tmp_path / "a"))
    assert first.returncode == 0, first.stdout + first.stderr
    index = (tmp_path / "a" / "index.html").read_text()
    for name in MINE:
        folder = tmp_path / "a" / name
        assert f"<h2>{name}:" in index
        for suffix in ("csv", "html", "png", "svg"):
            assert list(folder.glob(f"*.{suffix}")), (name, suffix)
        assert f'src="{name}/' in index  # the figures are on the index page
    second = run_experiments("--quick", "--no-images", "--out", str(tmp_path / "b"))
    assert second.returncode == 0, second.stderr
    compared = 0
    for csv in sorted((tmp_path / "a").rglob("*.csv")):
        module = importlib.import_module(f"experiments.{csv.parent.name}")
        if csv.name in getattr(module, "NONDETERMINISTIC", ()):
            continue
        twin = tmp_path / "b" / csv.relative_to(tmp_path / "a")
        assert csv.read_bytes() == twin.read_bytes(), csv
        compared += 1
    assert compared >= len(MINE)


def test_missing_kaleido_is_one_line_not_a_traceback(tmp_path):
    blocked = tmp_path / "blocked"
    (blocked / "kaleido").mkdir(parents=True)
    (blocked / "kaleido" / "__init__.py").write_text("raise ImportError('kaleido blocked for this test')\n")
    res = subprocess.run([sys.executable, "-m", "experiments.precision", "--quick", "--out", str(tmp_path / "p")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": f"{blocked}{os.pathsep}{ROOT}"})
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.count("warning: PNG/SVG figures skipped: kaleido is not installed") == 1
    assert (tmp_path / "p" / "precision.csv").exists() and (tmp_path / "p" / "precision.html").exists()
    assert not list((tmp_path / "p").glob("*.png"))


def test_runner_skips_an_experiment_whose_package_is_missing(monkeypatch, tmp_path):
    def fake_import(name):
        raise ImportError("No module named 'openvino'", name="openvino")

    monkeypatch.setattr(runner.importlib, "import_module", fake_import)
    assert runner.run_one("anything", tmp_path, True) == (
        "skipped", "needs openvino: install it (see docs/guide/getting-started.md, Install)")

    class Mod:
        @staticmethod
        def run(out, quick):
            raise output.MissingPackage("torch", "pip install torch==2.13.0")

    monkeypatch.setattr(runner.importlib, "import_module", lambda name: Mod)
    assert runner.run_one("anything", tmp_path, True) == ("skipped", "needs torch: pip install torch==2.13.0")


def test_write_csv_is_deterministic_and_plain(tmp_path):
    rows = [{"a": 1, "b": 0.1 + 0.2, "c": None}, {"b": 2.0, "a": 3, "d": "x,y"}]
    path = output.write_csv(tmp_path / "t.csv", rows)
    assert path.read_text() == 'a,b,c,d\n1,0.3,,\n3,2.0,,"x,y"\n'


@pytest.mark.parametrize("name", ["stagger"])
def test_one_experiment_alone(tmp_path, name):
    res = subprocess.run([sys.executable, "-m", f"experiments.{name}", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0 and "--quick" in res.stdout

"""The README's commands and outputs must stay true (examples that are tests, as in SimPy)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_ci_runs_the_readme_test_command():
    """README "Tests" is one command, .ci/run, which CI runs: it sets up and runs pytest."""
    assert _blocks("bash")[1].strip() == ".ci/run"
    ci = ROOT / ".ci" / "run"
    assert os.access(ci, os.X_OK)
    lines = ci.read_text().strip().splitlines()
    assert lines[-1] == '.venv/bin/python -m pytest -q "$@"'
    assert "apt-get install" in ci.read_text() and "sudo" not in lines[-1]
    assert ".venv/bin/python -m pip install -q -e \".[$EXTRAS]\"" in lines


def test_quick_start_output_is_current():
    shown = _blocks("text")[0]
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "run"], capture_output=True, text=True, check=True).stdout
    assert out == shown


def test_run_help_is_current():
    shown = _blocks("text")[1]
    env = {**os.environ, "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "run", "--help"], capture_output=True, text=True,
                         check=True, env=env).stdout
    assert out == shown, "update README.md with: COLUMNS=100 simkv run --help"

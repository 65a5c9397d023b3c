"""The README's quick start and test command must stay true (examples that are tests, as in SimPy).

Its other commands are ```console blocks, which tests/test_docs.py runs with every page of the docs site."""

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


def test_ci_installs_the_docs_extra():
    """.ci/run installs every extra pyproject.toml declares, so the docs test (mkdocs --strict) runs in CI."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("mkdocs-material") for dep in extras["docs"])
    assert 'extras = tomllib.load(open("pyproject.toml", "rb"))["project"].get("optional-dependencies", {})' in \
        (ROOT / ".ci" / "run").read_text()


def test_quick_start_is_the_default_run():
    """The quick start sets up a venv and runs `simkv run` with no arguments; the output shown is what it prints."""
    setup = _blocks("bash")[0].strip()
    assert setup.startswith("python3 -m venv .venv") and setup.endswith(".venv/bin/simkv run")
    shown = _blocks("text")[0]
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "run"], capture_output=True, text=True, check=True).stdout
    assert out == shown

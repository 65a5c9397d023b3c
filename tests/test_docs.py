"""The documentation site (mkdocs.yml, docs/) builds without a warning, and every command it shows is true.

The convention, for every Markdown page under docs/ and README.md:

* a ```console block holds ``$ simkv …`` lines (a trailing ``\\`` continues one), each followed by its exact
  output: the test runs each command (``python -m simkv.cli``, ``COLUMNS=100``, in a scratch folder that sees
  the repository's files, so outputs land there) and compares what it printed — stdout, and stderr too when
  the command exits 2 (an error shown on purpose);
* a ```bash block is for what cannot run here (a GPU, a side environment, minutes of work): not run.

Keep console examples small (each well under 10 s): the whole file runs in the README's test command.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted([*DOCS.rglob("*.md"), ROOT / "README.md"])
#: Pages written for users: no change-log prose, no issue numbers. (docs/DESIGN.md and docs/research/ are the
#: design record, which cites the issues that settled a question.)
USER_PAGES = [p for p in PAGES if p.name == "README.md" or p.parent == DOCS and p.name == "index.md"
              or p.parent.name in ("guide", "results")]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def console_blocks(text: str) -> list[tuple[int, list[tuple[str, str]]]]:
    """Each ```console block as (line number, [(command, expected output)])."""
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) != "console":
            continue
        line = text.count("\n", 0, match.start()) + 1
        pairs: list[tuple[str, str]] = []
        lines = match.group(2).splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                raise AssertionError(f"line {line + 1 + i}: console output before any '$ ' command")
            command = lines[i][2:]
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            i += 1
            out = []
            while i < len(lines) and not lines[i].startswith("$ "):
                out.append(lines[i])
                i += 1
            pairs.append((command, "".join(o + "\n" for o in out)))
        blocks.append((line, pairs))
    return blocks


CASES = [pytest.param(page, line, pairs, id=f"{_rel(page)}:{line}")
         for page in PAGES for line, pairs in console_blocks(page.read_text())]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A folder that sees the repository's files (data/, experiments/ …) through links; outputs land in it."""
    return _linked_to_repository(tmp_path_factory.mktemp("docs_commands"))


def _linked_to_repository(folder: Path) -> Path:
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (folder / entry.name).symlink_to(entry)
    return folder


def run_shown(command: str, cwd: Path) -> str:
    argv = shlex.split(command)
    assert argv[0] == "simkv", f"a console block runs simkv commands only, got: {command}"
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "simkv.cli", *argv[1:]], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=60)
    assert proc.returncode in (0, 2, 3), f"{command}: exit {proc.returncode}\n{proc.stderr}"
    return proc.stdout + (proc.stderr if proc.returncode == 2 else "")


@pytest.mark.parametrize("page,line,pairs", CASES)
def test_console_block_output_is_current(page, line, pairs, scratch):
    for command, shown in pairs:
        out = run_shown(command, scratch)
        assert out == shown, (f"{_rel(page)}:{line}: `{command}` prints something else now; paste its output "
                              f"(python -m simkv.cli ... with COLUMNS=100):\n{out}")


def test_the_docs_show_commands():
    """The convention is in use: the guides' examples are console blocks, and there are many of them."""
    assert len(CASES) >= 15
    for page in DOCS.glob("guide/*.md"):
        text = page.read_text()
        if "$ simkv" in text:
            assert console_blocks(text), f"{_rel(page)}: '$ simkv' outside a ```console block"


@pytest.mark.parametrize("page", USER_PAGES, ids=_rel)
def test_user_pages_read_as_documentation(page):
    """No change-log prose and no issue numbers in what users read: history is in CHANGELOG.md."""
    text = page.read_text()
    for pattern in (r"[Ii]ssue #\d", r"\(#\d+\)", r"\bRe-measured\b", r"^Before, ", r"\bafter issue\b",
                    r"\bWhat changed\b", r"\bthis branch\b"):
        found = re.search(pattern, text, re.M)
        assert not found, f"{_rel(page)}: {found.group(0)!r} (history belongs in CHANGELOG.md)"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_source_files_named_exist(page):
    """A module the docs name (`simkv/serving/router.py`, `policies/fixed.py`, `tests/test_plan.py` …) exists: when
    code moves, the page that points a reader to it must follow."""
    text = page.read_text()
    for path in sorted(set(re.findall(r"(?<![\w/.])((?:simkv|policies|experiments|tests)/[\w/]+\.py)\b", text))):
        assert (ROOT / path).exists(), f"{_rel(page)} names {path}, which does not exist"


def test_rule_pages_have_their_modules():
    """Each runtime-rule page is generated from a module's docstring (docs/hooks.py RULES): when the module moves,
    this names the entry to fix (the build would only show a traceback)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    for page, _, source in hooks.RULES:
        assert (ROOT / source).exists(), f"docs/hooks.py RULES: rules/{page}.md reads {source}, which does not exist"


def test_readme_is_short_and_points_to_the_site():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_site_builds_without_warnings(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a page missing from the nav, a bad generated page fail.

    The command reference, the policy pages and the runtime-rule pages are generated during the build
    (docs/hooks.py), so building checks them too."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr
    site = tmp_path / "site"
    from simkv.cli import COMMANDS
    from policies import REGISTRY

    for command in COMMANDS:
        name = command.__name__.rsplit(".", 1)[1]
        page = (site / "reference" / name / "index.html").read_text()
        for option in re.findall(r"--[a-z][a-z0-9-]*", subprocess.run(
                [sys.executable, "-m", "simkv.cli", name, "--help"], capture_output=True, text=True,
                env=env, cwd=ROOT).stdout):
            assert option in page, f"reference/{name}: {option} missing"
    for name in REGISTRY:
        assert (site / "policies" / name / "index.html").exists()
    for html in site.rglob("index.html"):  # the generated pages read as documentation too
        if html.parent.parent.name in ("reference", "policies", "rules"):
            article = html.read_text().split("<article", 1)[1].split("</article>", 1)[0]  # not the nav
            found = re.search(r"[Ii]ssue #\d", article)
            assert not found, f"{html.relative_to(site)}: {found.group(0)!r} (from a docstring)"
    for page in PAGES:  # every page under docs/ is built (and, by omitted_files, in the nav)
        if page.parent != ROOT and page.name != "index.md":
            assert (site / page.relative_to(DOCS).with_suffix("") / "index.html").exists(), page


def update(paths: list[Path]) -> None:
    """Rewrite the output under every ``$ simkv`` line of these pages' console blocks with what it prints now."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cwd = _linked_to_repository(Path(tmp))
        for path in paths:
            text = path.read_text()

            def fresh(match: re.Match) -> str:
                if match.group(1) != "console":
                    return match.group(0)
                lines = match.group(2).splitlines()
                body, i = [], 0
                while i < len(lines):  # keep each command as written (continuations too), then its new output
                    command = lines[i][2:]
                    body.append(lines[i])
                    while command.endswith("\\"):
                        i += 1
                        body.append(lines[i])
                        command = command[:-1] + " " + lines[i].strip()
                    i += 1
                    while i < len(lines) and not lines[i].startswith("$ "):
                        i += 1
                    body.append(run_shown(command, cwd).rstrip("\n"))
                head = match.group(0).split("\n", 1)[0]
                return head + "\n" + "\n".join(b for b in body if b) + "\n```"

            path.write_text(FENCE.sub(fresh, text))


if __name__ == "__main__":  # python tests/test_docs.py docs/guide/PAGE.md …: refresh the console outputs shown
    update([Path(p).resolve() for p in sys.argv[1:]])

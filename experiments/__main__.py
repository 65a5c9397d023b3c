"""Regenerate every experiment and write an index page.

    python -m experiments [--quick] [--out DIR] [--only NAME ...] [--no-images]

Convention (also in docs/results/experiments.md): an
experiment is any ``experiments/<name>.py`` (not starting with ``_``) that
defines a top-level ``run(out: Path, quick: bool) -> None`` (exactly these
two parameter names). The runner finds them by reading the source (so other
scripts, such as the benchmarks, are never imported), runs them in name order, each into
``DIR/<name>/``, and writes ``DIR/index.html`` with each one's title (the
first line of its docstring), outcome, wall time, files and figures.

One experiment's failure does not stop the others: a missing optional
package (:class:`simkv.lab.output.MissingPackage` or an ImportError) is one
line and "skipped" on the index; any other error is reported (with its
traceback on stderr) and makes the exit code 1. Figures go through one
kaleido browser for the whole run.
"""

from __future__ import annotations

import argparse
import ast
import html
import importlib
import sys
import time
import traceback
from pathlib import Path

from simkv.lab import output

HERE = Path(__file__).resolve().parent


def discover(folder: Path = HERE) -> dict[str, str]:
    """name → title of every experiment script in ``folder`` (by the convention above)."""
    found = {}
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef) and n.name == "run" and [a.arg for a in n.args.args] == ["out", "quick"]
               for n in tree.body):
            doc = ast.get_docstring(tree) or path.stem
            found[path.stem] = doc.strip().splitlines()[0]
    return found


def run_one(name: str, out: Path, quick: bool) -> tuple[str, str]:
    """(outcome, detail): ok | skipped | failed."""
    try:
        module = importlib.import_module(f"experiments.{name}")
        module.run(out, quick)
    except output.MissingPackage as err:
        return "skipped", str(err)
    except ImportError as err:
        return "skipped", f"needs {err.name or err}: install it (see docs/guide/getting-started.md, Install)"
    except Exception as err:  # noqa: BLE001 - one experiment's bug must not stop the others
        traceback.print_exc()
        return "failed", f"{type(err).__name__}: {err}"
    return "ok", ""


def index_page(entries: list[dict], out: Path, quick: bool) -> str:
    rows = []
    for e in entries:
        folder = out / e["name"]
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "plotly.min.js") if folder.is_dir() else []
        links = " ".join(f'<a href="{html.escape(str(p.relative_to(out)))}">{html.escape(p.name)}</a>' for p in files)
        images = "".join(f'<a href="{html.escape(str(p.with_suffix(".html").relative_to(out)))}">'
                         f'<img src="{html.escape(str(p.relative_to(out)))}" alt="{html.escape(p.stem)}"></a>'
                         for p in files if p.suffix == ".png")
        detail = f"<p class=detail>{html.escape(e['detail'])}</p>" if e["detail"] else ""
        rows.append(f"<section><h2>{html.escape(e['name'])}: {html.escape(e['title'])}</h2>"
                    f"<p class={e['outcome']}>{e['outcome']} in {e['seconds']:.1f} s</p>{detail}"
                    f"<p class=files>{links}</p><div class=figs>{images}</div></section>")
    mode = "quick mode (--quick)" if quick else "full runs"
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>simkv experiments</title><style>"
        "body{font-family:sans-serif;max-width:1300px;margin:1em auto;padding:0 1em}"
        "img{max-width:600px;border:1px solid #ddd;margin:4px}.ok{color:#2ca02c}.failed{color:#d62728}"
        ".skipped{color:#ff7f0e}.files a{margin-right:.8em;font-size:90%}</style></head><body>"
        f"<h1>simkv experiments</h1><p>{mode}; regenerate with <code>python -m experiments"
        f"{' --quick' if quick else ''} --out {html.escape(str(out))}</code>.</p>"
        + "".join(rows) + "</body></html>\n"
    )


def main(argv: list[str] | None = None) -> int:
    found = discover()
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small versions for CI (seconds each)")
    parser.add_argument("--out", default="out", help="output folder (default out/)")
    parser.add_argument("--only", nargs="+", choices=sorted(found), metavar="NAME",
                        help=f"run only these ({', '.join(found)})")
    parser.add_argument("--no-images", action="store_true", help="skip PNG/SVG (HTML and CSV only)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.no_images:
        output.disable_images("--no-images")
    entries = []
    with output.image_server():
        for name in args.only or found:
            (out / name).mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            outcome, detail = run_one(name, out / name, args.quick)
            seconds = time.perf_counter() - start
            print(f"{name:<20}{outcome:<8}{seconds:7.1f} s  {detail}", flush=True)
            entries.append({"name": name, "title": found[name], "outcome": outcome, "detail": detail,
                            "seconds": seconds})
    (out / "index.html").write_text(index_page(entries, out, args.quick), encoding="utf-8")
    print(f"wrote {out / 'index.html'}")
    return 1 if any(e["outcome"] == "failed" for e in entries) else 0


if __name__ == "__main__":
    sys.exit(main())

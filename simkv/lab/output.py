"""What every experiment writes, written the same way: figures (HTML, PNG, SVG) and CSVs.

* :func:`save_figure` — ``stem.html`` (plotly.js in a ``plotly.min.js`` beside it, or inlined for a
  command's one figure), and
  ``stem.png`` + ``stem.svg`` through kaleido. Without kaleido or without a Chrome/Chromium
  for it, the images are skipped with ONE warning line (the HTML and CSV are still written);
  never a traceback.
* :func:`image_server` — keeps one kaleido browser open for many images (the runner uses it:
  ~0.3 s an image instead of ~5 s).
* :func:`write_csv` — fixed column order and number format: same rows, same bytes.
* :class:`MissingPackage` — raised by an experiment that cannot run here; the runner prints
  its one line and goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import logging
import sys
import warnings
from pathlib import Path
from typing import Callable, Iterable, Iterator

IMAGE_FORMATS = ("png", "svg")
_image_problem: list[str] = []  # the reason images are skipped, once known (printed once)


class MissingPackage(RuntimeError):
    """An optional package (or program) an experiment needs is not installed."""

    def __init__(self, package: str, install: str):
        super().__init__(f"needs {package}: {install}")
        self.package, self.install = package, install


@contextlib.contextmanager
def image_server() -> Iterator[None]:
    """One kaleido browser for every image written inside the block (no-op without kaleido)."""
    try:
        import kaleido
    except ImportError:
        yield
        return
    try:
        kaleido.start_sync_server(silence_warnings=True)
    except Exception:  # noqa: BLE001 - no browser: each write reports it once, below
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            kaleido.stop_sync_server(silence_warnings=True)


def write_image(fig, path: Path) -> bool:
    """PNG or SVG through kaleido; False (and one warning line, once) if that is not possible here."""
    if _image_problem:
        return False
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return _skip("kaleido is not installed (pip install kaleido)")
    # kaleido's browser driver (choreographer) logs a whole traceback to stderr for a message from Chromium it
    # cannot parse ("JSONError decoding message. Ignoring") and goes on; the image is still written
    logging.getLogger("choreographer").setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "kopts ignored when using a server"
            fig.write_image(path)
        return True
    except Exception as err:  # noqa: BLE001 - kaleido raises its own types (no Chrome, browser crash)
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return _skip(f"kaleido could not render ({text[:160]}); it needs Chrome or Chromium "
                     "(apt-get install chromium, or `kaleido_get_chrome`)")


def disable_images(reason: str) -> None:
    """Write no PNG/SVG from now on in this process (``--no-images``)."""
    if not _image_problem:
        _image_problem.append(reason)


def _skip(reason: str) -> bool:
    _image_problem.append(reason)
    print(f"warning: PNG/SVG figures skipped: {reason}", file=sys.stderr)
    return False


def save_figure(fig, path: str | Path, div_id: str = "simkv-figure", self_contained: bool = False) -> list[Path]:
    """Write ``path`` (.html/.png/.svg), or with no suffix ``path.html`` + ``.png`` + ``.svg``; returns the files.
    The HTML loads plotly.js from a ``plotly.min.js`` beside it (the experiments' many figures share one), or with
    ``self_contained`` holds it (one file: what a command writes where it was asked to write one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lstrip(".")
    formats = [suffix] if suffix in ("html", *IMAGE_FORMATS) else ["html", *IMAGE_FORMATS]
    stem = path.with_suffix("") if suffix in ("html", *IMAGE_FORMATS) else path
    written = []
    for fmt in formats:
        target = stem.with_name(stem.name + "." + fmt)
        if fmt == "html":
            fig.write_html(target, include_plotlyjs=True if self_contained else "directory", full_html=True,
                           div_id=div_id)
            written.append(target)
        elif write_image(fig, target):
            written.append(target)
    return written


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(round(value, 9))
    return str(value)


def write_csv(path: str | Path, rows: Iterable[dict], columns: list[str] | None = None) -> Path:
    """Rows as CSV: columns in first-seen order (or ``columns``), floats rounded to 9 decimals, None empty."""
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in columns])
    return path


def main_for(run: Callable[[Path, bool], None], doc: str | None, name: str) -> None:
    """``python -m experiments.NAME [--quick] [--out DIR]``: run one experiment into DIR (default out/NAME)."""
    parser = argparse.ArgumentParser(prog=f"python -m experiments.{name}",
                                     description=(doc or "").strip().splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help="small version for CI (seconds)")
    parser.add_argument("--out", default=f"out/{name}", help=f"output folder (default out/{name})")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with image_server():
            run(out, args.quick)
    except MissingPackage as err:
        print(f"{name}: skipped: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"{name}: wrote {out}/")


__all__ = ["MissingPackage", "disable_images", "image_server", "main_for", "save_figure", "write_csv", "write_image"]

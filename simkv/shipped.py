"""The data shipped inside the package (``simkv/data/``): the model presets' ``config.json`` files, real upstream
configs with their sources, the request traces and device files — found through ``importlib.resources``, so a wheel installed
anywhere reads them as a source checkout does."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

#: The package's data folder (a plain folder both in a checkout and in an installed wheel).
DATA = Path(str(files("simkv") / "data"))
CONFIG_DIR = DATA / "configs"
TRACE_DIR = DATA / "traces"
#: Device files (``--device PATH``) of devices simkv has no preset for: an NPU, priced with assumed efficiencies.
DEVICE_DIR = DATA / "devices"
#: Shipped traces by the short name ``--trace`` takes (a file name in TRACE_DIR, with or without ``.csv``, too).
TRACES = {"azure-conv": "azure_llm_2023_conv.csv", "azure-code": "azure_llm_2023_code.csv"}


def trace_path(name: str | Path) -> Path:
    """A trace's file: a shipped trace's by its name (:data:`TRACES`, or its file name in ``simkv/data/traces``)
    where no file of that name exists, else the path itself."""
    path = Path(name)
    if path.exists() or path.parent != Path("."):
        return path
    text = str(name)
    file = TRACES.get(text, text if text.endswith(".csv") else f"{text}.csv")
    shipped = TRACE_DIR / file
    return shipped if shipped.is_file() else path

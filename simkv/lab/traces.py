"""Workload distributions from request traces (e.g. the Azure LLM inference trace 2023).

A trace is a CSV with a header naming a prompt-length and a generated-length
column: ``ContextTokens`` / ``GeneratedTokens`` (the Azure trace) or ``prompt``
/ ``decode``. :func:`sample` draws rows with a seeded generator, without
replacement, and returns them in file order: the same file, count and seed
always give the same workloads.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from simkv.shipped import TRACE_DIR, TRACES, trace_path
from simkv.errors import ConfigError

PROMPT_COLUMNS = ("ContextTokens", "prompt")
DECODE_COLUMNS = ("GeneratedTokens", "decode")
#: ``samples`` value meaning every row of the trace.
ALL = 0
#: Rows read from a trace at most (the Azure conversation trace has 19,366).
MAX_ROWS = 2_000_000
#: Workloads one distribution may hold at most (repeated lengths are simulated once: simkv.lab.sweep).
MAX_SAMPLES = 100_000


def read_trace(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, decode lengths) of every row (a shipped trace by its name too: simkv.shipped.trace_path)."""
    path = trace_path(path)
    try:
        with path.open(newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None) or []
            cols = []
            for names in (PROMPT_COLUMNS, DECODE_COLUMNS):
                found = [header.index(n) for n in names if n in header]
                if not found:
                    raise ConfigError(f"trace {path}: no {' or '.join(names)} column in its header")
                cols.append(found[0])
            prompts, decodes = [], []
            for i, row in enumerate(reader):
                if i >= MAX_ROWS:
                    raise ConfigError(f"trace {path}: more than {MAX_ROWS:,} rows")
                try:
                    prompts.append(int(row[cols[0]]))
                    decodes.append(int(row[cols[1]]))
                except (ValueError, IndexError):
                    raise ConfigError(f"trace {path}: row {i + 2} is not two whole numbers in those columns") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read trace {path}: {err}") from None
    if not prompts:
        raise ConfigError(f"trace {path} has no rows")
    p, d = np.asarray(prompts, dtype=np.int64), np.asarray(decodes, dtype=np.int64)
    if (p < 1).any() or (d < 1).any():
        raise ConfigError(f"trace {path}: prompt and decode lengths must be >= 1")
    return p, d


def sample(path: str | Path, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``samples`` rows (all if fewer; :data:`ALL` = every row) drawn without replacement with ``seed``, in file order."""
    return split(path, samples, 0, seed)[0]


def split(path: str | Path, samples: int, holdout: int, seed: int):
    """Two disjoint draws without replacement: ``samples`` rows and ``holdout`` other rows, each in file order.

    The first draw is the same as :func:`sample` with the same seed, whatever ``holdout`` is.
    """
    if not (samples == ALL or 1 <= samples <= MAX_SAMPLES):
        raise ConfigError(f"--samples must be in 1..{MAX_SAMPLES:,} or all, got {samples}")
    if not 0 <= holdout <= MAX_SAMPLES:
        raise ConfigError(f"--holdout must be in 0..{MAX_SAMPLES:,}, got {holdout}")
    p, d = read_trace(path)
    if samples == ALL:
        if holdout:
            raise ConfigError("--samples all leaves no rows to hold out")
        if len(p) > MAX_SAMPLES:
            raise ConfigError(f"trace {path} has {len(p):,} rows, more than {MAX_SAMPLES:,}: give --samples N")
        return (p, d), (p[:0], d[:0])
    order = np.random.default_rng(seed).permutation(len(p))
    first, second = np.sort(order[:samples]), np.sort(order[samples:samples + holdout])
    if holdout and not len(second):
        raise ConfigError(f"trace {path} has {len(p)} rows: none left to hold out after {samples} samples")
    return (p[first], d[first]), (p[second], d[second])


#: The Azure LLM inference trace 2023, conversation service (simkv/data/traces/README.md), shipped in the package.
AZURE_CONV = TRACE_DIR / TRACES["azure-conv"]
#: The same hour of the code-completion service (longer prompts, short answers).
AZURE_CODE = AZURE_CONV.with_name("azure_llm_2023_code.csv")

__all__ = ["AZURE_CODE", "AZURE_CONV", "read_trace", "sample", "split", "MAX_ROWS", "MAX_SAMPLES"]

"""The child processes of the validators: their environment, and the clean runs' allocator setting.

The clean runs of ``simkv validate`` (OpenVINO and transformers) and ``simkv calibrate``'s measurements run
in a child ``python -m simkv...`` because glibc reads ``MALLOC_MMAP_THRESHOLD_`` only at start-up; the GenAI
pipeline runs in one so that a crash of its native code fails one workload, not the validation. Each child
must import this checkout's ``simkv``, whatever the parent's working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

#: glibc's ``MALLOC_MMAP_THRESHOLD_`` of the clean runs (and of ``simkv calibrate``): every buffer of at least
#: this many bytes is a mapping of its own, so RSS follows the bytes written (docs/DESIGN.md §3).
DEFAULT_MMAP_THRESHOLD = 65536

#: The directory that holds the ``simkv`` package.
ROOT = str(Path(__file__).resolve().parents[2])


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with ``extra`` set and :data:`ROOT` first on ``PYTHONPATH``."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env

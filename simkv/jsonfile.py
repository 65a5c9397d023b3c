"""A JSON object from a file a user names — a model's ``config.json``, a device file —, read within a bound.

At most ``max_bytes + 1`` bytes are read whatever the path is: a FIFO or ``/dev/zero`` reports no size to check
first, and reading it whole would not end. Every way the file can be wrong is one :class:`ConfigError` line that
starts with ``where``.
"""

from __future__ import annotations

import json
from pathlib import Path

from simkv.errors import ConfigError


def read_json_object(path: Path, where: str, max_bytes: int, what: str) -> dict:
    """The file's top-level JSON object; ``what`` names the kind of file in the size refusal."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as err:
        raise ConfigError(f"{where}: cannot be read ({err.strerror or err})") from None
    if len(data) > max_bytes:
        size = path.stat().st_size if path.is_file() else 0
        held = f"{size:,} bytes" if size > max_bytes else f"more than {max_bytes:,} bytes"
        raise ConfigError(f"{where}: {held}, over the limit of {max_bytes:,} for {what}")
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a UTF-8 text file") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise ConfigError(f"{where}: not valid JSON (nested too deeply)") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the top level must be a JSON object, got {type(raw).__name__}")
    return raw

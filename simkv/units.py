"""Byte sizes for humans: parse ``16GiB`` / ``512MB``, print ``1.50 GiB``."""

from __future__ import annotations

import re

from simkv.errors import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int) -> int:
    """``"16GiB"`` → 17179869184. Decimal units (GB) are powers of 1000, binary (GiB) of 1024."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE.match(str(text))
        unit = match.group(2).lower() if match else None
        if not match or unit not in _UNITS:
            raise ConfigError(f"cannot read {text!r} as a size; use e.g. 16GiB, 512MiB or 8000000000")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ConfigError(f"size must be positive, got {text!r}")
    return value


def format_bytes(n: float) -> str:
    """Binary units with three significant decimals: ``1.50 GiB``, ``37.1 KiB``, ``512 B``."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:,.0f} {unit}" if unit == "B" else f"{sign}{n:,.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")

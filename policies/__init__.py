"""Pluggable KV-cache allocation policies, one per file, selectable by name.

To add one: subclass :class:`policies.base.Policy` in a new file, give it a
``name``, a ``summary`` and a ``capacity`` rule, and list it in ``_BUILTIN``
below (or call :func:`register` from your own code).
"""

from __future__ import annotations

import dataclasses

from policies.base import Policy, parse_value
from policies.exact import Exact
from policies.fixed import Fixed
from policies.geometric import Geometric
from policies.hf_dynamic import HFDynamic
from policies.hf_static import HFStatic
from policies.openvino_cpu import OpenVINOCPU
from policies.openvino_gpu import OpenVINOGPU
from policies.openvino_npu import OpenVINONPU
from policies.stateless import Stateless
from policies.static import Static
from simkv.errors import ConfigError

__all__ = ["Policy", "REGISTRY", "get_policy", "parse_policy_opts", "register"]

_BUILTIN = (OpenVINOGPU, OpenVINOCPU, OpenVINONPU, Fixed, Geometric, Exact, Static, Stateless, HFDynamic, HFStatic)
REGISTRY: dict[str, type[Policy]] = {cls.name: cls for cls in _BUILTIN}


def register(cls: type[Policy]) -> type[Policy]:
    """Make a policy class selectable by its ``name`` (usable as a decorator)."""
    REGISTRY[cls.name] = cls
    return cls


def get_policy(name: str, options: dict[str, object] | None = None) -> Policy:
    """Build a policy by name; ``options`` values may be strings (from the CLI) or typed."""
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; choose one of {', '.join(REGISTRY)}") from None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in (options or {}).items():
        if key not in fields:
            raise ConfigError(f"policy {name} has no option {key!r}; it has {', '.join(fields)}")
        kwargs[key] = parse_value(fields[key], value) if isinstance(value, str) else value
    return cls(**kwargs)


def parse_policy_opts(items: list[str] | None) -> dict[str, str]:
    """``["a=1", "b=x"]`` → ``{"a": "1", "b": "x"}``, rejecting anything else."""
    parsed: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"--policy-opt expects KEY=VALUE, got {item!r}")
        parsed[key.strip()] = value.strip()
    return parsed

"""simkv: a KV-cache memory simulator and policy lab for LLM inference.

>>> from simkv import build_scenario, simulate
>>> result = simulate(build_scenario(model="llama-3-8b", policy="openvino-cpu", prompt=32, decode=100))
>>> result.metrics.realloc_count  # steps 33 and 99, K and V of 32 layers
128

This package's init is the library's front door and loads nothing itself: each name below is imported from
its module the first time it is asked for (PEP 562). Importing ``simkv.errors`` — as the policies do — so
runs no more than that module, and the layers stay apart (docs/DESIGN.md "Architecture").
"""

from simkv.version import __version__

#: Public name → the module that owns it.
_EXPORTS = {
    "ConfigError": "simkv.errors", "PolicyError": "simkv.errors", "SimkvError": "simkv.errors",
    "Ledger": "simkv.ledger", "Metrics": "simkv.metrics", "PRESETS": "simkv.models", "ModelSpec": "simkv.models",
    "PRECISIONS": "simkv.precision", "Precision": "simkv.precision",
    "Result": "simkv.scenario", "Scenario": "simkv.scenario", "build_scenario": "simkv.scenario",
    "simulate": "simkv.scenario",
    "Decode": "simkv.workload", "Fork": "simkv.workload", "Prefill": "simkv.workload", "Reorder": "simkv.workload",
    "Reset": "simkv.workload", "Select": "simkv.workload", "Workload": "simkv.workload",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'simkv' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # asked once: later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

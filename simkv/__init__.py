"""simkv: a KV-cache memory simulator and policy lab for LLM inference.

>>> from simkv import build_scenario, simulate
>>> result = simulate(build_scenario(model="llama-3-8b", policy="openvino-cpu", prompt=32, decode=100))
>>> result.metrics.realloc_count  # steps 33 and 99, K and V of 32 layers
128
"""

from simkv.errors import ConfigError, PolicyError, SimkvError
from simkv.ledger import Ledger
from simkv.metrics import Metrics
from simkv.models import PRESETS, ModelSpec
from simkv.precision import PRECISIONS, Precision
from simkv.scenario import Result, Scenario, build_scenario, simulate
from simkv.workload import Decode, Fork, Prefill, Reorder, Reset, Select, Workload

__all__ = [
    "ConfigError", "Decode", "Fork", "Ledger", "Metrics", "ModelSpec", "PRECISIONS", "PRESETS",
    "PolicyError", "Precision", "Prefill", "Reorder", "Reset", "Result", "Scenario", "Select",
    "SimkvError", "Workload", "build_scenario", "simulate",
]
__version__ = "0.1.0"

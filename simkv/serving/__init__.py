"""Serving: a device running a stream of requests (issue #7).

:func:`serve` runs a :class:`ServingSpec` (requests + scheduler + memory model + device) and
returns a :class:`ServingResult` (step table, request table, ledger, metrics).
:func:`simulate_paged` is the GenAI continuous-batching call ``simkv validate --paged`` uses.
"""

from simkv.serving.requests import Request, load_trace, synthetic, write_trace
from simkv.serving.run import ServingResult, ServingSpec, serve, simulate_paged
from simkv.serving.sched.config import SchedulerConfig

__all__ = ["Request", "SchedulerConfig", "ServingResult", "ServingSpec", "load_trace", "serve", "simulate_paged",
           "synthetic", "write_trace"]

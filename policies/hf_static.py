"""Hugging Face ``StaticCache``: ``max_cache_len`` tokens per layer, allocated on the first forward.

Source: huggingface/transformers 5.23.0 ``src/transformers/cache_utils.py``, class
``StaticLayer`` (``lazy_initialization``, ``update``) and ``CacheLayerMixin.reorder_cache`` /
``reset``; observed with memray on torch 2.13 CPU (``simkv validate --runtime transformers``):

* the first ``update`` of each layer runs ``lazy_initialization``: ``torch.zeros`` of
  ``[B, H_kv, max_cache_len, S]`` for the keys, then the values (``+K +V`` per layer); later
  tokens are written in place with ``index_copy_`` — nothing is allocated after that;
* ``reset()`` zeroes the tensors and keeps them;
* ``reorder_cache(beam_idx)`` is ``index_select`` on the full tensors: per layer a new
  ``max_cache_len`` K at the new batch, the old freed, then V (``+K -K +V -V``);
* a history longer than ``max_cache_len`` cannot run (``index_copy_`` past the end), and
  sliding-window layers use ``StaticSlidingWindowLayer`` (its per-step ``roll`` copies are
  not modelled: refused).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from policies.base import Policy, option
from simkv.errors import ConfigError, PolicyError
from simkv.workload import Fork, Reset, Select

_HELP = {f.name: f.metadata["help"] for f in fields(Policy)}


@dataclass(frozen=True)
class HFStatic(Policy):
    name = "hf-static"
    summary = "transformers StaticCache: max_cache_len tokens per layer on the first forward, in place after"
    unit = "layer"
    row_orders = {"grow": "+k =k -k +v =v -v", "gather": "+k =k -k +v =v -v"}

    max_cache_len: int = option(4096, "tokens each layer's K and V tensors hold (StaticCache max_cache_len)")
    first_touch: bool = option(False, "resident only once written (off: torch.zeros writes each tensor whole, resident = allocated)")
    beam_gather: bool = option(True, _HELP["beam_gather"])

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_cache_len < 1:
            raise ConfigError(f"max_cache_len must be >= 1, got {self.max_cache_len}")

    def capacity(self, needed, prim):
        return np.full(np.shape(needed), self.max_cache_len, dtype=np.int64)

    def check(self, model, workload) -> None:
        if model.sliding_window:
            raise PolicyError("hf-static: sliding-window layers (StaticSlidingWindowLayer) are not modelled; "
                              "use hf-dynamic or --sliding-window 0")
        if workload.max_tokens > self.max_cache_len:
            raise PolicyError(f"hf-static: the session reaches {workload.max_tokens} tokens but max_cache_len is "
                              f"{self.max_cache_len}; raise it with --policy-opt max_cache_len=N")
        batch = 1
        for op in workload.ops:
            if isinstance(op, Reset) and batch > 1:
                raise PolicyError("hf-static: reset keeps the cache's batch of beams; select one beam before resetting")
            batch = op.width if isinstance(op, Fork) else 1 if isinstance(op, (Select, Reset)) else batch

"""Static cache: one allocation of ``MAX_PROMPT_LEN + MIN_RESPONSE_LEN`` tokens, a generic what-if.

A fixed cache in the manner of TensorRT's or Hugging Face's ``StaticCache``: it never grows and never
copies; a prompt longer than ``max_prompt_len`` (rounded up to a multiple of ``prefill_chunk``) or a
history longer than the cache cannot run (DESIGN.md §4). A trim only lowers the token count. OpenVINO's NPU
pipeline as NPUW builds it (two fixed-shape models, their outputs, the staged copy, prefix-cache blocks,
MAX_PROMPT_LEN aligned to 64 before the chunk) is ``openvino-npu`` (policies/openvino_npu.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.base import Policy, option
from simkv.errors import ConfigError, PolicyError
from simkv.workload import Fork


@dataclass(frozen=True)
class Static(Policy):
    name = "static"
    summary = "one allocation of max_prompt_len + min_response_len tokens, never grows (generic; the NPU: openvino-npu)"

    max_prompt_len: int = option(1024, "longest prompt (or chat turn) in tokens")
    min_response_len: int = option(128, "tokens reserved for the answer")
    prefill_chunk: int = option(1024, "round max_prompt_len up to a multiple of this (NPU chunked prefill; 1 = off)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_prompt_len < 1 or self.min_response_len < 0 or self.prefill_chunk < 1:
            raise ConfigError("max_prompt_len and prefill_chunk must be >= 1, min_response_len >= 0")

    @property
    def prompt_capacity(self) -> int:
        return -(-self.max_prompt_len // self.prefill_chunk) * self.prefill_chunk

    @property
    def total(self) -> int:
        return self.prompt_capacity + self.min_response_len

    def capacity(self, needed, prim):
        return np.full(np.shape(needed), self.total, dtype=np.int64)

    def check(self, model, workload) -> None:
        if workload.max_prompt > self.prompt_capacity:
            raise PolicyError(
                f"static: a {workload.max_prompt}-token prompt does not fit max_prompt_len="
                f"{self.prompt_capacity}; raise it with --policy-opt max_prompt_len=N"
            )
        if workload.max_tokens > self.total:
            raise PolicyError(
                f"static: the session reaches {workload.max_tokens} tokens but the cache holds "
                f"{self.total} ({self.prompt_capacity} + {self.min_response_len}); raise "
                f"--policy-opt min_response_len=N"
            )
        if any(isinstance(op, Fork) for op in workload.ops):
            raise PolicyError("static: the cache has a fixed batch of 1; beam search is not supported")

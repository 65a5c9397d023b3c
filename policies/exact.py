"""Exact size, concatenated every step: the stateless / ``DynamicCache`` pattern.

Stateless pipelines pass ``past_key_values`` in and get ``present_key_values``
out: every step builds a new cache of exactly ``L0 + L1`` tokens and copies
the whole past into it (Hugging Face ``DynamicCache`` grows with
``torch.cat``). The previous cache is only dropped after the step, so for the
whole step old and new coexist (transformers PR #30536 halved ``generate()``
memory by shortening that overlap) — DESIGN.md §1, §4.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import Policy, option


@dataclass(frozen=True)
class Exact(Policy):
    name = "exact"
    summary = "cap = L every step, full copy, old and new alive for the step (stateless concat)"

    free_old: str = option("end_of_step", "when a replaced buffer is freed: immediate | end_of_step | next_inference")
    reset: str = option("free", "what reset_state() does to KV buffers: keep | free")

    def capacity(self, needed, prim):
        return needed

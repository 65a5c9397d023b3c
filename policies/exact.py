"""Exact size, concatenated every step, old and new alive for the whole step: stateless pipelines.

Stateless pipelines pass ``past_key_values`` in and get ``present_key_values``
out: every step builds a new cache of exactly ``L0 + L1`` tokens and copies
the whole past into it, and the caller's past is only dropped after the step,
so for the whole step old and new coexist (two copies of the cache). That is
also what Hugging Face transformers did before PR #30536 halved ``generate()``
memory — DESIGN.md §1, §4.

Current transformers ``DynamicCache`` is *not* this: it replaces one layer's
tensor at a time and frees the old one at once (policy ``hf-dynamic``,
validated event by event, DESIGN.md §3b).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import Policy, option


@dataclass(frozen=True)
class Exact(Policy):
    name = "exact"
    summary = "cap = L every step, full copy, old and new alive for the step (stateless past in / present out)"

    free_old: str = option("end_of_step", "when a replaced buffer is freed: immediate | end_of_step | next_inference")
    reset: str = option("free", "what reset_state() does to KV buffers: keep | free")

    def capacity(self, needed, prim):
        return needed

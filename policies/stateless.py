"""Stateless: nothing kept between steps, the whole sequence recomputed every step.

The naive generation loop the seed blog compares with a stateful model: a
model without state (OpenVINO "Stateful models and State API": a stateless
model returns everything it produced as outputs; here the loop keeps none of
it) is called on the whole sequence, prompt and every token generated so far,
to produce each next token. Each step therefore creates the K/V of every
layer for all ``L`` tokens — buffers of exactly ``L`` tokens, computed, not
copied — and frees them when the step ends. Memory between steps is zero;
inside a step it is the full cache; the time of a step is a prefill of ``L``
tokens (simkv.latency prices it that way).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import Policy, option


@dataclass(frozen=True)
class Stateless(Policy):
    name = "stateless"
    summary = "nothing kept: every step recomputes all L tokens into exact buffers, freed at the end of the step"
    stateless = True

    reset: str = option("free", "what reset_state() does to KV buffers: keep | free")

    def capacity(self, needed, prim):
        return needed

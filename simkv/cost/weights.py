"""The weight matmuls' side of a step: which parameters a token multiplies by, and which weights a step streams
(a mixture of experts reads only the experts its tokens are routed to; docs/DESIGN.md §6a)."""

from __future__ import annotations

from typing import Any

import numpy as np

from simkv.models import ModelSpec


def matmul_params(model: ModelSpec) -> int:
    """Parameters a token multiplies by if its logits are computed: the weight matrices and
    the LM head, not the input-embedding lookup (a separate table unless tied), and of a mixture
    of experts only the experts it is routed to (:attr:`simkv.models.ModelSpec.active_params`)."""
    return model.active_params


def expected_experts(experts: int, per_token: int, tokens: Any) -> Any:
    """Expected distinct experts one MoE layer runs for ``tokens`` tokens, each routed to ``per_token``
    of ``experts``: ``E · (1 − (1 − k/E)^B)``.

    Assumption: routing is uniform and independent between tokens (each token picks a uniformly random
    set of k distinct experts). An expert is then in one token's set with probability k/E, in none of B
    tokens' with (1 − k/E)^B, and the expectation of the count is E times the complement. Real routers
    are skewed (load-balancing losses only even them out on average), which touches fewer experts for
    the same B: this is an upper bound of the weights a step reads under skew. B = 1 gives k; B → ∞ gives E."""
    tokens = np.asarray(tokens, dtype=np.float64)
    return experts * (1.0 - (1.0 - per_token / experts) ** tokens)


def weights_read_bytes(model: ModelSpec, weights_bytes: Any, tokens: Any) -> Any:
    """Bytes of weights a step of ``tokens`` tokens streams, of ``weights_bytes`` for all of them.

    A dense model reads every weight once per step (``weights_bytes`` itself; the input-embedding table
    included, as the H100 preset's weight-streaming efficiency was derived). A mixture of experts reads its
    non-expert weights once and, in each MoE layer, only the experts the step's tokens are routed to — the
    :func:`expected_experts` of E: ``W · (1 − f) + W · f · expected(B) / E``, where ``f`` is the routed experts'
    share of the parameters (``routed_params / weight_params``; every weight at one precision)."""
    routed = model.routed_params
    if not routed:
        return weights_bytes
    w = np.asarray(weights_bytes, dtype=np.float64)
    share = routed / model.weight_params
    touched = expected_experts(model.experts, model.experts_per_token, tokens)
    return w * (1.0 - share) + w * share * touched / model.experts

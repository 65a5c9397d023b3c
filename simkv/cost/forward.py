"""One forward pass of a batch of like sequences (decode or prefill), priced by :func:`simkv.cost.step.step_cost`
with each layer kind's attention work (:func:`simkv.cost.attention.attention_work`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from simkv.cost.attention import attention_work
from simkv.cost.devices import Device
from simkv.cost.step import StepCost, step_cost
from simkv.kvspec import F32
from simkv.models import ModelSpec, weights_bytes as model_weights_bytes
from simkv.precision import Precision


def forward_cost(
    model: ModelSpec,
    device: Device,
    kv: Precision,
    *,
    batch: Any,
    context: Any,
    new: Any,
    weights_precision: str = "f16",
    copy_bytes: Any = 0,
    precision: str | None = None,
    mla: str = "latent",
    recurrent_bytes: float = F32,
    beside: tuple[tuple[Any, Any, Any], ...] = (),
) -> StepCost:
    """One forward pass of ``batch`` sequences, each with ``context`` cached tokens and
    ``new`` tokens to process: decode is ``new=1``, a prefill is ``context=0, new=prompt``.
    Each layer reads what it attends to (window- and chunk-capped; a linear layer its state) and writes
    the new tokens' KV (:func:`attention_work`; ``mla`` and ``recurrent_bytes`` as there); a mixture of
    experts reads the experts its ``batch × new`` tokens are routed to (:func:`weights_read_bytes`).
    ``beside``: further groups ``(batch, context, new)`` in the same step (a prompt chunk beside decodes), each
    sequence sampling a token: their tokens, logit rows and attention work added to the step's."""
    tokens = logits = read = write = flops = decode_flops = 0.0
    for b, c, n in ((batch, context, new), *beside):
        b = np.asarray(b, dtype=np.float64)
        c = np.asarray(c, dtype=np.float64)
        n = np.asarray(n, dtype=np.float64)
        work = attention_work(model, kv, c, n, sequences=b, mla=mla, recurrent_bytes=recurrent_bytes)
        tokens, logits = tokens + b * n, logits + b
        read, write = read + work.read_bytes, write + work.write_bytes
        flops, decode_flops = flops + work.flops, decode_flops + work.decode_flops  # a one-token query's own rate
    return step_cost(
        model,
        device,
        weights_bytes=model_weights_bytes(model, weights_precision),
        new_tokens=tokens,
        attended_pairs=0,
        kv_read_bytes=read,
        kv_write_bytes=write,
        copy_bytes=copy_bytes,
        precision=precision,
        logit_tokens=logits,
        attention_flops=flops,
        decode_flops=decode_flops,
    )

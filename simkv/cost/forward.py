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
) -> StepCost:
    """One forward pass of ``batch`` sequences, each with ``context`` cached tokens and
    ``new`` tokens to process: decode is ``new=1``, a prefill is ``context=0, new=prompt``.
    Each layer reads what it attends to (window- and chunk-capped; a linear layer its state) and writes
    the new tokens' KV (:func:`attention_work`; ``mla`` and ``recurrent_bytes`` as there); a mixture of
    experts reads the experts its ``batch × new`` tokens are routed to (:func:`weights_read_bytes`)."""
    batch = np.asarray(batch, dtype=np.float64)
    context = np.asarray(context, dtype=np.float64)
    new = np.asarray(new, dtype=np.float64)
    work = attention_work(model, kv, context, new, sequences=batch, mla=mla, recurrent_bytes=recurrent_bytes)
    result = step_cost(
        model,
        device,
        weights_bytes=model_weights_bytes(model, weights_precision),
        new_tokens=batch * new,
        attended_pairs=0,
        kv_read_bytes=work.read_bytes,
        kv_write_bytes=work.write_bytes,
        copy_bytes=copy_bytes,
        precision=precision,
        logit_tokens=batch,
        attention_flops=work.flops,
        decode_flops=work.decode_flops,  # a one-token query per sequence
    )
    return result

"""The figures ``simkv cost`` prints: a decode step, a prefill, the copy rate and the stateless loop's step."""

from __future__ import annotations

from typing import Any

from simkv.cost.attention import MLA_COMPUTE, attention_work, read_tokens
from simkv.cost.devices import GIB, Device, device_summary
from simkv.cost.forward import forward_cost
from simkv.cost.weights import expected_experts, weights_read_bytes
from simkv.errors import ConfigError
from simkv.kvspec import request_bytes, token_bytes
from simkv.models import ModelSpec, weights_bytes as model_weights_bytes
from simkv.precision import Precision


def estimate(
    model: ModelSpec,
    device: Device,
    kv: Precision,
    *,
    batch: int = 1,
    context: int = 1024,
    prompt: int | None = None,
    weights_precision: str = "f16",
    mla: str = "latent",
) -> dict[str, Any]:
    """The figures of ``simkv cost``: a decode step of ``batch`` sequences with ``context`` cached
    tokens, a prefill of ``prompt`` tokens, the copy time per GiB, and the stateless loop's step
    (the whole ``context + 1`` tokens recomputed) beside the stateful one. The stateful KV is what a
    runtime that keeps every token holds (OpenVINO's stateful pipeline, docs/DESIGN.md §4c), linear
    layers' states included. A mixture of experts adds ``moe`` (experts touched, weights read)."""
    from simkv.limits import MAX_BATCH, MAX_TOKENS

    for name, value, low, high in (("batch", batch, 1, MAX_BATCH), ("context", context, 0, MAX_TOKENS),
                                   ("prompt", prompt, 1, MAX_TOKENS)):
        if value is not None and (not isinstance(value, int) or value < low or value > high):
            raise ConfigError(f"--{name} must be an integer in {low:,}..{high:,}, got {value!r}")
    if mla not in MLA_COMPUTE:
        raise ConfigError(f"unknown MLA computation {mla!r}; choose {', '.join(MLA_COMPUTE)}")
    storage = "decompressed" if mla == "decompressed" else "latent"
    decode = forward_cost(model, device, kv, batch=batch, context=context, new=1, weights_precision=weights_precision,
                          mla=mla)
    work = attention_work(model, kv, context, 1, mla=mla)
    layers = model.kv_layers
    # the decode step's bytes per sequence in integers (exact at any size): the cache it reads, the new token's KV,
    # plus what attention_work adds on top (linear states, expanded MLA K/V; none for plain attention layers)
    cache_read = sum(read_tokens(layer, context) * token_bytes([layer], kv, mla=storage) for layer in layers)
    cache_write = token_bytes(layers, kv, mla=storage)
    kv_read = batch * (cache_read + int(round(float(work.read_bytes) - cache_read)))
    kv_write = batch * (cache_write + int(round(float(work.write_bytes) - cache_write)))
    kept = batch * request_bytes(layers, kv, context + 1, mla=storage, windows=False)
    stateless = forward_cost(model, device, kv, batch=batch, context=0, new=context + 1,
                             weights_precision=weights_precision, mla=mla)
    all_weights = model_weights_bytes(model, weights_precision)
    out: dict[str, Any] = {
        "model": model.name,
        "batch": batch,
        "context": context,
        "kv_precision": kv.name,
        "weights_precision": weights_precision,
        "decode_step_s": decode.seconds,
        "copy_s_per_gib": GIB / device.copy_bandwidth,
        "bound": decode.bound,
        "weights_bytes": all_weights,
        "kv_read_bytes": kv_read,
        "kv_write_bytes": kv_write,
        "flops": decode.flops,
        "terms": {"memory_s": decode.memory_s, "compute_s": decode.compute_s, "matmul_s": decode.matmul_s,
                  "attention_s": decode.attention_s, "overhead_s": decode.overhead_s},
        "stateless": {
            "decode_step_s": stateless.seconds,
            "bound": stateless.bound,
            "flops": stateless.flops,
            "kv_peak_bytes": kept,
            "kv_between_steps_bytes": 0,
            "slowdown": stateless.seconds / decode.seconds,
        },
        "stateful_kv_bytes": kept,
        "device": device_summary(device),
    }
    if model.routed_params:
        out["moe"] = {
            "experts": model.experts,
            "experts_per_token": model.experts_per_token,
            "moe_layers": model.moe_layers,
            "params": model.weight_params,
            "active_params": model.active_params,
            "decode_experts_touched": float(expected_experts(model.experts, model.experts_per_token, batch)),
            "decode_weights_read_bytes": float(weights_read_bytes(model, all_weights, batch)),
        }
    if any(layer.latent is not None for layer in layers):
        out["mla"] = mla
    if prompt is not None:
        pre = forward_cost(model, device, kv, batch=batch, context=0, new=prompt, weights_precision=weights_precision,
                           mla=mla)
        out["prefill_s"] = pre.seconds
        out["prefill_bound"] = pre.bound
        out["prefill_flops"] = pre.flops
    return out

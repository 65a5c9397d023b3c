"""Attention's side of a step: the positions each new token attends to per layer kind, the cached tokens a step
reads, and the FLOPs and bytes of a sequence's attention and state layers (docs/DESIGN.md §6a)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simkv.errors import ConfigError
from simkv.kvspec import F32, LayerKV, expand_flops, pair_flops, state_bytes, state_flops, token_bytes
from simkv.models import ModelSpec
from simkv.precision import Precision


def pair_flops_per_model(model: ModelSpec) -> int:
    """FLOPs of one attended pair summed over every attention layer (:func:`simkv.kvspec.pair_flops`, MLA
    expanded): ``4 · layers · heads · head_dim`` for a uniform model. What :func:`step_cost` charges per
    ``attended_pairs`` — right where every attention layer attends the same positions."""
    return sum(pair_flops(layer, model.heads) for layer in model.kv_layers)



def _window_pairs(context: Any, new: Any, window: int | None) -> Any:
    """Σ over ``new`` tokens appended after ``context`` of min(position + 1, window) (floats, exact on integers)."""
    # token i (0-based among the new) attends to context + i + 1 positions
    total = new * context + new * (new + 1) / 2
    if window is not None:
        w = float(window)
        # positions beyond the window: Σ_i max(0, context + i + 1 - w)
        first = np.maximum(0.0, w - context)  # new tokens that still fit the window entirely
        over = np.maximum(0.0, new - np.minimum(first, new))
        start = context + np.minimum(first, new) + 1 - w  # excess of the first over-window token
        total = total - over * start - over * (over - 1) / 2
    return total


def _chunk_prefix(n: Any, chunk: int) -> Any:
    """Σ_{p < n} (p mod C + 1): the pairs of the first n positions under chunked attention of C."""
    full = np.floor(n / chunk)
    rest = n - full * chunk
    return full * (chunk * (chunk + 1) / 2) + rest * (rest + 1) / 2


def layer_pairs(layer: LayerKV, context: Any, new: Any) -> Any:
    """Σ over ``new`` tokens appended after ``context`` cached ones of the positions each attends to in
    ``layer`` (itself included): all ``context + i + 1`` (full, MLA), at most W (sliding), or those since its
    chunk's start (chunked of C: the token at position p attends to positions C·⌊p/C⌋ … p, ``p mod C + 1`` of
    them, so the sum is F(context + new) − F(context) with F(n) = ⌊n/C⌋ · C(C+1)/2 + r(r+1)/2, r = n mod C).
    0 for a layer without attention."""
    context = np.asarray(context, dtype=np.float64)
    new = np.asarray(new, dtype=np.float64)
    if not layer.caches_tokens:
        return np.zeros(np.broadcast(context, new).shape)
    if layer.kind == "chunked":
        return _chunk_prefix(context + new, layer.window) - _chunk_prefix(context, layer.window)
    return _window_pairs(context, new, layer.window if layer.kind == "sliding" else None)


def read_tokens(layer: LayerKV, context: Any) -> Any:
    """Cached tokens a step reads from ``layer`` when its sequence has ``context`` of them: all (full, MLA),
    the last ``min(context, W)`` (sliding), or those of the current chunk, ``context mod C`` (chunked: after the
    chunk boundary a token attends to nothing before it; over a long decode the mean is (C − 1)/2). Python
    integers stay integers."""
    if not layer.caches_tokens:
        return 0 * context
    if layer.kind == "sliding":
        return np.minimum(context, layer.window) if isinstance(context, np.ndarray) else min(context, layer.window)
    if layer.kind == "chunked":
        return context % layer.window
    return context


def attended_pairs(model: ModelSpec, context: Any, new: Any) -> Any:
    """Σ over ``new`` tokens appended after ``context`` cached ones of the positions each
    attends to (itself included), capped by the model's sliding window (a uniform model)."""
    context = np.asarray(context, dtype=np.float64)
    new = np.asarray(new, dtype=np.float64)
    total = _window_pairs(context, new, model.sliding_window)
    return total if total.ndim else float(total)


#: How a runtime computes MLA attention (and so which cache form it reads):
#: ``latent`` — vLLM (vllm/v1/attention/backends/mla/common.py): a latent cache; one-token queries (decode)
#: absorbed into the latent, multi-token queries (prefill, chunked prefill) expand the cached latent per head;
#: ``latent-expand`` — transformers 5.x (``DeepseekV3Attention.expand_kv``): a latent cache, every step expands
#: all of it; ``decompressed`` — an optimum-intel / OpenVINO export: per-head K and V cached (docs/DESIGN.md §4c).
MLA_COMPUTE = ("latent", "latent-expand", "decompressed")


@dataclass(frozen=True)
class AttentionWork:
    """What one sequence's attention and state layers do in a step (arrays or floats)."""

    #: Attention and state arithmetic, FLOPs; ``decode_flops`` is the part from a one-token query's pairs.
    flops: Any
    decode_flops: Any
    #: Bytes read (the cache the step attends to, linear states, decompressed MLA K/V) and written (the new
    #: tokens' KV, updated states, decompressed MLA K/V).
    read_bytes: Any
    write_bytes: Any


def attention_work(model: ModelSpec, kv: Precision, context: Any, new: Any, *, sequences: Any = 1,
                   mla: str = "latent", recurrent_bytes: float = F32) -> AttentionWork:
    """The attention work of ``sequences`` sequences, each with ``context`` cached tokens appending ``new``
    ones, summed over the model's layers by kind (floats; arrays broadcast).

    - Attention layers (full, sliding, chunked, MLA): :func:`layer_pairs` pairs at
      :func:`simkv.kvspec.pair_flops` each; reads :func:`read_tokens` cached tokens and writes ``new`` at the
      layer's bytes per token (:func:`simkv.kvspec.token_bytes`: K + V + metadata, MLA in its cached form).
    - MLA by ``mla`` (:data:`MLA_COMPUTE`): absorbed pairs where vLLM absorbs (``latent``, one-token queries);
      where a latent cache is expanded, the pairs are the expanded ones, ``kv_b_proj`` runs on every cached
      position read (:func:`simkv.kvspec.expand_flops`; the new tokens' share is in the weight matmuls) and the
      decompressed K and V of every attended position are written once and read once (2 × their bytes at the
      KV precision, no metadata).
    - Linear-attention layers: O(1) per token — the state (conv + recurrent, :func:`simkv.kvspec.state_bytes`:
      conv at the KV precision's element size, recurrent at ``recurrent_bytes``, f32 in transformers' torch
      delta rule) is read once and written once per step whatever ``new`` is, and every new token costs
      :func:`simkv.kvspec.state_flops`.
    """
    if mla not in MLA_COMPUTE:
        raise ConfigError(f"unknown MLA computation {mla!r}; choose {', '.join(MLA_COMPUTE)}")
    storage = "decompressed" if mla == "decompressed" else "latent"
    b = np.asarray(sequences, dtype=np.float64)
    context = np.asarray(context, dtype=np.float64)
    new = np.asarray(new, dtype=np.float64)
    one_token = new == 1
    flops = decode = read = write = 0.0
    for layer, ids in model.groups:
        n = len(ids)
        if layer.kind == "linear":
            state = float(sum(state_bytes(layer, kv.bits / 8, recurrent_bytes)))
            stepped = b * np.where(new > 0, n * state, 0.0)
            read, write = read + stepped, write + stepped
            flops = flops + b * new * (n * float(state_flops(layer)))
            continue
        if not layer.caches_tokens:
            continue
        pairs = b * layer_pairs(layer, context, new)
        tokens = read_tokens(layer, context)
        per_token = float(n * token_bytes([layer], kv, mla=storage))
        read, write = read + b * tokens * per_token, write + b * new * per_token
        expanded = float(n * pair_flops(layer, model.heads))
        if layer.latent is not None and mla != "decompressed":
            absorbed = float(n * pair_flops(layer, model.heads, absorbed=True))
            expands = ~one_token if mla == "latent" else np.ones(np.shape(one_token), dtype=bool)
            pair = np.where(expands, expanded, absorbed) * pairs
            big = float(n * token_bytes([layer], kv, mla="decompressed", meta_per_head=0))
            flops = flops + np.where(expands, b * tokens * (n * float(expand_flops(layer))), 0.0)
            moved = np.where(expands, b * (tokens + new) * (2.0 * big), 0.0)
            read, write = read + moved / 2, write + moved / 2
        else:
            pair = expanded * pairs
        flops = flops + pair
        decode = decode + np.where(one_token, pair, 0.0)
    return AttentionWork(flops, decode, read, write)

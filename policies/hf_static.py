"""Hugging Face ``StaticCache``: ``max_cache_len`` tokens per layer, allocated on the first forward.

Source: huggingface/transformers 5.23.0 ``src/transformers/cache_utils.py``, classes
``StaticLayer`` (``lazy_initialization``, ``update``), ``StaticSlidingWindowLayer`` (``update``),
``LinearAttentionLayer`` and ``CacheLayerMixin.reorder_cache`` / ``reset``; observed with memray
on torch 2.13 CPU (``simkv validate --runtime transformers``, also on tiny Gemma-3, gpt-oss,
Llama-4, Qwen3-Next and DeepSeek-V3 configs: docs/DESIGN.md §3c,
``experiments/hf_layer_kinds/README.md`` §2.3):

* the first ``update`` of each layer runs ``lazy_initialization``: ``torch.zeros`` of
  ``[B, H_kv, max_cache_len, S]`` for the keys, then the values (``+K +V`` per layer); later
  tokens are written in place with ``index_copy_`` — nothing is allocated after that;
* sliding **and chunked** layers are ``StaticSlidingWindowLayer``: the same, at
  ``min(W, max_cache_len)`` tokens (W, one more than the dynamic view keeps: a *ring*,
  :meth:`Policy.ring_tokens`). A prompt longer than the ring on an empty layer is copied in
  without a temporary. Once the ring is full (``cumulative_length >= W'``) every one-token step
  rolls it: ``new_keys = self.keys.roll(-1)``, ``new_values = ...`` (+ an 8 B index tensor), copied
  back, both freed when ``update`` returns: ``+K[W'] +V[W'] -K -V`` per layer and step, modelled as
  rebuilding the ring (the same bytes in the same order);
* MLA layers (DeepSeek-V3) are ``StaticLayer``s of the latent: ``[B, 1, M, kv_lora_rank]`` and
  ``[B, 1, M, qk_rope_head_dim]``;
* linear-attention layers are the same ``LinearAttentionLayer`` as under ``DynamicCache``
  (states allocated at the first update, updated in place, zeroed and kept by ``reset``);
* ``reset()`` zeroes the tensors and keeps them;
* ``reorder_cache(beam_idx)`` is ``index_select`` on the full tensors: per layer a new
  ``max_cache_len`` (or ring-sized) K at the new batch, the old freed, then V (``+K -K +V -V``);
  a linear layer's conv state then its recurrent state alike;
* a history longer than ``max_cache_len`` cannot run (``index_copy_`` past the end); a
  multi-token step (a chat turn) that overflows a non-empty ring concatenates temporaries
  (``torch.cat((self.keys[:, :, 1:], key_states))``) that are not modelled: refused.

The 8-byte ``cumulative_length`` counter of each layer is allocated when the cache is built and
the per-update ``cache_position`` / index tensors are int64 temporaries: not KV, not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from policies.base import Policy, option
from policies.hf_dynamic import check_reset_batch
from simkv.errors import ConfigError, PolicyError
from simkv.workload import Decode, Reset, inference_of

_HELP = {f.name: f.metadata["help"] for f in fields(Policy)}
_PER_LAYER = "+k =k -k +v =v -v"  # one tensor replaced at a time (lazy_initialization, index_select)
_ROLL = "+k =k +v =v -k -v"  # both rolled copies before either is dropped


@dataclass(frozen=True)
class HFStatic(Policy):
    name = "hf-static"
    summary = "transformers StaticCache: max_cache_len tokens per layer on the first forward, in place after"
    unit = "layer"
    # DeepseekV3Attention decompresses every cached latent each step (expand_kv; docs/DESIGN.md §3c).
    mla_compute = "latent-expand"
    kv_in_model_dtype = True
    row_orders = {"grow": _PER_LAYER, "gather": _PER_LAYER}
    trim_rule = "refuse"  # StaticLayer has no crop (CacheLayerMixin.is_croppable is False)

    max_cache_len: int = option(4096, "tokens each layer's K and V tensors hold (StaticCache max_cache_len)")
    first_touch: bool = option(False, "resident only once written (off: torch.zeros writes each tensor whole, resident = allocated)")
    beam_gather: bool = option(True, _HELP["beam_gather"])

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_cache_len < 1:
            raise ConfigError(f"max_cache_len must be >= 1, got {self.max_cache_len}")

    def capacity(self, needed, prim):
        return np.full(np.shape(needed), self.max_cache_len, dtype=np.int64)

    def ring_tokens(self, layer):
        # StaticSlidingWindowLayer: effective_max_cache_len = min(sliding_window, max_cache_len).
        return min(layer.window, self.max_cache_len) if layer.window else None

    def kept_tokens(self, layer):
        return self.ring_tokens(layer)

    def orders(self, layer):
        if layer.window:
            return {**self.row_orders, "grow": _ROLL}
        return self.row_orders

    def check(self, model, workload) -> None:
        if workload.max_tokens > self.max_cache_len:
            raise PolicyError(f"hf-static: the session reaches {workload.max_tokens} tokens but max_cache_len is "
                              f"{self.max_cache_len}; raise it with --policy-opt max_cache_len=N")
        check_reset_batch(self.name, workload, "StaticCache zeroes its tensors and keeps them")
        rings = [self.ring_tokens(layer) for layer in model.kv_layers if layer.caches_tokens and layer.window]
        if not rings:
            return
        ring, batch, stored = min(rings), 1, 0
        for op in workload.ops:
            if isinstance(op, Decode):
                stored += op.steps
                continue
            inf = inference_of(op, batch, stored)
            if inf.tokens > 1 and 0 < stored and stored + inf.tokens > ring:
                raise PolicyError(f"hf-static: a {inf.tokens}-token step onto {stored} stored tokens overflows a "
                                  f"sliding layer's {ring}-token StaticSlidingWindowLayer, whose concatenated "
                                  "temporaries are not modelled")
            batch, stored = inf.batch, 0 if isinstance(op, Reset) else stored + inf.tokens

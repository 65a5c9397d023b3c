"""Hugging Face ``DynamicCache``: every layer's K and V are rebuilt with ``torch.cat`` every inference.

Source: huggingface/transformers 5.23.0 ``src/transformers/cache_utils.py``, classes
``DynamicLayer`` (``update``, ``reset``), ``DynamicSlidingWindowLayer`` (``update``) and
``CacheLayerMixin.reorder_cache``; ``Cache.update`` / ``reorder_cache`` / ``reset`` loop over
the layers in order. Observed allocation by allocation with memray on torch 2.13 CPU
(``simkv validate --runtime transformers``):

* ``DynamicLayer.update``: ``self.keys = torch.cat([self.keys, key_states])``, then the same
  for values. The cat allocates a tensor of exactly ``L0 + L1`` tokens and the assignment
  drops the old one at once: per layer ``+K -K +V -V``; the step's extra memory is one
  tensor, not a second cache (the old "two copies" is the ``exact`` policy). The first
  ``update`` starts from empty tensors, which allocate nothing.
* ``DynamicSlidingWindowLayer.update`` (a model with ``sliding_window`` W): both cats
  (``full_key_states``, ``full_value_states``) happen before ``self.keys``/``self.values``
  are replaced by views of their last ``W - 1`` tokens, so per layer ``+K +V -K -V``; the
  view keeps the whole cat alive: ``min(L0, W - 1) + L1`` tokens each step.
* ``reorder_cache(beam_idx)`` (a simkv fork, reorder or select, applied before the
  forward pass): ``self.keys.index_select(0, beam_idx)``, then values — a full gather
  copy per layer, ``+K -K +V -V``, at the stored length (``W - 1`` past the window) and
  the new batch; the forward's cat then reallocates again.
* ``reset()`` sets ``self.keys = self.values = None``: frees K then V, layer by layer
  (transformers 5.17 zeroed and kept them instead; the next prompt then concatenated onto the
  old length — measured on CUDA, docs/DESIGN.md §3b).

Per layer kind (``DYNAMIC_LAYER_TYPE_MAPPING``, ``get_layer_types_and_kwargs``; measured on tiny
Gemma-3, gpt-oss, Llama-4, Qwen3-Next and DeepSeek-V3 configs, docs/DESIGN.md §3c and
``experiments/hf_layer_kinds/README.md``; ``simkv validate --runtime transformers --arch ...``):

* sliding **and chunked** layers are ``DynamicSlidingWindowLayer`` with W = ``sliding_window`` or
  ``attention_chunk_size``: the rule above per layer (P tokens held after a prefill of P, then W per
  step); nothing happens at a chunk boundary (chunking lives in the mask);
* MLA layers (DeepSeek-V3) are plain ``DynamicLayer``s caching the latent: keys
  ``[B, 1, L, kv_lora_rank]``, values ``[B, 1, L, qk_rope_head_dim]``, model dtype;
* linear-attention layers are ``LinearAttentionLayer``: at the first update ``torch.zeros`` of the
  conv state ``[B, conv_dim, K]`` (model dtype, ``lazy_initialization``), then ``zeros_like`` of the
  recurrent state ``[B, Hv, dk, dv]`` (f32, the torch delta rule's dtype) — updated in place after
  (``copy_``), nothing allocated while decoding; ``reorder_cache`` replaces each with an
  ``index_select`` (``+conv -conv +rec -rec``); ``reset()`` zeroes them and keeps them
  (``LinearAttentionCacheLayerMixin.reset``), so a reset frees only the attention layers. LFM2's
  ``conv`` layers are ``LinearAttentionLayer``s too, with a conv state ``[B, hidden_size, conv_L_cache]``
  only (``Lfm2ShortConv.forward`` never calls ``update_recurrent_state``): the same rules, no recurrent row.

The same sequences were measured on CUDA (H100, torch 2.11, transformers 5.17) from torch's
allocator history (``experiments/hf_cuda_trace.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from policies.base import Policy, option
from simkv.errors import PolicyError
from simkv.workload import Fork, Reset, Select

_HELP = {f.name: f.metadata["help"] for f in fields(Policy)}
_PER_LAYER = "+k =k -k +v =v -v"  # one tensor replaced at a time


@dataclass(frozen=True)
class HFDynamic(Policy):
    name = "hf-dynamic"
    summary = "transformers DynamicCache: exact-size torch.cat per layer every step (+K -K +V -V), gather on beam_idx"
    unit = "layer"
    # DeepseekV3Attention decompresses every cached latent each step (expand_kv; docs/DESIGN.md §3c).
    mla_compute = "latent-expand"
    kv_in_model_dtype = True
    row_orders = {"grow": _PER_LAYER, "gather": _PER_LAYER}

    reset: str = option("free", _HELP["reset"])
    first_touch: bool = option(False, "resident only once written (off: torch writes each new tensor whole, resident = allocated)")
    beam_gather: bool = option(True, _HELP["beam_gather"])

    reset_keeps_states = True  # LinearAttentionCacheLayerMixin.reset zeroes the states in place

    def capacity(self, needed, prim):
        return needed

    def reclaim(self, needed, prim, capacity):
        # torch.cat allocates a new tensor whatever fits: only a sliding-window layer past
        # its window (same length every step) ever "fits", and it is rebuilt all the same.
        return np.ones(np.shape(needed), dtype=bool)

    def kept_tokens(self, layer):
        # keys[:, :, -W + 1:] keeps W - 1 tokens; for W = 1 the slice is [0:]: everything.
        # Chunked layers are the same class with W = attention_chunk_size (docs/DESIGN.md §3c).
        return layer.window - 1 if layer.window and layer.window > 1 else None

    def orders(self, layer):
        if layer.window:  # both cats before either old tensor is dropped
            return {**self.row_orders, "grow": "+k =k +v =v -k -v"}
        return self.row_orders

    def check(self, model, workload) -> None:
        if any(layer.kind == "linear" for layer in model.kv_layers):
            check_reset_batch(self.name, workload, "linear-attention states are zeroed and kept at their batch")


def check_reset_batch(policy: str, workload, why: str) -> None:
    """Refuse a reset while several beams are live: what transformers keeps across a reset keeps its batch."""
    batch = 1
    for op in workload.ops:
        if isinstance(op, Reset) and batch > 1:
            raise PolicyError(f"{policy}: reset keeps the cache's batch of beams ({why}); select one beam before resetting")
        batch = op.width if isinstance(op, Fork) else 1 if isinstance(op, (Select, Reset)) else batch

"""The cost model: how long one engine step takes on a device (docs/DESIGN.md §6).

One step processes ``new_tokens`` tokens over all its sequences (decode: one per
sequence; a prefill chunk: its length). It runs two kinds of kernels one after the
other: the weight matmuls (stream the weights once, do the matmul FLOPs) and
attention (read the KV cache its tokens attend to, write the KV of the new tokens,
do the QKᵀ and PV FLOPs). Each kind is bounded by its own roofline, and the step
is their sum plus two separate terms::

    t = max(weights_bytes / (bandwidth · η_bw), matmul FLOPs / (peak[precision] · η_flops))     # matmuls
        + max(KV bytes / (bandwidth · η_kv), attention FLOPs / attention rate)                 # attention
          (or their sum, where the device's attention does not overlap its reads: see below)
        + copy_bytes / copy_bandwidth          # KV reallocations (a synchronised copy)
        + step_overhead_s + layers · layer_overhead_s   # runtime/framework fixed cost per step
        + logit_tokens · (sequence_overhead_s + layers · heads · head_overhead_s   # per sequence sampling a token
                          + vocab · vocab_overhead_s)                           # (its sampler over the logits row)
        + (new_tokens − logit_tokens) · layers · heads · prompt_token_overhead_s  # per prompt token sampling none
        + R · (α(n) + 2(n − 1)/n · graph_tokens · hidden · 2 B / busbw(n))  # tensor parallelism of n > 1 devices

    weights_bytes read = weights_bytes                                       (dense)
                       = W · (1 − f) + W · f · E · (1 − (1 − k/E)^B) / E      (mixture of experts, B = graph_tokens)
    KV bytes = kv_read_bytes + kv_write_bytes   (η_kv defaults to η_bw)
    graph_tokens = new_tokens, or the batch padded to a CUDA graph's size (:mod:`.cudagraphs`): the layers'
                   GEMMs, the experts streamed and the all-reduces run over them; KV writes, attention and the
                   LM head over the real tokens
    matmul FLOPs = 2 · active_layer_params · graph_tokens + 2 · vocab · hidden · logit_tokens
                   (a device with matmul_rows_flops, the calibrated host: each part over min(peak · η_flops,
                    the rate measured at its rows: new_tokens, logit_tokens; past 64 rows the full 64-row
                    blocks at the rate for their rows plus the rows left over at theirs, Device.matmul_rate))
    attention FLOPs = P · attended_pairs + attention_flops,   P = Σ_layers 2 · heads · (k_dim + v_dim)
                                                               (= 4 · layers · heads · head_dim, uniform)
    attention time = (P · (pairs - decode_pairs) + attention_flops - decode_flops) / (peak · η_flops)
                     + (P · decode_pairs + decode_flops) / decode_attention_flops   (default: peak · η_flops too)

Under tensor parallelism (``model.tp = n > 1``, :func:`simkv.models.tp_shard`) the model is one device's share,
so weights, FLOPs and KV above are already divided; each step adds ``R`` all-reduces of the step's activations
(:func:`allreduces_per_step`: vLLM's ``o_proj`` and ``down_proj`` row-parallel linears in every layer and the
vocab-parallel embedding, ``2 · L + 1`` for a dense model; bf16/f16 activations, 2 B per element), each timed
by the device's :class:`Interconnect` (docs/research/plan-facts.md §2.2, §3).

``active_layer_params`` are the parameters of the matrices a token multiplies by in the
transformer layers (``ModelSpec.active_params`` without the LM head: of a mixture of
experts only the k experts it is routed to); the LM
head runs only for the tokens whose logits are needed (every token by default,
the last token of each sequence in :func:`forward_cost`). A mixture of experts
streams its non-expert weights (share 1 − f) once and, per MoE layer, the experts
its tokens touch (:func:`expected_experts`: uniform independent routing).
``attended_pairs`` is Σ over the step's tokens of the positions each attends to
(QKᵀ and PV cost 2 · k_dim and 2 · v_dim FLOPs per *query* head per pair), priced as
if every attention layer attended them; a model whose layers attend differently
(sliding, chunked, MLA absorbed or expanded, linear-attention state) gives its work per
layer kind as ``attention_flops`` (:func:`attention_work`, which :func:`forward_cost`
uses; docs/DESIGN.md §6a). ``decode_pairs`` are the pairs of
one-token queries (a sequence decoding): a CPU runtime computes them with a
dot-product loop per query head, not a matrix kernel — the OpenVINO CPU plugin's
``mha_single_token_kernel`` (``src/plugins/intel_cpu/src/nodes/kernels/scaled_attn/
mha_single_token.cpp``) dequantises each cached key and value row once per query
head of its group — so their rate is a device property of its own
(``Device.decode_attention_flops``, measured by ``simkv calibrate``), and grouped-query
models pay per query head, not per KV byte. That loop also does not hide its KV reads behind
its arithmetic: it walks the rows one at a time, so on such a device (``attention_overlap``
False) the attention time is the *sum* of the two terms, not the larger. ``simkv calibrate``
measures both rates on two probes that differ only in KV heads, and this host's figures fit
the sum (docs/guide/step-times.md).

Every argument of :func:`step_cost` may be a numpy array: the serving engine
evaluates ~10⁵ steps at once. The model leaves out activations' bytes (but for the decompressed K and V
of an expanded MLA cache), kernel
fusion gaps, cache effects and the overlap of a copy with compute.

Where each part lives (one room per concept; ``step_cost`` is the one function everything asks):

- :mod:`.devices` — ``Device``, the presets (``simkv/data/devices/<name>.json``, every number with its source),
  ``get_device``, the ``host`` preset's path;
- :mod:`.interconnects` — the all-reduce time model, its presets (``simkv/data/interconnects/<name>.json``) and the
  all-reduces a tensor-parallel step runs;
- :mod:`.weights` — the parameters a token multiplies by and the weights a step streams (experts touched);
- :mod:`.attention` — attended pairs and cached reads per layer kind, ``attention_work``, MLA per runtime;
- :mod:`.cudagraphs` — vLLM's CUDA-graph capture sizes and the padded token count a step runs over;
- :mod:`.step` — ``StepCost`` and ``step_cost``;
- :mod:`.forward` — ``forward_cost``, one forward pass of like sequences;
- :mod:`.report` — ``estimate``, the figures of ``simkv cost``.
"""

from simkv.cost.attention import (MLA_COMPUTE, AttentionWork, attended_pairs, attention_work, layer_pairs,
                                  pair_flops_per_model, read_tokens)
from simkv.cost.cudagraphs import capture_sizes, padded_tokens
from simkv.cost.devices import (DEFAULT_DEVICE, DEVICE_DIR, DEVICES, GIB, PRESET_NAMES, RUNTIMES, Device,
                                device_summary, get_device, host_preset_path, load_device)
from simkv.cost.forward import forward_cost
from simkv.cost.interconnects import (ACTIVATION_BYTES, INTERCONNECTS, Interconnect, allreduce_s,
                                      allreduces_per_step)
from simkv.cost.report import estimate
from simkv.cost.step import StepCost, gemm_mix, step_cost
from simkv.cost.weights import expected_experts, matmul_params, weights_read_bytes

__all__ = ["ACTIVATION_BYTES", "DEFAULT_DEVICE", "DEVICE_DIR", "DEVICES", "GIB", "INTERCONNECTS", "MLA_COMPUTE",
           "PRESET_NAMES", "RUNTIMES",
           "AttentionWork", "Device", "Interconnect", "StepCost", "allreduce_s", "allreduces_per_step", "attended_pairs",
           "attention_work", "capture_sizes", "device_summary", "estimate", "expected_experts", "forward_cost",
           "gemm_mix", "get_device",
           "host_preset_path", "layer_pairs", "load_device", "matmul_params", "padded_tokens", "pair_flops_per_model",
           "read_tokens",
           "step_cost", "weights_read_bytes"]

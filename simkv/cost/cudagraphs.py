"""CUDA-graph batch padding: the tokens a vLLM V1 step's forward pass really runs over.

vLLM V1 (0.12.0; docs/research/latency-facts.md §2) captures its forward pass as CUDA graphs for a fixed list of
batch sizes and, at run time, pads a batch to the smallest captured size that holds it:

- **The sizes** (``VllmConfig._set_cudagraph_sizes``, vllm/config/vllm.py): the largest is
  ``compilation_config.max_cudagraph_capture_size`` when the server sets it (gpt-oss's InferenceX recipe: 2048),
  else ``min(2 · max_num_seqs, 512)``; either is then capped at ``max_num_batched_tokens``. The sizes are
  ``[1, 2, 4]`` (those ≤ the largest) ``+ range(8, min(largest + 1, 256), 8) + range(256, largest + 1, 16)``.
- **The padding** (``CudagraphDispatcher.dispatch`` and ``_create_padded_batch_descriptor``,
  vllm/v1/cudagraph_dispatcher.py; ``VllmConfig.pad_for_cudagraph`` reads ``bs_to_padded_graph_size``; called
  from ``GPUModelRunner._determine_batch_execution_and_padding``, vllm/v1/worker/gpu_model_runner.py): a step of
  ``num_tokens ≤ max_cudagraph_capture_size`` runs the graph of the smallest capture size ≥ ``num_tokens`` — a
  FULL graph for a uniform decode batch, a PIECEWISE one (attention eager between the pieces) for a mixed batch
  or under ``cudagraph_mode: PIECEWISE``; both are padded to the same size. Above the largest size the step runs
  eagerly (``CUDAGraphMode.NONE``, ``BatchDescriptor(num_tokens)``), unpadded. With ``cudagraph_mode`` NONE (or
  ``enforce_eager``) nothing is captured and nothing is padded.
- **What the padded tokens cost** (``GPUModelRunner.execute_model``): the model runs over ``input_ids[:
  num_tokens_padded]`` (``_preprocess``), so every weight GEMM, the MoE router and the experts its (stale) padded
  ids are routed to, and every tensor-parallel all-reduce work on the padded count; the LM head runs on
  ``hidden_states[logits_indices]`` only — the real sequences' last tokens — and the padded slots write no KV
  (their slot mapping is padding) and attend to nothing.

So :func:`simkv.cost.step_cost` takes the padded count as ``graph_tokens`` and prices the layers' GEMMs, the
experts streamed and the all-reduces on it, the KV writes, attention and LM head on the real tokens.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import numpy as np

#: vLLM's cap on the default largest capture size (``min(max_num_seqs * 2, 512)``, ``_set_cudagraph_sizes``).
DEFAULT_MAX_CAPTURE = 512


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, max_capture_size: int | None = None) -> tuple[int, ...]:
    """The batch sizes vLLM 0.12 captures CUDA graphs for (``VllmConfig._set_cudagraph_sizes``), ascending.
    ``max_capture_size``: the server's ``max_cudagraph_capture_size`` (None: vLLM's default,
    ``min(2 · max_num_seqs, 512)``)."""
    largest = min(2 * max_num_seqs, DEFAULT_MAX_CAPTURE) if max_capture_size is None else max_capture_size
    largest = min(max_num_batched_tokens, largest)
    if largest < 1:
        return ()
    sizes = [s for s in (1, 2, 4) if s <= largest]
    if largest >= 8:
        sizes += range(8, min(largest + 1, 256), 8)
    if largest >= 256:
        sizes += range(256, largest + 1, 16)
    return tuple(sizes)


def padded_tokens(tokens: Any, sizes: tuple[int, ...]) -> Any:
    """The tokens a step of ``tokens`` new tokens runs its forward pass over: the smallest of ``sizes`` ≥ it where
    one holds it (a CUDA graph replayed), else ``tokens`` itself (eager, or no graphs: ``sizes`` empty); a step
    of 0 tokens runs nothing (0). An int for an int, else an int64 array (a count: bisected in ``sizes``, no
    array made — :meth:`simkv.serving.engine.costing.StepTimer.step` pads every step's count)."""
    if not sizes:
        return tokens
    if np.ndim(tokens) == 0:
        t = int(tokens)
        return int(sizes[bisect_left(sizes, t)]) if 0 < t <= sizes[-1] else t
    table = np.asarray(sizes, dtype=np.int64)
    t = np.asarray(tokens, dtype=np.int64)
    at = np.minimum(np.searchsorted(table, t, side="left"), len(table) - 1)
    return np.where((t > 0) & (t <= table[-1]), table[at], t)

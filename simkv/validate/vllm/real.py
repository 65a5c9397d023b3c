"""The real vLLM V1 scheduler on a simkv workload: the job written from simkv's specs, the run in the side venv.

:func:`job` maps a model's per-layer KV specs (:class:`simkv.kvspec.LayerKV`) to vLLM's ``KVCacheSpec``
classes (``vllm/v1/kv_cache_interface.py``), as vLLM's layers declare them:

* full attention → ``FullAttentionSpec(num_kv_heads, head_size=K, head_size_v=V)``;
* MLA → ``MLAAttentionSpec(num_kv_heads=1, head_size=kv_lora_rank + qk_rope_head_dim)`` (the latent is the
  cache: ``ModelConfig.get_head_size`` / ``get_num_kv_heads`` under ``use_mla``);
* sliding window → ``SlidingWindowSpec(sliding_window=W)``; chunked local → ``ChunkedLocalAttentionSpec``;
* linear attention / Mamba → ``MambaSpec`` whose state tensors are the layer's conv state (``kernel - 1``
  columns kept, ``MambaStateShapeCalculator``) and recurrent state at the model dtype (2 bytes here). As vLLM's
  ``HybridAttentionMambaModelConfig.verify_and_update_config`` does, the attention block grows until one
  attention page holds the Mamba state (simkv's ``paged_kv(..., "vllm")`` computes that block size) and the
  Mamba page is padded to the attention page; the Mamba block size is ``max_model_len`` without prefix caching
  (``mamba_cache_mode="none"``) and the attention block with it (``"align"``).

Grouping (page-size unification, group sizes) is left to vLLM's own ``get_kv_cache_groups``
(``vllm/v1/core/kv_cache_planning.py``); the answer names the groups it made. The pool is given in blocks
(``num_blocks``, block 0 being vLLM's null block), as ``--num-kv-blocks`` gives GenAI's.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from simkv.errors import ConfigError
from simkv.serving.sched.vllm import VllmSettings

from .env import driver_env, require

DRIVER = Path(__file__).with_name("driver.py")
#: The model dtype the specs are written at (vLLM's "auto" for a float16 model): 2 bytes per element.
DTYPE, DTYPE_BYTES = "float16", 2
#: Steps after which a real run is stopped (a workload within ``validate --paged``'s bounds ends far sooner).
MAX_STEPS = 100_000
#: Seconds one real run may take before it is stopped.
TIMEOUT_S = 600


#: vLLM's scheduler and cache settings that a validation varies: simkv's own scheduler takes the same.
SchedulerSettings = VllmSettings


@dataclass
class RealRun:
    """What the real scheduler did: one record per step (see :mod:`.driver`), the groups it made."""

    steps: list[dict]
    groups: list[dict]
    block_size: int
    hash_block_size: int
    mamba_cache_mode: str
    free_at_end: int
    elapsed_s: float
    versions: dict = field(default_factory=dict)


def layer_dicts(model, block_size: int, *, prefix_caching: bool, max_model_len: int) -> tuple[list[dict], int]:
    """The driver's per-layer specs for ``model`` and the attention block size (grown for Mamba layers)."""
    from simkv.precision import get_precision
    from simkv.serving.kv.groups import conv_columns, paged_kv

    from simkv.kvspec import token_bytes

    precision = get_precision("f16")
    layers = model.kv_layers
    if any(layer.kind == "linear" for layer in layers):
        block_size = paged_kv(model, precision, block_size, "vllm", prefix_caching=prefix_caching).block_size
    out, attn_page = [], 0
    for layer in layers:
        if layer.kind == "none" or (not layer.caches_tokens and layer.kind != "linear"):
            out.append({"kind": "none"})
        elif layer.kind == "linear":
            out.append({"kind": "mamba"})  # shapes below, once the attention page is known
        else:
            heads, k, v = layer.cached("latent")
            base = {"num_kv_heads": heads, "head_size": k, "dtype": DTYPE}
            if layer.latent is not None:
                out.append({"kind": "mla", **base, "num_kv_heads": 1, "head_size": k + v})
            elif layer.kind == "full":
                out.append({"kind": "full", **base, "head_size_v": v})
            elif layer.kind in ("sliding", "chunked"):
                if k != v:
                    raise ConfigError("vLLM's sliding and chunked specs have one head size: K and V must match")
                out.append({"kind": layer.kind, **base, "window": layer.window})
            else:  # pragma: no cover - kvspec's kinds are all above
                raise ConfigError(f"no vLLM spec for a {layer.kind} layer")
            attn_page = attn_page or block_size * token_bytes((layer,), precision, mla="latent")
    columns = conv_columns(model)
    for layer, spec in zip(layers, out):
        if spec["kind"] != "mamba":
            continue
        conv = layer.conv_elements
        if columns:
            kernel, kept = columns
            conv = conv * kept // kernel
        shapes = [[n] for n in (conv, layer.recurrent_elements) if n]
        page = (conv + layer.recurrent_elements) * DTYPE_BYTES
        if page > attn_page:
            raise ConfigError("a Mamba state larger than the attention page: the block size was not aligned")
        spec.update(shapes=shapes, dtype=DTYPE, page_size_padded=attn_page,
                    block_size=block_size if prefix_caching else max_model_len)
    return out, block_size


def job(model, requests: Sequence, token_ids: Sequence[Sequence[int]], settings: SchedulerSettings) -> dict:
    """The JSON job :mod:`.driver` reads."""
    settings.check()
    check_workload(requests)
    check_model_len(requests, settings.max_model_len)
    layers, block_size = layer_dicts(model, settings.block_size, prefix_caching=settings.enable_prefix_caching,
                                     max_model_len=settings.max_model_len)
    sched = {k: getattr(settings, k) for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                                                 "long_prefill_token_threshold", "policy", "enable_prefix_caching")}
    reqs = [{"id": str(r.id), "arrival_step": int(r.arrival_step), "prompt_token_ids": [int(t) for t in ids],
             "max_new_tokens": int(r.max_new_tokens), "priority": int(getattr(r, "priority", 0) or 0)}
            for r, ids in zip(requests, token_ids)]
    return {"layers": layers, "block_size": block_size, "num_blocks": settings.num_blocks, "scheduler": sched,
            "requests": reqs, "max_steps": MAX_STEPS}


def check_model_len(requests: Sequence, max_model_len: int) -> None:
    """vLLM's admission check on prompt length, which the driver's direct ``Scheduler.add_request`` skips:
    ``InputProcessor._validate_prompt_len`` (``vllm/v1/engine/input_processor.py``, 0.33.0) refuses a prompt
    longer than ``max_model_len`` and, for a generating model, one of exactly ``max_model_len`` tokens (no room for
    one output token). A prompt that fits but whose ``max_tokens`` would run past ``max_model_len`` is admitted: the
    scheduler stops it at ``max_model_len`` tokens (``check_stop``, ``vllm/v1/core/sched/utils.py``), and the
    OpenAI server lowers its ``max_tokens`` to ``max_model_len − prompt`` beforehand (``get_max_tokens``,
    ``vllm/entrypoints/serve/utils/api_utils.py``): the same end."""
    for r in requests:
        if r.prompt >= max_model_len:
            raise ConfigError(f"request {r.id}: the prompt (length {r.prompt}) "
                              f"{'plus one output token ' if r.prompt == max_model_len else ''}is longer than the "
                              f"maximum model length of {max_model_len} (vLLM refuses it at add time)")


def check_workload(requests: Sequence) -> None:
    """``validate --paged``'s checks (arrival steps, no sessions, at most 500 requests and 100,000 tokens), and one
    sequence per request: vLLM's scheduler sees each of ``n`` samples as a request of its own."""
    from ..genai.runner import check_workload as check_paged_workload

    check_paged_workload(requests)
    for r in requests:
        if r.samples > 1 or r.beam > 1:
            raise ConfigError(f"request {r.id}: vLLM's scheduler sees one sequence per request (n > 1 is split into "
                              "requests before it): give samples=1, beam=1")


def run_jobs(payloads: Sequence[dict]) -> list[RealRun | ConfigError]:
    """Run several jobs through the real scheduler in one start of the side venv's Python (vLLM imported once):
    one :class:`RealRun` per job, or the :class:`ConfigError` saying what the real scheduler refused it with.
    Raises :class:`ConfigError` (missing venv) or RuntimeError (the child died, or ran past :data:`TIMEOUT_S`)."""
    python = require()
    t0 = time.perf_counter()
    try:
        done = subprocess.run([str(python), str(DRIVER)], input=json.dumps({"jobs": list(payloads)}),
                              capture_output=True, text=True, env=driver_env(), timeout=TIMEOUT_S,
                              cwd=str(DRIVER.parent))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the real vLLM scheduler ran past {TIMEOUT_S} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = [ln for ln in done.stderr.splitlines() if ln.strip()]
        raise RuntimeError(f"the vLLM driver failed (exit {done.returncode}): {tail[-1] if tail else 'no output'}")
    elapsed = time.perf_counter() - t0
    out: list[RealRun | ConfigError] = []
    for answer in json.loads(lines[-1])["answers"]:
        if "error" in answer:
            out.append(ConfigError(f"the real vLLM scheduler refused the job: {answer['error']}"))
            continue
        out.append(RealRun(steps=answer["steps"], groups=answer["groups"], block_size=answer["block_size"],
                           hash_block_size=answer["hash_block_size"], mamba_cache_mode=answer["mamba_cache_mode"],
                           free_at_end=answer["free_at_end"], elapsed_s=elapsed / len(payloads),
                           versions=answer.get("versions", {})))
    return out


def run_job(payload: dict) -> RealRun:
    """One job through the real scheduler (:func:`run_jobs`); its refusal raised as the :class:`ConfigError`."""
    (answer,) = run_jobs([payload])
    if isinstance(answer, ConfigError):
        raise answer
    return answer


def run_real(model, requests: Sequence, token_ids: Sequence[Sequence[int]], settings: SchedulerSettings) -> RealRun:
    """The workload (with these prompt token ids) through the real vLLM scheduler."""
    return run_job(job(model, requests, token_ids, settings))

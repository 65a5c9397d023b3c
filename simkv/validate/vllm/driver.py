"""The real vLLM V1 scheduler, driven step by step with fake model outputs: run by the side venv's Python.

This file runs in the side venv (``simkv setup vllm``), not in simkv's: it imports vLLM and the standard
library only, never ``simkv``. It reads ``{"jobs": [job, …]}`` as JSON on stdin and writes
``{"answers": [run, …]}`` on stdout, one run (or ``{"error": …}``) per job, in order
(:func:`simkv.validate.vllm.real.run_jobs` writes the jobs and reads the answers). Several jobs share one process,
so vLLM is imported once (about 6 s of a start here): CI batches its cases into one start.

Job: ``layers`` (one spec per layer, in order: ``{"kind": "full"|"sliding"|"chunked"|"mla"|"mamba", ...}``),
``block_size`` (tokens per attention block, after simkv's Mamba alignment), ``num_blocks`` (the pool,
block 0 included: vLLM's null block), ``scheduler`` (``max_num_seqs``, ``max_num_batched_tokens``,
``max_model_len``, ``long_prefill_token_threshold``, ``policy``, ``enable_prefix_caching``), ``requests``
(``id``, ``arrival_step``, ``prompt_token_ids``, ``max_new_tokens``, ``priority``).

What it does, as vLLM's own unit tests do (``tests/v1/core/utils.py`` ``create_scheduler``): builds per-layer
``KVCacheSpec``s, groups them with vLLM's own ``get_kv_cache_groups`` (page-size unification included), makes
a ``KVCacheConfig`` of ``num_blocks`` blocks, a ``Scheduler``, then loops over step index ``k = 0, 1, …``: adds
the requests whose ``arrival_step == k`` (file order; ``arrival_time`` = their index in the file), calls
``schedule()``, builds a ``ModelRunnerOutput`` with one sampled token for each scheduled request that has
reached the end of its known tokens and none for a partial prefill chunk (as the GPU model runner does), and
calls ``update_from_output()``. A generated token's id is ``GENERATED_ID + index``: distinct per request, so
no two requests share generated content and a preempted request's recompute finds its own cached blocks.
The loop ends when no request is left and none is pending; an idle index with a later arrival still calls
``schedule()``, so step numbers are arrival steps.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

#: Generated tokens' ids start here (the prompts' ids lie below it).
GENERATED_ID = 1_000_000


def _dtype(torch, name: str):
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def layer_specs(job: dict, torch, block_size: int) -> dict:
    """One vLLM ``KVCacheSpec`` per layer (``vllm/v1/kv_cache_interface.py``), named ``layers.<i>``."""
    from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec, MambaSpec,
                                            MLAAttentionSpec, SlidingWindowSpec)

    specs = {}
    for i, layer in enumerate(job["layers"]):
        kind = layer["kind"]
        dtype = _dtype(torch, layer.get("dtype", "float16"))
        name = f"layers.{i}"
        if kind == "none":
            continue
        if kind == "mamba":
            specs[name] = MambaSpec(block_size=layer["block_size"], shapes=tuple(tuple(s) for s in layer["shapes"]),
                                    dtypes=tuple(dtype for _ in layer["shapes"]),
                                    page_size_padded=layer.get("page_size_padded"),
                                    mamba_type=layer.get("mamba_type", "mamba2"),
                                    mamba_cache_mode=job["mamba_cache_mode"])
            continue
        common = dict(block_size=layer.get("block_size", block_size), num_kv_heads=layer["num_kv_heads"],
                      head_size=layer["head_size"], dtype=dtype)
        if kind == "full":
            specs[name] = FullAttentionSpec(**common, head_size_v=layer.get("head_size_v", layer["head_size"]))
        elif kind == "mla":
            specs[name] = MLAAttentionSpec(**common, cache_dtype_str=None)
        elif kind == "sliding":
            specs[name] = SlidingWindowSpec(**common, sliding_window=layer["window"])
        elif kind == "chunked":
            specs[name] = ChunkedLocalAttentionSpec(**common, attention_chunk_size=layer["window"])
        else:
            raise ValueError(f"unknown layer kind {kind!r}")
    return specs


def model_dir(job: dict) -> str:
    """A folder with a Llama ``config.json`` for ``ModelConfig`` (the scheduler reads only ``max_model_len`` and
    the dtype from it; the KV specs are ours)."""
    path = tempfile.mkdtemp(prefix="simkv-vllm-model-")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": GENERATED_ID + 10_000, "max_position_embeddings": max(job["scheduler"]["max_model_len"], 16),
              "torch_dtype": "float16", "rms_norm_eps": 1e-6}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def build(job: dict):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.structured_output import StructuredOutputManager

    s = job["scheduler"]
    has_mamba = any(layer["kind"] == "mamba" for layer in job["layers"])
    mode = "align" if has_mamba and s["enable_prefix_caching"] else "none"
    job["mamba_cache_mode"] = mode
    scheduler_config = SchedulerConfig(max_num_seqs=s["max_num_seqs"], max_num_batched_tokens=s["max_num_batched_tokens"],
                                       max_model_len=s["max_model_len"],
                                       long_prefill_token_threshold=s.get("long_prefill_token_threshold", 0),
                                       enable_chunked_prefill=True, async_scheduling=False, is_encoder_decoder=False,
                                       policy=s.get("policy", "fcfs"))
    model_config = ModelConfig(model=model_dir(job), skip_tokenizer_init=True, dtype="float16",
                               max_model_len=s["max_model_len"], seed=0)
    cache_kwargs = dict(block_size=job["block_size"], enable_prefix_caching=s["enable_prefix_caching"])
    if has_mamba:
        cache_kwargs["mamba_cache_mode"] = mode
    cache_config = CacheConfig(**cache_kwargs)
    # The engine core resolves the physical layout from the attention backends (``resolve_kv_cache_layout``);
    # FlashAttention's on CUDA is layer-outermost ("NHD" = LBNHC), under which grouping unifies page sizes
    # (a block-outermost layout would pack groups instead: ``_get_packed_kv_cache_groups``).
    cache_config.kv_cache_layout = job.get("kv_cache_layout", "LBNHC")
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config)
    specs = layer_specs(job, torch, job["block_size"])
    groups = get_kv_cache_groups(vllm_config, specs)
    # A server's KVCacheConfig carries CacheConfig.prefix_cache_retention_interval (default 0: sliding and Mamba
    # groups cache only the blocks a replay or a shared-prefix junction can reach), as
    # kv_cache_planning.get_kv_cache_config_from_groups sets it; the constructor's own default (None) is dense.
    kv_cache_config = KVCacheConfig(num_blocks=job["num_blocks"], kv_cache_tensors=[], kv_cache_groups=groups,
                                    prefix_cache_retention_interval=cache_config.prefix_cache_retention_interval)
    cache_config.num_gpu_blocks = job["num_blocks"]
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                          structured_output_manager=StructuredOutputManager(vllm_config), block_size=block_size,
                          hash_block_size=hash_block_size, log_stats=True)
    described = [{"layers": [int(n.split(".")[1]) for n in g.layer_names], "spec": type(g.kv_cache_spec).__name__,
                  "block_size": g.kv_cache_spec.block_size, "page_size_bytes": g.kv_cache_spec.page_size_bytes}
                 for g in groups]
    return scheduler, hash_block_size, {"groups": described, "block_size": block_size,
                                        "hash_block_size": hash_block_size, "mamba_cache_mode": mode}


def run(job: dict) -> dict:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.utils.hashing import sha256

    t0 = time.perf_counter()
    scheduler, hash_block_size, described = build(job)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(hash_block_size, sha256)
    pending = sorted(enumerate(job["requests"]), key=lambda p: (p[1]["arrival_step"], p[0]))
    index_of = {str(r["id"]): i for i, r in enumerate(job["requests"])}
    pool = scheduler.kv_cache_manager.block_pool
    steps, k, cursor = [], 0, 0
    max_steps = job.get("max_steps", 100_000)
    while cursor < len(pending) or scheduler.get_num_unfinished_requests():
        while cursor < len(pending) and pending[cursor][1]["arrival_step"] <= k:
            i, r = pending[cursor]
            params = SamplingParams(max_tokens=r["max_new_tokens"], ignore_eos=True, temperature=0.0)
            scheduler.add_request(Request(request_id=str(r["id"]), prompt_token_ids=list(r["prompt_token_ids"]),
                                          sampling_params=params, pooling_params=None, arrival_time=float(i),
                                          priority=r.get("priority", 0), block_hasher=hasher))
            cursor += 1
        out = scheduler.schedule()
        record = {"step": k, "scheduled": dict(out.num_scheduled_tokens),
                  "new": [r.req_id for r in out.scheduled_new_reqs],
                  "resumed": sorted(out.scheduled_cached_reqs.resumed_req_ids),
                  "preempted": sorted(out.preempted_req_ids or ()),
                  "hits": {}, "blocks": {}, "free_after_schedule": pool.get_num_free_blocks()}
        for r in out.scheduled_new_reqs:
            record["hits"][r.req_id] = r.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
            if rid in cached.resumed_req_ids:
                record["hits"][rid] = computed
        for req in scheduler.running:
            record["blocks"][req.request_id] = [list(ids) for ids in
                                                scheduler.kv_cache_manager.get_block_ids(req.request_id)]
        sampled = []
        ids = list(out.num_scheduled_tokens)
        for rid in ids:
            req = scheduler.requests[rid]
            done = req.num_computed_tokens >= req.num_tokens  # past its known tokens: the step samples one
            sampled.append([GENERATED_ID + index_of[rid]] if done else [])
        runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: n for n, rid in enumerate(ids)},
                                   sampled_token_ids=sampled)
        scheduler.update_from_output(out, runner)
        record["finished"] = sorted((rid for rid in ids if rid not in scheduler.requests), key=index_of.get)
        record["free"] = pool.get_num_free_blocks()
        record["running"] = [r.request_id for r in scheduler.running]
        record["waiting"] = [r.request_id for r in scheduler.waiting]
        steps.append(record)
        k += 1
        if not ids and not scheduler.running and cursor == len(pending) and scheduler.waiting:
            # Nothing runs, nothing will arrive, and the waiting head does not fit: vLLM would wait forever
            # (its startup check that max_model_len fits the pool is what prevents this in a real server).
            head = scheduler.waiting.peek_request().request_id
            return {"error": f"stalled at step {k - 1}: request {head} can never be admitted (the pool is too small "
                             "for its whole prompt: scheduler_reserve_full_isl)", "steps": steps, **described}
        if k >= max_steps:
            return {"error": f"no end after {max_steps} steps", "steps": steps, **described}
    import vllm

    return {"steps": steps, **described, "free_at_end": pool.get_num_free_blocks(),
            "elapsed_s": time.perf_counter() - t0, "versions": {"vllm": vllm.__version__}}


def run_one(job: dict) -> dict:
    """One job's run, or the one line the real scheduler refused it with (the other jobs go on)."""
    try:
        return run(job)
    except Exception as err:  # the real scheduler refused the job: one line back to the parent
        return {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"}


def main() -> int:
    jobs = json.load(sys.stdin)["jobs"]
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # vLLM's prints must not corrupt the answer
    answers = [run_one(job) for job in jobs]
    json.dump({"answers": answers}, real_stdout)
    real_stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

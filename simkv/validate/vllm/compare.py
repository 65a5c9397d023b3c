"""simkv's vLLM scheduler (:mod:`simkv.serving.sched.vllm`) against the real one (:mod:`.real`), step by step.

Compared per step (the driver's record, ``driver.py``): tokens scheduled per request, new / resumed / preempted
requests, prefix-cache hits, every running request's block ids per group, free blocks after scheduling and at
the step's end, finished requests, the running and waiting queues.
"""

from __future__ import annotations

from typing import Sequence

#: The fields of a step record compared (the driver's names).
STEP_FIELDS = ("scheduled", "new", "resumed", "preempted", "hits", "blocks", "free_after_schedule", "free",
               "finished", "running", "waiting")


def settings_of(settings):
    """The real run's :class:`~.real.SchedulerSettings` as simkv's :class:`VllmSettings`."""
    from simkv.serving.sched.vllm import VllmSettings

    return VllmSettings(num_blocks=settings.num_blocks, max_num_batched_tokens=settings.max_num_batched_tokens,
                        max_num_seqs=settings.max_num_seqs, max_model_len=settings.max_model_len,
                        long_prefill_token_threshold=settings.long_prefill_token_threshold, policy=settings.policy,
                        enable_prefix_caching=settings.enable_prefix_caching)


def specs_of(model, settings) -> list[tuple[str, int, int]]:
    """vLLM's groups for ``model`` as simkv lays them out (``--kv-manager vllm``), at the real run's dtype."""
    from simkv.precision import get_precision
    from simkv.serving.kv.groups import paged_kv
    from simkv.serving.sched.vllm import group_specs

    kv = paged_kv(model, get_precision("f16"), settings.block_size, "vllm",
                  prefix_caching=settings.enable_prefix_caching)
    return group_specs(kv, settings.max_model_len)


def simulate(model, requests: Sequence, token_ids, settings) -> list[dict]:
    """The workload through simkv's vLLM scheduler, recorded as the driver records the real one."""
    from simkv.serving.sched.vllm import simulate_steps

    return simulate_steps(specs_of(model, settings), settings_of(settings), requests, token_ids)


def compare_steps(real: Sequence[dict], sim: Sequence[dict], limit: int = 20) -> dict:
    """``validate --paged``'s summary fields over :data:`STEP_FIELDS`; a missing step mismatches."""
    n = max(len(real), len(sim))
    mismatches, matched = [], 0
    for k in range(n):
        a = real[k] if k < len(real) else None
        b = sim[k] if k < len(sim) else None
        if a is None or b is None:
            diff = {"step": {"real": None if a is None else k, "simulated": None if b is None else k}}
        else:
            diff = {f: {"real": a[f], "simulated": b[f]} for f in STEP_FIELDS if a[f] != b[f]}
        if diff:
            if len(mismatches) < limit:
                mismatches.append({"step": k, "fields": diff})
        else:
            matched += 1
    return {"steps_total": n, "steps_matched": matched, "steps_mismatched": n - matched,
            "first_mismatches": mismatches}

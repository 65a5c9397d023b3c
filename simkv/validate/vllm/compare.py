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


def specs_of(model, settings) -> list[tuple[str, int, int]]:
    """vLLM's groups for ``model`` as simkv lays them out (``--kv-manager vllm``), at the real run's dtype."""
    from simkv.precision import get_precision
    from simkv.serving.kv.groups import paged_kv
    from simkv.serving.sched.vllm import group_specs

    kv = paged_kv(model, get_precision("f16"), settings.block_size, "vllm",
                  prefix_caching=settings.enable_prefix_caching)
    return group_specs(kv, settings.max_model_len, settings.enable_prefix_caching)


def simulate(model, requests: Sequence, token_ids, settings) -> list[dict]:
    """The workload through simkv's vLLM scheduler, recorded as the driver records the real one."""
    from simkv.serving.sched.vllm import simulate_steps

    return simulate_steps(specs_of(model, settings), settings, requests, token_ids)


def compare_steps(real: Sequence[dict], sim: Sequence[dict], limit: int = 20) -> dict:
    """``validate --paged``'s summary fields over :data:`STEP_FIELDS`; a missing step mismatches."""
    from ..genai.runner import tally_steps

    return tally_steps(real, sim, lambda k, a, b: {f: {"real": a[f], "simulated": b[f]} for f in STEP_FIELDS
                                                   if a[f] != b[f]}, limit)


#: The most random requests one validation takes (``--random N``).
MAX_RANDOM_REQUESTS = 500


#: Priorities a random workload draws under ``--scheduling-policy priority`` (lower is served first).
RANDOM_PRIORITIES = 4


def random_workload(n: int, seed: int, prefix_caching: bool, priorities: bool = False) -> list:
    """``n`` random requests drawn as ``validate --paged``'s random workloads draw theirs
    (:func:`simkv.validate.genai.runner.random_case`: prompts 1–160 tokens, 1–60 new, two shared prefixes "a" and
    "b" under prefix caching, some prompts exactly their prefix), arriving over ``2n`` steps, one sequence each.
    With ``priorities`` each request gets a priority in ``0..3``, drawn after the rest from a generator of its own
    (the lengths and arrivals stay those of the same seed without)."""
    import dataclasses

    import numpy as np

    from simkv.serving.requests import Request

    rng = np.random.default_rng([seed, 27])
    arrivals = np.sort(rng.integers(0, 2 * n, n))
    reqs = []
    for i in range(n):
        prompt = int(rng.integers(1, 161))
        new = int(rng.integers(1, 61))
        pid, ptok = None, 0
        if prefix_caching and rng.random() < 0.7:
            pid = str(rng.choice(["a", "b"]))
            ptok = prompt if rng.random() < 0.25 else int(rng.integers(1, prompt + 1))
        reqs.append(Request(i, prompt, new, arrival_step=int(arrivals[i]), prefix_id=pid, prefix_tokens=ptok))
    if priorities:
        drawn = np.random.default_rng([seed, 27, 1]).integers(0, RANDOM_PRIORITIES, n)
        reqs = [dataclasses.replace(r, priority=int(p)) for r, p in zip(reqs, drawn)]
    return reqs


def fitting_pool(model, requests: Sequence, settings) -> int:
    """Twice the blocks (null block included) that the longest request's whole sequence needs to be admitted (S4):
    every request fits alone, and several at once preempt each other."""
    from simkv.serving.kv.vllm_pool import cdiv

    longest = min(max(r.prompt + r.max_new_tokens for r in requests), settings.max_model_len)
    need = 0
    for kind, bs, window in specs_of(model, settings):
        blocks = cdiv(longest, bs)
        if kind == "sliding":
            blocks = min(blocks, cdiv(min(window - 1 + settings.max_num_batched_tokens, settings.max_model_len), bs) + 1)
        elif kind == "chunked":
            blocks = min(blocks, cdiv(min(window + settings.max_num_batched_tokens, settings.max_model_len), bs))
        need += blocks
    return 2 * need + 1


def cli_main(args) -> int:
    """``simkv validate --runtime vllm``: a workload (``--trace`` or ``--random N``) through the real vLLM scheduler
    (side venv) and simkv's, compared step by step; exit 0 only if every step matched."""
    import dataclasses
    import json
    import sys
    import time

    from simkv.errors import ConfigError
    from simkv.hfconfig import resolve_model
    from simkv.validate.genai.runner import prompt_token_ids

    from .real import SchedulerSettings, check_model_len, check_workload, run_real

    if (args.trace is None) == (args.random is None):
        raise ConfigError("--runtime vllm needs exactly one of --trace W.csv and --random N")
    if args.model == "custom":
        model = resolve_model("custom", layers=args.layers or 2, heads=args.heads or 4,
                              kv_heads=args.kv_heads or 2, head_dim=args.head_dim or 16)
    else:
        model = resolve_model(args.model)
    if args.random is not None:
        if not 1 <= args.random <= MAX_RANDOM_REQUESTS:
            raise ConfigError(f"--random must be in 1..{MAX_RANDOM_REQUESTS}")
        requests = random_workload(args.random, args.seed, args.prefix_caching, args.scheduling_policy == "priority")
    else:
        from simkv.serving.requests import load_trace

        requests = load_trace(args.trace)
    check_workload(requests)
    settings = SchedulerSettings(num_blocks=args.num_kv_blocks or 2, block_size=args.block_size,
                                 max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                                 max_model_len=args.max_model_len, enable_prefix_caching=args.prefix_caching,
                                 long_prefill_token_threshold=args.long_prefill_token_threshold,
                                 policy=args.scheduling_policy)
    settings.check()
    check_model_len(requests, settings.max_model_len)
    if not args.num_kv_blocks:
        settings = dataclasses.replace(settings, num_blocks=fitting_pool(model, requests, settings))
    ids = prompt_token_ids(requests, args.seed)
    t0 = time.perf_counter()
    sim = simulate(model, requests, ids, settings)
    sim_s = time.perf_counter() - t0
    real = run_real(model, requests, ids, settings)
    data = {"runtime": "vllm", "model": model.name, "requests": len(requests), "seed": args.seed,
            "settings": dataclasses.asdict(settings), "groups": real.groups,
            **compare_steps(real.steps, sim), "preemptions": sum(len(s["preempted"]) for s in real.steps),
            "prefix_hit_tokens": sum(sum(s["hits"].values()) for s in real.steps),
            "real_s": round(real.elapsed_s, 2), "simulated_s": round(sim_s, 3), "versions": real.versions}
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        ok = data["steps_mismatched"] == 0
        print(f"simkv validate --runtime vllm: the real vLLM {real.versions.get('vllm', '')} scheduler (CPU) vs "
              "simkv's --scheduler vllm")
        print(f"  {'result':<24}{'PASS: every step matched' if ok else 'FAIL: steps differ'}")
        print(f"  {'model':<24}{model.name}: {len(real.groups)} groups "
              f"({', '.join(g['spec'].replace('Spec', '') for g in real.groups)})")
        print(f"  {'steps matched / total':<24}{data['steps_matched']:,} / {data['steps_total']:,}")
        print(f"  {'pool':<24}{settings.num_blocks} blocks (block 0 the null block); "
              f"{data['preemptions']} preemptions, {data['prefix_hit_tokens']} prefix-hit tokens")
        for m in data["first_mismatches"][:5]:
            fields = ", ".join(f"{k} real {v['real']} sim {v['simulated']}" for k, v in list(m["fields"].items())[:3])
            print(f"  {'mismatch':<24}step {m['step']}: {fields}"[:300])
    return 0 if data["steps_mismatched"] == 0 else 1

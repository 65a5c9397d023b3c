"""``simkv validate --paged``: OpenVINO GenAI's ``ContinuousBatchingPipeline`` on CPU vs simkv's paged model, step by step.

This module holds the workload side (token ids, random cases), the comparison and the command;
:mod:`.model` builds the model directory, :mod:`.real` drives the real pipeline and reads
its allocations, :mod:`.report` shows the result (verdict, summary, HTML report).

What runs
---------
1. **Model directory** (:mod:`.model`): the toy stateful decoder plus a local word-level tokenizer,
   cached. Its logits are biased so the model never *generates* an id of the prompt range (see
   :func:`prompt_token_ids`: this keeps prefix-cache hits exactly those the workload declares).
2. **Real run** (:func:`run_real`): a ``ContinuousBatchingPipeline`` on CPU from a ``SchedulerConfig``
   (``num_kv_blocks`` or ``cache_size``, ``max_num_batched_tokens``, ``max_num_seqs``, ``dynamic_split_fuse``,
   ``enable_prefix_caching``). Loop index ``k = 0, 1, …``: every request with ``arrival_step == k`` is added
   (``add_request(id, token_ids, config)``, in file order), then ``step()`` is called once and
   ``get_metrics()`` read. The loop ends when nothing is live and nothing is pending; an idle index with a
   later arrival pending still calls ``step()``, so step numbers are arrival steps. Every request runs with
   ``ignore_eos`` so it generates exactly ``max_new_tokens`` per sequence unless IGNORED.
3. **Observed per step**: ``requests`` and ``scheduled_requests`` (``PipelineMetrics``), ``blocks_total`` =
   ``kv_cache_size_in_bytes / block_bytes``, ``blocks_used`` = ``cache_usage · blocks_total / 100`` (an
   integer to within float32 rounding, else the step is flagged), and per request its status
   (``GenerationHandle.get_status()``: RUNNING covers waiting and preempted) and tokens generated so far.
   Observable bound, measured on openvino-genai 2026.4.1: a request streams its tokens every step only with
   one sequence; with ``samples`` > 1 (multinomial ``num_return_sequences``) or beam search its outputs
   arrive when it finishes, so its count is compared at the finish only (``None`` before).
   For beam search the block count is not compared exactly: beams share blocks by lineage, which depends on
   the scores of a random model; ``blocks_used`` must lie within ``[lower, upper]`` (see :func:`beam_bounds`).
4. **Allocations** (memray, optional): the 2·L pool tensors ``key_cache.N`` / ``value_cache.N``, allocated by
   ``ov::genai::KVCacheManager::allocate_cache_if_needed`` (recognised by that frame in the native stack),
   per layer ``+K +V −K_old −V_old`` on growth; and the CPU plugin's transient buffers of the same sizes
   allocated and freed inside the step (DESIGN §4b). Compared with the simulated ledger in order and size.
5. **Block bytes and KV type** are read from the compiled model (``paged_attention_transformation`` then
   CPU compile: the ``key_cache.N`` / ``value_cache.N`` input shapes and element type), and cross-checked
   with the pipeline's ``kv_cache_size_in_bytes``.
6. **Simulation** of the same workload (same token ids) through simkv's paged continuous scheduler, and a
   step-by-step comparison (:func:`compare_steps`).
"""

from __future__ import annotations

import sys
import time
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from simkv.errors import ConfigError, SimkvError
from simkv.limits import MAX_VALIDATE_RANDOM
from simkv.serving.sched.config import SchedulerConfig

from .real import PIPELINE_PROPERTIES, KVLayout, RealCrash, RealWorker, kv_layout, run_real

__all__ = [
    "MISSING_DEPS", "check_scheduler", "check_dependencies", "prompt_token_ids", "compare_steps", "random_case",
    "beam_bounds", "simulate", "run_case", "validate", "cli_main", "STEP_FIELDS",
]

MISSING_DEPS = "paged validation needs openvino-genai: pip install 'simkv[openvino]'"
BLOCK_SIZE = 32  # GenAI's KV block on CPU (DESIGN §4b)
STEP_FIELDS = ("requests", "scheduled_requests", "blocks_used", "blocks_total")
#: Bounds on a real run (it costs CPU time on a shared machine): requests, tokens, steps.
MAX_REQUESTS = 500
MAX_TOKENS = 100_000
#: Per-step records kept in the JSON result (for the report) only up to this many request entries.
MAX_KEPT_ENTRIES = 200_000


def check_dependencies() -> None:
    """Raise ImportError with :data:`MISSING_DEPS` unless openvino-genai (and its companions) import."""
    try:
        import openvino  # noqa: F401
        import openvino_genai  # noqa: F401
        import openvino_tokenizers  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as exc:
        raise ImportError(MISSING_DEPS) from exc


#: simkv's extensions of GenAI's scheduler config at what GenAI does on CPU: the real run knows no other.
GENAI_CPU = {"block_size": BLOCK_SIZE, "on_oom": "preempt", "transient_buffers": True}


def check_scheduler(cfg: SchedulerConfig) -> None:
    """A scheduler config the real pipeline can run, or a one-line :class:`ConfigError`: GenAI's fields in
    range, ``cache_size`` whole GiB (GenAI's is an integer), simkv's extensions at :data:`GENAI_CPU`, cache
    eviction as GenAI runs it (:func:`simkv.serving.sched.eviction.check_eviction`)."""
    for name in ("num_kv_blocks", "cache_size"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name} must be >= 0")
    for name in ("max_num_batched_tokens", "max_num_seqs"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be >= 1")
    if cfg.cache_size != int(cfg.cache_size):
        raise ConfigError(f"cache_size must be a whole number of GiB for GenAI, not {cfg.cache_size}")
    for name, value in GENAI_CPU.items():
        if getattr(cfg, name) != value:
            raise ConfigError(f"{name} must be {value!r}: the real pipeline on CPU runs no other")
    if cfg.cache_eviction is not None:
        from simkv.serving.sched.eviction import check_eviction

        check_eviction(cfg.cache_eviction, BLOCK_SIZE, prefix_caching=cfg.enable_prefix_caching, plain=True)


# --------------------------------------------------------------------------- workload and token ids


def check_workload(requests: Sequence, cfg: SchedulerConfig | None = None) -> None:
    """The workload must arrive by step, stay small enough to run for real, and be one GenAI runs with the
    configuration's cache eviction."""
    if not requests:
        raise ConfigError("the workload has no requests")
    if len(requests) > MAX_REQUESTS:
        raise ConfigError(f"{len(requests):,} requests: a real run takes at most {MAX_REQUESTS:,}")
    for r in requests:
        if r.arrival_step is None:
            raise ConfigError(f"request {r.id}: paged validation needs arrival_step (the step it is added before)")
        if r.session is not None:
            raise ConfigError(f"request {r.id}: sessions are not validated on the real pipeline")
    tokens = sum(r.prompt + r.max_new_tokens * r.sequences for r in requests)
    if tokens > MAX_TOKENS:
        raise ConfigError(f"the workload holds {tokens:,} tokens: a real run takes at most {MAX_TOKENS:,}")
    if cfg is not None and cfg.cache_eviction is not None:
        from simkv.serving.sched.eviction import check_request

        for r in requests:
            check_request(r)


def prompt_token_ids(requests: Sequence, seed: int = 0) -> list[tuple[int, ...]]:
    """Token ids of every prompt, such that the only prompt content two requests share is a declared prefix.

    The model never generates an id below :data:`~.model.PROMPT_ID_END` (its logits are masked
    there), so a prompt can never continue a cached sequence into its generated tokens. Prefix ids come
    from the lower half of the prompt range, everything else from the upper half: requests with the same
    ``prefix_id`` share the first ``prefix_tokens`` ids of one sequence drawn for that id; after its prefix
    a request starts with two ids that encode its position in the workload (distinct for up to
    ``half²`` = 16,384 requests, and never a prefix id), then ids drawn from ``(seed, position)``. So a
    cached block can match a new prompt only inside a declared prefix (or a whole prompt that *is* that
    prefix). Explicit ``token_ids`` in the workload are used as given.
    """
    from .model import PROMPT_ID_END, PROMPT_ID_START

    half = (PROMPT_ID_END - PROMPT_ID_START) // 2
    lo, hi = PROMPT_ID_START, PROMPT_ID_START + half
    longest: dict[str, int] = {}
    for r in requests:
        if r.prefix_id:
            longest[r.prefix_id] = max(longest.get(r.prefix_id, 0), r.prefix_tokens)
    prefixes = {}
    for pid, n in longest.items():
        rng = np.random.default_rng([seed, zlib.crc32(pid.encode())])
        prefixes[pid] = (lo + rng.integers(0, half, n)).tolist()
    out = []
    for i, r in enumerate(requests):
        if r.token_ids is not None:
            out.append(tuple(int(t) for t in r.token_ids))
            continue
        head = prefixes[r.prefix_id][: r.prefix_tokens] if r.prefix_id else []
        rest = r.prompt - len(head)
        rng = np.random.default_rng([seed, 1, i])
        tail = [hi + (i // half) % half, hi + i % half] + (hi + rng.integers(0, half, max(rest - 2, 0))).tolist()
        out.append(tuple(head + tail[:rest]))
    return out


# --------------------------------------------------------------------------- beam bounds


def beam_bounds(prompt: int, context: int, beams: int, generated: int) -> tuple[int, int]:
    """Blocks one beam-search request with ``context`` tokens per beam can hold, whatever its lineage.

    Before its first token (``generated == 0``) it is one sequence: ``ceil(context / 32)`` blocks.
    After that, every beam shares the prompt's full blocks (``floor(prompt / 32)``); at least the beams
    form one lineage (``ceil(context / 32)`` blocks in all), at most they share nothing else:
    ``floor(P/32) + beams · (ceil(C/32) − floor(P/32))``.
    """
    n = -(-context // BLOCK_SIZE)
    if generated == 0:
        return n, n
    shared = min(prompt, context) // BLOCK_SIZE
    return n, shared + beams * (n - shared)


# --------------------------------------------------------------------------- comparison


def compare_steps(real: Sequence[dict], sim: Sequence[dict], *, exempt_blocks: Iterable[int] = (),
                  bounds: dict[int, tuple[int, int]] | None = None, limit: int = 20) -> dict:
    """Compare step records field by field; a step matches when every field does.

    Compared: :data:`STEP_FIELDS`, and per request ``status`` and ``generated`` wherever the real value is
    observable (not ``None``). Steps in ``exempt_blocks`` compare ``blocks_used`` against ``bounds[step]``
    (inclusive) instead of the simulated value (beam search). A step missing on one side mismatches.
    """
    bounds = bounds or {}
    exempt = set(exempt_blocks)

    def diff_of(k: int, a: dict, b: dict) -> dict:
        diff: dict[str, dict] = {}
        for f in STEP_FIELDS:
            if f == "blocks_used" and k in exempt:
                lo, hi = bounds[k]
                if not lo <= a[f] <= hi:
                    diff[f] = {"real": a[f], "simulated": b[f], "bounds": [lo, hi]}
            elif a[f] != b[f]:
                diff[f] = {"real": a[f], "simulated": b[f]}
        for rid in sorted(set(a["status"]) | set(b["status"]), key=lambda s: int(s)):
            for f in ("status", "generated"):
                ra, sb = a[f].get(rid), b[f].get(rid)
                if f == "generated" and ra is None:
                    continue
                if ra != sb:
                    diff[f"{f}[{rid}]"] = {"real": ra, "simulated": sb}
        return diff

    return tally_steps(real, sim, diff_of, limit)


def tally_steps(real: Sequence[dict], sim: Sequence[dict], diff_of, limit: int = 20) -> dict:
    """Step records compared pairwise (``diff_of(k, real_step, sim_step)``: the differing fields); a step missing
    on one side mismatches. The summary every step validator reports: ``steps_total``, ``steps_matched``,
    ``steps_mismatched``, ``first_mismatches`` (at most ``limit``)."""
    n = max(len(real), len(sim))
    mismatches, matched = [], 0
    for k in range(n):
        a = real[k] if k < len(real) else None
        b = sim[k] if k < len(sim) else None
        if a is None or b is None:
            diff = {"step": {"real": None if a is None else k, "simulated": None if b is None else k}}
        else:
            diff = diff_of(k, a, b)
        if diff:
            if len(mismatches) < limit:
                mismatches.append({"step": k, "fields": diff})
        else:
            matched += 1
    return {"steps_total": n, "steps_matched": matched, "steps_mismatched": n - matched,
            "first_mismatches": mismatches}


def compare_stops(comparison: dict, real: dict | None, sim: dict | None) -> None:
    """Where ``step()`` threw (``real``: :attr:`RealRun.stop`; ``sim``: the simulation's ``runtime_stop``), as one
    more step of ``comparison``: matched when both stop at the same step on the same check (the simulated check's
    expression is in the real message), else a mismatch naming both. A real stop the simulation has no stop for is
    an error of the workload (as before cache eviction: the real pipeline refused it)."""
    if real is not None and sim is None:
        raise RuntimeError(f"step() threw at step {real['step']:,}: {real['check']}")
    if real is None and sim is None:
        return
    same = real is not None and real["step"] == sim["step"] and sim["check"] in real["check"]
    comparison["stop"] = {"real": real, "simulated": sim, "matched": same}
    comparison["steps_total"] += 1
    if same:
        comparison["steps_matched"] += 1
        return
    comparison["steps_mismatched"] += 1
    step = sim["step"] if real is None else real["step"]
    comparison["first_mismatches"].append({"step": step, "fields": {"stop": {"real": real, "simulated": sim}}})


# --------------------------------------------------------------------------- random workloads


def group_blocks(prompt: int, new: int, sequences: int) -> int:
    """Blocks a request with ``sequences`` samples holds at its end: the prompt's full blocks once, the
    rest per sequence (DESIGN §4b): ``floor(P/32) + n · (ceil((P+G)/32) − floor(P/32))``."""
    shared = prompt // BLOCK_SIZE
    return shared + sequences * (-(-(prompt + new) // BLOCK_SIZE) - shared)


def random_case(rng: np.random.Generator, eviction=None) -> tuple[list, SchedulerConfig]:
    """One small random workload and scheduler config, exercising what the validator compares exactly
    (with ``eviction``, a :class:`~simkv.serving.sched.eviction.CacheEviction`: :func:`random_eviction_case`).

    Fixed pools (tight ones preempt and ignore), dynamic pools, split-fuse on and off (off: every
    sequence must fit ``max_num_batched_tokens`` whole, else GenAI stops with an assertion, and
    ``max_num_batched_tokens >= max_num_seqs``), chunked prompts, prefix caching with shared prefixes
    (some prompts are exactly their prefix), multinomial samples whose group fits a fixed pool.
    No beam search (bounds only).
    """
    from simkv.serving.requests import Request

    if eviction is not None:
        return random_eviction_case(rng, eviction)
    n = int(rng.integers(1, 7))
    caching = bool(rng.random() < 0.4)
    arrivals = np.sort(rng.integers(0, 25, n))
    reqs = []
    for i in range(n):
        prompt = int(rng.integers(1, 161))
        new = int(rng.integers(1, 61))
        samples = int(rng.integers(2, 4)) if rng.random() < 0.15 else 1
        pid, ptok = None, 0
        if caching and rng.random() < 0.7:
            pid = str(rng.choice(["a", "b"]))
            ptok = prompt if rng.random() < 0.25 else int(rng.integers(1, prompt + 1))
        reqs.append(Request(i, prompt, new, arrival_step=int(arrivals[i]), prefix_id=pid, prefix_tokens=ptok,
                            samples=samples))
    split_fuse = bool(rng.random() < 0.6)
    seqs = int(rng.integers(1, 9))
    batched = int(rng.choice([16, 32, 64, 128, 256]))
    if not split_fuse:
        batched = max(batched, seqs, max(r.prompt + r.max_new_tokens for r in reqs))
    blocks = 0 if rng.random() < 0.3 else int(rng.integers(2, 31))
    if blocks:  # a sample group larger than the whole pool makes GenAI recompute it forever (DESIGN §4b)
        reqs = [r if r.samples == 1 or group_blocks(r.prompt, r.max_new_tokens, r.samples) <= blocks
                else replace(r, samples=1) for r in reqs]
    opts = SchedulerConfig(num_kv_blocks=blocks, max_num_batched_tokens=batched, max_num_seqs=seqs,
                           dynamic_split_fuse=split_fuse, enable_prefix_caching=caching)
    return reqs, opts


def random_eviction_case(rng: np.random.Generator, eviction) -> tuple[list, SchedulerConfig]:
    """One small random workload run with GenAI's cache ``eviction``: prompts up to ``max + 4`` blocks (some evict
    many blocks at their first decode step, some land where GenAI's SnapKV check stops ``step()``), decodes up to
    ``max + 4`` blocks (crossing ``max + block`` again and again), fixed pools from very tight (preemption of
    requests that evicted, and their recompute) to roomy, dynamic pools, split-fuse on and off, chunked prompts.
    No prefix caching and one sequence per request: GenAI cannot run the others with eviction
    (:func:`simkv.serving.sched.eviction.check_eviction`)."""
    from simkv.serving.requests import Request

    n = int(rng.integers(1, 7))
    arrivals = np.sort(rng.integers(0, 25, n))
    longest = eviction.max + 4 * BLOCK_SIZE
    reqs = [Request(i, int(rng.integers(1, longest + 1)), int(rng.integers(1, longest + 1)),
                    arrival_step=int(arrivals[i])) for i in range(n)]
    split_fuse = bool(rng.random() < 0.6)
    seqs = int(rng.integers(1, 9))
    batched = int(rng.choice([16, 32, 64, 128, 256]))
    if not split_fuse:
        batched = max(batched, seqs, max(r.prompt + r.max_new_tokens for r in reqs))
    kept = eviction.max // BLOCK_SIZE + 1 + eviction.kvcrush  # blocks a request settles at, at most
    blocks = 0 if rng.random() < 0.3 else int(rng.integers(2, 2 + n * kept + 1))
    opts = SchedulerConfig(num_kv_blocks=blocks, max_num_batched_tokens=batched, max_num_seqs=seqs,
                           dynamic_split_fuse=split_fuse, cache_eviction=eviction)
    return reqs, opts


# --------------------------------------------------------------------------- the simulated side


def simulate(requests: Sequence, token_ids: Sequence[Sequence[int]], opts: SchedulerConfig, layout: KVLayout,
             spec) -> tuple[list[dict], list[dict], dict]:
    """The same workload (same token ids) through simkv's paged continuous scheduler
    (:func:`simkv.serving.simulate_paged` with the real bytes per block): step records shaped like
    :func:`run_real`'s, with per request ``processed`` added, the pool's ledger events, and what the
    run went through (preemptions, IGNORED requests, prefix-cache hits, pool growths)."""
    from simkv.models import custom_model
    from simkv.precision import get_precision
    from simkv.serving import simulate_paged

    from ..compare import predicted_events

    reqs = [replace(r, token_ids=tuple(ids)) for r, ids in zip(requests, token_ids)]
    try:
        precision = get_precision(layout.kv_precision)
    except ConfigError:
        precision = get_precision("u8")  # only names the type: block_bytes below carries the real size
    res = simulate_paged(reqs, opts, model=custom_model(layers=spec.layers, heads=spec.heads, kv_heads=spec.kv_heads,
                                                        head_dim=spec.head_dim),
                         precision=precision, block_bytes=layout.block_bytes,
                         tensor_block_bytes=layout.tensor_block_bytes[:2], device_memory=1 << 50)
    by_step: dict[int, list] = {}
    for row in res.progress:
        by_step.setdefault(int(row["step"]), []).append(row)
    steps = []
    for row in res.steps:
        k = int(row["step"])
        live = by_step.get(k, ())
        steps.append({"step": k, "requests": int(row["requests"]), "scheduled_requests": int(row["scheduled_requests"]),
                      "blocks_used": int(row["blocks_used"]), "blocks_total": int(row["blocks_total"]),
                      "generated": {str(int(p["request"])): int(p["generated"]) for p in live},
                      "status": {str(int(p["request"])): str(p["status"]) for p in live},
                      "processed": {str(int(p["request"])): int(p["processed"]) for p in live}})
    events = [e for e in predicted_events(res) if e["tensor"] in ("k", "v")]
    table, st = res.request_table, res.steps
    facts = {"preemptions": int(np.sum(table["preemptions"])), "ignored": int(np.sum(table["status"] == "IGNORED")),
             "prefix_hit_tokens": int(np.sum(table["prefix_hit_tokens"])),
             "pool_growths": int(np.sum(st["blocks_total"][1:] != st["blocks_total"][:-1])) if len(st) > 1 else 0,
             "max_blocks_used": int(st["blocks_used"].max()) if len(st) else 0,
             "max_blocks_total": int(st["blocks_total"].max()) if len(st) else 0}
    if opts.cache_eviction is not None:
        facts["evicted_blocks"] = res.evicted_blocks
        facts["runtime_stop"] = ({"step": res.runtime_stop["step"], "check": res.runtime_stop["check"]}
                                 if res.runtime_stop else None)
    return steps, events, facts


# --------------------------------------------------------------------------- one workload, many workloads


@dataclass
class CaseResult:
    """One workload's comparison (the ``workloads`` entries of the JSON result)."""

    index: int
    scheduler: dict
    requests: list[dict]
    comparison: dict
    allocations: dict
    exercised: dict
    real_s: float
    sim_s: float
    steps: list[dict] | None = None  # per step, real and simulated (single-workload runs, for the report)
    error: str | None = None  # the real pipeline failed on this workload (--random)
    #: Left out, and why: the pipeline crashes on this workload without cache eviction too (--random with eviction).
    excluded: str | None = None


def _scheduler_dict(opts: SchedulerConfig) -> dict:
    """The GenAI fields, and the cache eviction (its flag form) when on."""
    d = opts.genai()
    if opts.cache_eviction is not None:
        d["cache_eviction"] = opts.cache_eviction.label()
    return d


def _request_dict(r) -> dict:
    d = {"id": r.id, "arrival_step": r.arrival_step, "prompt": r.prompt, "max_new_tokens": r.max_new_tokens}
    if r.prefix_id:
        d.update(prefix_id=r.prefix_id, prefix_tokens=r.prefix_tokens)
    if r.samples > 1:
        d["samples"] = r.samples
    if r.beam > 1:
        d["beam"] = r.beam
    return d


def _beam_exemptions(requests, sim_steps: list[dict]) -> tuple[set[int], dict[int, tuple[int, int]]]:
    """Steps where a beam-search request holds blocks, and the bounds of the real ``blocks_used`` there.

    simkv models a beam request as ``beam`` sequences sharing only the prompt's full blocks (the most a
    beam search can hold: :func:`beam_bounds`' upper bound). GenAI shares more along each beam's lineage,
    which depends on the scores, so the real count lies between the simulated one less, per live beam
    request, ``(beam − 1) · (ceil(C/32) − floor(P/32))`` (every beam one lineage: all blocks past the
    prompt shared) and the simulated one. ``C`` is the request's processed context in the simulation.
    """
    beams = {str(r.id): r for r in requests if r.beam > 1}
    exempt, bounds = set(), {}
    if not beams:
        return exempt, bounds
    for s in sim_steps:
        live = [rid for rid in beams if rid in s["status"]]  # in the pipeline at this step
        if not live:
            continue
        slack = 0
        for rid in live:
            r = beams[rid]
            lo, hi = beam_bounds(r.prompt, max(s["processed"][rid], 1), r.beam, s["generated"][rid])
            slack += hi - lo
        exempt.add(s["step"])
        bounds[s["step"]] = (s["blocks_used"] - slack, s["blocks_used"])
    return exempt, bounds


def run_case(index: int, requests: Sequence, opts: SchedulerConfig, model_path: str | Path, spec, *, seed: int = 0,
             trace: bool = True, keep_steps: bool = False, progress: bool = False, worker=None) -> CaseResult:
    """Real run (in ``worker``'s child process when given), simulation and comparison of one workload."""
    from ..compare import align_events

    ids = prompt_token_ids(requests, seed)
    if worker is not None:
        real = worker.run(requests, ids, opts, model_path, trace=trace, seed=seed)
    else:
        real = run_real(requests, ids, opts, model_path, trace=trace, seed=seed, progress=progress)
    t0 = time.perf_counter()
    sim_steps, sim_events, facts = simulate(requests, ids, opts, real.layout, spec)
    sim_s = time.perf_counter() - t0
    exempt, bounds = _beam_exemptions(requests, sim_steps)
    comparison = compare_steps(real.steps, sim_steps, exempt_blocks=exempt, bounds=bounds)
    compare_stops(comparison, real.stop, facts.get("runtime_stop"))
    comparison["warnings"] = real.warnings
    comparison["bounded_steps"] = len(exempt)
    allocations: dict = {"compared": False, "real_events": len(real.pool_events),
                         "plugin_transients": len(real.transient_events),
                         "plugin_transient_bytes": sum(t["bytes"] for t in real.transient_events)}
    if trace and sim_events is not None:
        aligned = align_events(real.pool_events, sim_events)
        counts = {s: sum(1 for e in aligned if e["status"] == s) for s in ("matched", "missing", "unexpected")}
        allocations.update(compared=True, events_total=len(aligned), events_matched=counts["matched"],
                           events_missing=counts["missing"], events_unexpected=counts["unexpected"],
                           first_differences=[e for e in aligned if e["status"] != "matched"][:20])
    steps = None
    if keep_steps and sum(len(x["status"]) for x in real.steps) <= MAX_KEPT_ENTRIES:
        steps = [{"step": k, "real": real.steps[k] if k < len(real.steps) else None,
                  "simulated": sim_steps[k] if k < len(sim_steps) else None}
                 for k in range(max(len(real.steps), len(sim_steps)))]
    return CaseResult(index=index, scheduler=_scheduler_dict(opts), requests=[_request_dict(r) for r in requests],
                      comparison=comparison, allocations=allocations, exercised=facts, real_s=real.elapsed_s,
                      sim_s=sim_s, steps=steps)


def _one_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and not ln.startswith("Exception from ")]
    return lines[-1] if lines else repr(err)


def case_ok(c: CaseResult) -> bool:
    a = c.allocations
    return c.error is None and c.excluded is None and c.comparison["steps_mismatched"] == 0 and (not a["compared"] or
                                                      a["events_missing"] == 0 and a["events_unexpected"] == 0)


def paged_versions() -> dict:
    from importlib.metadata import version

    from ..openvino.runner import versions

    v = versions(None)
    v.pop("MALLOC_MMAP_THRESHOLD_", None)
    for pkg in ("openvino-genai", "openvino-tokenizers", "tokenizers"):
        try:
            v[pkg] = version(pkg)
        except Exception:  # pragma: no cover
            v[pkg] = None
    return v


def _validate_one(results: list, i: int, requests, opts, path, spec, seed: int, trace: bool, keep: bool, worker,
                  *, single: bool) -> None:
    check_workload(requests, opts)
    try:
        results.append(run_case(i, requests, opts, path, spec, seed=seed, trace=trace, keep_steps=keep,
                                worker=worker))
    except (RuntimeError, SimkvError) as err:  # real pipeline or simulator failed: the workload fails
        if single:
            raise
        excluded = None
        if isinstance(err, RealCrash) and opts.cache_eviction is not None and worker is not None:
            excluded = _crashes_without_eviction(requests, opts, path, seed, worker)
        results.append(CaseResult(i, _scheduler_dict(opts), [_request_dict(r) for r in requests],
                                  {"steps_total": 0, "steps_matched": 0, "steps_mismatched": 0,
                                   "first_mismatches": [], "bounded_steps": 0, "warnings": []},
                                  {"compared": False, "real_events": 0, "plugin_transients": 0}, {}, 0.0, 0.0,
                                  error=None if excluded else ("simulation: " if isinstance(err, SimkvError)
                                                               else "real pipeline: ") + _one_line(err),
                                  excluded=excluded))


def _crashes_without_eviction(requests, opts, path, seed: int, worker) -> str | None:
    """A workload whose real run crashed with cache eviction: the reason it is left out if the pipeline crashes on
    it without eviction too (a crash of GenAI's own, docs/DESIGN.md §4b: not one eviction brings), else None."""
    try:
        worker.run(requests, prompt_token_ids(requests, seed), replace(opts, cache_eviction=None), path, trace=False,
                   seed=seed)
    except RealCrash as crash:
        return f"{_one_line(crash)} without cache eviction too (GenAI's own crash, docs/DESIGN.md §4b)"
    except RuntimeError:
        return None
    return None


def validate(cases: Sequence[tuple[Sequence, SchedulerConfig]], *, spec=None, model_root: str | Path | None = None,
             seed: int = 0, trace: bool = True, progress: bool = False, keep_steps: bool | None = None) -> dict:
    """Every workload real vs simulated; the ``simkv validate --paged --json`` dict."""
    for _, opts in cases:  # before anything runs (the command has checked its own, in flag order)
        check_scheduler(opts)
    check_dependencies()
    from .model import GenaiModelSpec, model_dir

    t0 = time.perf_counter()
    spec = spec or GenaiModelSpec()
    path = model_dir(spec, model_root)
    keep = len(cases) == 1 if keep_steps is None else keep_steps
    results: list[CaseResult] = []
    it: Iterable = enumerate(cases)
    if progress and len(cases) > 1:
        from tqdm import tqdm

        it = tqdm(it, total=len(cases), desc="workloads", unit="workload", file=sys.stderr)
    worker = RealWorker()  # a crash of the native pipeline fails one workload, not the whole run
    try:
        for i, (requests, opts) in it:
            _validate_one(results, i, requests, opts, path, spec, seed, trace, keep, worker, single=len(cases) == 1)
    finally:
        worker.close()
    layout = kv_layout(path, PIPELINE_PROPERTIES)
    first = [{"workload": c.index, **m} for c in results for m in c.comparison["first_mismatches"]][:20]
    alloc = [c.allocations for c in results if c.allocations["compared"]]
    data = {
        "steps_total": sum(c.comparison["steps_total"] for c in results),
        "steps_matched": sum(c.comparison["steps_matched"] for c in results),
        "steps_mismatched": sum(c.comparison["steps_mismatched"] for c in results),
        "first_mismatches": first,
        "workloads_total": len(results),
        "workloads_matched": sum(case_ok(c) for c in results),
        "workloads_excluded": [{"workload": c.index, "why": c.excluded} for c in results if c.excluded],
        "workload_errors": [{"workload": c.index, "error": c.error} for c in results if c.error],
        "allocations": {
            "compared": bool(alloc),
            "events_total": sum(a["events_total"] for a in alloc),
            "events_matched": sum(a["events_matched"] for a in alloc),
            "events_missing": sum(a["events_missing"] for a in alloc),
            "events_unexpected": sum(a["events_unexpected"] for a in alloc),
            "real_events": sum(c.allocations["real_events"] for c in results),
            "plugin_transients": sum(c.allocations["plugin_transients"] for c in results),
        },
        "bounded_steps": sum(c.comparison["bounded_steps"] for c in results),
        "stops": {"total": sum(1 for c in results if "stop" in c.comparison),
                  "matched": sum(1 for c in results if c.comparison.get("stop", {}).get("matched"))},
        "evicted_blocks": sum(c.exercised.get("evicted_blocks", 0) for c in results),
        "block_bytes": layout.block_bytes,
        "kv_precision": layout.kv_precision,
        "kv_layout": {"layers": layout.layers, "block_size": BLOCK_SIZE, "key_block_shape": list(layout.key_shape),
                      "value_block_shape": list(layout.value_shape)},
        "model": {k: v for k, v in asdict(spec).items() if k != "with_tokenizer" and not (k == "hidden" and v is None)}
                 | {"dir": str(path)},
        "seed": seed,
        "workloads": [asdict(c) for c in results],
        "versions": paged_versions(),
    }
    data["elapsed_s"] = time.perf_counter() - t0
    return data


#: Random workloads of ``--random N`` (each a fresh real pipeline run: simkv.limits, the validation bounds).
MAX_RANDOM = MAX_VALIDATE_RANDOM


def cases_from_args(args) -> list[tuple[list, SchedulerConfig]]:
    """The workloads ``--trace`` or ``--random`` asks for (errors are one-line ConfigErrors)."""
    if (args.trace is None) == (args.random is None):
        raise ConfigError("--paged needs exactly one of --trace W.csv and --random N")
    if args.ir or args.ops or args.model != "custom":
        raise ConfigError("--paged runs its own toy model and workload: drop --ir/--ops/--model "
                          "(shape the model with --layers/--heads/--kv-heads/--head-dim)")
    from simkv.serving.sched.eviction import parse_cache_eviction

    eviction = parse_cache_eviction(args.cache_eviction)
    if args.random is not None:
        if not 1 <= args.random <= MAX_RANDOM:
            raise ConfigError(f"--random must be in 1..{MAX_RANDOM:,}")
        if eviction is not None:
            check_scheduler(SchedulerConfig(cache_eviction=eviction))
        rng = np.random.default_rng(args.seed)
        return [random_case(rng, eviction) for _ in range(args.random)]
    from simkv.serving.requests import load_trace

    opts = SchedulerConfig(num_kv_blocks=args.num_kv_blocks, cache_size=args.cache_size,
                           max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                           dynamic_split_fuse=not args.no_dynamic_split_fuse, enable_prefix_caching=args.prefix_caching,
                           cache_eviction=eviction)
    check_scheduler(opts)
    requests = load_trace(args.trace)
    check_workload(requests, opts)
    return [(requests, opts)]


def spec_from_args(args):
    from .model import GenaiModelSpec

    def given(value, default):
        return default if value is None else value

    heads = given(args.heads, 4)
    kv = given(args.kv_heads, 2 if args.heads is None else heads)
    try:  # weights: seed 0 (they do not change the schedule)
        return GenaiModelSpec(layers=given(args.layers, 2), heads=heads, kv_heads=kv,
                              head_dim=given(args.head_dim, 32), vocab=args.vocab)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def cli_main(args) -> int:
    """``simkv validate --paged``: exit 0 only if every step (and every pool allocation) matched."""
    cases = cases_from_args(args)
    spec = spec_from_args(args)
    try:
        check_dependencies()
    except ImportError:
        print(f"simkv validate: error: {MISSING_DEPS}", file=sys.stderr)
        return 2
    try:
        data = validate(cases, spec=spec, seed=args.seed, trace=not args.no_memray, progress=sys.stderr.isatty())
    except RuntimeError as err:  # the real pipeline refused the workload or configuration
        print(f"simkv validate: error: the real pipeline failed: {_one_line(err)}", file=sys.stderr)
        return 2
    from ..report import emit
    from .report import ok, summary_lines, write_report

    return emit(args, data, summary_lines=summary_lines, report=write_report, ok=ok)

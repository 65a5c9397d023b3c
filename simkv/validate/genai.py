"""``simkv validate --paged``: OpenVINO GenAI's ``ContinuousBatchingPipeline`` on CPU vs simkv's paged model, step by step.

What runs
---------
1. **Model directory** (:mod:`.genai_model`): the toy stateful decoder plus a local word-level tokenizer,
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
   per layer ``+K +V −K_old −V_old`` on growth; and the CPU plugin's transient copies of the same size
   allocated and freed inside the step (reported, see DESIGN §4b).
5. **Block bytes and KV type** are read from the compiled model (``paged_attention_transformation`` then
   CPU compile: the ``key_cache.N`` / ``value_cache.N`` input shapes and element type), and cross-checked
   with the pipeline's ``kv_cache_size_in_bytes``.
6. **Simulation** of the same workload (same token ids) through simkv's paged continuous scheduler, and a
   step-by-step comparison (:func:`compare_steps`).
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from simkv.errors import ConfigError, SimkvError

__all__ = [
    "MISSING_DEPS", "SchedulerOptions", "RealRun", "check_dependencies", "prompt_token_ids",
    "run_real", "compare_steps", "random_case", "beam_bounds", "kv_layout", "STEP_FIELDS",
]

MISSING_DEPS = "paged validation needs openvino-genai: pip install 'simkv[openvino]'"
BLOCK_SIZE = 32  # GenAI's KV block on CPU (DESIGN §4b)
STEP_FIELDS = ("requests", "scheduled_requests", "blocks_used", "blocks_total")
#: Bounds on a real run (it costs CPU time on a shared machine): requests, tokens, steps.
MAX_REQUESTS = 2000
MAX_TOKENS = 400_000
MAX_STEPS = 200_000


def check_dependencies() -> None:
    """Raise ImportError with :data:`MISSING_DEPS` unless openvino-genai (and its companions) import."""
    try:
        import openvino  # noqa: F401
        import openvino_genai  # noqa: F401
        import openvino_tokenizers  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as exc:
        raise ImportError(MISSING_DEPS) from exc


@dataclass(frozen=True)
class SchedulerOptions:
    """GenAI ``SchedulerConfig`` values (``cache_size`` is whole GiB, as GenAI takes it)."""

    num_kv_blocks: int = 0
    cache_size: int = 0
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 256
    dynamic_split_fuse: bool = True
    enable_prefix_caching: bool = False

    def __post_init__(self) -> None:
        for name in ("num_kv_blocks", "cache_size"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")

    @property
    def dynamic(self) -> bool:
        return self.num_kv_blocks == 0 and self.cache_size == 0

    def describe(self) -> str:
        pool = (f"{self.num_kv_blocks} blocks" if self.num_kv_blocks else
                f"cache_size {self.cache_size} GiB" if self.cache_size else "dynamic pool")
        return (f"{pool}, max_num_batched_tokens {self.max_num_batched_tokens}, max_num_seqs {self.max_num_seqs}, "
                f"split-fuse {'on' if self.dynamic_split_fuse else 'off'}, "
                f"prefix caching {'on' if self.enable_prefix_caching else 'off'}")


# --------------------------------------------------------------------------- workload and token ids


def check_workload(requests: Sequence) -> None:
    """The workload must arrive by step and stay small enough to run for real."""
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


def prompt_token_ids(requests: Sequence, seed: int = 0) -> list[tuple[int, ...]]:
    """Token ids of every prompt, such that the only prompt content two requests share is a declared prefix.

    The model never generates an id below :data:`~.genai_model.PROMPT_ID_END` (its logits are masked
    there), so a prompt can never continue a cached sequence into its generated tokens. Prefix ids come
    from the lower half of the prompt range, everything else from the upper half: requests with the same
    ``prefix_id`` share the first ``prefix_tokens`` ids of one sequence drawn for that id; after its prefix
    a request starts with two ids that encode its position in the workload (distinct for up to
    ``half²`` = 16,384 requests, and never a prefix id), then ids drawn from ``(seed, position)``. So a
    cached block can match a new prompt only inside a declared prefix (or a whole prompt that *is* that
    prefix). Explicit ``token_ids`` in the workload are used as given.
    """
    from .genai_model import PROMPT_ID_END, PROMPT_ID_START

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


# --------------------------------------------------------------------------- the real KV layout


@dataclass(frozen=True)
class KVLayout:
    """What the compiled paged model stores per block (read from its ``key_cache.N``/``value_cache.N`` inputs)."""

    kv_precision: str
    layers: int
    block_bytes: int  # all layers, K + V
    tensor_block_bytes: tuple[int, ...]  # per tensor, in input order (key_cache.0, value_cache.0, ...)
    key_shape: tuple[int, ...]  # per block: [H_kv, rows, cols]
    value_shape: tuple[int, ...]


_LAYOUTS: dict[str, KVLayout] = {}


def kv_layout(model_path: str | Path, properties: dict | None = None) -> KVLayout:
    """Compile the paged form of the model on CPU as GenAI does and read the cache inputs."""
    key = f"{model_path}|{sorted((properties or {}).items())}"
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    import openvino as ov
    from openvino._offline_transformations import paged_attention_transformation

    core = ov.Core()
    model = core.read_model(str(Path(model_path) / "openvino_model.xml"))
    paged_attention_transformation(model, False, False)
    compiled = core.compile_model(model, "CPU", dict(properties or {}))
    tensors = []
    for port in compiled.inputs:
        name = port.get_any_name()
        if name.startswith(("key_cache.", "value_cache.")):
            shape = tuple(int(d.get_length()) for d in list(port.get_partial_shape())[1:])
            et = port.get_element_type()
            tensors.append((name, shape, et.get_type_name(), int(np.prod(shape)) * et.size))
    if not tensors:
        raise RuntimeError("the compiled model has no key_cache/value_cache inputs")
    types = {t[2] for t in tensors}
    if len(types) != 1:
        raise RuntimeError(f"cache inputs disagree on the element type: {sorted(types)}")
    layout = KVLayout(
        kv_precision=types.pop(), layers=len(tensors) // 2, block_bytes=sum(t[3] for t in tensors),
        tensor_block_bytes=tuple(t[3] for t in tensors),
        key_shape=next(t[1] for t in tensors if t[0].startswith("key")),
        value_shape=next(t[1] for t in tensors if t[0].startswith("value")),
    )
    _LAYOUTS[key] = layout
    return layout


# --------------------------------------------------------------------------- beam bounds


def beam_bounds(prompt: int, processed: int, beams: int, generated: int) -> tuple[int, int]:
    """Blocks one beam-search request can hold, whatever its lineage.

    Before its first token (``generated == 0``) it is one sequence: ``ceil(processed / 32)`` blocks.
    After that every beam has ``L = prompt + generated`` tokens and shares the prompt's full blocks
    (``floor(prompt / 32)``); the rest lies between all beams sharing every block they can (one lineage:
    ``ceil(L / 32)`` in all, plus one partly filled last block per other beam once they diverge —
    bounded below by ``ceil(L / 32)``) and no sharing beyond the prompt:
    ``floor(P/32) + beams · (ceil(L/32) − floor(P/32))``.
    """
    if generated == 0:
        n = -(-processed // BLOCK_SIZE)
        return n, n
    total = prompt + generated
    shared = prompt // BLOCK_SIZE
    upper = shared + beams * (-(-total // BLOCK_SIZE) - shared)
    return -(-total // BLOCK_SIZE), upper


# --------------------------------------------------------------------------- the real run


@dataclass
class RealRun:
    steps: list[dict]
    layout: KVLayout
    pool_events: list[dict] = field(default_factory=list)
    transient_events: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


def _generation_config(r, seed: int):
    import openvino_genai as og

    from .genai_model import EOS_TOKEN_ID

    g = og.GenerationConfig()
    g.max_new_tokens = r.max_new_tokens
    g.ignore_eos = True
    g.set_eos_token_id(EOS_TOKEN_ID)
    if r.samples > 1:
        g.do_sample = True
        g.num_return_sequences = r.samples
        g.rng_seed = seed + r.id
    elif r.beam > 1:
        g.num_beams = r.beam
        g.num_return_sequences = r.beam
    return g


def _scheduler_config(opts: SchedulerOptions):
    import openvino_genai as og

    sc = og.SchedulerConfig()
    sc.num_kv_blocks = opts.num_kv_blocks
    sc.cache_size = opts.cache_size
    sc.max_num_batched_tokens = opts.max_num_batched_tokens
    sc.max_num_seqs = opts.max_num_seqs
    sc.dynamic_split_fuse = opts.dynamic_split_fuse
    sc.enable_prefix_caching = opts.enable_prefix_caching
    return sc


#: One CPU thread: the schedule does not depend on it, and the machine is shared.
PIPELINE_PROPERTIES = {"INFERENCE_NUM_THREADS": 1}


def run_real(requests: Sequence, token_ids: Sequence[Sequence[int]], opts: SchedulerOptions, model_path: str | Path,
             *, trace: bool = False, seed: int = 0, progress: bool = False) -> RealRun:
    """Drive the real pipeline step by step (module docstring, points 2-4)."""
    import openvino as ov
    import openvino_genai as og

    t0 = time.perf_counter()
    layout = kv_layout(model_path, PIPELINE_PROPERTIES)
    pipe = og.ContinuousBatchingPipeline(str(model_path), _scheduler_config(opts), "CPU", dict(PIPELINE_PROPERTIES))
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_step, i))
    max_steps = min(MAX_STEPS, max(r.arrival_step for r in requests)
                    + 4 * sum(r.prompt + r.max_new_tokens * r.sequences for r in requests) + 64)
    handles: dict[int, object] = {}
    counts: dict[int, dict[int, int]] = {}
    streamed = {r.id: r.sequences == 1 for r in requests}
    steps: list[dict] = []
    warnings: list[str] = []
    recorder = None
    if trace:
        from .memtrace import Recorder

        recorder = Recorder()
        recorder.__enter__()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(desc="real steps", unit="step", leave=False, file=sys.stderr)
    nxt, k = 0, 0
    try:
        while nxt < len(order) or pipe.has_non_finished_requests():
            if k >= max_steps:
                raise RuntimeError(f"the real pipeline did not finish within {max_steps:,} steps")
            while nxt < len(order) and requests[order[nxt]].arrival_step <= k:
                r = requests[order[nxt]]
                ids = ov.Tensor(np.asarray(token_ids[order[nxt]], dtype=np.int64).reshape(1, -1))
                handles[r.id] = pipe.add_request(r.id, ids, _generation_config(r, seed))
                counts[r.id] = {}
                nxt += 1
            if recorder is not None:
                with recorder.operation(k):
                    pipe.step()
            else:
                pipe.step()
            m = pipe.get_metrics()
            total_bytes = int(m.kv_cache_size_in_bytes)
            if total_bytes % layout.block_bytes:
                raise RuntimeError(f"pool of {total_bytes:,} B is not a whole number of {layout.block_bytes:,}-B blocks")
            total = total_bytes // layout.block_bytes
            used_f = float(m.cache_usage) * total / 100.0
            used = int(round(used_f))
            if abs(used_f - used) > 0.05:
                warnings.append(f"step {k}: cache_usage {m.cache_usage} of {total} blocks is not a whole block count")
            gen, status = {}, {}
            for rid, h in handles.items():
                st = h.get_status().name
                while h.can_read():
                    for seq, out in h.read().items():
                        counts[rid][seq] = counts[rid].get(seq, 0) + len(out.generated_ids)
                done = st in ("FINISHED", "IGNORED")
                gen[str(rid)] = max(counts[rid].values(), default=0) if streamed[rid] or done else None
                status[str(rid)] = st
            steps.append({"step": k, "requests": int(m.requests), "scheduled_requests": int(m.scheduled_requests),
                          "blocks_used": used, "blocks_total": total, "generated": gen, "status": status})
            k += 1
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if recorder is not None:
            recorder.__exit__(None, None, None)
    del pipe
    run = RealRun(steps=steps, layout=layout, warnings=warnings)
    if recorder is not None:
        try:
            run.pool_events, run.transient_events = read_pool_events(recorder.path, len(steps), layout)
        finally:
            recorder.cleanup()
    if opts.num_kv_blocks and steps and steps[-1]["blocks_total"] != opts.num_kv_blocks:
        raise RuntimeError(f"the pipeline reports {steps[-1]['blocks_total']} blocks for num_kv_blocks "
                           f"{opts.num_kv_blocks}: block bytes misread")
    run.elapsed_s = time.perf_counter() - t0
    return run


# --------------------------------------------------------------------------- memray: the pool tensors


POOL_FRAME = "KVCacheManager::allocate_cache_if_needed"


def read_pool_events(path: str | Path, n_steps: int, layout: KVLayout) -> tuple[list[dict], list[dict]]:
    """Pool tensor allocations/frees (layer, k/v, bytes, blocks) and the plugin's same-size transients.

    A pool allocation is one whose native stack holds :data:`POOL_FRAME` (GenAI is not stripped); inside a
    step they come per layer as K then V (input order ``key_cache.i, value_cache.i``). Its free is matched
    by address. A *transient* is any other allocation inside a step of exactly the size of a pool tensor
    allocated in that step, freed in the same step.
    """
    import memray

    from .memtrace import MARKER_BASE

    names = {int(a): a.name for a in memray.AllocatorType}
    site_is_pool: dict[int, bool] = {}
    live: dict[int, dict] = {}
    other: dict[int, dict] = {}
    events: list[dict] = []
    transients: list[dict] = []
    step, seen, per_step = None, 0, 0
    min_bytes = min(layout.tensor_block_bytes)
    reader = memray.FileReader(str(path))
    try:
        for rec in reader.get_allocation_records():
            kind = names[int(rec.allocator)]
            if kind == "MALLOC" and MARKER_BASE <= rec.size < MARKER_BASE + 2 * n_steps:
                seq, end = divmod(rec.size - MARKER_BASE, 2)
                step = None if end else seq
                seen += 0 if end else 1
                per_step = 0
                continue
            if kind in ("FREE", "MUNMAP"):
                ev = live.pop(rec.address, None)
                if ev is not None and step is not None:
                    events.append({**ev, "step": step, "op": "free"})
                t = other.pop(rec.address, None)
                if t is not None and step == t["step"] and t["bytes"] in {e["bytes"] for e in events
                                                                          if e["step"] == step and e["op"] == "alloc"}:
                    transients.append(t)
                continue
            if step is None or rec.size < min_bytes:
                continue
            sid = rec.native_stack_id
            if sid not in site_is_pool:
                try:
                    frames = rec.native_stack_trace(max_stacks=16)
                except Exception:  # pragma: no cover - unresolvable stack
                    frames = []
                site_is_pool[sid] = any(POOL_FRAME in str(f[0]) for f in frames)
            if site_is_pool[sid]:
                i = per_step
                per_step += 1
                ev = {"layer": i // 2, "tensor": "k" if i % 2 == 0 else "v", "bytes": int(rec.size),
                      "blocks": int(rec.size) // layout.tensor_block_bytes[i % len(layout.tensor_block_bytes)]}
                live[rec.address] = ev
                events.append({**ev, "step": step, "op": "alloc"})
            else:
                other[rec.address] = {"step": step, "bytes": int(rec.size), "allocator": kind}
    finally:
        reader.close()
    if seen != n_steps:
        raise RuntimeError(f"memray trace holds {seen} steps, expected {n_steps}")
    return events, transients


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
    n = max(len(real), len(sim))
    mismatches, matched = [], 0
    for k in range(n):
        a = real[k] if k < len(real) else None
        b = sim[k] if k < len(sim) else None
        diff: dict[str, dict] = {}
        if a is None or b is None:
            diff["step"] = {"real": None if a is None else k, "simulated": None if b is None else k}
        else:
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
        if diff:
            if len(mismatches) < limit:
                mismatches.append({"step": k, "fields": diff})
        else:
            matched += 1
    return {"steps_total": n, "steps_matched": matched, "steps_mismatched": n - matched,
            "first_mismatches": mismatches}


# --------------------------------------------------------------------------- random workloads


def random_case(rng: np.random.Generator) -> tuple[list, SchedulerOptions]:
    """One small random workload and scheduler config, exercising what the validator compares exactly.

    Fixed pools (tight ones preempt and ignore), dynamic pools, split-fuse on and off (off: every
    sequence must fit ``max_num_batched_tokens`` whole, else GenAI stops with an assertion, and
    ``max_num_batched_tokens >= max_num_seqs``), chunked prompts, prefix caching with shared prefixes
    (some prompts are exactly their prefix), multinomial samples. No beam search (bounds only).
    """
    from simkv.serving.requests import Request

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
    opts = SchedulerOptions(num_kv_blocks=blocks, max_num_batched_tokens=batched, max_num_seqs=seqs,
                            dynamic_split_fuse=split_fuse, enable_prefix_caching=caching)
    return reqs, opts

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
MAX_REQUESTS = 500
MAX_TOKENS = 100_000
MAX_STEPS = 50_000
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
            for rid, h in list(handles.items()):  # live requests; one that ends here shows now, then leaves
                st = h.get_status().name
                while h.can_read():
                    for seq, out in h.read().items():
                        counts[rid][seq] = counts[rid].get(seq, 0) + len(out.generated_ids)
                done = st in ("FINISHED", "IGNORED")
                gen[str(rid)] = max(counts[rid].values(), default=0) if streamed[rid] or done else None
                status[str(rid)] = st
                if done:
                    del handles[rid], counts[rid]
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
    """The pool's allocations and frees, in the order they happened: ``(events, transients)``.

    A pool tensor is an allocation whose native stack holds :data:`POOL_FRAME` (GenAI is not stripped);
    inside a step they come per layer as K then V (input order ``key_cache.i, value_cache.i``), and a free
    is matched by address. A *transient* is any other allocation inside a step of exactly the size of a
    pool tensor allocated in that step and freed in the same step (the CPU plugin's, DESIGN §4b); they are
    numbered in the same K, V per layer order and kept in ``events`` too (``transient: True``), where
    they sit in the stream. ``transients`` lists them alone.
    """
    import memray

    from .memtrace import MARKER_BASE

    names = {int(a): a.name for a in memray.AllocatorType}
    site_is_pool: dict[int, bool] = {}
    live: dict[int, dict] = {}
    cand: dict[int, dict] = {}
    events: list[dict] = []
    step, seen, n_pool, n_trans, sizes = None, 0, 0, {"k": 0, "v": 0}, {"k": set(), "v": set()}
    min_bytes = min(layout.tensor_block_bytes)
    ntens = len(layout.tensor_block_bytes)
    reader = memray.FileReader(str(path))
    try:
        for rec in reader.get_allocation_records():
            kind = names[int(rec.allocator)]
            if kind == "MALLOC" and MARKER_BASE <= rec.size < MARKER_BASE + 2 * n_steps:
                seq, end = divmod(rec.size - MARKER_BASE, 2)
                for ev in cand.values():  # allocated in the step, not freed in it: not a transient
                    ev["drop"] = True
                cand.clear()
                step = None if end else seq
                seen += 0 if end else 1
                n_pool, n_trans, sizes = 0, {"k": 0, "v": 0}, {"k": set(), "v": set()}
                continue
            if kind in ("FREE", "MUNMAP"):
                ev = live.pop(rec.address, None) or cand.pop(rec.address, None)
                if ev is not None and step is not None:
                    events.append({**ev, "step": step, "op": "free"})
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
                i, n_pool = n_pool, n_pool + 1
                ev = {"layer": i // 2, "tensor": "k" if i % 2 == 0 else "v", "bytes": int(rec.size),
                      "blocks": int(rec.size) // layout.tensor_block_bytes[i % ntens], "transient": False}
                live[rec.address] = ev
                sizes[ev["tensor"]].add(int(rec.size))
                events.append({**ev, "step": step, "op": "alloc"})
            elif int(rec.size) in sizes["k"] | sizes["v"]:
                size = int(rec.size)
                # Named by size (the plugin takes V before K when they differ); equal sizes alternate K, V.
                t = ("k" if size not in sizes["v"] else "v" if size not in sizes["k"]
                     else "k" if (n_trans["k"] + n_trans["v"]) % 2 == 0 else "v")
                i = n_trans[t]
                n_trans[t] += 1
                ev = {"layer": i, "tensor": t, "bytes": size,
                      "blocks": size // layout.tensor_block_bytes[0 if t == "k" else 1], "transient": True}
                cand[rec.address] = ev
                events.append(ev | {"step": step, "op": "alloc", "_ref": ev})
    finally:
        reader.close()
    if seen != n_steps:
        raise RuntimeError(f"memray trace holds {seen} steps, expected {n_steps}")
    out = [{k: v for k, v in e.items() if k != "_ref"} for e in events
           if not e.get("drop") and not (e.get("_ref") or {}).get("drop")]
    return out, [e for e in out if e["transient"] and e["op"] == "alloc"]


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


def group_blocks(prompt: int, new: int, sequences: int) -> int:
    """Blocks a request with ``sequences`` samples holds at its end: the prompt's full blocks once, the
    rest per sequence (DESIGN §4b): ``floor(P/32) + n · (ceil((P+G)/32) − floor(P/32))``."""
    shared = prompt // BLOCK_SIZE
    return shared + sequences * (-(-(prompt + new) // BLOCK_SIZE) - shared)


def random_case(rng: np.random.Generator) -> tuple[list, SchedulerOptions]:
    """One small random workload and scheduler config, exercising what the validator compares exactly.

    Fixed pools (tight ones preempt and ignore), dynamic pools, split-fuse on and off (off: every
    sequence must fit ``max_num_batched_tokens`` whole, else GenAI stops with an assertion, and
    ``max_num_batched_tokens >= max_num_seqs``), chunked prompts, prefix caching with shared prefixes
    (some prompts are exactly their prefix), multinomial samples whose group fits a fixed pool.
    No beam search (bounds only).
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
    if blocks:  # a sample group larger than the whole pool makes GenAI recompute it forever (DESIGN §4b)
        reqs = [r if r.samples == 1 or group_blocks(r.prompt, r.max_new_tokens, r.samples) <= blocks
                else replace(r, samples=1) for r in reqs]
    opts = SchedulerOptions(num_kv_blocks=blocks, max_num_batched_tokens=batched, max_num_seqs=seqs,
                            dynamic_split_fuse=split_fuse, enable_prefix_caching=caching)
    return reqs, opts


# --------------------------------------------------------------------------- the simulated side


def simulate(requests: Sequence, token_ids: Sequence[Sequence[int]], opts: SchedulerOptions, layout: KVLayout,
             spec) -> tuple[list[dict], list[dict], dict]:
    """The same workload (same token ids) through simkv's paged continuous scheduler
    (:func:`simkv.serving.simulate_paged` with the real bytes per block): step records shaped like
    :func:`run_real`'s, with per request ``processed`` added, the pool's ledger events, and what the
    run went through (preemptions, IGNORED requests, prefix-cache hits, pool growths)."""
    from simkv.models import custom_model
    from simkv.precision import get_precision
    from simkv.serving import simulate_paged

    from .compare import predicted_events

    reqs = [replace(r, token_ids=tuple(ids)) for r, ids in zip(requests, token_ids)]
    try:
        precision = get_precision(layout.kv_precision)
    except ConfigError:
        precision = get_precision("u8")  # only names the type: block_bytes below carries the real size
    res = simulate_paged(reqs, model=custom_model(layers=spec.layers, heads=spec.heads, kv_heads=spec.kv_heads,
                                                  head_dim=spec.head_dim),
                         precision=precision, block_size=BLOCK_SIZE, num_kv_blocks=opts.num_kv_blocks,
                         cache_size=float(opts.cache_size), max_num_batched_tokens=opts.max_num_batched_tokens,
                         max_num_seqs=opts.max_num_seqs, dynamic_split_fuse=opts.dynamic_split_fuse,
                         enable_prefix_caching=opts.enable_prefix_caching, block_bytes=layout.block_bytes,
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


def run_case(index: int, requests: Sequence, opts: SchedulerOptions, model_path: str | Path, spec, *, seed: int = 0,
             trace: bool = True, keep_steps: bool = False, progress: bool = False) -> CaseResult:
    """Real run, simulation and comparison of one workload."""
    from .compare import align_events

    ids = prompt_token_ids(requests, seed)
    real = run_real(requests, ids, opts, model_path, trace=trace, seed=seed, progress=progress)
    t0 = time.perf_counter()
    sim_steps, sim_events, facts = simulate(requests, ids, opts, real.layout, spec)
    sim_s = time.perf_counter() - t0
    exempt, bounds = _beam_exemptions(requests, sim_steps)
    comparison = compare_steps(real.steps, sim_steps, exempt_blocks=exempt, bounds=bounds)
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
    return CaseResult(index=index, scheduler=asdict(opts), requests=[_request_dict(r) for r in requests],
                      comparison=comparison, allocations=allocations, exercised=facts, real_s=real.elapsed_s,
                      sim_s=sim_s, steps=steps)


def _one_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and not ln.startswith("Exception from ")]
    return lines[-1] if lines else repr(err)


def case_ok(c: CaseResult) -> bool:
    a = c.allocations
    return c.error is None and c.comparison["steps_mismatched"] == 0 and (not a["compared"] or
                                                      a["events_missing"] == 0 and a["events_unexpected"] == 0)


def paged_versions() -> dict:
    from importlib.metadata import version

    from .runner import versions

    v = versions(None)
    v.pop("MALLOC_MMAP_THRESHOLD_", None)
    for pkg in ("openvino-genai", "openvino-tokenizers", "tokenizers"):
        try:
            v[pkg] = version(pkg)
        except Exception:  # pragma: no cover
            v[pkg] = None
    return v


def validate(cases: Sequence[tuple[Sequence, SchedulerOptions]], *, spec=None, model_root: str | Path | None = None,
             seed: int = 0, trace: bool = True, progress: bool = False, keep_steps: bool | None = None) -> dict:
    """Every workload real vs simulated; the ``simkv validate --paged --json`` dict."""
    check_dependencies()
    from .genai_model import GenaiModelSpec, model_dir

    t0 = time.perf_counter()
    spec = spec or GenaiModelSpec()
    path = model_dir(spec, model_root)
    keep = len(cases) == 1 if keep_steps is None else keep_steps
    results: list[CaseResult] = []
    it: Iterable = enumerate(cases)
    if progress and len(cases) > 1:
        from tqdm import tqdm

        it = tqdm(it, total=len(cases), desc="workloads", unit="workload", file=sys.stderr)
    for i, (requests, opts) in it:
        check_workload(requests)
        try:
            results.append(run_case(i, requests, opts, path, spec, seed=seed, trace=trace, keep_steps=keep,
                                    progress=progress and len(cases) == 1))
        except (RuntimeError, SimkvError) as err:  # real pipeline or simulator failed: the workload fails
            if len(cases) == 1:
                raise
            results.append(CaseResult(i, asdict(opts), [_request_dict(r) for r in requests],
                                      {"steps_total": 0, "steps_matched": 0, "steps_mismatched": 0,
                                       "first_mismatches": [], "bounded_steps": 0, "warnings": []},
                                      {"compared": False, "real_events": 0, "plugin_transients": 0}, {}, 0.0, 0.0,
                                      error=("simulation: " if isinstance(err, SimkvError) else "real pipeline: ")
                                      + _one_line(err)))
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
        "block_bytes": layout.block_bytes,
        "kv_precision": layout.kv_precision,
        "kv_layout": {"layers": layout.layers, "block_size": BLOCK_SIZE, "key_block_shape": list(layout.key_shape),
                      "value_block_shape": list(layout.value_shape)},
        "model": {k: v for k, v in asdict(spec).items() if k != "with_tokenizer"} | {"dir": str(path)},
        "seed": seed,
        "workloads": [asdict(c) for c in results],
        "versions": paged_versions(),
    }
    data["elapsed_s"] = time.perf_counter() - t0
    return data


def ok(data: dict) -> bool:
    a = data["allocations"]
    return not data["workload_errors"] and data["steps_mismatched"] == 0 and a["events_missing"] == 0 and a["events_unexpected"] == 0


def summary_lines(data: dict) -> list[str]:
    a = data["allocations"]
    lines = [
        f"simkv validate --paged: OpenVINO GenAI ContinuousBatchingPipeline (CPU) vs simkv's paged model",
        f"  {'result':<24}{'PASS: every step matched' if ok(data) else 'FAIL: steps differ'}",
        f"  {'workloads':<24}{data['workloads_matched']:,} of {data['workloads_total']:,} matched",
        f"  {'steps matched / total':<24}{data['steps_matched']:,} / {data['steps_total']:,}"
        + (f" ({data['bounded_steps']:,} with beam search: blocks within bounds)" if data["bounded_steps"] else ""),
        f"  {'KV precision':<24}{data['kv_precision']} ({data['block_bytes']:,} B per block, all layers, K+V)",
    ]
    if a["compared"]:
        lines.append(f"  {'pool allocations':<24}{a['events_matched']:,} / {a['events_total']:,} matched "
                     f"({a['events_missing']} missing, {a['events_unexpected']} unexpected)")
    else:
        lines.append(f"  {'pool allocations':<24}{a['real_events']:,} observed (not compared)")
    for e in data["workload_errors"][:5]:
        lines.append(f"  {'workload failed':<24}workload {e['workload']}: {e['error']}")
    for m in data["first_mismatches"][:5]:
        fields = ", ".join(f"{k} real {v['real']} sim {v['simulated']}" for k, v in list(m["fields"].items())[:4])
        lines.append(f"  {'mismatch':<24}workload {m['workload']} step {m['step']}: {fields}")
    lines.append(f"  {'time':<24}{data['elapsed_s']:.1f} s")
    return lines


# --------------------------------------------------------------------------- report and CLI


def steps_figure(data: dict):
    """Blocks in use and pool size per step, real (solid) vs simulated (dashed), for a single workload."""
    import plotly.graph_objects as go

    from .report import COLORS, _layout

    steps = (data["workloads"][0].get("steps") or []) if data["workloads"] else []
    fig = go.Figure()
    for key, color in (("blocks_used", COLORS["resident"]), ("blocks_total", COLORS["allocated"]),
                       ("scheduled_requests", COLORS["latency"])):
        for side, dash in (("real", "solid"), ("simulated", "dash")):
            xs = [s["step"] for s in steps if s[side] is not None]
            ys = [s[side][key] for s in steps if s[side] is not None]
            fig.add_scatter(x=xs, y=ys, name=f"{side} {key}", line={"color": color, "dash": dash, "width": 1.5})
    bad = [m["step"] for m in data["first_mismatches"] if m["workload"] == 0]
    if bad:
        fig.add_scatter(x=bad, y=[0] * len(bad), mode="markers", name="mismatching step",
                        marker={"color": COLORS["event"], "symbol": "x", "size": 9})
    fig.update_layout(xaxis_title="step", yaxis_title="blocks / requests")
    return _layout(fig, "Per step: real (solid) vs simulated (dashed)")


def write_report(data: dict, path: str | Path) -> Path:
    """A self-contained HTML page: summary, the per-step figure (one workload), mismatches, workloads,
    versions. Byte-identical for the same dict."""
    import html

    from plotly.offline import get_plotlyjs

    from .report import _table

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    a = data["allocations"]
    summary = _table([
        ("result", "PASS: every step matched" if ok(data) else "FAIL: steps differ"),
        ("steps matched / total", f"{data['steps_matched']:,} / {data['steps_total']:,}"),
        ("workloads matched / total", f"{data['workloads_matched']:,} / {data['workloads_total']:,}"),
        ("beam-search steps (blocks within bounds)", data["bounded_steps"]),
        ("KV precision, block bytes", f"{data['kv_precision']}, {data['block_bytes']:,} B"),
        ("pool allocations matched / total", f"{a['events_matched']:,} / {a['events_total']:,}" if a["compared"]
         else f"{a['real_events']:,} observed, not compared"),
        ("plugin transients (same size, freed in the step)", a["plugin_transients"]),
    ])
    rows = "".join(
        f"<tr><td>{m['workload']}</td><td>{m['step']}</td><td>{html.escape(json.dumps(m['fields']))}</td></tr>"
        for m in data["first_mismatches"])
    mism = ("<p>None.</p>" if not rows else
            f"<table><tr><th>workload</th><th>step</th><th>fields (real vs simulated)</th></tr>{rows}</table>")
    wl = "".join(
        f"<tr><td>{w['index']}</td><td>{w['comparison']['steps_matched']:,} / {w['comparison']['steps_total']:,}</td>"
        f"<td>{html.escape(json.dumps(w['scheduler']))}</td><td>{len(w['requests'])}</td>"
        f"<td>{w['real_s']:.2f}</td></tr>" for w in data["workloads"][:500])
    fig = ""
    if len(data["workloads"]) == 1 and data["workloads"][0].get("steps"):
        fig = steps_figure(data).to_html(full_html=False, include_plotlyjs=False, div_id="simkv-paged-steps")
    versions = _table([(k, v) for k, v in data["versions"].items() if k != "cpu_flags"])
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>simkv validate --paged</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;margin:1em 0}}
th,td{{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:90%}}pre{{background:#f6f6f6;padding:1em}}</style>
<script type="text/javascript">{get_plotlyjs()}</script></head><body>
<h1>simkv validate --paged: OpenVINO GenAI continuous batching vs simkv's paged model</h1>
{summary}
<pre>{html.escape(chr(10).join(summary_lines(data)))}</pre>
{fig}
<h2>First mismatching steps</h2>{mism}
<h2>Workloads</h2><table><tr><th>#</th><th>steps matched</th><th>scheduler</th><th>requests</th><th>real s</th></tr>{wl}</table>
<h2>Versions</h2>{versions}
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path


MAX_RANDOM = 10_000


def cases_from_args(args) -> list[tuple[list, SchedulerOptions]]:
    """The workloads ``--trace`` or ``--random`` asks for (errors are one-line ConfigErrors)."""
    if (args.trace is None) == (args.random is None):
        raise ConfigError("--paged needs exactly one of --trace W.csv and --random N")
    if args.ir or args.ops:
        raise ConfigError("--paged runs its own model and workload: drop --ir/--ops")
    if args.random is not None:
        if not 1 <= args.random <= MAX_RANDOM:
            raise ConfigError(f"--random must be in 1..{MAX_RANDOM:,}")
        rng = np.random.default_rng(args.seed)
        return [random_case(rng) for _ in range(args.random)]
    from simkv.serving.requests import load_trace

    opts = SchedulerOptions(num_kv_blocks=args.num_kv_blocks, cache_size=args.cache_size,
                            max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                            dynamic_split_fuse=not args.no_dynamic_split_fuse,
                            enable_prefix_caching=args.prefix_caching)
    requests = load_trace(args.trace)
    check_workload(requests)
    return [(requests, opts)]


def spec_from_args(args):
    from .genai_model import GenaiModelSpec

    heads = args.heads or 4
    kv = args.kv_heads or (heads if args.heads else 2)
    try:
        return GenaiModelSpec(layers=args.layers or 2, heads=heads, kv_heads=kv, head_dim=args.head_dim or 32,
                              vocab=args.vocab)  # weights: seed 0 (they do not change the schedule)
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
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    if args.report:
        write_report(data, args.report)
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print("\n".join(summary_lines(data)))
        for what, p in (("json", args.out), ("report", args.report)):
            if p:
                print(f"  {what:<24}{p}")
    return 0 if ok(data) else 1

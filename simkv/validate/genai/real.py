"""The real side of ``simkv validate --paged``: OpenVINO GenAI's ``ContinuousBatchingPipeline`` on CPU, step by step.

* :func:`kv_layout` compiles the paged form of the model as GenAI does (``paged_attention_transformation``,
  CPU) and reads what a block holds from the ``key_cache.N`` / ``value_cache.N`` inputs: element type,
  per-tensor bytes (u8: keys ``[H_kv, 32 + 8, S]``, values ``[H_kv, 32, S + 8]``).
* :func:`run_real` drives the pipeline (the step convention is in :mod:`.runner`'s docstring) and records
  per step ``requests``, ``scheduled_requests``, ``blocks_used``, ``blocks_total`` and, per live request,
  its status and tokens generated so far.
* :func:`read_pool_events` reads a memray capture of the run: the pool tensors (recognised by
  ``ov::genai::KVCacheManager::allocate_cache_if_needed`` in their native stack) and the CPU plugin's
  same-size transient buffers, in order.

Imports OpenVINO lazily; ``openvino-genai`` and ``memray`` are needed only when a run starts.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["KVLayout", "kv_layout", "RealRun", "run_real", "read_pool_events", "PIPELINE_PROPERTIES", "POOL_FRAME",
           "MAX_STEPS", "RealCrash", "assertion"]

#: A real run stops (as an error) after this many steps.
MAX_STEPS = 50_000


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



@dataclass
class RealRun:
    steps: list[dict]
    layout: KVLayout
    pool_events: list[dict] = field(default_factory=list)
    transient_events: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: ``step()`` threw (one of GenAI's checks): {"step": k, "check": :func:`assertion`'s line}; ``steps`` holds
    #: the steps before it.
    stop: dict | None = None


def _generation_config(r, seed: int):
    import openvino_genai as og

    from .model import EOS_TOKEN_ID

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


def _scheduler_config(opts):
    """GenAI's ``SchedulerConfig`` from simkv's, with ``use_cache_eviction`` and its ``CacheEvictionConfig``
    (:meth:`simkv.serving.sched.eviction.CacheEviction.genai`; NORM_SUM and no rotation, GenAI's defaults) when
    ``opts.cache_eviction`` is set."""
    import openvino_genai as og

    sc = og.SchedulerConfig()
    for name, value in opts.genai().items():
        setattr(sc, name, value)
    if opts.cache_eviction is not None:
        eviction = opts.cache_eviction.genai()
        sc.use_cache_eviction = True
        sc.cache_eviction_config = og.CacheEvictionConfig(
            eviction["start"], eviction["recent"], eviction["max"], og.AggregationMode.NORM_SUM, False,
            eviction["snapkv"], og.KVCrushConfig(eviction["kvcrush"]))
    return sc


#: One CPU thread: the schedule does not depend on it, and the machine is shared.
PIPELINE_PROPERTIES = {"INFERENCE_NUM_THREADS": 1}


def run_real(requests: Sequence, token_ids: Sequence[Sequence[int]], opts, model_path: str | Path,
             *, trace: bool = False, seed: int = 0, progress: bool = False) -> RealRun:
    """Drive the real pipeline step by step (:mod:`.runner`'s docstring, points 2-4), with GenAI's cache eviction
    when ``opts.cache_eviction`` is set. An error out of ``step()`` (one of GenAI's assertions) ends the run:
    ``RealRun.stop`` names the step and the check."""
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
        from ..memtrace import Recorder

        recorder = Recorder()
        recorder.__enter__()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(desc="real steps", unit="step", leave=False, file=sys.stderr)
    nxt, k = 0, 0
    stop = None
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
            try:
                if recorder is not None:
                    with recorder.operation(k):
                        pipe.step()
                else:
                    pipe.step()
            except RuntimeError as err:  # one of GenAI's assertions: the run ends here
                stop = {"step": k, "check": assertion(str(err))}
                break
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
    run = RealRun(steps=steps, layout=layout, warnings=warnings, stop=stop)
    if recorder is not None:
        try:  # (a step that threw has its start marker)
            run.pool_events, run.transient_events = read_pool_events(recorder.path, len(steps) + (stop is not None),
                                                                     layout)
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
    is matched by address. A *transient* is one of the next allocations, at most as many as the pool
    tensors the step allocated, of exactly a new pool tensor's size and freed in the same step (the CPU
    plugin's, DESIGN §4b; later same-size allocations are activations that happen to match, e.g. 40
    tokens x 32 f32 = 5,120 B = 2 blocks of the toy model). They are named K or V by size (V first per
    layer, as the plugin allocates them), numbered per layer, and kept in ``events`` too
    (``transient: True``) where they sit in the stream; ``transients`` lists them alone.
    """
    import memray

    from ..memtrace import MARKER_BASE

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
            elif int(rec.size) in sizes["k"] | sizes["v"] and n_trans["k"] + n_trans["v"] < n_pool:
                size = int(rec.size)
                # Named by size: the plugin takes each layer's V-sized buffer before its K-sized one when
                # the sizes differ (head_dim != 32 in u8), so equal sizes are named V, K, V, K too.
                t = ("k" if size not in sizes["v"] else "v" if size not in sizes["k"]
                     else "v" if (n_trans["k"] + n_trans["v"]) % 2 == 0 else "k")
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
    # The plugin frees its transients in a scrambled but repeatable order (head_dim 64, by address: V0 K2 V2
    # K1 V1 K0 with 3 layers, K0 V1 K3 V3 K2 V2 K1 V0 with 4): put each step's transient frees, where they
    # stand, in their allocation order (per layer V, then K), the order the comparison expects.
    rank = {"v": 0, "k": 1}
    slots = [i for i, e in enumerate(out) if e["transient"] and e["op"] == "free"]
    for i, e in sorted(zip(slots, sorted((out[i] for i in slots),
                                         key=lambda e: (e["step"], e["layer"], rank[e["tensor"]]))),
                       key=lambda x: x[0]):
        out[i] = e
    return out, [e for e in out if e["transient"] and e["op"] == "alloc"]


# --------------------------------------------------------------------------- a child process per session


_RESULT = "SIMKV-RESULT "


class RealWorker:
    """Runs :func:`run_real` in a child process, one workload after another.

    The pipeline is native code: a crash (a segfault inside GenAI) would take the whole validation with
    it. In a child it fails that workload only (:class:`RealCrash`); the next workload starts a fresh
    child. Results come back as one JSON line each, marked, so anything the runtime prints to stdout
    (GenAI logs there) is skipped.
    """

    def __init__(self) -> None:
        self.proc = None

    def _start(self) -> None:
        import subprocess

        from ..child import child_env

        self.proc = subprocess.Popen([sys.executable, "-m", "simkv.validate.genai.real"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env())

    def run(self, requests: Sequence, token_ids, opts, model_path, *, trace: bool, seed: int) -> RealRun:
        import json
        from dataclasses import asdict

        if self.proc is None or self.proc.poll() is not None:
            self._start()
        task = {"requests": [asdict(r) | {"token_ids": None} for r in requests],
                "token_ids": [list(t) for t in token_ids], "opts": opts.genai(), "model": str(model_path),
                "trace": trace, "seed": seed,
                "eviction": opts.cache_eviction.genai() if opts.cache_eviction is not None else None}
        self.proc.stdin.write(json.dumps(task) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(_RESULT):
                out = json.loads(line[len(_RESULT):])
                if "error" in out:
                    raise RuntimeError(out["error"])
                run = out["run"]
                lay = run.pop("layout")
                layout = KVLayout(**{k: tuple(v) if isinstance(v, list) else v for k, v in lay.items()})
                return RealRun(layout=layout, **run)
        code = self.proc.wait()
        self.proc = None
        raise RealCrash(f"the real pipeline crashed ({_signal_name(code)})")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()
        self.proc = None


class RealCrash(RuntimeError):
    """The pipeline's process died (a signal from native code) while running a workload."""


def assertion(message: str) -> str:
    """GenAI's assertion message in one line: ``file:line: Check 'expression': reason`` (from ``Check '...' failed
    at .../block_manager.hpp:416:`` and the reason on the next line), else the message's last line."""
    import re

    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        m = re.search(r"(Check '.*') failed at .*?([\w.]+\.(?:cpp|hpp|h)):(\d+)", ln)
        if m:
            reason = [x for x in lines[i + 1:] if not x.startswith("Exception from")][:1]
            return f"{m.group(2)}:{m.group(3)}: {m.group(1)}" + (f": {reason[0]}" if reason else "")
    return lines[-1] if lines else message


def _signal_name(code: int) -> str:
    import signal

    try:
        return signal.Signals(-code).name if code < 0 else f"exit {code}"
    except ValueError:
        return f"exit {code}"


def _child() -> int:
    """``python -m simkv.validate.genai.real``: run the workloads read from stdin, one JSON line each."""
    import json
    from dataclasses import asdict

    from simkv.serving.requests import Request
    from simkv.serving.sched.config import SchedulerConfig
    from simkv.serving.sched.eviction import CacheEviction

    for line in sys.stdin:
        task = json.loads(line)
        requests = [Request(**r) for r in task["requests"]]
        try:
            eviction = task["eviction"]
            opts = SchedulerConfig(**task["opts"], cache_eviction=CacheEviction(**eviction) if eviction else None)
            run = run_real(requests, task["token_ids"], opts, task["model"], trace=task["trace"], seed=task["seed"])
            out = {"run": asdict(run)}
        except RuntimeError as err:
            out = {"error": str(err)}
        sys.stdout.write(_RESULT + json.dumps(out) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child())

"""The real side of ``simkv validate --serving``: OpenVINO GenAI's ``ContinuousBatchingPipeline`` timed on CPU.

Every measurement runs in a fresh child process (``python -m simkv.validate.genai.live``) pinned to one core
(``taskset -c CPU``), so repeats do not share warmed allocator or plugin state, and one core is what the
host preset describes. The child reads one JSON task on stdin and writes one marked JSON line back.

Two tasks:

* ``steps`` (:func:`time_steps`): fixed batches, each after warm-up, medians over repeats. A decode batch of
  ``b``: ``b`` requests of a ``P``-token prompt are added and one ``step()`` prefills them all (the
  scheduler's ``max_num_batched_tokens`` is set to ``b · P``), then every further ``step()`` decodes one
  token for each of the ``b`` sequences; the first ``warmup`` of those are dropped, the next ``repeats``
  timed (the context of the ``j``-th decode step is ``P + j`` cached tokens). A prefill chunk of ``c``: a
  fresh request of a ``c``-token prompt (``max_new_tokens`` 1, no prefix caching) whose single ``step()``
  is timed; ``warmup`` of them dropped, then ``repeats`` timed.
  A mixed step of ``b`` decodes beside a ``c``-token chunk: ``b`` requests of a ``P``-token prompt are
  prefilled in one ``step()`` as for a decode batch; then, ``warmup + repeats`` times, a fresh request of a
  ``c``-token prompt (``max_new_tokens`` 1) is added and one ``step()`` timed: the scheduler's budget
  (``max(b · P, b + c)`` tokens) holds the ``b`` running decodes and the whole prompt, so every timed step
  is ``b`` one-token queries of ``P + j`` cached tokens and one ``c``-token query of none (the prompt
  request samples its one token in that step and finishes).
* ``serve`` (:func:`serve_live`): after one warm-up request run to its end, requests are added as token ids
  at their wall-clock arrivals (``add_request`` when ``perf_counter() - t0 >= arrival_s``), ``step()`` is
  called while anything is unfinished (the loop sleeps to the next arrival when nothing is), and after each
  step every handle is read: a request's token count rising means its tokens came out of that step, at the
  step's end time. First token → TTFT (from the arrival), last token → e2e, TPOT = (last − first) / (n − 1),
  the same definitions as simkv's request table (:meth:`simkv.serving.run.ServingResult.request_rows`).

Every handle ``add_request`` returns is held until its request ends: GenAI drops a request whose handle is
destroyed (measured: its steps then take microseconds).

Step times and token times are wall-clock here by nature; the simulation they are compared with knows none.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Sequence

import numpy as np

from .real import PIPELINE_PROPERTIES, _generation_config, _scheduler_config

__all__ = ["time_steps", "serve_live", "run_child", "MAX_WALL_S"]

#: A live run stops (as an error) after this many wall-clock seconds.
MAX_WALL_S = 900.0
_RESULT = "SIMKV-LIVE "
#: The warm-up request's id (outside every workload's ids) and shape.
WARMUP_ID, WARMUP_PROMPT, WARMUP_NEW = 1_000_000, 64, 8


def _pipeline(model_path: str, opts: dict):
    import openvino_genai as og

    from simkv.serving.sched.config import SchedulerConfig

    return og.ContinuousBatchingPipeline(model_path, _scheduler_config(SchedulerConfig(**opts)), "CPU",
                                         dict(PIPELINE_PROPERTIES))


def _request(req_id: int, ids: Sequence[int], new: int):
    import openvino as ov

    from simkv.serving.requests import Request

    tensor = ov.Tensor(np.asarray(ids, dtype=np.int64).reshape(1, -1))
    return req_id, tensor, _generation_config(Request(req_id, len(ids), new, arrival_step=0), 0)


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    from .model import PROMPT_ID_END, PROMPT_ID_START

    return rng.integers(PROMPT_ID_START, PROMPT_ID_END, n).tolist()


def _drain(pipe) -> None:
    while pipe.has_non_finished_requests():
        pipe.step()


def time_steps(model_path: str, *, decode_batches: Sequence[int], prefill_chunks: Sequence[int], context: int,
               warmup: int, repeats: int, seed: int = 0, mixed: Sequence[Sequence[int]] = ()) -> dict:
    """Wall time of ``step()`` at each fixed batch (module docstring), every timed repeat kept; ``mixed``:
    (decodes, chunk) pairs."""
    rng = np.random.default_rng(seed)
    out: dict = {"decode": [], "prefill": [], "mixed": []}
    for b in decode_batches:
        pipe = _pipeline(model_path, {"cache_size": 1, "max_num_batched_tokens": max(b * context, 256),
                                      "max_num_seqs": max(b, 1), "dynamic_split_fuse": True})
        # Handles kept: GenAI drops a request whose handle is destroyed.
        handles = [pipe.add_request(*_request(rid, _ids(rng, context), warmup + repeats + 1)) for rid in range(b)]
        pipe.step()  # every prompt in one step
        times = []
        for _ in range(warmup + repeats):
            t0 = time.perf_counter()
            pipe.step()
            times.append(time.perf_counter() - t0)
        _drain(pipe)
        del handles, pipe
        out["decode"].append({"batch": b, "context": context, "first_step": warmup, "times_s": times[warmup:]})
    for c in prefill_chunks:
        pipe = _pipeline(model_path, {"cache_size": 1, "max_num_batched_tokens": c, "max_num_seqs": 1,
                                      "dynamic_split_fuse": True})
        times = []
        for rid in range(warmup + repeats):
            handle = pipe.add_request(*_request(rid, _ids(rng, c), 1))  # noqa: F841 (dropped with its handle)
            t0 = time.perf_counter()
            pipe.step()
            times.append(time.perf_counter() - t0)
            _drain(pipe)
        del pipe
        out["prefill"].append({"chunk": c, "times_s": times[warmup:]})
    for b, c in mixed:
        pipe = _pipeline(model_path, {"cache_size": 1, "max_num_batched_tokens": max(b * context, b + c),
                                      "max_num_seqs": b + 1, "dynamic_split_fuse": True})
        handles = [pipe.add_request(*_request(rid, _ids(rng, context), warmup + repeats + 1)) for rid in range(b)]
        pipe.step()  # every decode's prompt in one step
        times = []
        for j in range(warmup + repeats):
            handles.append(pipe.add_request(*_request(b + j, _ids(rng, c), 1)))
            t0 = time.perf_counter()
            pipe.step()
            times.append(time.perf_counter() - t0)
            if handles[-1].get_status().name != "FINISHED":  # else the next step would hold b + 1 decodes
                raise RuntimeError(f"mixed step {b}+{c}: the prompt request did not finish in its step")
        _drain(pipe)
        del handles, pipe
        out["mixed"].append({"batch": b, "chunk": c, "context": context, "first_step": warmup,
                             "times_s": times[warmup:]})
    return out


def serve_live(model_path: str, opts: dict, requests: Sequence[dict], token_ids: Sequence[Sequence[int]],
               max_wall_s: float = MAX_WALL_S) -> dict:
    """One real-time serving run (module docstring): per request its first/last token times and count."""
    pipe = _pipeline(model_path, opts)
    rng = np.random.default_rng(12345)
    warm = pipe.add_request(*_request(WARMUP_ID, _ids(rng, WARMUP_PROMPT), WARMUP_NEW))  # noqa: F841 (kept: see below)
    _drain(pipe)
    order = sorted(range(len(requests)), key=lambda i: (requests[i]["arrival_s"], i))
    handles: dict[int, object] = {}
    count = {r["id"]: 0 for r in requests}
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    busy, steps, nxt = 0.0, 0, 0
    t0 = time.perf_counter()
    while nxt < len(order) or handles:
        now = time.perf_counter() - t0
        if now > max_wall_s:
            raise RuntimeError(f"the live run did not finish within {max_wall_s:.0f} s")
        while nxt < len(order) and requests[order[nxt]]["arrival_s"] <= now:
            r = requests[order[nxt]]
            handles[r["id"]] = pipe.add_request(*_request(r["id"], token_ids[order[nxt]], r["max_new_tokens"]))
            nxt += 1
        if not handles:
            time.sleep(max(0.0, requests[order[nxt]]["arrival_s"] - (time.perf_counter() - t0)))
            continue
        s = time.perf_counter()
        pipe.step()
        e = time.perf_counter()
        busy += e - s
        steps += 1
        t = e - t0
        for rid, h in list(handles.items()):
            status = h.get_status().name
            while h.can_read():
                for out in h.read().values():
                    if out.generated_ids:
                        count[rid] += len(out.generated_ids)
                        first.setdefault(rid, t)
                        last[rid] = t
            if status in ("FINISHED", "IGNORED"):
                del handles[rid]
    end = time.perf_counter() - t0
    del pipe
    return {"requests": [{"id": r["id"], "generated": count[r["id"]], "first_s": first.get(r["id"]),
                          "last_s": last.get(r["id"])} for r in requests],
            "busy_s": busy, "wall_s": end, "steps": steps}


def run_child(task: dict, cpu: int | None, timeout_s: float) -> dict:
    """Run ``task`` in a fresh child process (pinned to ``cpu`` with ``taskset`` when given); its result dict."""
    import shutil
    import subprocess

    from ..child import child_env

    cmd = [sys.executable, "-m", "simkv.validate.genai.live"]
    if cpu is not None:
        if shutil.which("taskset") is None:
            raise RuntimeError("pinning to one core needs taskset (util-linux); pass --cpu -1 to run unpinned")
        cmd = ["taskset", "-c", str(cpu), *cmd]
    try:
        proc = subprocess.run(cmd, input=json.dumps(task), capture_output=True, text=True, env=child_env(),
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the real pipeline did not finish within {timeout_s:.0f} s") from None
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULT):
            out = json.loads(line[len(_RESULT):])
            if "error" in out:
                raise RuntimeError(out["error"])
            return out["result"]
    tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or [f"exit {proc.returncode}"]
    raise RuntimeError(f"the real pipeline's process failed: {tail[0]}")


def _child() -> int:
    task = json.loads(sys.stdin.read())
    kind = task.pop("kind")
    try:
        result = time_steps(**task) if kind == "steps" else serve_live(**task)
        out = {"result": result}
    except RuntimeError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        out = {"error": lines[-1] if lines else repr(err)}
    sys.stdout.write(_RESULT + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child())

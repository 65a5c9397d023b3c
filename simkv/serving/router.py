"""Replicas and a router: each request goes, at its arrival, to one of N serving engines (``simkv run
--replicas N --router NAME``); each replica is the ordinary engine (:class:`~simkv.serving.engine.PagedServing`
or :class:`~simkv.serving.contiguous.ContiguousServing`) on a device of its own.

What the router sees, and when (docs/research/plan-facts.md §1.4; Vidur's global scheduler routes at
arrival with no staleness, ``vidur/events/global_schedule_event.py``):

* requests are routed one at a time, in trace order, at their arrival time ``t``;
* every replica is first advanced to ``t``: it has taken every step that *starts* before ``t`` (a step
  starting at ``t`` waits for the requests arriving then, as the engine pulls arrivals ``<= t`` at a step's
  start). The router sees the effects of the steps that *ended* at or before ``t``; a step still in flight
  shows the state before it (vLLM and GenAI report their metrics per step);
* a router's counts are updated right after each assignment, so the next arrival — at the same ``t`` too —
  sees it (Vidur ``lor``'s ``pending[chosen] += 1``, vLLM's DP balancer's optimistic increment);
* ties go to the lowest replica index (Vidur ``lor``: ``min`` over dict items; SGLang's DP controller
  ``total_requests.index(min(...))`` and its router's ``min_by_key`` all take the first minimum).

The routers:

* ``round-robin`` — the k-th request (from 0) to replica ``k mod N``; it reads no state (Vidur
  ``round_robin_global_scheduler.py``; vLLM production-stack ``RoundRobinRouter``), so replicas run
  independently of one another.
* ``least-outstanding`` — fewest requests sent to the replica and not yet ended (FINISHED, IGNORED or
  REJECTED in a step that ended by ``t``): queued + running, the SGLang router's worker load
  (``WorkerLoadGuard``: dispatched, not yet answered), the SGLang DP controller's ``num_running_reqs +
  num_waiting_reqs`` and production-stack's ``in_prefill + in_decoding`` counters. (Vidur's ``lor`` counts
  only its waiting queue, not running requests; not what is done here.)
* ``least-kv`` — fewest KV bytes in use as the last step that ended by ``t`` reports them (paged: blocks in
  use × block bytes, read after scheduling as GenAI's ``cache_usage`` and vLLM's ``kv_cache_usage``;
  contiguous: the bytes of the requests' buffers), plus, for each request sent there that no such step has
  seen yet (added at a later step, or not yet), its prompt's KV (paged: its blocks; contiguous: its tokens'
  bytes) — the optimistic increment. The Gateway API Inference Extension's ``kv-cache-utilization-scorer``
  (``1 − KVCacheUsagePercent``) ranks the same way on identical devices.
* ``session`` — a request goes where its session went, else where its shared prefix (``prefix_id``) went,
  else by ``least-outstanding``; its session and prefix are then pinned to that replica (a sticky map, as
  production-stack's ``SessionRouter`` keeps a session on one engine, but without its hash ring). The Azure
  traces have no session or prefix column: there every request is keyless and ``session`` is
  ``least-outstanding``.

``least-outstanding``, ``least-kv`` and ``session`` read replica state, so the replicas advance in lockstep to
each arrival; ``round-robin`` needs none, so each replica runs its share alone (:func:`route` only assigns).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right

import numpy as np

from simkv.errors import ConfigError
from simkv.serving.sched.group import RUNNING, UNFINISHED

ROUTERS = ("round-robin", "least-outstanding", "least-kv", "session")
#: Routers that read the replicas' state (the replicas then advance in lockstep to each arrival).
STATEFUL = ("least-outstanding", "least-kv", "session")
#: Bound on ``--replicas`` (each replica is a whole engine in memory).
MAX_REPLICAS = 256


def check_router(replicas: int, router: str, requests, workers: int = 1) -> None:
    """One line (:class:`ConfigError`) for a replica count or router that cannot run."""
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= MAX_REPLICAS:
        raise ConfigError(f"--replicas must be in 1..{MAX_REPLICAS}, got {replicas}")
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_REPLICAS:
        raise ConfigError(f"--workers must be in 1..{MAX_REPLICAS}, got {workers}")
    if router not in ROUTERS:
        raise ConfigError(f"unknown router {router!r}; choose {', '.join(ROUTERS)}")
    if replicas > 1 and requests and requests[0].arrival_step is not None:
        raise ConfigError("--replicas needs arrivals in seconds: arrival_step counts one engine's steps")


class Replica:
    """What the router reads of one engine, as of time ``t`` (the steps that ended by then)."""

    def __init__(self, eng, paged: bool) -> None:
        self.eng = eng
        self.paged = paged
        self.routed = 0  # requests sent here
        self.ended = 0  # of them, ended in a step that ended by the time of the last view
        self.seen_groups = 0  # groups of the engine looked at so far
        self.open: list = []  # groups not yet ended
        self.ends: list[float] = []  # heap: end times of ended groups not yet counted (after t)
        self.unseen: list[tuple[int, int]] = []  # (routed position, prompt KV bytes) not yet in a reported step
        self.unseen_bytes = 0
        self.kv = 0  # KV bytes in use the last ended step reports
        self.held_ended = 0  # ended in the engine's held run by the time of the last view

    def prompt_bytes(self, prompt: int) -> int:
        eng = self.eng
        if self.paged:
            return -(-prompt // eng.bs) * eng.block_bytes
        return prompt * eng.kv_token

    def view(self, t: float, kv: bool) -> None:
        """Bring the counts to time ``t`` (the engine has taken every step starting before ``t``)."""
        eng = self.eng
        groups = eng.groups
        if self.seen_groups < len(groups):
            self.open.extend(groups[self.seen_groups:])
            self.seen_groups = len(groups)
        still = []
        for g in self.open:
            if g.status == RUNNING:
                still.append(g)
            elif g.status != UNFINISHED:  # UNFINISHED (a stopped run) never ends
                # REJECTED by the paged scheduler has no finish time: ended by the end of the steps taken
                heapq.heappush(self.ends, g.finish_s if g.finish_s is not None else eng.t)
        self.open = still
        while self.ends and self.ends[0] <= t:
            heapq.heappop(self.ends)
            self.ended += 1
        held = getattr(eng, "held", None)  # a planned run not yet carried out (engine.advance): its steps count too
        self.held_ended = 0
        if held is not None:
            run = held[0]
            self.held_ended = sum(1 for f in run.fin if f < run.K and run.times[f] <= t)
        if kv:
            self.kv, last = _kv_at(eng, t, self.paged)
            visible = groups + held[1] if held is not None else groups
            keep = []
            for pos, b in self.unseen:
                if pos < len(visible) and visible[pos].added_step <= last:
                    self.unseen_bytes -= b
                else:
                    keep.append((pos, b))
            self.unseen = keep

    @property
    def outstanding(self) -> int:
        return self.routed - self.ended - self.held_ended

    def assign(self, req, prompt: int, tokens, kv: bool) -> None:
        self.eng.add(req, prompt, tokens)
        if kv:
            b = self.prompt_bytes(prompt)
            self.unseen.append((self.routed, b))
            self.unseen_bytes += b
        self.routed += 1


def _kv_at(eng, t: float, paged: bool) -> tuple[int, int]:
    """KV bytes in use that the last step ended by ``t`` reports, and that step's number (-1: none yet).
    Rows are single steps (tuples in :data:`~simkv.serving.engine.STEP_TABLE` order) or planned runs
    (column dicts)."""
    held = getattr(eng, "held", None)
    if held is not None:  # the held run's steps come after every row
        run = held[0]
        i = int(np.searchsorted(run.times[:run.K], t, "right")) - 1
        if i >= 0:
            in_use = int(run.used[i]) * eng.block_bytes
            if run.used1 is not None:
                in_use += int(run.used1[i]) * eng.state_bytes
            return in_use, eng.step + i
    for row in reversed(eng.rows):
        if isinstance(row, tuple):
            if row[1] <= t:
                return (row[6] - row[11] if paged else row[6]), row[0]
            continue
        times = row["time_s"]
        i = bisect_right(times.tolist(), t) - 1 if len(times) < 64 else int(np.searchsorted(times, t, "right")) - 1
        if i >= 0:
            alloc, reserved = row["allocated_bytes"], row["reserved_bytes"]
            alloc = int(alloc[i]) if isinstance(alloc, np.ndarray) else int(alloc)
            reserved = int(reserved[i]) if isinstance(reserved, np.ndarray) else int(reserved)
            return (alloc - reserved if paged else alloc), int(row["step"][i])
    return 0, -1


def _lowest(values) -> int:
    """Index of the first minimum (ties to the lowest replica index)."""
    best, at = None, 0
    for i, v in enumerate(values):
        if best is None or v < best:
            best, at = v, i
    return at


def route(engines: list, requests: list, prompts: list[int], tokens: list | None, router: str, paged: bool,
          progress=None) -> list[int]:
    """Route ``requests`` (arrivals in seconds, sorted) to the ``engines`` (each started with no requests) by
    ``router``, advancing them in lockstep to each arrival where the router reads their state; every engine is
    then advanced to its end. Returns the replica of each request, in trace order."""
    n = len(engines)
    reps = [Replica(e, paged) for e in engines]
    stateful = router in STATEFUL
    kv = router == "least-kv"
    pinned: dict[tuple[str, str], int] = {}
    out: list[int] = []
    i, N = 0, len(requests)
    while i < N:
        t = requests[i].arrival_s
        if stateful:
            for r in reps:
                r.eng.advance(t)
                r.view(t, kv)
        j = i
        while j < N and requests[j].arrival_s == t:  # simultaneous arrivals, in trace order
            req = requests[j]
            if router == "round-robin":
                k = j % n
            elif router == "least-kv":
                k = _lowest([r.kv + r.unseen_bytes for r in reps])
            else:
                keys = ([("session", req.session)] if req.session else []) + \
                       ([("prefix", req.prefix_id)] if req.prefix_id else []) if router == "session" else []
                k = next((pinned[key] for key in keys if key in pinned), None)
                if k is None:
                    k = _lowest([r.outstanding for r in reps])
                for key in keys:
                    pinned.setdefault(key, k)
            reps[k].assign(req, prompts[j], tokens[j] if tokens is not None else None, kv)
            out.append(k)
            j += 1
        i = j
        if progress is not None:
            progress(i)
    for r in reps:
        r.eng.advance()
    return out

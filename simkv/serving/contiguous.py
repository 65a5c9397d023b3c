"""Contiguous KV memory: every request owns per-layer K/V buffers sized by an allocation policy.

Each request's buffers follow exactly what ``simkv run`` computes for one stateful
session: :class:`simkv.engine.FastEngine` runs the request's own operations
(``prefill:P`` then ``decode:G-1``; in a static batch the batch's longest prompt and
answer, as a padded batch computes them) with ``request=i`` in its ledger. That gives
the request's allocated/peak/used bytes per *local* step and its alloc/copy/free rows;
the serving loop places local steps on engine steps and sums over requests. No
mechanics are copied: a policy change shows up here unchanged. (Limits that look at
the whole device — the GPU plugin's 90 % headroom rule — see one request's buffers
only; the device budget itself is enforced here, across requests.)

Schedulers over contiguous memory:

* ``sequential`` — one request at a time, in arrival order (a stateful pipeline serving
  one user after another, as OVMS does for a stateful or NPU model); its buffers are
  freed when it finishes;
* ``static`` — batches of ``static_batch`` requests in arrival order, started together
  when the device is idle; the batch holds its memory until its longest request ends;
* ``continuous`` — a waiting request joins (its whole prompt in one step) as soon as
  fewer than ``max_num_seqs`` run and its first allocation fits the device.

Waste per step (allocated − used, conserved): ``reserved_bytes`` is the headroom the
requests' own later tokens will fill (the vLLM paper's "reservation"), ``internal_bytes``
the rest, allocated but never to hold one of the request's tokens (over-provisioning for a
longer sequence, padding of a static batch, metadata: the paper's "internal fragmentation").

When a running request's next step does not fit (``on_oom``): ``preempt`` frees the
most recently admitted request that holds memory (it restarts from scratch later,
recompute), ``wait`` lets the request skip the step, ``reject`` drops it. A request
that cannot run even alone on the device is REJECTED.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from simkv.errors import PolicyError
from simkv.ledger import ALLOC, COPY, FREE, ROW, Ledger
from simkv.limits import MAX_SERVING_LEDGER_ROWS
from simkv.serving.costing import StepTimer, attended_pairs
from simkv.serving.engine import PROGRESS, STEP_TABLE, session_prompts
from simkv.serving.scheduler import FINISHED, IGNORED, REJECTED, RUNNING, Group


class Seat(Group):
    """A request with contiguous buffers: its trajectory and where it stands in it."""

    __slots__ = ("traj", "local", "held", "order", "run_P", "run_G", "buffer_base")

    def __init__(self, req, index: int, prompt_tokens: int) -> None:
        super().__init__(req, index, prompt_tokens)
        self.traj, self.local, self.held, self.order = None, 0, 0, 0
        self.run_P, self.run_G, self.buffer_base = prompt_tokens, req.max_new_tokens, 0


def request_scenario(model, precision, policy, prompt: int, new: int, budget: int):
    """One request as a single session: its prompt, then ``new - 1`` decode steps (the prompt's step
    samples the first token), on ``budget`` bytes of KV memory."""
    from simkv.scenario import Scenario
    from simkv.workload import Decode, Prefill, Workload

    ops = (Prefill(prompt),) + ((Decode(new - 1),) if new > 1 else ())
    return Scenario(model, precision, policy, Workload(ops), budget)


class Trajectory:
    """One request's memory per local step (0 = its prompt), from a FastEngine run."""

    __slots__ = ("allocated", "peak", "copy", "rows", "steps", "starts")

    def __init__(self, model, precision, policy, prompt: int, new: int, budget: int) -> None:
        from simkv.engine import FastEngine

        eng = FastEngine(request_scenario(model, precision, policy, prompt, new, budget))
        eng.run()
        if eng.oom is not None:
            raise PolicyError(f"does not fit the device alone ({eng.oom})")
        t = eng.steps.table()
        self.steps = len(t)
        self.allocated = t["allocated"].astype(np.int64)
        self.peak = t["peak"].astype(np.int64)
        rows = eng.ledger.rows
        self.rows = rows
        self.copy = np.bincount(rows["step"][rows["op"] == COPY], weights=rows["bytes"][rows["op"] == COPY],
                                minlength=self.steps).astype(np.int64)[: self.steps]
        self.starts = np.searchsorted(rows["step"], np.arange(self.steps + 1))

    def rows_of(self, local: int) -> np.ndarray:
        return self.rows[self.starts[local] : self.starts[local + 1]]


class ContiguousServing:
    def __init__(self, requests, model, precision, policy, config, *, scheduler: str, static_batch: int, device,
                 weights_bytes: int, device_memory: int, trace_requests: bool = False, progress=None,
                 max_steps: int = 10_000_000) -> None:
        self.requests = requests
        self.model, self.precision, self.policy = model, precision, policy
        self.cfg = config
        self.scheduler = scheduler
        self.static_batch = static_batch
        self.budget = device_memory - weights_bytes
        self.kv_token = precision.kv_bytes_per_token(model)
        self.timer = StepTimer(model, device, weights_bytes, self.kv_token)
        self.window = model.sliding_window
        self.trace_requests = trace_requests
        self.progress = progress
        self.max_steps = max_steps
        self._cache: dict[tuple[int, int], Trajectory | Exception] = {}
        self.ledger = Ledger(limit=MAX_SERVING_LEDGER_ROWS)
        self.next_buffer = 0

    def _trajectory(self, prompt: int, new: int) -> Trajectory | None:
        key = (prompt, new)
        if key not in self._cache:
            try:
                self._cache[key] = Trajectory(self.model, self.precision, self.policy, prompt, new, self.budget)
            except PolicyError as err:
                self._cache[key] = err
        out = self._cache[key]
        return None if isinstance(out, Exception) else out

    # -- ledger ----------------------------------------------------------------------------------

    def _emit(self, rows: np.ndarray, g: Group, step: int) -> None:
        if not len(rows):
            return
        rows = rows.copy()
        rows["step"] = step
        rows["request"] = g.req.id
        # buffer ids unique across requests: offset by the request's base
        rows["buffer"] += g.buffer_base
        self.ledger.append(rows)

    def _free_all(self, g: Group, step: int) -> None:
        """Free the request's live buffers (it finished, was preempted or rejected)."""
        traj = g.traj
        if traj is None or g.local == 0:
            g.held = 0
            return
        done = traj.rows[traj.rows["step"] < g.local]
        freed = set(done["buffer"][done["op"] == FREE].tolist())
        alloc = done[done["op"] == ALLOC]
        live = alloc[[b not in freed for b in alloc["buffer"].tolist()]]
        rows = np.zeros(len(live), dtype=ROW)
        for name in ("phase", "layer", "tensor", "bytes", "capacity_tokens", "buffer"):
            rows[name] = live[name]
        rows["op"] = FREE
        rows["used_tokens"] = min(g.processed, g.P + g.generated)
        self._emit(rows, g, step)
        g.held = 0

    # -- the loop ---------------------------------------------------------------------------------

    def run(self):
        reqs = self.requests
        by_step = reqs[0].arrival_step is not None
        prompts = session_prompts(reqs)
        groups = []
        waiting: deque = deque()
        running: list[Group] = []
        pending = 0
        t, step = 0.0, 0
        rows, progress_rows, est = [], [], []
        admitted_order = 0
        bar = self.progress
        while pending < len(reqs) or waiting or running:
            if step >= self.max_steps:
                from simkv.errors import ConfigError

                raise ConfigError(f"stopped after {self.max_steps:,} steps (raise max_steps)")
            if not by_step and not running and not waiting and reqs[pending].arrival_s > t:
                t = reqs[pending].arrival_s
            while pending < len(reqs) and (reqs[pending].arrival_step <= step if by_step
                                           else reqs[pending].arrival_s <= t):
                r = reqs[pending]
                g = Seat(r, pending, prompts[pending])
                g.added_s = r.arrival_s if r.arrival_s is not None else t
                g.added_step = step
                groups.append(g)
                waiting.append(g)
                pending += 1
            # admission
            used_now = sum(g.held for g in running)
            admitted = self._admit(waiting, running, used_now)
            for g in admitted:
                admitted_order += 1
                g.order = admitted_order
            # one local step per running request, in admission order
            new = pairs = kvr = logits = copied = decode_pairs = 0
            preempted = 0
            held_total = sum(g.held for g in running)
            spike = 0
            stepped = []
            for g in list(running):
                if g.status != RUNNING:
                    continue
                traj, l = g.traj, g.local
                after = int(traj.allocated[l])
                grow = int(traj.peak[l]) - g.held
                if held_total + grow > self.budget:
                    held_total, freed, fits = self._make_room(g, grow, held_total, running, waiting, t, step)
                    preempted += freed
                    if not fits:
                        continue
                spike = max(spike, int(traj.peak[l]) - after)
                held_total += after - g.held
                g.held = after
                self._emit(traj.rows_of(l), g, step)
                tokens = g.run_P if l == 0 else 1
                ctx = (0 if l == 0 else g.run_P + l - 1)
                new += tokens
                attended = attended_pairs(ctx, tokens, self.window)
                pairs += attended
                if tokens == 1:  # a one-token query (simkv.cost: decode_pairs)
                    decode_pairs += attended
                seen = ctx + tokens if self.window is None else min(ctx + tokens, self.window)
                kvr += seen  # tokens read
                copied += int(traj.copy[l])
                own = g.generated < g.G
                if own:
                    logits += 1
                stepped.append((g, own))
                g.local = l + 1
                g.processed = g.run_P + l
            n_live = len(running) + len(waiting)
            if not stepped:
                # Nothing could step (every running request waits for memory that only a step could free,
                # or nothing can be admitted): nothing will ever change, so, as GenAI does when a step
                # schedules nothing, every present request is IGNORED and its memory freed.
                for g in list(running) + list(waiting):
                    if g.status == RUNNING:
                        self._free_all(g, step)
                        g.status = IGNORED
                        g.finish_s, g.finish_step = t, step
                waiting.clear()
                self.timer.record_idle()
                dt = 0.0
            else:
                dt = self.timer.step(new, pairs, kvr, copied, logits, decode_pairs)
            t += dt
            est.append(dt)
            used_tokens = reserved = 0
            finished = []
            for g, own in stepped:
                if own:
                    g.generated += 1
                    if g.generated == 1 and g.first_token_s is None:
                        g.first_token_s, g.first_token_step = t, step
                    if g.generated == g.G:
                        g.finish_s, g.finish_step = t, step
                if g.local >= g.traj.steps:
                    finished.append(g)
            for g in running:
                if g.held:
                    own = min(g.P + g.generated, g.processed)
                    used_tokens += own
                    # the part of the headroom this request's own later tokens will fill (the vLLM paper's
                    # "reservation"); the rest of allocated − used is never filled ("internal fragmentation")
                    final = min(g.P + g.G, g.run_P + g.run_G - 1)
                    reserved += max(0, min(g.held, final * self.kv_token) - own * self.kv_token)
            allocated = sum(g.held for g in running)
            internal = allocated - used_tokens * self.kv_token - reserved
            if self.trace_requests:
                for g in list(running) + list(waiting):
                    progress_rows.append((step, g.req.id, g.generated, g.processed,
                                          FINISHED if g in finished else g.status))
            for g in finished:
                self._free_all(g, step)
                g.status = FINISHED
                running.remove(g)
            running = [g for g in running if g.status == RUNNING]
            rows.append((step, t, n_live, len(stepped), 0, 0, allocated, used_tokens * self.kv_token, dt, new,
                         allocated + spike, reserved, internal, copied, preempted))
            step += 1
            if bar is not None and not by_step:
                bar(pending)
        steps = np.array(rows, dtype=STEP_TABLE) if rows else np.zeros(0, dtype=STEP_TABLE)
        self.timer.official(np.asarray(est))
        prog = np.array(progress_rows, dtype=PROGRESS) if progress_rows else np.zeros(0, dtype=PROGRESS)
        return groups, steps, prog

    def _make_room(self, g: Seat, grow: int, held_total: int, running: list, waiting: deque, t: float, step: int):
        """The request's next step needs ``grow`` more bytes than the device has left (``on_oom``): ``preempt``
        frees the most recently admitted requests holding memory until it fits (they restart from scratch
        later: recompute), ``wait`` skips its step, ``reject`` drops it. Returns the bytes then held, the
        requests preempted and whether the request steps now."""
        if self.cfg.on_oom == "preempt":
            preempted = 0
            victim = _last_admitted(running, g)
            while victim is not None and held_total + grow > self.budget:
                held_total -= victim.held
                self._free_all(victim, step)
                victim.local = victim.processed = victim.generated = 0
                victim.preemptions += 1
                preempted += 1
                running.remove(victim)
                waiting.appendleft(victim)
                victim = _last_admitted(running, g)
            return held_total, preempted, held_total + grow <= self.budget
        if self.cfg.on_oom == "wait":
            return held_total, 0, False
        held_total -= g.held
        self._free_all(g, step)
        g.status = REJECTED
        g.finish_s, g.finish_step = t, step
        return held_total, 0, False

    def _admit(self, waiting: deque, running: list, used_now: int) -> list[Group]:
        out = []
        if self.scheduler == "sequential":
            limit = 1
        elif self.scheduler == "static":
            if running or not waiting:
                return out
            batch = [waiting[i] for i in range(min(self.static_batch, len(waiting)))]
            P = max(g.P for g in batch)
            G = max(g.G for g in batch)
            for g in batch:
                g.run_P, g.run_G = P, G
            limit = len(batch)
        else:
            limit = self.cfg.max_num_seqs
        while waiting and len(running) < limit:
            g = waiting[0]
            if g.traj is None:
                g.traj = self._trajectory(g.run_P, g.run_G)
                g.buffer_base = self.next_buffer
                if g.traj is not None:
                    self.next_buffer += int(g.traj.rows["buffer"].max(initial=-1)) + 1
            if g.traj is None:  # can never run on this device
                waiting.popleft()
                g.status = REJECTED
                g.finish_s, g.finish_step = g.added_s, g.added_step
                continue
            if running and used_now + int(g.traj.peak[0]) > self.budget:
                break
            waiting.popleft()
            running.append(g)
            out.append(g)
            used_now += int(g.traj.allocated[0])
        return out


def _last_admitted(running: list, g: Group) -> Group | None:
    """Preemption's victim: the most recently admitted running request, other than ``g``, holding memory."""
    return max((v for v in running if v.status == RUNNING and v.held and v is not g), key=lambda v: v.order,
               default=None)

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

:meth:`ContiguousServing.run` conducts the step loop: arrivals, admission (``_admit``), one
local step per running request (``_step_running``: ``_make_room`` when its memory does not
fit, ``_local_step`` for its ledger rows and cost terms), every request IGNORED when nothing
can step (``_ignore_all``), the step's time, sampling (``_sample``), the step's bytes
(``_accounting``) and freeing what finished (``_retire``).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from simkv.errors import ConfigError, PolicyError
from simkv.ledger import ALLOC, COPY, FREE, ROW, Ledger
from simkv.limits import MAX_SERVING_LEDGER_ROWS
from simkv.serving.engine.costing import Work as StepWork
from simkv.serving.engine.core import PROGRESS, STEP_TABLE, session_prompts
from simkv.serving.sched.group import FINISHED, IGNORED, REJECTED, RUNNING, Group


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
        self.work, self._per_layer = request_work(model, precision, policy)
        self.kv_token = self.work.kv_token
        self.timer = self.work.timer(model, device, weights_bytes)
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
        """Serve every request, one engine step at a time; returns the requests (:class:`Seat`), the step
        table and, with ``trace_requests``, every present request's progress per step."""
        self.start()
        self.advance()
        return self.finish()

    # -- the loop in parts: a router (simkv.serving.router) adds requests while the engine runs ----

    def start(self, *, prompts: list[int] | None = None) -> None:
        """Set up a run over ``self.requests`` (a router starts with none and gives each with :meth:`add`,
        with the prompt the whole trace gives it)."""
        reqs = self.requests
        self.by_step = bool(reqs) and reqs[0].arrival_step is not None
        self.prompts = session_prompts(reqs) if prompts is None else list(prompts)
        self.groups: list = []
        self.waiting: deque = deque()
        self.running: list[Group] = []
        self.pending = 0
        self.t, self.step = 0.0, 0
        self.rows, self.progress_rows, self.est = [], [], []
        self.admitted_order = 0

    def add(self, req, prompt: int, tokens=None) -> None:
        """A request routed here (arrivals in seconds, in order): it arrives at the first step starting at or
        after its arrival, as if it had been in ``requests`` from the start."""
        self.requests.append(req)
        self.prompts.append(prompt)

    def advance(self, limit: float = float("inf")) -> None:
        """Take every step that starts before ``limit`` seconds (all of them: to the end)."""
        reqs = self.requests
        by_step, prompts = self.by_step, self.prompts
        waiting, rows, progress_rows, est = self.waiting, self.rows, self.progress_rows, self.est
        bar = self.progress
        while self.pending < len(reqs) or waiting or self.running:
            t, step, pending, running = self.t, self.step, self.pending, self.running
            if step >= self.max_steps:
                raise ConfigError(f"stopped after {self.max_steps:,} steps (raise max_steps)")
            if not by_step and not running and not waiting and reqs[pending].arrival_s > t:
                t = reqs[pending].arrival_s  # an idle device jumps to the next arrival
            if t >= limit:
                break
            arrived = self._arrivals(pending, prompts, by_step, t, step)
            self.groups += arrived
            waiting += arrived
            pending += len(arrived)
            used_now = sum(g.held for g in running)
            for g in self._admit(waiting, running, used_now):
                self.admitted_order += 1
                g.order = self.admitted_order
            stepped, work, spike, preempted = self._step_running(running, waiting, t, step)
            n_live = len(running) + len(waiting)
            if not stepped:
                self._ignore_all(running, waiting, t, step)
                self.timer.record_idle()
                dt = 0.0
            else:
                dt = self.timer.step(*work)
            t += dt
            est.append(dt)
            finished = _sample(stepped, t, step)
            allocated, used, reserved, internal = self._accounting(running)
            if self.trace_requests:
                progress_rows += [(step, g.req.id, g.generated, g.processed, FINISHED if g in finished else g.status)
                                  for g in list(running) + list(waiting)]
            self.running = self._retire(finished, running, step)
            rows.append((step, t, n_live, len(stepped), 0, 0, allocated, used, dt, work.new, allocated + spike,
                         reserved, internal, work.copied, preempted, 0, 0))
            self.t, self.step, self.pending = t, step + 1, pending
            if bar is not None and not by_step:
                bar(pending)

    def finish(self):
        """The run's results after :meth:`advance` to its end (as :meth:`run` returns them)."""
        rows = self.rows
        steps = np.array(rows, dtype=STEP_TABLE) if rows else np.zeros(0, dtype=STEP_TABLE)
        self.timer.official(np.asarray(self.est))
        prog = (np.array(self.progress_rows, dtype=PROGRESS) if self.progress_rows
                else np.zeros(0, dtype=PROGRESS))
        return self.groups, steps, prog

    def _arrivals(self, pending: int, prompts: list[int], by_step: bool, t: float, step: int) -> list[Seat]:
        """The requests that have arrived by this step (``arrival_step``) or by its start (``arrival_s``)."""
        reqs = self.requests
        out = []
        while pending < len(reqs) and (reqs[pending].arrival_step <= step if by_step else reqs[pending].arrival_s <= t):
            r = reqs[pending]
            g = Seat(r, pending, prompts[pending])
            g.added_s = r.arrival_s if r.arrival_s is not None else t
            g.added_step = step
            out.append(g)
            pending += 1
        return out

    # -- one engine step --------------------------------------------------------------------------

    def _step_running(self, running: list, waiting: deque, t: float, step: int):
        """One local step per running request, in admission order, once its memory fits the device (else
        :meth:`_make_room`). Returns the requests that stepped, each with whether it samples a token of its
        own, the forward pass's :class:`Work`, the step's transient spike above the bytes held, and the
        requests preempted."""
        new = pairs = kvr = logits = copied = decode_pairs = 0
        preempted = 0
        held_total = sum(g.held for g in running)
        spike = 0
        stepped = []
        budget = self.budget
        for g in list(running):
            # A request preempted earlier in this loop is back in the waiting queue, its status still
            # RUNNING: it must not step (it would allocate memory the step's accounting never sees).
            if g.status != RUNNING or (preempted and g not in running):
                continue
            traj, l = g.traj, g.local
            after, peak = int(traj.allocated[l]), int(traj.peak[l])
            # What the step needs once this request has stepped, as its row counts it (allocated + the largest
            # spike): the bytes then held, and the larger of its own spike and one already taken in this step
            # (a request's old buffers beside its new ones). Checking its own spike alone let a step's peak pass
            # the device when an earlier request's spike was the larger.
            grow = after - g.held + max(spike, peak - after)
            if held_total + grow > budget:
                held_total, freed, fits = self._make_room(g, grow, held_total, running, waiting, t, step)
                preempted += freed
                if not fits:
                    continue
            spike = max(spike, peak - after)
            held_total += after - g.held
            g.held = after
            tokens, attended, seen, own = self._local_step(g, step)
            new += tokens
            pairs += attended
            if tokens == 1:  # a one-token query (simkv.cost: decode_pairs)
                decode_pairs += attended
            kvr += seen  # tokens read
            copied += int(traj.copy[l])
            if own:
                logits += 1
            stepped.append((g, own))
        return stepped, Work(new, pairs, kvr, copied, logits, decode_pairs), spike, preempted

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

    def _local_step(self, g: Seat, step: int) -> tuple[int, int, int, bool]:
        """The request's next local step, on this engine step: its ledger rows, and it advances. Returns what the
        forward pass computes for it: its tokens (the prompt, then one), the pairs they attend, the KV tokens
        read, and whether it samples a token of its own (a static batch pads shorter answers to the longest)."""
        l = g.local
        self._emit(g.traj.rows_of(l), g, step)
        tokens = g.run_P if l == 0 else 1
        ctx = 0 if l == 0 else g.run_P + l - 1
        attended, seen = self.work.seq(ctx, tokens)
        g.local = l + 1
        g.processed = g.run_P + l
        return tokens, attended, seen, g.generated < g.G

    def _ignore_all(self, running: list, waiting: deque, t: float, step: int) -> None:
        """Nothing could step (every running request waits for memory only a step could free, or nothing can
        be admitted): nothing will ever change, so, as GenAI does when a step schedules nothing, every present
        request is IGNORED and its memory freed."""
        for g in list(running) + list(waiting):
            if g.status == RUNNING:
                self._free_all(g, step)
                g.status = IGNORED
                g.finish_s, g.finish_step = t, step
        waiting.clear()

    def _accounting(self, running: list) -> tuple[int, int, int, int]:
        """The step's KV bytes, after it: allocated, used (the requests' tokens), reserved (the headroom their
        own later tokens will fill: the vLLM paper's "reservation") and internal (the rest of allocated − used,
        never filled: "internal fragmentation")."""
        if self._per_layer is not None:
            return self._accounting_per_layer(running)
        used_tokens = reserved = 0
        for g in running:
            if g.held:
                own = min(g.P + g.generated, g.processed)
                used_tokens += own
                final = min(g.P + g.G, g.run_P + g.run_G - 1)
                reserved += max(0, min(g.held, final * self.kv_token) - own * self.kv_token)
        allocated = sum(g.held for g in running)
        internal = allocated - used_tokens * self.kv_token - reserved
        return allocated, used_tokens * self.kv_token, reserved, internal

    def _accounting_per_layer(self, running: list) -> tuple[int, int, int, int]:
        """:meth:`_accounting` for a model whose layers differ: a request's tokens cost what its runtime keeps of
        them per layer (a window's part where the policy keeps one, a linear layer's state once)."""
        used = reserved = 0
        of = self._used_of
        for g in running:
            if g.held:
                own = of(min(g.P + g.generated, g.processed))
                used += own
                final = min(g.P + g.G, g.run_P + g.run_G - 1)
                reserved += max(0, min(g.held, of(final)) - own)
        allocated = sum(g.held for g in running)
        return allocated, used, reserved, allocated - used - reserved

    def _used_of(self, tokens: int) -> int:
        """Bytes a request of ``tokens`` tokens holds of its own (per layer: its kept tokens; states once)."""
        if tokens <= 0:
            return 0
        per_token, state = self._per_layer
        return sum(b * (tokens if kept is None else min(tokens, kept)) for b, kept in per_token) + state

    def _retire(self, finished: list, running: list, step: int) -> list:
        """Free the requests that ran their last local step; returns those still running."""
        for g in finished:
            self._free_all(g, step)
            g.status = FINISHED
            running.remove(g)
        return [g for g in running if g.status == RUNNING]

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


def request_work(model, precision, policy):
    """What a request's steps compute (:class:`simkv.serving.engine.costing.Work`, ``StepWork`` here) and, for a model whose layers
    differ, its bytes per layer: ((bytes per token, tokens kept or None) per attention layer, state bytes).

    A model whose layers are all alike keeps its former rule: the precision's bytes per token and the model's
    window caps the attention cost. Otherwise each layer as the policy's runtime stores it (its MLA form,
    metadata and state element sizes, simkv.kvspec), and a layer's window caps its cost and its bytes only where
    the policy keeps just the window (``kept_tokens``; OpenVINO's stateful caches keep every token and attend
    to all of them under a mask, docs/DESIGN.md §4c)."""
    from simkv.kvspec import state_bytes, token_bytes

    layers = model.kv_layers
    if not model.layer_kv or (model.uniform and layers[0].caches_tokens and layers[0].latent is None
                              and layers[0].kind != "chunked"):
        window = layers[0].window or 0
        return StepWork(((model.layers, precision.kv_bytes_per_token(model) // model.layers, window,
                      "sliding" if window else "full"),), model.layers), None
    meta, mla = policy.meta_bytes_per_head(precision), policy.mla_form
    conv_el, rec_el = policy.state_element_bytes(precision)
    classes: dict[tuple, int] = {}
    per_token, state = [], 0
    for layer in layers:
        if layer.caches_tokens:
            b = token_bytes((layer,), precision, meta_per_head=meta, mla=mla)
            kept = policy.kept_tokens(layer)
            per_token.append((b, kept))
            key = (b, layer.window, layer.kind) if kept is not None and layer.window else (b, 0, "full")
            classes[key] = classes.get(key, 0) + 1
        elif layer.kind == "linear":
            state += sum(state_bytes(layer, conv_el, rec_el))
    work = StepWork(tuple((n, b, w, kind) for (b, w, kind), n in classes.items()), model.layers, state)
    return work, (tuple(per_token), state)


class Work(NamedTuple):
    """What one engine step's forward pass computes, in :meth:`StepTimer.step`'s order."""

    new: int
    pairs: int
    kv_read: int
    copied: int
    logits: int
    decode_pairs: int


def _last_admitted(running: list, g: Group) -> Group | None:
    """Preemption's victim: the most recently admitted running request holding memory, admitted after ``g`` (as
    GenAI's victim, never the target itself or an earlier group): one not yet stepped in this step, as the steps
    go in admission order."""
    return max((v for v in running if v.status == RUNNING and v.held and v.order > g.order), key=lambda v: v.order,
               default=None)


def _sample(stepped: list, t: float, step: int) -> list:
    """A token sampled by each request that stepped and samples its own (its first: the time to first token;
    its last: its latency ends); returns those that ran their last local step (their buffers still held)."""
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
    return finished

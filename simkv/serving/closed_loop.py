"""Closed-loop load (``simkv run --concurrency C``): C clients, each sending its next request when its previous one
has ended, as serving benchmarks drive a server (docs/research/latency-facts.md §1).

The protocol is that of InferenceX's ``benchmark_serving.py`` (``--max-concurrency C --request-rate inf``), the
client of the measured vLLM rows (and of vLLM's own ``vllm bench serve --max-concurrency``): every request is a task
created at once, each waiting on ``asyncio.Semaphore(C)``; asyncio wakes a semaphore's waiters first in, first out,
so

* requests 0 … C − 1 are sent at t = 0;
* at the j-th completion (j = 1, 2, …), request C + j − 1 is sent — the next in order, whichever client finished.
  Completions in the same step release the next requests in the order of the requests that completed (their index
  order; all at the same time, so only which request goes first in the queue depends on it).

A completion is a request that ended: its last token sampled (FINISHED), or ended without one (IGNORED, REJECTED:
the client receives its error and moves on, as ``benchmark_serving`` counts a failed request and releases the
semaphore). Nothing is sent after N requests.

When the next request arrives: the engine's step that sampled the last token ends at t; the engine core starts its
next step at once (vLLM's ``EngineCore`` loop: schedule → execute → update → outputs to the front end, then the next
step's schedule), while the response travels to the client and the next request back through the HTTP server and
its tokenizer. So the next request joins no earlier than the step after the one that starts at t: it arrives at
the smallest time after t (``nextafter(t, inf)``), which the engine's rule — a request joins the first step that
starts at or after its arrival — places exactly there. The client's round trip itself is not modelled beyond that
(no source gives it; docs/research/latency-facts.md §3).

With vLLM's ``--async-scheduling`` (``EngineCore.step_with_batch_queue``, a queue of two batches) the engine
schedules the step after next while the next one runs, before the step that ended at t has even returned its
outputs: the next request then misses one more step, ``lag = 2`` steps in flight instead of 1. It still counts its
latency from t (``Request.sent_s``). An engine with nothing in flight takes a sent request at once.

**A drained warm-up** (``warmup`` W > 0: aiperf's protocol, AIConfigurator's generated benchmark ``aiperf profile
--concurrency C --warmup-request-count 2C``; docs/research/latency-facts.md §1). aiperf 0.3.0 runs its credit phases
one after the other (``CreditIssuingStrategy._execute_phases``, aiperf/timing/credit_issuing_strategy.py): it issues
the warm-up phase's W credits through ``RequestRateStrategy``'s ``asyncio.Semaphore(C)`` (concurrency-burst mode: no
sleep between credits), then awaits ``_wait_for_phase_completion`` — every warm-up credit returned — before the
profiling phase starts and issues its first C credits at once. So:

* requests 0 … min(C, W) − 1 are sent at t = 0; each completion sends the next warm-up request while any is left;
* no profiling request is sent before the last warm-up request has ended: at that completion (time t) requests
  W … W + C − 1 are all sent, in order; from then on, as above (one sent per completion).

A worker returns its credit only after the whole streamed response was received (``Worker._process_credit_drop_internal``,
aiperf/workers/worker.py), as ``benchmark_serving`` releases its semaphore.
"""

from __future__ import annotations

import math
from dataclasses import replace

from simkv.errors import ConfigError
from simkv.serving.requests import Request


class ClosedLoop:
    """The clients of a closed-loop run over ``requests`` (sent in their order, whatever arrival they carry)."""

    def __init__(self, requests: list[Request], concurrency: int, tokens: list | None = None, lag: int = 1,
                 warmup: int = 0) -> None:
        check_closed_loop(requests, concurrency)
        if lag not in (1, 2):
            raise ConfigError(f"a closed loop's lag is 1 step in flight, or 2 with async scheduling; got {lag!r}")
        if not isinstance(warmup, int) or isinstance(warmup, bool) or not 0 <= warmup <= len(requests):
            raise ConfigError(f"a closed loop's warm-up is 0 to {len(requests)} requests (those it sends first); "
                              f"got {warmup!r}")
        #: The first ``warmup`` requests are a warm-up phase that drains before the others are sent (aiperf).
        self.warmup = warmup
        #: Requests that have ended so far.
        self.ended = 0
        self.requests = requests
        self.concurrency = concurrency
        #: Steps in flight a sent request waits for (1; 2 under vLLM's async scheduling): see the module docstring.
        self.lag = lag
        #: Each request's prompt token ids (prefix caching: simkv.serving.engine.core.prompt_token_ids of the whole
        #: list, whose shared prefixes are numbered in request order); None without prefix caching.
        self.tokens = tokens
        #: Requests sent so far (the first ``concurrency`` at t = 0, no more than the warm-up where there is one).
        self.sent = min(concurrency, warmup or len(requests))

    def first(self) -> list[Request]:
        """The requests the C clients send at t = 0."""
        return [replace(r, arrival_s=0.0, arrival_step=None) for r in self.requests[: self.sent]]

    def completed(self, t: float) -> list[tuple[Request, list | None]]:
        """A request ended at ``t`` seconds: the requests sent then (arriving at ``nextafter(t, inf)``), each with
        its prompt token ids (None without prefix caching) — one, or none when every request was sent or the
        warm-up is still draining, or C at once when this was the warm-up's last."""
        self.ended += 1
        n = 1  # the next request (of the warm-up, or after it)
        if self.warmup and self.sent == self.warmup:  # warm-up all sent: the profiling phase waits for it to drain
            n = self.concurrency if self.ended == self.warmup else 0
        first, self.sent = self.sent, min(self.sent + n, len(self.requests))
        arrival = math.nextafter(t, math.inf)
        return [(replace(self.requests[i], arrival_s=arrival, arrival_step=None),
                 self.tokens[i] if self.tokens is not None else None) for i in range(first, self.sent)]


def check_closed_loop(requests: list[Request], concurrency: int) -> None:
    """Refuse what a closed loop cannot drive (one line each): a concurrency below 1, sessions (a turn's prompt
    holds an earlier turn's reply: the order of a conversation, not a pool of clients), beam search and samples
    (one sequence per request, as the benchmark clients send)."""
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise ConfigError(f"--concurrency must be a positive integer, got {concurrency!r}")
    for r in requests:
        if r.session:
            raise ConfigError(f"--concurrency: request {r.id} belongs to session {r.session!r}; a closed loop sends "
                              "independent requests (drop the session column, or replay the trace by its arrivals)")
        if r.samples > 1 or r.beam > 1:
            raise ConfigError(f"--concurrency: request {r.id} asks for {max(r.samples, r.beam)} sequences; a closed "
                              "loop sends one sequence per request")

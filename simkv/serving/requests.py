"""Serving workloads: a list of requests, from a trace file or drawn at random.

A :class:`Request` arrives at ``arrival_s`` seconds (simulated time) or just
before engine step ``arrival_step`` (as a program that calls ``add_request``
and then ``step()`` would), asks for ``max_new_tokens`` after a prompt of
``prompt`` tokens, and optionally carries:

* ``session`` — multi-turn chat: the turn's prompt is the session's history
  (the previous turn's prompt and answer) followed by ``prompt`` new tokens;
* ``prefix_id`` + ``prefix_tokens`` — a shared system prompt: the first
  ``prefix_tokens`` tokens are the same for every request with that id;
* ``samples`` — n parallel samples (multinomial ``num_return_sequences``);
* ``beam`` — beam width (beam search);
* ``token_ids`` — explicit prompt token ids (prefix caching hashes ids; a
  real pipeline replaying the workload must use the same ids);
* ``priority`` — an integer, lower served first, read only by ``--scheduler vllm
  --scheduling-policy priority`` (vLLM's ``priority`` argument of ``add_request``; default 0).

Files (:func:`load_trace`):

* the Azure LLM inference trace 2023 CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``;
  arrival = seconds since the first timestamp);
* our CSV or JSONL: ``id`` (optional, default the row number), ``arrival`` (seconds)
  or ``arrival_step``, ``prompt``, ``max_new_tokens``, and the optional columns above
  (``token_ids`` in CSV: space-separated integers).

Every problem with a file is a :class:`~simkv.errors.ConfigError` naming the
row: missing columns, non-positive lengths, unsorted arrivals, an empty file.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import numpy as np

from simkv.shipped import trace_path
from simkv.errors import ConfigError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
#: Bound on the requests of one run (the Azure traces hold < 30,000; one hour of the conversation
#: trace simulates in tens of seconds): more is refused with one line instead of running for hours.
MAX_REQUESTS = 200_000


def _too_many(p) -> ConfigError:
    return ConfigError(f"{p} has more than {MAX_REQUESTS:,} requests; use --limit N (at most {MAX_REQUESTS:,})")


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    prompt: int
    max_new_tokens: int
    arrival_s: float | None = None
    arrival_step: int | None = None
    session: str | None = None
    prefix_id: str | None = None
    prefix_tokens: int = 0
    samples: int = 1
    beam: int = 1
    token_ids: tuple[int, ...] | None = field(default=None, repr=False)
    priority: int = 0
    #: When the client sent it, where that is before it reaches the engine (``arrival_s``): a closed loop's request
    #: sent as another ended and scheduled only after the steps already in flight (simkv.serving.closed_loop).
    #: Latencies count from it. None: at its arrival.
    sent_s: float | None = None

    @property
    def sent(self) -> float | None:
        """When the request was sent: ``sent_s``, else its arrival (seconds; None for arrivals in steps)."""
        return self.sent_s if self.sent_s is not None else self.arrival_s

    def __post_init__(self) -> None:
        if self.prompt <= 0:
            raise ConfigError(f"request {self.id}: prompt must be positive, got {self.prompt}")
        if self.max_new_tokens <= 0:
            raise ConfigError(f"request {self.id}: max_new_tokens must be positive, got {self.max_new_tokens}")
        if (self.arrival_s is None) == (self.arrival_step is None):
            raise ConfigError(f"request {self.id}: give exactly one of arrival (seconds) and arrival_step")
        if self.arrival_s is not None and not (self.arrival_s >= 0 and np.isfinite(self.arrival_s)):
            raise ConfigError(f"request {self.id}: arrival must be a non-negative number of seconds")
        if self.arrival_step is not None and self.arrival_step < 0:
            raise ConfigError(f"request {self.id}: arrival_step must be >= 0")
        if self.samples < 1 or self.beam < 1:
            raise ConfigError(f"request {self.id}: samples and beam must be >= 1")
        if self.samples > 1 and self.beam > 1:
            raise ConfigError(f"request {self.id}: give samples or beam, not both")
        if self.prefix_tokens < 0 or (self.prefix_tokens and not self.prefix_id):
            raise ConfigError(f"request {self.id}: prefix_tokens needs a prefix_id and must be >= 0")
        if self.prefix_tokens > self.prompt:
            raise ConfigError(f"request {self.id}: prefix_tokens ({self.prefix_tokens}) exceeds the prompt ({self.prompt})")
        if self.token_ids is not None and len(self.token_ids) != self.prompt:
            raise ConfigError(f"request {self.id}: {len(self.token_ids)} token_ids for a {self.prompt}-token prompt")

    @property
    def sequences(self) -> int:
        """Sequences generated in parallel (samples or beams)."""
        return max(self.samples, self.beam)


def check_workload(requests: list[Request], max_context: int | None = None) -> list[Request]:
    """Reject an empty list, mixed or unsorted arrivals, duplicate ids, and (given ``max_context``) a prompt at or
    above the context (:func:`over_context`; serving rejects such requests one by one unless asked to be strict)."""
    if not requests:
        raise ConfigError("the workload has no requests")
    by_step = requests[0].arrival_step is not None
    prev = -1.0
    seen = set()
    for r in requests:
        if (r.arrival_step is not None) != by_step:
            raise ConfigError(f"request {r.id}: mix of arrival and arrival_step; use one for every request")
        t = r.arrival_step if by_step else r.arrival_s
        if t < prev:
            raise ConfigError(f"request {r.id}: arrivals are not sorted ({t} after {prev})")
        prev = t
        if r.id in seen:
            raise ConfigError(f"request id {r.id} appears twice")
        seen.add(r.id)
    for i in over_context(requests, max_context)[:1]:
        r = requests[i]
        raise ConfigError(f"request {r.id}: prompt of {r.prompt:,} tokens is at or above the model's context of "
                          f"{max_context:,}: no token can follow it (raise it with --max-context)")
    return requests


def over_context(requests: list[Request], max_context: int | None) -> list[int]:
    """The positions of the requests whose prompt is at or above the context (``max_context``; None or 0: no
    limit): no token of theirs can be generated. A chat turn (``session``) is not checked: its prompt holds the
    history the engine adds."""
    if not max_context:
        return []
    return [i for i, r in enumerate(requests) if r.session is None and r.prompt >= max_context]


# -- files -----------------------------------------------------------------------------------------


def load_trace(path: str | Path, limit: int | None = None) -> list[Request]:
    """Requests from an Azure trace CSV, our CSV or our JSONL (by content, not by name); a shipped trace by its name
    (simkv.shipped.TRACES: ``azure-conv``, ``azure-code``)."""
    p = trace_path(path)
    if not p.is_file():
        raise ConfigError(f"no such trace file: {p}")
    with p.open(newline="", encoding="utf-8") as fh:
        head = fh.readline().strip()
        if not head:
            raise ConfigError(f"trace {p} is empty")
        fh.seek(0)
        if head.startswith("{"):
            requests = _load_jsonl(fh, p, limit)
        else:
            reader = csv.DictReader(fh)
            cols = set(reader.fieldnames or ())
            if set(AZURE_COLUMNS) <= cols:
                requests = _load_azure(reader, p, limit)
            else:
                requests = _load_rows(reader, p, limit, csv_ids=True)
    if not requests:
        raise ConfigError(f"trace {p} has no requests")
    return check_workload(requests)


def _load_azure(reader: csv.DictReader, p: Path, limit: int | None) -> list[Request]:
    out: list[Request] = []
    t0 = None
    for i, row in enumerate(reader):
        if limit is not None and i >= limit:
            break
        if i >= MAX_REQUESTS:
            raise _too_many(p)
        line = i + 2
        try:
            ts = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26])
            prompt, gen = int(row["ContextTokens"]), int(row["GeneratedTokens"])
        except (ValueError, TypeError, AttributeError):
            raise ConfigError(f"{p}:{line}: cannot read TIMESTAMP/ContextTokens/GeneratedTokens") from None
        t0 = ts if t0 is None else t0
        arrival = (ts - t0).total_seconds()
        if arrival < 0:
            raise ConfigError(f"{p}:{line}: timestamps are not sorted")
        if prompt <= 0 or gen <= 0:
            raise ConfigError(f"{p}:{line}: ContextTokens and GeneratedTokens must be positive")
        out.append(Request(i, prompt, gen, arrival_s=arrival))
    return out


_INT = ("arrival_step", "prompt", "max_new_tokens", "prefix_tokens", "samples", "beam", "priority")


def _request_from(row: dict, p: Path, line: int, default_id: int) -> Request:
    missing = [c for c in ("prompt", "max_new_tokens") if row.get(c) in (None, "")]
    if row.get("arrival") in (None, "") and row.get("arrival_step") in (None, ""):
        missing.append("arrival or arrival_step")
    if missing:
        raise ConfigError(f"{p}:{line}: missing {', '.join(missing)} (columns: id, arrival|arrival_step, prompt, "
                          "max_new_tokens[, session, prefix_id, prefix_tokens, samples, beam, token_ids, priority])")
    kw: dict = {}
    try:
        for k in _INT:
            if row.get(k) not in (None, ""):
                v = row[k]
                if isinstance(v, float) and not v.is_integer() or isinstance(v, bool):
                    raise ValueError
                kw[k] = int(v)
        if row.get("arrival") not in (None, ""):
            kw["arrival_s"] = float(row["arrival"])
        ids = row.get("token_ids")
        if ids not in (None, ""):
            kw["token_ids"] = tuple(int(x) for x in (ids.split() if isinstance(ids, str) else ids))
        rid = int(row["id"]) if row.get("id") not in (None, "") else default_id
    except (ValueError, TypeError):
        raise ConfigError(f"{p}:{line}: a value that should be a number is not") from None
    for k in ("session", "prefix_id"):
        if row.get(k) not in (None, ""):
            kw[k] = str(row[k])
    try:
        return Request(rid, **kw)
    except ConfigError as err:
        raise ConfigError(f"{p}:{line}: {err}") from None


def _load_rows(reader, p: Path, limit: int | None, csv_ids: bool) -> list[Request]:
    cols = set(reader.fieldnames or ())
    if not cols & {"prompt"}:
        raise ConfigError(f"{p}: not a trace: expected columns {', '.join(AZURE_COLUMNS)} (Azure) or "
                          "id, arrival|arrival_step, prompt, max_new_tokens")
    out = []
    for i, row in enumerate(reader):
        if limit is not None and i >= limit:
            break
        if i >= MAX_REQUESTS:
            raise _too_many(p)
        out.append(_request_from(row, p, i + 2, i))
    return out


def _load_jsonl(fh, p: Path, limit: int | None) -> list[Request]:
    out = []
    for i, text in enumerate(fh):
        if limit is not None and len(out) >= limit:
            break
        if len(out) >= MAX_REQUESTS:
            raise _too_many(p)
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError:
            raise ConfigError(f"{p}:{i + 1}: not a JSON object") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{p}:{i + 1}: not a JSON object")
        out.append(_request_from(row, p, i + 1, len(out)))
    return out


def write_trace(requests: list[Request], path: str | Path) -> None:
    """Our CSV format (round-trips through :func:`load_trace`)."""
    cols = ["id", "arrival", "arrival_step", "prompt", "max_new_tokens", "session", "prefix_id", "prefix_tokens",
            "samples", "beam", "token_ids", "priority"]
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in requests:
            w.writerow([r.id, "" if r.arrival_s is None else repr(r.arrival_s), "" if r.arrival_step is None else r.arrival_step,
                        r.prompt, r.max_new_tokens, r.session or "", r.prefix_id or "", r.prefix_tokens or "",
                        r.samples, r.beam, " ".join(map(str, r.token_ids)) if r.token_ids else "", r.priority])


# -- synthetic ---------------------------------------------------------------------------------------

DISTRIBUTIONS = ("fixed", "uniform", "lognormal", "trace")


def _draw(spec: str, n: int, rng: np.random.Generator, what: str, column: str) -> np.ndarray:
    """``fixed:N``, ``uniform:LO:HI``, ``lognormal:MEAN:SIGMA`` (mean of the tokens, sigma of the log),
    ``trace:PATH`` (resampled from a trace's prompts or outputs)."""
    kind, _, rest = spec.partition(":")
    args = rest.split(":") if rest else []
    try:
        if kind == "fixed" and len(args) == 1:
            out = np.full(n, int(args[0]))
        elif kind == "uniform" and len(args) == 2:
            lo, hi = int(args[0]), int(args[1])
            if lo > hi:
                raise ValueError
            out = rng.integers(lo, hi + 1, n)
        elif kind == "lognormal" and len(args) == 2:
            mean, sigma = float(args[0]), float(args[1])
            if mean <= 0 or sigma < 0:
                raise ValueError
            out = np.maximum(1, np.rint(rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n))).astype(np.int64)
        elif kind == "trace" and rest:
            pool = np.array([getattr(r, column) for r in load_trace(rest)])
            out = rng.choice(pool, n)
        else:
            raise ValueError
    except ValueError:
        raise ConfigError(f"bad {what} distribution {spec!r}; use fixed:N, uniform:LO:HI, lognormal:MEAN:SIGMA "
                          "or trace:PATH") from None
    if (out <= 0).any():
        raise ConfigError(f"{what} distribution {spec!r} gives non-positive lengths")
    return out.astype(np.int64)


def synthetic(
    requests: int,
    rate: float,
    prompt_dist: str = "fixed:512",
    output_dist: str = "fixed:128",
    *,
    arrivals: str = "poisson",
    seed: int = 0,
    max_prompt: int | None = None,
) -> list[Request]:
    """``requests`` requests arriving at ``rate`` per second (Poisson or fixed-rate), lengths drawn
    from the given distributions with a seeded generator (same seed, same workload); prompts are
    clipped to ``max_prompt`` (the model's context less one) when given."""
    if requests <= 0 or requests > MAX_REQUESTS:
        raise ConfigError(f"--requests must be in 1..{MAX_REQUESTS}, got {requests}")
    if not rate > 0 or not np.isfinite(rate):
        raise ConfigError(f"--rate must be a positive number of requests per second, got {rate}")
    if arrivals not in ("poisson", "fixed"):
        raise ConfigError(f"arrivals must be poisson or fixed, got {arrivals!r}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / rate, requests) if arrivals == "poisson" else np.full(requests, 1 / rate)
    times = np.cumsum(gaps) - gaps[0]
    prompts = _draw(prompt_dist, requests, rng, "prompt", "prompt")
    if max_prompt:
        prompts = np.minimum(prompts, max_prompt)
    outputs = _draw(output_dist, requests, rng, "output", "max_new_tokens")
    return [Request(i, int(p), int(o), arrival_s=float(t)) for i, (t, p, o) in enumerate(zip(times, prompts, outputs))]


def with_steps(requests: list[Request], steps: list[int]) -> list[Request]:
    return [replace(r, arrival_s=None, arrival_step=s) for r, s in zip(requests, steps)]

"""Sweeps: a parameter grid × workloads → one row per point, stored as Parquet, resumable.

A *point* is the plain values :func:`simkv.build_scenario` takes (``model``,
``prompt``, ``decode``, …, ``policy`` and its ``policy_options``). Running it
gives a *row*: every scenario field (as ``simkv run --json`` reports it, policy
options as ``policy.<name>`` columns), the metrics of ``simkv run --json`` and
two more the tuner optimises (``spike_p99_bytes``: 99th percentile of the
in-step spike over steps; ``mean_waste_bytes``: allocated − used, averaged over
steps). ``point_id`` (a hash of the point's values) lets a rerun with the same
``--out`` skip the points already stored.

Executors (:func:`executor`): in this process (``workers=1``), local processes
(``concurrent.futures``, the default), or a Dask cluster (``dask.distributed``,
given a scheduler address). The simulator is deterministic and rows are stored
in point order, so every executor writes the same file.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from simkv.errors import ConfigError

#: Scenario values a point may set (build_scenario's keywords) and their types.
SCENARIO_FIELDS: dict[str, type] = {
    "model": str, "layers": int, "heads": int, "kv_heads": int, "head_dim": int, "precision": str,
    "prompt": int, "decode": int, "turns": int, "turn_tokens": int, "turn_decode": int, "beam": int,
    "turn_divergence": int, "ops": str, "device_memory": str, "weights_memory": str, "weights_precision": str,
    "sliding_window": int, "device": str,
}
#: Most points one sweep (or one tuner grid) may have.
MAX_POINTS = 100_000
#: Seconds between rewrites of the output file while a sweep runs (an interruption loses at most this much).
FLUSH_SECONDS = 2.0
#: How long to wait for a Dask scheduler before giving up.
CONNECT_TIMEOUT = "10s"


# --- describing points ---------------------------------------------------------------------------


def point_id(point: dict) -> str:
    """A stable hash of a point's values (JSON with sorted keys)."""
    text = json.dumps(point, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _policy_fields(policy: str) -> dict:
    import dataclasses

    from policies import REGISTRY

    if policy not in REGISTRY:
        raise ConfigError(f"unknown policy {policy!r}; choose one of {', '.join(REGISTRY)}")
    return {f.name: f for f in dataclasses.fields(REGISTRY[policy])}


def _number(text: str, kind: type, key: str):
    if kind is bool:
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return lowered in ("1", "true", "yes", "on")
    else:
        with contextlib.suppress(ValueError):
            return kind(text)
    raise ConfigError(f"--param {key}: {text!r} is not a valid {kind.__name__}")


def param_kind(key: str, policy: str) -> type:
    """The type of a sweepable key: a policy option's or a scenario field's."""
    fields = _policy_fields(policy)
    if key in fields:
        default = fields[key].default
        return type(default) if default is not None else int
    if key in SCENARIO_FIELDS:
        return SCENARIO_FIELDS[key]
    raise ConfigError(f"--param {key}: not an option of policy {policy} ({', '.join(fields)}) "
                      f"nor a scenario field ({', '.join(SCENARIO_FIELDS)})")


def parse_param(spec: str, policy: str, kinds: dict[str, type] | None = None) -> tuple[str, list]:
    """``KEY=START:STOP:STEP`` (STOP included when on the grid) or ``KEY=V1,V2,…`` → (key, values).

    ``kinds`` (key → type) replaces the policy's options and the scenario fields as the keys allowed."""
    key, sep, text = spec.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key or not text.strip():
        raise ConfigError(f"--param expects KEY=START:STOP:STEP or KEY=V1,V2,..., got {spec!r}")
    if kinds is not None and key not in kinds:
        raise ConfigError(f"--param {key}: not one of {', '.join(kinds)}")
    kind = kinds[key] if kinds is not None else param_kind(key, policy)
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3 or kind not in (int, float):
            raise ConfigError(f"--param {key}: a range is START:STOP:STEP of numbers, got {text!r}")
        try:
            start, stop, step = (Decimal(p) for p in parts)
        except InvalidOperation:
            raise ConfigError(f"--param {key}: {text!r} is not START:STOP:STEP") from None
        if step <= 0 or stop < start:
            raise ConfigError(f"--param {key}: need STEP > 0 and STOP >= START, got {text!r}")
        count = int((stop - start) / step) + 1
        if count > MAX_POINTS:
            raise ConfigError(f"--param {key}: {count:,} values, more than {MAX_POINTS:,}")
        values = [start + i * step for i in range(count)]
        if kind is int:
            if any(v != int(v) for v in values):
                raise ConfigError(f"--param {key} takes whole numbers, got {text!r}")
            return key, [int(v) for v in values]
        return key, [float(v) for v in values]
    items = [t.strip() for t in text.split(",")]
    if any(not t for t in items):
        raise ConfigError(f"--param {key}: empty value in {text!r}")
    if kind is str:
        return key, items
    return key, [_number(t, kind, key) for t in items]


def grid(specs: Iterable[str], policy: str) -> list[dict]:
    """Every combination of the ``--param`` values, in order (last key varies fastest)."""
    parsed = [parse_param(s, policy) for s in specs]
    keys = [k for k, _ in parsed]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"--param given twice for {sorted(k for k in keys if keys.count(k) > 1)[0]}")
    total = int(np.prod([len(v) for _, v in parsed], dtype=float)) if parsed else 1
    if total > MAX_POINTS:
        raise ConfigError(f"the grid has {total:,} points, more than {MAX_POINTS:,}")
    return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in parsed))]


def make_point(base: dict, overrides: dict) -> dict:
    """``base`` (scenario values + ``policy`` + ``policy_options``) with some values replaced."""
    point = {k: v for k, v in base.items() if k != "policy_options"}
    options = dict(base.get("policy_options") or {})
    scenario_keys = set(SCENARIO_FIELDS)
    for key, value in overrides.items():
        if key in scenario_keys:
            point[key] = value
        else:
            options[key] = value
    point["policy_options"] = dict(sorted(options.items()))
    return point


def scenario_of(point: dict):
    from simkv.scenario import build_scenario

    return build_scenario(**point)


# --- running one point ---------------------------------------------------------------------------


def run_point(point: dict) -> dict:
    """Simulate one point and return its row (module-level, so processes and Dask workers can run it)."""
    from simkv.scenario import simulate

    result = simulate(scenario_of(point))
    return row_of(point, result)


def row_of(point: dict, result) -> dict:
    summary = result.summary()
    scenario = summary.pop("scenario")
    options = scenario.pop("policy_options")
    row: dict = {"point_id": point_id(point)}
    for key in SCENARIO_FIELDS:  # what was asked (None: the default / the model's)
        row[key] = point.get(key)
    row.update({k: v for k, v in scenario.items() if k not in row or row[k] is None})
    row["policy"] = scenario["policy"]
    row.update({f"policy.{k}": v for k, v in options.items()})
    row.update(summary)
    steps = result.steps
    spikes = steps["peak"] - steps["steady"]
    row["spike_p99_bytes"] = int(np.percentile(spikes, 99, method="higher"))
    row["mean_waste_bytes"] = int(round(float((steps["allocated"] - steps["used"]).mean())))
    return row


# --- executors -----------------------------------------------------------------------------------


@dataclass
class Executor:
    """Runs a function over items and yields ``(index, result)`` as each finishes."""

    kind: str  # "inline" | "processes" | "dask"
    workers: int = 1
    _pool: object = field(default=None, repr=False)

    def map_unordered(self, fn: Callable, items: list) -> Iterator[tuple[int, object]]:
        if self.kind == "inline" or len(items) <= 1:
            for i, item in enumerate(items):
                yield i, fn(item)
        elif self.kind == "processes":
            from concurrent.futures import as_completed

            futures = {self._pool.submit(fn, item): i for i, item in enumerate(items)}
            try:
                for fut in as_completed(futures):
                    yield futures[fut], fut.result()
            finally:
                for fut in futures:
                    fut.cancel()
        else:
            from distributed import as_completed

            futures = self._pool.map(fn, items, pure=False)
            index = {fut.key: i for i, fut in enumerate(futures)}
            try:
                for fut in as_completed(futures):
                    yield index[fut.key], fut.result()
            finally:
                self._pool.cancel(futures)


@contextlib.contextmanager
def executor(workers: int | None = None, scheduler: str | None = None) -> Iterator[Executor]:
    """In this process (``workers=1``), local processes (default: one per core) or Dask at ``scheduler``."""
    if scheduler:
        try:
            from distributed import Client
        except ImportError:
            raise ConfigError("--scheduler needs dask.distributed: pip install 'simkv[lab]'") from None
        try:
            client = Client(scheduler, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError, ValueError) as err:
            raise ConfigError(f"cannot reach the Dask scheduler {scheduler}: {err}") from None
        try:
            yield Executor("dask", len(client.scheduler_info().get("workers", {})), client)
        finally:
            client.close()
        return
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    if workers == 1:
        yield Executor("inline", 1)
        return
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield Executor("processes", workers, pool)


# --- the store and the sweep ---------------------------------------------------------------------


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a sweep file (empty if it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises its own types for a file that is not Parquet
        raise ConfigError(f"{path} is not a readable Parquet file: {str(err).splitlines()[0]}") from None


def write_rows(path: str | Path, rows: list[dict]) -> None:
    """Write rows atomically (a temporary file renamed over ``path``); columns in first-seen order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    columns: dict[str, list] = {}
    for row in rows:
        for key in row:
            columns.setdefault(key, [])
    for row in rows:
        for key, values in columns.items():
            values.append(row.get(key))
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.table(columns), tmp)
    os.replace(tmp, path)


@dataclass
class SweepResult:
    rows: list[dict]  # one row per point, in point order (a repeated point repeats its row)
    computed: int
    skipped: int


def run_sweep(points: list[dict], out: str | Path | None = None, *, workers: int | None = None,
              scheduler: str | None = None, progress: bool = True, pool: Executor | None = None) -> SweepResult:
    """Run every point not already in ``out``; store all rows there (rewritten every few seconds).

    ``pool`` reuses an open :func:`executor` (the tuner runs many small sweeps).
    """
    if len(points) > MAX_POINTS:
        raise ConfigError(f"{len(points):,} points, more than {MAX_POINTS:,}")
    ids = [point_id(p) for p in points]
    for i in {pid: i for i, pid in enumerate(ids)}.values():  # a bad combination fails before any work, as one line
        try:
            scenario_of(points[i])
        except ConfigError as err:
            raise ConfigError(f"point {_brief(points[i])}: {err}") from None
    stored = read_rows(out) if out else []
    done = {r["point_id"]: r for r in stored if r.get("point_id") in set(ids)}
    others = [r for r in stored if r.get("point_id") not in done]
    todo = [i for i, pid in enumerate(ids) if pid not in done]
    # Duplicated points (same values) run once.
    first = {}
    for i in todo:
        first.setdefault(ids[i], i)
    unique = sorted(first.values())

    def ordered() -> list[dict]:  # what the file holds: each point once, in point order
        return [done[pid] for pid in dict.fromkeys(ids) if pid in done]

    last_flush = time.monotonic()
    bar = None
    if progress and unique:
        from tqdm import tqdm

        bar = tqdm(total=len(unique), desc="sweep", unit="point", disable=None)  # None: only on a terminal
    try:
        with (contextlib.nullcontext(pool) if pool else executor(workers, scheduler)) as ex:
            for j, row in ex.map_unordered(run_point, [points[i] for i in unique]):
                done[ids[unique[j]]] = row
                if bar:
                    bar.update()
                if out and time.monotonic() - last_flush > FLUSH_SECONDS:
                    write_rows(out, others + ordered())
                    last_flush = time.monotonic()
    finally:
        if bar:
            bar.close()
        if out and unique:
            write_rows(out, others + ordered())
    return SweepResult([done[pid] for pid in ids], computed=len(unique), skipped=len(points) - len(todo))


def _brief(point: dict) -> str:
    shown = {k: v for k, v in point.items() if v is not None and k != "policy_options"}
    shown.update(point.get("policy_options") or {})
    return ", ".join(f"{k}={v}" for k, v in shown.items())


__all__ = ["MAX_POINTS", "SCENARIO_FIELDS", "Executor", "SweepResult", "executor", "grid", "make_point",
           "parse_param", "point_id", "read_rows", "row_of", "run_point", "run_sweep", "write_rows"]

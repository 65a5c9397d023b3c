"""Shared helpers: tiny scenarios that run in milliseconds."""

from __future__ import annotations

import os

import numpy as np
import pytest

from simkv import build_scenario, simulate
from simkv.ledger import OPS, TENSORS


@pytest.fixture()
def kept_environ():
    """The process environment restored after the test: a Dask ``LocalCluster``'s nanny sets
    ``MALLOC_TRIM_THRESHOLD_`` in it, and later tests (the validators' clean runs) read the environment."""
    environ = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(environ)


@pytest.fixture()
def planned_runs(monkeypatch):
    """Every run of steps the serving engine plans (simkv.serving.engine.planned_run.plan's non-None results), in
    order: a test of the fast path checks that it planned runs there (else its comparison with the reference
    would prove nothing)."""
    from simkv.serving.engine import planned_run

    runs = []
    plan = planned_run.plan

    def spy(eng, live, pending):
        out = plan(eng, live, pending)
        if out is not None:
            runs.append(out)
        return out

    monkeypatch.setattr(planned_run, "plan", spy)
    return runs


def run(engine: str = "fast", **kwargs):
    kwargs.setdefault("model", None)
    return simulate(build_scenario(**kwargs), engine=engine)


def rows_of(result, *, op=None, tensor=None, layer=None, step=None):
    """Ledger rows as plain tuples (step, layer, tensor, op, bytes, capacity, used, buffer)."""
    r = result.ledger.rows
    mask = np.ones(len(r), dtype=bool)
    if op is not None:
        mask &= r["op"] == OPS.index(op)
    if tensor is not None:
        mask &= r["tensor"] == TENSORS.index(tensor)
    if layer is not None:
        mask &= r["layer"] == layer
    if step is not None:
        mask &= r["step"] == step
    sel = r[mask]
    return [
        (int(s), int(la), TENSORS[t], OPS[o], int(b), int(c), int(u), int(buf))
        for s, la, t, o, b, c, u, buf in zip(
            sel["step"], sel["layer"], sel["tensor"], sel["op"], sel["bytes"],
            sel["capacity_tokens"], sel["used_tokens"], sel["buffer"],
        )
    ]


def assert_same_run(a, b):
    """Two results with identical ledgers and step tables (the fast = reference contract)."""
    assert len(a.ledger) == len(b.ledger)
    if not a.ledger == b.ledger:
        first = int(np.flatnonzero(a.ledger.rows != b.ledger.rows)[0])
        pytest.fail(f"ledgers differ first at row {first}: {a.ledger.rows[first]} vs {b.ledger.rows[first]}")
    if not np.array_equal(a.steps, b.steps):
        first = int(np.flatnonzero(a.steps != b.steps)[0])
        pytest.fail(f"step tables differ first at step {first}: {a.steps[first]} vs {b.steps[first]}")
    assert (a.oom is None) == (b.oom is None)

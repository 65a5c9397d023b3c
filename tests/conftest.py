"""Shared helpers: tiny scenarios that run in milliseconds."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from hypothesis import strategies as st

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


#: What :func:`workloads` draws from: decode runs, chat turns, resets, beam search, reorders, trims.
OP_KINDS = ("decode", "decode", "turn", "reset", "beam", "reorder", "trim")


@st.composite
def workloads(draw, kinds=OP_KINDS, prompt=300, turn=200, decode=400):
    """A valid ``--ops`` text: a prompt then up to 7 operations of ``kinds`` (a beam forks, then selects;
    a trim keeps at least one token of one sequence; a reset is followed by a new prompt)."""
    first = draw(st.integers(1, prompt))
    ops, width, stored = [f"prefill:{first}"], 1, first
    for _ in range(draw(st.integers(0, 7))):
        kind = draw(st.sampled_from(kinds))
        if kind == "decode":
            n = draw(st.integers(1, decode))
            ops.append(f"decode:{n}")
            stored += n
        elif kind == "turn":
            n = draw(st.integers(1, turn))
            ops.append(f"prefill:{n}")
            stored += n
        elif kind == "reset":
            stored = draw(st.integers(1, prompt))
            ops += ["reset", f"prefill:{stored}"]
            width = 1
        elif kind == "beam" and width == 1:
            width = draw(st.integers(2, 4))
            ops.append(f"fork:{width}")
            stored += 1
        elif kind == "beam":
            ops.append(f"select:{draw(st.integers(0, width - 1))}")
            width, stored = 1, stored + 1
        elif kind == "trim" and width == 1 and stored > 1:  # GenAI's chat-history trim (cut back, then go on)
            n = draw(st.integers(1, stored - 1))
            ops.append(f"trim:{n}")
            stored -= n
        elif kind in ("reorder", "beam", "trim") and "reorder" in kinds:
            ops.append("reorder")
            stored += 1
    if draw(st.booleans()):
        ops.append("reset")
    return ",".join(ops)


def default_sigint() -> None:
    """``preexec_fn`` for a subprocess a test interrupts as a user's Ctrl-C would: SIGINT at its default in the
    child. A suite started in the background (``pytest &`` from a non-interactive shell) runs with SIGINT ignored,
    its children inherit that, and Python then never raises KeyboardInterrupt: the interrupt tests' runs went on to
    their end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


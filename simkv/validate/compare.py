"""Compare a real run with the simulator's prediction, event by event and step by step.

Pure logic (numpy only, no runtime), so it is unit-tested without one. The OpenVINO CPU runner
(:mod:`simkv.validate.openvino.runner`) and the transformers runner call :func:`compare`; the GenAI
runner uses the event alignment alone. It is one module of ~700 lines on purpose: every figure it
produces (matched events, slopes, in-step peaks, VmSize, latency) is read off the same aligned steps
against the same baseline and the same comparability bounds, and the sections below follow that
order. :mod:`simkv.validate.openvino.runner` feeds it three things:

* the KV events the real plugin made (memray run; :mod:`.openvino.observe`): every allocation
  and free of K/V data, scale/zero-point buffers, beam tables and the model-wide f32
  ``past_view`` block, in stream order, with the operation index ``seq``;
* the per-operation process measurements of a *clean* run (no tracker, started with
  ``MALLOC_MMAP_THRESHOLD_``): RSS, VmSize, VmHWM, latency;
* the simulator's :class:`simkv.Result` for the same scenario (policy ``openvino-cpu``,
  the *effective* KV precision, the model's dimensions).

Steps: the simulator's ``step`` counts every operation, ``reset`` included, so it is
the observer's ``seq``; that is the ``step`` of every record produced here.

What is compared (docs/DESIGN.md §3 says why each quantity behaves as it does):

* **Events.** Per step, the observed and predicted sequences of ``(op, tensor,
  layer, bytes)`` are aligned in order (longest common subsequence): *matched*,
  *missing* (predicted, not observed) or *unexpected* (observed, not predicted).
  Copies are not observable and are not compared.
* **Baseline.** Predicted absolute memory = baseline + predicted KV. The baseline is
  the non-KV memory of the process, measured once: ``RSS - predicted resident`` (and
  ``VmSize - predicted allocated``) at the first decode step after the first prompt
  (step 1 in a plain run), when the prompt's activations and the decode kernels
  exist. Everything the process gains later that the simulator does not model shows
  up as drift of the timeline, not hidden in the baseline.
* **Resident slope.** Over *quiet* decode stretches (consecutive decode steps with
  no KV event other than the past view, same batch), the per-token slope of the
  measured RSS and of the predicted ``resident``, fitted with one common slope and
  one intercept per stretch; only stretches of at least ``min_tokens`` steps count
  (else the longest one of at least 8 steps).
* **In-step rise.** At every reallocation step ``s``, the measured increase inside the
  step, ``VmHWM(s) - RSS(s - 1)`` (the high-water mark is reset just before the step),
  against the predicted one, ``resident_peak(s) - resident(s - 1)``: one error per
  step, reported as a distribution (median, worst).  Nothing predicted enters the
  measured side.
* **Absolute RSS.** At every step, measured RSS against baseline + predicted
  ``resident`` with the one baseline above; the final step and the worst step are
  reported, as a share of the predicted RSS and of the predicted KV.
* **Comparability.** glibc serves a buffer smaller than ``MALLOC_MMAP_THRESHOLD_``
  from its heap: writing it may not raise RSS (recycled resident memory) and freeing it
  does not lower RSS.  From the predicted ledger each memory figure gets a *heap
  bound*: the KV bytes it involves that lie in such buffers (a rise: the small buffers
  allocated or freed in the step; a slope: the share of each token's bytes written into
  small buffers, plus a page per live buffer; absolute RSS: every small KV buffer
  allocated so far).  A figure whose bound
  exceeds ``COMPARABLE_BOUND_PCT`` of what it compares is marked not comparable (its
  error is ``None``, with the reason) instead of printing a number that says nothing
  about the simulator: on small models that is most of them.
* **VmSize.** At every step with predicted (re)allocations, the VmSize change vs the
  change of predicted ``allocated`` (address space, past view included), and the
  VmSize slope over the quiet stretches.
* **Latency.** Per step, with the reallocation steps (KV buffers replaced: growth or
  batch rebuild; ``realloc`` in the step records) marked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .child import DEFAULT_MMAP_THRESHOLD

__all__ = [
    "EventKey",
    "STATUSES",
    "align",
    "align_events",
    "predicted_events",
    "quiet_stretches",
    "common_slope",
    "slope_comparison",
    "choose_baseline",
    "heap_bounds",
    "compare",
    "recompare",
    "summary_lines",
]

STATUSES = ("matched", "missing", "unexpected")

#: A memory figure is compared only when KV buffers glibc keeps in its heap can move it
#: by at most this share of the compared quantity (module docstring, "Comparability").
COMPARABLE_BOUND_PCT = 5.0
PAGE = 4096
#: A rise or a stretch's KV growth below this is not compared: glibc serves even a buffer
#: above MALLOC_MMAP_THRESHOLD_ from a free heap chunk when one fits (a step's freed
#: activations), and then writing it raises no RSS. Measured: the rises of 137-555 KB of
#: a 2-layer GPT-2 export came out -100 % to +101 % (docs/results/validation.md).
MIN_COMPARED_BYTES = 1 << 20
#: Steps that run a prompt (or a chat turn) through the model: their activations are big.
PROMPT_PHASES = ("prefill", "turn")

#: ``(op, tensor, layer, bytes)``; ``layer`` is None for the model-wide past view.
EventKey = tuple


# --------------------------------------------------------------------------- events


def predicted_events(result) -> list[dict]:
    """The simulator ledger's allocations and frees (copies dropped), as event dicts.

    Layer ``-1`` (a model-wide buffer, the past view) becomes ``None`` as in the observer.
    """
    from simkv.ledger import OPS, TENSORS

    rows = result.ledger.rows
    keep = rows["op"] != OPS.index("copy")
    rows = rows[keep]
    tensors = np.asarray(TENSORS, dtype=object)[rows["tensor"]]
    ops = np.asarray(OPS, dtype=object)[rows["op"]]
    return [
        {"step": int(s), "layer": None if la < 0 else int(la), "tensor": t, "op": o, "bytes": int(b)}
        for s, la, t, o, b in zip(rows["step"].tolist(), rows["layer"].tolist(), tensors, ops, rows["bytes"].tolist())
    ]


def _key(e: dict) -> EventKey:
    return (e["op"], e["tensor"], e["layer"], e["bytes"])


def align(observed: Sequence[EventKey], predicted: Sequence[EventKey]) -> list[tuple[str, EventKey]]:
    """Align two ordered event sequences of one step.

    Returns ``(status, key)`` pairs in order: a longest common subsequence is
    *matched*; the rest of the predicted sequence is *missing*, the rest of the
    observed one *unexpected*, each placed where it occurs.
    """
    obs, pred = list(observed), list(predicted)
    if obs == pred:
        return [("matched", k) for k in obs]
    # Trim the common prefix and suffix, then an LCS table on what differs.
    head = 0
    while head < len(obs) and head < len(pred) and obs[head] == pred[head]:
        head += 1
    tail = 0
    while tail < len(obs) - head and tail < len(pred) - head and obs[-1 - tail] == pred[-1 - tail]:
        tail += 1
    o, p = obs[head : len(obs) - tail], pred[head : len(pred) - tail]
    n, m = len(o), len(p)
    if n * m > 4_000_000:  # pathological: fall back to difflib's (near-LCS) matching
        import difflib

        middle: list[tuple[str, EventKey]] = []
        sm = difflib.SequenceMatcher(a=o, b=p, autojunk=False)
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag == "equal":
                middle += [("matched", k) for k in o[i1:i2]]
            else:
                middle += [("missing", k) for k in p[j1:j2]] + [("unexpected", k) for k in o[i1:i2]]
    else:
        lcs = [[0] * (m + 1) for _ in range(n + 1)]
        for i in range(n - 1, -1, -1):
            row, below = lcs[i], lcs[i + 1]
            oi = o[i]
            for j in range(m - 1, -1, -1):
                row[j] = below[j + 1] + 1 if oi == p[j] else max(below[j], row[j + 1])
        middle = []
        i = j = 0
        while i < n and j < m:
            if o[i] == p[j]:
                middle.append(("matched", o[i]))
                i += 1
                j += 1
            elif lcs[i + 1][j] >= lcs[i][j + 1]:
                middle.append(("unexpected", o[i]))
                i += 1
            else:
                middle.append(("missing", p[j]))
                j += 1
        middle += [("unexpected", k) for k in o[i:]] + [("missing", k) for k in p[j:]]
    return (
        [("matched", k) for k in obs[:head]]
        + middle
        + [("matched", k) for k in obs[len(obs) - tail :]]
    )


def align_events(observed: Iterable[dict], predicted: Iterable[dict]) -> list[dict]:
    """Align observed and predicted events step by step (dicts with step, layer, tensor,
    op, bytes); returns the aligned list with a ``status`` each, ordered by step."""
    by_obs: dict[int, list[EventKey]] = {}
    by_pred: dict[int, list[EventKey]] = {}
    for e in observed:
        by_obs.setdefault(int(e["step"]), []).append(_key(e))
    for e in predicted:
        by_pred.setdefault(int(e["step"]), []).append(_key(e))
    out: list[dict] = []
    for step in sorted(set(by_obs) | set(by_pred)):
        for status, (op, tensor, layer, nbytes) in align(by_obs.get(step, []), by_pred.get(step, [])):
            out.append({"step": step, "layer": layer, "tensor": tensor, "op": op, "bytes": nbytes, "status": status})
    return out


# --------------------------------------------------------------------------- slopes


@dataclass(frozen=True)
class Stretch:
    start: int  # first step (inclusive)
    end: int  # last step (inclusive)

    @property
    def steps(self) -> int:
        return self.end - self.start + 1


def quiet_stretches(phases: Sequence[str], batches: Sequence[int], event_steps: Iterable[int]) -> list[Stretch]:
    """Maximal runs of consecutive decode steps with the same batch and no KV event
    (other than the past view) at any of their steps; ``event_steps`` lists the steps
    that have such an event, predicted or observed."""
    busy = set(int(s) for s in event_steps)
    out: list[Stretch] = []
    start = None
    for i, phase in enumerate(phases):
        quiet = phase == "decode" and i not in busy and (start is None or batches[i] == batches[start])
        if quiet and start is None:
            start = i
        elif not quiet and start is not None:
            out.append(Stretch(start, i - 1))
            start = i if (phase == "decode" and i not in busy) else None
    if start is not None:
        out.append(Stretch(start, len(phases) - 1))
    return out


def common_slope(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> float:
    """Least-squares slope shared by several segments, each with its own intercept
    (the fixed-effects estimator: deviations from each segment's mean, pooled)."""
    num = den = 0.0
    for x, y in zip(xs, ys):
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if len(x) < 2:
            continue
        dx = x - x.mean()
        num += float(dx @ (y - y.mean()))
        den += float(dx @ dx)
    return num / den if den else math.nan


def _pct(measured: float, predicted: float) -> float | None:
    if predicted == 0 or not math.isfinite(measured) or not math.isfinite(predicted):
        return None
    return 100.0 * (measured - predicted) / predicted


def slope_comparison(
    x: np.ndarray,
    measured: np.ndarray,
    predicted: np.ndarray,
    stretches: Sequence[Stretch],
    min_tokens: int,
) -> dict:
    """Common per-token slope of ``measured`` and ``predicted`` over the stretches of
    at least ``min_tokens`` steps (else the longest of at least 8 steps).

    ``x`` is the stored token rows (tokens × batch) per step."""
    used = [s for s in stretches if s.steps >= min_tokens]
    rule = f">= {min_tokens} steps"
    if not used:
        longest = max(stretches, key=lambda s: s.steps, default=None)
        if longest is not None and longest.steps >= 8:
            used, rule = [longest], f"longest stretch (none has {min_tokens} steps)"
    per = []
    for s in stretches:
        sl = slice(s.start, s.end + 1)
        m = common_slope([x[sl]], [measured[sl]])
        p = common_slope([x[sl]], [predicted[sl]])
        per.append({"start": s.start, "end": s.end, "steps": s.steps, "measured": _num(m), "predicted": _num(p),
                    "error_pct": _num(_pct(m, p)), "used": s in used})
    if not used:
        return {"measured": None, "predicted": None, "error_pct": None, "rule": rule, "tokens": 0, "stretches": per}
    sls = [slice(s.start, s.end + 1) for s in used]
    m = common_slope([x[s] for s in sls], [measured[s] for s in sls])
    p = common_slope([x[s] for s in sls], [predicted[s] for s in sls])
    return {"measured": _num(m), "predicted": _num(p), "error_pct": _num(_pct(m, p)), "rule": rule,
            "tokens": int(sum(s.steps for s in used)), "stretches": per}


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


# --------------------------------------------------------------------------- baseline


def choose_baseline(phases: Sequence[str]) -> int:
    """The reference step of the baseline: the first decode step after the first
    prompt (the prompt's activations and the decode kernels exist by then), else the
    last step."""
    for i, phase in enumerate(phases):
        if i > 0 and phase == "decode":
            return i
    return len(phases) - 1


# --------------------------------------------------------------------------- comparability


def heap_bounds(result, mmap_threshold: int) -> dict[str, np.ndarray]:
    """Per step, from the predicted ledger: the bytes of K/V/scale/beam buffers below
    ``mmap_threshold`` allocated in the step (``small_alloc_bytes``), allocated or freed
    in it (``small_step_bytes``: a freed heap chunk may or may not go back to the
    system), allocated so far (``small_cum_bytes``), and, after the step, the bytes per token of live buffers,
    in small buffers and in all (``small_row_bytes``, ``row_bytes``).  The past view is
    never written, so it never adds RSS and is left out."""
    from simkv.ledger import ALLOC, COPY, FREE, TENSOR_CODE

    n = len(result.steps)
    rows = result.ledger.rows
    rows = rows[(rows["tensor"] != TENSOR_CODE["past_view"]) & (rows["op"] != COPY)]
    small = rows["bytes"] < mmap_threshold
    per_row = rows["bytes"] // np.maximum(rows["capacity_tokens"], 1)
    sign = np.where(rows["op"] == ALLOC, 1, np.where(rows["op"] == FREE, -1, 0))
    step = rows["step"]

    def by_step(values: np.ndarray) -> np.ndarray:
        out = np.zeros(n, dtype=np.int64)
        np.add.at(out, step, values)
        return out

    alloc_small = by_step(np.where((sign > 0) & small, rows["bytes"], 0))
    freed_small = by_step(np.where((sign < 0) & small, rows["bytes"], 0))
    return {"small_alloc_bytes": alloc_small, "small_cum_bytes": np.cumsum(alloc_small),
            "small_step_bytes": alloc_small + freed_small,
            "small_row_bytes": np.cumsum(by_step(sign * per_row * small)),
            "row_bytes": np.cumsum(by_step(sign * per_row))}


def _slope_bound(slope: dict, heap: dict[str, np.ndarray], buffers: int) -> float:
    """Largest share (%), over the stretches the slope was fitted on, of what the
    stretch's KV growth can be off by: the bytes written into small (heap) buffers,
    plus one 4 KiB page for each of the ``buffers`` live buffers (RSS counts whole
    pages; a short stretch of a small model grows by only a few pages)."""
    shares = []
    for s in slope["stretches"]:
        row = heap["row_bytes"][s["start"]]
        if s["used"] and row > 0:
            growth = row * s["steps"]
            if growth < MIN_COMPARED_BYTES:
                return math.inf
            shares.append(100.0 * (heap["small_row_bytes"][s["start"]] * s["steps"] + PAGE * buffers) / growth)
    return max(shares, default=0.0)


# --------------------------------------------------------------------------- compare


def compare(
    observed_events: Sequence[dict],
    samples: Sequence[dict] | None,
    result,
    *,
    min_tokens: int = 500,
    mmap_threshold: int = DEFAULT_MMAP_THRESHOLD,
) -> dict:
    """Everything ``simkv validate`` reports, as one JSON-ready dict (see the module
    docstring). ``observed_events``: dicts with ``step`` (= seq), ``layer``, ``tensor``,
    ``op``, ``bytes``; ``samples``: the clean run's per-operation dicts (``seq``,
    ``rss_bytes``, ``vmsize_bytes``, ``hwm_bytes``, ``latency_s``) or None."""
    from simkv.ledger import PHASES

    st = result.steps
    n = len(st)
    phases = [PHASES[p] for p in st["phase"].tolist()]
    pred_events = predicted_events(result)
    events = align_events(observed_events, pred_events)
    counts = {s: sum(1 for e in events if e["status"] == s) for s in STATUSES}

    # A reallocation step replaces KV buffers (frees old ones): growth, batch rebuild.
    realloc_steps = sorted({e["step"] for e in pred_events if e["tensor"] != "past_view" and e["op"] == "free"})
    kv_steps = {e["step"] for e in pred_events if e["tensor"] != "past_view"} | {
        int(e["step"]) for e in observed_events if e["tensor"] != "past_view"
    }
    realloc = np.zeros(n, dtype=bool)
    realloc[[s for s in realloc_steps if s < n]] = True

    out: dict = {
        "events_total": len(events),
        "events_matched": counts["matched"],
        "events_missing": counts["missing"],
        "events_unexpected": counts["unexpected"],
        "events_observed": len(observed_events),
        "events_predicted": len(pred_events),
        "rise_error_pct": None,
        "resident_slope_error_pct": None,
        "rss_error_pct": None,
    }

    alloc_peak = _alloc_peak(observed_events, result, n)
    out["alloc_peak"] = alloc_peak
    out["alloc_peak_error_pct"] = alloc_peak["error_pct"]

    steps_out = []
    if samples is None:
        for i in range(n):
            steps_out.append(_step_record(i, phases[i], None, st[i], 0, 0, bool(realloc[i])))
        out["steps"] = steps_out
        out["events"] = events
        return out

    if len(samples) != n:
        raise ValueError(f"clean run has {len(samples)} operations, the simulator {n} steps")
    rss = np.array([s["rss_bytes"] for s in samples], dtype=np.int64)
    vms = np.array([s["vmsize_bytes"] for s in samples], dtype=np.int64)
    hwm = np.array([s["hwm_bytes"] if s["hwm_bytes"] is not None else -1 for s in samples], dtype=np.int64)
    lat = np.array([s["latency_s"] for s in samples], dtype=np.float64)
    res, alloc, rpeak = (st[c].astype(np.int64) for c in ("resident", "allocated", "resident_peak"))
    rows = (st["tokens"] * st["batch"]).astype(np.int64)

    ref = choose_baseline(phases)
    base_rss = int(rss[ref] - res[ref])
    base_vms = int(vms[ref] - alloc[ref])
    out["baseline"] = {
        "step": ref,
        "rss_bytes": base_rss,
        "vmsize_bytes": base_vms,
        "how": f"measured RSS (VmSize) minus predicted KV resident (allocated) at step {ref}, the first decode "
        "step after the first prompt, in the clean run",
    }
    for i in range(n):
        steps_out.append(_step_record(i, phases[i], samples[i], st[i], base_rss, base_vms, bool(realloc[i])))

    stretches = quiet_stretches(phases, st["batch"].tolist(), kv_steps)
    slope = slope_comparison(rows, rss, res, stretches, min_tokens)
    vslope = slope_comparison(rows, vms, alloc, stretches, min_tokens)
    out["resident_slope"] = slope
    out["resident_slope_error_pct"] = slope["error_pct"]
    out["vmsize_slope"] = {k: vslope[k] for k in ("measured", "predicted", "error_pct", "rule", "tokens")}

    heap = heap_bounds(result, mmap_threshold)
    out["mmap_threshold"] = mmap_threshold
    kv_buffers = int(((result.ledger.rows["op"] == 0) & (result.ledger.rows["step"] == 0)).sum())
    bound = out["resident_slope"]["heap_bound_pct"] = _slope_bound(slope, heap, kv_buffers)
    if slope["error_pct"] is not None and bound > COMPARABLE_BOUND_PCT:
        slope["not_comparable"] = (
            f"a fitted stretch grows by less than {_mib(MIN_COMPARED_BYTES)} of KV (free heap chunks)"
            if math.isinf(bound) else
            f"the KV growth fitted can be off by {bound:.0f} % from buffers below "
            f"MALLOC_MMAP_THRESHOLD_={mmap_threshold} (glibc heap) and page rounding")
        out["resident_slope_error_pct"] = None
        if math.isinf(bound):
            out["resident_slope"]["heap_bound_pct"] = None

    rises = []
    for s in realloc_steps:
        if 0 < s < n and hwm[s] >= 0:
            measured, predicted = int(hwm[s] - rss[s - 1]), int(rpeak[s] - res[s - 1])
            bound = int(heap["small_step_bytes"][s])
            reason = None
            if phases[s] in PROMPT_PHASES:
                reason = "a prompt step: its activations (not modelled) raise VmHWM too"
            elif predicted < MIN_COMPARED_BYTES:
                reason = f"a predicted rise of {_mib(predicted)}, below {_mib(MIN_COMPARED_BYTES)} (free heap chunks)"
            elif 100.0 * bound > COMPARABLE_BOUND_PCT * predicted:
                reason = f"{_mib(bound)} of KV buffers allocated or freed in the step are below MALLOC_MMAP_THRESHOLD_"
            rises.append({"step": s, "phase": phases[s], "measured_rise_bytes": measured,
                          "predicted_rise_bytes": predicted, "heap_bound_bytes": bound, "comparable": reason is None,
                          "not_comparable": reason,
                          "error_pct": _num(_pct(measured, predicted)) if reason is None else None})
    out["rises"] = rises
    errs = [r["error_pct"] for r in rises if r["error_pct"] is not None]
    worst = max(errs, key=abs) if errs else None
    out["rise"] = {"steps": len(rises), "comparable_steps": len(errs),
                   "median_error_pct": _num(float(np.median(errs))) if errs else None, "worst_error_pct": worst,
                   "worst_step": next((r["step"] for r in rises if r["error_pct"] == worst), None) if errs else None}
    out["rise_error_pct"] = worst

    predicted_rss = base_rss + res
    dev = rss - predicted_rss
    ok = 100.0 * heap["small_cum_bytes"] <= COMPARABLE_BOUND_PCT * np.maximum(res, 1)
    # A prompt longer than the one before the baseline leaves bigger activations in RSS
    # (glibc keeps the freed heap): the one baseline no longer describes the non-KV memory.
    stored = st["tokens"].astype(np.int64)
    appended = stored - np.r_[0, stored[:-1]]
    longer = np.array([p in PROMPT_PHASES for p in phases]) & (appended > appended[0]) & (np.arange(n) > ref)
    ok &= np.cumsum(longer) == 0
    after = np.arange(n) > ref

    def rss_point(i: int) -> dict:
        return {"step": i, "measured_bytes": int(rss[i]), "predicted_bytes": int(predicted_rss[i]),
                "deviation_bytes": int(dev[i]), "heap_bound_bytes": int(heap["small_cum_bytes"][i]),
                "comparable": bool(ok[i]),
                "not_comparable": None if ok[i] else (
                    f"a prompt longer than the first ({int(appended[0])} tokens) came after the baseline"
                    if np.cumsum(longer)[i] else
                    f"{_mib(int(heap['small_cum_bytes'][i]))} of KV buffers below MALLOC_MMAP_THRESHOLD_ (glibc heap)"),
                "error_pct": _num(_pct(int(rss[i]), int(predicted_rss[i]))) if ok[i] else None,
                "kv_error_pct": _num(_pct(int(res[i] + dev[i]), int(res[i]))) if ok[i] else None}

    last = n - 1
    cand = np.flatnonzero(after & ok)
    out["rss"] = {"final": rss_point(last),
                  "worst": rss_point(int(cand[np.argmax(np.abs(dev[cand]))])) if len(cand) else None,
                  "comparable_steps": int(len(cand)), "steps_after_baseline": int(after.sum())}
    out["rss_error_pct"] = out["rss"]["final"]["error_pct"]
    out["final_resident"] = {
        "step": last, "measured_kv_bytes": int(rss[last] - base_rss), "predicted_kv_bytes": int(res[last]),
        "error_pct": out["rss"]["final"]["kv_error_pct"],
    }

    vsteps = []
    for s in realloc_steps:
        if 0 < s < n:
            vsteps.append({"step": s, "measured_delta_bytes": int(vms[s] - vms[s - 1]),
                           "predicted_delta_bytes": int(alloc[s] - alloc[s - 1])})
    out["vmsize_steps"] = vsteps
    tot_m = sum(v["measured_delta_bytes"] for v in vsteps)
    tot_p = sum(v["predicted_delta_bytes"] for v in vsteps)
    out["vmsize_step_error_pct"] = _num(_pct(tot_m, tot_p)) if vsteps else None

    decode = np.array([p == "decode" for p in phases]) & ~realloc
    median = float(np.median(lat[decode])) if decode.any() else float(np.median(lat))
    rl = [{"step": s, "latency_ms": float(lat[s] * 1e3), "x_median": float(lat[s] / median) if median else None}
          for s in realloc_steps if s < n]
    out["latency"] = {"median_decode_ms": median * 1e3, "realloc_steps": rl}

    out["steps"] = steps_out
    out["events"] = events
    return out


def _step_record(i, phase, sample, row, base_rss, base_vms, realloc) -> dict:
    rec = {
        "step": i,
        "phase": phase,
        "tokens": int(row["tokens"]),
        "batch": int(row["batch"]),
        "measured_rss_bytes": None,
        "measured_vmsize_bytes": None,
        "measured_hwm_bytes": None,
        "predicted_resident_bytes": base_rss + int(row["resident"]),
        "predicted_allocated_bytes": base_vms + int(row["allocated"]),
        "predicted_peak_bytes": base_rss + int(row["resident_peak"]),
        "predicted_kv_resident_bytes": int(row["resident"]),
        "predicted_kv_allocated_bytes": int(row["allocated"]),
        "predicted_kv_peak_bytes": int(row["resident_peak"]),
        "predicted_kv_alloc_peak_bytes": int(row["peak"]),
        "latency_ms": None,
        "realloc": realloc,
    }
    if sample is not None:
        rec["measured_rss_bytes"] = int(sample["rss_bytes"])
        rec["measured_vmsize_bytes"] = int(sample["vmsize_bytes"])
        rec["measured_hwm_bytes"] = None if sample["hwm_bytes"] is None else int(sample["hwm_bytes"])
        rec["latency_ms"] = float(sample["latency_s"]) * 1e3
    return rec


def _alloc_peak(observed_events: Sequence[dict], result, n: int) -> dict:
    """Highest live KV bytes (past view included) at any moment, observed (memray
    stream, in order) vs predicted (ledger ``peak``)."""
    live = peak = 0
    peak_step = None
    for e in observed_events:
        live += e["bytes"] if e["op"] == "alloc" else -e["bytes"]
        if live > peak:
            peak, peak_step = live, int(e["step"])
    st = result.steps
    pred = int(st["peak"].max()) if n else 0
    pred_step = int(np.flatnonzero(st["peak"] == pred)[0]) if n else None
    return {"measured_bytes": peak, "measured_step": peak_step, "predicted_bytes": pred, "predicted_step": pred_step,
            "error_pct": _num(_pct(peak, pred))}


def recompare(data: dict) -> dict:
    """Every figure of a saved ``simkv validate`` result derived again with this module's
    current rules, from what the result keeps: the observed events (matched and
    unexpected ones), the clean run's per-step measurements and the scenario (the
    prediction is simulated again). No OpenVINO run; the header fields are kept."""
    from simkv.scenario import build_scenario, simulate

    sc = data["scenario"]
    result = simulate(build_scenario(model=None, layers=sc["layers"], heads=sc["heads"], kv_heads=sc["kv_heads"],
                                     head_dim=sc["head_dim"], precision=data["effective_kv_precision"],
                                     policy="openvino-cpu", ops=sc["workload"]))
    observed = [e for e in data["events"] if e["status"] != "missing"]
    samples = None
    if data["steps"] and data["steps"][0]["measured_rss_bytes"] is not None:
        samples = [{"seq": s["step"], "rss_bytes": s["measured_rss_bytes"], "vmsize_bytes": s["measured_vmsize_bytes"],
                    "hwm_bytes": s["measured_hwm_bytes"], "latency_s": s["latency_ms"] / 1e3} for s in data["steps"]]
    fresh = compare(observed, samples, result, min_tokens=sc.get("slope_min_tokens", 500),
                    mmap_threshold=int(data.get("mmap_threshold") or data["versions"].get("MALLOC_MMAP_THRESHOLD_")
                                       or DEFAULT_MMAP_THRESHOLD))
    return {**data, **fresh}


# --------------------------------------------------------------------------- text


def _mib(b: float | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:,.2f} MiB"


def _pc(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.2f} %"


def summary_lines(data: dict) -> list[str]:
    """The human-readable report of ``simkv validate`` (from the JSON dict)."""
    sc = data.get("scenario", {})
    ok = data["events_missing"] == 0 and data["events_unexpected"] == 0
    if data.get("runtime") == "transformers":
        window = f", sliding window {sc['sliding_window']}" if sc.get("sliding_window") else ""
        runtime = f"transformers {sc.get('cache')} ({sc.get('policy')}{window}); KV {data.get('effective_kv_precision')}"
    else:
        runtime = (f"KV {data.get('effective_kv_precision')} (requested {sc.get('requested_kv_precision') or 'default'}, "
                   f"inference {sc.get('inference_precision')}); fused {data.get('fused')}")
    shape = (sc["layer_kv"] if sc.get("arch") or sc.get("config") else
             f"{sc.get('layers')} layers, {sc.get('heads')}/{sc.get('kv_heads')} heads x {sc.get('head_dim')}")
    lines = [
        f"simkv validate: {shape}; {runtime}; workload {sc.get('workload')}",
        f"  {'KV events':<22}{data['events_observed']:,} observed, {data['events_predicted']:,} predicted: "
        f"{data['events_matched']:,} matched, {data['events_missing']:,} missing, {data['events_unexpected']:,} unexpected",
    ]
    pv = data.get("past_view")  # an IR's past block, compared apart from the cache (openvino/runner.py)
    if pv:
        lines.append(f"  {'past view (not KV)':<22}{pv['observed']:,} observed, {pv['predicted']:,} predicted: "
                     f"{pv['matched']:,} matched, {pv['missing']:,} missing, {pv['unexpected']:,} unexpected "
                     f"({pv['note']})")
    ap = data.get("alloc_peak") or {}
    if ap:
        lines.append(f"  {'allocated KV peak':<22}measured {_mib(ap.get('measured_bytes'))} (memray), predicted "
                     f"{_mib(ap.get('predicted_bytes'))} ({_pc(ap.get('error_pct'))})")
    if data.get("clean_run_error"):
        lines.append(f"  {'clean run':<22}{data['clean_run_error']}: memory and latency not compared")
    b = data.get("baseline")
    if b:
        lines.append(f"  {'baseline (non-KV)':<22}RSS {_mib(b['rss_bytes'])}, VmSize {_mib(b['vmsize_bytes'])} "
                     f"(measured - predicted KV at step {b['step']})")
    sl = data.get("resident_slope")
    if sl:
        if sl["measured"] is None:
            lines.append(f"  {'resident slope':<22}n/a (no quiet decode stretch of 8+ steps)")
        else:
            verdict = (f"not comparable: {sl['not_comparable']}" if sl.get("not_comparable")
                       else _pc(sl["error_pct"]))
            lines.append(f"  {'resident slope':<22}measured {sl['measured']:,.0f} B/token, predicted "
                         f"{sl['predicted']:,.0f} ({verdict}) over {sl['tokens']:,} quiet decode steps "
                         f"({sl['rule']})")
    ri = data.get("rise")
    if ri:
        lines.append(f"  {'in-step rise':<22}{ri['comparable_steps']} of {ri['steps']} reallocation steps comparable"
                     + (f"; error median {_pc(ri['median_error_pct'])}, worst {_pc(ri['worst_error_pct'])} "
                        f"(step {ri['worst_step']})" if ri["comparable_steps"] else
                        " (prompt steps, or KV buffers in the glibc heap: see rises in the JSON)"))
    rs = data.get("rss")
    if rs:
        for label, pt in (("final RSS", rs["final"]), ("worst RSS", rs["worst"])):
            if pt is None:
                continue
            verdict = (f"{_pc(pt['error_pct'])} of predicted RSS, {_pc(pt['kv_error_pct'])} of predicted KV"
                       if pt["comparable"] else
                       f"not comparable: {_mib(pt['heap_bound_bytes'])} of KV buffers in the glibc heap")
            lines.append(f"  {label:<22}step {pt['step']}: measured {_mib(pt['measured_bytes'])}, baseline + KV "
                         f"{_mib(pt['predicted_bytes'])} ({verdict})")
    vs = data.get("vmsize_slope")
    if vs and vs.get("measured") is not None:
        lines.append(f"  {'VmSize':<22}slope {vs['measured']:,.0f} B/token vs {vs['predicted']:,.0f} predicted "
                     f"({_pc(vs['error_pct'])}); realloc-step jumps {_pc(data.get('vmsize_step_error_pct'))} in total")
    la = data.get("latency")
    if la:
        worst = max(la["realloc_steps"], key=lambda r: r["latency_ms"], default=None)
        extra = f"; slowest realloc step {worst['step']}: {worst['latency_ms']:.2f} ms ({worst['x_median']:.1f}x)" if worst and worst["x_median"] else ""
        lines.append(f"  {'latency':<22}median decode {la['median_decode_ms']:.2f} ms; {len(la['realloc_steps'])} "
                     f"realloc steps{extra}")
        if la.get("decode_error_median_pct") is not None:  # the cost model's prediction (simkv/validate/openvino/latency.py)
            lines.append(f"  {'predicted step time':<22}on {la['device']}: decode error median {la['decode_error_median_pct']:.1f} %, "
                         f"p90 {la['decode_error_p90_pct']:.1f} % over {la['steps_compared']} steps; realloc excess "
                         f"error median {'n/a' if la['realloc_excess_error_median_pct'] is None else format(la['realloc_excess_error_median_pct'], '.1f') + ' %'}")
        elif la.get("latency_note"):
            lines.append(f"  {'predicted step time':<22}{la['latency_note']}")
    inc = data.get("in_step_increase")
    if inc:
        lines.append(f"  {'in-step KV increase':<22}equal in {inc['steps_equal']:,} of {inc['steps']:,} steps; largest "
                     f"predicted at step {inc['step']}: measured {_mib(inc['measured_bytes'])}, predicted "
                     f"{_mib(inc['predicted_bytes'])}")
    v = data.get("versions", {})
    if v:
        runtimes = ", ".join(f"{k} {v[k]}" for k in ("openvino", "torch", "transformers") if v.get(k))
        lines.append(f"  {'versions':<22}{runtimes}, memray {v.get('memray')}, python "
                     f"{v.get('python')}; MALLOC_MMAP_THRESHOLD_={v.get('MALLOC_MMAP_THRESHOLD_')}")
    if data.get("elapsed_s") is not None:
        lines.append(f"  {'time':<22}{data['elapsed_s']:.1f} s")
    if not ok:
        bad = [e for e in data["events"] if e["status"] != "matched"][:8]
        lines.append("  first differences:")
        for e in bad:
            lines.append(f"    step {e['step']}: {e['status']:<10} {e['op']} {e['tensor']} layer {e['layer']} {e['bytes']:,} B")
    lines.append(f"  {'result':<22}{'PASS: every KV event matched' if ok else 'FAIL: KV events differ'}")
    return lines

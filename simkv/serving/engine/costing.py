"""Step time from :mod:`simkv.cost`, evaluated once per step inside the serving loop.

The loop needs each step's time before it schedules the next (arrivals in seconds
decide who is present), and one scalar :func:`simkv.cost.step_cost` call costs
~50 µs — seconds over a trace of 10⁵ steps. The cost model is two rooflines of
affine terms (``StepCost.terms``: weights streaming and matmul FLOPs; KV bytes and
attention FLOPs) plus an affine copy term, so :class:`StepTimer` reads the terms'
coefficients from one vectorised call on probe inputs and evaluates the rooflines
with them per step. :meth:`StepTimer.official` then evaluates ``step_cost`` on
every recorded step at once, and the run stops with an error if the two differ —
the reported times are always ``step_cost``'s own.

Tensor parallelism (``model.tp > 1``) adds one more affine term, the step's all-reduces
(:func:`simkv.cost.allreduce_s`, linear in the step's new tokens), probed like the others.

One term is not affine: a mixture of experts streams the experts its tokens are
routed to, ``E · (1 − (1 − k/E)^B)`` per MoE layer for B tokens
(:func:`simkv.cost.weights_read_bytes`). The timer evaluates that term itself,
with the powers of ``1 − k/E`` from one table, so a step's time is the same
number whether it is asked alone or in a planned run.
"""

from __future__ import annotations

import math

import numpy as np

from simkv.cost import step_cost
from simkv.cost.cudagraphs import padded_tokens
from simkv.errors import SimkvError

_ARGS = ("weights_bytes", "new_tokens", "attended_pairs", "kv_read_bytes", "kv_write_bytes", "copy_bytes", "logit_tokens",
         "decode_pairs", "graph_tokens")


def chunk_pairs(context: int, new: int, chunk: int) -> int:
    """Σ over ``new`` tokens after ``context`` of the positions each attends to under chunked local attention
    (a token at position p attends to the positions of its own chunk up to itself: ``p mod chunk + 1``)."""
    def below(n):  # Σ_{p < n} p mod chunk
        q, r = divmod(n, chunk)
        return q * (chunk * (chunk - 1) // 2) + r * (r - 1) // 2
    return below(context + new) - below(context) + new


def attended_pairs(context: int, new: int, window: int | None) -> int:
    """Σ over ``new`` tokens after ``context`` of the positions each attends to, capped by a window
    (the same sum as :func:`simkv.cost.attended_pairs`, in integers)."""
    total = new * context + new * (new + 1) // 2
    if window is not None:
        first = max(0, window - context)
        fit = min(first, new)
        over = new - fit
        if over > 0:
            start = context + fit + 1 - window
            total -= over * start + over * (over - 1) // 2
    return total


class StepTimer:
    #: The loop's per-step inputs: new tokens, attended pairs, KV tokens read, bytes copied, logit tokens,
    #: attended pairs of one-token queries.
    INPUTS = 6

    def __init__(self, model, device, weights_bytes: int, kv_token_bytes: int, *, read_unit: int | None = None,
                 pairs_div: int = 1, gemm_mix: tuple | None = None, graph_sizes: tuple[int, ...] = ()) -> None:
        """``kv_token_bytes``: KV bytes one new token writes; ``read_unit``: bytes per unit of the loop's KV-read
        input (default ``kv_token_bytes``: tokens read); ``pairs_div``: what the loop's attended pairs are
        divided by before :func:`simkv.cost.step_cost` prices them (:class:`Work`); ``graph_sizes``: the engine's
        CUDA-graph capture sizes (:func:`simkv.cost.cudagraphs.capture_sizes`; empty: no graphs, no padding) — a
        step's layers run over its new tokens padded to them (a derived seventh input, :meth:`_inputs`)."""
        self.model, self.device, self.weights = model, device, weights_bytes
        self.graph_sizes = tuple(graph_sizes)
        self.kv_token = kv_token_bytes
        self.read_unit = kv_token_bytes if read_unit is None else read_unit
        self.pairs_div = pairs_div
        #: The layers' GEMMs by peak (:func:`simkv.cost.step_cost`'s ``gemm_mix``; None: all at the device's).
        self.gemm_mix = gemm_mix
        k = len(_ARGS)
        probe = np.zeros((k + 1, k))
        probe[1:] = np.eye(k) * 1e6
        c = step_cost(model, device, gemm_mix=gemm_mix, **{a: probe[:, i] for i, a in enumerate(_ARGS)})
        self._ovh = float(c.overhead_s[0])  # the fixed part; a per-sequence part (logit tokens) is self._seq
        kvt, unit = float(kv_token_bytes), float(self.read_unit)
        div = pairs_div

        def affine(term):
            """(constant with this run's weights, coefficients of the loop's inputs) of one affine term."""
            at0 = float(term[0])
            a = [float(v) for v in (np.asarray(term[1:]) - at0) / 1e6]
            # step_cost's (weights, new, pairs, kv_read, kv_write, copy, logits, decode pairs, graph tokens) -> the
            # loop's inputs and the derived graph tokens (KV bytes written = new tokens x bytes per token; read =
            # units read x bytes per unit)
            if div == 1:
                return at0 + a[0] * weights_bytes, [a[1] + a[4] * kvt, a[2], a[3] * unit, a[5], a[6], a[7], a[8]]
            return at0 + a[0] * weights_bytes, [a[1] + a[4] * kvt, a[2] / div, a[3] * unit, a[5], a[6], a[7] / div,
                                                a[8]]

        # the weights are fixed for a run: folded into the constants
        self.terms = [affine(t) for t in c.terms]  # weights, matmul FLOPs, KV bytes, attention FLOPs
        self.copy = affine(c.copy_s)
        #: A per-sequence overhead (``Device.sequence_overhead_s``, per logit token): (0, coefficients) or None.
        ovh0, ovh_coef = affine(c.overhead_s)
        self._seq = (0.0, ovh_coef) if any(ovh_coef) else None
        #: Tensor parallelism: the all-reduces' (constant, coefficients) (None on one device: nothing added).
        self._reduce = affine(c.allreduce_s) if model.tp > 1 else None
        #: A mixture of experts: the weights term is a function of the step's tokens (None: a constant).
        self._moe = None
        if model.routed_params:
            self._moe = (float(weights_bytes), device.memory_bandwidth * device.bandwidth_efficiency,
                         1.0 - model.experts_per_token / model.experts, model.routed_params / model.weight_params,
                         model.experts)
            self._powers = np.ones(1)
            self.terms[0] = (0.0, [0.0] * (self.INPUTS + 1))
        #: A lower bound of any step's time (every coefficient is non-negative; a step that runs has a token).
        (w0, _), (mm0, _), (kv0, _), (at0, _) = self.terms
        if self._moe:
            w0 = float(self._weights_s(1))
        self.min_seconds = max(w0, mm0) + float(device.attention_time(kv0, at0)) + self.copy[0] + self._ovh
        if self._reduce:
            self.min_seconds += self._reduce[0]
        #: Whether one-token queries cost differently from others (else the loop need not count them).
        self.decode_rate_differs = any(coef[5] for _, coef in self.terms)
        # decode pairs are a part of the pairs: their coefficient may be negative, not with the pairs' added
        extra = [self._reduce] if self._reduce else []
        nonneg = [v for _, coef in self.terms + [self.copy] + extra for v in coef[:5] + coef[6:]]
        nonneg += [coef[1] + coef[5] for _, coef in self.terms + [self.copy] + extra]
        if min(nonneg) < 0 or self.min_seconds < 0:
            raise SimkvError("the cost model has a negative term")
        # each term as (constant, [(coefficient, input index) for the non-zero coefficients])
        self._nonzero = [(c0, [(c, i) for i, c in enumerate(coef) if c]) for c0, coef in self.terms + [self.copy]]
        if self._reduce:
            c0, coef = self._reduce
            self._reduce_nz = (c0, [(c, i) for i, c in enumerate(coef) if c])
        if self._seq:
            self._seq_nz = (0.0, [(c, i) for i, c in enumerate(self._seq[1]) if c])
        #: A device whose matmul rate depends on the rows (``Device.matmul_rows_flops``): the matmul term is no
        #: affine one; (layers' FLOPs per token, LM head's per logit token) priced as step_cost prices them.
        self._rows = None
        if device.matmul_rows_flops and gemm_mix is None:
            from simkv.cost.weights import matmul_params

            head = float(model.vocab * model.hidden) if model.weight_params else 0.0
            self._rows = (2.0 * (matmul_params(model) - head), 2.0 * head,
                          device.peak() * device.flops_efficiency)
        self.chunks: list = []
        self.pending: list[tuple] = []

    def _eval(self, x, affine=None):
        """The rooflines with the probed coefficients; scalars or arrays, the same operations in the same order.
        ``affine``: how each term is summed (default :meth:`_affine`; :meth:`_affine_counts` for counts)."""
        affine = affine or self._affine
        x = self._inputs(x)
        w, mm, kv, at, cp = (affine(t, x) for t in self._nonzero)
        if self._rows:  # step_cost's operations in its order (bit-identical)
            layers, head, peak = self._rows
            n, logits = (np.asarray(v, dtype=np.float64) for v in (x[6], x[4]))
            mm = layers * n / self.device.matmul_rate(n, peak) + head * logits / self.device.matmul_rate(logits, peak)
        if self._moe:
            w = self._weights_s(x[6])
        out = np.maximum(w, mm) + self.device.attention_time(kv, at) + cp + self._ovh
        if self._seq:
            out = out + affine(self._seq_nz, x)
        if self._reduce:
            out = out + affine(self._reduce_nz, x)
        return out

    def _inputs(self, x):
        """The loop's six inputs and the tokens the layers run over: the new tokens padded to a CUDA graph's size
        (:func:`simkv.cost.cudagraphs.padded_tokens`; the new tokens themselves without graphs)."""
        return (*x, padded_tokens(x[0], self.graph_sizes) if self.graph_sizes else x[0])

    def _weights_s(self, new_tokens):
        """Seconds of a MoE step's weight streaming for ``new_tokens`` tokens (an integer count, or an array of
        them): :func:`simkv.cost.weights_read_bytes` with ``(1 - k/E)^B`` read from a table of powers."""
        weights, bandwidth, q, share, experts = self._moe
        b = np.asarray(new_tokens, dtype=np.int64)
        top = int(b.max()) if b.size else 0
        if top >= len(self._powers):  # grow the table: q^0 .. q^(2 top)
            self._powers = q ** np.arange(2 * top + 1, dtype=np.float64)
        touched = experts * (1.0 - self._powers[b])
        return (weights * (1.0 - share) + weights * share * touched / experts) / bandwidth

    @staticmethod
    def _affine(term, x):
        total, coef = term
        for c, i in coef:
            total = total + c * x[i]
        return total

    def step(self, new_tokens, pairs, kv_read_tokens, copy_bytes, logit_tokens, decode_pairs=0) -> float:
        """Seconds of one step; the inputs are recorded for :meth:`official`."""
        x = (new_tokens, pairs, kv_read_tokens, copy_bytes, logit_tokens, decode_pairs)
        self.pending.append(x)
        return float(self._eval(x))

    def steps(self, new_tokens, pairs, kv_read_tokens, logit_tokens, decode_pairs=0) -> np.ndarray:
        """Seconds of many steps without copies (arrays), bit-identical to :meth:`step` on each.
        Not recorded: a plan may be cut; :meth:`record` what is kept."""
        return self._eval((new_tokens, pairs, kv_read_tokens, 0, logit_tokens, decode_pairs), self._affine_counts)

    @staticmethod
    def _affine_counts(term, x):
        """:meth:`_affine` of inputs that are counts (never negative): a constant +0.0 before a positive
        coefficient's product is left out (``0.0 + c * x`` is ``c * x``, bit for bit: the product is +0.0 or
        more)."""
        total, coef = term
        if not coef:
            return total
        c, i = coef[0]
        if total == 0.0 and c > 0 and math.copysign(1.0, total) > 0:
            total = c * x[i]
        else:
            total = total + c * x[i]
        for c, i in coef[1:]:
            total = total + c * x[i]
        return total

    def record(self, new_tokens, pairs, kv_read_tokens, logit_tokens, decode_pairs=0) -> None:
        self._flush()
        z = np.zeros(len(new_tokens))
        self.chunks.append((new_tokens, pairs, kv_read_tokens, z, logit_tokens, decode_pairs if np.ndim(decode_pairs) else z))

    def record_idle(self) -> None:
        self.pending.append((0, 0, 0, 0, 0, 0))

    def _flush(self) -> None:
        if self.pending:
            a = np.asarray(self.pending, dtype=np.float64).reshape(-1, self.INPUTS)
            self.chunks.append(tuple(a.T))
            self.pending = []

    def official(self, estimated: np.ndarray):
        """``step_cost`` on every recorded step (a step that ran no forward pass costs nothing)."""
        self._flush()
        if not self.chunks:
            return np.zeros(0), None
        a = np.stack([np.concatenate([np.asarray(c[i], dtype=np.float64) for c in self.chunks])
                      for i in range(self.INPUTS)], axis=1)
        div = self.pairs_div
        c = step_cost(self.model, self.device, gemm_mix=self.gemm_mix, weights_bytes=self.weights,
                      new_tokens=a[:, 0],
                      attended_pairs=a[:, 1] if div == 1 else a[:, 1] / div,
                      kv_read_bytes=a[:, 2] * self.read_unit, kv_write_bytes=a[:, 0] * self.kv_token,
                      copy_bytes=a[:, 3], logit_tokens=a[:, 4], decode_pairs=a[:, 5] if div == 1 else a[:, 5] / div,
                      graph_tokens=padded_tokens(a[:, 0], self.graph_sizes))
        seconds = np.asarray(c.seconds, dtype=np.float64)
        ran = estimated > 0
        if not np.allclose(seconds[ran], estimated[ran], rtol=1e-9, atol=1e-15):
            raise SimkvError("the cost model is not affine in its inputs; serving time needs an update of "
                             "simkv/serving/engine/costing.py")
        return np.where(ran, seconds, 0.0), c


class Work:
    """What a step's forward pass computes for the cost model, per sequence: attended pairs and KV read, by the
    kinds of its attention layers (``PagedKV.token_classes``: (count, bytes per token, window, kind)).

    Attention layers all alike (one class, full or sliding) and no state: as for a uniform model — tokens read
    (window-capped) at ``kv_token`` bytes each, pairs of one layer (:func:`simkv.cost.step_cost` multiplies by
    the layers). Otherwise pairs are summed over the attention layers and divided by the model's layers before
    pricing, and reads are bytes: per class ``min(context, W)`` tokens (sliding), the tokens of the chunks the
    new tokens fall in (chunked), every token (full); each scheduled sequence also reads and writes its linear
    state (``state`` bytes) once. Integer sums, so planned runs and the reference add them up exactly alike.
    """

    def __init__(self, classes, layers: int, state: int = 0) -> None:
        self.classes = tuple(classes)
        self.state = state
        self.uniform = len(self.classes) == 1 and self.classes[0][3] in ("full", "sliding") and not state
        self.kv_token = sum(count * nbytes for count, nbytes, _, _ in self.classes)
        if self.uniform:
            self.window = self.classes[0][2] or None
            self.read_unit, self.pairs_div = self.kv_token, 1
        else:
            self.window = None
            self.read_unit, self.pairs_div = 1, layers

    def timer(self, model, device, weights_bytes: int, gemm_mix: tuple | None = None,
              graph_sizes: tuple[int, ...] = ()) -> StepTimer:
        return StepTimer(model, device, weights_bytes, self.kv_token, read_unit=self.read_unit, pairs_div=self.pairs_div,
                         gemm_mix=gemm_mix, graph_sizes=graph_sizes)

    def seq(self, prev: int, new: int) -> tuple[int, int]:
        """(attended pairs, KV read) of ``new`` tokens after ``prev`` cached ones, one sequence."""
        ctx = prev + new
        if self.uniform:
            w = self.window
            return attended_pairs(prev, new, w), (ctx if w is None else min(ctx, w))
        pairs = reads = 0
        for count, nbytes, w, kind in self.classes:
            if kind == "chunked":
                p, r = chunk_pairs(prev, new, w), ctx - prev // w * w
            elif kind == "sliding":
                p, r = attended_pairs(prev, new, w), min(ctx, w)
            else:
                p, r = new * prev + new * (new + 1) // 2, ctx
            pairs += count * p
            reads += count * nbytes * r
        return pairs, reads + (2 * self.state if new else 0)

    def arrays(self, tok: np.ndarray, ctx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`seq` of every entry (``tok`` new tokens ending at ``ctx``), 0 where ``tok`` is 0."""
        prev = ctx - tok
        live = tok > 0
        if self.uniform:
            w = self.window
            if w is None:
                return tok * prev + tok * (tok + 1) // 2, np.where(live, ctx, 0)
            first = np.maximum(0, w - prev)
            fit = np.minimum(first, tok)
            over_w = tok - fit
            st_ = prev + fit + 1 - w
            pairs = tok * prev + tok * (tok + 1) // 2 - np.where(over_w > 0, over_w * st_ + over_w * (over_w - 1) // 2, 0)
            return pairs, np.where(live, np.minimum(ctx, w), 0)
        pairs = np.zeros_like(tok)
        reads = np.zeros_like(tok)
        full = tok * prev + tok * (tok + 1) // 2
        for count, nbytes, w, kind in self.classes:
            if kind == "chunked":
                def below(n):
                    q, r = np.divmod(n, w)
                    return q * (w * (w - 1) // 2) + r * (r - 1) // 2
                p, r = below(ctx) - below(prev) + tok, ctx - prev // w * w
            elif kind == "sliding":
                first = np.maximum(0, w - prev)
                fit = np.minimum(first, tok)
                over_w = tok - fit
                st_ = prev + fit + 1 - w
                p = full - np.where(over_w > 0, over_w * st_ + over_w * (over_w - 1) // 2, 0)
                r = np.minimum(ctx, w)
            else:
                p, r = full, ctx
            pairs += count * p
            reads += count * nbytes * r
        return pairs, np.where(live, reads + 2 * self.state, 0)

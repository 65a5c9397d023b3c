"""The paged half of ``simkv calibrate``: time what OpenVINO GenAI's ``ContinuousBatchingPipeline`` runs.

The pipeline does not run the stateful model's SDPA. GenAI rewrites the model when it builds the pipeline
(``apply_paged_attention_transformations`` in ``src/cpp/src/continuous_batching/paged_attention_transformations.cpp``
runs ``ov::pass::SDPAToPagedAttention``): every layer's SDPA becomes a ``PagedAttentionExtension`` over
``key_cache.N`` / ``value_cache.N`` block tables, which the CPU plugin executes in
``src/plugins/intel_cpu/src/nodes/paged_attn.cpp`` with the kernels of
``src/plugins/intel_cpu/src/nodes/kernels/scaled_attn/executor_pa.cpp`` — one-token queries in
``MHAHelper::exec_loop_bhl`` (a loop over sequence, head and cached block), prompts in ``exec_loop_mixed``.
Each ``step()`` also runs GenAI's scheduler, fills the block tables and runs the sampler per sequence. So the
host preset's ``paged`` terms are measured by timing ``step()`` of the real pipeline (:func:`.live.time_steps`)
on probe decoders of other shapes than the validated one (never fitted to the steps they are checked against):

* **fixed cost per step and per layer** (``step_overhead_s``, ``layer_overhead_s``): decode at batch 1 of a
  1-layer and a 9-layer tiny decoder (hidden 64, one 64-wide head: weights and attention negligible);
* **per sequence** (``sequence_overhead_s``: block tables, the sampler, the output per sequence): the 1-layer
  decoder at batch :data:`SEQ_BATCH` over batch 1;
* **per sequence, layer and query head** (``head_overhead_s``): the paged-attention kernel's fixed work per
  one-token query and head (``MHAHelper::exec_loop_bhl``: a softmax call per sequence and query head, the head's
  output accumulators zeroed and reduced), which the per-position terms below cancel out: 1- and 9-layer probes
  with 16 query / 8 KV heads x 128 on hidden 64 (:data:`HEAD_PROBES`) decoding at batch 1 and :data:`SEQ_BATCH`;
  their per-sequence slopes' difference per layer, less the priced attention per position and the matmuls' growth
  at the measured rows rates, over the query heads. Measured on this host: ~1 µs per sequence, layer and query
  head, 14-24 µs per sequence and layer at 16 heads (the 0.09 ms per sequence a 6-layer decode step lacked);
* **per prompt token, layer and query head** (``prompt_token_overhead_s``): a multi-token query's kernel work
  beyond its matmuls and attention arithmetic (``exec_loop_mixed``: the chunk's K and V quantised into the u8
  cache per token and KV head, the cached blocks repacked by ``transpose_16NxK``, a brgemm and a softmax per row
  for each block of 32 query rows and head): one prompt of :data:`PROMPT_CHUNK` tokens on the 1- and 9-layer
  :data:`HEAD_PROBES`; the 8 extra layers' time less their priced layer and head overheads, KV writes, causal
  attention at ``matmul_flops`` and their matmuls at the rate a stack of the probe's own layer matmuls runs at
  :data:`PROMPT_CHUNK` rows (hidden-64 matmuls run slower than hidden-2,048 ones), over the chunk's tokens and
  query heads. The prefill probe's slope holds the same work (2 layers x 16 heads per token), so ``matmul_flops``
  is solved together with it. Measured on this host: ~0.17 us per token, layer and query head (2.7 us per token
  and layer at 16 heads, the 7 % a 6-layer prefill chunk lacked);
* **per vocabulary entry of a sampling sequence** (``vocab_overhead_s``): the sampler's pass over each sampling
  sequence's logits row (``Sampler::_get_logit_vector`` and ``Sampler::_greedy_sample`` in GenAI's
  ``src/cpp/src/sampling/sampler.cpp``: the arg max over all ``vocab_size`` floats): the 1-layer tiny decoder and
  the same with a :data:`VOCAB_BIG`-entry vocabulary (``vocab``) decoding at batch 1 and :data:`SEQ_BATCH`; their
  per-sequence slopes' difference, less the LM heads' matmul growth at the rate a stack of the big head's own matmul
  runs at 1 and :data:`SEQ_BATCH` rows, over the vocabularies' difference;
* **one-token attention per position** (``decode_attention_flops``, ``kv_bandwidth_efficiency``): two 4-layer
  probes with 32 query heads x 128 over 8 or 32 KV heads (hidden 256), decoding :data:`ATT_BATCH` sequences at
  two contexts :data:`ATT_CONTEXT` apart; the extra time per sequence, layer and position is
  ``a · query heads + b · KV heads`` (as the stateful probes of :mod:`simkv.validate.openvino.calibrate` fit it):
  ``a`` gives the arithmetic rate (4 · head_dim FLOPs), ``b`` the rate of a KV head's cached bytes;
* **matmuls at few rows** (``matmul_rows_flops``): the pipeline's model runs every step's tokens, all sequences
  flattened, through each FullyConnected node (``[tokens, hidden]`` rows; GenAI's SDPAToPagedAttention makes
  ``input_ids`` one-dimensional), which the CPU plugin runs as ``brgemm_avx512_bf16`` (its profiling's exec
  type, measured here). Its rate at a decode batch's few rows is neither the weights' streaming rate nor the
  large-matrix rate (measured on this host, 1 thread: 120 GFLOP/s at 4 rows, 283 at 16, 333 at 32, 456 at
  512 while 64 MiB of bf16 weights stream at 30 GB/s); so a stack of :data:`ROWS_MATMULS` square hidden-
  :data:`ROWS_HIDDEN` matmuls (weights beyond the caches, as a model's are) is timed at :data:`MATMUL_ROWS`
  rows with the pipeline's thread count: FLOPs / time at each;
* **weight streaming** (``memory_bandwidth``): the same stack at 1 row is bound by streaming its weights; its
  bytes over its time is the rate the pipeline's weight matmuls stream at (a decode step at batch 1 is bound by
  it), in place of the stateful decoder's (whose one-row rate differs: other properties, other matrices). The
  validated model's own layer matmuls (6 x Q, K, V, O of hidden 1,024, 75 MB) run at 1 row within 2 % of the
  2,048-square stack (67 MB; both beyond the 32 MB L3) on this host;
* **prefill chunks** (``matmul_flops``): chunks of :data:`PREFILL_CHUNKS` tokens of a 2-layer, hidden-2,048
  decoder; their slope (the fixed costs cancel), less the prompt tokens' kernel work above, over the chunk's
  FLOPs (weight matmuls and causal attention, which the cost model prices at one rate).

Each figure is the median over :data:`ROUNDS` rounds of all probes (this VM's speed drifts within seconds).
:func:`derive` is the arithmetic alone (golden-tested); :func:`measure_paged` runs the probes. Needs
``openvino-genai``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ProbeShape", "PROBES", "HEAD_PROBES", "PROMPT_CHUNK", "VOCAB_BIG", "derive", "measure_paged", "ROUNDS"]

ROUNDS = 3
WARMUP, REPEATS = 2, 7
#: Decode context of the fixed-cost probes; the attention probes' short context and the gap to the long one.
CONTEXT = 64
ATT_CONTEXT = 512
SEQ_BATCH = 16
ATT_BATCH = 4
PREFILL_CHUNKS = (128, 512)
#: The prompt the per-prompt-token term is timed at on the :data:`HEAD_PROBES` (one chunk, one sequence).
PROMPT_CHUNK = 128
ATT_KV_HEADS = (8, 32)
#: The vocabulary of the per-vocabulary-entry probe (``vocab``: the 1-layer tiny decoder, whose own is 512).
VOCAB_BIG = 32_768
#: Rows the matmul probe is timed at (a decode batch's and a prefill chunk's tokens), and its shape.
MATMUL_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
ROWS_MATMULS, ROWS_HIDDEN = 8, 2048


@dataclass(frozen=True)
class ProbeShape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int = 512

    def spec(self):
        from .model import GenaiModelSpec

        return GenaiModelSpec(layers=self.layers, heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim,
                              hidden=self.hidden, vocab=self.vocab, with_tokenizer=False)


PROBES = {
    "tiny1": ProbeShape(1, 1, 1, 64, 64),
    "tiny9": ProbeShape(9, 1, 1, 64, 64),
    "attention8": ProbeShape(4, 32, 8, 128, 256),
    "attention32": ProbeShape(4, 32, 32, 128, 256),
    "prefill": ProbeShape(2, 16, 16, 128, 2048),
    "heads1": ProbeShape(1, 16, 8, 128, 64),
    "heads9": ProbeShape(9, 16, 8, 128, 64),
    "vocab": ProbeShape(1, 1, 1, 64, 64, vocab=VOCAB_BIG),
}
#: The probes of the per-head term: a real head shape on hidden 64 (weights small), one layer and nine.
HEAD_PROBES = ("heads1", "heads9")


def mean_context(entry: dict) -> float:
    """Mean cached tokens over a decode entry's timed steps (the j-th follows P + first_step + j of them)."""
    return entry["context"] + entry["first_step"] + (len(entry["times_s"]) - 1) / 2


def derive(raw: dict, *, kv_bytes_per_head: float, weights_rate: float, prefill_flops: dict,
           tiny_weights_bytes: dict) -> dict:
    """One round's paged terms from its timings (seconds; contexts in tokens). ``raw`` holds:

    * ``tiny1_b1``, ``tiny1_bS``, ``tiny9_b1``: (median step time, mean context) of the tiny decoders' decode at
      batch 1 and :data:`SEQ_BATCH`;
    * ``attention{kv}_short``, ``attention{kv}_long``: the same for the attention probes at batch :data:`ATT_BATCH`;
    * ``prefill``: {chunk: median step time};
    * ``heads1_b1``, ``heads1_bS``, ``heads9_b1``, ``heads9_bS``: the same for the :data:`HEAD_PROBES`;
    * ``rows``: {1: FLOP/s, :data:`SEQ_BATCH`: FLOP/s} of the matmul probe at those rows;
    * ``heads1_prompt``, ``heads9_prompt``: median time of one prompt of :data:`PROMPT_CHUNK` tokens on the
      :data:`HEAD_PROBES`; ``heads_rows``: FLOP/s of a stack of their layer's matmuls at :data:`PROMPT_CHUNK` rows;
    * ``vocab_b1``, ``vocab_bS``: (median step time, mean context) of the ``vocab`` probe at batch 1 and
      :data:`SEQ_BATCH`; ``vocab_rows``: {1: FLOP/s, :data:`SEQ_BATCH`: FLOP/s} of a stack of its LM head's matmul.

    ``kv_bytes_per_head``: one KV head's K and V bytes per cached position (the pipeline's KV precision);
    ``weights_rate``: the stateful calibration's weight-streaming rate (bytes/s); ``prefill_flops``: {chunk: FLOPs
    of that chunk on the prefill probe}; ``tiny_weights_bytes``: {"tiny1", "tiny9": each tiny decoder's weights}
    (streamed once per step).

    Attention first (differences of like steps cancel every fixed cost): per sequence, layer and position
    ``x = Δt / (batch · layers · Δcontext)`` on each attention probe; ``x = a · 32 + b · KV heads`` on both gives
    ``b = (x32 − x8) / 24`` and ``a = (x8 − 8 b) / 32`` (clamped at 0 and a tiny positive ``a``). The tiny decoders'
    head is half as wide (64): their attention per position is ``(a + b) / 2``. Then, with ``att(b, c) =
    b · layers · c · (a + b) / 2`` and each decoder's weights ``w = bytes / weights_rate``:
    per sequence ``q = (t1S − att(S, c1S) − (t1 − att(1, c1))) / (S − 1)``, per layer
    ``ℓ = ((t9 − att9 − w9) − (t1 − att1 − w1)) / 8``, per step ``s = t1 − att1 − w1 − q − ℓ``; prefill
    ``matmul_flops = Δ FLOPs / Δ t`` over the two chunks when no prompt-token work is found.

    Prompt tokens (``c`` = :data:`PROMPT_CHUNK`, ``H`` query heads, ``K`` KV heads of the head probes): per layer
    ``D = (T9 − T1) / 8 − ℓ − H h − 2 P c / heads_rows − c K b`` (layer and head overheads, matmuls, KV writes)
    holds the causal attention ``A = c (c + 1) / 2 · 4 · head_dim · H`` FLOPs at the unknown prefill rate ``F``
    and ``p · c · H``. The prefill probe's slope holds ``p`` too: ``Δt = ΔFLOPs / F + Δc · 2 · 16 · p``. With
    ``u = 1 / F`` and ``k = Δc · 2 · 16 / (c H)``: ``u = (Δt − k D) / (ΔFLOPs − k A)``, ``p = (D − A u) / (c H)``;
    ``p`` clamped at 0 (then ``u = Δt / ΔFLOPs``).

    Vocabulary (``V`` = :data:`VOCAB_BIG`, ``v0`` = the tiny decoder's 512, hidden ``d``): each decoder's
    per-sequence slope ``σ = ((tS − att(S, cS)) − (t1 − att(1, c1))) / (S − 1)``; the big LM head's matmuls grow by
    ``g = 2 d (V − v0) (S / R_S − 1 / R_1) / (S − 1)`` per sequence at its own rates ``R``; per vocabulary entry
    ``v = (σ_vocab − σ_tiny1 − g) / (V − v0)`` (clamped at 0). The tiny decoder's ``v0 · v`` per sequence is taken
    out of ``q`` and ``s`` as its head's ``h`` is.
    """
    heads = PROBES["attention8"].heads
    few, many = ATT_KV_HEADS
    per = {}
    for kv in ATT_KV_HEADS:
        (short, c0), (long, c1) = raw[f"attention{kv}_short"], raw[f"attention{kv}_long"]
        per[kv] = (long - short) / (ATT_BATCH * PROBES[f"attention{kv}"].layers * (c1 - c0))
    per_kv_head = max(0.0, (per[many] - per[few]) / (many - few))
    per_query_head = max(1e-15, (per[few] - few * per_kv_head) / heads)
    tiny_pos = (per_query_head + per_kv_head) * PROBES["tiny1"].head_dim / PROBES["attention8"].head_dim

    def att(name: str, batch: int, context: float) -> float:
        return batch * PROBES[name].layers * context * tiny_pos

    hp = PROBES[HEAD_PROBES[0]]
    head_pos = per_query_head * hp.heads + per_kv_head * hp.kv_heads

    def head_slope(name: str) -> float:
        (t1_, c1_), (tS_, cS_) = raw[f"{name}_b1"], raw[f"{name}_bS"]
        layers_ = PROBES[name].layers
        return ((tS_ - SEQ_BATCH * layers_ * cS_ * head_pos) - (t1_ - layers_ * c1_ * head_pos)) / (SEQ_BATCH - 1)

    one, nine = HEAD_PROBES
    layer_params = 2 * hp.hidden * (hp.heads + hp.kv_heads) * hp.head_dim  # Q and O, K and V of one layer
    grow = 2.0 * layer_params * (SEQ_BATCH / raw["rows"][SEQ_BATCH] - 1.0 / raw["rows"][1]) / (SEQ_BATCH - 1)
    per_layer = (head_slope(nine) - head_slope(one)) / (PROBES[nine].layers - PROBES[one].layers) - grow
    head = max(0.0, per_layer / hp.heads)

    def seq_slope(name: str) -> float:  # a 1-layer tiny decoder's time per sequence more, attention removed
        (t1_, c1_), (tS_, cS_) = raw[f"{name}_b1"], raw[f"{name}_bS"]
        return ((tS_ - att("tiny1", SEQ_BATCH, cS_)) - (t1_ - att("tiny1", 1, c1_))) / (SEQ_BATCH - 1)

    tv, big_vocab = PROBES["tiny1"], PROBES["vocab"].vocab
    d_vocab = big_vocab - tv.vocab
    vrows = raw["vocab_rows"]
    vocab_grow = 2.0 * tv.hidden * d_vocab * (SEQ_BATCH / vrows[SEQ_BATCH] - 1.0 / vrows[1]) / (SEQ_BATCH - 1)
    vocab = max(0.0, (seq_slope("vocab") - seq_slope("tiny1") - vocab_grow) / d_vocab)
    sampler = tv.vocab * vocab  # the tiny decoder's own sampler pass per sequence

    t1, c1 = raw["tiny1_b1"]
    t9, c9 = raw["tiny9_b1"]
    base1 = t1 - att("tiny1", 1, c1)
    w1, w9 = (tiny_weights_bytes[k] / weights_rate for k in ("tiny1", "tiny9"))
    seq = max(0.0, seq_slope("tiny1") - head - sampler)
    layer = max(0.0, (t9 - att("tiny9", 1, c9) - w9 - (base1 - w1)) / (PROBES["tiny9"].layers - PROBES["tiny1"].layers)
                - head)
    step = max(0.0, base1 - w1 - seq - layer - head - sampler)
    small, big = sorted(raw["prefill"])
    dt = raw["prefill"][big] - raw["prefill"][small]
    dflops = prefill_flops[big] - prefill_flops[small]
    c, pp = PROMPT_CHUNK, PROBES["prefill"]
    prompt_layer = ((raw[f"{nine}_prompt"] - raw[f"{one}_prompt"]) / (PROBES[nine].layers - PROBES[one].layers)
                    - layer - head * hp.heads - 2.0 * layer_params * c / raw["heads_rows"] - c * hp.kv_heads * per_kv_head)
    attention = c * (c + 1) / 2 * 4.0 * hp.head_dim * hp.heads
    k = (big - small) * pp.layers * pp.heads / (c * hp.heads)
    num, den = dt - k * prompt_layer, dflops - k * attention
    u = num / den if num > 0 and den > 0 else 0.0
    prompt = (prompt_layer - attention * u) / (c * hp.heads) if u > 0 else 0.0
    if not prompt > 0:
        prompt, u = 0.0, (dt / dflops if dt > 0 else 0.0)
    flops = 1.0 / u if u > 0 else float("inf")
    return {"step_overhead_s": step, "layer_overhead_s": layer, "sequence_overhead_s": seq, "head_overhead_s": head,
            "prompt_token_overhead_s": prompt, "vocab_overhead_s": vocab,
            "decode_attention_flops": 4.0 * PROBES["attention8"].head_dim / per_query_head,
            "kv_rate": kv_bytes_per_head / per_kv_head if per_kv_head > 0 else float("inf"),
            "matmul_flops": flops}


def _model(name: str):
    """(model directory, cost-model shape, KV precision name) of a probe."""
    from .model import model_dir
    from .real import PIPELINE_PROPERTIES, kv_layout
    from .serving import cost_model

    spec = PROBES[name].spec()
    path = model_dir(spec)
    return path, cost_model(spec), kv_layout(path, PIPELINE_PROPERTIES).kv_precision


def _decode(path, batch: int, context: int) -> tuple[float, float]:
    from .live import time_steps

    d = time_steps(str(path), decode_batches=[batch], prefill_chunks=[], context=context, warmup=WARMUP,
                   repeats=REPEATS)["decode"][0]
    return float(np.median(d["times_s"])), mean_context(d)


def _round(paths: dict) -> dict:
    from .live import time_steps

    raw = {"tiny1_b1": _decode(paths["tiny1"], 1, CONTEXT), "tiny1_bS": _decode(paths["tiny1"], SEQ_BATCH, CONTEXT),
           "tiny9_b1": _decode(paths["tiny9"], 1, CONTEXT)}
    for name in HEAD_PROBES:
        raw[f"{name}_b1"] = _decode(paths[name], 1, CONTEXT)
        raw[f"{name}_bS"] = _decode(paths[name], SEQ_BATCH, CONTEXT)
    raw["vocab_b1"] = _decode(paths["vocab"], 1, CONTEXT)
    raw["vocab_bS"] = _decode(paths["vocab"], SEQ_BATCH, CONTEXT)
    for kv in ATT_KV_HEADS:
        raw[f"attention{kv}_short"] = _decode(paths[f"attention{kv}"], ATT_BATCH, CONTEXT)
        raw[f"attention{kv}_long"] = _decode(paths[f"attention{kv}"], ATT_BATCH, CONTEXT + ATT_CONTEXT)
    pre = time_steps(str(paths["prefill"]), decode_batches=[], prefill_chunks=list(PREFILL_CHUNKS), context=CONTEXT,
                     warmup=WARMUP, repeats=REPEATS)["prefill"]
    raw["prefill"] = {p["chunk"]: float(np.median(p["times_s"])) for p in pre}
    for name in HEAD_PROBES:
        one = time_steps(str(paths[name]), decode_batches=[], prefill_chunks=[PROMPT_CHUNK], context=CONTEXT,
                         warmup=WARMUP, repeats=REPEATS)["prefill"][0]
        raw[f"{name}_prompt"] = float(np.median(one["times_s"]))
    return raw


def _matmul_rates(shapes, rows_list) -> dict:
    """{rows: FLOP/s} of a stack of matmuls ``[rows, k] x [k, n]`` for each (k, n) of ``shapes`` (f32 constants the
    plugin computes in its inference precision, dynamic rows as the pipeline's; a matmul whose k differs from the
    previous one's n takes the stack's input), each the median of :data:`REPEATS` inferences after :data:`WARMUP`,
    with the pipeline's properties."""
    import time

    import openvino as ov
    import openvino.opset13 as ops

    from .real import PIPELINE_PROPERTIES

    rng = np.random.default_rng(0)
    k0 = shapes[0][0]
    x = ops.parameter(ov.PartialShape([-1, k0]), ov.Type.f32, name="x")
    h, width, outs = x, k0, []
    for k, n in shapes:
        w = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
        h = ops.matmul(h if width == k else x, ops.constant(w), False, False)
        width = n
        outs.append(h)
    compiled = ov.Core().compile_model(ov.Model(outs, [x], "simkv_calibrate_matmul_rows"), "CPU",
                                       dict(PIPELINE_PROPERTIES))
    request = compiled.create_infer_request()
    flops_per_row = sum(2.0 * k * n for k, n in shapes)
    rates = {}
    for rows in rows_list:
        a = rng.standard_normal((rows, k0)).astype(np.float32)
        times = []
        for i in range(WARMUP + REPEATS):
            t0 = time.perf_counter()
            request.infer({0: a}, share_outputs=True)
            if i >= WARMUP:
                times.append(time.perf_counter() - t0)
        rates[rows] = flops_per_row * rows / float(np.median(times))
    return rates


def _matmul_rows() -> dict:
    """{rows: FLOP/s} of :data:`ROWS_MATMULS` square hidden-:data:`ROWS_HIDDEN` matmuls (weights beyond the caches,
    as a model's are) at each of :data:`MATMUL_ROWS`."""
    return _matmul_rates([(ROWS_HIDDEN, ROWS_HIDDEN)] * ROWS_MATMULS, MATMUL_ROWS)


def _head_probe_rows() -> float:
    """FLOP/s of the :data:`HEAD_PROBES`' layer matmuls (Q, O, K, V on their hidden) at :data:`PROMPT_CHUNK` rows."""
    p = PROBES[HEAD_PROBES[0]]
    q, kv = p.heads * p.head_dim, p.kv_heads * p.head_dim
    return _matmul_rates([(p.hidden, q), (q, p.hidden), (p.hidden, kv), (p.hidden, kv)] * 8, [PROMPT_CHUNK])[PROMPT_CHUNK]


def _vocab_probe_rows() -> dict:
    """{rows: FLOP/s} of the ``vocab`` probe's LM head matmul ([rows, hidden] x [hidden, :data:`VOCAB_BIG`], a stack
    of 8 of it) at 1 and :data:`SEQ_BATCH` rows."""
    p = PROBES["vocab"]
    return _matmul_rates([(p.hidden, p.vocab)] * 8, [1, SEQ_BATCH])


def measure_paged(weights_rate: float, precision: str, progress=None) -> tuple[dict, dict]:
    """Run :data:`ROUNDS` rounds of the probes; (the ``paged`` terms, their sources). ``progress()`` after each round."""
    from simkv.cost.attention import attended_pairs, pair_flops_per_model
    from simkv.cost.weights import matmul_params
    from simkv.models import weights_bytes
    from simkv.precision import get_precision
    from simkv.weights import weight_format

    paths, shapes = {}, {}
    for name in PROBES:
        paths[name], shapes[name], kv_name = _model(name)
        if name == "attention8":
            att_kv = kv_name
    att = shapes["attention8"]
    kv_bytes_per_head = get_precision(att_kv).kv_bytes_per_token(att) / (att.layers * att.kv_heads)
    pm = shapes["prefill"]
    head = pm.vocab * pm.hidden
    prefill_flops = {c: 2.0 * (matmul_params(pm) - head) * c + 2.0 * head
                     + pair_flops_per_model(pm) * attended_pairs(pm, 0, c) for c in PREFILL_CHUNKS}
    tiny_w = {k: float(weights_bytes(shapes[k], precision)) for k in ("tiny1", "tiny9")}
    bytes_per_weight = weight_format(precision).bytes_per_weight
    rounds = []
    for _ in range(ROUNDS):
        raw = _round(paths)
        rows = _matmul_rows()
        raw["rows"] = rows
        raw["heads_rows"] = _head_probe_rows()
        raw["vocab_rows"] = _vocab_probe_rows()
        rounds.append(derive(raw, kv_bytes_per_head=kv_bytes_per_head, weights_rate=weights_rate,
                             prefill_flops=prefill_flops, tiny_weights_bytes=tiny_w))
        rounds[-1].update({f"rows{r}": f for r, f in rows.items()})
        # the stack at 1 row streams its weights (2 FLOPs per weight): bytes / time = rate x bytes per weight / 2
        rounds[-1]["memory_bandwidth"] = rows[1] * bytes_per_weight / 2.0
        if progress:
            progress()
    fig = {k: float(np.median([r[k] for r in rounds])) for k in rounds[0]}
    kv_eff = min(1.0, fig.pop("kv_rate") / fig["memory_bandwidth"])
    rows_flops = [[r, fig.pop(f"rows{r}")] for r in MATMUL_ROWS]

    def spread(key, scale, unit, digits=2):
        v = np.array([r[key] for r in rounds]) * scale
        return (f"median {np.median(v):.{digits}f} {unit} of {len(v)} rounds (range {v.min():.{digits}f}-"
                f"{v.max():.{digits}f})")

    how = ("OpenVINO GenAI ContinuousBatchingPipeline step() on CPU (simkv.validate.genai.calibrate: the model GenAI "
           "rewrites to PagedAttentionExtension, run by the CPU plugin's executor_pa.cpp)")
    a, hp = PROBES["attention8"], PROBES[HEAD_PROBES[0]]
    terms = {**fig, "kv_bandwidth_efficiency": kv_eff, "matmul_rows_flops": rows_flops}
    rates_text = ", ".join(f"{r}: {f / 1e9:.0f}" for r, f in rows_flops)
    sources = {
        "step_overhead_s": f"measured: decode step at batch 1 of a 1-layer hidden-64 decoder minus its per-layer, "
                           f"per-sequence, attention and weights shares: {spread('step_overhead_s', 1e3, 'ms', 3)}; {how}",
        "layer_overhead_s": f"measured: (9-layer - 1-layer tiny decoder step, attention removed) / 8: "
                            f"{spread('layer_overhead_s', 1e3, 'ms', 3)}; {how}",
        "sequence_overhead_s": f"measured: (1-layer tiny decoder at batch {SEQ_BATCH} - batch 1, attention removed) / "
                               f"{SEQ_BATCH - 1}, less its head's and its {PROBES['tiny1'].vocab}-entry sampler's "
                               f"shares: {spread('sequence_overhead_s', 1e3, 'ms', 4)}; {how}",
        "head_overhead_s": f"measured: ({PROBES[HEAD_PROBES[1]].layers}-layer - {hp.layers}-layer probe, {hp.heads} query / "
                           f"{hp.kv_heads} KV heads x {hp.head_dim} on hidden {hp.hidden}) per-sequence slope from "
                           f"batch 1 to {SEQ_BATCH} per layer, less the priced attention per position and the "
                           f"matmuls' growth at the rows rates, / {hp.heads} query heads: "
                           f"{spread('head_overhead_s', 1e6, 'us', 3)}; the fixed work per sequence and query head of "
                           f"MHAHelper::exec_loop_bhl (softmax, output accumulators zeroed and reduced); {how}",
        "prompt_token_overhead_s": f"measured: ({PROBES[HEAD_PROBES[1]].layers}-layer - {hp.layers}-layer probe) "
                                   f"prompt of {PROMPT_CHUNK} tokens per layer, less its priced layer and head "
                                   f"overheads, KV writes, matmuls (at the rate of a stack of the probe's own layer "
                                   f"matmuls at {PROMPT_CHUNK} rows) and causal attention at matmul_flops, / "
                                   f"{PROMPT_CHUNK} tokens / {hp.heads} query heads: "
                                   f"{spread('prompt_token_overhead_s', 1e6, 'us', 3)}; a multi-token query's work in "
                                   f"exec_loop_mixed (K/V quantised per token, cached blocks repacked by "
                                   f"transpose_16NxK, a softmax per row and head); {how}",
        "vocab_overhead_s": f"measured: (1-layer tiny decoder with a {VOCAB_BIG:,}-entry vocabulary - the same with "
                            f"{PROBES['tiny1'].vocab}) per-sequence slope from batch 1 to {SEQ_BATCH}, attention "
                            f"removed, less the LM heads' matmul growth at the rate of a stack of the big head's own "
                            f"matmul at 1 and {SEQ_BATCH} rows, / {VOCAB_BIG - PROBES['tiny1'].vocab:,} entries: "
                            f"{spread('vocab_overhead_s', 1e9, 'ns', 3)}; the sampler's pass over each sampling "
                            f"sequence's logits row (GenAI's Sampler::_greedy_sample, src/cpp/src/sampling/"
                            f"sampler.cpp: the arg max over all vocab_size floats); {how}",
        "decode_attention_flops": f"measured: a = time per query head and position of {a.layers}-layer probes with "
                                  f"{a.heads} query heads over {ATT_KV_HEADS[0]} or {ATT_KV_HEADS[1]} KV heads x "
                                  f"{a.head_dim}, batch {ATT_BATCH}, contexts {CONTEXT}+ and {CONTEXT + ATT_CONTEXT}+: "
                                  f"4 x {a.head_dim} FLOPs / a = {spread('decode_attention_flops', 1e-9, 'GFLOP/s', 1)}; {how}",
        "kv_bandwidth_efficiency": f"measured: b = time per KV head and position of the same probes: "
                                   f"{kv_bytes_per_head:.0f} B of K and V ({att_kv}) / b, over memory_bandwidth; {how}",
        "memory_bandwidth": f"measured: the matmul_rows_flops stack ({ROWS_MATMULS} x {ROWS_HIDDEN}-square, "
                            f"{ROWS_MATMULS * ROWS_HIDDEN ** 2 * bytes_per_weight / 1e6:.0f} MB of {precision} "
                            f"weights, beyond the caches as a model's are) at 1 row: its weights' bytes / its time: "
                            f"{spread('memory_bandwidth', 1e-9, 'GB/s', 2)}; the rate a decode step's weight matmuls "
                            f"stream at with the pipeline's properties (a one-row step is bound by it); {how}",
        "matmul_rows_flops": f"measured: a stack of {ROWS_MATMULS} matmuls [rows, {ROWS_HIDDEN}] x [{ROWS_HIDDEN}, "
                             f"{ROWS_HIDDEN}] (f32 constants, the plugin's bf16 brgemm, dynamic rows as the "
                             f"pipeline's FullyConnected nodes over a step's tokens), the pipeline's threads: FLOPs / "
                             f"time at each rows, median of {ROUNDS} rounds (GFLOP/s by rows: {rates_text}); the "
                             f"weight matmuls of a step run at the lower of this rate at its tokens and matmul_flops",
        "matmul_flops": f"measured: prefill chunks of {PREFILL_CHUNKS[0]} and {PREFILL_CHUNKS[1]} tokens of a "
                        f"{pm.layers}-layer hidden-{pm.hidden} decoder: their FLOPs' difference / their times' "
                        f"difference less the prompt tokens' work (prompt_token_overhead_s): {spread('matmul_flops', 1e-9, 'GFLOP/s', 1)}; {how}",
    }
    return terms, sources

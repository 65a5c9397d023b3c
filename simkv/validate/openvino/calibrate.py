"""``simkv calibrate``: measure this host and write the ``host`` device preset.

Every number is measured here, on the OpenVINO CPU plugin running the toy stateful decoders of
``simkv validate`` (:func:`.ovmodel.build_stateful_decoder`), the way it runs an LLM step:

* **per-inference overhead** (``step_overhead_s``, ``layer_overhead_s``): decode steps of tiny decoders
  (hidden 64) of 1 and 9 layers, where weights, KV and FLOPs are negligible;
* **decode attention** (``decode_attention_flops``, ``kv_bandwidth_efficiency``, ``attention_overlap``):
  two 4-layer probes with 32 query heads x 128 and hidden 256 (negligible weights), one with 8 KV heads,
  one with 32. Each decodes in two sessions, 1,024 tokens of history apart (from 128 and 1,152 on); the
  extra time per layer and position
  is ``a · query heads + b · KV heads``. The plugin's one-token attention (``mha_single_token_kernel`` in
  ``src/plugins/intel_cpu/src/nodes/kernels/scaled_attn/mha_single_token.cpp``) dequantises and dots each
  cached row once per *query* head (``a``: 4 · head_dim FLOPs) and walks the rows of each *KV* head
  (``b``: that head's K and V bytes), one after the other: the two probes give both rates, and the
  attention time is their sum (``attention_overlap`` False), not the larger;
* **weight streaming** (``memory_bandwidth``, efficiency 1: the achieved rate itself): decode steps of a
  4-layer, hidden-2,560 decoder at 16-28 tokens of history (420 MB of f32 weights), minus the overhead and
  the attention just measured: weight bytes / time. A decode step's matrices are streamed one
  FullyConnected node at a time, which is slower here than one large GEMV (a single 256 MiB matrix
  streams ~25 % faster, and predicts the decode steps of ``experiments/latency_table.py`` that much short);
* **matmul throughput** (``peak_flops`` in the plugin's inference precision, efficiency 1): a
  compute-bound MatMul ``[512, K] x [K, N]``;
* **the paged pipeline's terms** (``paged``: per step, layer and sequence, one-token paged attention, prefill
  chunks): OpenVINO GenAI's ContinuousBatchingPipeline timed on probe decoders
  (:mod:`simkv.validate.genai.calibrate`), what ``simkv serve``/``validate --serving`` price steps with;
* **copy bandwidth** (``copy_bandwidth``): the plugin's own KV reallocation in the 8-KV-head probe: the
  bytes simkv's ledger copies at that decode step over the step's excess time (a plain numpy copy into
  fresh pages is reported beside it).

Overhead, attention and weight streaming are measured in :data:`ROUNDS` interleaved rounds, and each
figure is the median of its per-round values: this 2-core VM's speed drifts by 10-30 % over seconds, and
a figure taken in one burst is at the mercy of that drift. Models are compiled with the hints of
``simkv validate`` (``PERFORMANCE_HINT=LATENCY``). Needs ``openvino``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from simkv.cost import Device
from simkv.errors import SimkvError

from ..child import DEFAULT_MMAP_THRESHOLD, child_env
from .toy import ToyDecoderSpec, toy_model_spec

COPY_BYTES = 256 << 20
MATMUL = (512, 2048, 2048)
#: Interleaved rounds of the overhead, attention and weight-streaming probes (medians over rounds).
ROUNDS = 9
#: Decode steps timed per probe per round; the first WARM of them are not counted.
STEPS, WARM = 12, 2

#: The weight-streaming probe: attention-only layers of hidden 2,560 (20 heads x 128): 420 MB of weights.
WEIGHTS_PROBE = {"layers": 4, "heads": 20, "kv_heads": 20, "head_dim": 128, "vocab": 64}
WEIGHTS_PROBE_HISTORY = 16
#: The attention probes: 32 query heads over 8 or 32 KV heads; hidden 256 keeps the weights negligible.
ATTENTION_PROBE = {"layers": 4, "heads": 32, "head_dim": 128, "hidden": 256, "vocab": 64}
ATTENTION_KV_HEADS = (8, 32)
#: The attention probes' two sessions: a prompt of the first length, and one that much longer again.
ATTENTION_HISTORY = (128, 1024)
#: The reallocation probe (on the 8-KV-head attention probe): prompt P (capacity 2P), a turn to 2P - 24,
#: COPY_PROBE_DECODE decode steps, the 25th of which grows every layer's cache to 2 (2P + 1).
COPY_PROBE_PROMPT = 256
COPY_PROBE_DECODE = 40
COPY_PROBE_REPEATS = 3
NEIGHBOURS = 8


def _median_time(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _compile(model, threads: int | None):
    from .ovmodel import compile_cpu

    extra = {"INFERENCE_NUM_THREADS": threads} if threads else None
    return compile_cpu(model, extra_config=extra)


def _matmul_model(rows: int, k: int, n: int, seed: int = 0):
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([rows, k], ov.Type.f32, name="x")
    w = (np.random.default_rng(seed).standard_normal((k, n)) * 0.02).astype(np.float32)
    y = ops.matmul(x, ops.constant(w), False, False)
    return ov.Model([ops.result(y)], [x], "simkv_calibrate_matmul")


class _Probe:
    """A toy stateful decoder on the CPU plugin, driven one inference at a time (timed)."""

    def __init__(self, threads: int | None, **shape) -> None:
        from .ovmodel import build_stateful_decoder, compile_checked

        self.spec = ToyDecoderSpec(**shape)
        model = build_stateful_decoder(self.spec)
        self.compiled, inspection = compile_checked(model, None, None)
        if threads:  # recompile with the thread count (compile_checked takes no extra config)
            self.compiled = _compile(model, threads)
        self.kv_precision = inspection.kv_cache_precision or "u8"
        self._fresh()

    def _fresh(self) -> None:
        self.request = self.compiled.create_infer_request()
        self.length = 0
        self.rng = np.random.default_rng(0)

    def fork(self) -> "_Probe":
        """The same compiled decoder with a request of its own: a session of its own, with fresh KV buffers."""
        twin = object.__new__(_Probe)
        twin.spec, twin.compiled, twin.kv_precision = self.spec, self.compiled, self.kv_precision
        twin._fresh()
        return twin

    def reset(self) -> None:
        self.request.reset_state()
        self.length = 0

    def infer(self, tokens: int) -> float:
        """Append ``tokens`` tokens (a prompt, or 1: a decode step); the wall time of the inference."""
        length = self.length
        inputs = {"input_ids": self.rng.integers(0, self.spec.vocab, (1, tokens), dtype=np.int64),
                  "attention_mask": np.ones((1, length + tokens), dtype=np.int64),
                  "position_ids": np.arange(length, length + tokens, dtype=np.int64)[None, :],
                  "beam_idx": np.zeros(1, dtype=np.int32)}
        t0 = time.perf_counter()
        self.request.infer(inputs, share_outputs=True)
        self.length += tokens
        return time.perf_counter() - t0

    def decode(self, steps: int = STEPS) -> tuple[float, float]:
        """(median step time, mean history length) of ``steps`` decode steps, the first WARM not counted."""
        start = self.length
        times = [self.infer(1) for _ in range(steps)][WARM:]
        return float(np.median(times)), start + WARM + (steps - WARM - 1) / 2

    def scenario(self, ops: str):
        """simkv's simulation of this decoder running ``ops`` (the plugin's own policy)."""
        from simkv.scenario import build_scenario, simulate

        s = self.spec
        return simulate(build_scenario(model=None, layers=s.layers, heads=s.heads, kv_heads=s.kv_heads,
                                       head_dim=s.head_dim, precision=self.kv_precision, policy="openvino-cpu",
                                       ops=ops))


def _tiny(threads: int | None, layers: int) -> _Probe:
    return _Probe(threads, layers=layers, heads=1, kv_heads=1, head_dim=64, vocab=16)


def _round(probes: dict) -> dict:
    """One round of the interleaved probes: their raw timings. Each attention probe has two sessions
    prefilled once (:func:`_attention_sessions`) that both grow by the same decode steps every round,
    so their history differs by ``ATTENTION_HISTORY[1]`` tokens throughout."""
    out = {}
    for name in ("tiny1", "tiny9"):
        p = probes[name]
        if p.length == 0 or p.length > 256:
            p.reset()
            p.infer(1)
        out[name] = p.decode()[0]
    for kv in ATTENTION_KV_HEADS:
        short, long = probes[f"attention{kv}"]
        low, at_low = short.decode()
        high, at_high = long.decode()
        out[f"attention{kv}"] = (high - low) / ((at_high - at_low) * short.spec.layers)  # s per layer and position
    p = probes["weights"]
    p.reset()
    p.infer(WEIGHTS_PROBE_HISTORY)
    out["weights"], out["weights_history"] = p.decode()
    return out


def _attention_sessions(probe: "_Probe") -> tuple:
    """Two sessions of an attention probe: one at a short history, one that many tokens longer."""
    short, long = probe, probe.fork()
    short.infer(ATTENTION_HISTORY[0])
    long.infer(sum(ATTENTION_HISTORY))
    return short, long


def _sizes(probes: dict, precision: str) -> dict:
    """Bytes the probes move, as simkv counts them: the weights probe's weights (in the plugin's inference
    precision, the toy decoder's shape as ``simkv validate`` prices it) and one KV head's K and V per position."""
    from simkv.models import weights_bytes

    w, a = probes["weights"], probes[f"attention{ATTENTION_KV_HEADS[0]}"][0]
    model = toy_model_spec(w.scenario("prefill:1").scenario.model, w.spec.hidden_size, w.spec.vocab)
    kv = a.scenario("prefill:1").scenario
    return {"weight_bytes": weights_bytes(model, precision),
            "kv_bytes_per_head": kv.precision.kv_bytes_per_token(kv.model) / (a.spec.layers * a.spec.kv_heads)}


def _derive(raw: dict, spec, sizes: dict) -> dict:
    """One round's device figures from its raw timings (``spec``: the weights probe's shape)."""
    layer = max(0.0, (raw["tiny9"] - raw["tiny1"]) / 8)
    step = max(0.0, raw["tiny1"] - layer)
    few, many = ATTENTION_KV_HEADS
    per_kv_head = max(0.0, (raw[f"attention{many}"] - raw[f"attention{few}"]) / (many - few))
    per_query_head = max(1e-15, (raw[f"attention{few}"] - few * per_kv_head) / ATTENTION_PROBE["heads"])
    attention = spec.layers * raw["weights_history"] * (spec.heads * per_query_head + spec.kv_heads * per_kv_head)
    streaming = raw["weights"] - step - spec.layers * layer - attention
    return {"step_overhead_s": step, "layer_overhead_s": layer,
            "decode_attention_flops": 4.0 * ATTENTION_PROBE["head_dim"] / per_query_head,
            "kv_rate": sizes["kv_bytes_per_head"] / per_kv_head if per_kv_head > 0 else float("inf"),
            "weights_rate": sizes["weight_bytes"] / max(streaming, raw["weights"] * 0.05)}


def _copy_probe(probe: _Probe) -> dict:
    """The CPU plugin's own reallocation: a decode step that grows every layer's cache, in excess of its neighbours."""
    from simkv.ledger import COPY

    p, decode = COPY_PROBE_PROMPT, COPY_PROBE_DECODE
    tokens = [p, p - 24] + [1] * decode  # per inference: the prompt, the turn, the decode steps
    ops = f"prefill:{p},prefill:{p - 24},decode:{decode}"
    result = probe.scenario(ops)
    rows = result.ledger.rows
    copies = rows[rows["op"] == COPY]
    realloc = int(copies["step"].max())  # the decode step that grows the cache
    copied = float(copies["bytes"][copies["step"] == realloc].sum())
    first_decode = 2  # the first decode step after a prompt (cold kernels) is no neighbour
    near = [i for i in range(realloc - NEIGHBOURS, realloc + NEIGHBOURS + 1) if i != realloc and i > first_decode]
    excess = []
    for _ in range(COPY_PROBE_REPEATS):
        probe = probe.fork()  # fresh buffers: a request keeps its grown ones across reset_state
        times = np.array([probe.infer(n) for n in tokens])
        excess.append(times[realloc] - float(np.median(times[near])))
    return {"copied_bytes": copied, "excess_s": float(np.median(excess)), "ops": ops}


def _copy_bandwidth(repeats: int) -> float:
    src = np.ones(COPY_BYTES // 8, dtype=np.float64)

    def realloc():
        dst = np.empty_like(src)  # a fresh mapping: the copy faults its pages in, as a KV reallocation does
        np.copyto(dst, src)

    return COPY_BYTES / _median_time(realloc, repeats)


def _spread(values, scale: float, unit: str, digits: int = 2) -> str:
    values = np.asarray(values) * scale
    return f"median {np.median(values):.{digits}f} {unit} of {len(values)} rounds (range {values.min():.{digits}f}-{values.max():.{digits}f})"


def measure(threads: int | None = None, progress: bool = True) -> Device:
    """Run the measurements and return the host device (nothing written).

    ``simkv validate``'s clean runs fix glibc's mmap threshold (``MALLOC_MMAP_THRESHOLD_``), so every KV
    buffer the plugin allocates is a fresh mapping whose pages fault in when a reallocation's copy first
    touches them: ~1.6 GB/s here, where the same copy into reused heap memory ran at 2-6 GB/s. The
    measurements run under the same setting; glibc reads it at start-up, so they run in a child process
    unless this one already has it."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") == str(DEFAULT_MMAP_THRESHOLD):
        return _measure(threads, progress)
    import subprocess
    import sys
    import tempfile

    from simkv.errors import SimkvError

    with tempfile.TemporaryDirectory(prefix="simkv_calibrate_") as tmp:
        out = Path(tmp) / "host.json"
        env = child_env(MALLOC_MMAP_THRESHOLD_=str(DEFAULT_MMAP_THRESHOLD))
        cmd = [sys.executable, "-m", "simkv.validate.openvino.calibrate", str(out), str(threads or 0),
               "1" if progress else "0"]
        # the child's progress bar goes to this terminal; its error, one line, is the last line of its stderr
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=None if progress else subprocess.PIPE,
                              text=True)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
            raise SimkvError(f"calibration failed (exit {proc.returncode}): {lines[-1] if lines else 'see above'}")
        return Device.from_dict(json.loads(out.read_text()))


def _measure(threads: int | None, progress: bool) -> Device:
    import openvino as ov

    from .ovmodel import inference_precision

    precision = inference_precision()
    from simkv.validate.genai.calibrate import ROUNDS as PAGED_ROUNDS

    with tqdm(total=ROUNDS + 4 + PAGED_ROUNDS, desc="calibrate", unit="step", disable=None if progress else True, leave=False) as bar:
        probes = {"tiny1": _tiny(threads, 1), "tiny9": _tiny(threads, 9), "weights": _Probe(threads, **WEIGHTS_PROBE)}
        probes.update({f"attention{kv}": _attention_sessions(_Probe(threads, kv_heads=kv, **ATTENTION_PROBE))
                       for kv in ATTENTION_KV_HEADS})
        bar.update()
        sizes = _sizes(probes, precision)
        rounds = []
        for _ in range(ROUNDS):
            rounds.append(_derive(_round(probes), probes["weights"].spec, sizes))
            bar.update()
        rows, k2, n2 = MATMUL
        mm_model = _compile(_matmul_model(rows, k2, n2, seed=2), threads).create_infer_request()
        x = np.random.default_rng(1).standard_normal((rows, k2)).astype(np.float32)
        mm = _median_time(lambda: mm_model.infer({0: x}, share_outputs=True), repeats=7)
        bar.update()
        memcpy = _copy_bandwidth(repeats=7)
        bar.update()
        copy_probe = _copy_probe(probes[f"attention{ATTENTION_KV_HEADS[0]}"][0])
        bar.update()
        figure = {key: float(np.median([r[key] for r in rounds])) for key in rounds[0]} | sizes
        paged, paged_sources = _paged(figure["weights_rate"], precision, bar.update)
    overhead = figure["step_overhead_s"] + figure["layer_overhead_s"]
    flops = 2.0 * rows * k2 * n2 / max(mm - overhead, mm * 0.05)
    weights_rate, kv_rate = figure["weights_rate"], figure["kv_rate"]
    kv_efficiency = min(1.0, kv_rate / weights_rate)
    copy = copy_probe["copied_bytes"] / copy_probe["excess_s"] if copy_probe["excess_s"] > 0 else memcpy
    cpu = _cpu_name()
    how = f"median over {ROUNDS} interleaved rounds, this host"
    w, a = probes["weights"].spec, probes[f"attention{ATTENTION_KV_HEADS[0]}"][0].spec
    few, many = ATTENTION_KV_HEADS
    attention_probes = (f"{a.layers}-layer decoders with {a.heads} query heads over {few} or {many} KV heads x "
                        f"{a.head_dim} (hidden {a.hidden_size}), decoding at {ATTENTION_HISTORY[0]}+ and "
                        f"{sum(ATTENTION_HISTORY)}+ tokens of history: per layer and position, "
                        f"a x query heads + b x KV heads")
    return Device(
        name="host",
        description=f"this host ({cpu}, {os.cpu_count()} CPUs, OpenVINO {ov.__version__} CPU plugin"
        + (f", {threads} threads" if threads else "") + f"), calibrated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        memory_bytes=_memory_bytes(),
        memory_bandwidth=weights_rate,
        peak_flops={precision: flops},
        bandwidth_efficiency=1.0,
        kv_bandwidth_efficiency=kv_efficiency,
        decode_attention_flops=figure["decode_attention_flops"],
        attention_overlap=False,
        flops_efficiency=1.0,
        step_overhead_s=figure["step_overhead_s"],
        layer_overhead_s=figure["layer_overhead_s"],
        copy_bandwidth=copy,
        compute_precision=precision,
        paged=paged,
        sources={**{f"paged.{k}": v for k, v in paged_sources.items()},
            "memory_bandwidth": "the achieved weight-streaming rate of a decode step (bandwidth_efficiency)",
            "bandwidth_efficiency": f"1: measured: decode steps of a {w.layers}-layer, hidden-{w.hidden_size} decoder "
                                    f"at {WEIGHTS_PROBE_HISTORY}+ tokens ({figure['weight_bytes'] / 1e6:.0f} MB of "
                                    f"{precision} weights) minus overhead and attention: "
                                    + _spread([r["weights_rate"] for r in rounds], 1e-9, "GB/s") + "; " + how,
            "kv_bandwidth_efficiency": f"measured: b = the time per KV head and position of {attention_probes}: "
                                       f"{figure['kv_bytes_per_head']:.0f} B of K and V ({probes[f'attention{few}'][0].kv_precision}) / b = "
                                       + _spread([r["kv_rate"] for r in rounds], 1e-9, "GB/s")
                                       + (", over the weights' rate" if kv_efficiency < 1 else
                                          ", capped at the weights' rate") + "; " + how,
            "decode_attention_flops": f"measured: a = the time per query head and position of {attention_probes}: "
                                      f"4 x {a.head_dim} FLOPs / a = "
                                      + _spread([r["decode_attention_flops"] for r in rounds], 1e-9, "GFLOP/s", 1)
                                      + "; " + how,
            "attention_overlap": "false: the plugin's one-token attention (mha_single_token_kernel) walks the rows and "
                                 "computes in turn; the probes' times fit a sum of the two terms",
            "peak_flops": f"measured (achieved): CPU plugin MatMul {MATMUL[0]}x{MATMUL[1]}x{MATMUL[2]} in {precision}, "
                          "median of 7 after warm-up, this host",
            "flops_efficiency": "1: peak_flops is already the achieved matmul rate",
            "step_overhead_s": "measured: decode step of a 1-layer, hidden-64 stateful decoder on the CPU plugin, "
                               "minus one layer's share: " + _spread([r["step_overhead_s"] for r in rounds], 1e3, "ms", 3)
                               + "; " + how,
            "layer_overhead_s": "measured: (9-layer - 1-layer tiny decoder step) / 8: "
                                + _spread([r["layer_overhead_s"] for r in rounds], 1e3, "ms", 3) + "; " + how,
            "copy_bandwidth": f"measured: the CPU plugin's own KV reallocation in the {few}-KV-head attention probe, "
                              f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')} as in simkv "
                              "validate's clean runs (fresh pages fault in as the copy first touches them) "
                              f"({copy_probe['ops']}): {copy_probe['copied_bytes'] / 2**20:.1f} MiB copied "
                              f"(simkv's ledger) / {copy_probe['excess_s'] * 1e3:.2f} ms excess of that step over its "
                              f"neighbours' median, median of {COPY_PROBE_REPEATS} runs (a plain numpy copy into fresh "
                              f"pages: {memcpy / 1e9:.2f} GB/s), this host",
        },
    )


#: What ``simkv calibrate`` says where OpenVINO is not installed (as ``simkv validate`` does).
MISSING_OPENVINO = "calibrating this host needs OpenVINO: pip install 'simkv[openvino]'"


def check_openvino() -> None:
    """One line (:class:`~simkv.errors.SimkvError`) unless OpenVINO imports: before anything is measured."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        raise SimkvError(MISSING_OPENVINO) from None


def _paged(weights_rate: float, precision: str, progress) -> tuple[dict, dict]:
    """The paged-attention terms (simkv.validate.genai.calibrate), or none where openvino-genai is missing."""
    try:
        import openvino_genai  # noqa: F401
    except ImportError:
        return {}, {"paged": "not measured: openvino-genai is not installed (the serving engine then prices steps "
                    "with the stateful terms)"}
    from simkv.validate.genai.calibrate import measure_paged

    return measure_paged(weights_rate, precision, progress)


def calibrate(path: str | Path, threads: int | None = None, progress: bool = True) -> Device:
    """Measure this host and write its preset to ``path`` (JSON)."""
    device = measure(threads, progress)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(device.to_dict(), indent=1) + "\n")
    return device


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 34


if __name__ == "__main__":  # the child process of :func:`measure`: OUT.json THREADS(0: default) PROGRESS(0/1)
    import sys

    _out, _threads, _progress = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    try:
        Path(_out).write_text(json.dumps(_measure(_threads or None, _progress).to_dict()))
    except Exception as exc:  # noqa: BLE001 - one line for the parent to report, not a traceback
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)

"""``simkv calibrate``: measure this host and write the ``host`` device preset.

Every number of the preset is measured here, the way the OpenVINO CPU plugin runs an LLM step:

* **weight streaming** (``memory_bandwidth``, efficiency 1: the achieved rate itself; the KV cache streams
  at it too): one CPU-plugin inference of a single-row MatMul against a constant matrix far larger than the
  caches (a decode step's GEMV), minus the plugin's fixed overhead: bytes of the matrix / time;
* **matmul throughput** (``peak_flops`` in the plugin's inference precision, efficiency 1): a
  compute-bound MatMul ``[512, K] x [K, N]`` on the CPU plugin;
* **copy bandwidth** (``copy_bandwidth``): the plugin's own KV reallocation, timed on a 4-layer decoder
  with a wide cache: the bytes simkv's ledger copies at that step over the step's excess time (a plain
  copy into freshly allocated pages is reported beside it);
* **per-inference overhead** (``step_overhead_s``, ``layer_overhead_s``): decode steps of tiny stateful
  decoders (:func:`simkv.validate.ovmodel.build_stateful_decoder`, hidden 64) of 1 and 9 layers, where
  weights, KV and FLOPs are negligible;
* **decode attention rate** (``decode_attention_flops``): the same probe's ordinary decode steps at ~2k
  against ~1k tokens of history: the extra attention FLOPs (4 · heads · head_dim per attended position)
  over the extra time. The plugin's one-token attention (``mha_single_token_kernel`` in
  ``src/plugins/intel_cpu/src/nodes/kernels/scaled_attn/mha_single_token.cpp``) is a dot-product loop that
  dequantises each cached row once per query head, so its time follows query heads x positions, not the
  KV bytes: a rate of FLOPs, which carries over to grouped-query models (the KV-bytes rate would not).
  The KV bytes themselves stream at the weights' rate.

Each figure is the median of repeated timings after a warm-up. Models are compiled with the same
hints as ``simkv validate`` (``PERFORMANCE_HINT=LATENCY``). Needs ``openvino``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from simkv.cost import Device

#: Bytes of the weight-streaming matrix (f32): well beyond any last-level cache.
STREAM_BYTES = 256 << 20
COPY_BYTES = 256 << 20
MATMUL = (512, 2048, 2048)


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
    from simkv.validate.ovmodel import compile_cpu

    extra = {"INFERENCE_NUM_THREADS": threads} if threads else None
    return compile_cpu(model, extra_config=extra)


def _matmul_model(rows: int, k: int, n: int, seed: int = 0):
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([rows, k], ov.Type.f32, name="x")
    w = (np.random.default_rng(seed).standard_normal((k, n)) * 0.02).astype(np.float32)
    y = ops.matmul(x, ops.constant(w), False, False)
    return ov.Model([ops.result(y)], [x], "simkv_calibrate_matmul")


def _infer_time(compiled, rows: int, k: int, repeats: int) -> float:
    request = compiled.create_infer_request()
    x = np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)
    return _median_time(lambda: request.infer({0: x}, share_outputs=True), repeats)


def _overhead(threads: int | None, repeats: int, layers: int = 1) -> float:
    from simkv.validate.ovmodel import ToyDecoderSpec, build_stateful_decoder

    spec = ToyDecoderSpec(layers=layers, heads=1, kv_heads=1, head_dim=64, vocab=16)
    compiled = _compile(build_stateful_decoder(spec), threads)
    request = compiled.create_infer_request()
    ids = np.zeros((1, 1), dtype=np.int64)
    beam = np.zeros(1, dtype=np.int32)
    state = {"length": 0}

    def step():
        length = state["length"]
        request.infer({"input_ids": ids, "attention_mask": np.ones((1, length + 1), dtype=np.int64),
                       "position_ids": np.full((1, 1), length, dtype=np.int64), "beam_idx": beam},
                      share_outputs=True)
        state["length"] = length + 1

    return _median_time(step, repeats, warmup=5)


#: The KV probe: a 4-layer grouped-query decoder (32 query heads over 8 KV heads x 128: the layout of
#: Llama-3, Qwen2, Mistral) runs prompt P (capacity 2P), a chat turn to 2P - 24 tokens, 40 decode steps (the
#: 25th grows the cache to 2 (2P + 1)), a turn to ~4P and 16 more decode steps. The reallocating step's
#: excess gives the copy rate; the ordinary steps at ~4P against those at ~2P give the decode-attention rate
#: (FLOPs per second of one-token attention).
KV_PROBE_SHAPE = {"layers": 4, "heads": 32, "kv_heads": 8, "head_dim": 128, "hidden": 256, "vocab": 64}
KV_PROBE_PROMPT = 512
#: Clean runs of each probe (the figures are medians over them): its extra times are a few ms.
KV_PROBE_REPEATS = 3
NEIGHBOURS = 8


def _probe_name() -> str:
    shape = KV_PROBE_SHAPE
    return f"{shape['layers']}-layer {shape['heads']}/{shape['kv_heads']}-head x {shape['head_dim']}"


def _kv_probe_ops(p: int) -> str:
    # capacity 2p; the turn fills to 2p - 24; 40 decode steps (the 25th grows it to 4p + 2) end at 2p + 16;
    # the second turn fills to 4p - 22, and 16 decode steps stay inside the capacity
    return f"prefill:{p},prefill:{p - 24},decode:40,prefill:{2 * p - 38},decode:16"


def _kv_probe(threads: int | None, repeats: int) -> dict:
    """The CPU plugin's own reallocation and decode attention, on the KV probe decoder."""
    from simkv.ledger import COPY, PHASE_CODE
    from simkv.scenario import build_scenario, simulate
    from simkv.validate.ovmodel import ToyDecoderSpec, build_stateful_decoder, compile_checked

    shape = KV_PROBE_SHAPE
    model = build_stateful_decoder(ToyDecoderSpec(**shape))
    compiled, inspection = compile_checked(model, None, None)
    if threads:  # recompile with the thread count (compile_checked takes no extra config)
        compiled = _compile(model, threads)
    ops = _kv_probe_ops(KV_PROBE_PROMPT)
    scenario = build_scenario(model=None, layers=shape["layers"], heads=shape["heads"], kv_heads=shape["kv_heads"],
                              head_dim=shape["head_dim"], precision=inspection.kv_cache_precision or "u8",
                              policy="openvino-cpu", ops=ops)
    result = simulate(scenario)
    rows, steps = result.ledger.rows, result.steps
    copies = rows[rows["op"] == COPY]
    realloc = int(copies["step"].max())  # the decode step that grows the cache
    copied = float(copies["bytes"][copies["step"] == realloc].sum())
    decode = steps["phase"] == PHASE_CODE["decode"]
    first = decode & ~np.r_[False, decode[:-1]]
    ordinary = decode & ~first & (np.arange(len(steps)) != realloc)
    second = np.arange(len(steps)) > np.flatnonzero(~decode)[-1]  # the decode run after the second turn
    low, high = np.flatnonzero(ordinary & ~second), np.flatnonzero(ordinary & second)
    rng = np.random.default_rng(0)
    excess, slopes = [], []
    for _ in range(repeats):
        request = compiled.create_infer_request()
        times, length = [], 0
        for op in ops.split(","):
            kind, n = op.split(":")
            for tokens in ([int(n)] if kind == "prefill" else [1] * int(n)):
                ids = rng.integers(0, shape["vocab"], (1, tokens), dtype=np.int64)
                inputs = {"input_ids": ids, "attention_mask": np.ones((1, length + tokens), dtype=np.int64),
                          "position_ids": np.arange(length, length + tokens, dtype=np.int64)[None, :],
                          "beam_idx": np.zeros(1, dtype=np.int32)}
                t0 = time.perf_counter()
                request.infer(inputs, share_outputs=True)
                times.append(time.perf_counter() - t0)
                length += tokens
        times = np.array(times)
        near = [i for i in range(realloc - NEIGHBOURS, realloc + NEIGHBOURS + 1) if i in set(low)]
        excess.append(times[realloc] - float(np.median(times[near])))
        slopes.append(float(np.median(times[high]) - np.median(times[low])))
    extra_tokens = float(np.mean(steps["tokens"][high]) - np.mean(steps["tokens"][low]))
    model = scenario.model
    return {"copied_bytes": copied, "excess_s": float(np.median(excess)),
            "attention_extra_flops": 4.0 * model.layers * model.heads * model.head_dim * extra_tokens,
            "kv_extra_bytes": extra_tokens * scenario.precision.kv_bytes_per_token(model),
            "kv_extra_s": float(np.median(slopes))}


def _layer_overhead(threads: int | None, repeats: int, base: float) -> float:
    """Per-layer share of the plugin's fixed cost: a 9-layer tiny decoder's step minus the 1-layer one's, / 8."""
    nine = _overhead(threads, repeats, layers=9)
    return max(0.0, (nine - base) / 8)


def _copy_bandwidth(repeats: int) -> float:
    src = np.ones(COPY_BYTES // 8, dtype=np.float64)

    def realloc():
        dst = np.empty_like(src)  # a fresh mapping: the copy faults its pages in, as a KV reallocation does
        np.copyto(dst, src)

    return COPY_BYTES / _median_time(realloc, repeats)


def inference_precision(threads: int | None = None) -> str:
    """The precision the CPU plugin computes in by default on this host (bf16 with AMX/AVX-512-BF16, else f32)."""
    import openvino as ov

    value = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
    return value.to_string() if hasattr(value, "to_string") else str(value)


def measure(threads: int | None = None, progress: bool = True) -> Device:
    """Run the four measurements and return the host device (nothing written)."""
    import openvino as ov

    precision = inference_precision(threads)
    with tqdm(total=6, desc="calibrate", unit="measurement", disable=None if progress else True, leave=False) as bar:
        overhead = _overhead(threads, repeats=150)
        bar.update()
        per_layer = _layer_overhead(threads, 60, overhead)
        bar.update()
        k = 4096
        n = STREAM_BYTES // (4 * k)
        stream = _infer_time(_compile(_matmul_model(1, k, n), threads), 1, k, repeats=15)
        weights_rate = (k * n * 4) / max(stream - overhead, stream * 0.05)
        bar.update()
        rows, k2, n2 = MATMUL
        mm = _infer_time(_compile(_matmul_model(rows, k2, n2, seed=2), threads), rows, k2, repeats=7)
        flops = 2.0 * rows * k2 * n2 / max(mm - overhead, mm * 0.05)
        bar.update()
        memcpy = _copy_bandwidth(repeats=7)
        bar.update()
        probe = _kv_probe(threads, repeats=KV_PROBE_REPEATS)
        bar.update()
    copy = probe["copied_bytes"] / probe["excess_s"] if probe["excess_s"] > 0 else memcpy
    attention = probe["attention_extra_flops"] / probe["kv_extra_s"] if probe["kv_extra_s"] > 0 else None
    cpu = _cpu_name()
    how = "median of repeats after warm-up, this host"
    return Device(
        name="host",
        description=f"this host ({cpu}, {os.cpu_count()} CPUs, OpenVINO {ov.__version__} CPU plugin"
        + (f", {threads} threads" if threads else "") + f"), calibrated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        memory_bytes=_memory_bytes(),
        memory_bandwidth=weights_rate,
        peak_flops={precision: flops},
        bandwidth_efficiency=1.0,
        decode_attention_flops=attention,
        flops_efficiency=1.0,
        step_overhead_s=max(0.0, overhead - per_layer),
        layer_overhead_s=per_layer,
        copy_bandwidth=copy,
        compute_precision=precision,
        sources={
            "memory_bandwidth": "the achieved weight-streaming rate below (the KV cache streams at it too)",
            "bandwidth_efficiency": f"1: measured: CPU plugin MatMul [1,{k}]x[{k},{n}] f32 constant, "
                                    f"{k * n * 4 >> 20} MiB per inference minus the overhead: "
                                    f"{weights_rate / 1e9:.2f} GB/s; {how}",
            "decode_attention_flops": (f"measured: decode steps of a {_probe_name()} decoder at ~2k vs ~1k tokens of "
                                       f"history: {probe['attention_extra_flops'] / 1e6:.1f} MFLOP more attention "
                                       f"({probe['kv_extra_bytes'] / 2**20:.1f} MiB more KV) in "
                                       f"{probe['kv_extra_s'] * 1e3:.3f} ms more: {attention / 1e9:.2f} GFLOP/s; " + how)
                                      if attention else "not resolved (no slower step at the longer history): "
                                                        "as the matmuls",
            "peak_flops": f"measured (achieved): CPU plugin MatMul {MATMUL[0]}x{MATMUL[1]}x{MATMUL[2]} in {precision}; {how}",
            "flops_efficiency": "1: peak_flops is already the achieved matmul rate",
            "step_overhead_s": "measured: decode step of a 1-layer, hidden-64 stateful decoder on the CPU plugin, "
                               "minus one layer's share; " + how,
            "layer_overhead_s": "measured: (9-layer - 1-layer tiny decoder step) / 8; " + how,
            "copy_bandwidth": f"measured: the CPU plugin's own KV reallocation in a {_probe_name()} decoder "
                              f"({_kv_probe_ops(KV_PROBE_PROMPT)}): {probe['copied_bytes'] / 2**20:.1f} MiB copied "
                              f"(simkv's ledger) / {probe['excess_s'] * 1e3:.2f} ms excess of that step over its "
                              f"neighbours' median, median of {KV_PROBE_REPEATS} runs (a plain numpy copy into fresh pages: "
                              f"{memcpy / 1e9:.2f} GB/s); {how}",
        },
    )


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

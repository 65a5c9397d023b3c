"""``simkv calibrate``: measure this host and write the ``host`` device preset.

Every number of the preset is measured here, the way the OpenVINO CPU plugin runs an LLM step:

* **weight streaming** (``memory_bandwidth``, efficiency 1): one CPU-plugin inference of a single-row
  MatMul against a constant matrix far larger than the caches (a decode step's GEMV), minus the
  plugin's fixed overhead: bytes of the matrix / time;
* **matmul throughput** (``peak_flops`` in the plugin's inference precision, efficiency 1): a
  compute-bound MatMul ``[512, K] x [K, N]`` on the CPU plugin;
* **copy bandwidth** (``copy_bandwidth``): copying a buffer into a *freshly allocated* one, as a KV
  reallocation does (the new pages are faulted in by the copy);
* **per-inference overhead** (``step_overhead_s``): a decode step of a tiny stateful decoder
  (:func:`simkv.validate.ovmodel.build_stateful_decoder`, one layer, hidden 64), where weights, KV and
  FLOPs are negligible.

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


def _overhead(threads: int | None, repeats: int) -> float:
    from simkv.validate.ovmodel import ToyDecoderSpec, build_stateful_decoder

    compiled = _compile(build_stateful_decoder(ToyDecoderSpec(layers=1, heads=1, kv_heads=1, head_dim=64, vocab=16)), threads)
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
    with tqdm(total=4, desc="calibrate", unit="measurement", disable=None if progress else True, leave=False) as bar:
        overhead = _overhead(threads, repeats=200)
        bar.update()
        k = 4096
        n = STREAM_BYTES // (4 * k)
        stream = _infer_time(_compile(_matmul_model(1, k, n), threads), 1, k, repeats=15)
        bandwidth = (k * n * 4) / max(stream - overhead, stream * 0.05)
        bar.update()
        rows, k2, n2 = MATMUL
        mm = _infer_time(_compile(_matmul_model(rows, k2, n2, seed=2), threads), rows, k2, repeats=7)
        flops = 2.0 * rows * k2 * n2 / max(mm - overhead, mm * 0.05)
        bar.update()
        copy = _copy_bandwidth(repeats=7)
        bar.update()
    cpu = _cpu_name()
    how = "median of repeats after warm-up, this host"
    return Device(
        name="host",
        description=f"this host ({cpu}, {os.cpu_count()} CPUs, OpenVINO {ov.__version__} CPU plugin"
        + (f", {threads} threads" if threads else "") + f"), calibrated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        memory_bytes=_memory_bytes(),
        memory_bandwidth=bandwidth,
        peak_flops={precision: flops},
        bandwidth_efficiency=1.0,
        flops_efficiency=1.0,
        step_overhead_s=overhead,
        copy_bandwidth=copy,
        compute_precision=precision,
        sources={
            "memory_bandwidth": f"measured (achieved): CPU plugin MatMul [1,{k}]x[{k},{n}] f32 constant, "
                                f"{k * n * 4 >> 20} MiB per inference minus the overhead; {how}",
            "peak_flops": f"measured (achieved): CPU plugin MatMul {MATMUL[0]}x{MATMUL[1]}x{MATMUL[2]} in {precision}; {how}",
            "bandwidth_efficiency": "1: memory_bandwidth is already the achieved weight-streaming rate",
            "flops_efficiency": "1: peak_flops is already the achieved matmul rate",
            "step_overhead_s": "measured: decode step of a 1-layer, hidden-64 stateful decoder on the CPU plugin; " + how,
            "copy_bandwidth": f"measured: numpy copy of {COPY_BYTES >> 20} MiB into a freshly allocated buffer "
                              f"(page faults included, as in a reallocation); {how}",
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

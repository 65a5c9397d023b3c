"""Where a real decode step's time per sequence goes: OpenVINO's per-node counters on GenAI's paged model.

``simkv validate --serving --stage steps`` times ``ContinuousBatchingPipeline.step()`` at fixed decode batches;
this script opens the same step up. GenAI exposes no per-node counters of its pipeline (``PipelineMetrics`` holds
requests and cache usage only), so the script builds the model the pipeline runs itself:

* the toy model of ``simkv validate --serving`` (6 layers, hidden 1,024, 16/8 heads x 128, vocab 512), read and
  turned into its paged form by ``openvino._offline_transformations.paged_attention_transformation`` -- the
  ``ov::pass::SDPAToPagedAttention`` pass GenAI applies in ``utils::apply_paged_attention_transformations``
  (openvino.genai src/cpp/src/utils/paged_attention_transformations.cpp);
* compiled on CPU with the pipeline's properties (``INFERENCE_NUM_THREADS`` 1, ``KV_CACHE_PRECISION`` u8: the
  compiled key/value cache inputs are ``[blocks, 8, 40, 128]`` / ``[blocks, 8, 32, 136]`` u8, block size 32,
  as the pipeline's cache manager reads them) plus ``PERF_COUNT``;
* fed one decode step of ``b`` sequences the way GenAI's ``ModelRunner::forward`` lays it out: one token per
  sequence (``input_ids`` / ``position_ids`` ``[b]``), ``past_lens`` = cached tokens, ``subsequence_begins``
  0..b, each sequence its own blocks (``block_indices`` / ``block_indices_begins``), ``max_context_len``.

For each batch: the median over repeats of ``infer()`` wall time and of each node type's summed ``real_time``
(``InferRequest.get_profiling_info``), next to the median ``step()`` of the real pipeline at the same batch
(:func:`simkv.validate.genai.live.time_steps`, same context). Their difference is GenAI's own host work per step
(scheduling, input building, sampling outside the graph). Writes one CSV row per (batch, part):

    taskset -c 0 python experiments/genai_decode_profile.py --out experiments/data/genai_decode_profile.csv

Run it on a quiet machine (one core pinned, about two minutes).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simkv.validate.genai.live import time_steps  # noqa: E402
from simkv.validate.genai.model import GenaiModelSpec, model_dir  # noqa: E402
from simkv.validate.genai.serving import DECODE_CONTEXT, DEFAULT_SHAPE  # noqa: E402

SPEC = GenaiModelSpec(**DEFAULT_SHAPE)  # the model ``validate --serving`` runs
CONTEXT = DECODE_CONTEXT  # the prompt of its decode steps
BLOCK = 32  # the CPU plugin's paged block size (the compiled value cache input's third dimension)


def compiled_paged_model(path: Path):
    import openvino as ov
    from openvino._offline_transformations import paged_attention_transformation

    core = ov.Core()
    model = core.read_model(path / "openvino_model.xml")
    paged_attention_transformation(model)
    return core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": 1, "KV_CACHE_PRECISION": "u8",
                                             "PERF_COUNT": True})


def decode_inputs(compiled, batch: int, context: int, rng: np.random.Generator) -> dict:
    """One decode step of ``batch`` sequences of ``context`` cached tokens each (module docstring)."""
    per_seq = -(-(context + 1) // BLOCK)
    inputs = {
        "input_ids": rng.integers(259, 512, batch).astype(np.int64),
        "position_ids": np.full(batch, context, np.int64),
        "max_context_len": np.array(context + 1, np.int32),
        "past_lens": np.full(batch, context, np.int32),
        "subsequence_begins": np.arange(batch + 1, dtype=np.int32),
        "block_indices_begins": (np.arange(batch + 1) * per_seq).astype(np.int32),
        "block_indices": np.arange(batch * per_seq, dtype=np.int32),
    }
    for port in compiled.inputs:
        name = port.get_any_name()
        if name.startswith(("key_cache", "value_cache")):
            shape = [batch * per_seq, *[d.get_length() for d in list(port.get_partial_shape())[1:]]]
            inputs[name] = rng.integers(0, 255, shape).astype(np.uint8)
    return inputs


def profile(compiled, batch: int, repeats: int, warmup: int) -> tuple[float, dict[str, float]]:
    """Median infer wall time (ms) and median summed real time per node type (ms) over ``repeats``."""
    import openvino as ov

    request = compiled.create_infer_request()
    inputs = decode_inputs(compiled, batch, CONTEXT, np.random.default_rng(batch))
    for name, array in inputs.items():
        # OpenVINO-allocated tensors, as GenAI's cache manager allocates its caches (a numpy array shared in
        # place measured slower: the plugin may copy an input it cannot use in place, outside every counter)
        tensor = ov.Tensor(ov.Type(array.dtype), array.shape)
        tensor.data[...] = array
        request.set_tensor(name, tensor)
    walls, by_type = [], defaultdict(list)
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        request.infer()
        wall = time.perf_counter() - t0
        if i < warmup:
            continue
        walls.append(wall * 1e3)
        sums: dict[str, float] = defaultdict(float)
        for node in request.get_profiling_info():
            sums[node.node_type] += node.real_time.total_seconds() * 1e3
        for kind, ms in sums.items():
            by_type[kind].append(ms)
    return statistics.median(walls), {k: statistics.median(v) for k, v in by_type.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,4,8,16,32")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("genai_decode_profile.csv"))
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    path = model_dir(SPEC)
    compiled = compiled_paged_model(path)
    real = time_steps(str(path), decode_batches=batches, prefill_chunks=[], context=CONTEXT,
                      warmup=args.warmup, repeats=args.repeats)
    rows = []
    for entry in real["decode"]:
        b = entry["batch"]
        wall, by_type = profile(compiled, b, args.repeats, args.warmup)
        step = statistics.median(entry["times_s"]) * 1e3
        rows.append((b, "pipeline step()", step))
        rows.append((b, "model infer()", wall))
        rows.append((b, "outside the graph (step - infer)", step - wall))
        rows.append((b, "all nodes (sum of counters)", sum(by_type.values())))
        rows += [(b, f"node {k}", v) for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["batch", "part", "ms"])
        writer.writerows((b, part, f"{ms:.4f}") for b, part, ms in rows)
    for b, part, ms in rows:
        print(f"{b:3d}  {part:40s} {ms:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

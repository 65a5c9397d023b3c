"""Linear-attention states under the OpenVINO policies, worked out by hand (no OpenVINO needed).

The model is the tiny Qwen3-Next export of docs/DESIGN.md §4c: three linear-attention layers, each with a
conv state of 2·2·32 + 4·32 = 256 channels × kernel 4 = 1,024 elements and a recurrent state of
4 value heads × 32 × 32 = 4,096 elements, then one full-attention layer of 2 KV heads × 32.

Measured on the CPU plugin (openvino 2026.4.1, the export and simkv's hybrid toy, tests/test_validate_states.py):
both states in the *inference* precision (bf16 here) whatever the KV precision, two buffers per state
(``VariableStateDoubleBuffer``) allocated in the first inference, nothing while decoding, on a batch growth
one buffer of each state replaced in that inference and the other in the next, nothing on a select, a
reset or a prompt that fits — as ``openvino-cpu`` simulates it (``double_buffered_states``:
simkv/engine/state_buffers.py).
"""

from __future__ import annotations

from collections import Counter

import pytest

from policies import get_policy
from simkv.kvspec import LayerKV
from simkv.ledger import OPS, TENSORS
from simkv.models import ModelSpec
from simkv.precision import get_precision
from simkv.scenario import Scenario, simulate
from simkv.workload import parse_ops

LINEAR = LayerKV("linear", conv_elements=256 * 4, recurrent_elements=4 * 32 * 32)
FULL = LayerKV("full", 2, 32, 32)
QWEN3_NEXT_TINY = ModelSpec("qwen3-next-tiny", 4, 4, 2, 32, layer_kv=(LINEAR, LINEAR, LINEAR, FULL))
OPS_TEXT = "prefill:16,decode:20,fork:3,decode:1,select:1,reset,prefill:4"  # steps 0, 1-20, 21, 22, 23, 24, 25
STATES = ("conv_state", "recurrent_state")


def _run(policy: str, precision: str = "bf16", **options):
    scenario = Scenario(QWEN3_NEXT_TINY, get_precision(precision), get_policy(policy, options), parse_ops(OPS_TEXT))
    return simulate(scenario)


def _state_rows(result):
    return [(int(r["step"]), int(r["layer"]), TENSORS[r["tensor"]], OPS[r["op"]], int(r["bytes"]))
            for r in result.ledger.rows if TENSORS[r["tensor"]] in STATES and OPS[r["op"]] != "copy"]


@pytest.mark.parametrize("precision", ["u8", "bf16", "f32"])
def test_cpu_states_are_in_the_inference_precision_whatever_the_kv_precision(precision):
    # bf16 (the plugin's inference precision on this CPU): conv 1,024 x 2 = 2,048 B, recurrent 4,096 x 2 =
    # 8,192 B per sequence (transformers' rule would give 16,384 B, an f32 recurrent state). Two buffers
    # each: the read ones in layer order, then the written ones (recurrent with its layer, conv at the end).
    rows = _state_rows(_run("openvino-cpu", precision))
    first = [r for r in rows if r[0] == 0]
    assert first == ([(0, layer, kind, "alloc", size) for layer in (0, 1, 2)
                      for kind, size in (("conv_state", 2048), ("recurrent_state", 8192))]
                     + [(0, layer, "recurrent_state", "alloc", 8192) for layer in (0, 1, 2)]
                     + [(0, layer, "conv_state", "alloc", 2048) for layer in (2, 1, 0)])
    assert not [r for r in rows if 1 <= r[0] <= 20]  # nothing while decoding


def test_cpu_states_follow_state_precision_and_gpu_states_its_inference_precision():
    f32 = [r for r in _state_rows(_run("openvino-cpu", state_precision="f32")) if r[0] == 0]
    assert {r[4] for r in f32} == {1024 * 4, 4096 * 4}  # INFERENCE_PRECISION_HINT=f32: 4,096 and 16,384 B
    gpu = [r for r in _state_rows(_run("openvino-gpu", "f16")) if r[0] == 0]
    assert {r[4] for r in gpu} == {2048, 8192}  # f16 inference: 2 B per element, both states
    gpu32 = [r for r in _state_rows(_run("openvino-gpu", "f16", inference_precision="f32")) if r[0] == 0]
    assert {r[4] for r in gpu32} == {4096, 16384}


# The measured per-step state events (multisets; the order within a step depends on the graph): per layer
# and state, two buffers at the first inference (3 x (2 x 2,048 + 2 x 8,192)); at the fork to 3 beams one
# buffer of each state grows (+3 x 2,048 = 6,144, -2,048; +3 x 8,192 = 24,576, -8,192), in the next
# inference the other one; nothing on the select (buffers never shrink), the reset or the 4-token prompt.
MEASURED = {
    0: Counter({("conv_state", "alloc", 2048): 6, ("recurrent_state", "alloc", 8192): 6}),
    21: Counter({("conv_state", "alloc", 6144): 3, ("conv_state", "free", 2048): 3,
                 ("recurrent_state", "alloc", 24576): 3, ("recurrent_state", "free", 8192): 3}),
    22: Counter({("conv_state", "alloc", 6144): 3, ("conv_state", "free", 2048): 3,
                 ("recurrent_state", "alloc", 24576): 3, ("recurrent_state", "free", 8192): 3}),
}


def test_cpu_state_events_per_step_as_measured():
    per_step: dict[int, Counter] = {}
    for step, _layer, kind, op, size in _state_rows(_run("openvino-cpu")):
        per_step.setdefault(step, Counter())[(kind, op, size)] += 1
    assert per_step == MEASURED

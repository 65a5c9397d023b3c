"""A hybrid model's linear-attention states on the real OpenVINO CPU plugin (seconds; no export needed).

simkv's toy decoder with two of its four layers linear attention (``ToyDecoderSpec.linear_layers``): each
keeps a conv state ``[B, 32, 4]`` and a recurrent state ``[B, 2, 16, 16]`` as plain ReadValue/Assign
variables, the form a Qwen3-Next export has (docs/DESIGN.md §4c). The observer finds their buffers by
content (simkv/validate/openvino/statebufs.py); the sequence below is what the plugin does with them.
Skipped when openvino or memray is not importable.
"""

from __future__ import annotations

import pytest

pytest.importorskip("openvino")
pytest.importorskip("memray")

pytestmark = pytest.mark.openvino

from simkv.validate.openvino.cleanrun import observer_scenario  # noqa: E402
from simkv.validate.openvino.irspec import read_ir_layers  # noqa: E402
from simkv.validate.openvino.observe import kv_dims_from_model, observe  # noqa: E402
from simkv.validate.openvino.ovmodel import build_stateful_decoder, compile_checked  # noqa: E402
from simkv.validate.openvino.toy import ToyDecoderSpec  # noqa: E402
from simkv.workload import parse_ops  # noqa: E402

SPEC = ToyDecoderSpec(layers=4, heads=2, kv_heads=2, head_dim=16, linear_layers=(0, 2))
# steps: 0 prefill, 1-2 decode, 3 fork to 3, 4-5 decode, 6 select, 7 decode, 8 reset, 9 prefill
OPS = "prefill:8,decode:2,fork:3,decode:2,select:1,decode:1,reset,prefill:4"
# bf16 (the plugin's inference precision here; the KV cache is u8): conv 32 x 4 = 128 elements = 256 B,
# recurrent 2 x 16 x 16 = 512 elements = 1,024 B per sequence; x3 after the fork: 768 B and 3,072 B.
GROW = [(op, kind, layer, size) for layer in (0, 2)
        for kind, new, old in (("recurrent_state", 3072, 1024), ("conv_state", 768, 256))
        for op, size in (("alloc", new), ("free", old))]
MEASURED = {
    # two buffers per state, all before the attention layers' KV: the ReadValue's then the Assign's
    0: [("alloc", kind, layer, size) for _ in range(2) for layer in (0, 2)
        for kind, size in (("recurrent_state", 1024), ("conv_state", 256))],
    3: GROW,  # the fork: the buffer written in this inference grows (new, then the old freed)
    4: GROW,  # the next inference: the other one
}


@pytest.fixture(scope="module")
def hybrid():
    model = build_stateful_decoder(SPEC)
    compiled, inspection = compile_checked(model)
    return model, compiled, inspection


def test_the_ir_reads_as_a_hybrid_model(hybrid):
    model, _, inspection = hybrid
    layers = read_ir_layers(model)
    assert [spec.kind for spec in layers.layer_kv] == ["linear", "full", "linear", "full"]
    assert layers.layer_kv[0].conv_elements == 128 and layers.layer_kv[0].recurrent_elements == 512
    assert inspection.fused and inspection.n_state_variables == 4
    dims = kv_dims_from_model(model, inspection.kv_cache_precision)
    assert (dims.layers, dims.layer_ids) == (2, (1, 3))


def test_states_are_double_buffered_grown_one_inference_apart_and_never_shrunk(hybrid):
    model, compiled, inspection = hybrid
    if inspection.state_precision != "bf16":
        pytest.skip(f"the plugin computes in {inspection.state_precision} on this CPU (the sizes assume bf16)")
    dims = kv_dims_from_model(model, inspection.kv_cache_precision)
    obs = observe(compiled, observer_scenario(parse_ops(OPS)), dims=dims, model=model, inspection=inspection,
                  progress=False)
    assert obs.facts.warnings == []
    states = {}
    for e in obs.kv_events():
        if e.kind in ("conv_state", "recurrent_state"):
            states.setdefault(e.seq, []).append((e.op, e.kind, e.layer, e.bytes))
    assert states == MEASURED  # nothing while decoding, on the select, the reset or the new prompt
    kv_layers = {e.layer for e in obs.kv_events() if e.kind in ("k", "v")}
    assert kv_layers == {1, 3}  # KV events carry the model's layer numbers


def test_ir_with_a_window_in_its_config_validates_exactly_as_sliding_layers(tmp_path):
    """A stateful export keeps every token of a sliding layer (the window is only in the mask): an IR whose
    config.json names its layers sliding (window 8) and full is simulated with those kinds, and a decode far
    past the window matches event for event (docs/DESIGN.md §4c)."""
    import json

    import openvino as ov

    from simkv.validate.openvino.cleanrun import ValidateConfig
    from simkv.validate.openvino.runner import run_validation

    ov.save_model(build_stateful_decoder(ToyDecoderSpec(layers=2, heads=4, kv_heads=2, head_dim=32)),
                  str(tmp_path / "openvino_model.xml"))
    (tmp_path / "config.json").write_text(json.dumps(
        {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}))
    data = run_validation(ValidateConfig(workload="prefill:24,decode:40", ir=str(tmp_path), clean_run=False,
                                         progress=False))
    assert data["scenario"]["layer_kinds"] == ("ir: 2 layers (1 x sliding, window 8: 2 kv heads x 32; "
                                               "1 x full: 2 kv heads x 32)")
    assert data["events_missing"] == data["events_unexpected"] == 0 and data["events_matched"] > 20
    assert data["past_view"]["note"] == "exact"

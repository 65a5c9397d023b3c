"""Weight formats (simkv.weights) and a checkpoint's weights by format (simkv.models.params_by_format): bytes per
weight with their scales, worked out by hand from each format's layout, and which parts a quantization recipe
leaves unquantized."""

from __future__ import annotations

import pytest

from simkv import hfconfig
from simkv.errors import ConfigError
from simkv.models import CHECKPOINT, params_by_format, weights_bytes
from simkv.weights import FORMATS, scheme_of, weight_format


def test_bytes_per_weight_include_the_scales():
    # fp8 block: 1 B + one f32 scale per 128 x 128 block = 1 + 4 / 16,384
    assert FORMATS["fp8-block"].bytes_per_weight == 1 + 4 / 16_384
    # mxfp4: 4 bits + one e8m0 byte per 32 = 0.5 + 0.03125; nvfp4: 4 bits + one e4m3 byte per 16 = 0.5 + 0.0625
    assert FORMATS["mxfp4"].bytes_per_weight == 0.53125 and FORMATS["nvfp4"].bytes_per_weight == 0.5625
    # GPTQ/AWQ group 128: 0.5 + (f16 scale 2 B + packed 4-bit zero 0.5 B) / 128
    assert weight_format("int4-g128").bytes_per_weight == 0.5 + 2.5 / 128
    assert weight_format("int4-g32-sym").bytes_per_weight == 0.5 + 2 / 32  # compressed-tensors symmetric: bf16 scales
    # the formats of before keep their bytes (optimum-intel's per-channel scales are not counted)
    assert [FORMATS[n].bytes_per_weight for n in ("f32", "f16", "bf16", "int8", "int4")] == [4, 2, 2, 1, 0.5]
    with pytest.raises(ConfigError, match="unknown weight precision 'fp6'"):
        weight_format("fp6")


#: gpt-oss-20b's published config.json, the fields simkv reads (openai/gpt-oss-20b): no dtype, mxfp4 experts.
GPT_OSS_20B = {
    "model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32,
    "num_experts_per_tok": 4, "vocab_size": 201088, "tie_word_embeddings": False, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}}


def test_gpt_oss_20b_checkpoint_bytes_by_hand():
    m = hfconfig.parse_config(GPT_OSS_20B, name="gpt-oss-20b")
    # No dtype and a quantization_config: the unquantized tensors' bf16 (not torch's default float32).
    assert m.dtype == "bfloat16"
    # Per layer: attention in 2,880 x 64 x 64 + 2,880 x 8 x (64 + 64) = 14,745,600; out 64 x 64 x 2,880 = 11,796,480;
    # router 2,880 x 32 = 92,160; experts 32 x 3 x 2,880 x 2,880 = 796,262,400 (gate_up fused + down).
    roles = m.layer_roles(0)
    assert (roles["attn_in"], roles["attn_out"], roles["router"], roles["experts"]) == (
        14_745_600, 11_796_480, 92_160, 796_262_400)
    # bf16: 24 x (14,745,600 + 11,796,480 + 92,160) = 639,221,760 + embeddings and LM head 2 x 201,088 x 2,880
    # = 1,158,266,880 -> 1,797,488,640; mxfp4: 24 x 796,262,400 = 19,110,297,600
    assert params_by_format(m, CHECKPOINT) == {"bf16": 1_797_488_640, "mxfp4": 19_110_297_600}
    # 1,797,488,640 x 2 + 19,110,297,600 x 0.53125 = 3,594,977,280 + 10,152,345,600
    assert weights_bytes(m, CHECKPOINT) == 13_747_322_880
    assert weights_bytes(m, "bf16") == (1_797_488_640 + 19_110_297_600) * 2
    # One token: 4 of 32 experts per layer, no embedding lookup: 24 x 4 x 24,883,200 = 2,388,787,200 in mxfp4
    assert params_by_format(m, CHECKPOINT, active=True) == {"bf16": 639_221_760 + 579_133_440,
                                                            "mxfp4": 2_388_787_200}
    assert sum(params_by_format(m, CHECKPOINT, active=True).values()) == m.active_params


def test_exclusion_lists_name_parts_and_layers():
    # DeepSeek-V3.1-NVFP4 (ModelOpt): layer 0's four attention input projections stay bf16, its o_proj is nvfp4.
    scheme = scheme_of(None, {"quantization": {"quant_algo": "NVFP4", "exclude_modules": [
        "lm_head", "model.layers.0.self_attn.kv_a_proj_with_mqa", "model.layers.0.self_attn.q_b_proj"]}}, "bf16", "t")
    assert scheme.format_of("attn_in", 0) == "bf16" and scheme.format_of("attn_out", 0) == "nvfp4"
    assert scheme.format_of("attn_in", 1) == "nvfp4" and scheme.format_of("experts", 0) == "nvfp4"
    assert scheme.format_of("router", 3) == "bf16" and scheme.format_of("embed", None) == "bf16"
    # GLM-5.1-NVFP4: "model.layers.0*" leaves the whole of layer 0 unquantized
    scheme = scheme_of(None, {"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["model.layers.0*"]}},
                       "bf16", "t")
    assert {scheme.format_of(r, 0) for r in ("attn_in", "mlp", "experts", "shared")} == {"bf16"}
    assert scheme.format_of("experts", 10) == "nvfp4"
    # Kimi-K2.5 (compressed-tensors int4 group 32): attention, shared experts and dense MLPs by regex stay bf16
    scheme = scheme_of({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 32, "symmetric": True}}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]},
        None, "bf16", "t")
    assert scheme.quantized == "int4-g32-sym"
    assert [scheme.format_of(r, 5) for r in ("attn_in", "attn_out", "shared", "mlp", "experts")] == [
        "bf16", "bf16", "bf16", "bf16", "int4-g32-sym"]


def test_mtp_layer_module_names_are_skipped():
    """GLM-5-FP8 lists ``model.layers.78.eh_proj`` (its MTP layer: num_hidden_layers 78, layers 0-77) among the
    unquantized modules. The main model never loads layer 78 (vLLM DeepseekV2ForCausalLM.load_weights skips the
    spec-decode layers), so the name sets no rule; a name below the layer count still does, and without the count
    the name stays one simkv cannot place."""
    quant = {"quant_method": "fp8", "weight_block_size": [128, 128],
             "modules_to_not_convert": ["model.layers.78.eh_proj", "model.layers.77.self_attn.indexers_proj"]}
    scheme = scheme_of(quant, None, "bf16", "t", 78)
    assert scheme.rules == (("attn_in", 77, "bf16"),)
    assert scheme.format_of("attn_in", 77) == "bf16" and scheme.format_of("attn_in", 76) == "fp8-block"
    with pytest.raises(ConfigError, match="quantization module name 'model.layers.78.eh_proj'"):
        scheme_of(quant, None, "bf16", "t")


@pytest.mark.parametrize("quant, message", [
    ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not one simkv reads"),
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, "fp8 weight_block_size [64, 64]"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "gptq with bits 3"),
    ({"quant_method": "fp8", "modules_to_not_convert": ["model.mystery_block"]}, "cannot tell which weights"),
])
def test_unread_quantization_is_one_line(quant, message):
    with pytest.raises(ConfigError, match="^where: ") as err:
        scheme_of(quant, None, "bf16", "where")
    assert message in str(err.value) and "\n" not in str(err.value)

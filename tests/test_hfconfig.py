"""Hugging Face config.json files (simkv.hfconfig): golden byte counts worked out by hand from the shipped
configs, the per-layer kinds held equal to transformers 5.23's own cache layers, malformed files refused with
one line, and every shipped config run through ``simkv run --model PATH``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simkv import hfconfig
from simkv.cli import main as cli_main
from simkv.errors import ConfigError
from simkv.kvspec import request_bytes, state_bytes, token_bytes
from simkv.precision import get_precision

CONFIGS = Path(hfconfig.CONFIG_DIR)
FULL = sorted(CONFIGS.glob("*.json"))
TINY = sorted((CONFIGS / "tiny").glob("*.json"))
BF16 = get_precision("bf16")

try:
    import transformers  # noqa: F401

    HAVE_HF = True
except ImportError:  # the transformers extra is optional
    HAVE_HF = False
needs_hf = pytest.mark.skipif(not HAVE_HF, reason="needs pip install -e '.[transformers]'")


def groups(name):
    """{(kind, window, latent): (per-layer LayerKV, layer count)} of a shipped preset."""
    return {(s.kind, s.window, s.latent): (s, len(ids)) for s, ids in hfconfig.get_model(name).groups}


# -- golden numbers, by hand from the configs --------------------------------------------------------------------

def test_shipped_files_are_the_presets():
    assert [p.stem for p in FULL] == sorted(hfconfig.CONFIG_PRESETS)
    assert [p.stem for p in TINY] == ["deepseek_v3", "gemma3", "gpt_oss", "lfm2", "llama4", "qwen3_next"]
    assert set(hfconfig.all_presets()) == set(hfconfig.preset_names())


def test_gemma_3_27b_bytes_per_group():
    # text_config: 62 layers, sliding_window_pattern 6 -> layer i full when (i+1) % 6 == 0: 10 full, 52 sliding
    # (window 1024); 16 kv heads x head_dim 128. K+V per token per layer, bf16: 2 x 16 x 128 x 2 B = 8,192 B.
    g = groups("gemma-3-27b")
    sliding, n_sliding = g[("sliding", 1024, None)]
    full, n_full = g[("full", None, None)]
    assert (n_sliding, n_full) == (52, 10)
    assert token_bytes([sliding], BF16) == token_bytes([full], BF16) == 8_192
    m = hfconfig.get_model("gemma-3-27b")
    assert [i for i, layer in enumerate(m.kv_layers) if layer.kind == "full"] == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert token_bytes(m.kv_layers, BF16) == 62 * 8_192 == 507_904  # every token kept (OpenVINO)
    # 32k context, windows freed: 10 x 8,192 x 32,768 + 52 x 8,192 x 1,024 = 2,684,354,560 + 436,207,616
    assert request_bytes(m.kv_layers, BF16, 32_768) == 3_120_562_176
    assert request_bytes(m.kv_layers, BF16, 32_768, windows=False) == 507_904 * 32_768 == 16_642_998_272


def test_gpt_oss_20b_bytes_per_group():
    # 24 layers alternating from sliding (window 128) / full; 8 kv heads x 64; sinks on every layer (no bytes).
    # K+V per token per layer: 2 x 8 x 64 x 2 B = 2,048 B.
    g = groups("gpt-oss-20b")
    sliding, n_sliding = g[("sliding", 128, None)]
    full, n_full = g[("full", None, None)]
    assert (n_sliding, n_full) == (12, 12) and sliding.sinks and full.sinks
    assert token_bytes([sliding], BF16) == token_bytes([full], BF16) == 2_048
    m = hfconfig.get_model("gpt-oss-20b")
    assert [layer.kind for layer in m.kv_layers[:4]] == ["sliding", "full", "sliding", "full"]
    # 4,096 context: 12 x 2,048 x 4,096 + 12 x 2,048 x 128 = 100,663,296 + 3,145,728
    assert request_bytes(m.kv_layers, BF16, 4_096) == 103_809_024
    assert (m.experts, m.experts_per_token, m.expert_intermediate) == (32, 4, 2880)


def test_qwen3_next_80b_kv_and_state_bytes():
    # full_attention_interval 4: layers 3, 7, ..., 47 full (12), the other 36 Gated DeltaNet.
    # Full: 2 kv heads x 256: K+V 2 x 2 x 256 x 2 B = 2,048 B per token per layer, x 12 = 24,576 B.
    # Linear, per sequence per layer: conv (2 x 16 x 128 + 32 x 128) x kernel 4 = 32,768 elements, bf16 = 65,536 B;
    # recurrent 32 x 128 x 128 = 524,288 elements in f32 (transformers' torch path) = 2,097,152 B.
    g = groups("qwen3-next-80b-a3b")
    full, n_full = g[("full", None, None)]
    linear, n_linear = g[("linear", None, None)]
    assert (n_full, n_linear) == (12, 36)
    assert token_bytes([full], BF16) == 2_048
    assert (linear.conv_elements, linear.recurrent_elements) == (32_768, 524_288)
    assert state_bytes(linear, conv_bytes=2) == (65_536, 2_097_152)
    m = hfconfig.get_model("qwen3-next-80b-a3b")
    assert [i for i, layer in enumerate(m.kv_layers) if layer.kind == "full"] == list(range(3, 48, 4))
    assert token_bytes(m.kv_layers, BF16) == 24_576
    # 1,000 tokens: 24,576 x 1,000 + 36 x (65,536 + 2,097,152) = 24,576,000 + 77,856,768
    assert request_bytes(m.kv_layers, BF16, 1_000) == 102_432_768
    assert m.linear_dims == (16, 32, 128, 128, 4)
    assert (m.experts, m.experts_per_token, m.expert_intermediate, m.shared_intermediate) == (512, 10, 512, 512)


#: An LFM2-1.2B-shaped config as LFM2's files spell it (``block_ff_dim``, ``tie_embedding``, ``full_attn_idxs``
#: instead of ``layer_types``): 16 layers, attention on 6 of them, the rest short convolutions.
LFM2_LIKE = {"model_type": "lfm2", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
             "num_key_value_heads": 8, "conv_L_cache": 3, "block_ff_dim": 12288, "full_attn_idxs": [2, 5, 8, 10, 12, 14],
             "vocab_size": 65536, "tie_embedding": True, "dtype": "bfloat16"}


def test_lfm2_conv_state_and_kv_bytes():
    # Lfm2Config.__post_init__: full attention on full_attn_idxs, "conv" elsewhere (10 layers); head_dim 2048 / 32.
    # Full: 8 kv heads x 64: K+V 2 x 8 x 64 x 2 B = 2,048 B per token per layer, x 6 = 12,288 B.
    # Conv (Lfm2ShortConv, LinearAttentionLayer): conv state [B, hidden 2,048, conv_L_cache 3] = 6,144 elements,
    # bf16 = 12,288 B per sequence; no recurrent state (0 B, whatever its element size).
    m = hfconfig.parse_config(LFM2_LIKE, name="lfm2-like")
    assert [i for i, layer in enumerate(m.kv_layers) if layer.kind == "full"] == [2, 5, 8, 10, 12, 14]
    conv = m.kv_layers[0]
    assert (conv.kind, conv.conv_elements, conv.recurrent_elements) == ("linear", 6_144, 0)
    assert sum(layer.kind == "linear" for layer in m.kv_layers) == 10
    assert state_bytes(conv, conv_bytes=2) == (12_288, 0)
    assert token_bytes(m.kv_layers, BF16) == 12_288
    # 1,000 tokens: 12,288 x 1,000 + 10 x 12,288
    assert request_bytes(m.kv_layers, BF16, 1_000) == 12_410_880
    # Lfm2MLP: int(2 x 12,288 / 3) = 8,192, x 1.0, rounded up to a multiple of 256: 8,192 (block_ff_dim wins).
    # Weights: conv layers 4 x 2,048^2 + 2,048 x 3 = 16,783,360 (in_proj 3h x h, conv h x 3, out_proj h x h);
    # attention 2,048 x (32 + 8 + 8 + 32) x 64 = 10,485,760; MLP 3 x 2,048 x 8,192 = 50,331,648 per layer;
    # tied embeddings 65,536 x 2,048: 10 x 16,783,360 + 6 x 10,485,760 + 16 x 50,331,648 + 134,217,728.
    assert (m.intermediate, m.tied_embeddings, m.short_conv, m.dtype) == (8_192, True, 3, "bfloat16")
    assert m.weight_params == 1_170_272_256
    assert m.describe() == ("lfm2-like: 16 layers (10 x linear state: conv 6,144 elements (no recurrent state); "
                            "6 x full: 8 kv heads x 64)")


def test_lfm2_defaults_and_tensor_parallel_share():
    # No layer_types and no full_attn_idxs: Lfm2Config makes every layer full attention.
    plain = hfconfig.parse_config({"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 2}, name="p")
    assert [layer.kind for layer in plain.kv_layers] == ["full", "full"] and plain.kv_heads == 8
    # layer_types given: it wins; block_auto_adjust_ff_dim off keeps intermediate_size.
    m = hfconfig.parse_config({**LFM2_LIKE, "layer_types": ["conv", "full_attention"] * 8,
                               "block_auto_adjust_ff_dim": False}, name="t")
    assert [layer.kind for layer in m.kv_layers[:2]] == ["linear", "full"] and m.intermediate == 12_288
    # vLLM splits the short conv by channels: a 4-way share keeps 6,144 / 4 conv elements and 1/4 of its weights.
    from simkv.models import tp_shard

    share = tp_shard(m, 4)
    assert share.kv_layers[0].conv_elements == 1_536 and share.kv_layers[0].recurrent_elements == 0
    assert share.layer_params(0) == 16_783_360 // 4 + 3 * 2_048 * 12_288 // 4


def test_deepseek_v3_latent_vs_decompressed():
    # MLA on all 61 layers: the latent is kv_lora_rank 512 (keys) + qk_rope_head_dim 64 (values) per token:
    # (512 + 64) x 2 B = 1,152 B per layer; decompressed: 128 heads x (K 128 + 64 = 192, V 128) x 2 B = 81,920 B.
    (mla, n), = groups("deepseek-v3").values()
    assert n == 61 and mla.latent == (512, 64) and (mla.kv_heads, mla.k_dim, mla.v_dim) == (128, 192, 128)
    assert token_bytes([mla], BF16) == 1_152
    assert token_bytes([mla], BF16, mla="decompressed") == 81_920
    m = hfconfig.get_model("deepseek-v3")
    assert token_bytes(m.kv_layers, BF16) == 61 * 1_152 == 70_272
    assert token_bytes(m.kv_layers, BF16, mla="decompressed") == 61 * 81_920 == 4_997_120  # ~71x
    assert (m.experts, m.experts_per_token, m.expert_intermediate, m.shared_intermediate, m.dense_layers,
            m.q_lora_rank) == (256, 8, 2048, 2048, 3, 1536)


def test_llama_4_scout_chunked_and_full():
    # text_config: 48 layers, no_rope_layers [] -> every 4th layer (3, 7, ...) NoPE and full, the other 36 chunked
    # (attention_chunk_size 8192); 8 kv heads x 128: K+V 2 x 8 x 128 x 2 B = 4,096 B per token per layer.
    g = groups("llama-4-scout")
    chunked, n_chunked = g[("chunked", 8192, None)]
    full, n_full = g[("full", None, None)]
    assert (n_chunked, n_full) == (36, 12)
    assert token_bytes([chunked], BF16) == token_bytes([full], BF16) == 4_096
    m = hfconfig.get_model("llama-4-scout")
    assert [i for i, layer in enumerate(m.kv_layers) if layer.kind == "full"] == list(range(3, 48, 4))
    assert token_bytes(m.kv_layers, BF16) == 48 * 4_096 == 196_608
    assert (m.experts, m.experts_per_token, m.expert_intermediate, m.shared_intermediate, m.intermediate) == (
        16, 1, 8192, 8192, 16384)


def test_uniform_configs_are_plain_models():
    """A config whose layers are all alike is the same ModelSpec as a hand-written preset: the uniform fast path."""
    m = hfconfig.get_model("llama-3.1-8b")
    assert not m.layer_kv and (m.layers, m.heads, m.kv_heads, m.head_dim, m.sliding_window) == (32, 32, 8, 128, None)
    assert get_precision("f16").kv_bytes_per_token(m) == get_precision("f16").kv_bytes_per_token(
        hfconfig.get_model("llama-3-8b"))
    assert hfconfig.get_model("phi-4").head_dim == 128  # 5120 / 40: no head_dim in the file
    assert hfconfig.get_model("mistral-small-3.1").sliding_window is None  # null, not MistralConfig's 4096
    assert hfconfig.get_model("qwen3-30b-a3b").dense_layers == 0


def test_models_command_lists_groups(capsys):
    assert cli_main(["models"]) == 0
    out = capsys.readouterr().out
    for line in (
        "gemma-3-27b           52 x   8.00 KiB = 416.00 KiB/token     sliding, window 1024: 16 kv heads x 128; "
        "<= 1,024 tokens",
        "10 x   8.00 KiB =  80.00 KiB/token     full: 16 kv heads x 128",
        "qwen3-next-80b-a3b    36 x   2.06 MiB =  74.25 MiB/request   linear state: conv 32,768 + recurrent 524,288",
        "61 x   1.12 KiB =  68.62 KiB/token     full: MLA latent 512+64",
        "as decompressed: 80.00 KiB x 61 = 4.77 MiB/token",
    ):
        assert line in out
    assert all(name in out for name in hfconfig.preset_names())


# -- per-layer kinds equal transformers 5.23's ------------------------------------------------------------------

def transformers_layers(path) -> list[tuple[str, int | None]]:
    """(kind, window) per layer of ``DynamicCache(config=...)`` for the file's decoder config."""
    from transformers import AutoConfig, DynamicCache
    from transformers.cache_utils import (DummyLayer, DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionLayer,
                                          get_layer_types_and_kwargs)

    config = AutoConfig.from_pretrained(path).get_text_config(decoder=True)
    types, _ = get_layer_types_and_kwargs(config)
    out = []
    for layer, layer_type in zip(DynamicCache(config=config).layers, types, strict=True):
        if isinstance(layer, DynamicSlidingWindowLayer):
            out.append(("chunked" if layer_type == "chunked_attention" else "sliding", layer.sliding_window))
        elif isinstance(layer, LinearAttentionLayer):
            out.append(("linear", None))
        elif isinstance(layer, DummyLayer):
            out.append(("none", None))
        else:
            assert type(layer) is DynamicLayer, type(layer)
            out.append(("full", None))
    return out


def simkv_layers(path) -> list[tuple[str, int | None]]:
    return [(layer.kind, layer.window) for layer in hfconfig.load_config(path).kv_layers]


@needs_hf
@pytest.mark.parametrize("path", FULL + TINY, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_shipped_config_layers_equal_transformers(path):
    assert simkv_layers(path) == transformers_layers(path)


#: Files in the other forms the hub holds (no layer_types: each class's own rule; legacy names; wrappers whose
#: text_config gives only what differs from the defaults), each compared with transformers below.
VARIANTS = {
    "gemma3_published_wrapper": {"model_type": "gemma3", "text_config": {
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 13, "sliding_window": 8}},
    "gemma3_pattern_4": {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 9, "head_dim": 16,
                         "sliding_window": 32, "sliding_window_pattern": 4},
    "gemma3_bidirectional": {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 7, "head_dim": 16,
                             "sliding_window": 16, "use_bidirectional_attention": True},
    "gemma2": {"model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 5, "head_dim": 16, "sliding_window": 12},
    "gpt_oss_derived": {"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 5, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
    "llama4_interval_3": {"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 7,
                          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "no_rope_layers": [],
                          "no_rope_layer_interval": 3, "attention_chunk_size": 16},
    "llama4_explicit_rope": {"model_type": "llama4", "text_config": {
        "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "no_rope_layers": [0, 1, 1, 0]}},
    "qwen3_next_interval_3": {"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 7,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                              "full_attention_interval": 3},
    "qwen3_windows_from_2": {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 5, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "use_sliding_window": True, "sliding_window": 16,
                             "max_window_layers": 2},
    "qwen3_window_off": {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
                         "num_key_value_heads": 4, "sliding_window": 16, "use_sliding_window": False},
    "qwen3_moe_windows": {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 3,
                          "num_attention_heads": 4, "num_key_value_heads": 2, "use_sliding_window": True,
                          "sliding_window": 24},
    "qwen2_moe_windows": {"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 6,
                          "num_attention_heads": 4, "num_key_value_heads": 2, "use_sliding_window": True,
                          "sliding_window": 24, "max_window_layers": 4},
    "mistral_default_window": {"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 2},
    "mistral_null_window": {"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": None},
    "mistral3_wrapper": {"model_type": "mistral3", "text_config": {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "sliding_window": 20}},
    "phi3_window": {"model_type": "phi3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "sliding_window": 2047},
    "llama_chunked": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "attention_chunk_size": 40},
    "qwen3_legacy_names": {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "num_key_value_heads": 4, "layer_types": ["attention", "attention"]},
    "deepseek_v3": {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
                    "first_k_dense_replace": 1, "n_routed_experts": 4, "n_group": 1, "topk_group": 1,
                    "num_experts_per_tok": 2},
    "granite_published_block_type": {"model_type": "granitemoehybrid", "hidden_size": 64, "num_hidden_layers": 4,
                                     "num_attention_heads": 4, "num_key_value_heads": 2, "mamba_n_heads": 8,
                                     "mamba_d_state": 12, "mamba_n_groups": 2, "mamba_d_conv": 3,
                                     "num_local_experts": 4, "num_experts_per_tok": 2,
                                     "layers_block_type": ["mamba", "attention", "mamba", "mamba"]},
    "granite_all_mamba": {"model_type": "granitemoehybrid", "hidden_size": 64, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "mamba_n_heads": 8, "mamba_d_state": 12, "num_local_experts": 0},
    "lfm2_full_attn_idxs": {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 5, "num_attention_heads": 4,
                            "num_key_value_heads": 2, "full_attn_idxs": [1, 3], "conv_L_cache": 4},
    "lfm2_published_spelling": {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 3,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "block_ff_dim": 96,
                                "tie_embedding": False, "layer_types": ["conv", "conv", "full_attention"]},
    "jamba": {"model_type": "jamba", "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
              "num_key_value_heads": 2, "attn_layer_period": 3, "attn_layer_offset": 1, "mamba_d_state": 12,
              "mamba_d_conv": 3, "num_experts": 4, "num_experts_per_tok": 2},
}


def write(tmp_path: Path, config: dict, name="config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


@needs_hf
@pytest.mark.parametrize("name", VARIANTS)
def test_config_forms_equal_transformers(tmp_path, name):
    write(tmp_path, {"vocab_size": 96, **VARIANTS[name]})
    assert simkv_layers(tmp_path) == transformers_layers(tmp_path)


@needs_hf
def test_family_defaults_are_the_config_classes():
    """FAMILIES' defaults are each class's dataclass field defaults in the installed transformers."""
    import dataclasses

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    keyword_only = {"sliding_window_pattern", "full_attention_interval"}  # __post_init__ keywords, not fields
    for model_type, family in hfconfig.FAMILIES.items():
        if model_type not in CONFIG_MAPPING:  # mimo, kimi_k2, nemotron-nas: no transformers class, no defaults
            assert not family.defaults, model_type
            continue
        cls = CONFIG_MAPPING[model_type]
        if "text_config" in getattr(cls, "sub_configs", {}):  # a wrapper type whose file is its text config (step3p7)
            cls = cls.sub_configs["text_config"]
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        for key, value in family.defaults.items():
            if key not in keyword_only:
                assert fields[key] == value, (model_type, key, fields[key], value)


@pytest.mark.transformers
@needs_hf
@pytest.mark.parametrize("name", ["qwen3_next", "deepseek_v3", "granite_published_block_type", "jamba", "lfm2",
                                  "lfm2_full_attn_idxs"])
def test_state_and_latent_shapes_equal_a_real_forward(tmp_path, name):
    """What a tiny random model of the config really caches after a 5-token prefill: a linear layer's conv and
    recurrent state (LFM2's conv layers: none, ``recurrent_states`` left None), an MLA layer's latent keys and
    values, element for element; and the weight matrices' parameters (a model whose linear layers simkv can
    weigh)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = CONFIGS / "tiny" / f"{name}.json" if (CONFIGS / "tiny" / f"{name}.json").exists() else write(
        tmp_path, {"vocab_size": 96, **VARIANTS[name]})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config)).eval()
    with torch.no_grad():
        cache = model(torch.tensor([[1, 2, 3, 4, 5]]), use_cache=True).past_key_values
    spec_model = hfconfig.load_config(config)
    for spec, layer in zip(spec_model.kv_layers, cache.layers, strict=True):
        if spec.kind == "linear":
            assert layer.conv_states[0][0].numel() == spec.conv_elements
            if spec.recurrent_elements:
                assert layer.recurrent_states[0][0].numel() == spec.recurrent_elements
            else:
                assert layer.recurrent_states[0] is None
        elif spec.latent:
            rank, rope = spec.latent
            assert layer.keys.shape == (1, 1, 5, rank) and layer.values.shape == (1, 1, 5, rope)
        else:
            assert layer.keys.shape == (1, spec.kv_heads, 5, spec.k_dim)
    if name.startswith(("lfm2", "jamba")):  # every matrix and the depthwise conv kernels (Jamba's A_log [I, N] one);
        # norms, biases and Jamba's D left out, as simkv does
        params = sum(p.numel() for key, p in model.named_parameters() if p.dim() >= 2)
        assert spec_model.weight_params == params


WEIGHT_VARIANTS = {
    # Gemma-4: k_eq_v full layers (no v_proj) and two KV-shared layers (q_proj and o_proj only)
    "gemma4_k_eq_v_shared": {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 6,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                             "global_head_dim": 32, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
                             "num_kv_shared_layers": 2, "intermediate_size": 96, "sliding_window": 8,
                             "hidden_size_per_layer_input": 0,
                             "layer_types": ["sliding_attention", "full_attention"] * 3},
    # Qwen3.5: q_proj with the output gate (x 2) beside Gated DeltaNet layers
    "qwen3_5_output_gate": {"model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 4,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                            "intermediate_size": 96, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                            "linear_key_head_dim": 8, "linear_value_head_dim": 8},
}


@pytest.mark.transformers
@needs_hf
@pytest.mark.parametrize("name", WEIGHT_VARIANTS)
def test_weight_matrices_equal_transformers(tmp_path, name):
    """simkv's weight matrices equal those of the model transformers builds from the config: every parameter of two
    or more dimensions (norms and biases left out, as simkv does)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = write(tmp_path, {"vocab_size": 96, **WEIGHT_VARIANTS[name]})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config))
    params = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    assert hfconfig.load_config(config).weight_params == params


#: Gemma-3n E2B's text config, reconstructed from transformers' Gemma3nTextConfig defaults and the published
#: geometry (google/gemma-3n-E2B-it: 30 layers, the last 10 KV-shared, hidden 2,048, intermediate 8,192 per layer,
#: 8 heads, 2 KV heads x 256, window 512, full every 5th layer, per-layer inputs 256, LAuReL rank 64, AltUp 4).
GEMMA3N_E2B = {"model_type": "gemma3n", "text_config": {
    "model_type": "gemma3n_text", "hidden_size": 2048, "num_hidden_layers": 30, "intermediate_size": [8192] * 30,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "sliding_window": 512,
    "num_kv_shared_layers": 10, "vocab_size": 262400, "vocab_size_per_layer_input": 262144,
    "hidden_size_per_layer_input": 256, "laurel_rank": 64, "altup_num_inputs": 4, "altup_active_idx": 0,
    "altup_coef_clip": 120.0, "altup_correct_scale": True, "activation_sparsity_pattern": [0.95] * 10 + [0.0] * 20,
    "final_logit_softcapping": 30.0, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}}


def test_gemma3n_kv_sharing_by_hand(tmp_path):
    """Gemma-3n E2B: layer_types absent, so full where (i + 1) % 5 == 0; the last 10 of 30 layers (20..29) keep no
    KV. Layers 0..19 keep it: 16 sliding (window 512) and 4 full (4, 9, 14, 19), each 2 x 2 KV heads x 256 x 2 B
    (bf16) = 2,048 B per token: 20 x 2,048 = 40,960 B per token, every token kept, in transformers and vLLM alike.
    Layers 20..28 of them sliding read layer 18 (the last sliding layer before 20), 24 and 29 full read layer 19 —
    vLLM's first − 2 / first − 1 too. The weights are refused in one line (per-layer embeddings, AltUp, LAuReL)."""
    from simkv.commands.models import describe_model

    path = write(tmp_path, GEMMA3N_E2B)
    d = describe_model(str(path))
    assert d["kv_bytes_per_token"]["transformers"] == d["kv_bytes_per_token"]["vllm"] == 20 * 2 * 2 * 256 * 2
    m = hfconfig.load_config(path)
    assert [layer.reuses for layer in m.kv_layers[20:]] == [18, 18, 18, 18, 19, 18, 18, 18, 18, 19]
    assert "AltUp" in d["weights"]["refused"] and "\n" not in d["weights"]["refused"]
    # the last unshared layer sliding: transformers reads layer 19, vLLM first - 2 = 18 — refused
    moved = {**GEMMA3N_E2B["text_config"],
             "layer_types": ["sliding_attention"] * 18 + ["full_attention"] + ["sliding_attention"] * 11}
    with pytest.raises(ConfigError, match="layer 20 reads the KV of layer 19 in transformers but of layer 18 in vLLM"):
        hfconfig.load_config(write(tmp_path, {"model_type": "gemma3n", "text_config": moved}))


@pytest.mark.transformers
@needs_hf
def test_gemma3n_cache_layers_equal_transformers(tmp_path):
    """A tiny Gemma-3n (6 layers, the last 2 shared) writes a cache for its first 4 layers only, of simkv's shapes
    (transformers 5.23: a KV-shared layer's cache layer is a DummyLayer, never written)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = write(tmp_path, {"model_type": "gemma3n_text", "hidden_size": 64, "num_hidden_layers": 6,
                              "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "head_dim": 16, "sliding_window": 8, "num_kv_shared_layers": 2, "vocab_size": 96,
                              "vocab_size_per_layer_input": 96, "hidden_size_per_layer_input": 8, "laurel_rank": 4,
                              "layer_types": ["sliding_attention", "full_attention"] * 3})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config)).eval()
    with torch.no_grad():
        cache = model(torch.tensor([[1, 2, 3, 4, 5]]), use_cache=True).past_key_values
    specs = hfconfig.load_config(config).kv_layers
    assert [spec.caches_tokens for spec in specs] == [True] * 4 + [False] * 2
    for spec, layer in zip(specs, cache.layers, strict=True):  # a shared layer: cache_utils' DummyLayer, no tensors
        if spec.caches_tokens:
            assert layer.keys.shape == (1, spec.kv_heads, 5, spec.k_dim)
        else:
            assert type(layer).__name__ == "DummyLayer"


# -- malformed configs: one line, exit 2 --------------------------------------------------------------------------

GOOD = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}


def run_cli(*args) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "simkv.cli", "run", *args], capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("text, message", [
    (json.dumps({k: v for k, v in GOOD.items() if k != "num_hidden_layers"}), "missing num_hidden_layers"),
    (json.dumps({**GOOD, "layer_types": ["full_attention", "banded_attention"]}),
     "unknown layer type banded_attention (layer 1)"),
    ('{"model_type": "llama", "num_hidden_layers": 2,', "not valid JSON"),
    ("[1, 2, 3]", "the top level must be a JSON object, got list"),
])
def test_malformed_config_is_one_line_exit_2(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    code, err = run_cli("--model", str(path))
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"simkv run: error: model config {path}: ") and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("config, message", [
    ({**GOOD, "num_hidden_layers": 10**9}, "num_hidden_layers must be an integer from 1 to 100,000"),
    ({**GOOD, "num_hidden_layers": "32"}, "num_hidden_layers must be an integer"),
    ({**GOOD, "num_key_value_heads": 3}, "heads (4) must be a multiple of kv_heads (3)"),
    ({"model_type": "mystery", "num_hidden_layers": 2, "hidden_size": 64}, "missing num_attention_heads"),
    ({**GOOD, "model_type": "mystery", "sliding_window": 8, "use_sliding_window": False},
     "model_type 'mystery' is not a family simkv reads"),
    ({**GOOD, "model_type": "mystery", "layer_types": ["linear_attention", "full_attention"]},
     "layer 0 is linear_attention, whose state shapes simkv knows only for qwen3_next, qwen3_5_text, "
     "qwen3_5_moe_text, granitemoehybrid, jamba"),
    ({**GOOD, "model_type": "mystery", "layer_types": ["full_attention", "conv"]},
     "layer 1 is conv, whose state shapes simkv knows only for lfm2"),
    ({**GOOD, "model_type": "qwen3_next", "layer_types": ["conv", "full_attention"]},
     "layer 0 is conv, whose state shapes simkv knows only for lfm2"),
    ({**GOOD, "layer_types": ["full_attention", "hybrid"]}, "layer type hybrid (layer 1) is not one simkv models"),
    ({**GOOD, "layer_types": ["full_attention"]}, "layer_types has 1 entries for num_hidden_layers 2"),
    ({**GOOD, "layer_types": ["sliding_attention", "full_attention"]}, "layer 0 is sliding but sliding_window is not set"),
    ({**GOOD, "model_type": "falcon_h1"}, "every Falcon-H1 layer is 'hybrid'"),
    ({"model_type": "gemma3", "text_config": [1]}, "text_config must be a JSON object, got list"),
    ({**GOOD, "model_type": "gpt_oss", "num_experts_per_tok": 200, "num_local_experts": 4},
     "num_experts_per_tok must be from 1 to the 4 experts, got 200"),
])
def test_bad_fields_are_named(tmp_path, config, message):
    path = write(tmp_path, config, "bad.json")
    with pytest.raises(ConfigError, match="^model config .*bad.json: ") as err:
        hfconfig.load_config(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_paths_folders_and_names(tmp_path, capsys):
    write(tmp_path, GOOD)
    assert hfconfig.get_model(str(tmp_path)).name == tmp_path.name  # a folder holding config.json: its name
    assert hfconfig.get_model(str(tmp_path / "config.json")).source == str(tmp_path / "config.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    for model, message in ((str(empty), "the folder holds no config.json"), ("nope/x.json", "no such file or folder"),
                           ("gpt-9", "unknown model 'gpt-9'; presets: gpt2, ")):
        assert cli_main(["run", "--model", model]) == 2
        assert message in capsys.readouterr().err


def test_overrides_refused_on_a_model_given_per_layer(capsys):
    assert cli_main(["run", "--model", "gemma-3-27b", "--layers", "4"]) == 2
    assert "--layers would reshape a model described layer by layer" in capsys.readouterr().err
    assert cli_main(["run", "--model", "gpt-oss-20b", "--sliding-window", "0"]) == 2
    assert "--sliding-window would reshape" in capsys.readouterr().err
    # the model's own value is no change; a uniform model from a config takes overrides as a preset does
    assert hfconfig.resolve_model("gemma-3-27b", heads=32).kv_layers == hfconfig.get_model("gemma-3-27b").kv_layers
    assert hfconfig.resolve_model("llama-3.1-8b", layers=4).layers == 4


def test_validate_openvino_takes_a_config_path_of_plain_layers_only(capsys):
    """The OpenVINO toy decoder is of identical plain attention layers (simkv/validate/openvino); the
    transformers runtime builds a config file's model layer by layer (tests/test_hf_validate.py)."""
    assert cli_main(["validate", "--runtime", "openvino", "--model", str(CONFIGS / "tiny" / "gemma3.json")]) == 2
    assert "run builds a decoder of identical plain attention layers, which gemma3's are not (6 layers (5 x " \
        "sliding" in capsys.readouterr().err
    assert cli_main(["validate", "--runtime", "transformers", "--model", "gemma-3-27b"]) == 2
    assert "which gemma-3-27b's are not" in capsys.readouterr().err


@pytest.mark.parametrize("memory", ["paged", "contiguous"])
def test_serving_takes_layer_groups(memory, capsys):
    args = ["run", "--model", "gemma-3-4b", "--synthetic", "--requests", "2", "--device", "h100-sxm",
            "--memory", memory, "--json"]
    assert cli_main(args) == 0
    assert json.loads(capsys.readouterr().out)["requests_finished"] == 2


def test_dashboard_picker_lists_every_preset_and_keys_reshape_errors():
    from simkv.dashboard import compute, layout
    from simkv.dashboard import state as st

    options = {o["value"]: o["label"] for o in layout.model_options()}
    assert list(options) == [*hfconfig.preset_names(), st.CUSTOM]
    assert options["gemma-3-27b"] == "gemma-3-27b  (62 L: 52 sliding 1024, 10 full)"
    assert options["llama-2-7b"] == "llama-2-7b  (32 L, 32/32 heads × 128)"  # a built-in preset's label as before
    view = compute.main_view({**st.DEFAULTS, "model": "gemma-3-4b", "head_dim": "64"})
    assert list(view.errors) == ["head_dim"] and "--head-dim would reshape" in view.errors["head_dim"]
    # the dashboard takes preset names only: a URL cannot make the server read a file
    view = compute.main_view({**st.DEFAULTS, "model": "simkv/data/configs/gemma-3-4b.json"})
    assert view.errors == {"model": "model: unknown preset 'simkv/data/configs/gemma-3-4b.json'"}


# -- every shipped config runs --------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", FULL + TINY, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_run_every_shipped_config(path, capsys):
    code = cli_main(["run", "--model", str(path), "--prompt", "300", "--decode", "200", "--weights-memory", "0",
                     "--device-memory", "1TiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["oom"] is None
    from policies import get_policy

    model, policy = hfconfig.load_config(path), get_policy(out["scenario"]["policy"])
    assert out["scenario"]["model"] == model.name and out["steps"] == 201
    # the default policy is OpenVINO's GPU plugin, whose exports cache MLA decompressed (docs/DESIGN.md §4c)
    assert out["scenario"]["kv_bytes_per_token"] == token_bytes(model.kv_layers, get_precision("f16"),
                                                                mla=policy.mla_form)


@pytest.mark.parametrize("model, policy, precision", [
    (str(CONFIGS / "tiny" / "gemma3.json"), "hf-dynamic", "f32"),  # no dtype in the file: torch's float32
    ("gemma-3-27b", "hf-static", "bf16"),  # "dtype": "bfloat16"
    ("llama-3-8b", "hf-dynamic", "f16"),  # a built-in preset names no dtype: the policy's default
    ("gemma-3-27b", "openvino-gpu", "f16"),  # OpenVINO picks its own KV precision
])
def test_transformers_keeps_the_cache_in_the_models_dtype(model, policy, precision, capsys):
    assert cli_main(["run", "--model", model, "--policy", policy, "--prompt", "6", "--decode", "2",
                     "--weights-memory", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scenario"]["precision"] == precision

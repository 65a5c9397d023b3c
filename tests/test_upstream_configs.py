"""Every real upstream config.json simkv ships (simkv/data/configs/upstream, from aiconfigurator 0.12.0's
model_configs: SOURCES.md there) is read with the bytes per token worked out by hand below, or refused in one line
naming its model type — never silently wrong. The hand arithmetic is bf16 (2 B), every token kept, MLA as its
latent: attention layers x 2 (K and V) x KV heads x head size x 2 B; MLA layers x (kv_lora_rank + qk_rope_head_dim)
x 2 B; Gated DeltaNet layers keep no per-token KV (only the full-attention layers count); MiMo-V2-Flash K 192 and
V 128 with 4 KV heads on its 9 full layers and 8 on its 39 sliding ones; Gemma-4 its sliding layers' heads x 256
and its full layers' global heads x 512; Nemotron-NAS 49 attention layers of 64 / 8 KV heads (31 no-op).
DeepSeek-V3.2 and GLM-5 (MLA + DeepSeek sparse attention): each MLA layer also keeps the indexer's key as vLLM
caches it (vllm/model_executor/models/deepseek_v2.py Indexer.__init__: DeepseekV32IndexerCache of head_dim
index_head_dim + index_head_dim // 128 * 4, dtype uint8 — fp8 values and an f32 scale per 128, whatever the KV
dtype): index_head_dim 128 in every such file, so 128 + 4 = 132 B per layer beside the latent's
(512 + 64) x 2 B = 1,152 B; 1,284 B per layer. GLM-5.2 and 5.3 (IndexCache: index_topk_freq 4, index_skip_topk_offset 3)
keep the indexer's key only on the 21 layers vLLM builds an indexer on (deepseek_v2.py DeepseekV2MLAAttention:
_skip_topk = max(i - offset + 1, 0) % freq != 0); GLM-5.1-NVFP4's indexer_types marks every layer "full" (the
default freq 1), so it is GLM-5's sum. GLM-5(.1)-FP8 list their MTP layer's
``model.layers.78.eh_proj`` (layer 78 of 78) among the unquantized modules: a layer the main model never loads
(simkv.weights.scheme_of), so the name is skipped and the file read as GLM-5.
Nemotron-H / Nemotron-3: the attention layers (``*`` in hybrid_override_pattern, "attention" in
layers_block_type) x 2 x num_key_value_heads x head_dim 128 x 2 B; Mamba-2, MLP and MoE layers keep no per-token KV.
Counted from the files: Nano and Lightning 6 of 52 (23 M, 23 E), Super 8 of 88 (40 M, 40 E), Ultra 12 of 108
(48 mamba, 48 moe; no num_hidden_layers: the list's length), 56B-Base 10 of 118 (54 M, 54 -) with 8 KV heads and
its head size spelt attention_head_dim 128 (= the head_dim both runtimes take)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from simkv import hfconfig
from simkv.errors import ConfigError
from simkv.precision import get_precision

UPSTREAM = hfconfig.CONFIG_DIR / "upstream"
#: GLM-5.2 / 5.3 (index_topk_freq 4, index_skip_topk_offset 3): vLLM builds an indexer where
#: max(i - 3 + 1, 0) % 4 == 0 — layers 0, 1, 2 (max(...) = 0) and 6, 10, ..., 74 ((i - 2) % 4 == 0: 18 layers) —
#: 21 of 78; the other 57 reuse a top-k and keep only the latent. Their indexer_types lists the same 21 "full".
_INDEXED_5_3 = 3 + 18
#: file stem → bf16 KV bytes per token by hand, or the model type it is refused for.
EXPECTED = {
    "MiniMaxAI--MiniMax-M2.5": 62 * 2 * 8 * 128 * 2,
    "MiniMaxAI--MiniMax-M2.7": 62 * 2 * 8 * 128 * 2,
    "MiniMaxAI--MiniMax-M3": "minimax_m3",
    "Qwen--Qwen3-0.6B": 28 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-1.7B": 28 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-235B-A22B-FP8": 94 * 2 * 4 * 128 * 2,
    "Qwen--Qwen3-235B-A22B": 94 * 2 * 4 * 128 * 2,
    "Qwen--Qwen3-30B-A3B-FP8": 48 * 2 * 4 * 128 * 2,
    "Qwen--Qwen3-30B-A3B": 48 * 2 * 4 * 128 * 2,
    "Qwen--Qwen3-32B-FP8-Static-PerTensor": 64 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-32B-FP8": 64 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-32B": 64 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-8B": 36 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-Coder-480B-A35B-Instruct": 62 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-VL-235B-A22B-Instruct": 94 * 2 * 4 * 128 * 2,
    "Qwen--Qwen3-VL-2B-Instruct": 28 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-VL-30B-A3B-Instruct": 48 * 2 * 4 * 128 * 2,
    "Qwen--Qwen3-VL-32B-Instruct": 64 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-VL-32B-Thinking": 64 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-VL-4B-Instruct": 36 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3-VL-8B-Instruct": 36 * 2 * 8 * 128 * 2,
    "Qwen--Qwen3.5-122B-A10B": 12 * 2 * 2 * 256 * 2,
    "Qwen--Qwen3.5-27B": 16 * 2 * 4 * 256 * 2,
    "Qwen--Qwen3.5-35B-A3B": 10 * 2 * 2 * 256 * 2,
    "Qwen--Qwen3.5-397B-A17B": 15 * 2 * 2 * 256 * 2,
    "ai21labs--AI21-Jamba-1.5-Mini": 4 * 2 * 8 * 128 * 2,
    "XiaomiMiMo--MiMo-7B-Base": 36 * 2 * 8 * 128 * 2,
    "XiaomiMiMo--MiMo-V2-Flash": 9 * 4 * (192 + 128) * 2 + 39 * 8 * (192 + 128) * 2,
    "deepseek-ai--DeepSeek-R1": 61 * (512 + 64) * 2,
    "deepseek-ai--DeepSeek-V3.2": 61 * ((512 + 64) * 2 + 128 + 4),
    "deepseek-ai--DeepSeek-V3": 61 * (512 + 64) * 2,
    "deepseek-ai--DeepSeek-V4-Flash": "deepseek_v4",
    "deepseek-ai--DeepSeek-V4-Pro": "deepseek_v4",
    "google--gemma-4-26B-A4B": 25 * 2 * 8 * 256 * 2 + 5 * 2 * 2 * 512 * 2,
    "meta-llama--Llama-4-Maverick-17B-128E-Instruct": 48 * 2 * 8 * 128 * 2,
    "meta-llama--Llama-4-Scout-17B-16E-Instruct": 48 * 2 * 8 * 128 * 2,
    "meta-llama--Meta-Llama-3.1-405B": 126 * 2 * 8 * 128 * 2,
    "meta-llama--Meta-Llama-3.1-70B": 80 * 2 * 8 * 128 * 2,
    "meta-llama--Meta-Llama-3.1-8B": 32 * 2 * 8 * 128 * 2,
    "mistralai--Mixtral-8x22B-v0.1": 56 * 2 * 8 * 128 * 2,
    "mistralai--Mixtral-8x7B-v0.1": 32 * 2 * 8 * 128 * 2,
    "moonshotai--Kimi-K2-Instruct": 61 * (512 + 64) * 2,
    "moonshotai--Kimi-K2.5": 61 * (512 + 64) * 2,
    "moonshotai--Kimi-K3": "kimi_linear",
    "nvidia--DeepSeek-V3.1-NVFP4": 61 * (512 + 64) * 2,
    "nvidia--DeepSeek-V3.2-NVFP4": 61 * ((512 + 64) * 2 + 128 + 4),
    "nvidia--DeepSeek-V4-Flash-NVFP4": "deepseek_v4",
    "nvidia--DeepSeek-V4-Pro-NVFP4": "deepseek_v4",
    "nvidia--GLM-5-NVFP4": 78 * ((512 + 64) * 2 + 128 + 4),
    "nvidia--GLM-5.1-NVFP4": 78 * ((512 + 64) * 2 + 128 + 4),
    "nvidia--GLM-5.2-NVFP4": 78 * (512 + 64) * 2 + _INDEXED_5_3 * (128 + 4),
    "nvidia--GLM-5.3-NVFP4": 78 * (512 + 64) * 2 + _INDEXED_5_3 * (128 + 4),
    "nvidia--Gemma-4-26B-A4B-NVFP4": 25 * 2 * 8 * 256 * 2 + 5 * 2 * 2 * 512 * 2,
    "nvidia--Gemma-4-31B-IT-NVFP4": 50 * 2 * 16 * 256 * 2 + 10 * 2 * 4 * 512 * 2,
    "nvidia--Kimi-K2.5-NVFP4": 61 * (512 + 64) * 2,
    "nvidia--Kimi-K2.6-NVFP4": 61 * (512 + 64) * 2,
    "nvidia--Kimi-K2.7-Code-NVFP4": 61 * (512 + 64) * 2,
    "nvidia--Llama-3.1-70B-Instruct-FP8": 80 * 2 * 8 * 128 * 2,
    "nvidia--Llama-3_3-Nemotron-Super-49B-v1": 49 * 2 * (64 // 8) * 128 * 2,
    "nvidia--MiniMax-M2.5-NVFP4": 62 * 2 * 8 * 128 * 2,
    "nvidia--MiniMax-M2.7-NVFP4": 62 * 2 * 8 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": 6 * 2 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4": 6 * 2 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8": 8 * 2 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4": 8 * 2 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": 12 * 2 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8": 12 * 2 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4": 12 * 2 * 2 * 128 * 2,
    "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4": 6 * 2 * 2 * 128 * 2,
    "nvidia--Nemotron-H-56B-Base-8K": 10 * 2 * 8 * 128 * 2,
    "nvidia--Qwen3-235B-A22B-NVFP4": 94 * 2 * 4 * 128 * 2,
    "nvidia--Qwen3.5-122B-A10B-NVFP4": 12 * 2 * 2 * 256 * 2,
    "nvidia--Qwen3.5-397B-A17B-NVFP4": 15 * 2 * 2 * 256 * 2,
    "nvidia--Qwen3.6-27B-NVFP4": 16 * 2 * 4 * 256 * 2,
    "nvidia--Qwen3.6-35B-A3B-NVFP4": 10 * 2 * 2 * 256 * 2,
    "openai--gpt-oss-120b": 36 * 2 * 8 * 64 * 2,
    "openai--gpt-oss-20b": 24 * 2 * 8 * 64 * 2,
    "sgl-project--DeepSeek-V4-Flash-FP8": "deepseek_ref",
    "sgl-project--DeepSeek-V4-Pro-FP8": "deepseek_ref",
    "stepfun-ai--Step-3.7-Flash-FP8": 45 * 2 * 8 * 128 * 2,
    "stepfun-ai--Step-3.7-Flash": 45 * 2 * 8 * 128 * 2,
    "zai-org--GLM-5-FP8": 78 * ((512 + 64) * 2 + 128 + 4),
    "zai-org--GLM-5.1-FP8": 78 * ((512 + 64) * 2 + 128 + 4),
    "zai-org--GLM-5.1": 78 * ((512 + 64) * 2 + 128 + 4),
    "zai-org--GLM-5.2-FP8": 78 * (512 + 64) * 2 + _INDEXED_5_3 * (128 + 4),
    "zai-org--GLM-5.2": 78 * (512 + 64) * 2 + _INDEXED_5_3 * (128 + 4),
    "zai-org--GLM-5.3-FP8": 78 * (512 + 64) * 2 + _INDEXED_5_3 * (128 + 4),
    "zai-org--GLM-5.3": 78 * (512 + 64) * 2 + _INDEXED_5_3 * (128 + 4),
    "zai-org--GLM-5": 78 * ((512 + 64) * 2 + 128 + 4),
}
FILES = sorted(p for p in UPSTREAM.glob("*_config.json") if not p.name.endswith("hf_quant_config.json"))


def models_json(path) -> dict:
    """``simkv models --model PATH --json``, run as a user runs it (exit 0)."""
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "models", "--model", str(path), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_every_shipped_upstream_config_is_listed():
    assert sorted(p.name[: -len("_config.json")] for p in FILES) == sorted(EXPECTED)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name[: -len("_config.json")])
def test_upstream_config_exact_or_refused(path):
    want = EXPECTED[path.name[: -len("_config.json")]]
    if isinstance(want, str):
        with pytest.raises(ConfigError) as err:
            hfconfig.load_config(path)
        text = str(err.value)
        assert f"model_type {want}" in text and "\n" not in text
    else:
        assert get_precision("bf16").kv_bytes_per_token(hfconfig.load_config(path)) == want


def test_share_read():
    """The share read exactly (the rest refused): reported, and held from falling back."""
    read = sum(not isinstance(v, str) for v in EXPECTED.values())
    assert (read, len(EXPECTED)) == (81, 89)


def test_models_command_json_names_groups_and_runtimes():
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "models", "--model",
                          str(UPSTREAM / "XiaomiMiMo--MiMo-V2-Flash_config.json"), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    full, sliding = d["groups"]
    # full: 9 layers x 4 heads x (192 + 128) x 2 B = 23,040; sliding: 39 x 8 x 320 x 2 B = 199,680 (window 129:
    # sliding_window_size 128 + the query, as transformers builds it)
    assert (full["count"], full["bytes_per_token"]["vllm"]) == (9, 23_040)
    assert (sliding["count"], sliding["window"], sliding["bytes_per_token"]["transformers"]) == (39, 129, 199_680)
    assert d["kv_bytes_per_token"]["transformers"] == 222_720 and d["frees_windows"]["openvino"] is False
    assert d["fields"]["reader"] == "mimo_v2" and "hybrid_layer_pattern" in d["fields"]["read"]
    assert d["weights"]["scheme"].startswith("fp8: fp8-block")


def test_refused_config_is_one_line_exit_2_in_both_commands():
    path = str(UPSTREAM / "deepseek-ai--DeepSeek-V4-Flash_config.json")
    for args in (["models", "--model", path, "--json"], ["run", "--model", path, "--policy", "hf-dynamic", "--json"]):
        out = subprocess.run([sys.executable, "-m", "simkv.cli", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1
        assert "model_type deepseek_v4" in out.stderr and "compress_ratios" in out.stderr


def test_indexer_model_read_for_vllm_only_and_refused_by_runs():
    """GLM-5: 78 MLA layers x (1,152 B latent + 132 B indexer key, vLLM's layout) = 100,152 B per token under vLLM;
    the other runtimes' columns are null (they keep that cache otherwise or not at all); a run refuses it in one
    line, and so does serving."""
    path = str(UPSTREAM / "zai-org--GLM-5_config.json")
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "models", "--model", path, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["kv_bytes_per_token"] == {"transformers": None, "vllm": 100_152, "openvino": None, "genai": None}
    assert d["groups"][0]["layers"] == list(range(78)) and "indexer key 128" in d["groups"][0]["describe"]
    for args in (["run", "--model", path, "--policy", "hf-dynamic"], ["run", "--model", path, "--synthetic", "--memory", "paged", "--kv-manager", "vllm"]):
        out = subprocess.run([sys.executable, "-m", "simkv.cli", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, (args, out.stderr)
        assert "sparse-attention indexer" in out.stderr


def test_unknown_model_type_with_unread_layout_field_is_refused(tmp_path):
    # Nemotron-NAS's trap, under a model type no module reads: block_configs would be ignored by a generic reader.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mystery_nas", "num_hidden_layers": 2, "hidden_size": 64,
                                "num_attention_heads": 4, "block_configs": [{}, {}]}))
    with pytest.raises(ConfigError, match="model_type 'mystery_nas' is not a family simkv reads, and its "
                                          "block_configs may change what a layer caches"):
        hfconfig.load_config(path)
    # a known family with a new layout field of its own: refused naming the family's module and the field
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                                "num_attention_heads": 4, "swa_num_key_value_heads": 2}))
    with pytest.raises(ConfigError, match="model_type llama: swa_num_key_value_heads not read by simkv's llama reader"):
        hfconfig.load_config(path)


def test_docs_family_table_is_current():
    page = (hfconfig.CONFIG_DIR.parents[2] / "docs" / "guide" / "models.md").read_text()
    assert hfconfig.family_table() in page, "regenerate: python -c 'from simkv.hfconfig import family_table; " \
                                            "print(family_table())'"


def test_run_header_names_the_heads():
    """The header names every group's heads: a uniform MHA model its head count (Llama-2-7B: 32 heads of 128, no
    KV grouping), a GQA model query/KV heads, Nemotron-NAS its attention and no-cache groups."""
    assert hfconfig.get_model("llama-2-7b").describe() == "llama-2-7b: 32 layers, MHA 32 heads x 128"
    assert hfconfig.get_model("llama-3-8b").describe() == "llama-3-8b: 32 layers, GQA 32/8 heads x 128"
    nas = hfconfig.load_config(UPSTREAM / "nvidia--Llama-3_3-Nemotron-Super-49B-v1_config.json", name="super")
    assert nas.describe() == "super: 80 layers (49 x full: 8 kv heads x 128; 31 x no cache)"


def test_index_cache_layers_keep_no_indexer_key(tmp_path):
    """GLM-5.3 under vLLM: 21 layers keep latent + indexer key (1,152 + 132 = 1,284 B), 57 the latent only
    (1,152 B): 21 x 1,284 + 57 x 1,152 = 26,964 + 65,664 = 92,628 B per token; the indexer weights only on the 21.
    An indexer_types list that disagrees with vLLM's rule is refused in one line."""
    path = UPSTREAM / "zai-org--GLM-5.3_config.json"
    d = models_json(path)
    assert d["kv_bytes_per_token"]["vllm"] == 92_628
    with_key, without = d["groups"]
    assert with_key["layers"] == [0, 1, 2, *range(6, 78, 4)] and with_key["bytes_per_token"]["vllm"] == 26_964
    assert without["count"] == 57 and "indexer" not in without["describe"]
    m = hfconfig.load_config(path)
    indexer_weights = 2048 * 32 * 128 + 6144 * 128 + 6144 * 32  # wq_b q_lora_rank x n x d, wk, weights_proj
    assert m.layer_roles(0)["attn_in"] - m.layer_roles(3)["attn_in"] == indexer_weights
    raw = json.loads(path.read_text())
    raw["indexer_types"] = ["full"] * 78
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="indexer_types disagrees with index_topk_freq") as err:
        hfconfig.load_config(tmp_path)
    assert "\n" not in str(err.value)


def test_nemotron_3_nano_state_and_weights_by_hand():
    """Nemotron-3-Nano-30B-A3B (hidden 2,688; 23 Mamba-2, 6 attention, 23 MoE layers; bf16).

    Mamba-2 (mamba_num_heads H 64 x mamba_head_dim P 64: inner I 4,096; n_groups G 8, ssm_state_size N 128,
    conv_kernel K 4): conv_dim = I + 2 G N = 4,096 + 2,048 = 6,144; recurrent H x P x N = 524,288 elements.
    State per sequence, 23 layers: transformers conv 6,144 x 4 x 2 B + recurrent 524,288 x 4 B (torch scan, f32)
    = 49,152 + 2,097,152 = 2,146,304 B, x 23 = 49,364,992; vLLM conv K - 1 = 3 columns, 6,144 x 3 x 2 = 36,864,
    recurrent in mamba_ssm_cache_dtype float32: 2,097,152; 2,134,016 x 23 = 49,082,368.

    Weights: Mamba in_proj 2,688 x (2 I + 2 G N + H = 10,304) = 27,697,152 + conv1d 6,144 x 4 = 24,576 + out_proj
    4,096 x 2,688 = 11,010,048: 38,731,776 x 23 = 890,830,848. Attention q 2,688 x 32 x 128 = 11,010,048, k + v
    2,688 x 2 x 256 = 1,376,256, o 11,010,048: 23,396,352 x 6 = 140,378,112. MoE (relu2, 2 matrices): 128 experts
    x 2 x 2,688 x 1,856 = 1,277,165,568 + shared 2 x 2,688 x 3,712 = 19,955,712 + router 2,688 x 128 = 344,064:
    1,297,465,344 x 23 = 29,841,702,912. Embedding + LM head 2 x 131,072 x 2,688 = 704,643,072. Sum
    31,577,554,944 (NVIDIA's model card: 31.6 B). The NVFP4 checkpoint's exclude_modules keep lm_head, 6 Mamba
    layers' in/out_proj and 6 attention layers' q/k/v/o in bf16 and name every mixer.conv1d (an nn.Conv1d no
    quantizer converts, so the in_proj beside it stays nvfp4): bf16 = 704,643,072 + routers 23 x 344,064 +
    6 x (27,721,728 + 11,010,048) + 140,378,112 = 1,085,325,312."""
    from simkv.commands.models import describe_model

    d = describe_model(str(UPSTREAM / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16_config.json"))
    assert d["state_bytes_per_sequence"]["transformers"] == 49_364_992
    assert d["state_bytes_per_sequence"]["vllm"] == 49_082_368
    assert d["weights"]["params"] == 31_577_554_944
    m = hfconfig.load_config(UPSTREAM / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16_config.json")
    assert m.moe_at[:3] == (1, 3, 6) and m.layer_roles(5)["experts"] == 0 and m.layer_roles(6)["mlp"] == 0
    d = describe_model(str(UPSTREAM / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4_config.json"))
    assert d["weights"]["params_by_format"]["bf16"] == 1_085_325_312


def test_nemotron_h_56b_dense_mlp_layers_and_latent_moe_weights_refused():
    """56B-Base: 54 relu2 MLP layers (up + down, 2 x 8,192 x 32,768 = 536,870,912 each) and no MoE; Super's latent
    MoE (moe_latent_size) keeps its KV read and refuses only its weights, in one line."""
    m = hfconfig.load_config(UPSTREAM / "nvidia--Nemotron-H-56B-Base-8K_config.json")
    assert m.layer_roles(1)["mlp"] == 536_870_912 and m.layer_roles(0)["mlp"] == 0 and not m.experts
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "models", "--model",
                          str(UPSTREAM / "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4_config.json"), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    # vLLM: fp8 KV (its hf_quant_config.json kv_cache_quant_algo FP8: vLLM's auto KV dtype), 1 B per element
    assert d["kv_bytes_per_token"]["vllm"] == 8 * 2 * 2 * 128 * 1 and "moe_latent_size" in d["weights"]["refused"]
    super_ = hfconfig.load_config(UPSTREAM / "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4_config.json")
    with pytest.raises(ConfigError, match="its weights are not sized: Nemotron-H latent MoE") as err:
        super_.weight_params
    assert "\n" not in str(err.value)


def test_nemotron_h_layer_count_disagreement_is_refused(tmp_path):
    raw = json.loads((UPSTREAM / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16_config.json").read_text())
    for change, text in (({"num_hidden_layers": 50}, "num_hidden_layers 50 differs from the 52 blocks"),
                         ({"hybrid_override_pattern": "M*X"}, "hybrid_override_pattern holds 'X'"),
                         ({"attention_head_dim": 64}, "attention_head_dim 64 differs from head_dim 128")):
        (tmp_path / "config.json").write_text(json.dumps({**raw, **change}))
        with pytest.raises(ConfigError, match=text) as err:
            hfconfig.load_config(tmp_path)
        assert "\n" not in str(err.value)


def test_jamba_mamba1_state_and_weights_by_hand():
    """AI21-Jamba-1.5-Mini (hidden 4,096, 32 layers; attention where i % 8 == 4: layers 4, 12, 20, 28, Mamba-1 on
    the other 28; MoE of 16 experts where i % 2 == 1; bf16). KV: 4 x 2 x 8 x 128 x 2 B = 16,384 B per token.

    Mamba-1 (inner I = mamba_expand 2 x 4,096 = 8,192, d_state N 16, d_conv K 4, dt rank R 256). vLLM's state per
    layer (mamba_utils.py mamba1_state_shape: conv (I, K - 1), temporal (I, N); _mamba_state_dtype: both in the
    model dtype, Jamba setting no mamba_ssm_cache_dtype): 8,192 x 3 x 2 B + 8,192 x 16 x 2 B = 49,152 + 262,144 =
    311,296, x 28 = 8,716,288. transformers keeps K columns and the scan's f32 state: (32,768 x 2 + 131,072 x 4)
    x 28 = 16,515,072.

    Weights (vLLM MambaMixer): in_proj 4,096 x 2 x 8,192 = 67,108,864, conv1d 8,192 x 4 = 32,768, x_proj 8,192 x
    (256 + 32) = 2,359,296, dt_proj 256 x 8,192 = 2,097,152, A_log 8,192 x 16 = 131,072, out_proj 8,192 x 4,096 =
    33,554,432: 105,283,584 x 28 = 2,947,940,352. Attention (q, o 4,096²; k, v 4,096 x 1,024) 41,943,040 x 4 =
    167,772,160. Dense MLP 3 x 4,096 x 14,336 = 176,160,768 x 16 = 2,818,572,288; MoE 16 x 176,160,768 + router
    4,096 x 16 = 2,818,637,824 x 16 = 45,098,205,184. Embedding + LM head 2 x 65,536 x 4,096 = 536,870,912.
    Sum 51,569,360,896 (AI21: 52 B total, 12 B active)."""
    from simkv.commands.models import describe_model

    path = UPSTREAM / "ai21labs--AI21-Jamba-1.5-Mini_config.json"
    d = models_json(path)
    assert d["kv_bytes_per_token"]["vllm"] == 16_384
    assert d["state_bytes_per_sequence"] == describe_model(str(path))["state_bytes_per_sequence"]
    assert (d["state_bytes_per_sequence"]["vllm"], d["state_bytes_per_sequence"]["transformers"]) == (
        8_716_288, 16_515_072)
    assert d["weights"]["params"] == 51_569_360_896
    m = hfconfig.load_config(path)
    assert m.mamba1_dims == (8_192, 16, 4, 256)
    assert m.layer_roles(0)["attn_in"] + m.layer_roles(0)["attn_out"] == 105_283_584
    assert m.moe_at[:2] == (1, 3) and m.layer_roles(4)["attn_in"] == 4_096 * 4_096 + 4_096 * 2 * 1_024


def test_output_gate_and_k_eq_v_attention_weights_by_hand(tmp_path):
    """Qwen3.5-27B's full layer 3 (hidden 5,120; 24 heads, 4 KV heads, head_dim 256; attn_output_gate): q_proj
    5,120 x 24 x 256 x 2 (query and gate) = 62,914,560 + k, v 5,120 x 4 x 512 = 10,485,760 = 73,400,320; o_proj
    24 x 256 x 5,120 = 31,457,280. Gemma-4-26B-A4B's full layer 5 (hidden 2,816; 16 heads; global_head_dim 512,
    2 global KV heads; attention_k_eq_v): q 2,816 x 16 x 512 = 23,068,672 + k only 2,816 x 2 x 512 = 2,883,584 =
    25,952,256; its sliding layer 0 (8 KV heads x 256): q 11,534,336 + k, v 2,816 x 8 x 512 = 11,534,336. A
    Qwen3.5 file that turns the gate off is refused: vLLM reads it, transformers always gates."""
    qwen = hfconfig.load_config(UPSTREAM / "Qwen--Qwen3.5-27B_config.json")
    assert (qwen.layer_roles(3)["attn_in"], qwen.layer_roles(3)["attn_out"]) == (73_400_320, 31_457_280)
    gemma = hfconfig.load_config(UPSTREAM / "google--gemma-4-26B-A4B_config.json")
    assert (gemma.layer_roles(5)["attn_in"], gemma.layer_roles(5)["attn_out"]) == (25_952_256, 23_068_672)
    assert gemma.layer_roles(0)["attn_in"] == 23_068_672
    raw = json.loads((UPSTREAM / "Qwen--Qwen3.5-27B_config.json").read_text())
    raw["text_config"]["attn_output_gate"] = False
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="attn_output_gate False: vLLM then builds no output gate") as err:
        hfconfig.load_config(tmp_path)
    assert "\n" not in str(err.value)


def test_granite_mamba2_weights_and_one_vllm_state_rule(tmp_path):
    """A Granite-4-H config (hidden 64; layers mamba, attention, mamba, mamba; mamba_n_heads 8, mamba_d_head auto =
    2 x 64 / 8 = 16, groups 2, d_state 12, d_conv 3; bf16) is sized by ``simkv models --model`` (it failed on its
    weights before). Mamba-2: inner 128, conv_dim 128 + 2 x 2 x 12 = 176; in_proj 64 x (2 x 128 + 48 + 8) = 19,968,
    conv1d 176 x 3 = 528, out_proj 128 x 64 = 8,192: 28,688 per Mamba layer. vLLM state per Mamba layer: conv
    176 x (3 - 1) x 2 B = 704 + recurrent 8 x 16 x 12 x 2 B = 3,072 (model dtype: no mamba_ssm_cache_dtype) =
    3,776, x 3 = 11,328 — in ``simkv models``' column and in serving's vLLM pool (the same function)."""
    from simkv.precision import get_precision
    from simkv.serving.kv.groups import paged_kv

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "granitemoehybrid", "hidden_size": 64, "num_hidden_layers": 4,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "mamba_n_heads": 8,
                                "mamba_d_state": 12, "mamba_n_groups": 2, "mamba_d_conv": 3, "num_local_experts": 0,
                                "intermediate_size": 96, "shared_intermediate_size": 96, "vocab_size": 100,
                                "dtype": "bfloat16", "layers_block_type": ["mamba", "attention", "mamba", "mamba"]}))
    d = models_json(path)
    assert d["state_bytes_per_sequence"]["vllm"] == 11_328
    m = hfconfig.load_config(path)
    assert m.layer_roles(0)["attn_in"] + m.layer_roles(0)["attn_out"] == 19_968 + 528 + 8_192
    pool = paged_kv(m, get_precision("bf16"), 16, "vllm")
    assert sum(g.real_bytes for g in pool.groups if g.kind == "state") == 11_328


def test_qwen3_5_recurrent_state_in_mamba_ssm_dtype_under_vllm(tmp_path):
    """Qwen3.5-35B-A3B (40 layers, full_attention_interval 4: 30 Gated DeltaNet layers; Hk 16, Hv 32, dk = dv 128,
    kernel 4; bf16; mamba_ssm_dtype float32). vLLM's Qwen3_5ForConditionalGenerationConfig.verify_and_update_config
    (models/config.py) sets mamba_ssm_cache_dtype "auto" to the file's float32. Per layer: conv_dim
    2 x 16 x 128 + 32 x 128 = 8,192, K - 1 = 3 columns x 2 B = 49,152; recurrent 32 x 128 x 128 = 524,288 x 4 B
    = 2,097,152; 2,146,304 x 30 = 64,389,120 (it was 32,931,840 with the recurrent state at 2 B). Without the field
    (or "auto") the model dtype: 49,152 + 1,048,576 = 1,097,728 x 30 = 32,931,840; a value vLLM does not take is
    refused in one line."""
    from simkv.commands.models import describe_model

    path = UPSTREAM / "Qwen--Qwen3.5-35B-A3B_config.json"
    assert describe_model(str(path))["state_bytes_per_sequence"]["vllm"] == 64_389_120
    raw = json.loads(path.read_text())
    for value in (None, "auto"):
        raw["text_config"]["mamba_ssm_dtype"] = value
        (tmp_path / "config.json").write_text(json.dumps(raw))
        assert describe_model(str(tmp_path / "config.json"))["state_bytes_per_sequence"]["vllm"] == 32_931_840
    raw["text_config"]["mamba_ssm_dtype"] = "fp8"
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="mamba_ssm_dtype must be float32, bfloat16, float16 or auto") as err:
        hfconfig.load_config(tmp_path)
    assert "\n" not in str(err.value)


def test_checkpoint_fp8_kv_is_vllms_auto_kv_dtype(tmp_path):
    """vLLM 0.33's --kv-cache-dtype auto takes the checkpoint's KV format (vllm/utils/torch_utils.py
    resolve_kv_cache_dtype_string: ModelOpt kv_cache_quant_algo FP8 → fp8_e4m3; attention.py Attention.__init__:
    a compressed-tensors kv_cache_scheme → fp8). Llama-3.1-70B-Instruct-FP8 (hf_quant_config.json
    kv_cache_quant_algo FP8): 80 layers x 2 x 8 heads x 128 x 1 B = 163,840 B per token under vLLM (bf16 for
    transformers: 327,680). Qwen3.6-27B-NVFP4 (config.json kv_cache_scheme 8-bit float, dynamic false): 16 full
    layers x 2 x 4 x 256 x 1 B = 32,768. Qwen3-32B-FP8 (quant_method fp8, no KV scheme): bf16, 16 x ... = 64 x 2 x
    8 x 128 x 2 = 262,144. A compressed-tensors config with a kv_cache_scheme: fp8, 2 x 2 x 2 x 16 x 1 B = 128.
    GLM-5-NVFP4 (fp8 KV on a sparse-MLA model: vLLM's fp8_ds_mla, per backend): vLLM's column null, the reason
    given. serving's vLLM pool follows: one h100-sxm block of 16 tokens holds 16 x 163,840 = 2,621,440 B."""
    from simkv.commands.models import describe_model

    def vllm(path):
        d = describe_model(str(path))
        return d["kv_bytes_per_token"]["vllm"], d["kv_precision"]["vllm"]

    assert vllm(UPSTREAM / "nvidia--Llama-3.1-70B-Instruct-FP8_config.json") == (163_840, "fp8")
    assert describe_model(str(UPSTREAM / "nvidia--Llama-3.1-70B-Instruct-FP8_config.json"))[
        "kv_bytes_per_token"]["transformers"] == 327_680
    assert vllm(UPSTREAM / "nvidia--Qwen3.6-27B-NVFP4_config.json") == (32_768, "fp8")
    assert vllm(UPSTREAM / "Qwen--Qwen3-32B-FP8_config.json") == (262_144, "bf16")
    d = describe_model(str(UPSTREAM / "nvidia--GLM-5-NVFP4_config.json"))
    assert d["kv_bytes_per_token"]["vllm"] is None and "fp8_ds_mla" in d["vllm_kv_refused"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
                                "dtype": "bfloat16", "quantization_config": {
                                    "quant_method": "compressed-tensors", "ignore": ["lm_head"], "config_groups": {"group_0": {
                                        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
                                                                           "strategy": "tensor"}}},
                                    "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                        "dynamic": False, "symmetric": True}}}))
    assert hfconfig.load_config(path).vllm_kv_dtype == "fp8"
    run = [sys.executable, "-m", "simkv.cli", "run", "--model",
           str(UPSTREAM / "nvidia--Llama-3.1-70B-Instruct-FP8_config.json"), "--scheduler", "vllm", "--synthetic",
           "--requests", "4", "--device", "h100-sxm", "--json"]
    # (70B FP8 leaves 79.18 - 67.66 GiB of the measured H100 for activations and the pool: it runs)
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    scenario = json.loads(out.stdout)["scenario"]
    assert (scenario["precision"], scenario["kv_bytes_per_token"]) == ("fp8", 163_840)
    out = subprocess.run([*run, "--precision", "bf16"], capture_output=True, text=True, timeout=120)
    scenario = json.loads(out.stdout)["scenario"]  # an explicit precision wins, as in vLLM
    assert (scenario["precision"], scenario["kv_bytes_per_token"]) == ("bf16", 327_680)

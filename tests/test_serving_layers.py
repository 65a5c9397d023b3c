"""Paged (and contiguous) serving of models whose layers differ: golden numbers worked out by hand from the
layer specs (the model values are the published ones, /work/shared/MODELS.md §5, or the tiny exports measured
on OpenVINO GenAI 2026.4.1, experiments/genai_layer_kinds/README.md), and the planned runs equal to the
step-by-step reference on windowed, chunked, MLA and hybrid models under both KV-cache managers.

Rules (simkv/serving/kv/groups.py, docs/DESIGN.md §4c, §7): GenAI — one block spans every attention layer, MLA
decompressed, windows keep every block, linear-attention states in a pool of their own (one block per live
sequence; checkpoints every interval with prefix caching); vLLM — a block table per group of layers in one pool of
unified pages, sliding windows free the blocks before ``computed - W + 1``, chunks those before the current chunk,
MLA as its latent, one Mamba block per running request.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simkv.cost import get_device
from simkv.errors import ConfigError
from simkv.kvspec import LayerKV
from simkv.lab.traces import AZURE_CONV
from simkv.models import ModelSpec
from simkv.precision import get_precision
from simkv.serving import Request, ServingSpec, load_trace, serve
from simkv.serving.engine.core import PagedServing
from simkv.serving.kv.groups import paged_kv
from simkv.serving.sched.config import SchedulerConfig
from simkv.serving.sched.group import FINISHED, IGNORED, REJECTED, UNFINISHED

F16, BF16 = get_precision("f16"), get_precision("bf16")
DEVICE = get_device("xeon-8480")

# A Gemma-like model: 5 sliding-window layers (W 64) then a global one, 2 KV heads x 32.
SW, FULL = LayerKV("sliding", 2, 32, 32, 64), LayerKV("full", 2, 32, 32)
GEMMA = ModelSpec("gemma-like", 6, 4, 2, 32, layer_kv=(SW,) * 5 + (FULL,))
# A Llama-4-like model: 3 chunked layers (C 64), every 4th full.
CHUNK = LayerKV("chunked", 2, 32, 32, 64)
LLAMA4 = ModelSpec("llama4-like", 4, 4, 2, 32, layer_kv=(CHUNK,) * 3 + (FULL,))
# The tiny Qwen3-Next exported and measured on GenAI (README §3): 3 Gated-DeltaNet layers (conv_state_table
# [?, 256, 4], gated_delta_state_table [?, 4, 32, 32]) and one full-attention layer (2 KV heads x 32).
GDN = LayerKV("linear", conv_elements=256 * 4, recurrent_elements=4 * 32 * 32)
QWEN_NEXT = ModelSpec("qwen3-next-tiny", 4, 4, 2, 32, layer_kv=(GDN,) * 3 + (FULL,), linear_dims=(2, 4, 32, 32, 4))
# DeepSeek-V3's MLA (kv_lora_rank 512, qk_rope 64; 128 heads, K = nope 128 + rope 64, V 128), 3 layers.
MLA = LayerKV("full", 128, 192, 128, latent=(512, 64))
DEEPSEEK = ModelSpec("deepseek-mla", 3, 128, 128, 128, layer_kv=(MLA,) * 3)


def engine(requests, model, precision=F16, **cfg):
    return PagedServing(requests, model, precision, SchedulerConfig(**cfg), device=DEVICE, weights_bytes=0,
                        device_memory=1 << 40, stall_steps=200)


def run(requests, model, precision=F16, fast=False, **cfg):
    eng = engine(requests, model, precision, **cfg)
    groups, steps, _, _ = eng.run(fast=fast)
    return eng, {g.req.id: g for g in groups}, steps


# -- block bytes ----------------------------------------------------------------------------------------------------

def test_mla_block_bytes_latent_vs_decompressed():
    # GenAI caches MLA decompressed (optimum-intel's DeepSeek export): per layer and 32-token block
    # K = 32 x 128 heads x 192 x 2 B = 1,572,864, V = 32 x 128 x 128 x 2 = 1,048,576 -> 2,621,440 = 32 x 81,920
    # (81,920 B per token per layer, README §4); 3 layers: 7,864,320.
    genai = paged_kv(DEEPSEEK, BF16, 32, "genai")
    assert [t[2] for t in genai.tensors] == [1_572_864, 1_048_576] * 3
    assert genai.block_bytes == 7_864_320
    # vLLM caches the latent: one "head" of 512 + 64 elements, no separate V: a 16-token page per layer is
    # 16 x 576 x 2 = 18,432 (1,152 B per token, MODELS.md §1.2); one group of 3 layers: 55,296.
    vllm = paged_kv(DEEPSEEK, BF16, 16, "vllm")
    assert vllm.block_bytes == 3 * 18_432 and [g.kind for g in vllm.groups] == ["full"]
    assert 81_920 / 1_152 == pytest.approx(71.1, abs=0.05)
    # per token in the cost model: decompressed under GenAI, the latent under vLLM
    assert genai.token_classes == ((3, 81_920, 0, "full"),) and vllm.token_classes == ((3, 1_152, 0, "full"),)


def test_gemma_3_27b_and_qwen3_next_80b_layouts():
    # Gemma-3-27B (62 layers, 16 KV heads x 128, window 1,024, full at i % 6 == 5: 10 full + 52 sliding), bf16,
    # block 16. GenAI: one block over all 62 layers: 62 x 2 x 16 x 16 x 128 x 2 = 8,126,464 B.
    # vLLM (MODELS.md §1.3): page 16 x 16 x 256 x 2 = 131,072; group_size = min(52, 10) = 10 (52 >= 1.5 x 10);
    # 1 full group + cdiv(52, 10) = 6 sliding groups (9, 9, 9, 9, 8, 8 layers: 8 padding); block 10 x 131,072.
    sw, full = LayerKV("sliding", 16, 128, 128, 1024), LayerKV("full", 16, 128, 128)
    g27 = ModelSpec("gemma-3-27b", 62, 32, 16, 128, layer_kv=tuple(full if i % 6 == 5 else sw for i in range(62)))
    assert paged_kv(g27, BF16, 16, "genai").block_bytes == 8_126_464
    v = paged_kv(g27, BF16, 16, "vllm")
    assert v.block_bytes == 1_310_720 and v.group_size == 10
    assert [(g.kind, len(g.layers)) for g in v.groups] == [("full", 10)] + [("sliding", n) for n in (9, 9, 9, 9, 8, 8)]
    # Qwen3-Next-80B (12 full layers 2 x 256; 36 Gated-DeltaNet: conv 8,192 x kernel 4, state 32 x 128 x 128),
    # bf16, block 16. vLLM: Mamba page = 3 x 8,192 x 2 (kernel - 1 columns) + 32 x 128 x 128 x 2 = 1,097,728;
    # attention page per token 2 x 2 x 256 x 2 = 2,048 -> block 16 x cdiv(1,097,728, 16 x 2,048) = 544 tokens,
    # page 544 x 2,048 = 1,114,112; group_size 12: 1 full + 3 Mamba groups, block 12 x 1,114,112 = 13,369,344.
    att = LayerKV("full", 2, 256, 256)
    gdn = LayerKV("linear", conv_elements=8192 * 4, recurrent_elements=32 * 128 * 128)
    qn = ModelSpec("qwen3-next", 48, 16, 2, 256, layer_kv=tuple(att if i % 4 == 3 else gdn for i in range(48)),
                   linear_dims=(16, 32, 128, 128, 4))
    v = paged_kv(qn, BF16, 16, "vllm")
    assert v.block_size == 544 and v.block_bytes == 13_369_344
    assert [(g.kind, len(g.layers)) for g in v.groups] == [("full", 12)] + [("state", 12)] * 3
    assert v.groups[1].real_bytes == 12 * 1_097_728  # the padded page holds 12 unpadded states
    # GenAI: KV block 12 x 2 x 16 x 2 x 256 x 2 = 393,216; one state block = 36 layers x (8,192 x 4 + 32 x 128 x
    # 128) x 2 B (bf16, the conv table keeps all 4 columns as measured) = 40,108,032.
    g = paged_kv(qn, BF16, 16, "genai")
    assert (g.block_bytes, g.state_bytes) == (393_216, 40_108_032)


def test_short_conv_state_page_keeps_kernel_minus_one_columns():
    # The tiny LFM2 (simkv/data/configs/tiny/lfm2.json: hidden 64, conv_L_cache 3, float32, conv layers 0 and 2).
    # vLLM: short_conv_state_shape keeps (3 - 1) x 64 elements in the model's dtype: 512 B per layer, 1,024 B for the
    # state group of both layers (1,536 B if all three columns were kept). GenAI's state block keeps all three
    # columns at the KV precision: 2 layers x 64 x 3 x 2 B = 768 B.
    from simkv.hfconfig import get_model

    lfm2 = get_model("simkv/data/configs/tiny/lfm2.json")
    spec = {g.kind: g for g in paged_kv(lfm2, BF16, 16, "vllm").groups}["state"]
    assert spec.layers == (0, 2) and spec.real_bytes == 2 * 2 * 64 * 4
    assert paged_kv(lfm2, BF16, 16, "genai").state_bytes == 2 * 64 * 3 * 2


# -- windows: GenAI keeps every block, vLLM frees -------------------------------------------------------------------

def test_gemma_like_blocks_per_request_genai_vs_vllm():
    # One request, P = 40, G = 161, blocks of 16; after step k its context is n = 40 + k.
    # GenAI: one block table over the 6 layers, every block kept: ceil(n / 16) blocks of
    #   6 layers x (K + V) x 16 tokens x 2 heads x 32 x 2 B = 24,576 B.
    # vLLM: 5 sliding + 1 full layers -> group_size 1: 5 sliding groups and 1 full group, block = one layer's page
    #   16 x 2 x (32 + 32) x 2 = 4,096 B. Full: ceil(n / 16); each sliding group has freed the blocks before
    #   (c - 64 + 1) // 16 with c = n - 1 (freed at the end of the previous step): ceil(n/16) - max(0, n - 64) // 16.
    #   n = 40: 3 + 5 x 3 = 18 blocks (73,728 B, as GenAI: nothing left the window yet)
    #   n = 100: 7 + 5 x (7 - 36 // 16 = 5) = 32 blocks = 131,072 B (GenAI 7 x 24,576 = 172,032)
    #   n = 200: 13 + 5 x (13 - 136 // 16 = 5) = 38 blocks = 155,648 B (GenAI 13 x 24,576 = 319,488)
    reqs = [Request(0, 40, 161, arrival_step=0)]
    _, _, genai = run(reqs, GEMMA, block_size=16)
    eng, _, vllm = run(reqs, GEMMA, block_size=16, kv_manager="vllm")
    assert eng.block_bytes == 4_096 and len(eng.kv.groups) == 6
    at = {40: 0, 100: 60, 200: 160}
    assert [int(genai["blocks_used"][k]) for k in at.values()] == [3, 7, 13]
    assert [int(genai["blocks_used"][k]) * 24_576 for k in at.values()] == [73_728, 172_032, 319_488]
    assert [int(vllm["blocks_used"][k]) for k in at.values()] == [18, 32, 38]
    assert [int(vllm["blocks_used"][k]) * 4_096 for k in at.values()] == [73_728, 131_072, 155_648]
    n = 40 + np.arange(161)
    assert vllm["blocks_used"].tolist() == (-(-n // 16) + 5 * (-(-n // 16) - np.maximum(0, n - 64) // 16)).tolist()
    # the bytes of data: GenAI n tokens x 1,536 B; vLLM the full layer's n tokens and each sliding layer's tokens in
    # its held blocks (n - 16 x freed), 256 B per token and layer
    assert genai["used_bytes"][160] == 200 * 1_536
    assert vllm["used_bytes"][160] == (200 + 5 * (200 - 16 * 8)) * 256


def test_gemma_3_27b_32k_request_vllm_vs_genai():
    # MODELS.md §5: at 32k context vLLM holds the full group's 2,048 blocks and 64 per sliding group
    # (32,768 - 16 x (32,767 - 1,023) // 16 = 1,024 tokens): 2,048 + 6 x 64 = 2,432 blocks x 1.25 MiB = 2.97 GiB,
    # against GenAI's 2,048 blocks x 7.75 MiB = 15.5 GiB (no savings from the window).
    sw, full = LayerKV("sliding", 16, 128, 128, 1024), LayerKV("full", 16, 128, 128)
    g27 = ModelSpec("gemma-3-27b", 62, 32, 16, 128, layer_kv=tuple(full if i % 6 == 5 else sw for i in range(62)))
    reqs = [Request(0, 32_767, 2, arrival_step=0)]
    for manager, blocks, nbytes in (("vllm", 2_432, 2_432 * 1_310_720), ("genai", 2_048, 2_048 * 8_126_464)):
        eng, groups, steps = run(reqs, g27, BF16, fast=True, block_size=16, kv_manager=manager)
        last = int(np.flatnonzero(steps["scheduled_tokens"] == 1)[0])  # the step that takes the context to 32,768
        assert steps["blocks_used"][last] == blocks and steps["blocks_used"][last] * eng.block_bytes == nbytes
    assert 2_432 * 1_310_720 / 2**30 == pytest.approx(2.97, abs=0.005) and 2_048 * 8_126_464 / 2**30 == 15.5


def test_request_bytes_is_what_the_engine_holds_for_one_request():
    # PagedKV.request_bytes (experiments/layer_kinds.py) is the engine's count for a lone request: the same
    # Gemma-3-27B shape at 32,768 tokens (the test above: 2,432 x 1.25 MiB under vLLM, 2,048 x 7.75 MiB under
    # GenAI); a hybrid adds one state block (GenAI) or one Mamba page per group (vLLM).
    sw, full = LayerKV("sliding", 16, 128, 128, 1024), LayerKV("full", 16, 128, 128)
    g27 = ModelSpec("gemma-3-27b", 62, 32, 16, 128, layer_kv=tuple(full if i % 6 == 5 else sw for i in range(62)))
    assert paged_kv(g27, BF16, 16, "vllm").request_bytes(32_768) == 2_432 * 1_310_720
    assert paged_kv(g27, BF16, 16, "genai").request_bytes(32_768) == 2_048 * 8_126_464
    # Qwen3-Next tiny (4 layers, 3 linear): GenAI holds ceil(140 / 32) = 5 KV blocks and 1 state block.
    linear = LayerKV("linear", conv_elements=80 * 4, recurrent_elements=4 * 8 * 12)
    hybrid = ModelSpec("hybrid", 4, 4, 2, 16, layer_kv=(linear, linear, linear, LayerKV("full", 2, 16, 16)))
    kv = paged_kv(hybrid, BF16, 32, "genai")
    assert kv.request_bytes(140) == 5 * kv.block_bytes + kv.state_bytes


def test_chunked_group_frees_at_a_chunk_boundary():
    # Llama-4-like, vLLM, blocks of 16: 3 chunked layers (C 64) -> 3 chunked groups, 1 full. P = 40, G = 100;
    # after step k the context is n = 40 + k, and a chunked group has freed the blocks before (c // 64) x 64 with
    # c = n - 1: ceil(n / 16) - ((n - 1) // 64 x 64) // 16.
    #   n = 64 (k 24): full 4, chunked 4 - 0 = 4 -> 16 blocks; n = 65: 5 + 3 x (5 - 4 = 1) = 8 (the chunk boundary:
    #   every block of the first chunk is freed); n = 128: 8 + 3 x (8 - 4) = 20; n = 129: 9 + 3 x (9 - 8) = 12.
    _, _, steps = run([Request(0, 40, 100, arrival_step=0)], LLAMA4, block_size=16, kv_manager="vllm")
    assert [int(steps["blocks_used"][n - 40]) for n in (64, 65, 128, 129)] == [16, 8, 20, 12]
    n = 40 + np.arange(100)
    assert steps["blocks_used"].tolist() == (-(-n // 16) + 3 * (-(-n // 16) - (n - 1) // 64 * 64 // 16)).tolist()
    # GenAI keeps all: ceil(n / 16) blocks of 4 layers
    _, _, genai = run([Request(0, 40, 100, arrival_step=0)], LLAMA4, block_size=16)
    assert genai["blocks_used"].tolist() == (-(-n // 16)).tolist()


# -- hybrid linear-attention models --------------------------------------------------------------------------------

def test_hybrid_state_pool_matches_genai_measurements():
    # The tiny Qwen3-Next on GenAI 2026.4.1 CPU (README §3, measured): KV block 8,192 B (bf16, 32 tokens, one
    # attention layer of 2 x 32), state block 30,720 B = 3 layers x (256 x 4 + 4 x 32 x 32) x 2 B.
    eng = engine([Request(0, 1, 1, arrival_step=0)], QWEN_NEXT, BF16)
    assert (eng.block_bytes, eng.state_bytes) == (8_192, 30_720)
    # dynamic pool, 3 x (100 + 40): KV 3 x ceil(min(200, 140) / 32) = 15 blocks, state 3 (one per sequence):
    # 15 x 8,192 + 3 x 30,720 = 215,040 B (measured: 15 KV + 3 LA blocks, la_peak_pool_blocks 3)
    reqs = [Request(i, 100, 40, arrival_step=0) for i in range(3)]
    eng, groups, steps = run(reqs, QWEN_NEXT, BF16)
    assert (eng.pool.total, eng.state_pool.total, int(steps["allocated_bytes"].max())) == (15, 3, 215_040)
    assert all(g.status == FINISHED for g in groups.values())
    # with prefix caching the state pool is token-driven: interval = 32 x clamp(ceil(30,720 / 8,192) = 4, 8, 256)
    # = 256; 3 x (600 + 300): KV 3 x ceil(900 / 32) = 87, checkpoints 3 x ceil(900 / 256) = 12 -> 1,081,344 B
    reqs = [Request(i, 600, 300, arrival_step=0) for i in range(3)]
    eng, _, steps = run(reqs, QWEN_NEXT, BF16, enable_prefix_caching=True)
    assert eng.kv.side[0].block_size == 256
    assert (eng.pool.total, eng.state_pool.total, int(steps["allocated_bytes"].max())) == (87, 12, 1_081_344)
    # cache_size 1 GiB, no prefix caching: max_num_seqs (256) state blocks reserved first, KV gets the rest:
    # (2^30 - 256 x 30,720) / 8,192 = 130,112 blocks, exactly 2^30 B in all
    eng, _, steps = run([Request(0, 100, 40, arrival_step=0)], QWEN_NEXT, BF16, cache_size=1)
    assert (eng.pool.total, eng.state_pool.total, int(steps["allocated_bytes"][0])) == (130_112, 256, 2**30)
    # cache_size 1 with prefix caching: the largest token target T with ceil(T/32) x 8,192 + ceil(T/256) x 30,720
    # <= 2^30 (binary search): 89,240 KV + 11,155 state blocks = 1,073,735,680 B (measured)
    eng, _, steps = run([Request(0, 100, 40, arrival_step=0)], QWEN_NEXT, BF16, cache_size=1, enable_prefix_caching=True)
    assert (eng.pool.total, eng.state_pool.total, int(steps["allocated_bytes"][0])) == (89_240, 11_155, 1_073_735_680)


def test_hybrid_one_state_block_per_live_sequence():
    # GenAI, fixed KV pool: the state pool has max_num_seqs blocks (3 here); a sequence takes its block with its
    # first prompt chunk and frees it when it finishes. A: P 10, G 5 at step 0 (steps 0-4); B: P 10, G 8 at step 1
    # (steps 1-8); C: P 10, G 2 at step 6 (steps 6-7) -> state blocks in use: 1, 2, 2, 2, 2, 1, 2, 2, 1.
    reqs = [Request(0, 10, 5, arrival_step=0), Request(1, 10, 8, arrival_step=1), Request(2, 10, 2, arrival_step=6)]
    eng, groups, steps = run(reqs, QWEN_NEXT, BF16, num_kv_blocks=20, max_num_seqs=3)
    assert steps["state_blocks_used"].tolist() == [1, 2, 2, 2, 2, 1, 2, 2, 1]
    assert steps["state_blocks_total"].tolist() == [3] * 9
    # allocated = 20 x 8,192 + 3 x 30,720 throughout; the state blocks in use are used bytes, whole
    assert set(steps["allocated_bytes"].tolist()) == {20 * 8_192 + 3 * 30_720}
    assert steps["used_bytes"][0] == 10 * 8_192 // 32 + 30_720
    assert eng.state_pool.used() == 0


def test_hybrid_max_num_seqs_caps_sequences_under_cache_size():
    # cache_size reserves max_num_seqs state blocks (2 here) and no more: even with split-fuse (where GenAI does
    # not apply max_num_seqs itself) a third sequence waits for a state block. A, B, C: P 10, G 5 at step 0:
    # A and B run steps 0-4 and free their blocks at the end of step 4; C starts at step 5 (first token at 5).
    reqs = [Request(i, 10, 5, arrival_step=0) for i in range(3)]
    eng, groups, steps = run(reqs, QWEN_NEXT, BF16, cache_size=1, max_num_seqs=2)
    assert eng.state_pool.total == 2
    assert [groups[i].first_token_step for i in range(3)] == [0, 0, 5]
    assert steps["state_blocks_used"].tolist() == [2] * 5 + [1] * 5
    # a dynamic pool instead grows the state pool for C (ensure_sequence_capacity): all three start at once
    eng, groups, _ = run(reqs, QWEN_NEXT, BF16, max_num_seqs=2)
    assert eng.state_pool.total == 3 and [groups[i].first_token_step for i in range(3)] == [0, 0, 0]


def test_hybrid_under_vllm_holds_one_mamba_block_per_request():
    # vLLM, block 16 asked: one layer's Mamba page (conv 256 x (kernel - 1 = 3) x 2 B + state 4,096 x 2 B = 9,728 B,
    # bf16) needs 16 x cdiv(9,728, 16 x 256) = 48 tokens per attention block (attention page per token
    # 2 x 2 x 32 x 2 = 256 B) -> page 12,288 B; types: 1 full layer, 3 Mamba -> group_size 1 (3 >= 1.5 x 1):
    # 1 full group + 3 Mamba groups, block 12,288 B. A request of n tokens holds ceil(n / 48) + 3 blocks.
    kv = paged_kv(QWEN_NEXT, BF16, 16, "vllm")
    assert (kv.block_size, kv.block_bytes) == (48, 12_288)
    assert [g.kind for g in kv.groups] == ["full", "state", "state", "state"]
    _, _, steps = run([Request(0, 100, 60, arrival_step=0)], QWEN_NEXT, BF16, block_size=16, kv_manager="vllm")
    n = 100 + np.arange(60)
    assert steps["blocks_used"].tolist() == (-(-n // 48) + 3).tolist()


def test_vllm_refuses_prefix_caching_with_a_sentence():
    with pytest.raises(ConfigError, match="prefix caching under --kv-manager vllm is not modelled"):
        engine([Request(0, 10, 2, arrival_step=0)], GEMMA, kv_manager="vllm", enable_prefix_caching=True)
    with pytest.raises(ConfigError, match="unknown KV-cache manager"):
        engine([Request(0, 10, 2, arrival_step=0)], GEMMA, kv_manager="sglang")


# -- planned runs = the reference ----------------------------------------------------------------------------------

MODELS = {"gemma": GEMMA, "llama4": LLAMA4, "qwen-next": QWEN_NEXT, "deepseek": DEEPSEEK}


@st.composite
def layer_workloads(draw):
    n = draw(st.integers(1, 8))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0002, 0.0007, 0.004]))
        reqs.append(Request(i, draw(st.integers(1, 150)), draw(st.integers(1, 120)), arrival_s=t,
                            samples=draw(st.sampled_from([1, 1, 1, 2]))))
    model = draw(st.sampled_from(sorted(MODELS)))
    manager = draw(st.sampled_from(["genai", "vllm"]))
    cfg = dict(block_size=draw(st.sampled_from([4, 8, 16])), num_kv_blocks=draw(st.sampled_from([0, 0, 30, 60, 400])),
               max_num_batched_tokens=draw(st.sampled_from([16, 64, 256])), kv_manager=manager,
               dynamic_split_fuse=draw(st.booleans()), on_oom=draw(st.sampled_from(["preempt", "wait", "reject"])),
               enable_prefix_caching=manager == "genai" and draw(st.booleans()), max_num_seqs=draw(st.sampled_from([2, 256])))
    if not cfg["dynamic_split_fuse"]:
        cfg["max_num_batched_tokens"] = 256
    return reqs, model, cfg


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_workloads())
def test_per_layer_models_invariants_and_fast_equals_reference(case):
    reqs, name, cfg = case
    model = MODELS[name]

    def observe(step, eng, live):
        eng.pool.check()
        if eng.state_pool is not None:
            eng.state_pool.check()

    eng = PagedServing(reqs, model, BF16, SchedulerConfig(**cfg), device=DEVICE, weights_bytes=0,
                       device_memory=1 << 40, stall_steps=200, observe=observe)
    groups, steps, _, _ = eng.run(fast=False)
    ok = {FINISHED, IGNORED, UNFINISHED} | ({REJECTED} if cfg["on_oom"] == "reject" else set())
    assert all(g.status in ok for g in groups)
    assert all(g.generated == g.G for g in groups if g.status == FINISHED)
    assert (steps["blocks_used"] <= steps["blocks_total"]).all()
    assert (steps["state_blocks_used"] <= steps["state_blocks_total"]).all()
    # the ledger leaves exactly the final pools allocated; used + reserved + internal = allocated
    rows = eng.ledger.rows
    net = int(rows["bytes"][rows["op"] == 0].sum() - rows["bytes"][rows["op"] == 2].sum())
    assert net == steps["allocated_bytes"][-1]
    assert (steps["used_bytes"] + steps["reserved_bytes"] + steps["internal_bytes"] == steps["allocated_bytes"]).all()
    assert (steps["used_bytes"] >= 0).all() and (steps["internal_bytes"] >= 0).all()
    fast = PagedServing(reqs, model, BF16, SchedulerConfig(**cfg), device=DEVICE, weights_bytes=0,
                        device_memory=1 << 40, stall_steps=200)
    groups2, steps2, _, _ = fast.run(fast=True)
    assert np.array_equal(steps, steps2) and eng.ledger == fast.ledger
    assert [(g.status, g.generated, g.first_token_s, g.finish_s) for g in groups] == \
        [(g.status, g.generated, g.first_token_s, g.finish_s) for g in groups2]
    assert list(eng.pool.free) == list(fast.pool.free) and eng.pool.touched == fast.pool.touched


def _same_fast_and_reference(reqs, model, cfg):
    """The planned runs equal the step-by-step reference: step table, ledger, every request, the pool."""
    ref = engine(reqs, model, BF16, **cfg)
    groups, steps, _, _ = ref.run(fast=False)
    fast = engine(reqs, model, BF16, **cfg)
    groups2, steps2, _, _ = fast.run(fast=True)
    assert np.array_equal(steps, steps2) and ref.ledger == fast.ledger
    assert [(g.status, g.generated, g.preemptions, g.first_token_s, g.finish_s) for g in groups] == \
        [(g.status, g.generated, g.preemptions, g.first_token_s, g.finish_s) for g in groups2]
    assert list(ref.pool.free) == list(fast.pool.free) and ref.pool.touched == fast.pool.touched
    return fast


def test_untouched_queue_tail_of_a_layered_model_under_the_vllm_manager(planned_runs):
    # Found on a real run (gpt-oss-120b's sliding + full layers at TP 4, 8,192-token prompts arriving faster than
    # served, the vLLM KV manager, a fixed pool): a planned run gives the queue's untouched tail no row, but counted
    # every present request's block tables, and its matrices did not broadcast (777 rows against 787 tables). Here
    # the same regime at small size: a sliding/full model, prompts of several steps' budgets, a burst that leaves a
    # tail no step of a run reaches. The fast engine plans runs with such a tail and equals the reference.
    rng = np.random.default_rng(7)
    t, reqs = 0.0, []
    for i in range(150):
        t += float(rng.exponential(0.0002))
        reqs.append(Request(i, int(rng.integers(100, 400)), int(rng.integers(5, 60)), arrival_s=t))
    for manager in ("vllm", "genai"):
        planned_runs.clear()
        _same_fast_and_reference(reqs, GEMMA, dict(block_size=16, num_kv_blocks=400, max_num_batched_tokens=128,
                                                   kv_manager=manager, max_num_seqs=64))
        assert planned_runs and max(run.passive for run in planned_runs) > 20


@st.composite
def long_queues(draw):
    """Many requests with prompts of up to several steps' budgets, in bursts, onto fixed pools of every size, on every
    layered model and both managers: the regime where planned runs carry an untouched queue tail."""
    n = draw(st.integers(10, 60))
    budget = draw(st.sampled_from([16, 64, 128]))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.0001, 0.0005, 0.004]))
        reqs.append(Request(i, draw(st.integers(1, 5 * budget)), draw(st.integers(1, 60)), arrival_s=t))
    cfg = dict(block_size=draw(st.sampled_from([4, 16])), num_kv_blocks=draw(st.sampled_from([40, 120, 600])),
               max_num_batched_tokens=budget, kv_manager=draw(st.sampled_from(["vllm", "genai"])),
               on_oom=draw(st.sampled_from(["preempt", "preempt", "wait"])), max_num_seqs=draw(st.sampled_from([4, 64, 1024])))
    return reqs, draw(st.sampled_from(sorted(MODELS))), cfg


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_queues())
def test_fast_equals_reference_with_long_queues_on_layered_models(case):
    reqs, name, cfg = case
    _same_fast_and_reference(reqs, MODELS[name], cfg)


@pytest.mark.parametrize("model, manager", [("gemma", "genai"), ("gemma", "vllm"), ("llama4", "vllm"),
                                            ("qwen-next", "genai"), ("qwen-next", "vllm"), ("deepseek", "vllm")])
def test_fast_equals_reference_on_a_trace_slice(model, manager):
    reqs = load_trace(AZURE_CONV, limit=60)
    out = []
    for fast in (False, True):
        eng = engine(reqs, MODELS[model], BF16, block_size=16, num_kv_blocks=4000, kv_manager=manager)
        groups, steps, _, _ = eng.run(fast=fast)
        out.append((steps, eng, [(g.status, g.first_token_step, g.finish_step) for g in groups]))
    (a, ea, ga), (b, eb, gb) = out
    assert np.array_equal(a, b) and ea.ledger == eb.ledger and ga == gb
    assert sum(1 for r in eb.rows if not isinstance(r, tuple)) > 5  # planned runs were taken


def test_azure_trace_serves_a_hybrid_model_through_the_library():
    # `simkv run --trace simkv/data/traces/azure_llm_2023_conv.csv --limit 200` for a hand-built hybrid model (the CLI's
    # --model PATH comes from the config loader): both managers, the reference equal to the planned runs.
    reqs = load_trace(AZURE_CONV, limit=200)
    results = {}
    for manager in ("genai", "vllm"):
        spec = ServingSpec(reqs, QWEN_NEXT, BF16, paged=SchedulerConfig(kv_manager=manager), device="h100-sxm",
                           max_context=0)
        r = serve(spec)
        ref = serve(ServingSpec(reqs, QWEN_NEXT, BF16, paged=SchedulerConfig(kv_manager=manager), device="h100-sxm",
                                max_context=0, engine="reference"))
        assert np.array_equal(r.steps, ref.steps)
        assert r.metrics["requests_finished"] == 200
        results[manager] = r
    genai = results["genai"].steps
    assert genai["state_blocks_used"].max() > 0  # live sequences held their states
    assert (genai["allocated_bytes"] == genai["blocks_total"] * 8_192 + genai["state_blocks_total"] * 30_720).all()
    assert results["vllm"].summary()["scenario"]["paged"]["kv_manager"] == "vllm"


# -- contiguous serving reads the layers -----------------------------------------------------------------------------

def test_contiguous_used_bytes_per_layer_follow_the_policy():
    # One request, P 100, G 1 (one step): the Gemma-like model in f16 has 256 B per token and layer.
    # openvino-cpu keeps every token of every layer: 100 x 6 x 256 = 153,600 B used.
    # hf-dynamic keeps W - 1 = 63 tokens of a sliding layer: (5 x 63 + 100) x 256 = 106,240 B.
    # The hybrid model under hf-dynamic: its one attention layer's 100 tokens (100 x 2 x 2 x 32 x 2 = 25,600 B) and
    # 3 states of conv 1,024 x 2 B (f16) + recurrent 4,096 x 4 B (f32): 3 x 18,432 = 55,296 -> 80,896 B.
    req = [Request(0, 100, 1, arrival_step=0)]

    def used(model, policy):
        r = serve(ServingSpec(req, model, F16, memory="contiguous", policy=policy, max_context=0))
        return int(r.steps["used_bytes"][0])

    assert used(GEMMA, "openvino-cpu") == 153_600
    assert used(GEMMA, "hf-dynamic") == 106_240
    assert used(QWEN_NEXT, "hf-dynamic") == 80_896

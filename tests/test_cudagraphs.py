"""CUDA-graph batch padding (simkv/cost/cudagraphs.py): vLLM 0.12's capture sizes, the padded token count, and a
step priced at it — worked out by hand from ``VllmConfig._set_cudagraph_sizes`` and ``CudagraphDispatcher.dispatch``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simkv.cost import capture_sizes, get_device, padded_tokens, step_cost
from simkv.cost.interconnects import allreduce_s
from simkv.hfconfig import resolve_model
from simkv.models import tp_shard
from simkv.serving.engine.costing import StepTimer

CONFIGS = "experiments/data/silicon/configs/"
MODELS = {"llama-3.1-70b": CONFIGS + "meta-llama--Meta-Llama-3.1-70B_config.json",
          "gpt-oss-120b": CONFIGS + "openai--gpt-oss-120b_config.json"}


def get_model(name):
    return resolve_model(MODELS[name])


def test_capture_sizes_golden():
    # largest = min(2 * max_num_seqs, 512) capped at max_num_batched_tokens; [1, 2, 4] <= largest, then
    # range(8, min(largest + 1, 256), 8), then range(256, largest + 1, 16)
    assert capture_sizes(1, 8192) == (1, 2)                       # largest 2
    assert capture_sizes(4, 8192) == (1, 2, 4, 8)                 # largest 8: range(8, 9, 8) = [8]
    assert capture_sizes(8, 8192) == (1, 2, 4, 8, 16)             # largest 16
    assert capture_sizes(3, 8192) == (1, 2, 4)                    # largest 6: no multiple of 8 fits
    assert capture_sizes(128, 8192)[-3:] == (240, 248, 256)       # largest 256: 8..248 by 8, then [256]
    assert len(capture_sizes(128, 8192)) == 3 + 31 + 1
    assert capture_sizes(1024, 8192)[-2:] == (496, 512)           # capped at 512: 3 + 31 + 17 sizes
    assert len(capture_sizes(1024, 8192)) == 51
    assert capture_sizes(1024, 256)[-1] == 256                    # capped at max_num_batched_tokens
    assert capture_sizes(4, 8192, 2048)[-2:] == (2032, 2048)      # gpt-oss: max-cudagraph-capture-size 2048
    assert capture_sizes(4, 1000, 2048)[-1] == 992                # min(1000, 2048) = 1000: last 16-step size 992
    assert capture_sizes(0, 8192) == ()


def test_padded_tokens_golden():
    sizes = capture_sizes(4, 8192)  # (1, 2, 4, 8)
    assert [padded_tokens(t, sizes) for t in range(10)] == [0, 1, 2, 4, 4, 8, 8, 8, 8, 9]  # 9 > 8: eager, unpadded
    big = capture_sizes(1024, 8192)
    assert padded_tokens(257, big) == 272 and padded_tokens(512, big) == 512 and padded_tokens(513, big) == 513
    assert padded_tokens(100, ()) == 100  # no graphs
    assert list(padded_tokens(np.array([0, 3, 5, 4096]), sizes)) == [0, 4, 8, 4096]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 600), st.integers(1, 8192), st.integers(0, 9000))
def test_padding_is_the_smallest_capture_size_that_holds_the_batch(seqs, budget, tokens):
    sizes = capture_sizes(seqs, budget)
    p = padded_tokens(tokens, sizes)
    if tokens == 0 or tokens > sizes[-1]:
        assert p == tokens
    else:
        assert p in sizes and p >= tokens and all(s < tokens for s in sizes if s < p)


def test_step_priced_at_the_padded_tokens():
    """Llama-3.1-70B at TP 8 on an H100, a decode step of 5 sequences with graphs of (1, 2, 4, 8): the layers run
    over 8 tokens. By hand: the GEMM FLOPs and the all-reduces are those of 8 tokens, the KV write and the LM head
    those of 5; the weights are streamed once either way."""
    model = tp_shard(get_model("llama-3.1-70b"), 8)
    device = get_device("h100-sxm")
    kw = dict(weights_bytes=10e9, attended_pairs=5 * 1000, kv_read_bytes=1e8, kv_write_bytes=5 * 1000.0,
              logit_tokens=5)
    five = step_cost(model, device, new_tokens=5, **kw)
    padded = step_cost(model, device, new_tokens=5, graph_tokens=8, **kw)
    eight = step_cost(model, device, new_tokens=8, **kw)
    assert padded.flops == eight.flops > five.flops
    assert padded.allreduce_s == eight.allreduce_s == allreduce_s(model, device, 8) > five.allreduce_s
    assert padded.bytes == five.bytes  # the padded slots write no KV
    assert padded.seconds - five.seconds == pytest.approx(allreduce_s(model, device, 8) - allreduce_s(model, device, 5))


def test_moe_streams_the_experts_of_the_padded_tokens():
    """gpt-oss-120b: 3 real tokens padded to 4 route 4 tokens' experts: E · (1 − (1 − k/E)^4) per MoE layer."""
    model = get_model("gpt-oss-120b")
    device = get_device("h100-sxm")
    kw = dict(weights_bytes=60e9, attended_pairs=0, kv_read_bytes=0, kv_write_bytes=0)
    assert step_cost(model, device, new_tokens=3, graph_tokens=4, **kw).bytes == \
        step_cost(model, device, new_tokens=4, **kw).bytes > step_cost(model, device, new_tokens=3, **kw).bytes


@pytest.mark.parametrize("name", ["llama-3.1-70b", "gpt-oss-120b"])
def test_step_timer_pads_as_step_cost_does(name):
    """The serving loop's timer with capture sizes gives step_cost's own time at the padded count (its official
    check would raise otherwise), and differs from the unpadded timer exactly where padding happens."""
    model = tp_shard(get_model(name), 4)
    device = get_device("h100-sxm")
    sizes = capture_sizes(8, 8192)  # (1, 2, 4, 8, 16)
    plain = StepTimer(model, device, 20 * 10**9, 4096)
    graphs = StepTimer(model, device, 20 * 10**9, 4096, graph_sizes=sizes)
    tokens = np.array([1, 3, 5, 16, 17, 300])
    n = len(tokens)
    args = (tokens, tokens * 500, tokens * 500, tokens, np.zeros(n))
    t_plain, t_graphs = plain.steps(*args), graphs.steps(*args)
    assert list(t_graphs == t_plain) == [True, False, False, True, True, True]
    for t in tokens:
        graphs.step(int(t), int(t) * 500, int(t) * 500, 0, int(t))
    official, _ = graphs.official(t_graphs)
    assert np.allclose(official, t_graphs, rtol=1e-12)

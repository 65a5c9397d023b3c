"""Honest memory (issue #21 point 5): a dynamic pool that does not fit the device.

GenAI's rules (openvino.genai ``da1db864``; docs/research/plan-facts.md §5, experiments/genai_layer_kinds/README.md
§1): the reservation for arriving prompts is never checked; ``_try_increase_cache`` grows by 256 tokens
unconditionally on a CPU device (scheduler.hpp:769) and on a GPU device only as far as
``get_available_gpu_memory`` = ``min(total - 1.1 x used, max_alloc x tensors)`` allows (utils.cpp:1070-1104; a
partial growth, else none: preemption, waiting, IGNORED on an empty step); an allocation that does not fit throws
out of ``step()``. simkv: the run ends there, out of memory, the requests left UNFINISHED.

Golden cases by hand: block 32 tokens (a growth = 8 blocks), 1,000 B per block over 2 layers (500 B per layer per
block), 100,000 B of weights; one request, prompt 32, 300 new tokens. Step 0 reserves min(2P, P + G) = 64 tokens =
2 blocks; after step k (k >= 1) the request has processed 31 + k tokens, and step k needs ceil((32 + k) / 32)
blocks: a 3rd at step 33, a 6th at step 129, an 8th at step 193, an 11th at step 289.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simkv.cost import get_device
from simkv.models import custom_model
from simkv.precision import get_precision
from simkv.serving import Request
from simkv.serving.engine.core import PagedServing, memory_path
from simkv.serving.sched.config import SchedulerConfig
from simkv.serving.sched.genai import GpuCheck, gpu_available
from simkv.serving.sched.group import IGNORED, UNFINISHED

ROOT = Path(__file__).resolve().parent.parent
MODEL = custom_model(layers=2, heads=2, head_dim=8)
W = 100_000


def run(device: str, memory: int, fast: bool = False, **cfg):
    eng = PagedServing([Request(0, 32, 300, arrival_step=0)], MODEL, get_precision("f16"),
                       SchedulerConfig(**cfg), device=get_device(device), weights_bytes=W, device_memory=memory,
                       block_bytes=1000, stall_steps=200)
    groups, steps, _, _ = eng.run(fast=fast)
    return eng, groups[0], steps


def test_which_presets_take_the_gpu_path():
    assert [memory_path(get_device(d)) for d in ("h100-sxm", "a100-80gb", "h200-sxm", "b200", "b300", "arc-a770",
                                                 "core-ultra-155h-igpu")] == ["gpu"] * 7
    assert memory_path(get_device("xeon-8480")) == "cpu"


def test_gpu_available_is_genai_arithmetic():
    g = GpuCheck(total=115_700, weights=W, max_alloc=115_700, tensors=4)
    assert gpu_available(g, 102_000) == 115_700 - 112_200  # 1.1 x 102,000 in float32, truncated
    # 1.1 x used above the total: the unsigned difference wraps, only max_alloc x tensors is left
    assert gpu_available(g, 107_000) == 4 * 115_700


@pytest.mark.parametrize("fast", [False, True])
def test_gpu_growth_capped_then_ignored(fast):
    # Device 115,700 B. Step 33: used = 100,000 + 2 blocks = 102,000, 1.1 x used = 112,200, available 3,500 <
    # 8,000 (256 tokens): the most tokens whose blocks fit is 96 = 3 blocks, pool 5 (held at the copy's peak:
    # 5,000 new + 1,000 of the old layer not yet freed: 106,000 fits). Step 129: used 105,000, 1.1 x = 115,500,
    # available 200 < one block: no growth; the request is alone (no victim), schedules nothing: IGNORED
    # after 1 + 128 tokens.
    eng, g, steps = run("h100-sxm", 115_700, fast=fast)
    assert eng.oom is None and g.status == IGNORED and g.generated == 129
    assert len(steps) == 130
    assert steps["blocks_total"].tolist() == [2] * 33 + [5] * 97
    assert steps["scheduled_requests"][-1] == 0
    assert (steps["allocated_bytes"] + W <= 115_700).all() and eng.resident_peak == 6_000


@pytest.mark.parametrize("fast", [False, True])
def test_gpu_cap_makes_a_request_wait_then_be_preempted(fast):
    # Device 115,700 B; A (32 + 100) at step 0, B (32 + 100) at step 1. Step 1: B's prompt raises the pool to the
    # two reservations, 2 + 2 = 4 blocks (unchecked). Step 33: A needs a 3rd block; used 104,000, 1.1 x = 114,400,
    # available 1,300: one block (pool 5). Step 34: B needs its 3rd; available 115,700 - 1.1 x 105,000 = 200: no
    # growth, B is the last request (no victim): it waits. Step 65: A needs a 4th block: B, the last request
    # holding tokens, is preempted partially (it holds 2 blocks, A needs 1). Step 97: A's 5th: B fully
    # (1 block, not more than needed). A finishes at step 99, then B recomputes and finishes. Never out of memory.
    eng = PagedServing([Request(0, 32, 100, arrival_step=0), Request(1, 32, 100, arrival_step=1)], MODEL,
                       get_precision("f16"), SchedulerConfig(), device=get_device("h100-sxm"), weights_bytes=W,
                       device_memory=115_700, block_bytes=1000, stall_steps=200)
    groups, steps, _, _ = eng.run(fast=fast)
    a, b = groups
    assert eng.oom is None and a.status == b.status == "FINISHED"
    assert steps["blocks_total"].tolist()[:35] == [2] + [4] * 32 + [5] * 2 and (steps["blocks_total"][33:] == 5).all()
    assert (steps["scheduled_requests"][34:65] == 1).all()  # B waits
    assert np.flatnonzero(steps["preemptions"]).tolist() == [65, 97] and b.preemptions == 2 and a.preemptions == 0
    assert a.finish_step == 99 and (steps["allocated_bytes"] + W <= 115_700).all()


@pytest.mark.parametrize("fast", [False, True])
def test_gpu_check_wraps_then_out_of_memory(fast):
    # Device 117,300 B. Step 33: available 117,300 - 112,200 = 5,100: 5 blocks, pool 7 (held 7,000 + 1,000).
    # Step 193: used 107,000, 1.1 x = 117,700 > 117,300: the unsigned difference wraps, the growth of 8 blocks
    # passes; pool 15, held 15,000 + 3,500 (the old layer: 7 x 500) + 100,000 = 118,500 > 117,300: out of
    # memory at step 193, the request UNFINISHED after 1 + 192 tokens.
    eng, g, steps = run("h100-sxm", 117_300, fast=fast)
    assert eng.oom["step"] == 193 and eng.oom["pool_blocks"] == 15 and eng.oom["held_bytes"] == 18_500
    assert g.status == UNFINISHED and g.generated == 193 and len(steps) == 193
    assert steps["blocks_total"].tolist() == [2] * 33 + [7] * 160
    assert "out of memory at step 193" in eng.stopped


@pytest.mark.parametrize("fast", [False, True])
def test_cpu_growth_unchecked_then_out_of_memory(fast):
    # Same device as the first GPU case, CPU path: step 33 grows by 8 blocks unchecked, pool 10 (held 10,000 +
    # 1,000: fits); step 289 grows to 18, held 18,000 + 5,000 (10 x 500) + 100,000 = 123,000 > 115,700.
    eng, g, steps = run("xeon-8480", 115_700, fast=fast)
    assert eng.oom["step"] == 289 and eng.oom["held_bytes"] == 23_000
    assert g.status == UNFINISHED and g.generated == 289 and len(steps) == 289
    assert steps["blocks_total"].tolist() == [2] * 33 + [10] * 256
    # with room, the same request finishes (11 blocks: pool 18)
    eng, g, steps = run("xeon-8480", 123_000, fast=fast)
    assert eng.oom is None and g.generated == 300 and steps["blocks_total"][-1] == 18


def test_fixed_pool_unchanged_by_the_device_path():
    # A fixed pool is never grown: both paths give the same run (preemption and --on-oom as before)
    for oom in ("preempt", "wait", "reject"):
        a = run("h100-sxm", 10**9, num_kv_blocks=5, on_oom=oom)[2]
        b = run("xeon-8480", 10**9, num_kv_blocks=5, on_oom=oom)[2]
        cols = [c for c in a.dtype.names if c not in ("time_s", "step_s")]  # times follow the device
        assert all(np.array_equal(a[c], b[c]) for c in cols)


def test_overloaded_cpu_trace_reports_out_of_memory_not_a_peak_above_the_device():
    # The first 6,000 requests of the Azure conversation hour on the default CPU preset (xeon-8480, 512 GiB,
    # llama-3-8b): queues grow, the pool is reserved for every queued prompt and grows past the device. Before,
    # the pool was capped at the device and its copy reported a 976 GiB in-step peak as fitting.
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "run", "--trace", "simkv/data/traces/azure_llm_2023_conv.csv",
                          "--limit", "6000", "--max-context", "0", "--json"], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    device, weights = d["scenario"]["device_memory_bytes"], d["scenario"]["weights_memory_bytes"]
    assert d["oom_step"] is not None and d["oom"].startswith(f"out of memory at step {d['oom_step']:,}")
    assert d["steps"] == d["oom_step"]  # the failed step is not a step of the table
    assert d["requests_unfinished"] == d["requests_total"] - d["requests_finished"] > 0
    assert d["requests_total"] == 6000
    # what must fit (the pools without the CPU plugin's untouched scratch) fits in every step that ran
    assert d["peak_pool_bytes"] + weights <= device
    # the virtual peak (scratch included) may exceed it, and the text report says so
    assert d["peak_allocated_bytes"] + weights > device
    text = subprocess.run([sys.executable, "-m", "simkv.cli", "run", "--trace", "simkv/data/traces/azure_llm_2023_conv.csv",
                           "--limit", "6000", "--max-context", "0"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300).stdout
    assert "OUT OF MEMORY" in text and "virtual and never touched" in text

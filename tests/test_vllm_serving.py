"""``--scheduler vllm`` in the serving engine: the engine's steps are simkv's vLLM scheduler's steps (itself step-exact
against the real vLLM: tests/test_vllm_scheduler.py, tests/test_vllm_real.py), the reference path is the one taken,
and ``simkv run --scheduler vllm`` end to end."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from simkv.cost import get_device
from simkv.errors import ConfigError
from simkv.hfconfig import resolve_model
from simkv.precision import get_precision
from simkv.serving.engine.core import PagedServing, prompt_token_ids, takes_fast_paths
from simkv.serving.kv.groups import paged_kv
from simkv.serving.requests import Request
from simkv.serving.sched.config import SchedulerConfig
from simkv.serving.sched.vllm import (UNBOUNDED_MODEL_LEN, VllmSettings, batch_defaults, group_specs,
                                      num_gpu_blocks, simulate_steps)

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "simkv" / "data" / "configs" / "tiny"
GIB = 1024**3


def workload(seed: int, n: int = 30, prefix: bool = False) -> list[Request]:
    rng = random.Random(seed)
    reqs, step = [], 0
    for i in range(n):
        step += rng.randint(0, 3)
        kw = {"prefix_id": f"p{rng.randint(0, 2)}", "prefix_tokens": 32} if prefix else {}
        reqs.append(Request(i, rng.randint(33 if prefix else 1, 120), rng.randint(1, 40), arrival_step=step, **kw))
    return reqs


def engine(model, reqs, blocks: int, prefix: bool = False, **kw) -> PagedServing:
    cfg = SchedulerConfig(block_size=16, num_kv_blocks=blocks, max_num_batched_tokens=64, max_num_seqs=8,
                          enable_prefix_caching=prefix, scheduler="vllm", **kw)
    return PagedServing(reqs, model, get_precision("f16"), cfg, device=get_device("h100-sxm"),
                        weights_bytes=0, device_memory=80 * GIB)


@pytest.mark.parametrize("shape,blocks,prefix", [("uniform", 14, False), ("uniform", 14, True),
                                                 ("gemma3", 40, False), ("qwen3_next", 12, False)])
def test_engine_steps_are_the_vllm_schedulers(shape, blocks, prefix):
    """Every step of the engine under ``--scheduler vllm`` is the step :func:`simulate_steps` takes on the same
    workload (tokens scheduled, preemptions, blocks in use after scheduling), tight pools with preemptions included:
    the engine adds nothing to vLLM's rules and drops nothing."""
    model = (resolve_model("custom", layers=2, heads=4, kv_heads=2, head_dim=16) if shape == "uniform"
             else resolve_model(str(TINY / f"{shape}.json")))
    reqs = workload(7, prefix=prefix)
    eng = engine(model, reqs, blocks, prefix)
    groups, steps, _, _ = eng.run(fast=False)
    kv = paged_kv(model, get_precision("f16"), 16, "vllm", prefix_caching=prefix)
    settings = VllmSettings(num_blocks=blocks, block_size=kv.block_size, max_num_batched_tokens=64, max_num_seqs=8,
                            max_model_len=UNBOUNDED_MODEL_LEN, enable_prefix_caching=prefix)
    tokens = prompt_token_ids(reqs) if prefix else [range(r.prompt) for r in reqs]
    ref = simulate_steps(group_specs(kv, UNBOUNDED_MODEL_LEN), settings, reqs, tokens)
    assert len(steps) == len(ref)
    assert list(steps["scheduled_tokens"]) == [sum(s["scheduled"].values()) for s in ref]
    assert list(steps["preemptions"]) == [len(s["preempted"]) for s in ref]
    assert list(steps["blocks_used"]) == [blocks - 1 - s["free_after_schedule"] for s in ref]
    assert all(g.status == "FINISHED" for g in groups)
    assert sum(steps["preemptions"]) > 0 or shape == "gemma3"  # the tight pools preempt
    assert (steps["used_bytes"] <= steps["allocated_bytes"]).all()


def test_vllm_takes_the_reference_path_and_fast_equals_it():
    """The fast paths replay GenAI's rules only (core.takes_fast_paths): under vLLM ``run()`` is the reference."""
    model = resolve_model("custom", layers=2, heads=4, kv_heads=2, head_dim=16)
    fast, ref = engine(model, workload(3), 14), engine(model, workload(3), 14)
    assert not takes_fast_paths(fast.sched)
    a, b = fast.run(fast=True), ref.run(fast=False)
    assert a[1].tobytes() == b[1].tobytes() and list(a[3]) == list(b[3])
    assert fast.slow_steps == len(a[1])


def test_vllm_pool_from_gpu_memory_utilization():
    """``num_gpu_blocks``: (0.9 × 80 GiB − 16 GiB weights − 1 GiB activations) // 2 MiB = 55 GiB / 2 MiB = 28,160;
    one byte less of room, 28,159."""
    assert num_gpu_blocks(2 * 1024**2, 80 * GIB, 16 * GIB, GIB, 0.9) == 28_160
    assert num_gpu_blocks(2 * 1024**2, 80 * GIB, 16 * GIB, GIB + 1, 0.9) == 28_159
    with pytest.raises(ConfigError):
        num_gpu_blocks(2 * 1024**2, 80 * GIB, 80 * GIB, GIB, 0.9)
    assert batch_defaults("h100-sxm", 80 * 10**9) == (8192, 1024)
    assert batch_defaults("a100-80gb", 80 * GIB) == (2048, 256)
    assert batch_defaults("h200", 141 * 10**9) == (8192, 1024)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simkv.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_cli_run_scheduler_vllm_azure_conv():
    """``simkv run --trace azure-conv --limit 200 --device h100-sxm --scheduler vllm``: vLLM's defaults (block 16,
    8192 tokens / 1024 sequences on an H100, f16 KV), every request finished; a tight pool preempts, and the fast
    engine's JSON is byte-identical to the reference engine's."""
    p = cli("run", "--trace", "azure-conv", "--limit", "200", "--device", "h100-sxm", "--scheduler", "vllm")
    assert p.returncode == 0, p.stderr
    assert "f16 KV; vllm scheduler; paged, block 16, pool of gpu_memory_utilization 0.9" in p.stdout
    assert "200: 200 finished" in p.stdout
    base = ["run", "--trace", "azure-conv", "--limit", "200", "--device", "h100-sxm", "--scheduler", "vllm",
            "--num-kv-blocks", "400", "--json"]
    fast, ref = cli(*base), cli(*base, "--engine", "reference")
    assert fast.returncode == 0 and ref.returncode == 0, fast.stderr + ref.stderr
    assert fast.stdout == ref.stdout
    out = json.loads(fast.stdout)
    assert out["preemptions"] > 0 and out["requests_finished"] == 200
    paged = out["scenario"]["paged"]
    assert paged["scheduler"] == "vllm" and paged["max_num_batched_tokens"] == 8192 and paged["block_size"] == 16


def test_cli_scheduler_vllm_bad_input_one_line():
    p = cli("run", "--trace", "azure-conv", "--limit", "5", "--scheduler", "vllm", "--scheduling-policy", "lifo",
            "--device", "h100-sxm")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "lifo" in p.stderr

"""The servers the silicon rows ran: each recipe of :data:`simkv.validate.silicon.RECIPES` pinned flag by flag from the
InferenceX script its key names (docs/research/latency-facts.md §1, "The H200, B200 and B300 rows"), the lookup
that picks one per row, and an H200 gpt-oss row end to end."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from simkv.validate import silicon
from simkv.validate.silicon import ANY, RECIPES, Row, recipe_for

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "experiments" / "data" / "silicon"

GPT, LLAMA, MINIMAX, KIMI = ("openai/gpt-oss-120b", "meta-llama/Llama-3.1-70B", "MiniMaxAI/MiniMax-M2.5",
                             "moonshotai/Kimi-K2.5")

#: key -> (max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, kv_cache_dtype, async_scheduling,
#: max_cudagraph_capture_size, batched_tokens_per_isl, the script@commit its source must name). Read from the script
#: at that commit of SemiAnalysisAI/InferenceX (``git show COMMIT:PATH``):
#: * None seqs = ``--max-num-seqs $CONC``; 1024 = no ``--max-num-seqs``: vLLM's ``get_batch_defaults`` for ``vllm
#:   serve`` on >= 70 GiB (0.12.0 and 0.15.1 read); 8192 tokens likewise where the script sets none;
#: * async True: ``async-scheduling: true`` in the v0.10.2 scripts' config.yaml, or no flag on vLLM >= 0.15, whose
#:   ``VllmConfig.__post_init__`` turns it on (0.15.1 read);
#: * capture 2048: ``max-cudagraph-capture-size: 2048`` / ``cuda-graph-sizes: 2048`` (v0.10.2); None: vLLM's default;
#: * per-ISL 2: ``--max-num-batched-tokens "$((ISL * 2 ))"``; kv "fp8": ``kv-cache-dtype: fp8``.
PINNED = {
    # the H100 recipes, unchanged (latency-facts §1)
    (GPT, ANY, "h100_sxm", ANY): (None, 8192, 0.9, "bf16", True, 2048, 0, "gptoss_fp4_h100.sh"),
    (LLAMA, ANY, "h100_sxm", ANY): (None, 8192, 0.9, "fp8", True, None, 0, "70b_fp8_h100_"),
    (MINIMAX, ANY, "h100_sxm", ANY): (256, 8192, 0.9, "bf16", False, None, 0, "minimaxm2.5_fp8_h100.sh"),
    ("aic", ANY, "h100_sxm", ANY): (1024, 8192, 0.9, "bf16", False, None, 0, "get_batch_defaults"),
    # H200
    ("aic", ANY, "h200_sxm", ANY): (1024, 8192, 0.9, "bf16", False, None, 0, "get_batch_defaults"),
    (GPT, "fp4", "h200_sxm", "0.18.0"): (None, 8192, 0.9, "bf16", True, 2048, 0, "gptoss_fp4_h200.sh @ cec542a9a"),
    (GPT, "fp4", "h200_sxm", ""): (None, 8192, 0.9, "bf16", True, 2048, 0, "gptoss_fp4_h200_slurm.sh @ e06929c70"),
    (LLAMA, "fp8", "h200_sxm", ""): (None, 8192, 0.9, "fp8", True, None, 0, "70b_fp8_h200_slurm.sh @ 9596d23d7"),
    (MINIMAX, "fp8", "h200_sxm", "0.16.0"): (1024, 8192, 0.95, "bf16", True, None, 0,
                                             "minimaxm2.5_fp8_h200.sh @ a36346339"),
    (MINIMAX, "fp8", "h200_sxm", "0.18.0"): (1024, 8192, 0.95, "bf16", True, None, 0,
                                             "minimaxm2.5_fp8_h200.sh @ 1d5cae141..626932a11"),
    (KIMI, "int4", "h200_sxm", "0.16.0"): (None, 8192, 0.95, "bf16", True, None, 0,
                                           "kimik2.5_int4_h200.sh @ 749096c4c..79a42e20a"),
    # B200
    (GPT, "fp4", "b200_sxm", "0.15.1"): (512, 8192, 0.9, "fp8", True, 2048, 0, "gptoss_fp4_b200.sh @ d2c2acb19"),
    (GPT, "fp4", "b200_sxm", ""): (512, 8192, 0.9, "bf16", True, 2048, 0, "gptoss_fp4_b200_docker.sh @ e06929c70"),
    (LLAMA, "fp8", "b200_sxm", ""): (512, 8192, 0.9, "fp8", True, None, 0, "70b_fp8_b200_docker.sh @ 9596d23d7"),
    (LLAMA, "fp4", "b200_sxm", ""): (512, 8192, 0.9, "fp8", True, None, 0, "70b_fp4_b200_docker.sh @ 9596d23d7"),
    (MINIMAX, "fp8", "b200_sxm", "0.17.0"): (1024, 8192, 0.95, "bf16", True, None, 0,
                                             "minimaxm2.5_fp8_b200.sh @ f342df18e..626932a11"),
    (MINIMAX, "fp8", "b200_sxm", "0.19.0"): (1024, 8192, 0.9, "fp8", True, 2048, 2,
                                             "minimaxm2.5_fp8_b200.sh @ bddbf4031..8c3eb5b86"),
    (MINIMAX, "fp4", "b200_sxm", "0.19.0"): (1024, 8192, 0.9, "fp8", True, 2048, 2,
                                             "minimaxm2.5_fp4_b200.sh @ 79bd988e9..8c3eb5b86"),
    (KIMI, "int4", "b200_sxm", "0.15.1"): (None, 8192, 0.95, "bf16", True, None, 0,
                                           "kimik2.5_int4_b200.sh @ eb02101ef..1cb92d21d"),
    (KIMI, "fp4", "b200_sxm", "0.17.0"): (None, 8192, 0.9, "bf16", True, None, 0,
                                          "kimik2.5_fp4_b200.sh @ a58dedd5a..626932a11"),
    # B300
    (MINIMAX, "fp8", "b300_sxm", "0.19.0"): (1024, 8192, 0.9, "fp8", True, 2048, 2,
                                             "minimaxm2.5_fp8_b300.sh @ 340d7854c..77b259a5e"),
    (MINIMAX, "fp4", "b300_sxm", "0.19.0"): (1024, 8192, 0.9, "fp8", True, 2048, 2,
                                             "minimaxm2.5_fp4_b300.sh @ 22d0f12f7..77b259a5e"),
    (KIMI, "fp4", "b300_sxm", "0.19.0"): (None, 8192, 0.9, "bf16", True, None, 0, "kimik2.5_fp4_b300.sh @ f34a83b25"),
}


def test_every_recipe_is_pinned_from_its_script():
    assert set(RECIPES) == set(PINNED)
    for key, (seqs, tokens, memory, kv, asynchronous, capture, per_isl, script) in PINNED.items():
        r = RECIPES[key]
        assert (r.max_num_seqs, r.max_num_batched_tokens, r.gpu_memory_utilization, r.kv_cache_dtype,
                r.async_scheduling, r.max_cudagraph_capture_size, r.batched_tokens_per_isl) == (
                    seqs, tokens, memory, kv, asynchronous, capture, per_isl), key
        assert script in r.source, key


def _row(**kw) -> Row:
    base = dict(id="r", model_path=GPT, precision="fp4", system="h200_sxm", mode="agg", isl=1024, osl=1024,
                concurrency=8, tp=1, pp=1, attention_dp=1, moe_tp=1, moe_ep=1, ttft_ms=100.0, tpot_ms=10.0,
                source="source_file=2026-04-06.csv; model=gptoss", backend_version="0.18.0")
    return Row(**{**base, **kw})


def test_each_row_gets_the_recipe_of_its_device_and_image():
    # the most specific key wins; an H100 row of any version keeps the H100 recipe
    assert recipe_for(_row(), "inferencex") is RECIPES[(GPT, "fp4", "h200_sxm", "0.18.0")]
    assert recipe_for(_row(backend_version=""), "inferencex") is RECIPES[(GPT, "fp4", "h200_sxm", "")]
    assert recipe_for(_row(system="h100_sxm", backend_version="0.11.2"), "inferencex") is RECIPES[
        (GPT, ANY, "h100_sxm", ANY)]
    assert recipe_for(_row(model_path="Qwen/Qwen3-235B-A22B-FP8", precision="fp8", backend_version="0.12.0"),
                      "aic") is RECIPES[("aic", ANY, "h200_sxm", ANY)]
    # an image whose script is not recorded (a nightly, a version no master config named) has none
    assert recipe_for(_row(system="b200_sxm", backend_version="nightly-5b8c30d62b754b57"), "inferencex") is None
    assert recipe_for(_row(system="b300_sxm", model_path=KIMI, backend_version="0.17.0"), "inferencex") is None


def test_the_token_budget_follows_the_isl_where_the_script_says_so():
    """minimaxm2.5_fp8_b200.sh @ bddbf4031: --max-num-batched-tokens "$((ISL * 2 ))": 2 x 8192 = 16,384 for an
    8k-input row, 2 x 1024 = 2,048 for a 1k one; a fixed budget stays as it is."""
    row = _row(model_path=MINIMAX, precision="fp8", system="b200_sxm", backend_version="0.19.0", isl=8192)
    assert recipe_for(row, "inferencex").max_num_batched_tokens == 16_384
    assert recipe_for(_row(model_path=MINIMAX, precision="fp8", system="b200_sxm", backend_version="0.19.0",
                           isl=1024), "inferencex").max_num_batched_tokens == 2_048
    assert recipe_for(_row(isl=8192), "inferencex").max_num_batched_tokens == 8192


def test_an_h200_gpt_oss_row_end_to_end(tmp_path):
    """``validate --silicon --match``: an H200 gpt-oss row of vLLM 0.18.0 is modelled on its H200 recipe; the same row
    on an image whose script is not recorded is listed with the one-line reason."""
    configs = tmp_path / "configs"
    configs.mkdir()
    name = silicon.resolve_checkpoint(GPT, "fp4", SHIPPED / "configs").config
    (configs / name).write_text((SHIPPED / "configs" / name).read_text())
    row = {"id": "gptoss_h200_c4", "backend": "vllm", "backend_version": "0.18.0", "model_path": GPT,
           "system": "h200_sxm", "precision": "fp4", "mode": "agg", "isl": "256", "osl": "16", "batch_size": "4",
           "tp_size": "1", "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "1", "moe_ep_size": "1",
           "silicon_ttft_ms": "50", "silicon_tpot_ms": "5",
           "silicon_data_source": "source_file=2026-04-06.csv; model=gptoss; silicon_concurrency=4; wip=False"}
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=silicon.COLUMNS)
        w.writeheader()
        for r in (row, {**row, "id": "gptoss_h200_c4_v099", "backend_version": "0.99.0"}):
            w.writerow({c: "" for c in silicon.COLUMNS} | r)
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--silicon", str(path), "--match",
                          "gptoss_h200", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    one, two = json.loads(out.stdout)["rows"]
    assert one["reason"] is None and one["predicted_ttft_ms"] > 0 and one["predicted_tpot_ms"] > 0
    assert one["predicted_ttft_ms"] == pytest.approx(silicon.simulate(silicon.read_rows(path)[0], configs)
                                                     .predicted_ttft_ms, rel=0, abs=0)
    assert two["predicted_ttft_ms"] is None
    assert two["reason"] == ("no recipe for openai/gpt-oss-120b fp4 on h200_sxm at vLLM 0.99.0: the script it ran "
                             "is not recorded")

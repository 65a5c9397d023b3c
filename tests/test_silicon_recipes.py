"""The servers the silicon rows ran: each recipe of :data:`simkv.validate.silicon_recipes.RECIPES` pinned flag by
flag from the InferenceX script its key names (docs/research/latency-facts.md §1, "The H200, B200 and B300 rows"),
the lookup that picks one per row, and an H200 gpt-oss row end to end."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from simkv.validate import silicon
from simkv.errors import ConfigError
from simkv.validate.silicon_recipes import ANY, RECIPES, VLLM_DEFAULTS, Row, kv_cache_precision, recipe_for

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "experiments" / "data" / "silicon"

GPT, LLAMA, MINIMAX, KIMI = ("openai/gpt-oss-120b", "meta-llama/Llama-3.1-70B", "MiniMaxAI/MiniMax-M2.5",
                             "moonshotai/Kimi-K2.5")

#: key -> (max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, kv_cache_dtype, async_scheduling,
#: max_cudagraph_capture_size, batched_tokens_per_isl, block_size, vllm_version, the script@commit its source must
#: name). Read from the script at that commit of SemiAnalysisAI/InferenceX (``git show COMMIT:PATH``):
#: * None seqs = ``--max-num-seqs $CONC``; 1024 = no ``--max-num-seqs``: vLLM's ``get_batch_defaults`` for ``vllm
#:   serve`` on >= 70 GiB (0.12.0 and 0.15.1 read); 8192 tokens likewise where the script sets none;
#: * async True: ``async-scheduling: true`` in the v0.10.2 scripts' config.yaml; None: no flag, the row's version's
#:   default (VLLM_DEFAULTS, pinned in test_vllm_defaults_are_those_read_in_each_wheel);
#: * capture 2048: ``max-cudagraph-capture-size: 2048`` / ``cuda-graph-sizes: 2048`` (v0.10.2); None: vLLM's default;
#: * per-ISL 2: ``--max-num-batched-tokens "$((ISL * 2 ))"``; kv "fp8": ``kv-cache-dtype: fp8``; "auto": no
#:   ``--kv-cache-dtype`` (vLLM's default);
#: * block 32: ``--block-size 32`` (the MiniMax fp8 B200 scripts and the B300 one "as the B200 v0.19.0 fp8 script");
#:   16: none, vLLM's CUDA default;
#: * version "0.10.2": rows without a ``backend_version`` whose workflow template names ``vllm/vllm-openai:v0.10.2``;
#:   "0.12.0": aic's gap analysis (its rows' ``backend_version``, §2).
PINNED = {
    # H100 (latency-facts §1); MiniMax's rows ran v0.18.0 without the flag: async on (it was False before)
    (GPT, ANY, "h100_sxm", ANY): (None, 8192, 0.9, "auto", True, 2048, 0, 16, "", "gptoss_fp4_h100.sh"),
    (LLAMA, ANY, "h100_sxm", ANY): (None, 8192, 0.9, "fp8", True, None, 0, 16, "0.10.2", "70b_fp8_h100_"),
    (MINIMAX, ANY, "h100_sxm", ANY): (256, 8192, 0.9, "auto", None, None, 0, 16, "", "minimaxm2.5_fp8_h100.sh"),
    ("aic", ANY, "h100_sxm", ANY): (1024, 8192, 0.9, "auto", None, None, 0, 16, "0.12.0", "get_batch_defaults"),
    # H200
    ("aic", ANY, "h200_sxm", ANY): (1024, 8192, 0.9, "auto", None, None, 0, 16, "0.12.0", "get_batch_defaults"),
    (GPT, "fp4", "h200_sxm", "0.18.0"): (None, 8192, 0.9, "auto", None, 2048, 0, 16, "",
                                         "gptoss_fp4_h200.sh @ cec542a9a"),
    (GPT, "fp4", "h200_sxm", ""): (None, 8192, 0.9, "auto", True, 2048, 0, 16, "0.10.2",
                                   "gptoss_fp4_h200_slurm.sh @ e06929c70"),
    (LLAMA, "fp8", "h200_sxm", ""): (None, 8192, 0.9, "fp8", True, None, 0, 16, "0.10.2",
                                     "70b_fp8_h200_slurm.sh @ 9596d23d7"),
    (MINIMAX, "fp8", "h200_sxm", "0.16.0"): (1024, 8192, 0.95, "auto", None, None, 0, 16, "",
                                             "minimaxm2.5_fp8_h200.sh @ a36346339"),
    (MINIMAX, "fp8", "h200_sxm", "0.18.0"): (1024, 8192, 0.95, "auto", None, None, 0, 16, "",
                                             "minimaxm2.5_fp8_h200.sh @ 1d5cae141..626932a11"),
    (KIMI, "int4", "h200_sxm", "0.16.0"): (None, 8192, 0.95, "auto", None, None, 0, 16, "",
                                           "kimik2.5_int4_h200.sh @ 749096c4c..79a42e20a"),
    # B200
    (GPT, "fp4", "b200_sxm", "0.15.1"): (512, 8192, 0.9, "fp8", None, 2048, 0, 16, "",
                                         "gptoss_fp4_b200.sh @ d2c2acb19"),
    (GPT, "fp4", "b200_sxm", ""): (512, 8192, 0.9, "auto", True, 2048, 0, 16, "0.10.2",
                                   "gptoss_fp4_b200_docker.sh @ e06929c70"),
    (LLAMA, "fp8", "b200_sxm", ""): (512, 8192, 0.9, "fp8", True, None, 0, 16, "0.10.2",
                                     "70b_fp8_b200_docker.sh @ 9596d23d7"),
    (LLAMA, "fp4", "b200_sxm", ""): (512, 8192, 0.9, "fp8", True, None, 0, 16, "0.10.2",
                                     "70b_fp4_b200_docker.sh @ 9596d23d7"),
    (MINIMAX, "fp8", "b200_sxm", "0.17.0"): (1024, 8192, 0.95, "auto", None, None, 0, 32, "",
                                             "minimaxm2.5_fp8_b200.sh @ f342df18e..626932a11"),
    (MINIMAX, "fp8", "b200_sxm", "0.19.0"): (1024, 8192, 0.9, "fp8", None, 2048, 2, 32, "",
                                             "minimaxm2.5_fp8_b200.sh @ bddbf4031..8c3eb5b86"),
    (MINIMAX, "fp4", "b200_sxm", "0.19.0"): (1024, 8192, 0.9, "fp8", None, 2048, 2, 16, "",
                                             "minimaxm2.5_fp4_b200.sh @ 79bd988e9..8c3eb5b86"),
    (KIMI, "int4", "b200_sxm", "0.15.1"): (None, 8192, 0.95, "auto", None, None, 0, 16, "",
                                           "kimik2.5_int4_b200.sh @ eb02101ef..1cb92d21d"),
    (KIMI, "fp4", "b200_sxm", "0.17.0"): (None, 8192, 0.9, "auto", None, None, 0, 16, "",
                                          "kimik2.5_fp4_b200.sh @ a58dedd5a..626932a11"),
    # B300
    (MINIMAX, "fp8", "b300_sxm", "0.19.0"): (1024, 8192, 0.9, "fp8", None, 2048, 2, 32, "",
                                             "minimaxm2.5_fp8_b300.sh @ 340d7854c..77b259a5e"),
    (MINIMAX, "fp4", "b300_sxm", "0.19.0"): (1024, 8192, 0.9, "fp8", None, 2048, 2, 16, "",
                                             "minimaxm2.5_fp4_b300.sh @ 22d0f12f7..77b259a5e"),
    (KIMI, "fp4", "b300_sxm", "0.19.0"): (None, 8192, 0.9, "auto", None, None, 0, 16, "",
                                          "kimik2.5_fp4_b300.sh @ f34a83b25"),
}


def test_every_recipe_is_pinned_from_its_script():
    assert set(RECIPES) == set(PINNED)
    for key, (seqs, tokens, memory, kv, asynchronous, capture, per_isl, block, version, script) in PINNED.items():
        r = RECIPES[key]
        assert (r.max_num_seqs, r.max_num_batched_tokens, r.gpu_memory_utilization, r.kv_cache_dtype,
                r.async_scheduling, r.max_cudagraph_capture_size, r.batched_tokens_per_isl, r.block_size,
                r.vllm_version) == (seqs, tokens, memory, kv, asynchronous, capture, per_isl, block, version), key
        assert script in r.source, key


def _row(**kw) -> Row:
    base = dict(id="r", model_path=GPT, precision="fp4", system="h200_sxm", mode="agg", isl=1024, osl=1024,
                concurrency=8, tp=1, pp=1, attention_dp=1, moe_tp=1, moe_ep=1, ttft_ms=100.0, tpot_ms=10.0,
                source="source_file=2026-04-06.csv; model=gptoss", backend_version="0.18.0")
    return Row(**{**base, **kw})


def test_each_row_gets_the_recipe_of_its_device_and_image():
    # the most specific key wins (the recipe is told by its source); an H100 row of any version keeps the H100 recipe
    def picked(row, proto="inferencex"):
        return recipe_for(row, proto).source

    assert picked(_row()) == RECIPES[(GPT, "fp4", "h200_sxm", "0.18.0")].source
    assert recipe_for(_row(backend_version=""), "inferencex") is RECIPES[(GPT, "fp4", "h200_sxm", "")]
    assert picked(_row(system="h100_sxm", backend_version="0.11.2")) == RECIPES[(GPT, ANY, "h100_sxm", ANY)].source
    assert picked(_row(model_path="Qwen/Qwen3-235B-A22B-FP8", precision="fp8", backend_version="0.12.0"),
                  "aic") == RECIPES[("aic", ANY, "h200_sxm", ANY)].source
    # an image whose script is not recorded (a nightly, a version no master config named) has none
    assert recipe_for(_row(system="b200_sxm", backend_version="nightly-5b8c30d62b754b57"), "inferencex") is None
    assert recipe_for(_row(system="b300_sxm", model_path=KIMI, backend_version="0.17.0"), "inferencex") is None


def test_vllm_defaults_are_those_read_in_each_wheel():
    """Each release's wheel (``pip download vllm==X --no-deps``), read:

    * 0.10.2, 0.11.2, 0.12.0: ``config/scheduler.py`` ``async_scheduling: bool = False`` -> off without the flag
      (0.11.2 / 0.12.0 ``VllmConfig.__post_init__`` has the None branch, "we won't reach here until async scheduling
      is enabled by default");
    * 0.15.1, 0.16.0: ``async_scheduling: bool = Field(default=None)``; 0.17.0, 0.18.0: ``bool | None =
      Field(default=None)``; 0.19.0: ``bool | None = None``; ``__post_init__``: None -> True unless speculative
      decoding of another kind, ``disable_padded_drafter_batch`` or a ray executor -> on;
    * ``--kv-cache-dtype auto`` reads the checkpoint from 0.15.1 (``resolve_kv_cache_dtype_string`` in
      ``EngineArgs.create_engine_config``); 0.10.2 / 0.11.2 have no such call (auto: the model dtype); 0.12.0's
      ``engine/arg_utils.py`` was not read."""
    got = {v: (d.async_scheduling, d.kv_auto_reads_checkpoint) for v, d in VLLM_DEFAULTS.items()}
    assert got == {"0.10.2": (False, False), "0.11.2": (False, False), "0.12.0": (False, None),
                   "0.15.1": (True, True), "0.16.0": (True, True), "0.17.0": (True, True), "0.18.0": (True, True),
                   "0.19.0": (True, True)}


def test_a_script_without_the_flag_gets_its_version_s_async_default():
    """The H100 MiniMax-M2.5 rows name ``image=vllm/vllm-openai:v0.18.0`` and ``minimaxm2.5_fp8_h100.sh`` passes no
    ``--async-scheduling``: 0.18.0's default, on (the recipe had it off). The same recipe at 0.11.2 would be off; at
    a version not read the row is refused by ``simulate``, not guessed. A script that passes the flag keeps it."""
    h100 = dict(model_path=MINIMAX, precision="fp8", system="h100_sxm")
    assert recipe_for(_row(**h100), "inferencex").async_scheduling is True
    assert recipe_for(_row(**h100, backend_version="0.11.2"), "inferencex").async_scheduling is False
    assert recipe_for(_row(**h100, backend_version="0.13.0"), "inferencex").async_scheduling is None
    assert recipe_for(_row(system="h100_sxm", backend_version="0.11.2"), "inferencex").async_scheduling is True
    # aic's rows: vLLM 0.12.0, off
    assert recipe_for(_row(model_path="Qwen/Qwen3-32B", precision="", system="h100_sxm", backend_version="0.12.0"),
                      "aic").async_scheduling is False


def _model(path: str, precision: str):
    from simkv.hfconfig import resolve_model

    return resolve_model(str(SHIPPED / "configs" / silicon.resolve_checkpoint(path, precision,
                                                                             SHIPPED / "configs").config))


def test_kv_cache_dtype_auto_is_what_the_version_makes_of_the_checkpoint():
    """nvidia/Kimi-K2.5-NVFP4's ``quantization_config``: ``quant_method`` modelopt, ``kv_cache_scheme`` {dynamic
    false, 8 bits, float} -> ``get_kv_cache_quant_algo_string`` "fp8" -> fp8_e4m3 (1 B): on vLLM 0.17.0 and 0.19.0
    (the B200 / B300 Kimi fp4 scripts pass no --kv-cache-dtype) the cache is fp8, not bf16. Kimi-K2.5's own int4
    checkpoint (compressed-tensors, ``kv_cache_scheme`` null) asks for none: bf16. A recipe that passes fp8 keeps it;
    on 0.10.2 auto is the model dtype; on 0.12.0 (not read) an fp8-asking checkpoint is refused."""
    nvfp4, int4 = _model(KIMI, "fp4"), _model(KIMI, "int4")
    b200 = recipe_for(_row(model_path=KIMI, system="b200_sxm", backend_version="0.17.0"), "inferencex")
    b300 = recipe_for(_row(model_path=KIMI, system="b300_sxm", backend_version="0.19.0"), "inferencex")
    assert (kv_cache_precision(b200, nvfp4), kv_cache_precision(b300, nvfp4)) == ("fp8", "fp8")
    h200 = recipe_for(_row(model_path=KIMI, precision="int4", backend_version="0.16.0"), "inferencex")
    assert kv_cache_precision(h200, int4) == "bf16"
    minimax_fp4 = RECIPES[(MINIMAX, "fp4", "b200_sxm", "0.19.0")]
    assert kv_cache_precision(minimax_fp4, _model(MINIMAX, "fp4")) == "fp8"
    assert kv_cache_precision(replace(b200, vllm_version="0.10.2"), nvfp4) == "bf16"
    with pytest.raises(ConfigError, match="asks vLLM for a fp8 KV cache; what vLLM 0.12.0 makes"):
        kv_cache_precision(replace(b200, vllm_version="0.12.0"), nvfp4)


def test_simulate_runs_each_recipe_s_block_size_kv_dtype_and_async(monkeypatch):
    """What ``simulate`` hands the serving engine (its ``serve`` intercepted): blocks of 32 for the MiniMax fp8 B200
    rows (``--block-size 32``), 16 elsewhere (vLLM's CUDA default); an fp8 KV cache for Kimi fp4 on B200 (auto, the
    checkpoint's); async scheduling on for the H100 MiniMax rows (0.18.0's default)."""
    import simkv.serving

    seen = []

    def spy(spec):
        seen.append(spec)
        raise ConfigError("intercepted")

    monkeypatch.setattr(simkv.serving, "serve", spy)
    cases = [dict(model_path=MINIMAX, precision="fp8", system="b200_sxm", backend_version="0.17.0", tp=2),
             dict(model_path=KIMI, precision="fp4", system="b200_sxm", backend_version="0.17.0", tp=8),
             dict(model_path=MINIMAX, precision="fp8", system="h100_sxm", backend_version="0.18.0", tp=4)]
    for case in cases:
        assert silicon.simulate(_row(**case), SHIPPED / "configs").reason == "intercepted"
    assert [(s.paged.block_size, s.precision.name, s.async_scheduling) for s in seen] == [
        (32, "bf16", True), (16, "fp8", True), (16, "bf16", True)]


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


def test_the_changed_recipes_end_to_end(tmp_path):
    """``validate --silicon --match``, one row per change: the H100 MiniMax fp8 row of v0.18.0 (async on by default)
    against the same row at v0.11.2 (off: another prediction), a MiniMax fp8 B200 row of v0.17.0 (blocks of 32) and
    a Kimi-K2.5 fp4 B200 row of v0.17.0 (KV auto -> fp8); each modelled exactly as ``simulate`` models it."""
    def row(id_, model, precision, system, version, tp):
        return {c: "" for c in silicon.COLUMNS} | {
            "id": id_, "backend": "vllm", "backend_version": version, "model_path": model, "system": system,
            "precision": precision, "mode": "agg", "isl": "256", "osl": "8", "batch_size": "2", "tp_size": str(tp),
            "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "1", "moe_ep_size": "1",
            "silicon_ttft_ms": "50", "silicon_tpot_ms": "5",
            "silicon_data_source": "source_file=2026-04-06.csv; model=x; silicon_concurrency=2; wip=False"}

    rows = [row("chg_async", MINIMAX, "fp8", "h100_sxm", "0.18.0", 4),
            row("chg_async_v0112", MINIMAX, "fp8", "h100_sxm", "0.11.2", 4),
            row("chg_block", MINIMAX, "fp8", "b200_sxm", "0.17.0", 2),
            row("chg_kv", KIMI, "fp4", "b200_sxm", "0.17.0", 8)]
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=silicon.COLUMNS)
        w.writeheader()
        w.writerows(rows)
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--silicon", str(path), "--configs",
                          str(SHIPPED / "configs"), "--match", "chg_", "--json"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    got = {r["id"]: r for r in json.loads(out.stdout)["rows"]}
    assert all(r["reason"] is None for r in got.values()), got
    for r in silicon.read_rows(path):
        o = silicon.simulate(r, SHIPPED / "configs")
        assert (got[r.id]["predicted_ttft_ms"], got[r.id]["predicted_tpot_ms"]) == (o.predicted_ttft_ms,
                                                                                    o.predicted_tpot_ms)
    assert got["chg_async"]["predicted_ttft_ms"] != got["chg_async_v0112"]["predicted_ttft_ms"]

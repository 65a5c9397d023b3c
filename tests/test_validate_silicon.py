"""``simkv validate --silicon`` (simkv/validate/silicon.py): reading the measured rows, how each row's benchmark is
reproduced (its protocol, its request lengths, its server's recipe and its checkpoint's weights), the refusals, and
the command end to end on a small model."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from simkv.errors import ConfigError
from simkv.hfconfig import resolve_model
from simkv.models import tp_shard
from simkv.validate import silicon
from simkv.validate.silicon import lengths, protocol, read_rows, refusal, resolve_checkpoint
from simkv.validate.silicon_recipes import ANY, RECIPES, Row

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "experiments" / "data" / "silicon"


def _row(**kw) -> Row:
    base = dict(id="r", model_path="Qwen/Qwen3-32B", precision="", system="h100_sxm", mode="agg", isl=1024, osl=128,
                concurrency=8, tp=2, pp=1, attention_dp=1, moe_tp=1, moe_ep=1, ttft_ms=100.0, tpot_ms=10.0,
                source="silicon_concurrency=8")
    return Row(**{**base, **kw})


def test_the_shipped_rows_read_and_each_has_a_known_benchmark():
    rows = read_rows(SHIPPED / "h100_sxm_vllm_agg.csv")
    assert len(rows) == 237
    protocols = {}
    for r in rows:
        protocols.setdefault((r.model_path, protocol(r)), 0)
        protocols[(r.model_path, protocol(r))] += 1
    # docs/research/latency-facts.md §1: aic's own gap analysis for Qwen3-32B, InferenceX's database for the rest
    assert protocols == {("Qwen/Qwen3-32B", "aic"): 93, ("meta-llama/Llama-3.1-70B", "inferencex"): 45,
                         ("openai/gpt-oss-120b", "inferencex"): 69, ("MiniMaxAI/MiniMax-M2.5", "inferencex"): 30}
    assert not [r for r in rows if refusal(r)]
    # the 15 rows labelled attention-DP 4 hold one rank's concurrency in batch_size: the clients are 4 times it,
    # as their silicon_concurrency says (docs/research/vllm-dp.md section 1)
    dp = [r for r in rows if r.attention_dp > 1]
    assert len(dp) == 15 and all(f"silicon_concurrency={r.concurrency};" in r.source for r in dp)


def test_the_held_out_rows_read_and_each_has_its_benchmark():
    """The H200, B200 and B300 rows (aiconfigurator-core 0.12.0, held out: nothing is fitted to them) by model and
    protocol: InferenceX's dumps and its database records (``db-dump/...; config_id; workflow_run_id``), aic's
    gap analysis, and the Kimi-K2.5 gap-analysis rows whose client no source names."""
    counts = {}
    for system in ("h200", "b200", "b300"):
        for r in read_rows(SHIPPED / f"{system}_sxm_vllm_agg.csv"):
            key = (system, r.model_path, protocol(r))
            counts[key] = counts.get(key, 0) + 1
    assert counts == {
        ("h200", "MiniMaxAI/MiniMax-M2.5", "inferencex"): 84, ("h200", "Qwen/Qwen3-235B-A22B-FP8", "aic"): 51,
        ("h200", "meta-llama/Llama-3.1-70B", "inferencex"): 60, ("h200", "moonshotai/Kimi-K2.5", "inferencex"): 30,
        ("h200", "moonshotai/Kimi-K2.5", "unknown"): 15, ("h200", "nvidia/Llama-3.1-8B-Instruct-FP8", "aic"): 21,
        ("h200", "openai/gpt-oss-120b", "inferencex"): 75,
        ("b200", "MiniMaxAI/MiniMax-M2.5", "inferencex"): 299, ("b200", "meta-llama/Llama-3.1-70B", "inferencex"): 120,
        ("b200", "moonshotai/Kimi-K2.5", "inferencex"): 88, ("b200", "moonshotai/Kimi-K2.5", "unknown"): 32,
        ("b200", "openai/gpt-oss-120b", "inferencex"): 84,
        ("b300", "MiniMaxAI/MiniMax-M2.5", "inferencex"): 110, ("b300", "moonshotai/Kimi-K2.5", "inferencex"): 22}


@pytest.mark.parametrize("source, expected", [
    # InferenceX's dumps, whole and with the file name trimmed (the H100 file's form)
    ("source_file=2026-04-06.csv; model=Kimi-K2.5; silicon_concurrency=16; measured=2026-03-27T00:00:00.000Z; "
     "wip=False; image=vllm/vllm-openai:v0.16.0", "inferencex"),
    ("model=GPT-OSS-120B; silicon_concurrency=4; measured=2026-03-27T08:01:51Z; wip=False", "inferencex"),
    # InferenceX's database records: (workflow_run_id, config_id, ...) is its throughput point's key
    ("db-dump/2026-04-27; config_id=606; silicon_concurrency=8; measured=2026-03-01T00:00:00.000Z; "
     "workflow_run_id=305; vllm/vllm-openai:v0.16.0", "inferencex"),
    ("db-dump/2026-04-27; silicon_concurrency=8", "unknown"),  # no database key: not a record of it
    # aic's gap analysis: the file, its gtl job, or (trimmed) nothing but the concurrency
    ("source_file=/Users/x/aic-auto-gap-analysis/data/h200_sxm/vllm/0.12.0/Qwen_Qwen3-235B-A22B-FP8.csv; "
     "silicon_concurrency=16", "aic"),
    ("gtl_job_id=23364591; silicon_concurrency=24", "aic"),
    ("silicon_concurrency=8", "aic"),
    # the Kimi-K2.5 gap analysis: no source says which client took it
    ("source_file=kimi-k2.5-gap-analysis.csv; silicon_concurrency=4; aic_database_mode=SILICON", "unknown"),
])
def test_the_protocol_of_each_source_form(source, expected):
    assert protocol(_row(source=source)) == expected


#: Every (model, precision) of the shipped rows → (config, checkpoint, stored format), by the rule of
#: silicon.resolve_checkpoint: the model's own config where its stored format is the row's precision, else the
#: checkpoint the benchmark served (silicon_recipes.SERVED, each from InferenceX's configuration).
RESOLVED = {
    # own checkpoints: bf16; fp8 with weight_block_size [128, 128] (quantization_config quant_method fp8);
    # gpt-oss's mxfp4 for the rows' fp4; Kimi-K2.5's compressed-tensors int4 (num_bits 4, type int, group 32)
    ("Qwen/Qwen3-32B", ""): ("Qwen--Qwen3-32B_config.json", "Qwen/Qwen3-32B", "bf16"),
    ("MiniMaxAI/MiniMax-M2.5", "fp8"): ("MiniMaxAI--MiniMax-M2.5_config.json", "MiniMaxAI/MiniMax-M2.5", "fp8-block"),
    ("Qwen/Qwen3-235B-A22B-FP8", "fp8"): ("Qwen--Qwen3-235B-A22B-FP8_config.json", "Qwen/Qwen3-235B-A22B-FP8",
                                          "fp8-block"),
    ("openai/gpt-oss-120b", "fp4"): ("openai--gpt-oss-120b_config.json", "openai/gpt-oss-120b", "mxfp4"),
    ("moonshotai/Kimi-K2.5", "int4"): ("moonshotai--Kimi-K2.5_config.json", "moonshotai/Kimi-K2.5", "int4-g32-sym"),
    # served ones: Qwen's own FP8 release; NVIDIA's ModelOpt NVFP4 (hf_quant_config.json quant_algo NVFP4 for
    # MiniMax, quantization_config quant_method modelopt for Kimi); Llama-3.3-70B-Instruct-FP8 read from its
    # same-shape, same-format stand-in
    ("Qwen/Qwen3-32B", "fp8"): ("Qwen--Qwen3-32B-FP8_config.json", "Qwen/Qwen3-32B-FP8", "fp8-block"),
    ("MiniMaxAI/MiniMax-M2.5", "fp4"): ("nvidia--MiniMax-M2.5-NVFP4_config.json", "nvidia/MiniMax-M2.5-NVFP4", "nvfp4"),
    ("moonshotai/Kimi-K2.5", "fp4"): ("nvidia--Kimi-K2.5-NVFP4_config.json", "nvidia/Kimi-K2.5-NVFP4", "nvfp4"),
    ("meta-llama/Llama-3.1-70B", "fp8"): ("nvidia--Llama-3.1-70B-Instruct-FP8_config.json",
                                          "nvidia/Llama-3.3-70B-Instruct-FP8", "fp8"),
}


def test_each_shipped_pair_resolves_to_its_checkpoint():
    configs = SHIPPED / "configs"
    pairs = {(r.model_path, r.precision) for s in ("h100", "h200", "b200", "b300")
             for r in read_rows(SHIPPED / f"{s}_sxm_vllm_agg.csv")}
    missing = {("meta-llama/Llama-3.1-70B", "fp4"): "nvidia--Llama-3.3-70B-Instruct-FP4_config.json (the served "
               "nvidia/Llama-3.3-70B-Instruct-FP4) is not in",
               ("nvidia/Llama-3.1-8B-Instruct-FP8", "fp8"): "nvidia--Llama-3.1-8B-Instruct-FP8_config.json is not in"}
    assert pairs == set(RESOLVED) | set(missing)
    for pair, (config, name, fmt) in RESOLVED.items():
        ck = resolve_checkpoint(*pair, configs)
        assert (ck.config, ck.name, ck.format) == (config, name, fmt), pair
    for (model, precision), why in missing.items():
        reason = resolve_checkpoint(model, precision, configs)
        assert reason.startswith(f"no checkpoint config for {model} at precision {precision!r}: ") and why in reason


def test_unknown_pairs_say_why():
    configs = SHIPPED / "configs"
    # no config of the model and no served checkpoint known; the model's own is bf16 and no int8 one is known;
    # a precision simkv has no format for
    assert resolve_checkpoint("x/y", "fp8", configs) == (
        f"no checkpoint config for x/y at precision 'fp8': x--y_config.json is not in {configs}")
    assert resolve_checkpoint("Qwen/Qwen3-32B", "int4", configs) == (
        "no checkpoint config for Qwen/Qwen3-32B at precision 'int4': its own checkpoint is stored in bf16 and which "
        "checkpoint the benchmark served is not known")
    for precision in ("int8", "fp6", "bf16"):  # the column says bf16 by leaving itself empty
        assert resolve_checkpoint("Qwen/Qwen3-32B", precision, configs) == (
            f"no checkpoint config for Qwen/Qwen3-32B at precision {precision!r}: simkv knows no stored format for "
            "that precision column (empty (bf16), fp8, fp4, int4)")
    # a model whose own checkpoint is in another format is refused, not run in that format
    other = resolve_checkpoint("openai/gpt-oss-120b", "fp8", configs)
    assert "its own checkpoint is stored in mxfp4" in other


def test_odd_configs_are_the_rows_reason(tmp_path):
    """A config that cannot be read is that row's reason (one line), never the whole command's end: broken or huge
    JSON under the expected name, a folder under it, a model_path too long for a file name."""
    (tmp_path / "a--broken_config.json").write_text('{"num_hidden_layers": ')
    (tmp_path / "a--list_config.json").write_text("[1, 2]")
    (tmp_path / "a--huge_config.json").write_text('{"pad": "' + "x" * (16 << 20) + '"}')
    (tmp_path / "a--dir_config.json").mkdir()
    for model, why in (("a/broken", "not valid JSON"), ("a/list", "must be a JSON object"),
                       ("a/huge", "over the limit of 16,777,216"), ("a/dir", "a--dir_config.json is not in"),
                       ("a/" + "x" * 5000, "cannot read its config: File name too long")):
        reason = resolve_checkpoint(model, "", tmp_path)
        assert isinstance(reason, str) and why in reason and "\n" not in reason, (model, reason)
    assert refusal(_row(model_path="")) == "no model_path"


def test_the_held_out_checkpoints_weights():
    """What simkv.weights reads from each new config, whole model (``simkv cost --model CONFIG`` prints the same):
    Kimi-K2.5's routed experts in int4 (0.5 B + a bf16 scale per 32: 0.5625 B), the rest bf16; the NVFP4 ones
    every Linear but the attention (and MiniMax's router, Kimi's vision tower) at 0.5 B + an e4m3 scale per 16
    (0.5625 B)."""
    from simkv.models import weights_bytes

    configs = SHIPPED / "configs"
    gib = {c: round(weights_bytes(resolve_model(str(configs / c)), "checkpoint") / 2**30, 1) for c in (
        "moonshotai--Kimi-K2.5_config.json", "nvidia--Kimi-K2.5-NVFP4_config.json",
        "nvidia--MiniMax-M2.5-NVFP4_config.json", "Qwen--Qwen3-235B-A22B-FP8_config.json")}
    assert gib == {"moonshotai--Kimi-K2.5_config.json": 553.4, "nvidia--Kimi-K2.5-NVFP4_config.json": 549.3,
                   "nvidia--MiniMax-M2.5-NVFP4_config.json": 125.2, "Qwen--Qwen3-235B-A22B-FP8_config.json": 220.2}


def test_inferencex_lengths_are_the_clients_draws():
    # benchmark_serving.py: np.random.seed(0); randint(int(L * 0.8), L + 1) for the 10 x C inputs, then the outputs
    r = _row(isl=1024, osl=128, concurrency=3, source="model=X; silicon_concurrency=3; wip=False")
    inputs, outputs = lengths(r, "inferencex")
    rng = np.random.RandomState(0)
    assert list(inputs) == list(rng.randint(819, 1025, size=30)) and list(outputs) == list(rng.randint(102, 129, size=30))
    assert inputs.min() >= 819 and inputs.max() <= 1024 and outputs.min() >= 102 and outputs.max() <= 128
    # aic's generated benchmark (aiperf): fixed lengths, 2 x C warm-up requests, then 20 x C measured ones
    inputs, outputs = lengths(r, "aic")
    assert len(inputs) == 66 and set(inputs) == {1024} and set(outputs) == {128}
    assert silicon.warmup_requests(r, "aic") == 6 and silicon.warmup_requests(r, "inferencex") == 0


def test_aics_rows_run_aiperfs_protocol(monkeypatch):
    # the warm-up (2 x C) drains before the 20 x C measured requests (InferenceX's rows: no warm-up simulated)
    seen = {}

    def fake_serve(spec):
        seen["spec"] = spec
        raise ConfigError("stop here")

    monkeypatch.setattr("simkv.serving.serve", fake_serve)
    row = _row(concurrency=3, source="silicon_concurrency=3")
    out = silicon.simulate(row, SHIPPED / "configs")
    assert out.reason == "stop here"
    spec = seen["spec"]
    assert spec.warmup == 6 and spec.concurrency == 3 and len(spec.requests) == 66
    assert not spec.paged.enable_prefix_caching and all(r.prefix_id is None for r in spec.requests)
    # the statistics are over the measured requests only: warm-ups (ids 0..5) at 900 ms TTFT do not count
    ids = np.arange(66)
    table = {"id": ids, "status": np.array(["FINISHED"] * 66), "ttft_s": np.where(ids < 6, 0.9, 0.1),
             "tpot_s": np.where(ids < 6, 0.05, 0.01)}
    monkeypatch.setattr("simkv.serving.serve", lambda spec: SimpleNamespace(request_table=table, stopped=None))
    out = silicon.simulate(row, SHIPPED / "configs")
    assert out.predicted_ttft_ms == pytest.approx(100.0) and out.predicted_tpot_ms == pytest.approx(10.0)
    monkeypatch.setattr("simkv.serving.serve", fake_serve)
    ix = _row(model_path="openai/gpt-oss-120b", precision="fp4", source="model=X; silicon_concurrency=8; wip=False")
    silicon.simulate(ix, SHIPPED / "configs")
    assert seen["spec"].warmup == 0


def test_the_checkpoints_weights_and_kernels_by_hand():
    from simkv.cost import gemm_mix, get_device
    from simkv.models import weights_bytes

    configs = SHIPPED / "configs"
    h100 = get_device("h100-sxm")
    # gpt-oss-120b at TP 2: its routed experts in mxfp4 (0.5 B + 1 B per 32 = 0.53125 B), everything else bf16; on
    # an H100 the mxfp4 experts run weight-only kernels that multiply in bf16: no GEMM at another peak
    model = resolve_model(str(configs / resolve_checkpoint("openai/gpt-oss-120b", "fp4", configs).config))
    share = tp_shard(model, 2)
    assert weights_bytes(share, "checkpoint") == int(share.routed_params * 0.53125
                                                     + (share.weight_params - share.routed_params) * 2)
    assert gemm_mix(share, h100, "checkpoint") is None
    # Llama-3.1-70B FP8 at TP 4: every Linear at 1 B, the embedding table and the LM head at 2 B; on an H100 every
    # layer GEMM runs W8A8 on fp8 tensor cores (the LM head stays bf16, outside the mix)
    model = resolve_model(str(configs / resolve_checkpoint("meta-llama/Llama-3.1-70B", "fp8", configs).config))
    share = tp_shard(model, 4)
    vocab = share.vocab * share.hidden
    assert weights_bytes(share, "checkpoint") == int((share.weight_params - 2 * vocab) * 1.0 + 2 * vocab * 2)
    assert gemm_mix(share, h100, "checkpoint") == (("f8", share.active_params - vocab),)


def test_the_llama_rows_kv_cache_is_vllm_0_10_2_fp8_at_one_byte():
    """The Llama rows ran vLLM 0.10.2 with --kv-cache-dtype fp8 (InferenceX @ 9596d23d7; docs/research/latency-facts.md
    section 11). vLLM 0.10.2 keeps it fp8 on an H100 (FlashAttention 3: fa_utils.flash_attn_supports_fp8) and stores it
    at 1 B: GPUModelRunner.__init__ takes STR_DTYPE_TO_TORCH_DTYPE["fp8"] = torch.uint8, and
    AttentionSpec.page_size_bytes = 2 x block 16 x 4 KV heads (8 / TP 2) x 128 x 1 B = 16,384 B per layer per block,
    i.e. 81,920 B per token over 80 layers. The pool is Worker.determine_available_memory's: 0.9 x the preset's
    85,017,493,504 B = 76,515,744,153 B, less the weights (every Linear at 1 B, the embedding table and the LM head
    at 2 B, each shard of 128,256 x 8,192 / 2) and the profile run's peak, 8,192 tokens x (2 x 8,192 + (32 + 2 x 4)
    x 128 + 2 x 14,336) x 2 B = 822,083,584 B; get_num_blocks divides by 16 x 81,920 B: 30,034 blocks, 480,544
    tokens (a 2-byte cache would hold 240,272)."""
    from simkv.cost import get_device
    from simkv.models import weights_bytes
    from simkv.precision import get_precision
    from simkv.serving.sched.vllm import profile_peak_bytes

    recipe = RECIPES[("meta-llama/Llama-3.1-70B", ANY, "h100_sxm", ANY)]
    assert recipe.kv_cache_dtype == "fp8" and "v0.10.2" in recipe.source
    configs = SHIPPED / "configs"
    model = resolve_model(str(configs / resolve_checkpoint("meta-llama/Llama-3.1-70B", "fp8", configs).config))
    share = tp_shard(model, 2)
    assert get_precision(recipe.kv_cache_dtype).kv_bytes_per_token(share) == 2 * 4 * 128 * 1 * 80 == 81_920
    vocab = share.vocab * share.hidden
    weights = weights_bytes(share, "checkpoint")
    assert weights == (share.weight_params - 2 * vocab) * 1 + 2 * vocab * 2
    peak = profile_peak_bytes(share, recipe.max_num_batched_tokens, 64)
    assert peak == 8192 * (2 * 8192 + (32 + 2 * 4) * 128 + 2 * 14336) * 2 == 822_083_584
    pool = int(get_device("h100-sxm").memory_bytes * recipe.gpu_memory_utilization) - weights - peak
    assert (pool // (16 * 81_920), pool // (16 * 81_920) * 16) == (30_034, 480_544)


def test_refusals_are_one_line_each():
    assert "pipeline parallelism" in refusal(_row(pp=2))
    assert "disaggregated" in refusal(_row(mode="disagg"))
    assert "no device preset" in refusal(_row(system="gb300"))
    assert "not known" in refusal(_row(source="somewhere else; a=1"))
    assert "MoE over moe_tp x moe_ep = 4 devices but attention over tp = 2" in refusal(_row(tp=2, moe_tp=4))
    assert "more than the 200,000,000 tokens" in refusal(_row(concurrency=4096, isl=1_000_000, osl=1_000))
    assert refusal(_row()) is None


def _tiny_csv(tmp_path: Path, rows: list[dict]) -> Path:
    """A silicon CSV of ``rows`` and a configs folder whose Qwen3-32B is a 2-layer model of its shape."""
    configs = tmp_path / "configs"
    configs.mkdir()
    cfg = json.loads((SHIPPED / "configs" / "Qwen--Qwen3-32B_config.json").read_text())
    cfg["num_hidden_layers"] = 2
    (configs / "Qwen--Qwen3-32B_config.json").write_text(json.dumps(cfg))
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=silicon.COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: "" for c in silicon.COLUMNS} | r)
    return path


ROW = {"id": "q1", "backend": "vllm", "backend_version": "0.12.0", "model_path": "Qwen/Qwen3-32B", "system": "h100_sxm",
       "precision": "", "mode": "agg", "isl": "256", "osl": "16", "batch_size": "2", "tp_size": "2", "pp_size": "1",
       "attention_dp_size": "", "moe_tp_size": "1", "moe_ep_size": "1", "silicon_ttft_ms": "50",
       "silicon_tpot_ms": "5", "silicon_data_source": "silicon_concurrency=2"}


def test_the_command_end_to_end(tmp_path):
    path = _tiny_csv(tmp_path, [ROW, {**ROW, "id": "q2", "pp_size": "2"}])
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--silicon", str(path), "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    one, two = data["rows"]
    assert one["id"] == "q1" and one["predicted_ttft_ms"] > 0 and one["predicted_tpot_ms"] > 0 and one["reason"] is None
    assert one["ttft_error"] == pytest.approx(one["predicted_ttft_ms"] / 50 - 1)
    assert two["predicted_ttft_ms"] is None and "pipeline parallelism" in two["reason"]
    assert data["summary"]["overall"]["modelled"] == 1 and data["summary"]["overall"]["rows"] == 2
    # the same prediction in two processes, and as text
    again = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--silicon", str(path), "--workers", "2"],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 0 and f"{one['predicted_ttft_ms']:.1f}" in again.stdout and "not modelled" in again.stdout


@pytest.mark.parametrize("change, message", [
    ({"silicon_ttft_ms": "fast"}, "is not a number"),
    ({"batch_size": "0"}, "batch_size must be an integer in 1..4,096"),
    ({"isl": "1.5"}, "isl must be an integer"),
    ({"isl": "1e400"}, "isl must be an integer in 1..1,000,000, got '1e400'"),  # was OverflowError
    ({"model_path": "Qwen/Qwen3-32B\x00"}, "model_path 'Qwen/Qwen3-32B\\x00' has a control character"),
    ({"system": "h100_sxm\n"}, "system 'h100_sxm\\n' has a control character"),
])
def test_bad_rows_are_one_line_and_exit_2(tmp_path, change, message):
    path = _tiny_csv(tmp_path, [{**ROW, **change}])
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--silicon", str(path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_bad_files_are_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,model_path\nx,y\n")
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "empty.csv").write_text("")
    rows = _tiny_csv(tmp_path, [ROW])
    header, line = rows.read_text().splitlines()
    (tmp_path / "header.csv").write_text(header + "\n")
    (tmp_path / "short.csv").write_text(header + "\n" + ",".join(line.split(",")[:5]) + "\n")
    (tmp_path / "long.csv").write_text(header + "\n" + line + ",x,y\n")
    (tmp_path / "twice.csv").write_text(header + "\n" + line + "\n" + line + "\n")
    # 100,000 small rows: ~0.1 s each would run for hours; refused before any runs
    (tmp_path / "many.csv").write_text(header + "\n" + "".join(f"q{i}{line[2:]}\n" for i in range(100_000)))
    for args, message in (([str(tmp_path / "none.csv")], "cannot read"), ([str(bad)], "no column"),
                          ([str(SHIPPED / "h100_sxm_vllm_agg.csv"), "--match", "nothing-like-it"], "no row"),
                          ([str(tmp_path)], "cannot read"),  # a folder: was a bare OSError line
                          ([str(tmp_path / "binary.csv")], "not UTF-8 text"),  # was UnicodeDecodeError
                          ([str(tmp_path / "empty.csv")], "no column id"),
                          ([str(tmp_path / "header.csv")], "header.csv: no rows"),
                          ([str(tmp_path / "short.csv")], "short.csv:2: 5 fields where the header has 20"),  # was AttributeError
                          ([str(tmp_path / "long.csv")], "long.csv:2: 22 fields where the header has 20"),
                          ([str(tmp_path / "twice.csv")], "twice.csv:3: id 'q1' again (first on line 2)"),
                          ([str(tmp_path / "many.csv")], "100,000 rows to simulate moving 1,196,800,000 tokens, more than "
                                                         "the 1,000 rows"),
                          ([str(rows), "--configs", str(bad)], "no configs folder"),
                          ([str(rows), "--configs", str(tmp_path / "none")], "no configs folder")):
        out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--silicon", *args],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr
    shutil.rmtree(tmp_path)


def test_another_predictors_errors_beside_on_the_same_rows(tmp_path):
    path = _tiny_csv(tmp_path, [ROW, {**ROW, "id": "q2"}])
    beside = tmp_path / "aic.csv"
    # q1 predicted 10 % over the measured TTFT (50 ms) and 20 % under the TPOT (5 ms); q2 not predicted by it
    beside.write_text("id,aic_ttft_ms,aic_tpot_ms,aic_error\nq1,55.0,4.0,\nq2,,,ValueError: no data\n")
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--silicon", str(path), "--beside",
                          str(beside), "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    b = data["summary"]["overall"]["beside"]
    assert b["rows"] == 1 and b["ttft_median_abs_error"] == pytest.approx(0.10) and b["tpot_median_abs_error"] == pytest.approx(0.20)
    assert data["rows"][1]["beside_ttft_ms"] is None and data["rows"][1]["beside_error"] == "ValueError: no data"


def test_bad_predictions_beside_are_one_line_and_exit_2(tmp_path):
    path = _tiny_csv(tmp_path, [ROW])
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00")  # was UnicodeDecodeError
    (tmp_path / "inf.csv").write_text("id,aic_ttft_ms,aic_tpot_ms\nq1,inf,4.0\n")  # was taken, numpy warned
    (tmp_path / "minus.csv").write_text("id,aic_ttft_ms,aic_tpot_ms\nq1,55.0,-4\n")
    for name, message in (("binary", "binary.csv: not UTF-8 text"), ("inf", "row 'q1': aic_ttft_ms 'inf' is not a positive"),
                          ("minus", "row 'q1': aic_tpot_ms '-4' is not a positive")):
        out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--silicon", str(path), "--beside",
                              str(tmp_path / f"{name}.csv")], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_the_command_under_vllms_scheduler(tmp_path):
    # --vllm-scheduler: the rows run on vLLM's scheduler and vLLM's pool sizing (simkv run --scheduler vllm)
    path = _tiny_csv(tmp_path, [ROW])
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--silicon", str(path), "--vllm-scheduler",
                          "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["rows"][0]
    assert row["reason"] is None and row["predicted_ttft_ms"] > 0 and row["predicted_tpot_ms"] > 0


@pytest.mark.parametrize("system, match, rows", [
    # InferenceX's database records of MiniMax-M2.5 fp8 on H200 (config 606, 1k/1k at C = 4)
    ("h200", "1024x1024_c4_cfg606", 1),
    # aic's gap analysis of Qwen3-235B-A22B-FP8 (its own fp8 checkpoint) at TP 2 on H200
    ("h200", "1000x100_c16_tp2", 1),
    # InferenceX's database records of nvidia/MiniMax-M2.5-NVFP4 on B200 (configs 701, 702, 704, 705: TP 1, 4, 2, 8)
    ("b200", "1024x1024_c4_cfg70", 4),
])
def test_held_out_rows_are_modelled_end_to_end(system, match, rows):
    """Rows the H100 work could not model (an unknown checkpoint or benchmark) are simulated now; their errors are
    not checked here (held out: docs/research/latency-facts.md §1)."""
    out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--silicon",
                          str(SHIPPED / f"{system}_sxm_vllm_agg.csv"), "--match", match, "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)["rows"]
    assert len(data) == rows
    for r in data:
        assert r["reason"] is None and r["predicted_ttft_ms"] > 0 and r["predicted_tpot_ms"] > 0, r


def test_dp_labelled_rows_run_what_their_script_launched():
    """InferenceX's ``dp-attn`` label (docs/research/vllm-dp.md section 2): minimaxm2.5_fp8_b200.sh never reads it and
    launches one engine at ``--tensor-parallel-size=$TP --enable-expert-parallel``, so the row labelled TP 2 /
    attention-DP 2 / EP 4 at batch_size 2 ran one TP 2 engine with EP 2 for 4 clients; minimaxm2.5_fp4_b200.sh (from
    a9c199207) launches ``--data-parallel-size=$TP`` for it, which is not modelled: that row says so."""
    rows = {}
    for match in ("fp8_agg_1024x1024_c4_cfg690", "fp4_agg_1024x1024_c32_cfg703"):
        out = subprocess.run([sys.executable, "-m", "simkv.cli", "validate", "--silicon",
                              str(SHIPPED / "b200_sxm_vllm_agg.csv"), "--match", match, "--json"],
                             capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert out.returncode == 0, out.stderr
        rows |= {r["id"]: r for r in json.loads(out.stdout)["rows"]}
    one = rows["minimaxm2_5_b200_vllm_fp8_agg_1024x1024_c4_cfg690"]
    assert one["reason"] is None and one["concurrency"] == 4 and one["predicted_ttft_ms"] > 0
    assert any("one engine at TP 2 with expert parallelism over 2, 4 clients" in n for n in one["notes"])
    assert any("expert parallelism over 2: each device holds 128 whole experts" in n for n in one["notes"])
    dp = rows["minimaxm2_5_b200_vllm_fp4_agg_1024x1024_c32_cfg703"]
    assert dp["predicted_ttft_ms"] is None and dp["concurrency"] == 32
    assert dp["reason"] == ("vLLM data parallelism (4 engine cores of TP 1, experts over 4 devices: the script launches "
                            "--data-parallel-size for dp-attn) is not modelled")

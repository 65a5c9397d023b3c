"""AIConfigurator's own predictions of the silicon rows, for ``simkv validate --silicon --beside`` (run in a side venv
that holds the ``aiconfigurator`` and ``aiconfigurator-core`` 0.12.0 wheels, not in simkv's):

    python -m venv /work/venvs/aic/venv && /work/venvs/aic/venv/bin/pip install aiconfigurator==0.12.0
    /work/venvs/aic/venv/bin/python experiments/silicon_aic.py experiments/data/silicon/h100_sxm_vllm_agg.csv \\
        experiments/data/silicon/aic_predictions.csv

Each row goes to ``aiconfigurator.cli.api.cli_estimate`` as the row describes it (model, system, vLLM — at aic's
"current" vLLM data, 0.24.0: aic 0.12.0 refuses the rows' own version strings —, ISL/OSL, the concurrency as ``batch_size``, TP/PP/attention-DP/MoE-TP/MoE-EP, the GEMM and MoE quantization
modes) with aic's defaults for everything else (its SILICON database, its own KV and FMHA modes). The output has one
line per row: its id, aic's TTFT and TPOT in ms, or the error aic raised (empty predictions). Imports nothing of simkv.
"""

from __future__ import annotations

import contextlib
import csv
import io
import sys


def _int(text: str, default: int | None = None) -> int | None:
    text = (text or "").strip()
    return int(float(text)) if text else default


#: The model paths aic bundles configs under, where a row names its model otherwise (aic's own InferenceX adapter,
#: aiconfigurator/sdk/config_adapter/inferencex.py MODEL_PATHS: ("llama70b", "fp8") -> meta-llama/Meta-Llama-3.1-70B).
MODEL_PATHS = {"meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B"}
#: Checkpoints whose quantization aic reads from the model itself (the adapter's NATIVE_QUANT_MODELS): no GEMM or
#: MoE quantization mode is passed for them.
NATIVE = {"openai/gpt-oss-120b"}
#: Dense models: no MoE quantization mode (the adapter sets ``moe = None`` when not ``is_moe``).
DENSE = {"meta-llama/Llama-3.1-70B", "Qwen/Qwen3-32B"}
#: MoE checkpoints stored in 128 x 128 fp8 blocks: aic's MoE mode for them is fp8_block (its h100_sxm vLLM data has
#: no plain fp8 MoE entries; MiniMax-M2.5's quantization_config: fp8, weight_block_size [128, 128]).
BLOCK_FP8_MOE = {"MiniMaxAI/MiniMax-M2.5"}


def predict(row: dict) -> tuple[float | None, float | None, str]:
    from aiconfigurator.cli.api import cli_estimate

    native = row["model_path"] in NATIVE
    moe = None if native else (row["moe_quant_mode"] or None)
    if moe == "fp8" and row["model_path"] in BLOCK_FP8_MOE:
        moe = "fp8_block"
    # backend_version left to aic: 0.12.0 answers the rows' own versions with its "current" vLLM data (0.24.0)
    kwargs = dict(mode="agg", backend_name=row["backend"] or "vllm", backend_version=None,
                  isl=_int(row["isl"]), osl=_int(row["osl"]), batch_size=_int(row["batch_size"]),
                  tp_size=_int(row["tp_size"], 1), pp_size=_int(row["pp_size"], 1),
                  attention_dp_size=_int(row["attention_dp_size"], 1), moe_tp_size=_int(row["moe_tp_size"]),
                  moe_ep_size=_int(row["moe_ep_size"]),
                  gemm_quant_mode=None if native else (row["gemm_quant_mode"] or None),
                  moe_quant_mode=None if row["model_path"] in DENSE else moe)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            result = cli_estimate(MODEL_PATHS.get(row["model_path"], row["model_path"]), row["system"], **kwargs)
        return float(result.ttft), float(result.tpot), ""
    except Exception as exc:  # noqa: BLE001 - one row's failure is its outcome, reported per row
        return None, None, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def main(src: str, dst: str) -> int:
    with open(src, newline="") as fh:
        rows = list(csv.DictReader(fh))
    with open(dst, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["id", "aic_ttft_ms", "aic_tpot_ms", "aic_error"])
        for n, row in enumerate(rows, 1):
            ttft, tpot, err = predict(row)
            w.writerow([row["id"], "" if ttft is None else repr(ttft), "" if tpot is None else repr(tpot), err])
            print(f"{n}/{len(rows)} {row['id'][:60]} {ttft} {tpot} {err[:80]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

"""OpenVINO GenAI served live on this CPU vs simkv's serving simulation on the host preset (``simkv validate --serving``).

Stage 1 times fixed batches (decode at batch 1..32, prefill chunks 32..512) of the real
``ContinuousBatchingPipeline`` on a random-weight model of a real head shape (hidden 1,024, 6 attention-only
layers, 16/8 heads x 128), pinned to one core, against the host preset's step cost; stage 2 serves 80 requests
live at 30 %, 60 % and (for information) 120 % offered load, 3 repeats each in fresh processes, loads
interleaved, against the simulation of the same requests (p50/p90 TTFT, TPOT, e2e, paired ratios, the real
runs' spread). Needs ``simkv calibrate`` first (the ``host`` preset) and a quiet machine::

    taskset -c 0 python -m simkv.cli calibrate --threads 1
    python -m experiments --only genai_serving

Writes ``serving.json`` (the command's ``--json``) and ``summary.txt`` (its table). ``quick``: stage 1 at two
batches and stage 2 with 20 requests, one repeat.
"""

from __future__ import annotations

import json
from pathlib import Path


def run(out: Path, quick: bool) -> None:
    from simkv.cost import host_preset_path
    from simkv.lab.output import MissingPackage
    from simkv.validate.genai.serving import LiveConfig, summary_lines, validate_serving

    try:
        import openvino_genai  # noqa: F401
    except ImportError:
        raise MissingPackage("openvino-genai", "pip install 'simkv[openvino]'") from None
    if not host_preset_path().is_file():  # a measurement of this host, taken on a quiet machine: never made here
        raise MissingPackage("the host preset", "run `taskset -c 0 simkv calibrate --threads 1` on a quiet machine first")
    cfg = LiveConfig(decode_batches=(1, 16), prefill_chunks=(64, 256), requests=20, repeats=1) if quick else LiveConfig()
    data = validate_serving(cfg, progress=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serving.json").write_text(json.dumps(data, indent=1) + "\n")
    text = "\n".join(summary_lines(data)) + "\n"
    (out / "summary.txt").write_text(text)
    print(text, end="")

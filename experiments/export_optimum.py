"""Export small random-weight decoders with optimum-intel, offline, for ``simkv validate --ir``.

Each model is built from a ``transformers`` config (random weights, no download), saved,
and exported by ``optimum.exporters.openvino.main_export`` as a *stateful* OpenVINO IR
(``text-generation-with-past``, fp32 weights): the form OpenVINO GenAI and
``OVModelForCausalLM`` run. ``experiments/validation_table.py --optimum DIR`` then
validates each one.

Needs torch (CPU), ``transformers`` and ``optimum-intel[openvino]`` (not simkv
dependencies, and not in CI: torch is heavy). optimum-intel 2.2 requires
``transformers < 5`` and ``huggingface-hub < 1.22``; where the main environment has
newer ones, run this script with a side environment's interpreter::

    python -m venv /tmp/exp && echo "$PWD/.venv/lib/python3.11/site-packages" \\
        > /tmp/exp/lib/python3.11/site-packages/zz_main.pth   # reuse torch, openvino
    /tmp/exp/bin/pip install "optimum-intel[openvino]>=1.22" "transformers<5" "huggingface-hub<1.22" \\
        -c constraints.txt                                     # pin torch and openvino to the installed ones
    /tmp/exp/bin/python experiments/export_optimum.py --out experiments/out/optimum

Writes ``DIR/<name>/openvino_model.xml`` for each model; an existing export is kept.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: name -> (transformers config class, its arguments). Shapes: small, but GQA and MHA,
#: three attention implementations' export paths, and one 16-layer model whose K/V
#: buffers outgrow glibc's mmap threshold early (memory figures comparable).
MODELS = {
    "llama-gqa": ("LlamaConfig", dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192)),
    "qwen2": ("Qwen2Config", dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)),
    "gpt2": ("GPT2Config", dict(vocab_size=1000, n_embd=256, n_layer=2, n_head=4, n_positions=8192)),
    "phi3": ("Phi3Config", dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192,
                                pad_token_id=0)),
    "llama-16l": ("LlamaConfig", dict(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=16,
                                      num_attention_heads=4, num_key_value_heads=4, head_dim=128,
                                      max_position_embeddings=8192)),
}


def export(name: str, out: Path) -> float:
    """Build ``name`` with random weights (seed 0) and export it to ``out/name``; seconds taken."""
    import tempfile

    import torch
    import transformers
    from optimum.exporters.openvino import main_export

    t0 = time.perf_counter()
    cls_name, kwargs = MODELS[name]
    config = getattr(transformers, cls_name)(**kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with tempfile.TemporaryDirectory(prefix=f"simkv_export_{name}_") as src:
        model.save_pretrained(src)
        main_export(src, output=str(out / name), task="text-generation-with-past", stateful=True,
                    weight_format="fp32", library_name="transformers")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "experiments" / "out" / "optimum"))
    ap.add_argument("--only", action="append", choices=sorted(MODELS), help="export only this model (repeatable)")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: configs, not checkpoints
    try:
        import optimum.exporters.openvino  # noqa: F401
    except ImportError as err:
        print(f"export_optimum: needs torch, transformers and optimum-intel[openvino] ({err}); see the docstring",
              file=sys.stderr)
        return 2
    out = Path(a.out)
    for name in a.only or MODELS:
        if (out / name / "openvino_model.xml").exists():
            print(f"{name}: kept {out / name}")
            continue
        print(f"{name}: exported in {export(name, out):.0f} s -> {out / name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How the devices of a tensor-parallel group talk: all-reduce times per interconnect, and the all-reduces one
step runs (docs/research/plan-facts.md §2–3; docs/DESIGN.md §6).

The interconnects' figures are data: one file per interconnect in ``simkv/data/interconnects/<name>.json`` (its description,
``fits`` — (α seconds, bus bandwidth bytes/s) per device count, ``"any"`` for every count — and their source), loaded
into :data:`INTERCONNECTS`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simkv.errors import ConfigError
from simkv.shipped import DATA
from simkv.models import ModelSpec

#: Bytes per activation element in an all-reduce: vLLM runs bf16/f16 activations (Vidur converts all-reduce
#: sizes to tokens with ``size / embedding_dim / 2``, vidur sklearn_execution_time_predictor.py; plan-facts §2.2).
ACTIVATION_BYTES = 2


@dataclass(frozen=True)
class Interconnect:
    """How long an all-reduce of S bytes over n devices takes: ``α(n) + 2(n − 1)/n · S / busbw(n)``
    (NCCL's bus-bandwidth definition, nccl-tests doc/PERFORMANCE.md: ``busbw = algbw · 2(n − 1)/n``; its tuner's
    ``time = latency + bytes / bw``, nccl src/graph/tuning.cc; docs/research/plan-facts.md §3.1).

    ``fits`` holds (α seconds, busbw bytes/s) per device count n; ``None`` as a key: any n."""

    name: str
    description: str
    fits: Mapping[int | None, tuple[float, float]]
    source: str

    def fit(self, n: int) -> tuple[float, float]:
        if n in self.fits:
            return self.fits[n]
        if None in self.fits:
            return self.fits[None]
        raise ConfigError(f"no all-reduce figures for {n} devices over {self.name} (measured: "
                          f"{', '.join(str(k) for k in self.fits)}); use --tp {' or '.join(str(k) for k in self.fits)}")

    def allreduce_s(self, nbytes: Any, n: int) -> Any:
        """Seconds of one all-reduce of ``nbytes`` bytes over ``n`` devices."""
        alpha, busbw = self.fit(n)
        return alpha + 2.0 * (n - 1) / n * nbytes / busbw


#: The interconnect presets' files: beside the model configs (``simkv/data/configs``), in ``simkv/data/interconnects``.
INTERCONNECT_DIR = DATA / "interconnects"


def _load_interconnect(path: Path) -> Interconnect:
    data = json.loads(path.read_text())
    fits = {None if n == "any" else int(n): (float(a), float(b)) for n, (a, b) in data["fits"].items()}
    return Interconnect(data["name"], data["description"], fits, data["source"])


#: The interconnect presets, in the order they are listed (each is ``INTERCONNECT_DIR/<name>.json``).
INTERCONNECT_NAMES = ("nvlink4", "nvlink3", "pcie", "nvlink5")

#: Interconnect presets by name (what ``Device.interconnect`` names).
INTERCONNECTS: dict[str, Interconnect] = {
    name: _load_interconnect(INTERCONNECT_DIR / f"{name}.json") for name in INTERCONNECT_NAMES}


def allreduces_per_step(model: ModelSpec) -> int:
    """All-reduces one tensor-parallel step runs (docs/research/plan-facts.md §2.1–2.2): in each decoder layer one
    after attention (``o_proj``, a linear-attention ``out_proj``: ``RowParallelLinear``) when the layer has
    attention projections, one after the MLP or MoE (``down_proj``), and one after the vocab-parallel input
    embedding (``VocabParallelEmbedding.forward``): ``2 · L + 1`` for a dense model (vllm/model_executor/models/
    llama.py; Vidur adds the same two per layer, vidur/entities/execution_time.py). The LM head's logits gather
    is left out."""
    projections = sum(layer.kind != "none" or layer.reuses is not None for layer in model.kv_layers)
    return projections + model.layers + 1


def allreduce_s(model: ModelSpec, device: Any, new_tokens: Any) -> Any:
    """Seconds of a step's all-reduces under tensor parallelism (0 when ``model.tp`` is 1): :func:`allreduces_per_step`
    all-reduces of ``new_tokens · hidden · 2 B`` each over ``model.tp`` devices (:class:`Interconnect`)."""
    n = model.tp
    if n == 1:
        return 0.0 * np.asarray(new_tokens, dtype=np.float64)
    link = INTERCONNECTS[device.interconnect]
    nbytes = np.asarray(new_tokens, dtype=np.float64) * float(model.hidden * ACTIVATION_BYTES)
    return allreduces_per_step(model) * link.allreduce_s(nbytes, n)

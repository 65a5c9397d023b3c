"""One run of ``simkv validate``'s scenario on the CPU plugin, below the comparison: what to run
(:class:`ValidateConfig`), the compiled model (:func:`build_and_compile`), the observer's scenario
(:func:`observer_scenario`), and the *clean run* (:func:`run_clean`).

The clean run measures RSS, VmSize, VmHWM and latency per operation without a tracker, in a child process
started with ``MALLOC_MMAP_THRESHOLD_`` in its environment (glibc reads it at start-up; it makes buffers of
at least that size separate mappings, so that RSS follows the bytes written instead of glibc's heap
staircase). :mod:`.runner` adds the memray run and the comparison; :mod:`.latency` repeats clean runs
to time the cost model. Imports OpenVINO lazily.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from simkv.errors import ConfigError
from simkv.workload import Decode, Fork, Prefill, Reorder, Reset, Select, Trim, Workload, parse_ops

from ..child import DEFAULT_MMAP_THRESHOLD, child_env

__all__ = ["ValidateConfig", "CleanRunError", "build_and_compile", "observer_scenario", "run_clean"]


class CleanRunError(RuntimeError):
    """The untracked measuring subprocess did not finish (the events are still compared)."""


@dataclass
class ValidateConfig:
    """What to validate. ``workload`` is simkv's text form (``prefill:32,decode:100,...``)."""

    workload: str
    layers: int = 4
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 64
    hidden: int | None = None
    vocab: int = 1000
    seed: int = 0
    kv_cache_precision: str | None = None  # KV_CACHE_PRECISION hint (None: plugin default)
    inference_precision: str | None = None  # INFERENCE_PRECISION_HINT
    ir: str | None = None
    mmap_threshold: int = DEFAULT_MMAP_THRESHOLD
    slope_min_tokens: int = 500
    clean_run: bool = True
    progress: bool = True
    model_name: str = "custom"
    extra: dict = field(default_factory=dict)
    device: str | None = "host"  # cost-model device for the latency prediction (None: none)


def observer_scenario(workload: Workload):
    """The observer's :class:`~.observe.Scenario` for a simkv workload, step for step.

    ``prefill`` on a stored history is a chat turn; ``fork:W`` is ``beam_idx=[0]*W``;
    ``reorder`` reverses the beams (same width: any permutation allocates the same);
    ``select:i`` keeps beam i; ``trim:N`` cuts N tokens as GenAI's chat does (``observe.trim_states``).
    """
    from .observe import Scenario

    sc = Scenario()
    batch, stored = 1, 0
    for op in workload.ops:
        if isinstance(op, Prefill):
            (sc.chat if stored else sc.prefill)(op.tokens)
            stored += op.tokens
        elif isinstance(op, Decode):
            sc.decode(op.steps)
            stored += op.steps
        elif isinstance(op, Fork):
            sc.fork(op.width)
            batch, stored = op.width, stored + 1
        elif isinstance(op, Reorder):
            sc.reorder(tuple(reversed(range(batch))))
            stored += 1
        elif isinstance(op, Select):
            sc.select(op.beam)
            batch, stored = 1, stored + 1
        elif isinstance(op, Reset):
            sc.reset()
            batch, stored = 1, 0
        elif isinstance(op, Trim):
            sc.trim(op.tokens)
            stored -= op.tokens
        else:  # pragma: no cover - Workload validates its ops
            raise ConfigError(f"cannot observe {op!r}")
    return sc


def build_and_compile(cfg: ValidateConfig):
    """Model + compiled model + inspection + KV dims (raises NotFusedError if unfused)."""
    from .observe import kv_dims_from_model
    from .ovmodel import build_stateful_decoder, compile_checked, load_ir
    from .toy import ToyDecoderSpec

    if cfg.ir:
        model = load_ir(cfg.ir)
    else:
        model = build_stateful_decoder(
            ToyDecoderSpec(layers=cfg.layers, heads=cfg.heads, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                           hidden=cfg.hidden, vocab=cfg.vocab, seed=cfg.seed)
        )
    compiled, inspection = compile_checked(model, cfg.kv_cache_precision, cfg.inference_precision)
    try:
        dims = kv_dims_from_model(model, inspection.kv_cache_precision or "u8")
    except ValueError as err:  # a state simkv does not model (e.g. LFM2's conv-only layers)
        raise ConfigError(f"{cfg.ir or 'the model'}: {err}") from None
    return model, compiled, inspection, dims


def _clean_child(config_path: str, out_path: str) -> int:
    """Subprocess entry (``python -m simkv.validate.openvino.cleanrun CONFIG OUT``): the untracked run."""
    from .observe import observe

    cfg = ValidateConfig(**json.loads(Path(config_path).read_text()))
    model, compiled, inspection, dims = build_and_compile(cfg)
    obs = observe(compiled, observer_scenario(parse_ops(cfg.workload)), dims=dims, model=model,
                  tracker="none", progress=cfg.progress, inspection=inspection, seed=cfg.seed)
    Path(out_path).write_text(json.dumps({
        "kv_cache_precision": inspection.kv_cache_precision,
        "malloc_env": obs.facts.malloc_env,
        "samples": [asdict(s) for s in obs.samples],
    }))
    return 0


def run_clean(cfg: ValidateConfig) -> dict:
    """The clean run of ``cfg`` (module docstring): its effective KV precision, malloc environment and
    per-operation samples (RSS, VmSize, VmHWM, latency)."""
    with tempfile.TemporaryDirectory(prefix="simkv_validate_") as tmp:
        cpath, opath = Path(tmp) / "config.json", Path(tmp) / "clean.json"
        cpath.write_text(json.dumps(asdict(cfg)))
        env = child_env(MALLOC_MMAP_THRESHOLD_=str(cfg.mmap_threshold), PYTHONFAULTHANDLER="1")
        proc = subprocess.run([sys.executable, "-m", "simkv.validate.openvino.cleanrun", str(cpath), str(opath)],
                              env=env, stdout=subprocess.DEVNULL, stderr=None if cfg.progress else subprocess.PIPE,
                              text=True)
        if proc.returncode != 0:
            if proc.returncode < 0:
                import signal

                what = f"crashed ({signal.Signals(-proc.returncode).name})"
            else:
                lines = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
                what = f"failed (exit {proc.returncode}): {lines[-1].strip() if lines else 'see stderr'}"
            raise CleanRunError(f"clean run (MALLOC_MMAP_THRESHOLD_={cfg.mmap_threshold}) {what}")
        return json.loads(opath.read_text())


if __name__ == "__main__":  # the clean-run subprocess
    sys.exit(_clean_child(sys.argv[1], sys.argv[2]))

"""The side environment that runs the real vLLM scheduler: where it lives, how ``simkv setup vllm`` builds it.

vLLM 0.33.0's scheduler and KV-cache manager are pure Python, but vLLM pins a transformers range that excludes
simkv's (5.23) and its own requirements pull a CUDA torch, the nvidia libraries and flashinfer (a 9.4 GB venv).
So it gets a venv of its own, built from :data:`REQUIREMENTS` — every package pinned (vLLM's import chain of
``vllm.v1.core.sched.scheduler`` and their dependencies, frozen from a working build) and installed with
``pip install --no-deps``: pip never resolves anything, and the same file gives the same venv. torch is the
2.13.0 CPU wheel (vLLM asks for 2.14.0; with 2.13 ``vllm._C`` fails to load with a warning, which the
scheduler does not need).

Location: ``$SIMKV_VLLM_VENV``, else ``$XDG_CACHE_HOME/simkv/vllm-venv`` (``~/.cache/simkv/vllm-venv``).
Building is idempotent: a venv whose stamp (:data:`STAMP`) holds the requirements' hash and whose Python
imports the scheduler is left as it is. Measured here: 2.2 GB, about 95 s with pip's cache warm.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from simkv.errors import ConfigError

#: The pinned packages (one ``name==version`` a line).
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
#: The vLLM release the driver and the rules in docs/research/vllm-scheduler.md were read against.
VLLM_VERSION = "0.33.0"
#: The one command that builds the environment (named by every error about it).
SETUP_COMMAND = "simkv setup vllm"
#: The file a finished build leaves in the venv: the requirements' hash.
STAMP = "simkv-vllm.json"
#: What the venv's Python must import for the driver to run.
PROBE = "import vllm.v1.core.sched.scheduler"


def venv_dir() -> Path:
    """Where the side venv lives (see the module docstring)."""
    given = os.environ.get("SIMKV_VLLM_VENV")
    if given:
        return Path(given).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "simkv" / "vllm-venv"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def requirements_hash() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def driver_env() -> dict[str, str]:
    """The environment the real scheduler runs in: the CPU platform (else ``VllmConfig`` fails with "Failed to
    infer device type"), no hub access, and vLLM's cache (``ModelConfig`` inspects the model class in a
    subprocess and caches the answer) in a temporary folder rather than ``~/.cache/vllm``."""
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_CACHE_ROOT=str(Path(tempfile.gettempdir()) / "simkv-vllm-cache"),
               VLLM_LOGGING_LEVEL="ERROR", VLLM_CONFIGURE_LOGGING="0", TOKENIZERS_PARALLELISM="false")
    return env


def is_built(venv: Path | None = None) -> bool:
    """Whether the venv exists with the current requirements' stamp (cheap: no import)."""
    venv = venv or venv_dir()
    try:
        stamp = json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return python_of(venv).exists() and stamp.get("requirements") == requirements_hash()


def require() -> Path:
    """The side venv's Python, or a one-line :class:`ConfigError` naming :data:`SETUP_COMMAND`."""
    venv = venv_dir()
    if not is_built(venv):
        raise ConfigError(f"the vLLM environment is missing (or out of date) at {venv}: run `{SETUP_COMMAND}` "
                          f"(about 2 minutes, 2.2 GB; SIMKV_VLLM_VENV sets where)")
    return python_of(venv)


def build(venv: Path | None = None, *, log=print) -> Path:
    """Build (or confirm) the side venv; return its Python. Raises :class:`ConfigError` with pip's last line."""
    venv = venv or venv_dir()
    if is_built(venv) and _probe(venv):
        log(f"the vLLM {VLLM_VERSION} environment at {venv} is up to date")
        return python_of(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    (venv / STAMP).unlink(missing_ok=True)
    if not python_of(venv).exists():
        log(f"creating {venv}")
        _run([sys.executable, "-m", "venv", str(venv)])
    log(f"installing {sum(1 for _ in _pins())} pinned packages (vLLM {VLLM_VERSION}, torch 2.13.0 CPU) with --no-deps")
    _run([str(python_of(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
          "-r", str(REQUIREMENTS)])
    if not _probe(venv):
        raise ConfigError(f"the vLLM environment at {venv} was built but `{PROBE}` fails in it")
    (venv / STAMP).write_text(json.dumps({"requirements": requirements_hash(), "vllm": VLLM_VERSION}) + "\n")
    log(f"the vLLM {VLLM_VERSION} environment is ready at {venv}")
    return python_of(venv)


def _pins():
    for line in REQUIREMENTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            yield line.strip()


def _probe(venv: Path) -> bool:
    done = subprocess.run([str(python_of(venv)), "-c", PROBE], env=driver_env(), capture_output=True,
                          cwd=str(venv), timeout=300)
    return done.returncode == 0


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()
                 and not ln.startswith("WARNING: Location")]
        raise ConfigError(f"`{' '.join(cmd[:4])} …` failed: {lines[-1] if lines else f'exit {done.returncode}'}")

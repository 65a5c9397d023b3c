"""Upper bounds of ``simkv run`` (docs/guide/getting-started.md, "Limits") and of a model config, checked
before anything runs.

Beyond them a run would take minutes or gigabytes (or is no model anyone runs): the
command refuses with one line and exit code 2. The dashboard has tighter limits of its
own (:mod:`simkv.dashboard.state`). Steps after which memory certainly runs out do
not count towards :data:`MAX_STEPS`: the run stops there with an out-of-memory outcome.
"""

from __future__ import annotations

import os
from pathlib import Path

from simkv.errors import ConfigError
from simkv.workload import Decode, Fork, Prefill, Reset, Select, Trim

MAX_LAYERS = 100_000
MAX_HEADS = 65_536  # query heads and KV heads
MAX_HEAD_DIM = 65_536
MAX_TOKENS = 100_000_000  # --prompt, --decode, --turn-tokens, --turn-decode, and each --ops count
MAX_TURNS = 100_000
MAX_BEAM = 4_096
MAX_STEPS = 10_000_000  # simulated steps before memory certainly runs out
MAX_BATCH = 1_000_000  # sequences in one step priced by ``simkv cost``
MAX_DEVICE_BYTES = 1 << 50  # 1 PiB
#: A device's fixed cost per unit of work (per sequence, per layer and head, per prompt token ...), seconds.
MAX_OVERHEAD_S = 3600.0
#: A model config (simkv.hfconfig): hidden, MLP, vocabulary and state widths at most as wide as the widest
#: attention the limits above allow; experts; the file itself.
MAX_WIDTH = MAX_HEADS * MAX_HEAD_DIM
MAX_EXPERTS = 65_536
MAX_CONFIG_BYTES = 16 << 20  # 16 MiB, far above a real config.json
#: Ledger rows (allocations, copies, frees) a single-session run may record: 51 bytes each,
#: so about 0.4 GB of ledger, and a run that reaches it peaks near 0.6 GB RSS (docs/results/speed.md).
#: A run that would pass it stops there with one line, exit 2 (simkv.ledger.TooManyEvents).
MAX_LEDGER_ROWS = 8_000_000
#: The same for a serving run (``simkv run --trace``): contiguous memory records every layer's buffers of
#: every request; the whole shipped Azure conversation trace needs 13.6 M rows (``openvino-cpu``), and
#: 16 M rows are about 0.8 GB of ledger. A trace that would pass it stops there with one line, exit 2.
MAX_SERVING_LEDGER_ROWS = 16_000_000

#: ``simkv validate`` runs a REAL runtime for every token, so its bounds are those of a validation run, far below a
#: simulation's. The largest sessions validated (docs/results/validation.md, experiments/validation_table.py) decode
#: 4,200 tokens; the plugin runs them twice (memray, then a clean run): 4 layers x 4,200 tokens take about 70 s here,
#: 32 layers about 400 s (docs/DESIGN.md, "Cost of a real run here"). The bounds allow about four times the tokens
#: and twice the work of the largest run: at most about 5 minutes at 4 layers, about 13 minutes at 32.
#: Token rows one validated session computes: prompt and chat-turn tokens, generated tokens, each times the beams
#: computing it (:func:`validation_tokens`).
MAX_VALIDATE_TOKENS = 16_384
#: Layers x token rows of one validated session: twice the 32-layer, 4,200-token run (about 400 s).
MAX_VALIDATE_LAYER_TOKENS = 2 * 32 * 4_200
#: Layers of the toy decoder a validation builds (32 validated).
MAX_VALIDATE_LAYERS = 128
#: Weights of the toy decoder (f32: 2 GB): three times those of the largest documented one, llama-3-8b's shape at
#: ``--hidden 512`` (168 M, docs/guide/validating.md); the schedule does not depend on the weights.
MAX_VALIDATE_PARAMS = 500_000_000
#: Random workloads of ``simkv validate --paged --random N``: 200 take about 8 minutes (experiments/paged_validation.py),
#: so 1,000 about 40.
MAX_VALIDATE_RANDOM = 1_000

#: (flag, attribute, bound) of the numeric flags shared by run and validate.
FLAG_BOUNDS = (
    ("--layers", "layers", MAX_LAYERS), ("--heads", "heads", MAX_HEADS), ("--kv-heads", "kv_heads", MAX_HEADS),
    ("--head-dim", "head_dim", MAX_HEAD_DIM), ("--prompt", "prompt", MAX_TOKENS), ("--decode", "decode", MAX_TOKENS),
    ("--turns", "turns", MAX_TURNS), ("--turn-tokens", "turn_tokens", MAX_TOKENS),
    ("--turn-decode", "turn_decode", MAX_TOKENS), ("--beam", "beam", MAX_BEAM),
)


def check_flags(args) -> None:
    """The flags' own bounds (before a workload of ``--turns`` answers is even built)."""
    for flag, name, bound in FLAG_BOUNDS:
        value = getattr(args, name, None)
        if value is not None and value > bound:
            raise ConfigError(f"{flag} {value:,} is over the limit of {bound:,} "
                              "(see docs/guide/getting-started.md, Limits)")


def certain_steps(scenario) -> int:
    """Steps the run can take before its stored tokens alone exceed device memory.

    Any policy allocates at least the bytes of the tokens it stores (capacity >=
    tokens), so past that step the run is out of memory whatever the policy does."""
    per_token = max(1, scenario.precision.kv_bytes_per_token(scenario.model))
    fits = scenario.device_memory // per_token  # token rows (tokens x beams) that can be stored
    steps, stored, batch = 0, 0, 1
    for op in scenario.workload.ops:
        if isinstance(op, Decode):
            room = max(fits // batch - stored, 0)
            if op.steps > room:
                return steps + room + 1
            steps, stored = steps + op.steps, stored + op.steps
            continue
        steps += 1
        if isinstance(op, Reset):
            stored, batch = 0, 1
            continue
        batch = op.width if isinstance(op, Fork) else 1 if isinstance(op, Select) else batch
        stored += op.tokens if isinstance(op, Prefill) else 1
        if stored * batch > fits:
            return steps
    return steps


def check_scenario(scenario) -> None:
    """Bounds of a built scenario: device size, each operation's tokens, simulated steps."""
    if scenario.device_memory > MAX_DEVICE_BYTES:
        raise ConfigError("--device-memory is over the limit of 1 PiB")
    for op in scenario.workload.ops:
        count = op.tokens if isinstance(op, Prefill) else op.steps if isinstance(op, Decode) else 0
        if count > MAX_TOKENS:
            raise ConfigError(f"an operation of {count:,} tokens is over the limit of {MAX_TOKENS:,}")
    steps = certain_steps(scenario)
    if steps > MAX_STEPS:
        raise ConfigError(f"this run simulates {steps:,} steps before memory runs out, over the limit of "
                          f"{MAX_STEPS:,}: use fewer tokens or less --device-memory")


def check_output(path: str, flag: str, suffixes: tuple[str, ...]) -> Path:
    """An output path that can be written: a name ending in one of ``suffixes`` (``""`` among them: a name with no
    suffix, the stem of several files) in an existing, writable directory (none is created). Checked before the
    command runs (simkv.flags.check_contract), so a typo costs nothing and leaves nothing behind."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in suffixes:
        named = [s for s in suffixes if s]
        raise ConfigError(f"{flag} {path}: the file name must end in {' or '.join(named)}"
                          + (" (or have no suffix: one file of each)" if "" in suffixes else ""))
    parent = p.parent
    if not parent.exists():
        raise ConfigError(f"{flag} {path}: directory {parent} does not exist (none is created)")
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: {parent} is not a directory")
    if p.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{flag} {path}: directory {parent} is not writable")
    return p


def validation_tokens(workload) -> int:
    """Token rows a real run of ``workload`` computes: every prefilled token and every generated token, times the
    beams that compute it (after a fork, ``width`` rows per step until a select or reset); a trim computes none."""
    rows, batch = 0, 1
    for op in workload.ops:
        if isinstance(op, (Trim, Reset)):  # no inference (a reset only empties the history)
            batch = 1 if isinstance(op, Reset) else batch
            continue
        batch = op.width if isinstance(op, Fork) else 1 if isinstance(op, Select) else batch
        rows += batch * (op.tokens if isinstance(op, Prefill) else op.steps if isinstance(op, Decode) else 1)
    return rows


def check_validation(layers: int, workload, params: int = 0) -> None:
    """Bounds of a validation session on a real runtime (``simkv validate``; module docstring's
    :data:`MAX_VALIDATE_TOKENS` and below; ``params``: the toy model's weights), checked before the runtime is loaded: one line, exit code 2."""
    if layers > MAX_VALIDATE_LAYERS:
        raise ConfigError(f"{layers:,} layers: a real validation run builds at most {MAX_VALIDATE_LAYERS:,} "
                          "(the schedule is the same per layer; see docs/guide/cli.md, Limits)")
    if params > MAX_VALIDATE_PARAMS:
        raise ConfigError(f"the toy model would hold {params:,} weights: a real validation run builds at most "
                          f"{MAX_VALIDATE_PARAMS:,} (the schedule does not depend on them; see docs/guide/cli.md, Limits)")
    rows = validation_tokens(workload)
    if rows > MAX_VALIDATE_TOKENS or rows * layers > MAX_VALIDATE_LAYER_TOKENS:
        raise ConfigError(f"this validation computes {rows:,} tokens at {layers:,} layers: a real run takes at most "
                          f"{MAX_VALIDATE_TOKENS:,} tokens and {MAX_VALIDATE_LAYER_TOKENS:,} layer-tokens (about 13 "
                          "minutes; see docs/guide/cli.md, Limits)")

"""``simkv validate --silicon PATH.csv``: measured serving benchmarks (AIConfigurator's ``silicon_sample.csv`` column
format) against simkv's serving simulation of the same deployment and load, row by row.

Each row is one benchmark: ``batch_size`` closed-loop clients (the concurrency; times ``attention_dp_size`` on
AIConfigurator's attention-DP rows, which hold one rank's), every request ``isl`` input and
``osl`` output tokens, ``tp_size`` GPUs, a model and its checkpoint's format, the measured mean TTFT and TPOT.
How the rows were taken (docs/research/latency-facts.md §1) decides how they are simulated:

* **InferenceX rows** (``silicon_data_source`` from InferenceX's database, ``source_file=20..``): its
  ``benchmark_serving.py`` — 10·C requests, closed loop of C (:mod:`simkv.serving.closed_loop`), each request's
  input and output lengths uniform integers in [⌊0.8·L⌋, L] drawn as the client draws them (``np.random.seed(0)``,
  ``randint(int(L·0.8), L + 1)``, inputs then outputs), the server as the recipe of its model starts vLLM
  (:data:`simkv.validate.silicon_recipes.RECIPES`);
* **AIConfigurator's own rows** (``aic-auto-gap-analysis``): its generated benchmark's protocol, aiperf 0.3.0 —
  fixed lengths, a warm-up of 2·C requests that drains before 20·C measured ones (``bench_run.sh.j2``:
  ``--warmup-request-count C·2 --num-requests C·MULTI_ROUND``, MULTI_ROUND 20; simkv.serving.closed_loop) — on
  vLLM 0.12.0's defaults for a GPU of at least 70 GiB, the H100's and the H200's (``max_num_batched_tokens`` 8192,
  ``max_num_seqs`` 1024, ``gpu_memory_utilization`` 0.9).

The prediction is the mean TTFT and the mean per-request TPOT (``(e2e − ttft) / (output − 1)``) over the measured
requests, as ``benchmark_serving.calculate_metrics`` and aiperf's ``avg`` of TTFT and ITL report them. A row simkv
cannot model is listed with its reason and no prediction; nothing is fitted to the rows.

What each row ran — which checkpoint its benchmark served and how its vLLM server was started, each with its
source — is data, in :mod:`simkv.validate.silicon_recipes` (``SERVED``, ``PRECISION_FORMATS``, ``RECIPES``,
``VLLM_DEFAULTS``, the :class:`Row` both read); this file is the mechanism, in order: the bounds; which checkpoint a
row ran (:func:`resolve_checkpoint`, the rule over those tables); reading the rows (:func:`read_rows`); which
benchmark took a row and what its client sent (:func:`protocol`, :func:`request_count`, :func:`lengths`); why a row
is not modelled (:func:`refusal`); one row simulated (:func:`simulate`, its server by ``recipe_for``); the report
(:func:`summary`, :func:`render`, :func:`to_json`); the command (:func:`check_work`, :func:`validate`).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simkv.errors import ConfigError
from simkv.validate.silicon_recipes import PRECISION_FORMATS, SERVED, Row, kv_cache_precision, recipe_for

#: The columns a row must have (aiconfigurator-core 0.12.0 ``systems/silicon_sample.csv``; others are ignored).
COLUMNS = ("id", "backend", "backend_version", "model_path", "system", "precision", "mode", "isl", "osl",
           "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size",
           "moe_tp_size", "moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms", "silicon_data_source")
#: Bounds on a file (rows, bytes) and on a row (clients, tokens): beyond them the command refuses in one line.
MAX_ROWS = 100_000
MAX_FILE_BYTES = 64 << 20
MAX_CONCURRENCY = 4096
MAX_LENGTH = 1_000_000
#: The most tokens one row's benchmark may move (requests x (input + output)): the largest shipped row moves 47 M
#: (5,120 requests of 1k + 8k tokens, ~30 s here); beyond this a row is listed as not modelled, not run for hours.
MAX_ROW_TOKENS = 200_000_000
#: The most rows one command simulates and the most tokens they move together (the rows :func:`refusal` lets
#: through, counted before any runs): the largest shipped file, B200's, lets 591 rows through moving 1.60 G tokens; a
#: small row costs ~0.1 s however few tokens it moves, so 100,000 of them would run for hours. Beyond either bound
#: the command refuses in one line and ``--match`` picks a part.
MAX_SIMULATED_ROWS = 1_000
MAX_FILE_TOKENS = 3_000_000_000
#: AIConfigurator's systems → simkv's device presets.
SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200-sxm", "b200_sxm": "b200", "b300_sxm": "b300", "a100_sxm": "a100-80gb"}


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint a row's model and precision ran: its config in the configs folder (its
    ``quantization_config`` / ``hf_quant_config.json`` say which part is stored in which format: simkv.weights),
    the checkpoint's name, the format simkv reads its quantized parts in, and why this checkpoint."""

    config: str  # file name in the configs folder
    name: str  # the Hugging Face checkpoint
    format: str  # simkv.weights' name of its quantized parts' format (the dtype where nothing is quantized)
    source: str


def config_file(checkpoint: str) -> str:
    """The file aiconfigurator-core's ``model_configs`` keeps a checkpoint's config.json in: ``<org>--<name>``."""
    return checkpoint.replace("/", "--") + "_config.json"


@functools.lru_cache(maxsize=64)
def _stored_format(path: Path) -> str:
    """The format simkv.weights reads a config's quantized parts in (its WeightScheme's ``quantized``), or the
    checkpoint's dtype where nothing is quantized (simkv.models.checkpoint_weights_precision)."""
    from simkv.hfconfig import resolve_model
    from simkv.models import checkpoint_weights_precision

    model = resolve_model(str(path))
    return model.weight_scheme.quantized if model.weight_scheme else checkpoint_weights_precision(model)


def _at_precision(fmt: str, precision: str) -> bool:
    """Whether a stored format (``fp8-block`` is an fp8 layout) is one a row of that precision column runs."""
    return any(fmt == f or fmt.startswith(f + "-") for f in PRECISION_FORMATS.get(precision, ()))


def resolve_checkpoint(model_path: str, precision: str, configs: str | Path) -> Checkpoint | str:
    """Which checkpoint config a row runs, or why none (one line). The rule: the model's own checkpoint
    (``configs/<org>--<name>_config.json``) where its stored format is the row's precision (:data:`PRECISION_FORMATS`:
    Qwen3-235B-A22B-FP8 is itself fp8, Kimi-K2.5's own is compressed-tensors int4, gpt-oss-120b's own mxfp4 is the
    rows' fp4); else the quantized checkpoint the benchmark served (:data:`SERVED`), whose config must be in the
    folder — a missing one is named, never made up."""
    configs = Path(configs)
    where = f"no checkpoint config for {model_path} at precision {precision or 'bf16'!r}"
    if precision not in PRECISION_FORMATS:
        known = ", ".join(p or "empty (bf16)" for p in PRECISION_FORMATS)
        return f"{where}: simkv knows no stored format for that precision column ({known})"
    try:
        own = configs / config_file(model_path)
        fmt = _stored_format(own) if own.is_file() else None
        if fmt is not None and _at_precision(fmt, precision):
            return Checkpoint(own.name, model_path, fmt, f"the model's own checkpoint, stored in {fmt}")
        served = SERVED.get((model_path, precision))
        if served is None:
            return (f"{where}: {own.name} is not in {configs}" if fmt is None else
                    f"{where}: its own checkpoint is stored in {fmt} and which checkpoint the benchmark served is not known")
        path = configs / (served.stand_in or config_file(served.checkpoint))
        if not path.is_file():
            return f"{where}: {path.name} (the served {served.checkpoint}) is not in {configs}"
        fmt = _stored_format(path)
    except ConfigError as exc:
        return f"{where}: {exc}"
    except OSError as exc:  # e.g. a model_path too long for a file name: this row's reason, not the whole file's
        return f"{where}: cannot read its config: {exc.strerror}"
    if not _at_precision(fmt, precision):
        return f"{where}: {path.name} is stored in {fmt}"
    return Checkpoint(path.name, served.checkpoint, fmt, served.source)


@dataclass
class Outcome:
    """One row's prediction, or why it is not modelled."""

    row: Row
    predicted_ttft_ms: float | None = None
    predicted_tpot_ms: float | None = None
    reason: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ttft_error(self) -> float | None:
        return None if self.predicted_ttft_ms is None else self.predicted_ttft_ms / self.row.ttft_ms - 1.0

    @property
    def tpot_error(self) -> float | None:
        return None if self.predicted_tpot_ms is None else self.predicted_tpot_ms / self.row.tpot_ms - 1.0


@contextlib.contextmanager
def _csv_errors(path: Path):
    """A file that cannot be read as UTF-8 CSV: one line (a :class:`ConfigError`) naming it, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start} of a read: {exc.reason})") from None
    except csv.Error as exc:
        raise ConfigError(f"{path}: not CSV ({exc})") from None


def read_rows(path: str | Path) -> list[Row]:
    """The rows of a silicon CSV (one line naming the problem, as a :class:`ConfigError`, for a file simkv cannot
    read: missing, too large, not UTF-8 CSV, a missing column, a row of another width, a value that is not a number,
    a text with a control character, an id given twice)."""
    path = Path(path)
    with _csv_errors(path):
        size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: {size:,} bytes, more than the {MAX_FILE_BYTES:,} a silicon file may have")
    rows: list[Row] = []
    first_line: dict[str, int] = {}
    with _csv_errors(path), path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path}: no column {', '.join(missing)} (the silicon_sample.csv format)")
        for rec in reader:
            where = f"{path}:{reader.line_num}"
            if len(rows) >= MAX_ROWS:
                raise ConfigError(f"{path}: more than {MAX_ROWS:,} rows")
            row = _row(rec, where, len(reader.fieldnames))
            if row.id in first_line:
                raise ConfigError(f"{where}: id {row.id!r} again (first on line {first_line[row.id]}): an id names "
                                  "one row (--json, --beside)")
            first_line[row.id] = reader.line_num
            rows.append(row)
    if not rows:
        raise ConfigError(f"{path}: no rows")
    return rows


#: The text columns a row's outcome and report print: a control character in one (a newline, a NUL, a direction
#: override) would break the report's one line per row, so the file is refused.
TEXT_COLUMNS = ("id", "backend", "backend_version", "model_path", "system", "precision", "mode", "silicon_data_source")


def _row(rec: dict, where: str, width: int) -> Row:
    if None in rec or any(v is None for v in rec.values()):  # csv.DictReader's restkey / restval
        fields = width + len(rec.get(None, ())) - sum(v is None for v in rec.values())
        raise ConfigError(f"{where}: {fields} fields where the header has {width}")
    for name in TEXT_COLUMNS:
        if not rec[name].isprintable():
            raise ConfigError(f"{where}: {name} {rec[name]!r} has a control character")

    def integer(name: str, low: int, high: int, empty: int | None = None) -> int:
        text = rec[name].strip()
        if not text and empty is not None:
            return empty
        try:
            number = float(text)
        except ValueError:
            raise ConfigError(f"{where}: {name} {text!r} is not an integer") from None
        if not (low <= number <= high and number.is_integer()):
            raise ConfigError(f"{where}: {name} must be an integer in {low}..{high:,}, got {text!r}")
        return int(number)

    def positive(name: str) -> float:
        text = rec[name].strip()
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{where}: {name} {text!r} is not a number") from None
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{where}: {name} must be a positive number, got {text!r}")
        return value

    # AIConfigurator's attention-DP rows hold the concurrency of one DP rank in ``batch_size``; the benchmark's
    # clients (``silicon_concurrency`` in ``silicon_data_source``, its ``--max-concurrency``) are that times
    # ``attention_dp_size`` on every such row shipped (97 of 97; docs/research/vllm-dp.md §1)
    attention_dp = integer("attention_dp_size", 0, 1024, empty=1)
    clients = integer("batch_size", 1, MAX_CONCURRENCY) * max(1, attention_dp)
    if clients > MAX_CONCURRENCY:
        raise ConfigError(f"{where}: batch_size x attention_dp_size = {clients:,} clients, more than {MAX_CONCURRENCY:,}")
    return Row(id=rec["id"], model_path=rec["model_path"].strip(), precision=rec["precision"].strip(),
               system=rec["system"].strip(), mode=rec["mode"].strip(), isl=integer("isl", 1, MAX_LENGTH),
               osl=integer("osl", 1, MAX_LENGTH), concurrency=clients,
               tp=integer("tp_size", 1, 1024), pp=integer("pp_size", 1, 1024, empty=1),
               attention_dp=attention_dp,
               moe_tp=integer("moe_tp_size", 0, 1024, empty=1), moe_ep=integer("moe_ep_size", 0, 1024, empty=1),
               ttft_ms=positive("silicon_ttft_ms"), tpot_ms=positive("silicon_tpot_ms"),
               source=rec["silicon_data_source"], backend=rec["backend"].strip(),
               backend_version=rec["backend_version"].strip())


def protocol(row: Row) -> str:
    """Which benchmark took the row, by its ``silicon_data_source`` (docs/research/latency-facts.md §1):

    * ``inferencex`` — InferenceX's database: its dumps (``source_file=<date>.csv; model=...; wip=...``, or with the
      file name trimmed ``model=...; wip=...``), and the records of its database itself (``db-dump/<date>;
      config_id=N; ...; workflow_run_id=N; <image>``): ``(workflow_run_id, config_id, benchmark_type, isl, osl,
      conc)`` is the key of InferenceX's throughput database point (InferenceX @ f559835ae
      docs/results-and-ingestion.md, "Identity at each layer"); a row with an ISL and OSL is a fixed-sequence
      throughput run (AgentX points have none), i.e. ``benchmark_serving.py`` run by ``benchmark_lib.sh``, and the
      images the rows name are those of its ``nvidia-master.yaml`` entries (@ 09f7769f: kimik2.5-fp4-b200-vllm
      v0.17.0, minimaxm2.5-fp4-b200-vllm v0.19.0-cu130, ...);
    * ``aic`` — AIConfigurator's gap analysis (``source_file=.../aic-auto-gap-analysis/...``, its ``gtl_job_id``
      records, or, with the file name trimmed off, nothing but ``silicon_concurrency=C``);
    * else ``unknown`` — e.g. ``source_file=kimi-k2.5-gap-analysis.csv; ...; aic_database_mode=SILICON``: no
      aiconfigurator, aisimulate or InferenceX source found says which client took those."""
    src = row.source.strip()
    if "wip=" in src or src.startswith("source_file=20"):
        return "inferencex"
    if src.startswith("db-dump/") and "config_id=" in src and "workflow_run_id=" in src:
        return "inferencex"
    if "aic-auto-gap-analysis" in src or "gtl_job_id=" in src or src.startswith("silicon_concurrency=") and ";" not in src:
        return "aic"
    return "unknown"


#: aiperf's protocol as AIConfigurator's generated benchmark runs it (``bench_run.sh.j2``: ``--concurrency C
#: --num-requests 20·C --warmup-request-count 2·C``, lengths fixed; aiperf 0.3.0, the version its
#: ``generator/sflow.py`` installs): a warm-up of 2·C requests that drains before the 20·C measured ones
#: (simkv.serving.closed_loop). aiperf's 100 dataset prompts would repeat from request 100 on; the rows show no
#: prefix-cache hits from it (docs/research/latency-facts.md §1), so each request is its own prompt here.
AIPERF_WARMUP_PER_CLIENT = 2
AIPERF_REQUESTS_PER_CLIENT = 20


def warmup_requests(row: Row, proto: str) -> int:
    """The requests a row's benchmark sent as its drained warm-up (not measured): aiperf's 2·C; InferenceX's
    ``benchmark_serving`` warm-up is not simulated (2·C copies of one prompt, all ended before the run: §1)."""
    return AIPERF_WARMUP_PER_CLIENT * row.concurrency if proto == "aic" else 0


def request_count(row: Row, proto: str) -> int:
    """The requests the row's benchmark sent: InferenceX's 10·C, aiperf's warm-up and measured ones (22·C)."""
    per_client = 10 if proto == "inferencex" else AIPERF_WARMUP_PER_CLIENT + AIPERF_REQUESTS_PER_CLIENT
    return per_client * row.concurrency


def lengths(row: Row, proto: str) -> tuple[np.ndarray, np.ndarray]:
    """Each request's input and output tokens, as the row's benchmark client drew them (aic: the warm-up's first)."""
    n = request_count(row, proto)
    if proto == "inferencex":
        rng = np.random.RandomState(0)  # benchmark_serving.main: np.random.seed(args.seed), seed 0
        rng.randint(0, 1, size=0)  # the shared prefix's ids (--random-prefix-len 0: none)
        inputs = rng.randint(int(row.isl * 0.8), row.isl + 1, size=n)
        outputs = rng.randint(int(row.osl * 0.8), row.osl + 1, size=n)
        return inputs, outputs
    return np.full(n, row.isl), np.full(n, row.osl)


def refusal(row: Row) -> str | None:
    """Why a row cannot be modelled (one line), or None."""
    if row.backend != "vllm":
        return f"backend {row.backend!r}: only vLLM's serving engine is modelled"
    if not row.model_path:
        return "no model_path"
    if row.mode != "agg":
        return f"mode {row.mode!r}: disaggregated prefill/decode is not modelled"
    if row.system not in SYSTEMS:
        return f"system {row.system!r} has no device preset ({', '.join(SYSTEMS)})"
    if row.pp != 1:
        return f"pipeline parallelism ({row.pp} stages) is not modelled"
    if row.attention_dp <= 1 and row.moe_tp * row.moe_ep > row.tp:
        # e.g. aic's H200 Qwen3-235B-A22B-FP8 rows at tp_size 1 or 2 with moe_tp_size 2 or 4 and no attention_dp_size:
        # the MoE layers span devices that the attention's TP does not, and the row does not say what runs there
        return (f"MoE over moe_tp x moe_ep = {row.moe_tp * row.moe_ep} devices but attention over tp = {row.tp}: "
                "the layout of the other devices (attention data parallelism?) is not stated, not modelled")
    proto = protocol(row)
    if proto == "unknown":
        return "the benchmark that took the row is not known (neither InferenceX's nor AIConfigurator's)"
    requests = request_count(row, proto)
    if requests * (row.isl + row.osl) > MAX_ROW_TOKENS:
        return (f"{requests:,} requests of {row.isl:,} + {row.osl:,} tokens: more than the {MAX_ROW_TOKENS:,} tokens a "
                "row may move (simkv.validate.silicon.MAX_ROW_TOKENS)")
    return None


def simulate(row: Row, configs: Path, *, engine: str = "fast", scheduler: str = "continuous") -> Outcome:
    """The row simulated as its benchmark ran it (see the module docstring), or the reason it is not."""
    from simkv.cost import gemm_mix, get_device
    from simkv.cost.cudagraphs import capture_sizes
    from simkv.hfconfig import resolve_model
    from simkv.models import tp_shard, weights_bytes
    from simkv.precision import get_precision
    from simkv.serving import Request, ServingSpec, serve
    from simkv.serving.sched.config import SchedulerConfig
    from simkv.serving.sched.vllm import profile_peak_bytes

    why = refusal(row)
    ck = resolve_checkpoint(row.model_path, row.precision, configs) if why is None else None
    if why or isinstance(ck, str):
        return Outcome(row, reason=why or ck)
    proto = protocol(row)
    recipe = recipe_for(row, proto)
    if recipe is None:
        return Outcome(row, reason=f"no recipe for {row.model_path} {row.precision or 'bf16'} on {row.system} at vLLM "
                                   f"{row.backend_version or '(unversioned)'}: the script it ran is not recorded")
    if recipe.async_scheduling is None:
        return Outcome(row, reason=f"vLLM {recipe.vllm_version or '(unversioned)'}: its async-scheduling default is "
                                   "not read (simkv.validate.silicon_recipes.VLLM_DEFAULTS)")
    # InferenceX's ``dp-attn`` label: only some scripts launch vLLM data parallelism for it (docs/research/vllm-dp.md)
    if row.attention_dp > 1 and recipe.data_parallel_attention:
        return Outcome(row, reason=f"vLLM data parallelism ({row.tp} engine cores of TP 1, experts over {row.tp} "
                                   "devices: the script launches --data-parallel-size for dp-attn) is not modelled")
    notes = []
    try:
        model = resolve_model(str(configs / ck.config))
        kv_precision = get_precision(kv_cache_precision(recipe, model))
        device = get_device(SYSTEMS[row.system])
        shard = tp_shard(model, row.tp)
    except ConfigError as exc:
        return Outcome(row, reason=str(exc))
    ep = row.moe_ep
    if row.attention_dp > 1:  # a label its script ignores: the one engine it launched
        ep = row.tp
        notes.append(f"labelled attention-DP {row.attention_dp} / EP {row.moe_ep}, but its script ignores the label: "
                     f"one engine at TP {row.tp} with expert parallelism over {row.tp}, {row.concurrency} clients")
    if ep > 1:
        if not model.experts:
            return Outcome(row, reason=f"expert parallelism over {ep} devices on a dense model")
        notes.append(f"expert parallelism over {ep}: each device holds {model.experts // ep} whole "
                     "experts — the same expected expert bytes per step and the same all-reduces as TP (vLLM's "
                     "FusedMoEParallelConfig with DP 1: no all-to-all); the busiest device's excess is not modelled")
    weights = weights_bytes(shard, "checkpoint")  # every part in its stored format, scales included
    inputs, outputs = lengths(row, proto)
    warmup = warmup_requests(row, proto)
    requests = [Request(i, int(p), int(o), arrival_s=0.0) for i, (p, o) in enumerate(zip(inputs, outputs))]
    # vLLM's pool: gpu_memory_utilization x the device's memory less the weights and the profile run's activation
    # peak (simkv.serving.sched.vllm.num_gpu_blocks, profile_peak_bytes), in the recipe's blocks; vLLM's scheduler
    # (scheduler "vllm") or GenAI's continuous batching on vLLM's KV manager (the default: planned runs, ~10x faster)
    seqs = recipe.max_num_seqs or row.concurrency
    graphs = capture_sizes(seqs, recipe.max_num_batched_tokens, recipe.max_cudagraph_capture_size)
    if scheduler == "vllm":
        cfg = SchedulerConfig(block_size=recipe.block_size, max_num_batched_tokens=recipe.max_num_batched_tokens,
                              max_num_seqs=seqs, scheduler="vllm", gpu_memory_utilization=recipe.gpu_memory_utilization,
                              cudagraph_capture_sizes=graphs)
    else:
        peak = profile_peak_bytes(shard, recipe.max_num_batched_tokens, seqs)
        kv_bytes = int(device.memory_bytes * recipe.gpu_memory_utilization) - weights - peak
        if kv_bytes <= 0:
            return Outcome(row, reason=f"no KV cache fits: {recipe.gpu_memory_utilization} of the device less "
                                       f"{weights / 2**30:.1f} GiB of weights and {peak / 2**30:.1f} GiB of activations")
        cfg = SchedulerConfig(block_size=recipe.block_size, cache_size=kv_bytes / 2**30, max_num_seqs=seqs,
                              kv_manager="vllm", max_num_batched_tokens=recipe.max_num_batched_tokens, cudagraph_capture_sizes=graphs)
    mix = gemm_mix(shard, device, "checkpoint")  # each part's GEMMs at its kernel's peak (fp8 W8A8, mxfp4 in bf16)
    spec = ServingSpec(requests, model, kv_precision, scheduler=scheduler, paged=cfg,
                       device=device.name,
                       weights_bytes=weights, tp=row.tp, concurrency=row.concurrency, gemm_mix=mix,
                       async_scheduling=recipe.async_scheduling, max_context=0, engine=engine, warmup=warmup)
    try:
        result = serve(spec)
    except ConfigError as exc:
        return Outcome(row, reason=str(exc))
    table = result.request_table
    table = {k: v[table["id"] >= warmup] for k, v in table.items()} if warmup else table  # the measured requests
    done = table["status"] == "FINISHED"
    if not done.all():
        return Outcome(row, reason=f"{int((~done).sum())} of {len(done)} requests did not finish"
                                   + (f" ({result.stopped})" if result.stopped else ""))
    ttft = float(np.mean(table["ttft_s"])) * 1000
    tpot = float(np.nanmean(table["tpot_s"])) * 1000
    return Outcome(row, ttft, tpot, notes=notes)


# --------------------------------------------------------------------------- the report


def _stats(errors: list[float]) -> tuple[float | None, float | None]:
    """(median, p90) of the absolute errors (fractions), or (None, None) for none."""
    if not errors:
        return None, None
    a = np.abs(np.asarray(errors))
    return float(np.median(a)), float(np.percentile(a, 90))


def read_beside(path: str | Path) -> dict[str, tuple[float | None, float | None, str]]:
    """Another predictor's predictions of the same rows (``id, aic_ttft_ms, aic_tpot_ms, aic_error``, as
    experiments/silicon_aic.py writes AIConfigurator's): id → (TTFT ms, TPOT ms, its error or ""); a file simkv
    cannot read (too large, not UTF-8 CSV, a prediction that is not a positive number) is one line."""
    path = Path(path)

    def prediction(rec: dict, name: str) -> float | None:
        text = (rec.get(name) or "").strip()
        if not text:
            return None
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{path}: row {rec['id']!r}: {name} {text!r} is not a positive number")
        return value

    with _csv_errors(path):
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: more than the {MAX_FILE_BYTES:,} bytes a predictions file may have")
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if not {"id", "aic_ttft_ms", "aic_tpot_ms"} <= set(reader.fieldnames or []):
                raise ConfigError(f"{path}: needs the columns id, aic_ttft_ms, aic_tpot_ms (experiments/silicon_aic.py)")
            return {rec["id"]: (prediction(rec, "aic_ttft_ms"), prediction(rec, "aic_tpot_ms"), rec.get("aic_error") or "")
                    for rec in reader}


def summary(outcomes: list[Outcome], beside: dict | None = None) -> dict:
    """Median and p90 |error| of TTFT and TPOT per model and overall, and the rows not modelled by reason; with
    ``beside`` (:func:`read_beside`) that predictor's errors too, on the rows simkv models that it predicts."""
    by_model: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_model.setdefault(o.row.model_path, []).append(o)

    def block(items: list[Outcome]) -> dict:
        done = [o for o in items if o.reason is None]
        ttft, tpot = _stats([o.ttft_error for o in done]), _stats([o.tpot_error for o in done])
        out = {"rows": len(items), "modelled": len(done), "ttft_median_abs_error": ttft[0],
               "ttft_p90_abs_error": ttft[1], "tpot_median_abs_error": tpot[0], "tpot_p90_abs_error": tpot[1]}
        if beside is not None:
            both = [(o, beside[o.row.id]) for o in done if beside.get(o.row.id, (None,))[0] is not None]
            ttft = _stats([b[0] / o.row.ttft_ms - 1 for o, b in both])
            tpot = _stats([b[1] / o.row.tpot_ms - 1 for o, b in both])
            out["beside"] = {"rows": len(both), "ttft_median_abs_error": ttft[0], "ttft_p90_abs_error": ttft[1],
                             "tpot_median_abs_error": tpot[0], "tpot_p90_abs_error": tpot[1]}
        return out

    reasons: dict[str, int] = {}
    for o in outcomes:
        if o.reason is not None:
            reasons[o.reason] = reasons.get(o.reason, 0) + 1
    return {"overall": block(outcomes), "models": {m: block(items) for m, items in by_model.items()},
            "not_modelled": reasons}


def to_json(outcomes: list[Outcome], beside: dict | None = None) -> dict:
    """Every row (its id, what was measured, the prediction or null with the reason) and the summary."""
    rows = []
    for o in outcomes:
        r = o.row
        extra = {}
        if beside is not None:
            b = beside.get(r.id, (None, None, "no prediction"))
            extra = {"beside_ttft_ms": b[0], "beside_tpot_ms": b[1], "beside_error": b[2] or None}
        rows.append({**extra, "id": r.id, "model": r.model_path, "precision": r.precision or "bf16", "tp": r.tp, "isl": r.isl,
                     "osl": r.osl, "concurrency": r.concurrency, "protocol": protocol(r),
                     "measured_ttft_ms": r.ttft_ms, "measured_tpot_ms": r.tpot_ms,
                     "predicted_ttft_ms": o.predicted_ttft_ms, "predicted_tpot_ms": o.predicted_tpot_ms,
                     "ttft_error": o.ttft_error, "tpot_error": o.tpot_error, "reason": o.reason, "notes": o.notes})
    return {"rows": rows, "summary": summary(outcomes, beside)}


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


def render(outcomes: list[Outcome], path: str, beside: dict | None = None) -> str:
    """The text report: a line per row, then |error| per model and overall (and the other predictor's, on the same
    rows), then the rows not modelled."""
    s = summary(outcomes, beside)
    ov = s["overall"]
    lines = [f"simkv validate --silicon {path}: {ov['rows']} rows, {ov['modelled']} modelled "
             f"({100 * ov['modelled'] / ov['rows']:.1f} %), {ov['rows'] - ov['modelled']} not",
             f"  {'model':<26} {'prec':>5} {'tp':>2} {'isl/osl':>10} {'C':>4}  {'TTFT ms':>9} {'simkv':>9} {'error':>8}  "
             f"{'TPOT ms':>8} {'simkv':>8} {'error':>8}"]
    for o in outcomes:
        r = o.row
        head = (f"  {r.model_path[-26:]:<26} {r.precision or 'bf16':>5} {r.tp:>2} {f'{r.isl}/{r.osl}':>10} "
                f"{r.concurrency:>4}  {r.ttft_ms:>9.1f}")
        if o.reason is not None:
            lines.append(f"{head} {'':>9} {'':>8}  {r.tpot_ms:>8.2f}   not modelled")
            continue
        lines.append(f"{head} {o.predicted_ttft_ms:>9.1f} {100 * o.ttft_error:>+7.1f}%  {r.tpot_ms:>8.2f} "
                     f"{o.predicted_tpot_ms:>8.2f} {100 * o.tpot_error:>+7.1f}%")
    lines.append(f"  {'|error|':<34} {'modelled':>10} {'TTFT median':>12} {'p90':>8} {'TPOT median':>12} {'p90':>8}")
    for name, b in list(s["models"].items()) + [("overall", ov)]:
        lines.append(f"  {name[-34:]:<34} {str(b['modelled']) + ' of ' + str(b['rows']):>10} "
                     f"{_pct(b['ttft_median_abs_error']):>12} {_pct(b['ttft_p90_abs_error']):>8} "
                     f"{_pct(b['tpot_median_abs_error']):>12} {_pct(b['tpot_p90_abs_error']):>8}")
    if beside is not None:
        lines.append(f"  {'beside (the same rows)':<34} {'rows':>10} {'TTFT median':>12} {'p90':>8} {'TPOT median':>12} "
                     f"{'p90':>8}")
        for name, b in list(s["models"].items()) + [("overall", ov)]:
            c = b["beside"]
            lines.append(f"  {name[-34:]:<34} {c['rows']:>10} {_pct(c['ttft_median_abs_error']):>12} "
                         f"{_pct(c['ttft_p90_abs_error']):>8} {_pct(c['tpot_median_abs_error']):>12} "
                         f"{_pct(c['tpot_p90_abs_error']):>8}")
    for reason, n in s["not_modelled"].items():
        lines.append(f"  not modelled ({n} rows): {reason}")
    return "\n".join(lines)


def check_work(rows: list[Row], path: str | Path) -> None:
    """Refuse (one line) rows that together would run for too long: :data:`MAX_SIMULATED_ROWS`,
    :data:`MAX_FILE_TOKENS`; the rows :func:`refusal` turns away cost nothing and do not count."""
    runs = [r for r in rows if refusal(r) is None]
    tokens = sum(request_count(r, protocol(r)) * (r.isl + r.osl) for r in runs)
    if len(runs) > MAX_SIMULATED_ROWS or tokens > MAX_FILE_TOKENS:
        raise ConfigError(f"{path}: {len(runs):,} rows to simulate moving {tokens:,} tokens, more than the "
                          f"{MAX_SIMULATED_ROWS:,} rows and {MAX_FILE_TOKENS:,} tokens one command runs "
                          "(--match TEXT runs a part)")


def _simulate(job):
    row, configs, engine, scheduler = job
    return simulate(row, configs, engine=engine, scheduler=scheduler)


def validate(path: str | Path, configs: str | Path | None = None, *, match: str | None = None, workers: int = 1,
             engine: str = "fast", scheduler: str = "continuous") -> list[Outcome]:
    """Every row of ``path`` (those whose id contains ``match``), simulated in ``workers`` processes (the outcomes
    do not depend on them: each row is its own deterministic run)."""
    path = Path(path)
    configs = Path(configs) if configs is not None else path.parent / "configs"
    if not 1 <= workers <= 64:
        raise ConfigError(f"--workers must be in 1..64, got {workers}")
    rows = read_rows(path)
    if not configs.is_dir():
        raise ConfigError(f"no configs folder {configs} (the model configs the rows name; give --configs DIR)")
    if match:
        rows = [r for r in rows if match in r.id]
        if not rows:
            raise ConfigError(f"no row of {path} has {match!r} in its id")
    check_work(rows, path)
    jobs = [(r, configs, engine, scheduler) for r in rows]
    if workers == 1 or len(rows) == 1:
        return [_simulate(j) for j in jobs]
    from concurrent.futures import ProcessPoolExecutor

    # the longest rows first, so that the workers end together; the results in the file's order
    order = sorted(range(len(jobs)), key=lambda i: -rows[i].concurrency * (rows[i].isl + rows[i].osl))
    with ProcessPoolExecutor(workers) as ex:
        done = dict(zip(order, ex.map(_simulate, [jobs[i] for i in order])))
    return [done[i] for i in range(len(jobs))]


def cli_main(args) -> int:
    """``simkv validate --silicon``: the report (text, or ``--json``); exit 0 whatever the errors (a measurement,
    not a pass/fail check)."""
    import json
    import sys

    beside = read_beside(args.beside) if args.beside else None
    outcomes = validate(args.silicon, args.configs, match=args.match, workers=args.workers,
                        scheduler="vllm" if args.vllm_scheduler else "continuous")
    if args.json:
        json.dump(to_json(outcomes, beside), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(render(outcomes, args.silicon, beside))
    return 0

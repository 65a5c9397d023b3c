"""What each row of ``simkv validate --silicon`` ran, each fact with where it is written: which checkpoint its
benchmark served and how its vLLM server was started. The mechanism that reads the rows, decides which benchmark
took each, refuses, simulates and reports is :mod:`simkv.validate.silicon`; it imports this module, never the reverse.

In this file, in order: the row both files read (:class:`Row`: here, below silicon.py, so that the import runs one
way); which checkpoint a row ran — the stored formats of each ``precision`` column (:data:`PRECISION_FORMATS`) and
the quantized checkpoints the benchmarks served in place of a model's own (:data:`SERVED`; the rule that picks one
is :func:`simkv.validate.silicon.resolve_checkpoint`); what each vLLM release does where ``vllm serve`` is not told
(:data:`VLLM_DEFAULTS`) and the KV cache's precision that follows (:func:`kv_cache_precision`); how each row's server
was started (:class:`Recipe`, :data:`RECIPES`) and the lookup that picks a row's recipe (:func:`recipe_for`).
Sources: InferenceX's scripts at the commits of the rows' images and measured dates, vLLM's wheels, AIConfigurator's
generated benchmark (docs/research/latency-facts.md §1, §2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simkv.errors import ConfigError


@dataclass
class Row:
    """One measured benchmark: a row of the silicon CSV (:data:`simkv.validate.silicon.COLUMNS`) as
    :func:`simkv.validate.silicon.read_rows` reads it; ``precision`` empty is the model's bf16, ``concurrency`` is
    the benchmark's clients (``batch_size``, times ``attention_dp_size`` on AIConfigurator's attention-DP rows,
    which hold one rank's), ``source`` is ``silicon_data_source``."""

    id: str
    model_path: str
    precision: str
    system: str
    mode: str
    isl: int
    osl: int
    concurrency: int
    tp: int
    pp: int
    attention_dp: int
    moe_tp: int
    moe_ep: int
    ttft_ms: float
    tpot_ms: float
    source: str
    backend: str = "vllm"
    backend_version: str = ""


@dataclass(frozen=True)
class Served:
    """A quantized checkpoint a benchmark served in place of the model's own (``checkpoint``), and where that is
    written; ``stand_in``: the config read for it where AIConfigurator ships none of it but one of a checkpoint of
    the same shape and format."""

    checkpoint: str
    source: str
    stand_in: str | None = None


#: A row's ``precision`` column → the stored formats (simkv.weights' names) a checkpoint at that precision has. The
#: column names the weights' bits, not the scale layout: fp4 rows of gpt-oss-120b say ``nvfp4`` in
#: ``gemm_quant_mode`` where its checkpoint is mxfp4 (its ``quantization_config``); ``gemm_quant_mode`` /
#: ``moe_quant_mode`` restate the column in every shipped row (fp8/fp8, nvfp4/nvfp4, int4_wo/int4_wo) and decide
#: nothing more. ``int4`` is any int4 layout (Kimi-K2.5's compressed-tensors int4, group 32).
PRECISION_FORMATS = {"": ("bf16", "f16"), "fp8": ("fp8", "fp8-block"), "fp4": ("mxfp4", "nvfp4"), "int4": ("int4",)}

#: The repository of the InferenceX scripts and configurations the sources below cite.
_IX = "SemiAnalysisAI/InferenceX "
#: The rows whose model's own checkpoint is not stored at the row's precision: which checkpoint their benchmark
#: served instead (each from the benchmark's own configuration).
SERVED: dict[tuple[str, str], Served] = {
    ("MiniMaxAI/MiniMax-M2.5", "fp4"): Served(
        "nvidia/MiniMax-M2.5-NVFP4", _IX + "@ 09f7769f .github/configs/nvidia-master.yaml: minimaxm2.5-fp4-b200-vllm "
        "and minimaxm2.5-fp4-b300-vllm, model nvidia/MiniMax-M2.5-NVFP4"),
    ("moonshotai/Kimi-K2.5", "fp4"): Served(
        "nvidia/Kimi-K2.5-NVFP4", _IX + "@ 09f7769f .github/configs/nvidia-master.yaml: kimik2.5-fp4-b200-vllm and "
        "kimik2.5-fp4-b300-vllm, model nvidia/Kimi-K2.5-NVFP4"),
    ("meta-llama/Llama-3.1-70B", "fp4"): Served(
        "nvidia/Llama-3.3-70B-Instruct-FP4", _IX + "@ 9596d23d7 (the rows' measured=2025-10-29) "
        ".github/workflows/70b-tmpl.yml bmk-b200-fp4: model nvidia/Llama-3.3-70B-Instruct-FP4"),
    ("meta-llama/Llama-3.1-70B", "fp8"): Served(
        "nvidia/Llama-3.3-70B-Instruct-FP8", _IX + "@ 9596d23d7 .github/workflows/70b-tmpl.yml bmk-h100-fp8 (and the "
        "H200, B200 jobs): model nvidia/Llama-3.3-70B-Instruct-FP8; aiconfigurator-core ships no config of it but "
        "that of nvidia/Llama-3.1-70B-Instruct-FP8: the same shape (80 layers, 64/8 heads x 128, hidden 8192, MLP "
        "28672, vocab 128256) and the same ModelOpt FP8 per-tensor format, lm_head excluded",
        stand_in="nvidia--Llama-3.1-70B-Instruct-FP8_config.json"),
    ("Qwen/Qwen3-32B", "fp8"): Served(
        "Qwen/Qwen3-32B-FP8", "aiconfigurator's own rows name no checkpoint (docs/research/latency-facts.md section "
        "1); Qwen's own fp8 release (fp8, weight_block_size [128, 128])"),
}


@dataclass(frozen=True)
class VllmDefaults:
    """What a vLLM release does where ``vllm serve`` is not told, read in that release's wheel from PyPI
    (``pip download vllm==X --no-deps``; docs/research/latency-facts.md §1)."""

    #: ``SchedulerConfig.async_scheduling`` unset: False in 0.10.2-0.12.0 (the field defaults to False); from 0.15.1
    #: it defaults to None, which ``VllmConfig.__post_init__`` turns into True unless speculative decoding of a
    #: kind it cannot run ahead, ``disable_padded_drafter_batch`` or an executor other than mp / uni /
    #: external_launcher (ray) says otherwise — none of which a recipe here sets (a single node's TP runs "mp", TP 1
    #: "uni": ``ParallelConfig.__post_init__``).
    async_scheduling: bool
    #: ``--kv-cache-dtype auto`` takes the checkpoint's KV format (simkv.models.vllm_kv_precision): True from 0.15.1
    #: (``EngineArgs.create_engine_config`` → vllm/utils/torch_utils.py ``resolve_kv_cache_dtype_string``); False
    #: where auto is the model's dtype whatever the checkpoint says; None: not read (a recipe on "auto" whose
    #: checkpoint asks for a KV format is then refused, not guessed).
    kv_auto_reads_checkpoint: bool | None
    source: str


_READ_ASYNC_OFF = "config/scheduler.py SchedulerConfig: async_scheduling: bool = False"
_READ_ASYNC_ON = ("config/scheduler.py SchedulerConfig: async_scheduling default None; config/vllm.py "
                  "VllmConfig.__post_init__: None -> True (no speculative decoding, executor mp/uni)")
_READ_KV = "engine/arg_utils.py create_engine_config -> utils/torch_utils.py resolve_kv_cache_dtype_string"
#: The vLLM releases the rows ran (their ``backend_version``, or the image their recipe names), each read in its wheel.
VLLM_DEFAULTS: dict[str, VllmDefaults] = {
    "0.10.2": VllmDefaults(False, False, _READ_ASYNC_OFF + "; auto: the model dtype (no resolve_kv_cache_dtype_string, "
                           "no kv_cache_scheme in attention/layer.py)"),
    "0.11.2": VllmDefaults(False, False, _READ_ASYNC_OFF + " (config/vllm.py: \"we won't reach here until async "
                           "scheduling is enabled by default\"); auto: the model dtype (as 0.10.2)"),
    "0.12.0": VllmDefaults(False, None, _READ_ASYNC_OFF + "; auto: not read"),
    "0.15.1": VllmDefaults(True, True, _READ_ASYNC_ON + "; " + _READ_KV),
    "0.16.0": VllmDefaults(True, True, _READ_ASYNC_ON + "; " + _READ_KV),
    "0.17.0": VllmDefaults(True, True, _READ_ASYNC_ON + "; " + _READ_KV),
    "0.18.0": VllmDefaults(True, True, _READ_ASYNC_ON + "; " + _READ_KV),
    "0.19.0": VllmDefaults(True, True, _READ_ASYNC_ON + " (0.19.0 asks the executor class: MultiprocExecutor and "
                           "UniProcExecutor.supports_async_scheduling -> True); " + _READ_KV),
}
#: vLLM's KV block on CUDA where ``--block-size`` is not given: ``CacheConfig.DEFAULT_BLOCK_SIZE = 16`` (config/cache.py,
#: 0.18.0 and 0.19.0; platforms/cuda.py ``check_and_update_config``: None -> 16 in 0.10.2-0.17.0). From 0.18.0
#: ``Platform.update_block_size_for_backend`` keeps it where the attention backend supports 16 (FlashAttention:
#: multiples of 16, FlashInfer: 16/32/64); the MLA backends' 32/64/128 are not modelled.
VLLM_BLOCK_SIZE = 16


@dataclass(frozen=True)
class Recipe:
    """How a row's server was started: vLLM's batch limits, memory fraction, KV-cache dtype and block size."""

    max_num_seqs: int | None  # None: the concurrency (``--max-num-seqs=$CONC``)
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    #: ``--kv-cache-dtype``; "auto" (vLLM's default, where the script passes none): :func:`kv_cache_precision`
    kv_cache_dtype: str = "auto"
    source: str = ""
    #: ``--async-scheduling`` (a closed loop's next request waits for two steps in flight: simkv.serving.closed_loop);
    #: None where the script passes no flag: the version's default (:data:`VLLM_DEFAULTS`, set by :meth:`for_row`)
    async_scheduling: bool | None = None
    #: ``compilation_config.max_cudagraph_capture_size`` (None: vLLM's default, ``min(2 · max_num_seqs, 512)``);
    #: the capture sizes a step is padded to (simkv.cost.cudagraphs). Every recipe runs CUDA graphs (FULL_AND_PIECEWISE
    #: by default, MiniMax PIECEWISE: both pad alike).
    max_cudagraph_capture_size: int | None = None
    #: ``--max-num-batched-tokens "$((ISL * 2))"``: the token budget as a multiple of the row's input length (the
    #: script's ``ISL``); 0: the fixed ``max_num_batched_tokens``.
    batched_tokens_per_isl: int = 0
    #: ``--block-size`` (tokens per KV block): vLLM's CUDA default where the script passes none
    block_size: int = VLLM_BLOCK_SIZE
    #: the vLLM release the script's image ran, where the rows' ``backend_version`` does not name it ("": unknown)
    vllm_version: str = ""
    #: The script reads InferenceX's ``dp-attn`` flag (``DP_ATTENTION``) and then launches vLLM data parallelism,
    #: ``--tensor-parallel-size=1 --data-parallel-size=$TP --enable-expert-parallel`` (minimaxm2.5_fp4_b200.sh from
    #: a9c199207, minimaxm2.5_fp4_b300.sh from b0308eda6). False: the script never reads the flag and a row labelled
    #: ``dp-attn`` ran one engine at ``--tensor-parallel-size=$TP`` with ``--enable-expert-parallel``
    #: (docs/research/vllm-dp.md §2).
    data_parallel_attention: bool = False

    def for_row(self, row: Row) -> Recipe:
        """The recipe as the row's server ran it: its vLLM version (the row's ``backend_version``, else the
        recipe's image), that version's async-scheduling default where the script passes no flag (None where the
        version is not read), and the token budget where the script derives it from the ISL."""
        version = row.backend_version or self.vllm_version
        out = {}
        if version != self.vllm_version:
            out["vllm_version"] = version
        if self.async_scheduling is None and version in VLLM_DEFAULTS:
            out["async_scheduling"] = VLLM_DEFAULTS[version].async_scheduling
        if self.batched_tokens_per_isl:
            out["max_num_batched_tokens"] = self.batched_tokens_per_isl * row.isl
        return replace(self, **out) if out else self


def kv_cache_precision(recipe: Recipe, model) -> str:
    """The KV cache's precision: the recipe's ``--kv-cache-dtype``, or for "auto" what the recipe's vLLM makes of it
    for this checkpoint (:data:`VLLM_DEFAULTS`: from 0.15.1 the checkpoint's KV format, e.g. the fp8 of an NVFP4
    checkpoint's ``kv_cache_scheme``; simkv.models.vllm_kv_precision). A checkpoint that asks for no KV format gets
    the model's dtype in every version. :class:`ConfigError` where the version's rule is not read."""
    from simkv.models import vllm_kv_precision

    if recipe.kv_cache_dtype != "auto":
        return recipe.kv_cache_dtype
    if not model.vllm_kv_dtype:
        return vllm_kv_precision(model)
    defaults = VLLM_DEFAULTS.get(recipe.vllm_version)
    if defaults is None or defaults.kv_auto_reads_checkpoint is None:
        raise ConfigError(f"the checkpoint asks vLLM for a {model.vllm_kv_dtype} KV cache; what vLLM "
                          f"{recipe.vllm_version or '(unversioned)'} makes of --kv-cache-dtype auto for it is not read")
    return vllm_kv_precision(model if defaults.kv_auto_reads_checkpoint else replace(model, vllm_kv_dtype=""))


#: vLLM >= 0.15 turns async scheduling on unless told otherwise; 0.10.2-0.12 needs the flag (:data:`VLLM_DEFAULTS`).
_ASYNC_DEFAULT = "async scheduling: the version's default (VLLM_DEFAULTS)"
#: vLLM's batch defaults for ``vllm serve`` on a GPU of >= 70 GiB that is not an A100 (engine/arg_utils.py
#: get_batch_defaults, read in 0.12.0 and 0.15.1): 8192 tokens, 1024 sequences; H100, H200, B200 and B300 all qualify.
_SERVE_DEFAULT_SEQS = 1024
ANY = "*"
#: How the server of each row was started, keyed (model_path, precision, system, backend_version), ANY matching all
#: (:func:`recipe_for`; model_path ``aic`` for AIConfigurator's own rows). The InferenceX recipes are the script its
#: workflow ran for the row's config at the commit of the row's image and measured date (docs/research/latency-facts.md
#: §1, "The H200, B200 and B300 rows"); AIConfigurator's rows run vLLM 0.12.0's defaults (§2).
RECIPES: dict[tuple[str, str, str, str], Recipe] = {
    # ---- H100 (docs/research/latency-facts.md §1)
    ("openai/gpt-oss-120b", ANY, "h100_sxm", ANY): Recipe(
        None, 8192, 0.9, "auto", _IX + "benchmarks/gptoss_fp4_h100.sh: --max-num-seqs=$CONC, "
        "max-num-batched-tokens 8192, --gpu-memory-utilization=0.9, async-scheduling, prefix "
        "caching off, max-cudagraph-capture-size 2048", async_scheduling=True,
        max_cudagraph_capture_size=2048),
    ("meta-llama/Llama-3.1-70B", ANY, "h100_sxm", ANY): Recipe(
        None, 8192, 0.9, "fp8", _IX + "@ 9596d23d7 (measured 2025-10-29), "
        "benchmarks/70b_fp8_h100_{slurm,docker}.sh on vllm/vllm-openai:v0.10.2: "
        "kv-cache-dtype fp8, --max-num-seqs=$CONC, max-num-batched-tokens 8192, 0.9, "
        "async-scheduling, prefix caching off; vLLM 0.10.2 stores it at 1 B per element "
        "(FlashAttention 3 on SM90; STR_DTYPE_TO_TORCH_DTYPE fp8 -> uint8, "
        "AttentionSpec.page_size_bytes; latency-facts.md section 11)",
        async_scheduling=True, vllm_version="0.10.2"),
    ("MiniMaxAI/MiniMax-M2.5", ANY, "h100_sxm", ANY): Recipe(
        256, 8192, 0.9, "auto", _IX + "benchmarks/single_node/fixed_seq_len/"
        "minimaxm2.5_fp8_h100.sh: --max-num-seqs 256, --gpu-memory-utilization 0.90, "
        "prefix caching off, cudagraph_mode PIECEWISE; max_num_batched_tokens: vLLM's "
        "H100 default; the rows' image v0.18.0: " + _ASYNC_DEFAULT),
    ("aic", ANY, "h100_sxm", ANY): Recipe(
        1024, 8192, 0.9, "auto", "vLLM 0.12.0 defaults on an H100 (engine/arg_utils.py get_batch_defaults: "
        "8192 tokens, 1024 sequences for vllm serve on >= 70 GiB; config/cache.py: 0.9); " + _ASYNC_DEFAULT, vllm_version="0.12.0"),
    # ---- H200
    ("aic", ANY, "h200_sxm", ANY): Recipe(
        _SERVE_DEFAULT_SEQS, 8192, 0.9, "auto", "vLLM 0.12.0 defaults on an H200 (engine/arg_utils.py "
        "get_batch_defaults: 141 GB >= 70 GiB and not an A100: 8192 tokens, 1024 sequences for vllm serve; "
        "config/cache.py: 0.9); " + _ASYNC_DEFAULT, vllm_version="0.12.0"),
    ("openai/gpt-oss-120b", "fp4", "h200_sxm", "0.18.0"): Recipe(
        None, 8192, 0.9, "auto", _IX + "benchmarks/single_node/gptoss_fp4_h200.sh @ cec542a9a (image v0.18.0): "
        "--max-num-seqs $CONC, max-num-batched-tokens 8192, 0.9, prefix caching off, max-cudagraph-capture-size "
        "2048, VLLM_MXFP4_USE_MARLIN=1; " + _ASYNC_DEFAULT, max_cudagraph_capture_size=2048),
    ("openai/gpt-oss-120b", "fp4", "h200_sxm", ""): Recipe(
        None, 8192, 0.9, "auto", _IX + "benchmarks/gptoss_fp4_h200_slurm.sh @ e06929c70 (measured 2025-11-02; "
        "gptoss-tmpl.yml: vllm/vllm-openai:v0.10.2): --max-num-seqs $CONC, max-num-batched-tokens 8192, 0.9, "
        "async-scheduling, prefix caching off, cuda-graph-sizes 2048", async_scheduling=True, vllm_version="0.10.2",
        max_cudagraph_capture_size=2048),
    ("meta-llama/Llama-3.1-70B", "fp8", "h200_sxm", ""): Recipe(
        None, 8192, 0.9, "fp8", _IX + "benchmarks/70b_fp8_h200_slurm.sh @ 9596d23d7 (measured 2025-10-29; "
        "70b-tmpl.yml: vllm/vllm-openai:v0.10.2, nvidia/Llama-3.3-70B-Instruct-FP8): kv-cache-dtype fp8, "
        "--max-num-seqs $CONC, max-num-batched-tokens 8192, 0.9, async-scheduling, prefix caching off",
        async_scheduling=True, vllm_version="0.10.2"),
    ("MiniMaxAI/MiniMax-M2.5", "fp8", "h200_sxm", "0.16.0"): Recipe(
        _SERVE_DEFAULT_SEQS, 8192, 0.95, "auto", _IX + "benchmarks/single_node/minimaxm2.5_fp8_h200.sh @ "
        "a36346339 (image v0.16.0): --gpu-memory-utilization 0.95; max-num-seqs, max-num-batched-tokens, "
        "cudagraphs: vLLM's defaults; " + _ASYNC_DEFAULT),
    ("MiniMaxAI/MiniMax-M2.5", "fp8", "h200_sxm", "0.18.0"): Recipe(
        _SERVE_DEFAULT_SEQS, 8192, 0.95, "auto", _IX + "benchmarks/single_node/minimaxm2.5_fp8_h200.sh @ "
        "1d5cae141..626932a11 (image v0.18.0): --gpu-memory-utilization 0.95, --enable-expert-parallel when "
        "EP_SIZE >= 1, prefix caching off from 626932a11; max-num-seqs, max-num-batched-tokens, cudagraphs: "
        "vLLM's defaults; " + _ASYNC_DEFAULT),
    ("moonshotai/Kimi-K2.5", "int4", "h200_sxm", "0.16.0"): Recipe(
        None, 8192, 0.95, "auto", _IX + "benchmarks/single_node/kimik2.5_int4_h200.sh @ 749096c4c..79a42e20a "
        "(image v0.16.0): --max-num-seqs $CONC, --gpu-memory-utilization 0.95, pass_config.fuse_allreduce_rms; "
        "max-num-batched-tokens, cudagraphs: vLLM's defaults; " + _ASYNC_DEFAULT),
    # ---- B200
    ("openai/gpt-oss-120b", "fp4", "b200_sxm", "0.15.1"): Recipe(
        512, 8192, 0.9, "fp8", _IX + "benchmarks/single_node/gptoss_fp4_b200.sh @ d2c2acb19 (image v0.15.1): "
        "kv-cache-dtype fp8, --max-num-seqs 512, max-num-batched-tokens 8192, 0.9, prefix caching off, "
        "max-cudagraph-capture-size 2048, VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1, fuse_allreduce_rms; "
        + _ASYNC_DEFAULT, max_cudagraph_capture_size=2048),
    ("openai/gpt-oss-120b", "fp4", "b200_sxm", ""): Recipe(
        512, 8192, 0.9, "auto", _IX + "benchmarks/gptoss_fp4_b200_docker.sh @ e06929c70 (measured 2025-11-02; "
        "gptoss-tmpl.yml: vllm/vllm-openai:v0.10.2): --max-num-seqs 512, max-num-batched-tokens 8192, 0.9, "
        "async-scheduling, prefix caching off, cuda-graph-sizes 2048, FULL_AND_PIECEWISE, "
        "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1", async_scheduling=True, vllm_version="0.10.2",
        max_cudagraph_capture_size=2048),
    ("meta-llama/Llama-3.1-70B", "fp8", "b200_sxm", ""): Recipe(
        512, 8192, 0.9, "fp8", _IX + "benchmarks/70b_fp8_b200_docker.sh @ 9596d23d7 (measured 2025-10-29; "
        "70b-tmpl.yml: vllm/vllm-openai:v0.10.2, nvidia/Llama-3.3-70B-Instruct-FP8): kv-cache-dtype fp8, "
        "--max-num-seqs 512, max-num-batched-tokens 8192, 0.9, async-scheduling, prefix caching off, "
        "cudagraph_mode FULL_DECODE_ONLY", async_scheduling=True, vllm_version="0.10.2"),
    ("meta-llama/Llama-3.1-70B", "fp4", "b200_sxm", ""): Recipe(
        512, 8192, 0.9, "fp8", _IX + "benchmarks/70b_fp4_b200_docker.sh @ 9596d23d7 (measured 2025-10-29; "
        "70b-tmpl.yml: vllm/vllm-openai:v0.10.2, nvidia/Llama-3.3-70B-Instruct-FP4): kv-cache-dtype fp8, "
        "--max-num-seqs 512, max-num-batched-tokens 8192, 0.9, async-scheduling, prefix caching off, "
        "cudagraph_mode FULL_DECODE_ONLY", async_scheduling=True, vllm_version="0.10.2"),
    ("MiniMaxAI/MiniMax-M2.5", "fp8", "b200_sxm", "0.17.0"): Recipe(
        _SERVE_DEFAULT_SEQS, 8192, 0.95, "auto", _IX + "benchmarks/single_node/minimaxm2.5_fp8_b200.sh @ "
        "f342df18e..626932a11 (image v0.17.0-cu130): --gpu-memory-utilization 0.95, --block-size 32, "
        "VLLM_USE_FLASHINFER_MOE_FP8=0, VLLM_MOE_USE_DEEP_GEMM=0, --enable-expert-parallel when EP_SIZE >= 1; "
        "max-num-seqs, max-num-batched-tokens, cudagraphs: vLLM's defaults; " + _ASYNC_DEFAULT, block_size=32),
    ("MiniMaxAI/MiniMax-M2.5", "fp8", "b200_sxm", "0.19.0"): Recipe(
        _SERVE_DEFAULT_SEQS, 8192, 0.9, "fp8", _IX + "benchmarks/single_node/minimaxm2.5_fp8_b200.sh @ "
        "bddbf4031..8c3eb5b86 (image v0.19.0-cu130): --gpu-memory-utilization 0.90, --block-size 32, "
        "--kv-cache-dtype fp8, --max-cudagraph-capture-size 2048, --max-num-batched-tokens $((ISL * 2)), "
        "--stream-interval 20, prefix caching off, --enable-expert-parallel when EP_SIZE > 1; max-num-seqs: "
        "vLLM's default; " + _ASYNC_DEFAULT, max_cudagraph_capture_size=2048,
        batched_tokens_per_isl=2, block_size=32),
    ("MiniMaxAI/MiniMax-M2.5", "fp4", "b200_sxm", "0.19.0"): Recipe(
        _SERVE_DEFAULT_SEQS, 8192, 0.9, "fp8", _IX + "benchmarks/single_node/minimaxm2.5_fp4_b200.sh @ "
        "79bd988e9..8c3eb5b86 (image v0.19.0-cu130, nvidia/MiniMax-M2.5-NVFP4): --gpu-memory-utilization 0.90, "
        "--kv-cache-dtype fp8, --max-cudagraph-capture-size 2048, --max-num-batched-tokens $((ISL * 2)), "
        "--stream-interval 20, prefix caching off, EP / attention DP per config (from a9c199207: DP_ATTENTION -> "
        "--tensor-parallel-size=1 --data-parallel-size=$TP --enable-expert-parallel); max-num-seqs: vLLM's default; "
        + _ASYNC_DEFAULT, max_cudagraph_capture_size=2048, batched_tokens_per_isl=2, data_parallel_attention=True),
    ("moonshotai/Kimi-K2.5", "int4", "b200_sxm", "0.15.1"): Recipe(
        None, 8192, 0.95, "auto", _IX + "benchmarks/single_node/kimik2.5_int4_b200.sh @ eb02101ef..1cb92d21d "
        "(image v0.15.1): --max-num-seqs $CONC, --gpu-memory-utilization 0.95, fuse_allreduce_rms, "
        "VLLM_USE_FLASHINFER_MOE_INT4=1 from 79ea3651a; max-num-batched-tokens, cudagraphs: vLLM's defaults; "
        + _ASYNC_DEFAULT),
    ("moonshotai/Kimi-K2.5", "fp4", "b200_sxm", "0.17.0"): Recipe(
        None, 8192, 0.9, "auto", _IX + "benchmarks/single_node/kimik2.5_fp4_b200.sh @ a58dedd5a..626932a11 "
        "(image v0.17.0, nvidia/Kimi-K2.5-NVFP4): --max-num-seqs $CONC, --gpu-memory-utilization 0.90, "
        "fuse_allreduce_rms; max-num-batched-tokens, cudagraphs: vLLM's defaults; " + _ASYNC_DEFAULT
        + " (6c3acebfa, 2026-04-20, adds kv-cache-dtype fp8, capture 2048, ISL * 2 tokens: not these rows')"),
    # ---- B300
    ("MiniMaxAI/MiniMax-M2.5", "fp8", "b300_sxm", "0.19.0"): Recipe(
        _SERVE_DEFAULT_SEQS, 8192, 0.9, "fp8", _IX + "benchmarks/single_node/minimaxm2.5_fp8_b300.sh @ "
        "340d7854c..77b259a5e (image v0.19.0-cu130): as minimaxm2.5_fp8_b200.sh at v0.19.0",
        max_cudagraph_capture_size=2048, batched_tokens_per_isl=2, block_size=32),
    ("MiniMaxAI/MiniMax-M2.5", "fp4", "b300_sxm", "0.19.0"): Recipe(
        _SERVE_DEFAULT_SEQS, 8192, 0.9, "fp8", _IX + "benchmarks/single_node/minimaxm2.5_fp4_b300.sh @ "
        "22d0f12f7..77b259a5e (image v0.19.0-cu130): as minimaxm2.5_fp4_b200.sh at v0.19.0 (DP_ATTENTION from "
        "its first version, b0308eda6)", max_cudagraph_capture_size=2048, batched_tokens_per_isl=2,
        data_parallel_attention=True),
    ("moonshotai/Kimi-K2.5", "fp4", "b300_sxm", "0.19.0"): Recipe(
        None, 8192, 0.9, "auto", _IX + "benchmarks/single_node/kimik2.5_fp4_b300.sh @ f34a83b25 (image "
        "v0.19.0-cu130): --max-num-seqs $CONC, --gpu-memory-utilization 0.90, fuse_allreduce_rms, prefix caching "
        "off; max-num-batched-tokens, cudagraphs: vLLM's defaults; " + _ASYNC_DEFAULT),
}


def recipe_for(row: Row, proto: str) -> Recipe | None:
    """The recipe of the row's server (:data:`RECIPES`: the most specific key that matches), or None."""
    model = "aic" if proto == "aic" else row.model_path
    for key in ((model, row.precision, row.system, row.backend_version), (model, row.precision, row.system, ANY),
                (model, ANY, row.system, ANY)):
        if key in RECIPES:
            return RECIPES[key].for_row(row)
    return None

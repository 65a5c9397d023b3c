"""The configuration of paged serving: OpenVINO GenAI's ``SchedulerConfig`` fields and simkv's extensions."""

from __future__ import annotations

from dataclasses import dataclass

from simkv.serving.sched.eviction import CacheEviction


#: The fields of GenAI's ``SchedulerConfig`` that simkv models, by GenAI's names and in this order
#: (``openvino_genai.SchedulerConfig``; ``src/cpp/include/openvino/genai/scheduler_config.hpp``).
GENAI_FIELDS = ("num_kv_blocks", "cache_size", "max_num_batched_tokens", "max_num_seqs", "dynamic_split_fuse",
                "enable_prefix_caching")

#: The fields only ``scheduler="vllm"`` reads (left out of a GenAI run's summary).
VLLM_FIELDS = ("scheduler", "gpu_memory_utilization", "long_prefill_token_threshold", "scheduling_policy")


@dataclass
class SchedulerConfig:
    """OpenVINO GenAI's ``SchedulerConfig`` (its field names and defaults), and simkv's extensions.

    The one scheduler configuration of the paged serving model (``ServingSpec.paged``) and of
    ``simkv validate --paged``, which hands the GenAI fields to the real pipeline (:meth:`genai`).
    """

    #: simkv extension: tokens per block. GenAI takes the block size from the device plugin (32 on CPU,
    #: 16 on GPU), not from its SchedulerConfig.
    block_size: int = 32
    # GenAI's SchedulerConfig (GENAI_FIELDS): num_kv_blocks = cache_size = 0 is the dynamic pool.
    num_kv_blocks: int = 0
    #: Pool size in GiB. GenAI takes whole GB (an integer); the simulator also takes a fraction.
    cache_size: float = 0.0
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 256
    dynamic_split_fuse: bool = True
    enable_prefix_caching: bool = False
    #: simkv extension: what happens when a sequence needs a block and none is free: "preempt" (GenAI),
    #: "wait" (the sequence skips steps until blocks free up) or "reject" (it is dropped).
    on_oom: str = "preempt"
    #: simkv extension: the CPU plugin allocates and frees 2·L scratch buffers of the new pool tensors' sizes
    #: at every pool (re)allocation (measured by ``simkv validate --paged``): the in-step peak is twice the pool.
    transient_buffers: bool = True
    #: simkv extension: the KV-cache manager (simkv.serving.kv.groups): "genai" (one block spans every
    #: attention layer, windows keep every block, linear-attention state in a pool of its own, MLA decompressed)
    #: or "vllm" (vLLM's hybrid manager: a block table per group of layers, windows and chunks free blocks, MLA as
    #: its latent, a Mamba state block per running request). The scheduling rules stay GenAI's.
    kv_manager: str = "genai"
    #: GenAI's cache eviction (``use_cache_eviction`` with its ``CacheEvictionConfig``): None is off
    #: (simkv.serving.sched.eviction).
    cache_eviction: CacheEviction | None = None
    #: simkv extension: whose scheduling rules serve: "genai" (:mod:`simkv.serving.sched.genai`) or "vllm" (vLLM V1's
    #: ``Scheduler`` and ``KVCacheManager``, :mod:`simkv.serving.sched.vllm`; always vLLM's KV manager). The fields
    #: below are vLLM's (``CacheConfig`` / ``SchedulerConfig``) and are read only under "vllm".
    scheduler: str = "genai"
    gpu_memory_utilization: float = 0.9
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"
    #: simkv extension: the batch sizes the engine replays CUDA graphs for (vLLM V1's capture sizes,
    #: :func:`simkv.cost.cudagraphs.capture_sizes`); a step's layers run over its tokens padded to the smallest
    #: that holds them (:func:`simkv.cost.cudagraphs.padded_tokens`). Empty (the default): no graphs, no padding.
    cudagraph_capture_sizes: tuple[int, ...] = ()

    @property
    def dynamic(self) -> bool:
        """No ``num_kv_blocks`` and no ``cache_size``: the pool is sized and grown by the scheduler."""
        return self.num_kv_blocks == 0 and self.cache_size == 0

    def genai(self) -> dict:
        """The GenAI fields, as ``openvino_genai.SchedulerConfig`` takes them (``cache_size`` an int)."""
        return {name: int(self.cache_size) if name == "cache_size" else getattr(self, name) for name in GENAI_FIELDS}

    def summary(self) -> dict:
        """The ``paged`` object of ``simkv run --json``: every field, the pool size under its older key,
        ``cache_size_gib``."""
        out = {"cache_size_gib" if name == "cache_size" else name: value for name, value in vars(self).items()
               if (self.scheduler == "vllm" or name not in VLLM_FIELDS)
               and (name != "cudagraph_capture_sizes" or value)}
        if self.cudagraph_capture_sizes:
            out["cudagraph_capture_sizes"] = list(self.cudagraph_capture_sizes)
        out["cache_eviction"] = self.cache_eviction.label() if self.cache_eviction is not None else None
        return out

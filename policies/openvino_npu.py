"""OpenVINO on an Intel NPU: GenAI's stateful pipeline over NPUW's ``LLMCompiledModel`` (fixed-shape models).

Read in source (no NPU here; as the GPU plugin was, docs/DESIGN.md §2):

* openvinotoolkit/openvino.genai da1db864: ``src/cpp/src/llm/pipeline_stateful.cpp`` (``StatefulLLMPipeline``:
  on a device named NPU ``m_is_npu`` and ``m_use_full_chat_history``; ``generate``, ``start_chat``,
  ``finish_chat``), ``src/cpp/src/utils.cpp`` (``update_npu_config``: ``NPU_USE_NPUW``, ``NPUW_LLM``,
  ``NPUW_LLM_MAX_PROMPT_LEN`` / ``MIN_RESPONSE_LEN`` from ``MAX_PROMPT_LEN`` 1024 / ``MIN_RESPONSE_LEN`` 128;
  ``get_npu_kv_cache_capacity``), ``src/cpp/src/lm_encoding.cpp`` (generation stops when the history reaches
  that capacity). ``llm/pipeline_static.cpp`` (``StaticLLMPipeline``) is now only the "STATEFUL" kind that
  forwards to this pipeline.
* openvinotoolkit/openvino ``src/plugins/intel_npu/src/plugin/npuw/`` as stored in the code index:
  ``llm_compiled_model.cpp`` (its newest stored version, 125,487 characters, © 2018-2026; the index gives no
  commit: the ``LLMCompiledModel`` constructor, ``reshape_to_static``, ``redirect_new_kv_to_output``,
  ``remove_empty_kv_inputs``, ``create_generate_model_variants``), ``llm_infer_request.cpp`` (newest stored,
  72,467 characters: ``infer``, ``infer_prefill``, ``infer_chunked_prefill``, ``copy_kvcache``,
  ``infer_generate``, ``prepare_for_new_conversation``), ``llm_continuous_kvcache_strategy.cpp`` (6,569
  characters: ``on_initialize``), ``llm_prefix_caching.cpp`` at 092eb533 (``PrefixCacheManager``,
  ``PrefixCachingHelper``), ``llm_block_kvcache_strategy.cpp`` (47,204 characters), and the option defaults in
  ``src/plugins/intel_npu/src/al/include/intel_npu/config/npuw.hpp`` (``DEFINE_OPT``).

What it allocates — per attention layer, K and V alike, f16 (``cvt_kvcache_to_low_precision``; bf16 weights
and KV become f16), ``[1, H_kv, tokens, S]``:

* sizes: ``P = align(MAX_PROMPT_LEN, 64)``, ``R = align(MIN_RESPONSE_LEN, 64)``, ``G`` =
  ``NPUW_LLM_MAX_GENERATION_TOKEN_LEN`` (1; else aligned to 8). With ``NPUW_LLM_PREFILL_HINT`` DYNAMIC (the
  default) and ``0 < NPUW_LLM_PREFILL_CHUNK_SIZE < P`` the prefill is chunked: the chunk ``C`` must be a power
  of two (else "chunk size … is not power of 2") and ``P = align(P, C)``; a chunk of at least ``P`` (the
  defaults: 1024 and 1024) runs one static prefill. ``total = P + R``.
* the generate model's past KV, ``total − G`` tokens (``reshape_to_static(kvcache, G, total)``): the cache
  (``capacity``). Its present output is the new token's KV only, ``G`` tokens (``redirect_new_kv_to_output``).
* the prefill model: chunked, past inputs of ``P − C`` tokens bound to the generate model's past buffer
  (``bind_past_kv`` in ``LLMContinuousKVCacheStrategy::on_initialize``: no memory of their own while both
  models transpose V alike, the default) and a present output of ``C`` tokens; one static prefill has no
  past inputs (``remove_empty_kv_inputs``) and a present output of ``P`` tokens.
* all of it when the infer request is created, before the first inference; nothing grows, nothing is freed
  (simkv books it at the first inference). With ``NPUW_LLM_GENERATE_PYRAMID`` the smaller generate variants
  share the largest's past buffer (not modelled: the default is off).
* the first generate step after a prefill copies the prefill's KV into the generate past
  (``copy_kvcache``): chunked, the tokens of the earlier chunks go through a staging tensor of the prefill
  past's shape (``P − C`` tokens, ``allocMem`` then freed, one per K and V tensor; the plugin runs them in a
  ``parallel_for``, simkv one after another), the last chunk's from the present output; one static prefill
  copies from its present output. Each generated token's KV is copied from the present output into the past
  (``update_kvcache_for``): the token's own write, not booked as a copy.
* GenAI on NPU keeps the *whole* chat history as the prompt (``m_use_full_chat_history``): every turn resets
  and prefills the history again (``infer_prefill`` → ``prepare_for_new_conversation``), chunk by chunk, up
  to ``MAX_PROMPT_LEN`` tokens (GenAI asserts it: "may only process prompts or hold chat history up to");
  generation stops at ``MAX_PROMPT_LEN + MIN_RESPONSE_LEN − 1`` tokens. ``start_chat`` / ``finish_chat``
  only reset; no KV tensor is freed, and the prefix cache outlives them. It never trims (a trim here only
  shortens the history the next turn prefills). Batch 1, greedy or multinomial only (asserted).

Prefix caching (``NPUW_LLM_ENABLE_PREFIX_CACHING``, read only with chunked prefill; block size ``B`` =
``NPUW_LLM_PREFIX_CACHING_BLOCK_SIZE`` 256 unless it does not divide the chunk, then ``C``; at most
``NPUW_LLM_PREFIX_CACHING_MAX_NUM_BLOCKS`` 128 blocks): :class:`PrefixCache`. A block is ``B`` tokens of every
layer's K and V in host tensors of its own (``store_blocks``: ``ov::Tensor`` per output, copied from the
present output), keyed by the hash of its tokens and all before them; only full blocks of full chunks are
stored. A prefill first restores the longest run of cached blocks from the start (``find_cached_blocks``;
at most ``P − C`` tokens, never the whole prompt, cut down to a multiple of ``C``) by copying them into the
past inputs, and computes only the rest: a hit saves whole chunks of prefill compute, not memory.

Not modelled: ``NPUW_LLM_ENABLE_BLOCK_BASED_KV_CACHE`` (``LLMBlockKVCacheStrategy``: blocks of ``C`` tokens
allocated as the history grows, released on reset but for ``ceil(next prompt / C)`` kept warm; needs chunked
prefill and PYRAMID or HFA attention, not with prefix caching) — refused; quantised KV (``kv_cache_precision``
hint), sliding-window and linear-attention caches (NPUW has managers for them) — refused.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from policies.base import Policy, option
from simkv.errors import ConfigError, PolicyError
from simkv.workload import Decode, Prefill, Reset, Trim

PREFILL_HINTS = ("dynamic", "static")


def align_to(value: int, alignment: int) -> int:
    """NPUW's ``align_to``: up to a multiple of a power of two."""
    return (value + alignment - 1) & ~(alignment - 1)


@dataclass(frozen=True)
class NpuStep:
    """What one step does to the NPU pipeline's buffers (:meth:`OpenVINONPU.plan`)."""

    #: A prefill (a prompt or a chat turn): the history the prefill model runs over; 0 otherwise.
    history: int = 0
    #: Prefix-cache blocks restored (copied into the past inputs) before the chunks run, in order.
    restored: tuple[int, ...] = ()
    #: Prefill model calls (chunks), and the tokens of the last one (kept in the present output).
    calls: int = 0
    last_chunk: int = 0
    #: Prefix-cache changes, in order: ("new", key) a block's tensors allocated and filled; ("evict", key) a
    #: cached block freed to make room; ("drop", key) the new block not kept (already cached, or refused).
    stores: tuple[tuple[str, int], ...] = ()
    #: The first generate step after a prefill: tokens copied into the generate past (0: not that step), and
    #: how many of them go through the staging tensor (the earlier chunks').
    copied: int = 0
    staged: int = 0


class PrefixCache:
    """NPUW's prefix cache (``llm_prefix_caching.cpp`` at 092eb533), block by block.

    ``PrefixCacheManager``: a map from block hash to block, each block linked to its parent (the block before
    it) and its children; an *evictable* LRU list. ``put_block`` (only full blocks): already cached → made
    evictable and moved to the front; a parent that is cached is linked and no longer evictable; a parent
    hash that is not cached (``!= 0``) refuses the block; at ``max`` blocks the evictable block at the back is
    evicted first (unlinked from its parent, which becomes evictable without other children) — none: refused.
    ``get_block`` moves a hit to the front of the evictable list and makes it evictable (also one with
    children: the stored version does). A block's hash is its last token's, which hashes every token before
    it; simkv keys a block by its last token's identity (:meth:`OpenVINONPU.plan` numbers every token of the
    history, so equal prefixes have equal keys)."""

    def __init__(self, max_blocks: int) -> None:
        self.max = max_blocks
        self.parent: dict[int, int] = {}
        self.children: dict[int, set[int]] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()  # last = most recently used

    def __contains__(self, key: int) -> bool:
        return key in self.parent

    def _evictable(self, key: int, yes: bool) -> None:
        self.evictable.pop(key, None)
        if yes:
            self.evictable[key] = None

    def get(self, key: int) -> bool:
        if key not in self.parent:
            return False
        self._evictable(key, True)
        return True

    def put(self, key: int, parent: int) -> tuple[bool, int | None]:
        """Store a block: (kept, the key evicted to make room or None)."""
        if key in self.parent:
            self._evictable(key, True)
            return False, None  # already cached: the new copy is dropped
        linked = parent in self.parent
        if linked:
            self.children[parent].add(key)
            self._evictable(parent, False)
        elif parent != 0:
            return False, None
        victim = None
        if len(self.parent) >= self.max:
            if not self.evictable:
                if linked:
                    self.children[parent].discard(key)
                    if not self.children[parent]:
                        self._evictable(parent, True)
                return False, None
            victim = next(iter(self.evictable))
            up = self.parent.pop(victim)
            del self.children[victim]
            del self.evictable[victim]
            if up in self.parent:
                self.children[up].discard(victim)
                if not self.children[up]:
                    self._evictable(up, True)
        self.parent[key] = parent if linked else 0
        self.children[key] = set()
        self._evictable(key, True)
        return True, victim


@dataclass(frozen=True)
class OpenVINONPU(Policy):
    name = "openvino-npu"
    summary = "NPU (GenAI + NPUW): fixed prefill/generate KV tensors, chunked prefill, full-history chat, prefix-cache blocks"
    default_precision = "f16"
    accepted_precisions = ("f16",)  # cvt_kvcache_to_low_precision: f16 unless a kv_cache_precision hint
    unit = "layer"
    npu_pipeline = True

    max_prompt_len: int = option(1024, "MAX_PROMPT_LEN: longest prompt or chat history (GenAI's limit; NPUW aligns "
                                 "it to 64, then to the chunk)")
    min_response_len: int = option(128, "MIN_RESPONSE_LEN: tokens reserved for answers (aligned to 64)")
    prefill_chunk_size: int = option(1024, "NPUW_LLM_PREFILL_CHUNK_SIZE: a power of two; the prefill runs in chunks "
                                     "when it is below the aligned prompt length (0: never)")
    prefill_hint: str = option("dynamic", "NPUW_LLM_PREFILL_HINT: dynamic (chunked prefill) | static (one prefill)")
    max_generation_token_len: int = option(1, "NPUW_LLM_MAX_GENERATION_TOKEN_LEN (aligned to 8 unless 1)")
    prefix_caching: bool = option(False, "NPUW_LLM_ENABLE_PREFIX_CACHING (needs chunked prefill)")
    prefix_block_size: int = option(256, "NPUW_LLM_PREFIX_CACHING_BLOCK_SIZE (the chunk when it does not divide it)")
    prefix_max_blocks: int = option(128, "NPUW_LLM_PREFIX_CACHING_MAX_NUM_BLOCKS")
    block_based_kv_cache: bool = option(False, "NPUW_LLM_ENABLE_BLOCK_BASED_KV_CACHE (not modelled)")
    first_touch: bool = option(False, "resident only once written: not for the NPU (its runtime's tensors count whole)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_prompt_len < 1 or self.min_response_len < 0 or self.max_generation_token_len < 1:
            raise ConfigError("max_prompt_len and max_generation_token_len must be >= 1, min_response_len >= 0")
        if self.prefill_hint not in PREFILL_HINTS:
            raise ConfigError(f"prefill_hint must be dynamic or static, got {self.prefill_hint!r}")
        if self.prefill_chunk_size < 0 or self.prefix_block_size < 1 or self.prefix_max_blocks < 1:
            raise ConfigError("prefill_chunk_size must be >= 0, prefix_block_size and prefix_max_blocks >= 1")
        if self.chunked and self.prefill_chunk_size & (self.prefill_chunk_size - 1):
            raise ConfigError(f"NPUW: chunk size ({self.prefill_chunk_size}) is not power of 2; adjust prefill_chunk_size")
        if self.prefix_caching and not self.chunked:
            raise ConfigError("prefix caching needs chunked prefill (NPUW reads it only then): prefill_hint=dynamic "
                              "and prefill_chunk_size below max_prompt_len")
        if self.first_touch:
            raise ConfigError("openvino-npu: first_touch is not modelled (the NPU runtime's tensors count whole)")
        if self.block_based_kv_cache:
            raise ConfigError("openvino-npu: NPUW_LLM_ENABLE_BLOCK_BASED_KV_CACHE is not modelled "
                              "(docs/guide/openvino-npu.md)")

    # -- the sizes NPUW derives ------------------------------------------------------------

    @property
    def chunked(self) -> bool:
        return self.prefill_hint == "dynamic" and 0 < self.prefill_chunk_size < align_to(self.max_prompt_len, 64)

    @property
    def prompt_size(self) -> int:
        """``max_prompt_size``: MAX_PROMPT_LEN aligned to 64, then to the chunk."""
        p = align_to(self.max_prompt_len, 64)
        return align_to(p, self.prefill_chunk_size) if self.chunked else p

    @property
    def generate_tokens(self) -> int:
        g = self.max_generation_token_len
        return g if g == 1 else align_to(g, 8)

    @property
    def total(self) -> int:
        return self.prompt_size + align_to(self.min_response_len, 64)

    @property
    def chunk(self) -> int:
        """Tokens of one prefill call (the present output): the chunk, or the whole prompt size."""
        return self.prefill_chunk_size if self.chunked else self.prompt_size

    @property
    def block(self) -> int:
        """The prefix-cache block: the option if it divides the chunk, else the chunk."""
        return self.prefix_block_size if self.prefill_chunk_size % self.prefix_block_size == 0 else self.prefill_chunk_size

    def capacity(self, needed, prim):
        # the generate model's past KV: total - G tokens, whatever is needed
        return np.full(np.shape(needed), self.total - self.generate_tokens, dtype=np.int64)

    def presents(self) -> tuple[int, int]:
        """Tokens of the generate and the prefill model's present (KV output) tensors."""
        return self.generate_tokens, self.chunk

    def check(self, model, workload) -> None:
        if any(layer.kind != "full" for layer in model.kv_layers if layer.kind != "none"):
            raise PolicyError("openvino-npu: only full-attention layers are modelled (no windows, MLA or linear states)")
        if any(not isinstance(op, (Prefill, Decode, Reset, Trim)) for op in workload.ops):
            raise PolicyError("openvino-npu: GenAI on NPU runs batch 1, greedy or multinomial: no beam search")
        stored = 0
        for inf in workload.inferences():
            if inf.phase in ("prefill", "turn") and stored + inf.tokens > self.max_prompt_len:
                raise PolicyError(f"openvino-npu: a {stored + inf.tokens}-token chat history is over MAX_PROMPT_LEN "
                                  f"{self.max_prompt_len} (GenAI prefills the whole history each turn); raise "
                                  "--policy-opt max_prompt_len=N")
            stored = 0 if inf.phase == "reset" else stored + inf.tokens
        limit = self.total - self.generate_tokens
        if workload.max_tokens > limit:
            raise PolicyError(f"openvino-npu: the session reaches {workload.max_tokens} tokens but the generate model holds "
                              f"{limit} (MAX_PROMPT_LEN {self.prompt_size} + MIN_RESPONSE_LEN "
                              f"{align_to(self.min_response_len, 64)} - {self.generate_tokens}); raise min_response_len")

    # -- what each step does -----------------------------------------------------------------

    def plan(self, workload) -> list[NpuStep]:
        """Per step of ``workload``, what the pipeline does to its buffers (:class:`NpuStep`), prefix cache
        included. Every token of the history gets an identity; a prefill's tokens are the stored history's
        followed by new ones, so a turn after a trim has new tokens where the history was cut."""
        cache = PrefixCache(self.prefix_max_blocks) if self.prefix_caching else None
        ids: list[int] = []
        fresh = 0
        copy: tuple[int, int] | None = None  # after a prefill, until the first generate step: (copied, staged)
        out: list[NpuStep] = []
        for inf in workload.inferences():
            if inf.phase == "reset":
                ids, copy = [], None
                out.append(NpuStep())
            elif inf.phase == "trim":
                del ids[len(ids) + inf.tokens:]
                out.append(NpuStep())
            elif inf.phase == "decode":
                ids.append(fresh := fresh + 1)
                step = NpuStep() if copy is None else NpuStep(copied=copy[0], staged=copy[1])
                out.append(step)
                copy = None
            else:  # a prompt or a chat turn: the whole history again
                for _ in range(inf.tokens):
                    ids.append(fresh := fresh + 1)
                step = self._prefill(ids, cache)
                staged = step.history - step.last_chunk if self.chunked else 0
                copy = (step.history, staged)
                out.append(step)
        return out

    def _prefill(self, ids: list[int], cache: PrefixCache | None) -> NpuStep:
        """``infer_chunked_prefill`` / ``infer_whole_prefill`` over ``ids`` (the history)."""
        total = len(ids)
        restored: list[int] = []
        if cache is not None:
            restored = self._find_cached_blocks(ids, cache)
        done = len(restored) * self.block if cache is not None else 0
        remaining = total - done
        chunk = self.chunk
        calls = -(-remaining // chunk) if self.chunked else 1
        last = remaining - (calls - 1) * chunk if self.chunked else total
        stores: list[tuple[str, int]] = []
        if cache is not None:
            at = done
            for i in range(calls):
                n = min(chunk, remaining - i * chunk)
                if n < self.block or n < chunk:  # store_blocks: full chunks only
                    break
                for start in range(at, at + chunk, self.block):
                    key, parent = ids[start + self.block - 1], ids[start - 1] if start else 0
                    stores.append(("new", key))
                    kept, victim = cache.put(key, parent)
                    if victim is not None:
                        stores.append(("evict", victim))
                    if not kept:
                        stores.append(("drop", key))
                at += chunk
        return NpuStep(history=total, restored=tuple(restored), calls=calls, last_chunk=last, stores=tuple(stores))

    def _find_cached_blocks(self, ids: list[int], cache: PrefixCache) -> list[int]:
        """``PrefixCachingHelper::find_cached_blocks``: the cached blocks from the start, at most
        ``P − C`` tokens, never the whole prompt, then cut down to a whole number of chunks."""
        block, chunk, total = self.block, self.prefill_chunk_size, len(ids)
        limit = self.prompt_size - chunk
        found: list[int] = []
        restored = 0
        for index in range(-(-total // block)):
            if total - index * block < block:
                break
            key = ids[(index + 1) * block - 1]
            if not cache.get(key):
                break
            found.append(key)
            restored += block
            if restored + block > limit:
                break
            if restored == total:  # at least one token must be computed for the logits
                found.pop()
                break
        if restored and restored % chunk:
            for _ in range((restored - restored // chunk * chunk) // block):
                found.pop()
        return found

    def priced_calls(self, plan: list[NpuStep], phases: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per step, the model calls and each call's shape as the NPU runs it — static shapes compute the whole
        padded tensor: a prefill chunk is ``C`` new tokens over a past of ``P − C`` (one static prefill: ``P``
        over none), a generate step ``G`` new tokens over ``total − G``. Returns (calls, new, context)."""
        calls = np.zeros(len(plan))
        new = np.zeros(len(plan))
        context = np.zeros(len(plan))
        for i, (step, phase) in enumerate(zip(plan, phases)):
            if step.history:
                calls[i], new[i], context[i] = step.calls, self.chunk, self.prompt_size - self.chunk
            elif phase == "decode":
                calls[i], new[i], context[i] = 1, self.generate_tokens, self.total - self.generate_tokens
        return calls, new, context

"""OpenVINO GenAI's KV-cache eviction (``SchedulerConfig.use_cache_eviction``): its configuration and its rule.

Read in openvinotoolkit/openvino.genai ``da1db864`` (docs/DESIGN.md §4d holds every citation and what was
measured on the installed 2026.4.1):

* ``CacheEvictionConfig(start_size, recent_size, max_cache_size, aggregation_mode, apply_rotation,
  snapkv_window_size, kvcrush_config)``, defaults 32, 128, 672, NORM_SUM, no rotation, 8, budget 0
  (``include/openvino/genai/cache_eviction.hpp``). Its constructor asserts each size non-zero and
  ``max_cache_size > start_size + recent_size``; ``CacheEvictionAlgorithm``'s constructor (built for a sequence
  after its first forward, ``cache_eviction.cpp``) asserts each a multiple of the block size.
* After the forward of a step, for every sequence scheduled in it that had completed its prompt before the step
  (``ContinuousBatchingImpl::_maybe_evict_cache_blocks``: ``SequenceGroup::can_generate_tokens``), with ``T``
  tokens in its cache: when ``T >= max_cache_size + block`` (``get_max_cache_size_after_eviction`` is
  ``max + block - 1``) it drops ``floor(T / block) - max / block`` whole blocks from the logical range
  ``[start / block, floor(T / block) - recent / block)`` (``evict_logical_blocks``,
  ``get_evictable_block_range``, ``get_num_blocks_to_evict``), chosen by attention score, per layer. Every layer
  drops the same number (``BlockManager::free_blocks_from_sequence`` asserts it), so the blocks a sequence holds
  follow from its lengths alone.
* KVCrush with budget ``b > 0``: when the blocks to drop number ``n >= b``, ``b`` of them are kept
  (``KVCrushAlgorithm::get_representative_blocks_kvcrush``: ``min(n, b)`` retained, ``n // b`` apart).
* The ``T`` the rule reads is the length of the attention scores GenAI keeps per sequence
  (``EvictionScoreManager``), re-registered at every forward of the sequence (:func:`after_forward` models
  when, and the assertions that stop ``step()`` on the way: a recompute after a preemption registering fewer
  tokens than it holds scores for, a first registration of fewer tokens past ``start`` than SnapKV scores).

:class:`CacheEviction` is the configuration (``--cache-eviction start=32,recent=128,max=672,kvcrush=0``);
:meth:`CacheEviction.blocks_to_drop` is the rule, :func:`after_forward` one sequence's step of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from simkv.errors import ConfigError

#: The largest size (tokens) a flag may give: far beyond any context a model has.
MAX_EVICTION_TOKENS = 100_000_000
#: The KVCrush budget's bound (blocks).
MAX_KVCRUSH_BLOCKS = 1_000_000
#: ``--cache-eviction`` keys, in the order the configuration prints them, and their GenAI names.
KEYS = {"start": "start_size", "recent": "recent_size", "max": "max_cache_size", "kvcrush": "kvcrush_config.budget",
        "snapkv": "snapkv_window_size"}
#: GenAI's default SnapKV window (``CacheEvictionConfig::snapkv_window_size``).
SNAPKV_WINDOW = 8


@dataclass(frozen=True)
class CacheEviction:
    """GenAI's ``CacheEvictionConfig`` as far as it decides block counts (sizes in tokens, the KVCrush budget in
    blocks, the SnapKV window in tokens). The aggregation mode (NORM_SUM here) only changes which blocks go, not
    how many; rotation adds no KV block (docs/DESIGN.md §4d). The SnapKV window changes no count either, but
    decides when GenAI first keeps a sequence's scores, and with it one of its assertions (:func:`after_forward`):
    ``snapkv=0`` avoids it."""

    start: int = 32
    recent: int = 128
    max: int = 672
    kvcrush: int = 0
    snapkv: int = SNAPKV_WINDOW

    def label(self) -> str:
        """The flag's form: ``start=32,recent=128,max=672`` (``,kvcrush=B``, ``,snapkv=W`` when not the default)."""
        text = f"start={self.start},recent={self.recent},max={self.max}"
        text += f",kvcrush={self.kvcrush}" if self.kvcrush else ""
        return text + (f",snapkv={self.snapkv}" if self.snapkv != SNAPKV_WINDOW else "")

    def check(self, block_size: int) -> None:
        """What GenAI asserts, as a one-line :class:`ConfigError` naming its check."""
        for key in ("start", "recent", "max"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"--cache-eviction {key} must be > 0 (GenAI: \"CacheEvictionConfig.{KEYS[key]} "
                                  "must be non-zero\", cache_eviction.hpp)")
        if self.max <= self.start + self.recent:
            raise ConfigError(f"--cache-eviction max ({self.max}) must be larger than start + recent "
                              f"({self.start + self.recent}) (GenAI: CacheEvictionConfig's constructor, "
                              "cache_eviction.hpp)")
        for key in ("start", "recent", "max"):
            value = getattr(self, key)
            if value % block_size:
                raise ConfigError(f"--cache-eviction {key} ({value}) must be a multiple of the block size "
                                  f"{block_size} (GenAI: \"CacheEvictionConfig.{KEYS[key]} in tokens must be a "
                                  "multiple of block size\", CacheEvictionAlgorithm, cache_eviction.cpp)")

    def blocks_to_drop(self, tokens: int, block_size: int) -> int:
        """Blocks a sequence holding ``tokens`` after the forward drops (``evict_logical_blocks``): none below
        ``max + block``; else ``floor(tokens / block) - max / block``, less the KVCrush budget when at least that
        many would go."""
        if tokens < self.max + block_size:
            return 0
        drop = tokens // block_size - self.max // block_size
        if self.kvcrush and drop >= self.kvcrush:
            drop -= self.kvcrush
        return drop

    def genai(self) -> dict:
        """The fields ``openvino_genai.CacheEvictionConfig`` and ``KVCrushConfig`` take (the rest at GenAI's
        defaults: NORM_SUM, no rotation)."""
        return {"start": self.start, "recent": self.recent, "max": self.max, "kvcrush": self.kvcrush,
                "snapkv": self.snapkv}


#: Why GenAI cannot run eviction with several sequences sharing blocks (measured on 2026.4.1: step() throws).
SHARED_BLOCKS = ("\"blocks across layers must be freed simultaneously\" (block_manager.hpp BlockAllocator::free: "
                 "eviction drops different blocks per layer, and a block another sequence shares is freed in some "
                 "layers only)")


def check_eviction(eviction: CacheEviction, block_size: int, *, prefix_caching: bool, plain: bool) -> None:
    """What GenAI cannot run with cache eviction, and what simkv does not model, as one-line :class:`ConfigError`s:
    GenAI's own checks of the sizes; prefix caching (GenAI's ``step()`` throws once a restored or cached block is
    evicted: :data:`SHARED_BLOCKS`); a layout other than one plain table per sequence (``plain``: GenAI's manager
    over attention layers only; linear-attention pools and vLLM's manager are not modelled with eviction)."""
    eviction.check(block_size)
    if prefix_caching:
        raise ConfigError(f"--cache-eviction with prefix caching stops GenAI's step(): {SHARED_BLOCKS}")
    if not plain:
        raise ConfigError("--cache-eviction is modelled for GenAI's KV manager over attention layers only (not "
                          "--kv-manager vllm, not a linear-attention state pool)")


def check_request(req) -> None:
    """A request GenAI cannot run with cache eviction: several sequences (samples or beams) share their prompt's
    blocks, and eviction stops ``step()`` (:data:`SHARED_BLOCKS`)."""
    if req.sequences > 1:
        raise ConfigError(f"request {req.id}: {req.sequences} sequences (samples or beams) with --cache-eviction stop "
                          f"GenAI's step(): {SHARED_BLOCKS}")


def parse_cache_eviction(text: str | None) -> CacheEviction | None:
    """``start=32,recent=128,max=672[,kvcrush=B][,snapkv=W]`` (any key left out takes GenAI's default; ``on`` is
    every default); None or ``off``: no eviction. A bad value is a one-line :class:`ConfigError`."""
    if text is None:
        return None
    text = text.strip()
    if text in ("", "off", "none"):
        return None
    if text in ("on", "default"):
        return CacheEviction()
    values: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in KEYS:
            raise ConfigError(f"--cache-eviction takes start=N,recent=N,max=N[,kvcrush=B][,snapkv=W], not "
                              f"{part.strip()!r}")
        if key in values:
            raise ConfigError(f"--cache-eviction gives {key} twice")
        try:
            number = int(value.strip())
        except ValueError:
            raise ConfigError(f"--cache-eviction {key} must be a whole number, not {value.strip()!r}") from None
        bound = MAX_KVCRUSH_BLOCKS if key == "kvcrush" else MAX_EVICTION_TOKENS
        if not 0 <= number <= bound:
            raise ConfigError(f"--cache-eviction {key} must be in 0..{bound:,}")
        values[key] = number
    return CacheEviction(**values)


# --------------------------------------------------------------------------- one sequence's step


#: GenAI's assertions that a sequence's scores can trip in ``step()``, by the check's own expression (what the
#: real pipeline's error names) and where it is.
SCORES_SHRINK = ("new_size_in_tokens >= old_size_in_tokens",
                 "cache_eviction.cpp EvictionScoreManager::_accumulate_layer_scores_to: a sequence registers fewer "
                 "tokens than it holds scores for (a recompute after a preemption, in a chunk shorter than what it "
                 "held)")
SNAPKV_FIRST = ("new_scores_size >= num_snapkv_scores",
                "cache_eviction.cpp EvictionScoreManager::_accumulate_initial_scores: a sequence's first scores "
                "span fewer tokens past start than its SnapKV scores (a prompt of start+1 .. start+snapkv-1 "
                "tokens in its last chunk; snapkv=0 avoids it)")
SNAPKV_TOTAL = ("Total number of aggregated SnapKV scores",
                "cache_eviction.cpp EvictionScoreManager::register_new_token_scores: more SnapKV scores than the "
                "window (a recompute of a sequence shorter than the window)")
COUNTERS = ("new_size_in_tokens >= m_num_registered_snapkv_aggregated_scores",
            "cache_eviction.cpp EvictionScoreManager::_adjust_norm_sum_counters")
FREE_RANGE = ("cannot free logical block",
              "block_manager.hpp BlockManager::free_blocks_from_sequence: the scores a sequence kept reach past the "
              "blocks it holds (a recompute after a preemption that has not reached start yet)")


def snapkv_scores(prompt: int, scheduled: int, processed: int, window: int) -> int:
    """``SnapKVScoreAggregationCalculator::get_num_token_scores_to_aggregate``: the positions of this chunk inside
    the prompt's last ``window`` tokens (every scheduled token without a window)."""
    if window == 0:
        return scheduled
    first = 0 if window > prompt else prompt - window
    after = processed + scheduled
    if after <= first:
        return 0
    return scheduled if processed > first else after - first


def after_forward(g, eviction: CacheEviction, block_size: int) -> tuple[int, tuple[str, str] | None]:
    """One scheduled sequence (a one-sequence group ``g``) after the forward of its step, before sampling
    (``ContinuousBatchingImpl::_maybe_evict_cache_blocks``): GenAI registers the step's attention scores, then
    evicts if the group had completed its prompt before the step. Updates ``g.scores`` (the tokens GenAI's scores
    span, start included; 0: none kept yet), ``g.snap`` (SnapKV scores aggregated) and ``g.evicted``; returns the
    blocks to drop (the caller frees them) and, where GenAI's ``step()`` throws, the check (expression, where).

    Registration (``EvictionScoreManager::register_new_token_scores``), with ``T`` the tokens in the cache:
    the SnapKV counter grows by this chunk's scores while under the window (asserting it stays within); at
    ``T <= start`` nothing more; a first registration needs SnapKV scores in this chunk (any, without a window)
    and asserts ``T - start >= `` them (``_accumulate_initial_scores``); a later one asserts ``T`` is not below
    what the scores span (``_accumulate_layer_scores_to``). Eviction reads the scores' span, which a preemption
    does not reset (GenAI keeps the per-sequence algorithm for the pipeline's life)."""
    T = g.processed + g.scheduled - g.evicted
    num = snapkv_scores(g.P, g.scheduled, g.processed, eviction.snapkv)
    if g.snap < eviction.snapkv:
        if num + g.snap > eviction.snapkv:
            return 0, SNAPKV_TOTAL
        g.snap += num
    start = eviction.start
    if T > start:
        if g.scores == 0:
            if eviction.snapkv == 0 or num > 0:
                if eviction.snapkv and T - start < num:
                    return 0, SNAPKV_FIRST
                g.scores = T
        else:
            if T < g.scores:
                return 0, SCORES_SHRINK
            if eviction.snapkv and g.snap != eviction.snapkv and T - start < g.snap:
                return 0, COUNTERS
            g.scores = T
    if not g.can_generate() or g.scores == 0:  # (no scores: nothing past start to evict)
        return 0, None
    drop = eviction.blocks_to_drop(g.scores, block_size)
    if drop == 0:
        return 0, None
    end = g.scores // block_size - eviction.recent // block_size  # the evictable range's end (logical block)
    if end > -(-T // block_size):
        return 0, FREE_RANGE
    g.scores -= drop * block_size
    g.evicted += drop * block_size
    return drop, None

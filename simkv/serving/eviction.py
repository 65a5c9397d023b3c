"""OpenVINO GenAI's KV-cache eviction (``SchedulerConfig.use_cache_eviction``): its configuration and its rule.

Read in openvinotoolkit/openvino.genai ``da1db864`` (docs/DESIGN.md §4d holds every citation and what was
measured on the installed 2026.4.1):

* ``CacheEvictionConfig(start_size, recent_size, max_cache_size, aggregation_mode, apply_rotation,
  snapkv_window_size, kvcrush_config)``, defaults 32, 128, 672, NORM_SUM, no rotation, 8, budget 0
  (``include/openvino/genai/cache_eviction.hpp``). Its constructor asserts each size non-zero and
  ``max_cache_size > start_size + recent_size``; ``CacheEvictionAlgorithm``'s constructor (built at the first
  step past a prompt, ``cache_eviction.cpp``) asserts each a multiple of the block size.
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

:class:`CacheEviction` is the configuration (``--cache-eviction start=32,recent=128,max=672,kvcrush=0``);
:meth:`CacheEviction.blocks_to_drop` is the rule. What the scheduler does with it (the score length GenAI keeps
per sequence, recompute after a preemption, the workloads GenAI cannot run) is in the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from simkv.errors import ConfigError

#: The largest size (tokens) a flag may give: far beyond any context a model has.
MAX_EVICTION_TOKENS = 100_000_000
#: The KVCrush budget's bound (blocks).
MAX_KVCRUSH_BLOCKS = 1_000_000
#: ``--cache-eviction`` keys, in the order the configuration prints them, and their GenAI names.
KEYS = {"start": "start_size", "recent": "recent_size", "max": "max_cache_size", "kvcrush": "kvcrush_config.budget"}


@dataclass(frozen=True)
class CacheEviction:
    """GenAI's ``CacheEvictionConfig`` as far as it decides block counts (sizes in tokens, the KVCrush budget in
    blocks). The aggregation mode (NORM_SUM or SUM) and the SnapKV window only change which blocks go, not how
    many; rotation adds no KV block (docs/DESIGN.md §4d)."""

    start: int = 32
    recent: int = 128
    max: int = 672
    kvcrush: int = 0

    def label(self) -> str:
        """The flag's form: ``start=32,recent=128,max=672`` (``,kvcrush=B`` when a budget is set)."""
        text = f"start={self.start},recent={self.recent},max={self.max}"
        return text + (f",kvcrush={self.kvcrush}" if self.kvcrush else "")

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
        defaults: NORM_SUM, no rotation, SnapKV window 8)."""
        return {"start": self.start, "recent": self.recent, "max": self.max, "kvcrush": self.kvcrush}


def parse_cache_eviction(text: str | None) -> CacheEviction | None:
    """``start=32,recent=128,max=672[,kvcrush=B]`` (any key left out takes GenAI's default; ``on`` is every
    default); None or ``off``: no eviction. A bad value is a one-line :class:`ConfigError`."""
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
            raise ConfigError(f"--cache-eviction takes start=N,recent=N,max=N[,kvcrush=B], not {part.strip()!r}")
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

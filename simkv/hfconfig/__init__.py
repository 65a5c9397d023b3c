"""Any Hugging Face ``config.json``, read offline, as a :class:`~simkv.models.ModelSpec` — or refused in one line —
and the presets shipped as such files (``simkv/data/configs/<name>.json``).

One small module per family (``simkv/hfconfig/<family>.py``, as transformers keeps
``models/<family>/configuration_*.py``) says what its config class does and which fields it reads; all are
registered in :mod:`simkv.hfconfig.registry`, from which the docs' family table and the refusal messages are
generated. What each layer keeps is derived as transformers 5.23 derives it, so a model built here has the cache
layers ``DynamicCache(config=...)`` builds (tests/test_hfconfig.py compares them for every shipped config):

1. ``layer_types`` when the config gives it, legacy names renamed (``attention`` → ``full_attention``,
   ``mamba`` → ``linear_attention``: ``configuration_utils.remap_legacy_layer_types``);
2. else the config class's own ``__post_init__`` (the family's rule: Gemma-3 ``(i+1) % sliding_window_pattern``,
   gpt-oss even layers sliding, Llama-4 ``no_rope_layers``, Qwen3-Next ``full_attention_interval`` ...), or the
   family's own per-layer specs (Gemma-4's per-kind heads and sizes, Nemotron-NAS's ``block_configs``, MiMo-V2's
   sliding heads);
3. else ``cache_utils.get_layer_types_and_kwargs``: every layer sliding if ``sliding_window``, chunked if
   ``attention_chunk_size``, else full.

Never silently wrong: a field that is not one its family reads, not a common decoder field and not one no layout
depends on is refused with one line naming the family and the fields when its name may concern the layout; a
``model_type`` no module reads is read by the generic decoder only when every field is understood; a model type
whose layers hold what simkv does not (an indexer's keys, a compressed cache) is refused with the reason.
A field a file leaves out takes its config class's default (transformers 5.23), except ``num_hidden_layers`` and
``hidden_size``, which every config must give.
"""

from simkv.hfconfig.base import KIND_OF_TYPE, LEGACY_LAYER_TYPES, NOT_MODELLED, Family
from simkv.hfconfig.presets import (CONFIG_DIR, CONFIG_PRESETS, all_presets, get_model, preset_names, resolve_model)
from simkv.hfconfig.reader import load_config, parse_config
from simkv.hfconfig.registry import FAMILIES, REFUSED, WRAPPERS, family_table

__all__ = ["CONFIG_DIR", "CONFIG_PRESETS", "FAMILIES", "Family", "KIND_OF_TYPE", "LEGACY_LAYER_TYPES", "NOT_MODELLED",
           "REFUSED", "WRAPPERS", "all_presets", "family_table", "get_model", "load_config", "parse_config",
           "preset_names", "resolve_model"]

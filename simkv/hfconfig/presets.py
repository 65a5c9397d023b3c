"""The presets shipped as ``config.json`` files (``simkv/data/configs/<name>.json``, written by
``simkv/data/configs/make_configs.py``) and the one resolver of ``--model NAME|PATH``."""

from __future__ import annotations

import functools
from pathlib import Path

from simkv.errors import ConfigError
from simkv.hfconfig.reader import load_config
from simkv.models import PRESETS, ModelSpec, custom_model
from simkv.shipped import CONFIG_DIR

#: Presets read from CONFIG_DIR/<name>.json, each from the model's published config.json (SOURCES.md there).
CONFIG_PRESETS = ("gemma-3-4b", "gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b", "qwen3-8b", "qwen3-30b-a3b",
                  "qwen3-next-80b-a3b", "deepseek-v3", "llama-3.1-8b", "llama-3.1-70b", "llama-4-scout",
                  "mistral-small-3.1", "phi-4")


@functools.cache
def _config_preset(name: str) -> ModelSpec:
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise ConfigError(f"preset {name}: its file {path} is missing (the package ships simkv/data/configs)")
    return load_config(path, name=name)


def all_presets() -> dict[str, ModelSpec]:
    """Every preset: the built-in ones (simkv.models.PRESETS) then those of simkv/data/configs, by name."""
    return {**PRESETS, **{name: _config_preset(name) for name in CONFIG_PRESETS}}


def preset_names() -> tuple[str, ...]:
    return (*PRESETS, *CONFIG_PRESETS)


def get_model(name: str) -> ModelSpec:
    """A preset by name, or the model of a ``config.json`` path (a file or a folder holding one)."""
    key = name.lower()
    if key in PRESETS:
        return PRESETS[key]
    if key in CONFIG_PRESETS:
        return _config_preset(key)
    path = Path(name)
    if path.exists() or name.endswith(".json") or "/" in name:
        return load_config(path)
    raise ConfigError(f"unknown model {name!r}; presets: {', '.join(preset_names())} (or a config.json or its "
                      "folder, or 'custom' with --layers/--heads/--kv-heads/--head-dim)")


def resolve_model(model: str | None, *, layers: int | None = None, heads: int | None = None,
                  kv_heads: int | None = None, head_dim: int | None = None,
                  sliding_window: int | None = None) -> ModelSpec:
    """What ``--model`` and the dimension flags name: a preset or config path (optionally with dimensions
    overridden, :func:`simkv.models.custom_model`), or with ``None`` / ``"custom"`` a custom shape."""
    base = None if model is None or model == "custom" else get_model(model)
    return custom_model(base, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                        sliding_window=sliding_window)

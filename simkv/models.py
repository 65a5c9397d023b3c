"""Model shapes: what one attention layer's KV cache looks like.

Only the attention geometry matters for KV memory: the number of layers,
of key/value heads (fewer than query heads under grouped-query attention)
and the head size. Presets carry the values from each model's published
``config.json`` on the Hugging Face hub.
"""

from __future__ import annotations

from dataclasses import dataclass

from simkv.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for field in ("layers", "heads", "kv_heads", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model {field} must be a positive integer, got {value!r}")
        if self.heads % self.kv_heads:
            raise ConfigError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )

    @property
    def primitives(self) -> int:
        """KV primitives in construction order K0, V0, K1, V1, … (two per layer)."""
        return 2 * self.layers

    def describe(self) -> str:
        gqa = "MHA" if self.kv_heads == self.heads else f"GQA {self.heads}/{self.kv_heads}"
        return f"{self.name}: {self.layers} layers, {gqa} heads x {self.head_dim}"


# Sources: each model's config.json (num_hidden_layers, num_attention_heads,
# num_key_value_heads, hidden_size / num_attention_heads).
PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("gpt2", layers=12, heads=12, kv_heads=12, head_dim=64),
        ModelSpec("tinyllama-1.1b", layers=22, heads=32, kv_heads=4, head_dim=64),
        ModelSpec("qwen2.5-0.5b", layers=24, heads=14, kv_heads=2, head_dim=64),
        ModelSpec("phi-3.5-mini", layers=32, heads=32, kv_heads=32, head_dim=96),
        ModelSpec("llama-2-7b", layers=32, heads=32, kv_heads=32, head_dim=128),
        ModelSpec("llama-2-13b", layers=40, heads=40, kv_heads=40, head_dim=128),
        ModelSpec("llama-3-8b", layers=32, heads=32, kv_heads=8, head_dim=128),
        ModelSpec("mistral-7b", layers=32, heads=32, kv_heads=8, head_dim=128),
        ModelSpec("qwen2.5-7b", layers=28, heads=28, kv_heads=4, head_dim=128),
        ModelSpec("llama-3-70b", layers=80, heads=64, kv_heads=8, head_dim=128),
    )
}


def get_model(name: str) -> ModelSpec:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ConfigError(
            f"unknown model {name!r}; presets: {', '.join(PRESETS)} (or give --layers/--heads/--kv-heads/--head-dim)"
        ) from None


def custom_model(
    base: ModelSpec | None = None,
    *,
    layers: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
) -> ModelSpec:
    """A preset with some dimensions overridden, or a fully custom shape.

    Without a base, ``heads`` defaults to ``kv_heads`` (MHA) and vice versa.
    """
    if base is None:
        missing = [n for n, v in (("layers", layers), ("head_dim", head_dim)) if v is None]
        if missing or (heads is None and kv_heads is None):
            raise ConfigError(
                "a custom model needs --layers, --head-dim and --heads or --kv-heads "
                "(or a preset via --model)"
            )
        heads = heads if heads is not None else kv_heads
        kv_heads = kv_heads if kv_heads is not None else heads
        return ModelSpec("custom", layers, heads, kv_heads, head_dim)
    changed = {
        k: v
        for k, v in (("layers", layers), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim))
        if v is not None
    }
    if not changed:
        return base
    if "heads" in changed and "kv_heads" not in changed and base.kv_heads == base.heads:
        changed["kv_heads"] = changed["heads"]
    fields = {f: getattr(base, f) for f in ("layers", "heads", "kv_heads", "head_dim")}
    fields.update(changed)
    return ModelSpec(f"{base.name}*", **fields)

"""KV-cache element types and the metadata runtimes store beside them.

Bytes are counted as the runtimes lay them out (DESIGN.md §2, §3):

* CPU plugin, u8 / u4: data ``[cap, B, H_kv, S]`` plus, per K and per V, an f32
  (scale, zero-point) pair per token per head: ``[cap, B, H_kv, 2]`` × 4 B.
* GPU plugin, i8: data ``[B, H_kv, cap, S]`` plus an f16 (scale, zero-point)
  pair per token per head, interleaved ``[B, H_kv, cap, 2]`` × 2 B.
* f32 / f16 / bf16: data only; fp8 (vLLM's ``--kv-cache-dtype fp8``): data only, 1 B per element, with one
  scale per layer tensor (not per token).
"""

from __future__ import annotations

from dataclasses import dataclass

from simkv.errors import ConfigError
from simkv.kvspec import MLA_FORMS, k_v_bytes, token_bytes
from simkv.models import ModelSpec


@dataclass(frozen=True, slots=True)
class Precision:
    name: str
    #: Bits per stored element of K or V.
    bits: int
    #: Bytes of (scale, zero-point) metadata per token per KV head; 0 if none.
    meta_bytes_per_head: int = 0
    note: str = ""

    def check(self, model: ModelSpec) -> None:
        """Refuse a model whose K or V rows would not fill whole bytes at this precision (u4 with an odd
        head size), in any layer and either MLA form; and a model whose MLA layers keep a sparse-attention
        indexer's keys (DeepSeek-V3.2, GLM-5): only vLLM's layout of that cache is read
        (:func:`simkv.kvspec.indexer_bytes`, ``simkv models --model``), and the runtimes simkv runs keep it
        otherwise or not at all (transformers' GLM-5 caches its MLA expanded and the indexer keys outside
        DynamicCache; OpenVINO has no export of it), so runs and serving refuse it rather than guess."""
        if any(layer.indexer for layer in model.kv_layers):
            raise ConfigError(f"model {model.name}: its MLA layers keep a sparse-attention indexer's key cache, read "
                              "only as vLLM lays it out (see simkv models --model); simkv's runtimes do not hold it yet")
        for layer in set(model.kv_layers):
            for form in MLA_FORMS if layer.latent else MLA_FORMS[:1]:
                k_v_bytes(layer, self, form)

    def kv_bytes_per_token(self, model: ModelSpec) -> int:
        """Logical bytes of one token across the whole model: K + V (+ metadata) of every attention
        layer, every token kept (MLA as its latent; simkv.kvspec.token_bytes)."""
        return token_bytes(model.kv_layers, self)


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("f32", 32),
        Precision("f16", 16),
        Precision("bf16", 16),
        Precision("u8", 8, meta_bytes_per_head=8, note="CPU plugin: f32 scale + zero-point per token per head"),
        Precision("u4", 4, meta_bytes_per_head=8, note="CPU plugin: f32 scale + zero-point per token per head"),
        Precision("i8", 8, meta_bytes_per_head=4, note="GPU plugin: f16 scale + zero-point per token per head"),
        Precision("fp8", 8, note="vLLM fp8_e4m3: one scale per layer for K and one for V, none per token"),
    )
}


def get_precision(name: str) -> Precision:
    try:
        return PRECISIONS[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}") from None

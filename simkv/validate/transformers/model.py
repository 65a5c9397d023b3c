"""The transformers side of ``simkv validate --runtime transformers``: what to run (:class:`HFValidateConfig`),
the random-weight model and its cache, and the driver that runs the workload one bracketed operation per
simkv step (steps 1-2 of :mod:`.runner`'s docstring). Imports torch and transformers lazily.

The model is a Llama (Mistral with a sliding window) of the configured shape, or — ``arch`` /
``config_path`` — one of the tiny architectures of :mod:`.archs` or any ``config.json``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from simkv.errors import ConfigError
from simkv.workload import Decode, Fork, Prefill, Reorder, Reset, Select, parse_ops

from ..child import DEFAULT_MMAP_THRESHOLD

__all__ = ["DTYPES", "POLICIES", "HFValidateConfig", "build_model", "make_cache", "drive"]

DTYPES = ("f32", "f16", "bf16")
POLICIES = ("hf-dynamic", "hf-static")


@dataclass
class HFValidateConfig:
    """What to validate. ``workload`` is simkv's text form (``prefill:32,decode:100,...``)."""

    workload: str
    layers: int = 2
    heads: int = 4
    kv_heads: int = 4
    head_dim: int = 16
    hidden: int | None = None
    vocab: int = 1000
    seed: int = 0
    dtype: str = "f32"
    policy: str = "hf-dynamic"
    max_cache_len: int | None = None  # hf-static; None: the longest history of the workload
    sliding_window: int | None = None
    mmap_threshold: int = DEFAULT_MMAP_THRESHOLD
    slope_min_tokens: int = 500
    clean_run: bool = True
    progress: bool = False
    model_name: str = "custom"
    arch: str | None = None  # a tiny architecture of .archs (its config gives the shape)
    config_path: str | None = None  # a config.json or its folder (idem)

    def __post_init__(self) -> None:
        if self.arch and self.config_path:
            raise ConfigError("give a tiny architecture or a config, not both")
        if self.dtype not in DTYPES:
            raise ConfigError(f"the transformers runtime keeps the KV cache in the model's dtype: choose one of "
                              f"{', '.join(DTYPES)}, not {self.dtype!r}")
        if self.policy not in POLICIES:
            raise ConfigError(f"--runtime transformers validates {' or '.join(POLICIES)}, not {self.policy!r}")

    @property
    def cache_len(self) -> int:
        return self.max_cache_len or parse_ops(self.workload).max_tokens


def transformers_config(cfg: HFValidateConfig):
    """The transformers config object of an ``arch`` / ``config_path`` run (None for the Llama shape)."""
    from .archs import load_config, tiny_config

    if cfg.arch:
        return tiny_config(cfg.arch)
    return load_config(cfg.config_path) if cfg.config_path else None


def build_model(cfg: HFValidateConfig):
    """Random-weight Llama (or Mistral, with a sliding window) of the configured shape, or the model of an
    ``arch`` / ``config_path``, in eval mode."""
    import torch

    config = transformers_config(cfg)
    if config is not None:
        from .archs import build_model as from_config

        return from_config(config, cfg.dtype, cfg.seed)
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    hidden = cfg.hidden or cfg.heads * cfg.head_dim
    common = dict(vocab_size=cfg.vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                  head_dim=cfg.head_dim, max_position_embeddings=parse_ops(cfg.workload).max_tokens + 1)
    torch.manual_seed(cfg.seed)
    if cfg.sliding_window:
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=cfg.sliding_window))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[cfg.dtype]
    return model.to(dtype).eval()


def make_cache(model, cfg: HFValidateConfig):
    from transformers import DynamicCache, StaticCache

    if cfg.policy == "hf-static":
        return StaticCache(config=model.config, max_cache_len=cfg.cache_len)
    return DynamicCache(config=model.config)


def drive(model, cache, cfg: HFValidateConfig, recorder, on_step=None) -> int:
    """Run the workload, one bracketed operation per simkv step; returns the number of steps.

    Inputs are built outside the brackets. ``on_step(seq, latency_s)`` runs after each one.
    """
    import torch

    from tqdm import tqdm

    gen = torch.Generator().manual_seed(cfg.seed)
    vocab = model.config.vocab_size
    seq, batch = 0, 1
    bar = tqdm(total=parse_ops(cfg.workload).steps, unit="step", desc="transformers run", leave=False,
               disable=not cfg.progress)

    def step(tokens: int, beam_idx=None, reset: bool = False) -> None:
        nonlocal seq
        ids = torch.randint(0, vocab, (batch, tokens), generator=gen).to(model.device) if tokens else None
        index = torch.tensor(beam_idx, dtype=torch.long).to(model.device) if beam_idx is not None else None
        t0 = time.perf_counter()
        with recorder.operation(seq):
            if reset:
                cache.reset()
            else:
                if index is not None:
                    cache.reorder_cache(index)
                model(input_ids=ids, past_key_values=cache, use_cache=True)
        if on_step is not None:
            on_step(seq, time.perf_counter() - t0)
        seq += 1
        bar.update(1)

    with torch.no_grad():
        for op in parse_ops(cfg.workload).ops:
            if isinstance(op, Prefill):
                step(op.tokens)
            elif isinstance(op, Decode):
                for _ in range(op.steps):
                    step(1)
            elif isinstance(op, Fork):
                batch = op.width
                step(1, [0] * op.width)
            elif isinstance(op, Reorder):
                step(1, list(reversed(range(batch))))
            elif isinstance(op, Select):
                batch = 1
                step(1, [op.beam])
            elif isinstance(op, Reset):
                batch = 1
                step(0, reset=True)
    bar.close()
    return seq

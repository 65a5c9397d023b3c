"""Any Hugging Face ``config.json``, read offline, as a :class:`~simkv.models.ModelSpec`, and the presets
shipped as such files (``simkv/data/configs/<name>.json``, written by ``simkv/data/configs/make_configs.py``).

What each layer keeps is derived as transformers 5.23 derives it, so a model built here has the cache
layers ``DynamicCache(config=...)`` builds (tests/test_hfconfig.py compares them for every shipped config):

1. ``layer_types`` when the config gives it, legacy names renamed (``attention`` → ``full_attention``,
   ``mamba`` → ``linear_attention``: ``configuration_utils.remap_legacy_layer_types``);
2. else the config class's own ``__post_init__`` (:data:`FAMILIES`: Gemma-3 ``(i+1) % sliding_window_pattern``,
   gpt-oss even layers sliding, Llama-4 ``no_rope_layers``, Qwen3-Next ``full_attention_interval`` ...);
3. else ``cache_utils.get_layer_types_and_kwargs``: every layer sliding if ``sliding_window``, chunked if
   ``attention_chunk_size``, else full.

A field a file leaves out takes its config class's default (transformers 5.23) for the families of
:data:`FAMILIES`, except ``num_hidden_layers`` and ``hidden_size``, which every config must give; a model
type not listed there must give what is read, and one whose fields decide its layers in a way only its
own class knows (a pattern key without ``layer_types``, a latent or state) is refused with one line.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from simkv import limits
from simkv.errors import ConfigError
from simkv.kvspec import LayerKV
from simkv.models import PRESETS, ModelSpec, custom_model
from simkv.shipped import CONFIG_DIR
from simkv.weights import scheme_of

#: Presets read from CONFIG_DIR/<name>.json, each from the model's published config.json (SOURCES.md there).
CONFIG_PRESETS = ("gemma-3-4b", "gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b", "qwen3-8b", "qwen3-30b-a3b",
                  "qwen3-next-80b-a3b", "deepseek-v3", "llama-3.1-8b", "llama-3.1-70b", "llama-4-scout",
                  "mistral-small-3.1", "phi-4")

#: configuration_utils.py ``_LEGACY_LAYER_TYPE_REMAP`` (the two names a KV cache cares about).
LEGACY_LAYER_TYPES = {"attention": "full_attention", "mamba": "linear_attention"}
#: ``layer_types`` entry → simkv layer kind (cache_utils.py ``DYNAMIC_LAYER_TYPE_MAPPING``: ``linear_attention``
#: and LFM2's ``conv`` are both a ``LinearAttentionLayer``; ``moe`` and ``mlp`` layers hold no attention:
#: ``DummyLayer`` in ``get_layer_types_and_kwargs``).
KIND_OF_TYPE = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked",
                "linear_attention": "linear", "conv": "linear", "moe": "none", "mlp": "none"}
#: Entries transformers 5.23 allows (configuration_utils.py ``ALLOWED_ATTN_LAYER_TYPES``) that no simkv layer
#: kind holds (an indexer's keys, attention and a state in one layer ...).
NOT_MODELLED = ("window_attention", "indexed_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                "minimax_m3_sparse", "hybrid", "hybrid_sliding", "reference_sliding_attention")
#: Fields that decide the layer kinds in a way each config class defines for itself: in a model type simkv does
#: not know they are refused unless ``layer_types`` is given.
PATTERN_KEYS = ("sliding_window_pattern", "use_sliding_window", "max_window_layers", "full_attention_interval",
                "no_rope_layers", "no_rope_layer_interval", "attn_layer_period", "attn_layer_offset",
                "layers_block_type", "hybrid_override_pattern")
#: Fields that change what a layer stores (a latent, a state, another layer's KV): refused in an unknown model type.
STORAGE_KEYS = ("kv_lora_rank", "num_kv_shared_layers", "kv_sharing_modes", "per_layer_config")
STORAGE_PREFIXES = ("mamba_", "ssm_", "linear_")
#: The text model type of a multimodal wrapper whose ``text_config`` does not name one (its ``sub_configs``).
WRAPPERS = {"gemma3": "gemma3_text", "llama4": "llama4_text", "mistral3": "mistral"}
#: Model types refused with a reason.
REFUSED = {"falcon_h1": "every Falcon-H1 layer is 'hybrid', attention KV and a Mamba state in one layer "
                        "(configuration_falcon_h1.py layers_block_type), which no simkv layer kind holds"}
_MISSING = object()


class _Config:
    """One (text) config's values: the file's, else its family's defaults."""

    def __init__(self, where: str, values: Mapping, defaults: Mapping):
        self.where, self.values, self.defaults = where, values, defaults

    def has(self, key: str) -> bool:
        return key in self.values or key in self.defaults

    def get(self, key: str, default=None):
        return self.values[key] if key in self.values else self.defaults.get(key, default)

    def fail(self, message: str) -> ConfigError:
        return ConfigError(f"{self.where}: {message}")

    def int(self, key: str, bound: int, *, minimum: int = 1, default=_MISSING) -> int:
        """An integer field in ``[minimum, bound]``; absent or null: ``default`` (else an error naming it)."""
        value = self.get(key)
        if value is None:
            if default is _MISSING:
                raise self.fail(f"missing {key}")
            return default
        if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= bound:
            raise self.fail(f"{key} must be an integer from {minimum} to {bound:,}, got {value!r}")
        return value

    def ints(self, key: str, bound: int, *, minimum: int = 0) -> list[int]:
        """A list of integers (``mlp_only_layers``, ``no_rope_layers``, ``moe_layers``); null: empty."""
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                  and minimum <= v <= bound for v in value):
            raise self.fail(f"{key} must be a list of integers from {minimum} to {bound:,}, got {value!r}")
        return value

    def first(self, keys: tuple[str, ...], bound: int, *, minimum: int = 0) -> int:
        """The first of several names for one field (``num_local_experts`` / ``num_experts`` ...); 0 if none."""
        for key in keys:
            if self.get(key) is not None:
                return self.int(key, bound, minimum=minimum)
        return 0


# -- what each family's config class does (transformers 5.23, models/<family>/configuration_<family>.py) --------

def _sliding_window(c: _Config):
    return c.get("sliding_window")


def _qwen_window(c: _Config):
    """Qwen2/Qwen3/Qwen3-MoE ``__post_init__``: the window only with ``use_sliding_window``."""
    return c.get("sliding_window") if c.get("use_sliding_window") else None


def _gemma3_window(c: _Config):
    """Gemma3TextConfig.__post_init__: a bidirectional model halves the window (exclusive bounds)."""
    window = c.get("sliding_window")
    return window // 2 + 1 if c.get("use_bidirectional_attention") and isinstance(window, int) else window


def _by_window(c: _Config, n: int, window) -> list[str]:
    """cache_utils.get_layer_types_and_kwargs without ``layer_types``: sliding, else chunked, else full."""
    if window is not None:
        return ["sliding_attention"] * n
    if c.get("attention_chunk_size") is not None:
        return ["chunked_attention"] * n
    return ["full_attention"] * n


def _every(c: _Config, key: str, default: int, other: str, n: int) -> list[str]:
    """``other`` on each layer but every ``key``-th, which is full (Gemma-2/3, gpt-oss, Qwen3-Next)."""
    k = c.values.get(key, default)  # a constructor argument, not a stored field: its default is in __post_init__
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise c.fail(f"{key} must be a positive integer, got {k!r}")
    return [other if (i + 1) % k else "full_attention" for i in range(n)]


def _alternate(c: _Config, n: int, window) -> list[str]:
    """Gemma2Config / GptOssConfig.__post_init__: sliding where ``(i+1) % 2``, i.e. layers 0, 2, 4 ..."""
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]


def _llama4_types(c: _Config, n: int, window) -> list[str]:
    """Llama4TextConfig.__post_init__: ``no_rope_layers`` (default: every ``no_rope_layer_interval``-th layer is
    NoPE), then chunked on the RoPE layers, full on the NoPE ones."""
    rope = c.ints("no_rope_layers", 1)
    if not rope:
        k = c.int("no_rope_layer_interval", limits.MAX_LAYERS)
        rope = [int((i + 1) % k != 0) for i in range(n)]
    if len(rope) != n:
        raise c.fail(f"no_rope_layers has {len(rope)} entries for {n} layers")
    return ["chunked_attention" if r else "full_attention" for r in rope]


def _qwen_types(c: _Config, n: int, window) -> list[str]:
    """Qwen2Config/Qwen3Config.__post_init__: sliding from layer ``max_window_layers`` on, given a window."""
    start = c.int("max_window_layers", limits.MAX_LAYERS, minimum=0)
    return ["sliding_attention" if window is not None and i >= start else "full_attention" for i in range(n)]


def _qwen2_moe_types(c: _Config, n: int, window) -> list[str]:
    """Qwen2MoeConfig.__post_init__: every other layer below ``max_window_layers`` slides, given the window."""
    start = c.int("max_window_layers", limits.MAX_LAYERS, minimum=0)
    on = bool(c.get("use_sliding_window"))
    return ["sliding_attention" if (i + 1) % 2 and i < start and on else "full_attention" for i in range(n)]


def _jamba_types(c: _Config, n: int, window) -> list[str]:
    """JambaConfig.layers_block_type (a read-only property): attention where ``i % attn_layer_period ==
    attn_layer_offset``, Mamba elsewhere."""
    period = c.int("attn_layer_period", limits.MAX_LAYERS)
    offset = c.int("attn_layer_offset", period - 1, minimum=0)
    return ["full_attention" if i % period == offset else "linear_attention" for i in range(n)]


def _gated_delta_net(c: _Config) -> tuple[int, int]:
    """Qwen3-Next's Gated DeltaNet state per sequence (modeling_qwen3_next.py Qwen3NextGatedDeltaNet; measured,
    docs/DESIGN.md §3c): conv ``[conv_dim = 2·Hk·dk + Hv·dv, kernel]``, recurrent ``[Hv, dk, dv]``."""
    hk, hv = (c.int(k, limits.MAX_HEADS) for k in ("linear_num_key_heads", "linear_num_value_heads"))
    dk, dv, kernel = (c.int(k, limits.MAX_HEAD_DIM) for k in
                      ("linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"))
    return (2 * hk * dk + hv * dv) * kernel, hv * dk * dv


def _mamba_inner(c: _Config) -> int:
    expand = c.int("mamba_expand", limits.MAX_HEADS)
    inner = expand * c.int("hidden_size", limits.MAX_WIDTH)
    if inner > limits.MAX_WIDTH:
        raise c.fail(f"mamba_expand x hidden_size ({inner:,}) is over the limit of {limits.MAX_WIDTH:,}")
    return inner


def _mamba2(c: _Config) -> tuple[int, int]:
    """Granite-4's Mamba-2 state per sequence (modeling_granitemoehybrid.py GraniteMoeHybridMambaLayer.forward:
    ``update_conv_state`` keeps ``[conv_dim = inner + 2·groups·d_state, d_conv]``; ``torch_chunk_scan``'s final
    state is ``[heads, d_head, d_state]``), inner = ``mamba_expand × hidden_size``."""
    inner = _mamba_inner(c)
    heads, groups = c.int("mamba_n_heads", limits.MAX_HEADS), c.int("mamba_n_groups", limits.MAX_HEADS)
    state, kernel = c.int("mamba_d_state", limits.MAX_HEAD_DIM), c.int("mamba_d_conv", limits.MAX_HEAD_DIM)
    d_head = inner // heads if c.get("mamba_d_head") == "auto" else c.int("mamba_d_head", limits.MAX_HEAD_DIM)
    if heads * d_head != inner:  # GraniteMoeHybridConfig.validate_architecture
        raise c.fail(f"mamba_n_heads x mamba_d_head ({heads} x {d_head}) must equal mamba_expand x hidden_size "
                     f"({inner})")
    return (inner + 2 * groups * state) * kernel, heads * d_head * state


def _mamba1(c: _Config) -> tuple[int, int]:
    """Jamba's Mamba state per sequence (modeling_jamba.py JambaMambaMixer.forward: conv ``[inner, d_conv]``,
    ``mamba_selective_scan``'s last state ``[inner, d_state]``), inner = ``mamba_expand × hidden_size``."""
    inner = _mamba_inner(c)
    return inner * c.int("mamba_d_conv", limits.MAX_HEAD_DIM), inner * c.int("mamba_d_state", limits.MAX_HEAD_DIM)


def _lfm2_types(c: _Config, n: int, window) -> list[str]:
    """Lfm2Config.__post_init__ without ``layer_types``: full attention on ``full_attn_idxs`` (default every
    layer), ``conv`` elsewhere."""
    full = set(c.ints("full_attn_idxs", limits.MAX_LAYERS)) if c.get("full_attn_idxs") is not None else set(range(n))
    return ["full_attention" if i in full else "conv" for i in range(n)]


def _lfm2_conv(c: _Config) -> tuple[int, int]:
    """LFM2's short-conv state per sequence: a conv state only, no recurrent state. transformers 5.23
    (modeling_lfm2.py ``Lfm2ShortConv.forward``: ``update_conv_state(B*x, layer_idx, conv_kernel_size=
    conv_L_cache)`` with ``B*x`` of ``[B, hidden_size, seq]``; cache_utils.py ``LinearAttentionLayer.
    lazy_initialization``: ``zeros((*conv_states.shape[:-1], conv_kernel_size))``, model dtype; no
    ``update_recurrent_state`` call, so ``recurrent_states`` stays None) keeps ``[B, hidden_size, conv_L_cache]``;
    an optimum-intel export's ``cache_params.past.conv.N`` variable is ``[?, hidden_size, conv_L_cache]`` too
    (read from the IR)."""
    return c.int("hidden_size", limits.MAX_WIDTH) * c.int("conv_L_cache", limits.MAX_HEAD_DIM), 0


def _lfm2_intermediate(c: _Config, size: int) -> int:
    """Lfm2MLP.__init__ (modeling_lfm2.py): with ``block_auto_adjust_ff_dim``, ``int(2·size/3)``, then with
    ``block_ffn_dim_multiplier`` that times it, rounded up to a multiple of ``block_multiple_of``."""
    if not c.get("block_auto_adjust_ff_dim"):
        return size
    size = int(2 * size / 3)
    multiplier = c.get("block_ffn_dim_multiplier")
    if multiplier is None:
        return size
    if not isinstance(multiplier, (int, float)) or isinstance(multiplier, bool) or multiplier <= 0:
        raise c.fail(f"block_ffn_dim_multiplier must be a positive number, got {multiplier!r}")
    step = c.int("block_multiple_of", limits.MAX_WIDTH)
    return step * -(-int(multiplier * size) // step)


@dataclass(frozen=True)
class Family:
    """What one config class does: its defaults for the fields read here, the layer types it derives without
    ``layer_types``, the window it keeps, its linear layers' state, and its MoE layout."""

    defaults: Mapping[str, object]
    types: Callable[[_Config, int, object], list[str]] = _by_window
    window: Callable[[_Config], object] = _sliding_window
    state: Callable[[_Config], tuple[int, int]] | None = None
    #: The ``layer_types`` entry whose per-sequence state ``state`` gives (LFM2: ``conv``).
    state_type: str = "linear_attention"
    mla: bool = False
    sinks: bool = False
    #: The keys that may hold layer_types in a file (Granite's attribute_map adds ``layers_block_type``);
    #: none: always derived (Jamba's ``layer_types`` is a read-only property).
    types_keys: tuple[str, ...] = ("layer_types",)
    #: The MoE layers (None: every layer from first_k_dense_replace on, bar mlp_only_layers and
    #: decoder_sparse_step), the dense MLP size, and the shared experts' size.
    moe_layers: Callable[[_Config, int], list[int]] | None = None
    dense_key: str = "intermediate_size"
    shared: Callable[[_Config, int], int] | None = None
    #: The dense MLP's real size from the configured one (LFM2's auto-adjusted feed-forward size).
    intermediate: Callable[[_Config, int], int] | None = None
    #: Keyword spellings ``__post_init__`` pops in place of a field (LFM2: ``block_ff_dim`` for
    #: ``intermediate_size``, ``tie_embedding`` for ``tie_word_embeddings``): the alias wins when given.
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: A short-conv linear layer's weights (LFM2: conv kernel from ``conv_L_cache``) instead of Gated DeltaNet's.
    short_conv: bool = False


def _llama4_moe(c: _Config, n: int) -> list[int]:
    """Llama4TextConfig.__post_init__: ``moe_layers``, default every ``interleave_moe_layer_step``-th layer."""
    if c.get("moe_layers") is not None:
        return c.ints("moe_layers", limits.MAX_LAYERS)
    step = c.int("interleave_moe_layer_step", limits.MAX_LAYERS)
    return list(range(step - 1, n, step))


def _jamba_moe(c: _Config, n: int) -> list[int]:
    """JambaConfig.layers_num_experts: experts where ``i % expert_layer_period == expert_layer_offset``."""
    period = c.int("expert_layer_period", limits.MAX_LAYERS)
    offset = c.int("expert_layer_offset", period - 1, minimum=0)
    return [i for i in range(n) if i % period == offset] if c.int("num_experts", limits.MAX_EXPERTS) > 1 else []


#: model_type → its config class's behaviour. Defaults are each class's dataclass field defaults in transformers
#: 5.23 (tests/test_hfconfig.py checks them against the installed classes); ``sliding_window_pattern`` and
#: ``full_attention_interval`` are ``__post_init__`` keyword defaults.
FAMILIES: dict[str, Family] = {
    "llama": Family({"num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None,
                     "intermediate_size": 11008, "vocab_size": 32000, "tie_word_embeddings": False,
                     "max_position_embeddings": 2048}),
    "mistral": Family({"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None,
                       "intermediate_size": 14336, "vocab_size": 32000, "tie_word_embeddings": False,
                       "max_position_embeddings": 131072, "sliding_window": 4096}),
    "mixtral": Family({"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None,
                       "intermediate_size": 14336, "vocab_size": 32000, "tie_word_embeddings": False,
                       "max_position_embeddings": 131072, "sliding_window": None, "num_local_experts": 8,
                       "num_experts_per_tok": 2}),
    "phi3": Family({"num_attention_heads": 32, "num_key_value_heads": None, "intermediate_size": 8192,
                    "vocab_size": 32064, "tie_word_embeddings": False, "max_position_embeddings": 4096,
                    "sliding_window": None}),
    "qwen2": Family({"num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 22016,
                     "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 32768,
                     "sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 28},
                    types=_qwen_types, window=_qwen_window),
    "qwen2_moe": Family({"num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
                         "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 32768,
                         "sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 28,
                         "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                         "shared_expert_intermediate_size": 5632, "mlp_only_layers": None, "decoder_sparse_step": 1},
                        types=_qwen2_moe_types,
                        window=lambda c: c.get("sliding_window") if c.get("use_sliding_window") else 0),
    "qwen3": Family({"num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
                     "intermediate_size": 22016, "vocab_size": 151936, "tie_word_embeddings": False,
                     "max_position_embeddings": 32768, "sliding_window": 4096, "use_sliding_window": False,
                     "max_window_layers": 28}, types=_qwen_types, window=_qwen_window),
    "qwen3_moe": Family({"num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 6144,
                         "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 32768,
                         "sliding_window": 4096, "use_sliding_window": False, "num_experts": 128,
                         "num_experts_per_tok": 8, "moe_intermediate_size": 768, "mlp_only_layers": None,
                         "decoder_sparse_step": 1}, window=_qwen_window),
    "qwen3_next": Family({"num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                          "intermediate_size": 5632, "vocab_size": 151936, "tie_word_embeddings": False,
                          "max_position_embeddings": 32768, "num_experts": 512, "num_experts_per_tok": 10,
                          "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                          "mlp_only_layers": None, "decoder_sparse_step": 1, "linear_conv_kernel_dim": 4,
                          "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                          "linear_num_value_heads": 32, "full_attention_interval": 4},
                         types=lambda c, n, w: _every(c, "full_attention_interval", 4, "linear_attention", n),
                         state=_gated_delta_net),
    "gemma2": Family({"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216,
                      "vocab_size": 256000, "tie_word_embeddings": True, "max_position_embeddings": 8192,
                      "sliding_window": 4096},
                     types=_alternate),
    "gemma3_text": Family({"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                           "intermediate_size": 9216, "vocab_size": 262208, "tie_word_embeddings": True,
                           "max_position_embeddings": 131072, "sliding_window": 4096,
                           "use_bidirectional_attention": False, "sliding_window_pattern": 6},
                          types=lambda c, n, w: _every(c, "sliding_window_pattern", 6, "sliding_attention", n),
                          window=_gemma3_window),
    "gpt_oss": Family({"num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
                       "vocab_size": 201088, "tie_word_embeddings": False, "max_position_embeddings": 131072,
                       "sliding_window": 128, "num_local_experts": 128, "num_experts_per_tok": 4},
                      types=_alternate,
                      sinks=True),
    "llama4_text": Family({"num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                           "intermediate_size": 8192, "intermediate_size_mlp": 16384, "vocab_size": 202048,
                           "tie_word_embeddings": False, "max_position_embeddings": 131072,
                           "attention_chunk_size": 8192, "num_local_experts": 16, "num_experts_per_tok": 1,
                           "moe_layers": None, "interleave_moe_layer_step": 1, "no_rope_layers": None,
                           "no_rope_layer_interval": 4},
                          types=_llama4_types, moe_layers=_llama4_moe, dense_key="intermediate_size_mlp",
                          shared=lambda c, n: c.int("intermediate_size", limits.MAX_WIDTH)),
    "deepseek_v3": Family({"num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
                           "vocab_size": 129280, "tie_word_embeddings": False, "max_position_embeddings": 4096,
                           "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
                           "n_shared_experts": 1, "first_k_dense_replace": 3, "kv_lora_rank": 512,
                           "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128},
                          mla=True),
    "granitemoehybrid": Family({"num_attention_heads": 32, "num_key_value_heads": None, "intermediate_size": 11008,
                                "vocab_size": 32000, "tie_word_embeddings": False, "max_position_embeddings": 2048,
                                "num_local_experts": 8, "num_experts_per_tok": 2, "mamba_n_heads": 128,
                                "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_head": "auto",
                                "mamba_d_conv": 4, "mamba_expand": 2, "shared_intermediate_size": 1024},
                               types=lambda c, n, w: ["linear_attention"] * n, state=_mamba2,
                               types_keys=("layer_types", "layers_block_type"), dense_key="shared_intermediate_size",
                               shared=lambda c, n: c.int("shared_intermediate_size", limits.MAX_WIDTH)),
    "jamba": Family({"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                     "vocab_size": 65536, "tie_word_embeddings": False, "max_position_embeddings": 262144,
                     "num_experts": 16, "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
                     "mamba_expand": 2, "attn_layer_period": 8, "attn_layer_offset": 4, "expert_layer_period": 2,
                     "expert_layer_offset": 1},
                    types=_jamba_types, state=_mamba1, types_keys=(), moe_layers=_jamba_moe),
    "lfm2": Family({"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 12288,
                    "vocab_size": 65536, "tie_word_embeddings": True, "max_position_embeddings": 128000,
                    "conv_L_cache": 3, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0,
                    "block_auto_adjust_ff_dim": True, "full_attn_idxs": None},
                   types=_lfm2_types, state=_lfm2_conv, state_type="conv", intermediate=_lfm2_intermediate,
                   aliases={"block_ff_dim": "intermediate_size", "tie_embedding": "tie_word_embeddings"},
                   short_conv=True),
}
#: The config files' MoE field names, each with its other spellings (gpt-oss writes ``experts_per_token`` too).
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
EXPERTS_PER_TOKEN = ("num_experts_per_tok", "experts_per_token")


# -- reading a file ---------------------------------------------------------------------------------------------

def load_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """The model a ``config.json`` (or a folder holding one) describes; a file that cannot be read, a field
    missing or out of bounds (simkv.limits), an unknown layer type: :class:`ConfigError`, one line."""
    where = f"model config {path}"
    raw = _read_json(Path(path), where)
    file = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    if name is None:
        folder = file.resolve().parent.name
        name = folder if file.name == "config.json" and folder else file.stem
    quant_file = _quant_file(file)
    modelopt = _read_json(quant_file, f"model config {quant_file}") if quant_file else None
    return parse_config(raw, name=name, source=str(path), where=where, hf_quant=modelopt)


def _quant_file(config: Path) -> Path | None:
    """ModelOpt's ``hf_quant_config.json`` beside a config: in its folder, or ``<prefix>_hf_quant_config.json`` beside
    ``<prefix>_config.json`` (the name a collection of configs gives it)."""
    for candidate in (config.parent / "hf_quant_config.json",
                      config.parent / (config.name[: -len("config.json")] + "hf_quant_config.json")):
        if candidate != config and candidate.is_file() and config.name.endswith("config.json"):
            return candidate
    return None


def _read_json(path: Path, where: str) -> dict:
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{where}: the folder holds no config.json")
    elif not path.exists():
        raise ConfigError(f"{where}: no such file or folder")
    try:
        size = path.stat().st_size
        if size > limits.MAX_CONFIG_BYTES:
            raise ConfigError(f"{where}: {size:,} bytes, over the limit of {limits.MAX_CONFIG_BYTES:,} for a config.json")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a UTF-8 text file") from None
    except OSError as err:
        raise ConfigError(f"{where}: cannot be read ({err.strerror or err})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise ConfigError(f"{where}: not valid JSON (nested too deeply)") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the top level must be a JSON object, got {type(raw).__name__}")
    return raw


def parse_config(raw: dict, *, name: str = "config", source: str = "", where: str = "model config",
                 hf_quant: dict | None = None) -> ModelSpec:
    """The model of a parsed ``config.json`` (see the module docstring for the rules); ``hf_quant``: the
    checkpoint's ``hf_quant_config.json``, if it has one."""
    text, model_type = _text_config(raw, where)
    if model_type in REFUSED:
        raise ConfigError(f"{where}: model_type {model_type}: {REFUSED[model_type]}")
    family = FAMILIES.get(model_type)
    if family and family.aliases:
        text = {**text, **{field: text[alias] for alias, field in family.aliases.items() if alias in text}}
    c = _Config(where, text, family.defaults if family else {})
    missing = [k for k in ("num_hidden_layers", "hidden_size") + (() if family else ("num_attention_heads",))
               if c.get(k) is None]
    if missing:
        raise c.fail(f"missing {', '.join(missing)}" + (f" (model_type {model_type})" if model_type else ""))
    keys = family.types_keys if family else ("layer_types",)
    given_types = next((text[k] for k in keys if text.get(k) is not None), None)
    if family is None:
        _refuse_unknown(c, model_type, given_types is not None)
    n = c.int("num_hidden_layers", limits.MAX_LAYERS)
    hidden = c.int("hidden_size", limits.MAX_WIDTH)
    heads = c.int("num_attention_heads", limits.MAX_HEADS)
    kv_heads = c.int("num_key_value_heads", limits.MAX_HEADS, default=heads)
    head_dim = c.int("head_dim", limits.MAX_HEAD_DIM, default=hidden // heads) if not (family and family.mla) else 0
    window = family.window(c) if family else c.get("sliding_window")
    types = _layer_types(c, given_types, n, family, window)
    layers, latent = _layers(c, types, family, kv_heads, head_dim, window)
    if latent:
        heads_mla, k_dim = latent
        kv_heads, head_dim = heads_mla, k_dim
    moe = _moe(c, n, family)
    quant = text.get("quantization_config", raw.get("quantization_config"))
    quantized = quant is not None or hf_quant is not None
    scheme = scheme_of(quant, hf_quant, DTYPE_FORMAT.get(_dtype(raw, text, c, quantized), "bf16"), where)
    spec = dict(
        name=name, layers=n, heads=heads, kv_heads=kv_heads, head_dim=head_dim, hidden=hidden,
        intermediate=moe.pop("intermediate"), vocab=c.int("vocab_size", limits.MAX_WIDTH, default=0),
        tied_embeddings=_tied(raw, text, c), **moe,
        q_lora_rank=c.int("q_lora_rank", limits.MAX_HEAD_DIM, default=0) if family and family.mla else 0,
        linear_dims=_linear_dims(c) if family and family.state is _gated_delta_net else None,
        short_conv=c.int("conv_L_cache", limits.MAX_HEAD_DIM) if family and family.short_conv else 0,
        dtype=_dtype(raw, text, c, quantized), source=source, weight_scheme=scheme,
        context=c.int("max_position_embeddings", limits.MAX_TOKENS, default=0),
    )
    first = layers[0]
    if all(layer == first for layer in layers) and first.kind in ("full", "sliding") and first.latent is None \
            and not first.sinks and first.k_dim == first.v_dim == head_dim and first.kv_heads == kv_heads:
        spec["sliding_window"] = first.window  # uniform: the fields above say it all (the fast path's model)
    else:
        spec["layer_kv"] = tuple(layers)
    try:
        return ModelSpec(**spec)
    except ConfigError as err:
        raise c.fail(str(err)) from None


def _text_config(raw: dict, where: str) -> tuple[dict, str | None]:
    """The decoder's config: ``text_config`` of a multimodal wrapper (Gemma-3, Llama-4, Mistral-3), else the file."""
    outer = raw.get("model_type")
    if "text_config" not in raw:
        return raw, outer if isinstance(outer, str) else None
    text = raw["text_config"]
    if text is None:
        text = {}
    if not isinstance(text, dict):
        raise ConfigError(f"{where}: text_config must be a JSON object, got {type(text).__name__}")
    model_type = text.get("model_type") or WRAPPERS.get(outer)
    return text, model_type if isinstance(model_type, str) else None


def _refuse_unknown(c: _Config, model_type: str | None, has_types: bool) -> None:
    """A model type not in FAMILIES is read by the generic rule only where that rule is certain to hold."""
    keys = [k for k in STORAGE_KEYS if c.values.get(k) is not None]
    keys += [k for k in c.values if k.startswith(STORAGE_PREFIXES) and c.values[k] is not None]
    if not has_types:
        keys += [k for k in PATTERN_KEYS if c.values.get(k) is not None]
    if keys:
        what = f"model_type {model_type!r}" if model_type else "a config without model_type"
        raise c.fail(f"{what} is not a family simkv reads ({', '.join(FAMILIES)}), and its {', '.join(keys)} "
                     "decide its layers in a way only its own config class knows")


def _layer_types(c: _Config, given, n: int, family: Family | None, window) -> list[str]:
    if given is None:
        return family.types(c, n, window) if family else _by_window(c, n, window)
    if not isinstance(given, list) or not all(isinstance(t, str) for t in given):
        raise c.fail(f"layer_types must be a list of strings, got {given!r}")
    if len(given) != n:
        raise c.fail(f"layer_types has {len(given)} entries for num_hidden_layers {n}")
    types = [LEGACY_LAYER_TYPES.get(t, t) for t in given]
    for bad, known in ((lambda t: t not in KIND_OF_TYPE and t not in NOT_MODELLED, False),
                       (lambda t: t in NOT_MODELLED, True)):
        at = [i for i, t in enumerate(types) if bad(t)]
        if at:
            names = ", ".join(sorted({given[i] for i in at}, key=given.index))
            where = f"layer {at[0]}" if len(at) == 1 else f"layers {at[0]}, {at[1]}" + (" ..." if len(at) > 2 else "")
            if known:
                raise c.fail(f"layer type {names} ({where}) is not one simkv models")
            raise c.fail(f"unknown layer type {names} ({where}); known: {', '.join(KIND_OF_TYPE)}, "
                         f"legacy {', '.join(LEGACY_LAYER_TYPES)}")
    return types


def _layers(c: _Config, types: list[str], family: Family | None, kv_heads: int, head_dim: int,
            window) -> tuple[list[LayerKV], tuple[int, int] | None]:
    """One LayerKV per layer type; for MLA also (heads, K head size) of the decompressed form."""
    latent = None
    if family and family.mla:  # DeepseekV3Attention: latent kv_lora_rank + rope dims; per-head K nope + rope, V v_head
        rank = c.int("kv_lora_rank", limits.MAX_HEAD_DIM)
        rope, nope = c.int("qk_rope_head_dim", limits.MAX_HEAD_DIM), c.int("qk_nope_head_dim", limits.MAX_HEAD_DIM)
        v_dim = c.int("v_head_dim", limits.MAX_HEAD_DIM)
        heads = c.int("num_attention_heads", limits.MAX_HEADS)
        attn = dict(kv_heads=heads, k_dim=nope + rope, v_dim=v_dim, latent=(rank, rope))
        latent = (heads, nope + rope)
    else:
        attn = dict(kv_heads=kv_heads, k_dim=head_dim, v_dim=head_dim, sinks=bool(family and family.sinks))
    sliding = chunk = state = None
    out = []
    for i, t in enumerate(types):
        kind = KIND_OF_TYPE[t]
        if kind == "sliding":
            if sliding is None:
                sliding = _window(c, window, "sliding_window", i)
            out.append(LayerKV("sliding", window=sliding, **attn))
        elif kind == "chunked":
            if chunk is None:
                chunk = _window(c, c.get("attention_chunk_size"), "attention_chunk_size", i)
            out.append(LayerKV("chunked", window=chunk, **attn))
        elif kind == "linear":
            if family is None or family.state is None or family.state_type != t:
                known = [k for k, f in FAMILIES.items() if f.state and f.state_type == t]
                raise c.fail(f"layer {i} is {t}, whose state shapes simkv knows only for "
                             f"{', '.join(known) or 'no model type'}")
            if state is None:
                state = family.state(c)
            out.append(LayerKV("linear", conv_elements=state[0], recurrent_elements=state[1]))
        elif kind == "none":
            out.append(LayerKV("none"))
        else:
            out.append(LayerKV("full", **attn))
    return out, latent


def _window(c: _Config, value, key: str, layer: int) -> int:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value <= 0):
        raise c.fail(f"layer {layer} is {'sliding' if key == 'sliding_window' else 'chunked'} but {key} is "
                     f"{'not set' if value is None else value}")
    if not isinstance(value, int) or isinstance(value, bool) or value > limits.MAX_TOKENS:
        raise c.fail(f"{key} must be an integer from 1 to {limits.MAX_TOKENS:,}, got {value!r}")
    return value


def _moe(c: _Config, n: int, family: Family | None) -> dict:
    """MoE fields of ModelSpec; ``intermediate`` is the dense MLP's size (0: unknown)."""
    dense_key = family.dense_key if family else "intermediate_size"
    out = {"intermediate": c.int(dense_key, limits.MAX_WIDTH, default=0)}
    if family and family.intermediate and out["intermediate"]:
        out["intermediate"] = family.intermediate(c, out["intermediate"])
    experts = c.first(EXPERTS, limits.MAX_EXPERTS)
    if family and family.moe_layers is not None:
        moe_layers = sorted({i for i in family.moe_layers(c, n) if i < n})
    elif experts:
        first_dense = c.int("first_k_dense_replace", limits.MAX_LAYERS, minimum=0, default=0)
        only = set(c.ints("mlp_only_layers", limits.MAX_LAYERS))
        step = c.int("decoder_sparse_step", limits.MAX_LAYERS, default=1)
        moe_layers = [i for i in range(first_dense, n) if i not in only and (i + 1) % step == 0]
    else:
        moe_layers = []
    if not experts or not moe_layers:
        return out
    per_token = c.first(EXPERTS_PER_TOKEN, limits.MAX_EXPERTS, minimum=1)
    if not per_token:
        raise c.fail(f"missing {EXPERTS_PER_TOKEN[0]} (a model of {experts} experts)")
    if per_token > experts:
        raise c.fail(f"{EXPERTS_PER_TOKEN[0]} must be from 1 to the {experts} experts, got {per_token}")
    size = "moe_intermediate_size" if c.get("moe_intermediate_size") is not None else "intermediate_size"
    expert = c.int(size, limits.MAX_WIDTH)
    if family and family.shared is not None:
        shared = family.shared(c, n)
    elif c.get("shared_expert_intermediate_size") is not None:
        shared = c.int("shared_expert_intermediate_size", limits.MAX_WIDTH, minimum=0)
    else:
        shared = c.int("n_shared_experts", limits.MAX_EXPERTS, minimum=0, default=0) * expert
    return out | dict(experts=experts, experts_per_token=per_token, expert_intermediate=expert,
                      shared_intermediate=shared, dense_layers=n - len(moe_layers))


def _linear_dims(c: _Config) -> tuple[int, int, int, int, int]:
    return tuple(c.int(k, limits.MAX_HEADS if "num" in k else limits.MAX_HEAD_DIM) for k in (
        "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
        "linear_conv_kernel_dim"))


def _tied(raw: dict, text: dict, c: _Config) -> bool:
    """``tie_word_embeddings``: the text config's, else the file's top level, else the family default."""
    for where in (text, raw):
        if where.get("tie_word_embeddings") is not None:
            value = where["tie_word_embeddings"]
            if not isinstance(value, bool):
                raise c.fail(f"tie_word_embeddings must be true or false, got {value!r}")
            return value
    return bool(c.defaults.get("tie_word_embeddings", False))


#: A config's dtype → the weight format of its unquantized weights.
DTYPE_FORMAT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def _dtype(raw: dict, text: dict, c: _Config, quantized: bool = False) -> str:
    """The activation (and unquantized weights') dtype: ``dtype``, or ``torch_dtype`` in files written before
    transformers 5. A file that gives none: both runtimes then read the dtype from the weights' files, which
    simkv does not have — transformers 5.23 ``_get_dtype`` with ``dtype="auto"`` (``from_pretrained``'s default)
    takes the first floating tensor of the checkpoint that is not float8/float4 (``get_state_dict_dtype``), vLLM
    ``_find_dtype`` the common dtype of the safetensors metadata's parameters, and float32 only where no file says
    (then ``_resolve_auto_dtype`` downcasts float32 to the platform's first dtype, bfloat16 on CUDA). So:

    - a quantized checkpoint without a dtype (gpt-oss's mxfp4, MiniMax-M2's fp8): ``bfloat16``, the dtype of the
      tensors its quantizer leaves unquantized (gpt-oss: attention, router, embeddings in bf16);
    - an unquantized one: torch's default float32, what ``from_config`` builds (``PreTrainedConfig.dtype``
      defaults to None) and what simkv's transformers validation runs."""
    for where in (text, raw):
        for key in ("dtype", "torch_dtype"):
            value = where.get(key)
            if value is not None:
                if not isinstance(value, str):
                    raise c.fail(f"{key} must be a string such as \"bfloat16\", got {value!r}")
                return value
    return "bfloat16" if quantized else "float32"


# -- presets and the one resolver of --model ---------------------------------------------------------------------

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

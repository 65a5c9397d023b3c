"""What every family module builds on: a config's values with its class's defaults (:class:`Config`), the
:class:`Family` record each module registers, the layer-type names transformers uses, the fields no KV layout
depends on, and the rules several families share.

A family module (``simkv/hfconfig/<family>.py``) names its source — the transformers config class and modeling
file, or vLLM's model file — and the fields it reads; :mod:`simkv.hfconfig.registry` lists them all.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from simkv import limits
from simkv.errors import ConfigError

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
                "minimax_m3_sparse", "hybrid", "hybrid_sliding", "reference_sliding_attention",
                "deepseek_sparse_attention", "qwen_sparse_attention")
#: The config files' MoE field names, each with its other spellings (gpt-oss writes ``experts_per_token`` too).
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
EXPERTS_PER_TOKEN = ("num_experts_per_tok", "experts_per_token")

#: Fields every reader reads the same way (the decoder's shape, its MoE, its window) — a family reads these unless
#: it says otherwise; the generic reader of an unknown model type reads only these.
COMMON = ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
          "intermediate_size", "vocab_size", "tie_word_embeddings", "sliding_window", "attention_chunk_size",
          "layer_types", "max_position_embeddings", *EXPERTS, *EXPERTS_PER_TOKEN, "moe_intermediate_size",
          "shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace", "mlp_only_layers",
          "decoder_sparse_step", "dtype", "torch_dtype", "quantization_config", "text_config")
#: Fields that change no layer's cache and no weight simkv counts: token ids, positions, norms, activations,
#: dropout and initialisation, routing arithmetic, generation defaults, bookkeeping (PreTrainedConfig's own).
NEUTRAL = frozenset((
    "architectures", "auto_map", "transformers_version", "_name_or_path", "name_or_path", "use_cache",
    "initializer_range", "hidden_act", "hidden_activation", "mlp_hidden_act", "rms_norm_eps", "layer_norm_eps",
    "layer_norm_epsilon", "norm_eps", "attention_bias", "mlp_bias", "use_bias", "attention_dropout", "hidden_dropout",
    "bos_token_id", "eos_token_id", "pad_token_id", "rope_theta", "rope_scaling", "rope_parameters",
    "partial_rotary_factor", "rotary_dim", "pretraining_tp", "output_router_logits", "router_aux_loss_coef",
    "router_jitter_noise", "norm_topk_prob", "scoring_func", "topk_method", "n_group", "topk_group",
    "routed_scaling_factor", "aux_loss_alpha", "seq_aux", "ep_size", "use_qk_norm", "qk_norm_type",
    "final_logit_softcapping", "attn_logit_softcapping", "query_pre_attn_scalar", "initial_context_length",
    "swiglu_limit", "swiglu_alpha", "use_routing_bias", "num_logits_to_keep", "logits_to_keep", "tokenizer_class",
    "is_decoder", "is_encoder_decoder", "add_cross_attention", "torchscript", "use_bfloat16", "return_dict",
    "output_attentions", "output_hidden_states", "id2label", "label2id", "problem_type", "finetuning_task",
    "task_specific_params", "prefix", "chunk_size_feed_forward", "tie_encoder_decoder", "pruned_heads",
    "sep_token_id", "decoder_start_token_id", "model_name", "embedding_multiplier", "logits_scaling",
    "residual_multiplier", "attention_multiplier", "use_mrope", "mrope_section", "rescale_prenorm_residual",
    "residual_in_fp32", "time_step_floor", "time_step_max", "time_step_min", "time_step_limit",
))
#: Generation defaults older files carry (``max_length``, ``num_beams`` ...) and other names no reader needs.
NEUTRAL_PATTERN = re.compile(r"^(.*_token_ids?|.*dropout.*|.*_init.*|init_.*|rope_.*|.*_rope_theta|.*softcap.*|"
                             r"max_length|min_length|do_sample|early_stopping|num_beams|num_beam_groups|"
                             r"diversity_penalty|temperature|top_k|top_p|typical_p|repetition_penalty|length_penalty|"
                             r"no_repeat_ngram_size|encoder_no_repeat_ngram_size|bad_words_ids|num_return_sequences|"
                             r"output_scores|return_dict_in_generate|forced_.*|remove_invalid_values|"
                             r"exponential_decay_length_penalty|suppress_tokens|begin_suppress_tokens|"
                             r"tf_legacy_loss|cross_attention_hidden_size|.*_eps|.*epsilon)$")
#: Names that may decide what a layer keeps or weighs: in a field no reader reads, refused (one line).
LAYOUT_PATTERN = re.compile(r"head|kv|key|value|layer|window|attn|attention|swa|sliding|chunk|lora|rank|state|conv|"
                            r"mamba|ssm|linear|block|pattern|sparse|index|share|hybrid|latent|cache|dim|group|expert|"
                            r"moe|mlp|ffn|intermediate|hidden|width|size|interval|period|offset|mixer|compress|"
                            r"gate|proj|memory")
_MISSING = object()


class Config:
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
        if not isinstance(value, list) or len(value) > limits.MAX_LAYERS or not all(
                isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= bound for v in value):
            raise self.fail(f"{key} must be a list of integers from {minimum} to {bound:,}, got {_short(value)}")
        return value

    def first(self, keys: tuple[str, ...], bound: int, *, minimum: int = 0) -> int:
        """The first of several names for one field (``num_local_experts`` / ``num_experts`` ...); 0 if none."""
        for key in keys:
            if self.get(key) is not None:
                return self.int(key, bound, minimum=minimum)
        return 0


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- rules several config classes share (transformers 5.23, models/<family>/configuration_<family>.py) ------------

def sliding_window(c: Config):
    return c.get("sliding_window")


def by_window(c: Config, n: int, window) -> list[str]:
    """cache_utils.get_layer_types_and_kwargs without ``layer_types``: sliding, else chunked, else full."""
    if window is not None:
        return ["sliding_attention"] * n
    if c.get("attention_chunk_size") is not None:
        return ["chunked_attention"] * n
    return ["full_attention"] * n


def every(c: Config, key: str, default: int, other: str, n: int) -> list[str]:
    """``other`` on each layer but every ``key``-th, which is full (Gemma-2/3, gpt-oss, Qwen3-Next)."""
    k = c.values.get(key, default)  # a constructor argument, not a stored field: its default is in __post_init__
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise c.fail(f"{key} must be a positive integer, got {k!r}")
    return [other if (i + 1) % k else "full_attention" for i in range(n)]


def alternate(c: Config, n: int, window) -> list[str]:
    """Gemma2Config / GptOssConfig.__post_init__: sliding where ``(i+1) % 2``, i.e. layers 0, 2, 4 ..."""
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]


def ssm_dtype_from(key: str) -> Callable[[Config], str]:
    """The reader of a config field that names the recurrent state's dtype for vLLM (its ``MambaDType``:
    vllm/config/cache.py; "auto" or absent: the model dtype, mamba_utils.py ``_mamba_state_dtype``)."""
    def read(c: Config) -> str:
        value = c.get(key)
        if value in (None, "auto"):
            return ""
        if value not in ("float32", "bfloat16", "float16"):
            raise c.fail(f"{key} must be float32, bfloat16, float16 or auto, got {_short(value)}")
        return value
    return read


def mamba_inner(c: Config, expand_key: str = "mamba_expand") -> int:
    expand = c.int(expand_key, limits.MAX_HEADS)
    inner = expand * c.int("hidden_size", limits.MAX_WIDTH)
    if inner > limits.MAX_WIDTH:
        raise c.fail(f"{expand_key} x hidden_size ({inner:,}) is over the limit of {limits.MAX_WIDTH:,}")
    return inner


@dataclass(frozen=True)
class Family:
    """What one config class does: its defaults for the fields read here, the layer types it derives without
    ``layer_types``, the window it keeps, its linear layers' state, and its MoE layout.

    ``reads``: the fields this family understands besides :data:`COMMON` and its defaults' keys; a field of the
    file that is in none of them, not :data:`NEUTRAL`, and whose name may concern the layout is refused.
    ``source``: where its rules were read (a transformers config class and modeling file, a vLLM model file).
    ``layers``: a family that builds its per-layer specs itself (per-layer heads and sizes) gives the function;
    it returns one :class:`~simkv.kvspec.LayerKV` per layer."""

    defaults: Mapping[str, object]
    types: Callable[[Config, int, object], list[str]] = by_window
    window: Callable[[Config], object] = sliding_window
    state: Callable[[Config], tuple[int, int]] | None = None
    #: The ``layer_types`` entry whose per-sequence state ``state`` gives (LFM2: ``conv``).
    state_type: str = "linear_attention"
    mla: bool = False
    #: MLA with DeepSeek sparse attention's indexer (``index_n_heads``, ``index_head_dim``): its key per token.
    indexer: bool = False
    #: Which MLA layers build the indexer (and keep its key), from ``(config, layers)``; None: every one.
    indexed: Callable[[Config, int], list[bool]] | None = None
    sinks: bool = False
    #: The keys that may hold layer_types in a file (Granite's attribute_map adds ``layers_block_type``);
    #: none: always derived (Jamba's ``layer_types`` is a read-only property).
    types_keys: tuple[str, ...] = ("layer_types",)
    #: The MoE layers (None: every layer from first_k_dense_replace on, bar mlp_only_layers and
    #: decoder_sparse_step), the dense MLP size, and the shared experts' size.
    moe_layers: Callable[[Config, int], list[int]] | None = None
    dense_key: str = "intermediate_size"
    shared: Callable[[Config, int], int] | None = None
    #: The dense MLP's real size from the configured one (LFM2's auto-adjusted feed-forward size).
    intermediate: Callable[[Config, int], int] | None = None
    #: Keyword spellings ``__post_init__`` pops in place of a field (LFM2: ``block_ff_dim`` for
    #: ``intermediate_size``, ``tie_embedding`` for ``tie_word_embeddings``): the alias wins when given.
    aliases: Mapping[str, str] = field(default_factory=dict)
    #: A short-conv linear layer's weights (LFM2: conv kernel from ``conv_L_cache``) instead of Gated DeltaNet's.
    short_conv: bool = False
    reads: tuple[str, ...] = ()
    source: str = ""
    layers: Callable | None = None
    #: Each layer's dense MLP size where layers differ (Nemotron-NAS), from ``(config, layers)``.
    per_layer_mlp: Callable | None = None
    #: Fields checked by a family's own rule before reading (e.g. a per-kind size that must equal another).
    check: Callable[[Config], None] | None = None
    #: The layer count where it is not ``num_hidden_layers`` (Nemotron-H: the length of its block list).
    num_layers: Callable[[Config], int] | None = None
    #: Mamba-2 layers' (heads, head size, groups, state size, conv kernel), for their weights and vLLM's conv.
    mamba_dims: Callable[[Config], tuple[int, int, int, int, int]] | None = None
    #: ModelSpec.attn_output_gate / full_k_eq_v from the config (a q_proj with an output gate; full layers with
    #: no v_proj).
    output_gate: Callable[[Config], bool] | None = None
    k_eq_v: Callable[[Config], bool] | None = None
    #: Mamba-1 layers' (inner, state size, conv kernel, time-step rank), for their weights and vLLM's conv.
    mamba1_dims: Callable[[Config], tuple[int, int, int, int]] | None = None
    #: Matrices per MLP and expert: 3 gated (SwiGLU), 2 for a plain up/down MLP (Nemotron-H's relu²).
    mlp_matrices: int = 3
    #: The recurrent state's dtype vLLM keeps where it is not the model's (Nemotron-H's mamba_ssm_cache_dtype).
    ssm_dtype: Callable[[Config], str] | None = None
    #: Why the weights of a config cannot be sized exactly ("" when they can): its KV is still read.
    weights_refused: Callable[[Config], str] | None = None

    def understood(self) -> frozenset[str]:
        return frozenset((*COMMON, *self.defaults, *self.reads, *self.aliases, *self.types_keys))

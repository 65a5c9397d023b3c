"""Reading a ``config.json`` file: its text decoder's config, every field checked against what its family's
module reads, the per-layer specs, the MoE, the dtype and the checkpoint's weight formats."""

from __future__ import annotations

from pathlib import Path

from simkv import limits
from simkv.errors import ConfigError
from simkv.hfconfig.base import (COMMON, EXPERTS, EXPERTS_PER_TOKEN, KIND_OF_TYPE, LAYOUT_PATTERN, LEGACY_LAYER_TYPES,
                                 NEUTRAL, NEUTRAL_PATTERN, NOT_MODELLED, Config, Family, by_window)
from simkv.hfconfig.qwen3_next import gated_delta_net
from simkv.hfconfig.registry import FAMILIES, MODULE_OF, REFUSED, WRAPPERS
from simkv.jsonfile import read_json_object
from simkv.kvspec import LayerKV
from simkv.models import ModelSpec
from simkv.weights import scheme_of, vllm_auto_kv_dtype


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


def field_report(path: str | Path) -> dict:
    """Which of a config file's fields simkv read and which it set aside as changing no layout (``simkv models
    --model``): its model type, the module that reads it, and the two lists."""
    raw = _read_json(Path(path), f"model config {path}")
    text, model_type = _text_config(raw, f"model config {path}")
    family = FAMILIES.get(model_type)
    understood = family.understood() if family else frozenset(COMMON)
    read = [k for k in text if k in understood or (family and k in family.aliases)]
    return {"model_type": model_type, "reader": MODULE_OF.get(model_type, "generic decoder"), "read": read,
            "neutral": [k for k in text if k not in read]}


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
    return read_json_object(path, where, limits.MAX_CONFIG_BYTES, "a config.json")


def parse_config(raw: dict, *, name: str = "config", source: str = "", where: str = "model config",
                 hf_quant: dict | None = None) -> ModelSpec:
    """The model of a parsed ``config.json`` (see the package docstring for the rules); ``hf_quant``: the
    checkpoint's ``hf_quant_config.json``, if it has one."""
    text, model_type = _text_config(raw, where)
    if model_type in REFUSED:
        raise ConfigError(f"{where}: model_type {model_type}: {REFUSED[model_type]}")
    family = FAMILIES.get(model_type)
    if family and family.aliases:
        text = {**text, **{field: text[alias] for alias, field in family.aliases.items() if alias in text}}
    c = Config(where, text, family.defaults if family else {})
    counted = family is not None and family.num_layers is not None  # the layer count from the block list
    missing = [k for k in ("hidden_size",) + (() if counted else ("num_hidden_layers",))
               + (() if family else ("num_attention_heads",)) if c.get(k) is None]
    if missing:
        raise c.fail(f"missing {', '.join(missing)}" + (f" (model_type {model_type})" if model_type else ""))
    _refuse_unread(c, family, model_type)
    if family and family.check:
        family.check(c)
    keys = family.types_keys if family else ("layer_types",)
    given_types = next((text[k] for k in keys if text.get(k) is not None), None)
    n = family.num_layers(c) if counted else c.int("num_hidden_layers", limits.MAX_LAYERS)
    hidden = c.int("hidden_size", limits.MAX_WIDTH)
    heads = c.int("num_attention_heads", limits.MAX_HEADS)
    if family and family.layers:
        layers, latent = family.layers(c, n), None
        first = next((layer for layer in layers if layer.caches_tokens), None)
        if first is None:
            raise c.fail("no layer keeps a cache")
        kv_heads, head_dim = first.kv_heads, first.k_dim
    else:
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
    scheme = scheme_of(quant, hf_quant, DTYPE_FORMAT.get(_dtype(raw, text, c, quantized), "bf16"), where, n)
    spec = dict(
        name=name, layers=n, heads=heads, kv_heads=kv_heads, head_dim=head_dim, hidden=hidden,
        intermediate=moe.pop("intermediate"), vocab=c.int("vocab_size", limits.MAX_WIDTH, default=0),
        tied_embeddings=_tied(raw, text, c), **moe,
        q_lora_rank=c.int("q_lora_rank", limits.MAX_HEAD_DIM, default=0) if family and family.mla else 0,
        linear_dims=_linear_dims(c) if family and family.state is gated_delta_net else None,
        short_conv=c.int("conv_L_cache", limits.MAX_HEAD_DIM) if family and family.short_conv else 0,
        mamba_dims=family.mamba_dims(c) if family and family.mamba_dims else None,
        mamba1_dims=family.mamba1_dims(c) if family and family.mamba1_dims else None,
        attn_output_gate=bool(family and family.output_gate and family.output_gate(c)),
        full_k_eq_v=bool(family and family.k_eq_v and family.k_eq_v(c)),
        mlp_matrices=family.mlp_matrices if family else 3,
        ssm_dtype=family.ssm_dtype(c) if family and family.ssm_dtype else "",
        weights_refused=family.weights_refused(c) if family and family.weights_refused else "",
        dtype=_dtype(raw, text, c, quantized), source=source, weight_scheme=scheme,
        vllm_kv_dtype=vllm_auto_kv_dtype(quant, hf_quant),
        context=c.int("max_position_embeddings", limits.MAX_TOKENS, default=0),
        layer_intermediate=family.per_layer_mlp(c, n) if family and family.per_layer_mlp else (),
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
    """The decoder's config: ``text_config`` of a multimodal wrapper (Gemma-3/4, Llama-4, Mistral-3, Qwen3-VL,
    Qwen3.5, Kimi-K2.5), else the file; its model type, else the wrapper's text type, else the wrapper's own."""
    outer = raw.get("model_type")
    if "text_config" not in raw:
        return raw, outer if isinstance(outer, str) else None
    text = raw["text_config"]
    if text is None:
        text = {}
    if not isinstance(text, dict):
        raise ConfigError(f"{where}: text_config must be a JSON object, got {type(text).__name__}")
    model_type = text.get("model_type") or WRAPPERS.get(outer) or outer
    return text, model_type if isinstance(model_type, str) else None


def _refuse_unread(c: Config, family: Family | None, model_type: str | None) -> None:
    """Every field must be one the reader understands (its family's, or the common decoder fields), or one no
    layout depends on (:data:`~simkv.hfconfig.base.NEUTRAL`). Otherwise the file is refused, naming the fields:
    in a known family those whose names may concern the layout (a new field of that family), in a model type no
    module reads every such field — the generic decoder reads only configs it understands whole."""
    understood = family.understood() if family else frozenset(COMMON)
    unread = [k for k, v in c.values.items() if v is not None and k not in understood and k not in NEUTRAL
              and not NEUTRAL_PATTERN.match(k)]
    if family:
        unread = [k for k in unread if LAYOUT_PATTERN.search(k)]
    if not unread:
        return
    shown = ", ".join(unread[:6]) + (f" and {len(unread) - 6} more" if len(unread) > 6 else "")
    if family:
        raise c.fail(f"model_type {model_type}: {shown} not read by simkv's {MODULE_OF[model_type]} reader, and "
                     "may change what a layer caches")
    what = f"model_type {model_type!r}" if model_type else "a config without model_type"
    raise c.fail(f"{what} is not a family simkv reads, and its {shown} may change what a layer caches "
                 f"(families: {', '.join(FAMILIES)}; refused: {', '.join(REFUSED)})")


def _layer_types(c: Config, given, n: int, family: Family | None, window) -> list[str]:
    if given is None:
        return family.types(c, n, window) if family else by_window(c, n, window)
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


def _layers(c: Config, types: list[str], family: Family | None, kv_heads: int, head_dim: int,
            window) -> tuple[list[LayerKV], tuple[int, int] | None]:
    """One LayerKV per layer type; for MLA also (heads, K head size) of the decompressed form."""
    latent = None
    if family and family.mla:  # DeepseekV3Attention: latent kv_lora_rank + rope dims; per-head K nope + rope, V v_head
        rank = c.int("kv_lora_rank", limits.MAX_HEAD_DIM)
        rope, nope = c.int("qk_rope_head_dim", limits.MAX_HEAD_DIM), c.int("qk_nope_head_dim", limits.MAX_HEAD_DIM)
        v_dim = c.int("v_head_dim", limits.MAX_HEAD_DIM)
        heads = c.int("num_attention_heads", limits.MAX_HEADS)
        attn = dict(kv_heads=heads, k_dim=nope + rope, v_dim=v_dim, latent=(rank, rope))
        if family.indexer:  # vLLM deepseek_v2.py Indexer: n_head = index_n_heads, head_dim = index_head_dim
            attn["indexer"] = (c.int("index_n_heads", limits.MAX_HEADS), c.int("index_head_dim", limits.MAX_HEAD_DIM))
        latent = (heads, nope + rope)
    else:
        attn = dict(kv_heads=kv_heads, k_dim=head_dim, v_dim=head_dim, sinks=bool(family and family.sinks))
    sliding = chunk = state = None
    indexed = family.indexed(c, len(types)) if family and family.indexer and family.indexed else None
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
        elif indexed is not None and not indexed[i]:  # a layer that reuses another layer's top-k: no indexer
            out.append(LayerKV("full", **{**attn, "indexer": None}))
        else:
            out.append(LayerKV("full", **attn))
    return out, latent


def _window(c: Config, value, key: str, layer: int) -> int:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value <= 0):
        raise c.fail(f"layer {layer} is {'sliding' if key == 'sliding_window' else 'chunked'} but {key} is "
                     f"{'not set' if value is None else value}")
    if not isinstance(value, int) or isinstance(value, bool) or value > limits.MAX_TOKENS:
        raise c.fail(f"{key} must be an integer from 1 to {limits.MAX_TOKENS:,}, got {value!r}")
    return value


def _moe(c: Config, n: int, family: Family | None) -> dict:
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
    # interleaved MoE layers (Jamba, Nemotron-H) are named; the last ones are ModelSpec's default
    moe_at = tuple(moe_layers) if moe_layers != list(range(n - len(moe_layers), n)) else ()
    return out | dict(experts=experts, experts_per_token=per_token, expert_intermediate=expert,
                      shared_intermediate=shared, dense_layers=n - len(moe_layers), moe_at=moe_at)


def _linear_dims(c: Config) -> tuple[int, int, int, int, int]:
    return tuple(c.int(k, limits.MAX_HEADS if "num" in k else limits.MAX_HEAD_DIM) for k in (
        "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
        "linear_conv_kernel_dim"))


def _tied(raw: dict, text: dict, c: Config) -> bool:
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


def _dtype(raw: dict, text: dict, c: Config, quantized: bool = False) -> str:
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



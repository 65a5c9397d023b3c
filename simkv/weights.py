"""Weight formats: how many bytes a weight takes in each storage format (its scales included), and which part
of a model a quantized checkpoint stores in which format.

The one question the cost model and the memory model ask is "how many parameters of these matmuls are in which
format": :func:`simkv.models.params_by_format` answers it from a :class:`~simkv.models.ModelSpec` and a
precision — one of :data:`FORMATS` for every weight (``--weights-precision fp8``), or ``"checkpoint"`` for what
the checkpoint's ``quantization_config`` / ``hf_quant_config.json`` says (a :class:`WeightScheme`, read by
:func:`scheme_of`). :attr:`WeightFormat.compute` names the matmul precision a format runs at, for a device's
peak FLOP/s per precision.

The parts of a model (:data:`ROLES`) are those a quantization recipe names: the input embedding table (a lookup,
never a matmul), the LM head, per layer the projections into attention or a state mixer (``attn_in``: q/k/v, MLA's
``q_a``/``q_b``/``kv_a``/``kv_b``, a linear-attention or Mamba ``in_proj``), the projection out of it
(``attn_out``: ``o_proj``/``out_proj``), the dense MLP, the routed experts, the shared experts and the router.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass

from simkv.errors import ConfigError

ROLES = ("embed", "lm_head", "attn_in", "attn_out", "mlp", "experts", "shared", "router")
#: The roles inside a decoder layer (the others are the model's two vocabulary matrices).
LAYER_ROLES = ROLES[2:]


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """One storage format: ``bits`` per weight element plus ``scale_bytes`` of scales (and zero-points) per
    ``group`` elements (``group`` 0: one scale per tensor or per output channel, whose bytes are left out: under
    0.1 % of a matrix of 1,024 columns or more). ``compute``: the precision its matmuls run at on a device
    that has a kernel for it (a key of :attr:`simkv.cost.Device.peak_flops` where the device lists it)."""

    name: str
    bits: int
    group: int = 0
    scale_bytes: float = 0.0
    compute: str = "bf16"
    source: str = ""

    @property
    def bytes_per_weight(self) -> float:
        """Bytes of one weight, its share of the group's scales included."""
        return self.bits / 8 + (self.scale_bytes / self.group if self.group else 0.0)


def _int4(group: int, source: str) -> WeightFormat:
    """AWQ / GPTQ int4 with group scales: f16 ``scales`` and 4-bit ``qzeros`` packed eight to an int32 per group of
    ``group`` input rows and output column (AutoGPTQ / AutoAWQ ``QuantLinear``: ``qweight`` int32 ``[in/8, out]``,
    ``qzeros`` int32 ``[in/group, out/8]``, ``scales`` f16 ``[in/group, out]``): 0.5 B + 2.5 B / group."""
    return WeightFormat(f"int4-g{group}", 4, group, 2.5, "int4", source)


FORMATS: dict[str, WeightFormat] = {f.name: f for f in (
    WeightFormat("f32", 32, compute="f32"),
    WeightFormat("f16", 16, compute="f16"),
    WeightFormat("bf16", 16, compute="bf16"),
    # optimum-intel's int8 / int4 (the OpenVINO presets' defaults): scales per output channel.
    WeightFormat("int8", 8, compute="int8"),
    WeightFormat("int4", 4, compute="int4"),
    WeightFormat("fp8", 8, compute="fp8", source="per-tensor e4m3 with one f32 scale per tensor (transformers "
                 "FineGrainedFP8 without weight_block_size; vLLM Fp8LinearMethod; ModelOpt FP8)"),
    WeightFormat("fp8-block", 8, 128 * 128, 4.0, "fp8", "e4m3 with one f32 weight_scale_inv per 128 x 128 block "
                 "(quantization_config weight_block_size [128, 128]; DeepSeek-V3's recipe, vLLM "
                 "Fp8LinearMethod block path)"),
    WeightFormat("mxfp4", 4, 32, 1.0, "fp4", "OCP MX fp4 e2m1, one e8m0 (1 B) scale per 32 elements "
                 "(transformers Mxfp4HfQuantizer: gpt-oss ``*_blocks`` uint8 pairs + ``*_scales`` uint8 per 32)"),
    WeightFormat("mxfp8", 8, 32, 1.0, "fp8", "OCP MX fp8 e4m3, one e8m0 (1 B) scale per 32 elements (ModelOpt "
                 "MXFP8)"),
    WeightFormat("nvfp4", 4, 16, 1.0, "fp4", "NVIDIA fp4 e2m1, one e4m3 (1 B) scale per 16 elements plus an f32 "
                 "global scale per tensor (ModelOpt NVFP4: weight uint8 pairs, weight_scale fp8 [out, in/16])"),
    _int4(128, "AWQ / GPTQ int4, group 128 (the default group of both)"),
)}


def weight_format(name: str) -> WeightFormat:
    """A format by name; ``int4-gN`` (AWQ/GPTQ int4 with groups of N, for N from 8 to 8,192) and ``int4-gN-sym``
    (compressed-tensors' symmetric pack-quantized int4: a bf16 scale per group, no zero-points) too."""
    if name in FORMATS:
        return FORMATS[name]
    match = re.fullmatch(r"int4-g(\d+)(-sym)?", name)
    if match and 8 <= int(match.group(1)) <= 8192:
        group = int(match.group(1))
        if match.group(2):
            return WeightFormat(name, 4, group, 2.0, "int4", "compressed-tensors pack-quantized int4, symmetric: "
                                "one bf16 weight_scale per group, no zero-point")
        return _int4(group, "AWQ / GPTQ int4 with group scales")
    raise ConfigError(f"unknown weight precision {name!r}; choose {', '.join((*FORMATS, 'checkpoint'))}")


@dataclass(frozen=True, slots=True)
class WeightScheme:
    """Which format each part of a quantized checkpoint is in.

    ``quantized`` is the format of the quantized modules, ``unquantized`` that of the rest (the activation dtype's:
    what the checkpoint keeps in bf16); ``scope`` the roles the method quantizes by default; ``rules`` are
    ``(role, layer or None for every layer, format)`` read from the exclusion or per-module lists, the later
    winning. A role is one format per layer: a list naming one module of a part (``q_proj``) sets the whole part
    (``attn_in``)."""

    method: str
    quantized: str
    unquantized: str
    scope: frozenset[str]
    rules: tuple[tuple[str, int | None, str], ...] = ()
    source: str = ""

    def format_of(self, role: str, layer: int | None) -> str:
        name = self.quantized if role in self.scope else self.unquantized
        for rule_role, rule_layer, fmt in self.rules:
            if rule_role == role and (rule_layer is None or rule_layer == layer):
                name = fmt
        return name

    def describe(self) -> str:
        quantized = [r for r in ROLES if r in self.scope]
        text = f"{self.method}: {self.quantized} for {', '.join(quantized) or 'no part'}, else {self.unquantized}"
        return text + (f"; {len(self.rules)} per-module rules" if self.rules else "")


# -- reading quantization_config / hf_quant_config.json -----------------------------------------------------------

#: Every part a decoder's Linear modules make up (the embedding table is an nn.Embedding: no method quantizes it).
LINEAR_ROLES = frozenset(ROLES[1:]) - {"router"}


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def scheme_of(quant: Mapping | None, modelopt: Mapping | None, unquantized: str, where: str,
              layers: int | None = None) -> WeightScheme | None:
    """The weight scheme of a checkpoint: its ``quantization_config`` (``quant``, from config.json) or its
    ``hf_quant_config.json`` (``modelopt``, which wins: ModelOpt writes both and vLLM's ``ModelOptFp8Config`` /
    ``ModelOptNvFp4Config`` read the latter); None for an unquantized checkpoint. A method or a field this
    cannot read exactly is refused with one line.

    Which parts each method quantizes, by its source: routers stay unquantized everywhere (vLLM builds the MoE
    gates of DeepSeek, Qwen-MoE, gpt-oss ... as ``ReplicatedLinear(..., quant_config=None)``; transformers'
    ``get_keys_to_not_convert`` keeps them too; they are under 0.1 % of a MoE's weights); the embedding table is
    never a Linear; the LM head is left out by transformers (``get_keys_to_not_convert``: the output embeddings)
    and by vLLM's linear methods (``ParallelLMHead`` is not a ``LinearBase``) unless a recipe lists it.

    ``layers`` (the config's ``num_hidden_layers``): a module named on a layer at or above it is a multi-token
    prediction layer's (DeepSeek-V3's and GLM-5's ``model.layers.<n>.eh_proj`` …) and is skipped. The main model
    never loads it: vLLM's DeepseekV2Model builds ``num_hidden_layers`` layers and
    ``DeepseekV2ForCausalLM.load_weights`` skips every weight ``get_spec_layer_idx_from_weight_name`` places on a
    layer at or above ``num_hidden_layers`` ("skip spec decode layers for main model"; the MTP draft,
    deepseek_mtp.py, loads them), and transformers' DeepseekV3 / GlmMoeDsa models build ``num_hidden_layers``
    layers, ignoring the rest of the checkpoint. simkv counts no MTP weights, so their format changes nothing.
    """
    if modelopt is not None:
        return _modelopt(modelopt, unquantized, where, layers)
    if quant is None:
        return None
    if not isinstance(quant, Mapping):
        raise _fail(where, f"quantization_config must be a JSON object, got {type(quant).__name__}")
    method = quant.get("quant_method")
    if method == "fp8":
        return _fp8(quant, unquantized, where, layers)
    if method == "mxfp4":
        # transformers Mxfp4HfQuantizer replaces only the experts (GptOssExperts); vLLM Mxfp4Config quantizes
        # FusedMoE only and gives every LinearBase UnquantizedLinearMethod.
        return WeightScheme("mxfp4", "mxfp4", unquantized, frozenset({"experts"}),
                            _excluded(quant.get("modules_to_not_convert"), unquantized, where, layers),
                        "quantization_config")
    if method in ("awq", "gptq"):
        bits, group = quant.get("bits", quant.get("w_bit")), quant.get("group_size", quant.get("q_group_size"))
        if bits != 4 or not isinstance(group, int) or isinstance(group, bool) or not 8 <= group <= 8192:
            raise _fail(where, f"{method} with bits {bits!r} and group_size {group!r}: simkv reads 4-bit weights "
                        "with groups of 8 to 8,192")
        # AutoGPTQ / AutoAWQ quantize every Linear of the decoder layers, not the LM head.
        return WeightScheme(method, f"int4-g{group}", unquantized, LINEAR_ROLES - {"lm_head"},
                            _excluded(quant.get("modules_to_not_convert"), unquantized, where, layers),
                        "quantization_config")
    if method == "compressed-tensors":
        return _compressed_tensors(quant, unquantized, where, layers)
    if method == "modelopt" or (method is None and "quant_algo" in quant):  # ModelOpt's own config.json form
        return _modelopt({"quantization": quant}, unquantized, where, layers)
    raise _fail(where, f"quantization_config quant_method {method!r} is not one simkv reads (fp8, mxfp4, awq, gptq, "
                "compressed-tensors, modelopt, or an hf_quant_config.json)")


def _fp8(quant: Mapping, unquantized: str, where: str, layers: int | None) -> WeightScheme:
    """transformers FineGrainedFP8 / vLLM Fp8Config: every Linear but ``modules_to_not_convert``, per-tensor or in
    ``weight_block_size`` blocks with f32 scales."""
    block = quant.get("weight_block_size")
    if block is None:
        fmt = "fp8"
    elif list(block) == [128, 128]:
        fmt = "fp8-block"
    else:
        raise _fail(where, f"fp8 weight_block_size {block!r}: simkv reads [128, 128] blocks or per-tensor scales")
    return WeightScheme("fp8", fmt, unquantized, LINEAR_ROLES - {"lm_head"},
                        _excluded(quant.get("modules_to_not_convert"), unquantized, where, layers),
                        "quantization_config")


def _compressed_tensors(quant: Mapping, unquantized: str, where: str, layers: int | None) -> WeightScheme:
    """compressed-tensors (llm-compressor): one ``config_groups`` entry whose ``targets`` are ``Linear`` (or
    module names) with its weights' ``num_bits``/``type``/``group_size``, minus ``ignore``. Group scales are stored
    in the model dtype (2 B) for ints, e8m0 (1 B) for MX fp4, e4m3 (1 B) for NVFP4."""
    groups = quant.get("config_groups")
    if not isinstance(groups, Mapping) or len(groups) != 1:
        raise _fail(where, "compressed-tensors with other than one config_groups entry: not read")
    (group,) = groups.values()
    weights = (group or {}).get("weights") or {}
    bits, kind, size = weights.get("num_bits"), weights.get("type"), weights.get("group_size")
    fmt_name = str(quant.get("format") or group.get("format") or "")
    if bits == 8 and kind == "float":
        fmt = "fp8"
    elif bits == 4 and kind == "float" and size == 32 and "mxfp4" in fmt_name:
        fmt = "mxfp4"
    elif bits == 4 and kind == "float" and size == 16:
        fmt = "nvfp4"
    elif bits == 4 and kind == "int" and isinstance(size, int) and 8 <= size <= 8192:
        fmt = f"int4-g{size}" + ("-sym" if weights.get("symmetric", True) else "")
    else:
        raise _fail(where, f"compressed-tensors weights of {bits!r} bits, type {kind!r}, group {size!r}: not read")
    targets = group.get("targets") or []
    rules = _excluded(quant.get("ignore"), unquantized, where, layers)
    if targets == ["Linear"]:
        scope = LINEAR_ROLES - {"lm_head"}
    else:  # targets name modules: those parts, the rest unquantized
        scope = frozenset()
        rules = tuple((role, layer, fmt) for role, layer in _parts(targets, where, layers)) + rules
    return WeightScheme("compressed-tensors", fmt, unquantized, scope, rules, "quantization_config")


#: ModelOpt quant_algo → format (hf_quant_config.json ``quantization.quant_algo`` and per-layer entries).
MODELOPT = {"FP8": "fp8", "NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "W4A8_NVFP4_FP8": "nvfp4", "MXFP4": "mxfp4", "MXFP8": "mxfp8",
            "W4A16_AWQ": "int4-g128", "W4A8_AWQ": "int4-g128"}


def _modelopt(config: Mapping, unquantized: str, where: str, layers: int | None) -> WeightScheme:
    """NVIDIA ModelOpt's ``hf_quant_config.json``: ``quant_algo`` for every Linear but ``exclude_modules`` (vLLM
    ``ModelOptFp8Config`` / ``ModelOptNvFp4Config``), or ``MIXED_PRECISION`` with a format per module in
    ``quantized_layers`` and the rest unquantized."""
    q = config.get("quantization")
    if not isinstance(q, Mapping):
        raise _fail(where, "hf_quant_config.json has no quantization object")
    algo = q.get("quant_algo")
    if algo == "MIXED_PRECISION":
        per_module = q.get("quantized_layers")
        if not isinstance(per_module, Mapping):
            raise _fail(where, "MIXED_PRECISION without quantized_layers")
        rules = []
        for name, entry in per_module.items():
            fmt = MODELOPT.get((entry or {}).get("quant_algo"))
            if fmt is None:
                raise _fail(where, f"quantized_layers {name}: quant_algo {(entry or {}).get('quant_algo')!r} not read")
            rules += [(role, layer, fmt) for role, layer in _parts([name], where, layers)]
        names = sorted({fmt for _, _, fmt in rules})
        return WeightScheme("modelopt", "+".join(names) or unquantized, unquantized, frozenset(), tuple(rules),
                            "hf_quant_config.json")
    fmt = MODELOPT.get(algo)
    if fmt is None:
        raise _fail(where, f"ModelOpt quant_algo {algo!r} is not one simkv reads ({', '.join(MODELOPT)}, "
                    "MIXED_PRECISION)")
    return WeightScheme("modelopt", fmt, unquantized, LINEAR_ROLES - {"lm_head"},
                        _excluded(q.get("exclude_modules", q.get("ignore")), unquantized, where, layers),
                        "hf_quant_config.json")


def _excluded(names, unquantized: str, where: str, layers: int | None) -> tuple[tuple[str, int | None, str], ...]:
    if names is None:
        return ()
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _fail(where, "a quantization exclusion list must be a list of module names")
    return tuple((role, layer, unquantized) for role, layer in _parts(names, where, layers))


#: Module-name words → parts, the first that matches winning (shared experts before experts, the router and the
#: projections before the broad names of their block).
_PART_WORDS = (
    (re.compile(r"shared_expert"), ("shared",)),
    (re.compile(r"expert"), ("experts",)),
    (re.compile(r"(mlp|moe|mixer|ffn)\\?\.gate($|[^_a-z])|router|e_score_correction"), ("router",)),
    (re.compile(r"(o_proj|out_proj)($|[^a-z])"), ("attn_out",)),
    (re.compile(r"q_proj|k_proj|v_proj|qkv|kv_a|kv_b|q_a|q_b|in_proj|indexer"), ("attn_in",)),
    # an MLP's projections before the block names: Nemotron-H's MLP layers are ``backbone.layers.N.mixer.up_proj``
    (re.compile(r"(gate|up|down)_proj"), ("mlp",)),
    (re.compile(r"self_attn|linear_attn|\battn\b|attention|mixer"), ("attn_in", "attn_out")),
    (re.compile(r"mlp|ffn|gate_proj|up_proj|down_proj"), ("mlp",)),
    (re.compile(r"lm_head|^head$"), ("lm_head",)),
    (re.compile(r"embed"), ("embed",)),
)
#: Names that are no matmul weight simkv counts: norms, biases, the vision tower, MTP draft layers; and the
#: depthwise ``conv1d`` of a Mamba or Gated DeltaNet mixer, an ``nn.Conv1d`` that no Linear quantizer converts
#: (ModelOpt lists it among the excluded anyway: Nemotron-3-Nano-NVFP4 names every ``mixer.conv1d``), so naming it
#: leaves the ``in_proj`` beside it quantized. (simkv counts its K x conv_dim weights, under 0.1 % of the layer's,
#: in ``attn_in``'s format.)
_NOT_COUNTED = re.compile(r"norm|bias|vision|mm_projector|multi_modal|patch_merge|visual|^mtp|\.mtp|audio|conv1d")


def _parts(names, where: str, layers: int | None) -> list[tuple[str, int | None]]:
    """(role, layer) pairs a list of module names or patterns (globs, ``re:`` regexes) covers; none for a name on
    a layer at or above ``layers`` (an MTP layer the main model does not load: :func:`scheme_of`)."""
    out = []
    for raw in names:
        name = raw[3:] if raw.startswith("re:") else raw
        layer = re.search(r"layers\\?\.(\d+)", name)
        index = int(layer.group(1)) if layer else None
        rest = name[layer.end():] if layer else name
        if index is not None and layers is not None and index >= layers:
            continue
        if _NOT_COUNTED.search(rest):
            continue
        if layer and re.fullmatch(r"(\\?\.)?[*.]*", rest):  # "model.layers.0*", "model.layers.1.*": the whole layer
            out += [(role, index) for role in LAYER_ROLES]
            continue
        for words, roles in _PART_WORDS:
            if words.search(rest):
                out += [(role, index) for role in roles]
                break
        else:
            if raw == "gate":  # MiniMax's router, named bare
                out.append(("router", None))
                continue
            raise _fail(where, f"quantization module name {raw!r}: simkv cannot tell which weights it names")
    return out


# -- the KV cache dtype a checkpoint asks vLLM for ----------------------------------------------------------------

#: vllm/utils/torch_utils.py ``MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP`` (fp8 is fp8_e4m3: 1 B per element).
MODELOPT_KV = {"fp8": "fp8", "nvfp4": "nvfp4"}


def vllm_auto_kv_dtype(quant: Mapping | None, modelopt: Mapping | None) -> str:
    """What vLLM 0.33's ``--kv-cache-dtype auto`` (its default) becomes for a checkpoint: "fp8", "nvfp4", or ""
    (the model dtype). vLLM takes config.json's ``quantization_config`` and reads ``hf_quant_config.json`` only
    when there is none (vllm/transformers_utils/config.py ``get_config``). Then:

    - ModelOpt (``quant_method`` modelopt*, which ``ModelArchConfigConvertor._normalize_quantization_config`` sets
      from ``producer.name`` modelopt): ``resolve_kv_cache_dtype_string`` → ``get_kv_cache_quant_algo_string``:
      ``kv_cache_scheme`` (a dict: ``dynamic`` false, 8-bit float → fp8; 4-bit float → nvfp4) or
      ``kv_cache_quant_algo`` ("FP8" → fp8_e4m3, "NVFP4" → nvfp4), in ``quantization`` or at the top; another
      value falls back to auto with a warning. An ``hf_quant_config.json`` without ``producer`` (the trimmed
      copies aiconfigurator ships) is read as ModelOpt's: the file name is ModelOpt's alone.
    - compressed-tensors (and any method whose config carries a ``kv_cache_scheme``): the attention layer turns
      auto into "fp8" (vllm/model_executor/layers/attention/attention.py ``Attention.__init__``: "llm-compressor
      models declare an FP8 KV-cache scheme in their checkpoint config").
    Anything else: the model dtype."""
    config = quant if quant is not None else modelopt
    if not isinstance(config, Mapping):
        return ""
    method = str(config.get("quant_method") or "").lower().replace("compressed_tensors", "compressed-tensors")
    if method.startswith("modelopt") or config is modelopt or "quant_algo" in config:
        inner = config.get("quantization", config)
        inner = inner if isinstance(inner, Mapping) else config
        algo = (inner.get("kv_cache_scheme") or config.get("kv_cache_scheme") or inner.get("kv_cache_quant_algo")
                or config.get("kv_cache_quant_algo"))
        if isinstance(algo, Mapping):
            if algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get("type") == "float":
                return "fp8"
            return "nvfp4" if algo.get("num_bits") == 4 and algo.get("type") == "float" else ""
        return MODELOPT_KV.get(algo.lower(), "") if isinstance(algo, str) else ""
    if method == "compressed-tensors" and config.get("kv_cache_scheme") is not None:
        return "fp8"
    return ""

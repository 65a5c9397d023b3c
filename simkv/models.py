"""Model shapes: the transformer's dimensions and, per layer, what its KV cache keeps.

A uniform model (every layer full attention, or every layer one sliding window) is given by the
number of layers, of key/value heads (fewer than query heads under grouped-query attention) and
the head size. A model whose layers differ (Gemma-3, gpt-oss, Llama-4, Qwen3-Next, DeepSeek-V3)
also carries one :class:`simkv.kvspec.LayerKV` per layer (``layer_kv``); :attr:`ModelSpec.kv_layers`
gives the per-layer specs of either. Presets carry the values from each model's published
``config.json`` on the Hugging Face hub.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simkv.errors import ConfigError
from simkv.kvspec import LayerKV, groups, tp_kv_heads, tp_layers
from simkv.weights import FORMATS, LAYER_ROLES, WeightScheme, weight_format


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    #: The rest of the transformer, for weight bytes and FLOPs (the cost model);
    #: 0 means unknown (a custom shape): ``hidden`` then defaults to heads × head_dim.
    hidden: int = 0
    intermediate: int = 0
    vocab: int = 0
    tied_embeddings: bool = False
    #: Weight matrices per MLP block: 3 for gated (SwiGLU) MLPs, 2 for GPT-2's.
    mlp_matrices: int = 3
    #: Attention window in tokens of every layer (Mistral-7B v0.1: 4,096); None = full attention.
    #: A model whose layers differ gives ``layer_kv`` instead.
    sliding_window: int | None = None
    #: One KV spec per layer (simkv.kvspec); empty: every layer alike, from the fields above.
    layer_kv: tuple[LayerKV, ...] = ()
    #: Mixture of experts (0: a dense MLP): routed experts, experts each token is routed to, each
    #: expert's intermediate size, the shared experts' intermediate size in all, and how many layers
    #: are dense (their MLP has ``intermediate``): DeepSeek-V3's first 3, Llama-4 Maverick's every other
    #: one (only the count matters to weights and FLOPs).
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    dense_layers: int = 0
    #: MLA's query compression rank (0: queries are not compressed); the KV ranks are in ``layer_kv``.
    q_lora_rank: int = 0
    #: Linear-attention projections: (key heads, value heads, key head size, value head size, conv kernel).
    linear_dims: tuple[int, int, int, int, int] | None = None
    #: LFM2's short-conv layers instead (their conv kernel ``conv_L_cache``; 0: none): a linear layer's
    #: weights are then ``Lfm2ShortConv``'s.
    short_conv: int = 0
    #: Mamba-2 layers instead (Granite-4-H, Nemotron-H): (heads H, head size P, groups G, state size N, conv kernel
    #: K); the mixer's inner size is H x P (:meth:`layer_roles`).
    mamba_dims: tuple[int, int, int, int, int] | None = None
    #: Attention's query projection also yields an output gate (Qwen3-Next / 3.5 / 3.6 ``attn_output_gate``): q_proj
    #: is twice as wide.
    attn_output_gate: bool = False
    #: Full-attention layers whose values are their keys (Gemma-4 ``attention_k_eq_v``): no v_proj.
    full_k_eq_v: bool = False
    #: Mamba-1 layers instead (Jamba): (inner size I, state size N, conv kernel K, time-step rank R).
    mamba1_dims: tuple[int, int, int, int] | None = None
    #: The recurrent state's dtype where vLLM keeps it in another than the model's (Nemotron-H's
    #: ``mamba_ssm_cache_dtype``); "": the model's dtype.
    ssm_dtype: str = ""
    #: The indices of the MoE layers where they are not the last ``layers - dense_layers`` (Jamba, Nemotron-H
    #: interleave them); empty: the last ones.
    moe_at: tuple[int, ...] = ()
    #: Why the weights cannot be sized exactly (a layout simkv does not count yet); "": they can. The KV is read.
    weights_refused: str = ""
    #: The weights' dtype in the config (``torch_dtype``), the KV dtype of transformers; "" if not given.
    dtype: str = ""
    #: What vLLM's ``--kv-cache-dtype auto`` becomes for this checkpoint (simkv.weights.vllm_auto_kv_dtype): "fp8"
    #: for a ModelOpt or compressed-tensors checkpoint with an FP8 KV cache, "nvfp4"; "": the model's dtype.
    vllm_kv_dtype: str = ""
    #: Where the numbers come from (a config file, a published config).
    source: str = ""
    #: The context the model was trained for (``max_position_embeddings``); 0: not given.
    context: int = 0
    #: Tensor parallelism: this spec is one of ``tp`` devices' shares of the model (:func:`tp_shard`; 1: the
    #: whole model on one device). The cost model adds the step's all-reduces when it is above 1.
    tp: int = 1
    #: A quantized checkpoint's formats per part (its ``quantization_config`` / ``hf_quant_config.json``,
    #: simkv.weights.scheme_of); None: the weights are all in one precision.
    weight_scheme: WeightScheme | None = None
    #: Each layer's dense MLP size where layers differ (Nemotron-NAS's ``block_configs``); empty: ``intermediate``.
    layer_intermediate: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for field in ("layers", "heads", "kv_heads", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model {field} must be a positive integer, got {value!r}")
        for field in ("hidden", "intermediate", "vocab"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"model {field} must be a non-negative integer, got {value!r}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            raise ConfigError(f"sliding window must be a positive integer, got {self.sliding_window!r}")
        if self.heads % self.kv_heads:
            raise ConfigError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.layer_kv and len(self.layer_kv) != self.layers:
            raise ConfigError(f"a model of {self.layers} layers needs {self.layers} layer specs, got {len(self.layer_kv)}")
        if self.layer_kv and all(layer.kind == "none" for layer in self.layer_kv):
            raise ConfigError("no layer keeps a cache: there is no KV memory to simulate")
        if self.layer_intermediate and (len(self.layer_intermediate) != self.layers or not all(
                isinstance(v, int) and v >= 0 for v in self.layer_intermediate)):
            raise ConfigError(f"layer_intermediate needs {self.layers} sizes >= 0, got {len(self.layer_intermediate)}")
        if self.layer_kv and self.sliding_window is not None:
            raise ConfigError("give a window per layer (layer_kv) or one for every layer (sliding_window), not both")
        for field in ("experts", "experts_per_token", "expert_intermediate", "shared_intermediate", "dense_layers",
                      "q_lora_rank"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"model {field} must be a non-negative integer, got {value!r}")
        if self.experts and not (0 < self.experts_per_token <= self.experts and self.expert_intermediate
                                 and self.dense_layers <= self.layers):
            raise ConfigError(f"a mixture of {self.experts} experts needs experts_per_token in 1..{self.experts}, a "
                              f"positive expert_intermediate and dense_layers <= layers (got {self.experts_per_token}, "
                              f"{self.expert_intermediate}, {self.dense_layers})")
        if not self.experts and self.experts_per_token:
            raise ConfigError(f"experts_per_token {self.experts_per_token} without experts")
        if not isinstance(self.tp, int) or isinstance(self.tp, bool) or self.tp < 1:
            raise ConfigError(f"model tp must be a positive integer, got {self.tp!r}")
        if self.linear_dims is not None and (len(self.linear_dims) != 5 or not all(
                isinstance(v, int) and v > 0 for v in self.linear_dims)):
            raise ConfigError("linear_dims are five positive integers (key heads, value heads, key head size, "
                              f"value head size, conv kernel), got {self.linear_dims!r}")
        if self.mamba_dims is not None and (len(self.mamba_dims) != 5 or not all(
                isinstance(v, int) and v > 0 for v in self.mamba_dims)):
            raise ConfigError("mamba_dims are five positive integers (heads, head size, groups, state size, conv "
                              f"kernel), got {self.mamba_dims!r}")
        if self.mamba1_dims is not None and (len(self.mamba1_dims) != 4 or not all(
                isinstance(v, int) and v > 0 for v in self.mamba1_dims)):
            raise ConfigError("mamba1_dims are four positive integers (inner size, state size, conv kernel, time-step "
                              f"rank), got {self.mamba1_dims!r}")
        if self.moe_at and (len(set(self.moe_at)) != len(self.moe_at) or not all(
                isinstance(i, int) and 0 <= i < self.layers for i in self.moe_at)
                or self.layers - len(self.moe_at) != self.dense_layers or not self.experts):
            raise ConfigError(f"moe_at must name distinct layers below {self.layers}, as many as the layers less "
                              f"dense_layers, in a mixture of experts (got {len(self.moe_at)} of {self.layers})")

    @property
    def kv_layers(self) -> tuple[LayerKV, ...]:
        """One KV spec per layer: ``layer_kv``, or every layer alike from the uniform fields."""
        if self.layer_kv:
            return self.layer_kv
        kind = "full" if self.sliding_window is None else "sliding"
        layer = LayerKV(kind, self.kv_heads, self.head_dim, self.head_dim, self.sliding_window)
        return (layer,) * self.layers

    @property
    def uniform(self) -> bool:
        """Every layer alike: one group."""
        return len(set(self.kv_layers)) == 1

    @property
    def groups(self) -> list[tuple[LayerKV, tuple[int, ...]]]:
        """Identical layers together (simkv.kvspec.groups)."""
        return groups(self.kv_layers)

    @property
    def primitives(self) -> int:
        """KV primitives in construction order K0, V0, K1, V1, … (two per layer that caches tokens)."""
        return 2 * sum(layer.caches_tokens for layer in self.kv_layers)

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts: those ``moe_at`` names, else every layer after the
        ``dense_layers`` first (0 if dense)."""
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert: ``mlp_matrices`` matrices of hidden x expert_intermediate
        (gate, up and down of a gated MLP; gpt-oss fuses gate and up into one ``gate_up_proj``)."""
        return self.mlp_matrices * self.hidden * self.expert_intermediate

    def layer_roles(self, index: int) -> dict[str, int]:
        """Weight-matrix parameters of decoder layer ``index`` by part (simkv.weights.LAYER_ROLES: ``attn_in``,
        ``attn_out``, ``mlp``, ``experts``, ``shared``, ``router``; biases and norms left out).

        Attention, by the layer's kind (``kv_layers[index]``):

        - full / sliding / chunked (Llama, Qwen, Gemma, gpt-oss ``q_proj k_proj v_proj o_proj``):
          ``hidden x heads x k_dim`` (q) + ``hidden x kv_heads x (k_dim + v_dim)`` (k, v) +
          ``heads x v_dim x hidden`` (o);
        - MLA (``latent`` set; transformers ``DeepseekV3Attention``): q is ``q_a_proj`` hidden x q_lora_rank +
          ``q_b_proj`` q_lora_rank x heads x qk_head_dim (or one ``q_proj`` hidden x heads x qk_head_dim when
          ``q_lora_rank`` is 0), ``kv_a_proj_with_mqa`` hidden x (kv_lora_rank + qk_rope_head_dim), ``kv_b_proj``
          kv_lora_rank x heads x (qk_nope_head_dim + v_head_dim), ``o_proj`` heads x v_head_dim x hidden, with
          qk_head_dim = ``k_dim`` and qk_nope_head_dim = k_dim - qk_rope_head_dim; a sparse-attention indexer
          (``indexer`` = (n, d), vLLM deepseek_v2.py ``Indexer``) adds ``wq_b`` q_lora_rank x n x d, ``wk``
          hidden x d and ``weights_proj`` hidden x n;
        - linear attention (Qwen3-Next Gated DeltaNet, transformers ``Qwen3NextGatedDeltaNet``, ``linear_dims``
          = (key heads kh, value heads vh, dk, dv, conv kernel K)): ``in_proj_qkvz`` hidden x (2 kh dk + 2 vh dv),
          ``in_proj_ba`` hidden x 2 vh, the depthwise ``conv1d`` (2 kh dk + vh dv) x K, ``out_proj`` vh dv x hidden;
          no q/k/v/o of attention; LFM2's short conv (``short_conv`` = conv kernel L, transformers
          ``Lfm2ShortConv.__init__``): ``in_proj`` hidden x 3 hidden, the depthwise ``conv`` hidden x L,
          ``out_proj`` hidden x hidden (a ``tp`` share: 1/tp of each, vLLM's column- and row-parallel
          ``ShortConv`` projections); Mamba-2 (``mamba_dims`` = (H, P, G, N, K), inner I = H x P; vLLM
          ``MambaMixer2.__init__``, transformers ``NemotronHMamba2Mixer`` / ``GraniteMoeHybridMambaLayer``):
          ``in_proj`` hidden x (2 I + 2 G N + H) (z, x, B, C, dt), the depthwise ``conv1d`` (I + 2 G N) x K,
          ``out_proj`` I x hidden; its ``A_log``, ``D``, ``dt_bias`` (H each) and gated norm (I) are vectors, left
          out as every norm and bias is; Mamba-1 (``mamba1_dims`` = (I, N, K, R); vLLM mamba_mixer.py
          ``MambaMixer.__init__``, transformers ``JambaMambaMixer``): ``in_proj`` hidden x 2 I (x, z), the depthwise
          ``conv1d`` I x K, ``x_proj`` I x (R + 2 N) (dt, B, C), ``dt_proj`` R x I, the state matrix ``A_log`` I x N
          (vLLM keeps it as float32 ``A``; counted here at the layer's format, < 0.01 % of Jamba's weights),
          ``out_proj`` I x hidden; ``D`` (I) and the dt/B/C norms are vectors, left out;
        - an attention layer's q doubles with ``attn_output_gate`` (transformers ``Qwen3NextAttention`` /
          ``Qwen3_5Attention``: q_proj hidden x heads x head_dim x 2, query and gate; vLLM qwen3_next.py
          ``QKVParallelLinear(..., total_num_heads * (1 + attn_output_gate))``); a full layer of ``full_k_eq_v``
          has no v_proj (transformers modeling_gemma4.py ``Gemma4TextAttention.__init__``: ``v_proj = None`` where
          ``attention_k_eq_v`` and not sliding; the checkpoint ships k_proj only — vLLM gemma4.py loads that K into
          the K and V slots of its ``QKVParallelLinear``, so its resident copy holds the V-sized slot too, which
          this count, the checkpoint's, leaves out);
        - none: a layer that reads another layer's KV (``reuses``) has only that layer's q and o projections
          (transformers ``Gemma4TextAttention.__init__``: "Layers sharing kv states don't need any weight
          matrices" beyond q_proj / o_proj; vLLM gemma4.py builds a bare q_proj for a KV-shared layer); one
          without attention has none.

        MLP: ``mlp_matrices x hidden x intermediate`` for a dense layer (every layer of a dense model, the first
        ``dense_layers`` of a MoE, or those ``moe_at`` does not name; ``layer_intermediate`` where sizes differ,
        0 for a layer with no MLP: Nemotron-H's Mamba and attention layers); a MoE layer has ``experts`` routed experts (:attr:`expert_params` each), the
        shared experts (``mlp_matrices x hidden x shared_intermediate``) and the router (hidden x experts).
        """
        layer = self.kv_layers[index]
        shares_kv = layer.kind == "none" and layer.reuses is not None
        if shares_kv:
            layer = self.kv_layers[layer.reuses]
        h = self.hidden
        out = dict.fromkeys(LAYER_ROLES, 0)
        if layer.kind == "linear" and self.short_conv:  # one tensor-parallel share: each of them split by channels
            out["attn_in"], out["attn_out"] = (3 * h * h + h * self.short_conv) // self.tp, h * h // self.tp
        elif layer.kind == "linear" and self.mamba_dims:
            heads, head, groups, state, kernel = self.mamba_dims
            inner, conv_dim = heads * head, heads * head + 2 * groups * state
            out["attn_in"] = h * (inner + conv_dim + heads) + conv_dim * kernel
            out["attn_out"] = inner * h
        elif layer.kind == "linear" and self.mamba1_dims:
            inner, state, kernel, rank = self.mamba1_dims
            out["attn_in"] = h * 2 * inner + inner * kernel + inner * (rank + 2 * state) + rank * inner + inner * state
            out["attn_out"] = inner * h
        elif layer.kind == "linear":
            if self.linear_dims is None:
                raise ConfigError(f"model {self.name}: the weights of its linear-attention layers are not sized "
                                  "(no Gated DeltaNet, short-conv, Mamba-1 or Mamba-2 dimensions)")
            kh, vh, dk, dv, kernel = self.linear_dims
            out["attn_in"] = h * (2 * kh * dk + 2 * vh * dv) + h * 2 * vh + (2 * kh * dk + vh * dv) * kernel
            out["attn_out"] = vh * dv * h
        elif layer.kind == "none":
            pass
        elif layer.latent is not None:
            rank, rope = layer.latent
            heads = layer.kv_heads
            q = (h * self.q_lora_rank + self.q_lora_rank * heads * layer.k_dim if self.q_lora_rank
                 else h * heads * layer.k_dim)
            out["attn_in"] = q + h * (rank + rope) + rank * heads * (layer.k_dim - rope + layer.v_dim)
            if layer.indexer is not None:
                n, d = layer.indexer
                out["attn_in"] += self.q_lora_rank * n * d + h * d + h * n
            out["attn_out"] = heads * layer.v_dim * h
        else:
            q = h * self.heads * layer.k_dim * (2 if self.attn_output_gate else 1)
            kv = 0 if shares_kv else h * layer.kv_heads * (
                layer.k_dim if self.full_k_eq_v and layer.kind == "full" else layer.k_dim + layer.v_dim)
            out["attn_in"] = q + kv
            out["attn_out"] = self.heads * layer.v_dim * h
        if not (index in self.moe_at if self.moe_at else index >= self.layers - self.moe_layers):
            size = self.layer_intermediate[index] if self.layer_intermediate else self.intermediate
            out["mlp"] = self.mlp_matrices * h * size
        else:
            out["experts"] = self.experts * self.expert_params
            out["shared"] = self.mlp_matrices * h * self.shared_intermediate
            out["router"] = h * self.experts
        return out

    def layer_params(self, index: int) -> int:
        """Weight-matrix parameters of decoder layer ``index``: the sum of :meth:`layer_roles`."""
        return sum(self.layer_roles(index).values())

    @property
    def weight_params(self) -> int:
        """Parameters of the weight matrices and embeddings, from the config's dimensions: every
        layer's :meth:`layer_params` (all experts of a MoE) + the embedding table and the LM head
        (one matrix when tied). Biases and norms (under 0.1 %) are left out. 0 when the shape is only
        the attention geometry (a custom model without hidden/intermediate/vocab). A model whose weights are
        not sized (``weights_refused``): :class:`ConfigError`, one line."""
        if self.weights_refused:
            raise ConfigError(f"model {self.name}: its weights are not sized: {self.weights_refused}")
        if not (self.hidden and (self.intermediate or self.experts or self.layer_intermediate) and self.vocab):
            return 0
        if self.layer_kv or self.experts or self.layer_intermediate:
            layers = sum(self.layer_params(i) for i in range(self.layers))
        else:  # a uniform dense model: every layer alike
            layers = self.layers * self.layer_params(0)
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return layers + embeddings

    @property
    def routed_params(self) -> int:
        """Parameters of all routed experts (0 for a dense model): what a step reads only in part."""
        return self.moe_layers * self.experts * self.expert_params

    @property
    def active_params(self) -> int:
        """Parameters one token multiplies by: every weight matrix except the routed experts it is not
        sent to (``experts - experts_per_token`` per MoE layer) and the input-embedding table, a lookup
        (the LM head is counted; a tied table once). A dense model's are its weight matrices and LM head.

        Published "active" counts differ in that lookup: gpt-oss's (3.61 B of 20.9 B) leave it out as this
        does; Qwen's (3.3 B for Qwen3-30B-A3B) count it."""
        params = self.weight_params
        if not params:
            return 0
        if not self.tied_embeddings:
            params -= self.vocab * self.hidden
        return params - self.moe_layers * (self.experts - self.experts_per_token) * self.expert_params

    def describe(self) -> str:
        if not self.layer_kv:  # every group named with its heads, sizes and window
            gqa = f"MHA {self.heads}" if self.kv_heads == self.heads else f"GQA {self.heads}/{self.kv_heads}"
            window = f", window {self.sliding_window}" if self.sliding_window else ""
            return f"{self.name}: {self.layers} layers, {gqa} heads x {self.head_dim}{window}"
        parts = [f"{len(ids)} x {spec.describe()}" for spec, ids in self.groups]
        return f"{self.name}: {self.layers} layers ({'; '.join(parts)})"


# Sources: each model's config.json (num_hidden_layers, num_attention_heads,
# num_key_value_heads, head_dim or hidden_size / num_attention_heads,
# hidden_size, intermediate_size, vocab_size, tie_word_embeddings, sliding_window).
PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("gpt2", layers=12, heads=12, kv_heads=12, head_dim=64, hidden=768, intermediate=3072, vocab=50257, tied_embeddings=True, mlp_matrices=2),
        ModelSpec("tinyllama-1.1b", layers=22, heads=32, kv_heads=4, head_dim=64, hidden=2048, intermediate=5632, vocab=32000),
        ModelSpec("qwen2.5-0.5b", layers=24, heads=14, kv_heads=2, head_dim=64, hidden=896, intermediate=4864, vocab=151936, tied_embeddings=True),
        ModelSpec("phi-3.5-mini", layers=32, heads=32, kv_heads=32, head_dim=96, hidden=3072, intermediate=8192, vocab=32064),
        ModelSpec("llama-2-7b", layers=32, heads=32, kv_heads=32, head_dim=128, hidden=4096, intermediate=11008, vocab=32000),
        ModelSpec("llama-2-13b", layers=40, heads=40, kv_heads=40, head_dim=128, hidden=5120, intermediate=13824, vocab=32000),
        ModelSpec("llama-3-8b", layers=32, heads=32, kv_heads=8, head_dim=128, hidden=4096, intermediate=14336, vocab=128256),
        ModelSpec("mistral-7b", layers=32, heads=32, kv_heads=8, head_dim=128, hidden=4096, intermediate=14336, vocab=32000, sliding_window=4096),
        ModelSpec("qwen2.5-7b", layers=28, heads=28, kv_heads=4, head_dim=128, hidden=3584, intermediate=18944, vocab=152064),
        ModelSpec("llama-3-70b", layers=80, heads=64, kv_heads=8, head_dim=128, hidden=8192, intermediate=28672, vocab=128256),
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
    sliding_window: int | None = None,
) -> ModelSpec:
    """A preset with some dimensions overridden, or a fully custom shape.

    Without a base, ``heads`` defaults to ``kv_heads`` (MHA) and vice versa.
    ``sliding_window``: None keeps the preset's window, 0 removes it, N sets it.
    """
    if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window < 0):
        raise ConfigError(f"sliding window must be a non-negative integer (0 = none), got {sliding_window!r}")
    window = {} if sliding_window is None else {"sliding_window": sliding_window or None}
    if base is None:
        missing = [n for n, v in (("layers", layers), ("head_dim", head_dim)) if v is None]
        if missing or (heads is None and kv_heads is None):
            raise ConfigError(
                "a custom model needs --layers, --head-dim and --heads or --kv-heads "
                "(or a preset via --model)"
            )
        heads = heads if heads is not None else kv_heads
        kv_heads = kv_heads if kv_heads is not None else heads
        return ModelSpec("custom", layers, heads, kv_heads, head_dim, **window)
    if window.get("sliding_window", base.sliding_window) == base.sliding_window:
        window = {}
    changed = {
        k: v
        for k, v in (("layers", layers), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim))
        if v is not None
    }
    flags = [f"--{k.replace('_', '-')}" for k, v in changed.items() if v != getattr(base, k)]
    flags += ["--sliding-window"] * (sliding_window is not None)
    if base.layer_kv and flags:  # the dimensions describe a uniform model; each of these layers has its own
        raise ConfigError(f"{' '.join(flags)} would reshape a model described layer by layer "
                          f"({base.describe()}); edit a copy of its config.json instead")
    if not changed and not window:
        return base
    if "heads" in changed and "kv_heads" not in changed and base.kv_heads == base.heads:
        changed["kv_heads"] = changed["heads"]
    return replace(base, name=f"{base.name}*", **changed, **window)


#: Bytes per weight, scales included, of each weight format (simkv.weights.FORMATS): what ``--weights-precision``
#: takes, besides ``checkpoint`` (:data:`CHECKPOINT`).
WEIGHT_BYTES: dict[str, float] = {name: f.bytes_per_weight for name, f in FORMATS.items()}
#: The precision that means "as the checkpoint stores them": its :class:`~simkv.weights.WeightScheme` where it is
#: quantized, else its dtype (:func:`checkpoint_weights_precision`).
CHECKPOINT = "checkpoint"
WEIGHT_PRECISIONS = (*WEIGHT_BYTES, CHECKPOINT)


def params_by_role(model: ModelSpec) -> list[tuple[str, int | None, int]]:
    """Every weight matrix group of the model as ``(role, layer or None, parameters)``: per layer its
    :meth:`ModelSpec.layer_roles`, then the embedding table and the LM head (one matrix, the table, when tied)."""
    if not model.weight_params:
        return []
    out = [(role, i, n) for i in range(model.layers) for role, n in model.layer_roles(i).items() if n]
    out.append(("embed", None, model.vocab * model.hidden))
    if not model.tied_embeddings:
        out.append(("lm_head", None, model.vocab * model.hidden))
    return out


def params_by_format(model: ModelSpec, precision: str = "f16", *, active: bool = False) -> dict[str, int]:
    """How many of the model's parameters are stored in which format (simkv.weights.FORMATS names), at a
    precision: one format for every weight, or :data:`CHECKPOINT` for the checkpoint's scheme (a quantized
    checkpoint's quantized parts in its format, the rest in its dtype). ``active``: the parameters one token
    multiplies by instead (:attr:`ModelSpec.active_params`: the routed experts it is sent to, ``experts_per_token``
    of ``experts``, and no input-embedding lookup; a tied table counts once, as the LM head). The cost model's
    question "how many parameters of this step's GEMMs are in which format"; sums to :attr:`ModelSpec.weight_params`
    (``active``: :attr:`ModelSpec.active_params`)."""
    scheme = _scheme(model, precision)
    out: dict[str, int] = {}
    for role, layer, n in params_by_role(model):
        if active and role == "embed" and not model.tied_embeddings:
            continue
        if active and role == "experts":
            n = n // model.experts * model.experts_per_token
        fmt = precision if scheme is None else scheme.format_of("lm_head" if role == "embed" and active else role,
                                                                layer)
        out[fmt] = out.get(fmt, 0) + n
    return out


def _scheme(model: ModelSpec, precision: str) -> WeightScheme | None:
    if precision == CHECKPOINT:
        return model.weight_scheme or WeightScheme("dtype", "", checkpoint_weights_precision(model), frozenset())
    weight_format(precision)  # a known format, or one line naming the choices
    return None


def weights_bytes(model: ModelSpec, precision: str = "f16") -> int:
    """Bytes the model's weights take at a weight precision (:func:`params_by_format`; 0 for a custom shape)."""
    total = 0.0
    for fmt, n in sorted(params_by_format(model, precision).items()):
        total += n * weight_format(fmt).bytes_per_weight
    return int(total)


#: optimum-intel's export compresses the weights of a model with at least 10^9 parameters to int8
#: (asymmetric) unless told otherwise, and saves smaller models' weights as f16
#: (huggingface/optimum-intel at e1de5bee: ``_MAX_UNCOMPRESSED_SIZE = 1e9`` in
#: optimum/exporters/openvino/utils.py, compared with the model's f16/f32/bf16 constants in
#: ``_apply_model_size_based_quantization``, optimum/exporters/openvino/__main__.py → int8_asym;
#: docs/source/openvino/export.mdx: "Models larger than 1 billion parameters are exported to the OpenVINO
#: format with 8-bit weights by default").
INT8_WEIGHTS_FROM_PARAMS = 10**9


def optimum_intel_weights_precision(model: ModelSpec) -> str:
    """The weight precision an optimum-intel export gives a model: int8 from 10^9 parameters, else f16."""
    return "int8" if model.weight_params >= INT8_WEIGHTS_FROM_PARAMS else "f16"


def checkpoint_weights_precision(model: ModelSpec) -> str:
    """The precision vLLM loads a checkpoint in with ``--dtype auto`` (its default): a quantized checkpoint as it is
    stored (:data:`CHECKPOINT`: its :class:`~simkv.weights.WeightScheme`); otherwise "FP16 precision for FP32 and
    FP16 models, and BF16 precision for BF16 models" (vllm/config/model.py, ``ModelConfig.dtype`` docstring,
    docs/research/plan-facts.md §4): bf16 where the config's ``torch_dtype`` is bfloat16, else f16 (a preset
    without a dtype: f16; 2 B per parameter either way)."""
    if model.weight_scheme is not None:
        return CHECKPOINT
    return "bf16" if model.dtype.lower() in ("bfloat16", "bf16") else "f16"


def vllm_kv_precision(model: ModelSpec) -> str:
    """The KV precision vLLM keeps with ``--kv-cache-dtype auto`` (its default): the checkpoint's KV format where
    its quantization config names one (:attr:`ModelSpec.vllm_kv_dtype`: fp8), else the model dtype
    (vllm/utils/torch_utils.py ``get_kv_cache_torch_dtype``: bf16 for a bfloat16 config, else f16). One rule for
    ``simkv run --scheduler vllm``, ``simkv tune-serving`` and ``simkv plan``'s vLLM devices."""
    if model.vllm_kv_dtype == "fp8":
        if any(layer.indexer for layer in model.kv_layers):
            raise ConfigError(f"model {model.name}: its checkpoint asks vLLM for an fp8 KV cache, which vLLM lays out "
                              "per sparse-MLA backend (fp8_ds_mla) for a model with an indexer: not modelled")
        return "fp8"
    if model.vllm_kv_dtype:
        raise ConfigError(f"model {model.name}: its checkpoint asks vLLM for a {model.vllm_kv_dtype} KV cache, "
                          "which simkv does not model; give --precision")
    return "bf16" if model.dtype.lower() in ("bfloat16", "bf16") else "f16"


#: vLLM pads the vocabulary to a multiple of this before splitting the embedding and the LM head across
#: tensor-parallel devices (``DEFAULT_VOCAB_PADDING_SIZE = 64``, vllm/model_executor/layers/vocab_parallel_embedding.py).
VOCAB_PADDING = 64


def tp_shard(model: ModelSpec, tp: int) -> ModelSpec:
    """One device's share of ``model`` under tensor parallelism of ``tp`` devices, as vLLM splits it
    (docs/research/plan-facts.md §2.1): a spec whose weights, FLOPs and KV are one device's, with ``tp`` set.

    - query heads ``heads / tp`` (vLLM ``verify_with_parallel_config`` refuses a ``tp`` that does not divide them);
      KV heads :func:`simkv.kvspec.tp_kv_heads` (``max(1, kv_heads // tp)``: replicated when fewer than ``tp``),
      per layer :func:`simkv.kvspec.tp_layers` (MLA latent not divided, linear-attention states by heads);
    - q/k/v and gate/up projections column-parallel, o and down row-parallel (``ColumnParallelLinear``,
      ``RowParallelLinear``): ``intermediate / tp`` (dense, every expert's and the shared experts' intermediate:
      MoE without expert parallelism shards each expert like the MLP), key and value heads of linear attention
      ``/ tp``; MLA's ``q_a_proj`` and ``kv_a_proj_with_mqa`` and a MoE router are replicated (``ReplicatedLinear``)
      — :meth:`ModelSpec.layer_params` on the divided dimensions counts exactly that;
    - embedding and LM head vocab-parallel: the vocabulary padded to a multiple of :data:`VOCAB_PADDING`, then
      ``/ tp`` rows each (``VocabParallelEmbedding``, ``ParallelLMHead``); norms replicated (not counted).
    ``hidden`` stays whole (the activations every device holds; the all-reduce message). ``tp = 1``: the model."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError(f"--tp must be a positive integer, got {tp!r}")
    if tp == 1:
        return model
    if model.tp != 1:
        raise ConfigError(f"model {model.name} is already one of {model.tp} tensor-parallel shares")

    def split(value: int, what: str) -> int:
        if value % tp:
            raise ConfigError(f"--tp {tp} does not divide {model.name}'s {what} ({value}): vLLM splits them evenly "
                              "across the devices")
        return value // tp

    heads = split(model.heads, "attention heads")
    kv_heads = tp_kv_heads(model.kv_heads, tp)
    vocab = -(-model.vocab // VOCAB_PADDING) * VOCAB_PADDING // tp if model.vocab else 0
    linear = model.linear_dims
    if linear is not None:
        kh, vh, dk, dv, kernel = linear
        linear = (split(kh, "linear-attention key heads"), split(vh, "linear-attention value heads"), dk, dv, kernel)
    if model.short_conv and model.hidden:
        split(model.hidden, "short-conv channels")
    mamba = model.mamba_dims
    if mamba is not None:  # MambaMixer2: heads and groups column-parallel (state dims whole)
        mamba = (split(mamba[0], "Mamba heads"), mamba[1], split(mamba[2], "Mamba groups"), *mamba[3:])
    mamba1 = model.mamba1_dims
    if mamba1 is not None:  # MambaMixer: every projection split by the inner channels (the state size and rank whole)
        mamba1 = (split(mamba1[0], "Mamba inner size"), *mamba1[1:])
    return replace(
        model, heads=heads, kv_heads=kv_heads, hidden=model.hidden or model.heads * model.head_dim,
        layer_kv=tp_layers(model.layer_kv, tp) if model.layer_kv else (),
        intermediate=split(model.intermediate, "MLP intermediate size") if model.intermediate else 0,
        layer_intermediate=tuple(split(v, "MLP intermediate size") for v in model.layer_intermediate),
        expert_intermediate=split(model.expert_intermediate, "expert intermediate size") if model.experts else 0,
        shared_intermediate=split(model.shared_intermediate, "shared-expert intermediate size"),
        vocab=vocab, linear_dims=linear, mamba_dims=mamba, mamba1_dims=mamba1, tp=tp)

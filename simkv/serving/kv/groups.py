"""What one block of the paged pool holds for a model, which groups of layers keep block tables, and how many
blocks a sequence needs in each — per KV-cache manager (``SchedulerConfig.kv_manager``).

``genai`` (OpenVINO GenAI continuous batching; the default). Read in openvino.genai ``da1db864`` and measured
on 2026.4.1 (docs/DESIGN.md §4c, experiments/genai_layer_kinds/README.md §2–§5):

* One KV block spans every attention layer: ``KVCacheManager`` gives each layer a ``key_cache.N`` and a
  ``value_cache.N`` tensor of ``num_kv_blocks`` rows shaped by that layer's heads and head sizes, and
  ``block_size_in_bytes`` is their sum (``kv_cache_manager.hpp``). One block table serves all layers
  (``CacheOrchestrator::register_kv_cache``: one table unless cache eviction is on).
* Sliding-window and chunked layers keep every block: ``CacheType`` has only ``KV_CACHE`` and
  ``LINEAR_ATTENTION_CACHE``; the window reaches PagedAttention input 10 and limits compute only (a Gemma-3
  export with window 64 held ``ceil(context / 32)`` blocks, measured). Sinks are an input of PagedAttention,
  not cached tokens.
* MLA is cached decompressed, per-head K (nope + rope) and V, as optimum-intel exports DeepSeek (no latent
  cache anywhere in OpenVINO).
* Linear-attention layers (Qwen3-Next, LFM2): a separate pool (``LinearAttentionCacheManager``); one block is
  one sequence's whole state over every linear layer and state kind (``get_block_size() == 1``,
  ``m_block_size_in_bytes`` = Σ prod(dims[1:]) × element size), bf16 on this CPU (measured: the compiled
  ``conv_state_table`` / ``gated_delta_state_table`` inputs). Without prefix caching each sequence has one
  block (``BlockManager(..., fixed_blocks_per_sequence=1)``); with prefix caching the pool is token-driven, a
  checkpoint block every ``interval = block_size × clamp(ceil(state bytes / KV block bytes), 8, 256)``
  tokens, every checkpoint kept (``register_linear_attention_cache``, ``adaptive_cache_interval_multiplier``).

``vllm`` (vLLM V1's hybrid KV-cache manager; /work/shared/MODELS.md §1, read in ``vllm/v1/core/
kv_cache_utils.py``, ``single_type_kv_cache_manager.py`` and the platform's hybrid block-size alignment):

* One spec per layer: full attention (page ``block × heads × (K + V)``), MLA as its latent (one "head" of
  ``kv_lora_rank + qk_rope_head_dim``, no separate V), sliding window, chunked local attention, Mamba /
  linear-attention state (page = the layer's state tensors, the model's dtype; the conv state keeps
  ``kernel - 1`` columns).
* With Mamba layers the attention block grows to ``block × cdiv(mamba page, block × attention page per
  token)`` tokens and the Mamba page is padded to the attention page; other page sizes are unified by
  raising the smaller pages' block size by an integer ratio (not divisible: refused, as vLLM does).
* Layers with equal specs form a type; ``group_size`` = the fewest layers of a type (the most, if the most is
  under 1.5 × the fewest); a type of n layers makes ``cdiv(n, group_size)`` groups. One physical block is
  ``group_size × page`` bytes whichever group owns it (``group_size`` shared tensors). Every attention layer
  full, of different sizes: one group whose page is their sum (``UniformTypeKVCacheSpecs``).
* Blocks per sequence: full ``ceil(n / block)``; sliding-window groups free the blocks before
  ``max(0, computed - sliding_window + 1)`` (``SlidingWindowManager.get_num_skipped_tokens``: the window
  holds the last ``sliding_window - 1`` computed tokens and the one being computed); chunked local attention
  frees the blocks before ``(computed // chunk) × chunk`` (``ChunkedLocalAttentionManager``); a Mamba group
  holds one block per running request (``MambaManager``, ``mamba_cache_mode="none"``: the Mamba block size is
  ``max_model_len``). A freed block leaves a null placeholder in the table (``remove_skipped_blocks``).

simkv keeps GenAI's scheduler with either manager (``kv_manager`` changes the memory, not the scheduling
rules), and frees a window's blocks at the end of the step that moved the window past them (vLLM frees them
at the request's next ``allocate_slots``: the same count whenever the request runs the next step).
"""

from __future__ import annotations

from dataclasses import dataclass

from simkv.errors import ConfigError
from simkv.kvspec import LayerKV, k_v_bytes, state_bytes, token_bytes

KV_MANAGERS = ("genai", "vllm")
#: Bytes per element of GenAI's linear-attention state tables: bf16, as compiled on this CPU for both the conv
#: and the recurrent tables (experiments/genai_layer_kinds/README.md §3; the exports carry KV_CACHE_PRECISION=f16).
GENAI_STATE_ELEMENT_BYTES = 2
#: ``DEFAULT_LINEAR_ATTENTION_CACHE_INTERVAL_MULTIPLIER`` (scheduler_config.hpp) and
#: ``CacheOrchestrator::MAX_ADAPTIVE_CACHE_INTERVAL_MULTIPLIER``: the clamp of the checkpoint interval.
LA_MULTIPLIER_MIN, LA_MULTIPLIER_MAX = 8, 256
#: Bytes per element of a model dtype (vLLM's Mamba state dtype "auto" is the model's).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "": 2}

#: Group kinds. ``full``, ``sliding``, ``chunked`` and ``checkpoint`` (GenAI's state checkpoints under prefix
#: caching) need ``ceil(n / block_size)`` blocks for n tokens; ``state`` one block per sequence.
GROUP_KINDS = ("full", "sliding", "chunked", "state", "checkpoint")


@dataclass(frozen=True, slots=True)
class BlockGroup:
    """Layers that share one block table per sequence."""

    kind: str
    #: Tokens per block (a ``state`` group: 0 — one block whatever the length).
    block_size: int
    #: W of a sliding group, C of a chunked one.
    window: int = 0
    #: 0: the KV pool; 1: GenAI's separate linear-attention pool.
    pool: int = 0
    layers: tuple[int, ...] = ()
    #: Bytes of data in one of its blocks (a vLLM group smaller than ``group_size`` leaves padding; a padded
    #: Mamba page holds less): what "used" counts.
    real_bytes: int = 0

    def needed(self, tokens: int) -> int:
        """Entries of a sequence's table (freed ones included) once it holds ``tokens`` tokens."""
        if self.block_size == 0:  # a state: one block from the sequence's first scheduled token on
            return 1
        return -(-tokens // self.block_size)

    def skipped(self, computed: int) -> int:
        """Leading blocks no longer needed once ``computed`` tokens are computed (vLLM
        ``get_num_skipped_tokens // block_size``)."""
        if self.kind == "sliding":
            return max(0, computed - self.window + 1) // self.block_size
        if self.kind == "chunked":
            return computed // self.window * self.window // self.block_size
        return 0

    def describe(self) -> str:
        what = {"full": "full", "sliding": f"sliding window {self.window}", "chunked": f"chunked {self.window}",
                "state": "state (one block per sequence)", "checkpoint": f"state checkpoints every {self.block_size}"}
        size = "" if self.kind in ("state", "checkpoint") else f", {self.block_size} tokens per block"
        return f"{len(self.layers)} layers: {what[self.kind]}{size}" + (" (state pool)" if self.pool else "")


@dataclass(frozen=True)
class PagedKV:
    """The paged memory of one model under one manager."""

    manager: str
    #: ``groups[0]`` is the scheduler's own table (the first full group, else the first attention group); the
    #: others are side groups (:class:`simkv.serving.sched.genai.SideTables`).
    groups: tuple[BlockGroup, ...]
    #: Bytes of one block of the KV pool.
    block_bytes: int
    #: The KV pool's tensors, in allocation order: (layer, ledger tensor name, bytes per block).
    tensors: tuple[tuple[int, str, int], ...]
    #: Bytes of one block of GenAI's linear-attention pool (0: none) and its tensors.
    state_bytes: int = 0
    state_tensors: tuple[tuple[int, str, int], ...] = ()
    #: The CPU plugin's scratch buffers at each KV pool (re)allocation (GenAI only).
    transient: bool = True
    #: Cost: attention layers as (count, bytes per token, window, kind), and the state bytes each scheduled
    #: sequence reads and writes per step.
    token_classes: tuple[tuple[int, int, int, str], ...] = ()
    seq_state_bytes: int = 0
    #: How vLLM's groups came out (for reports): layers per group and shared tensors.
    group_size: int = 0

    @property
    def block_size(self) -> int:
        return self.groups[0].block_size

    @property
    def plain(self) -> bool:
        """One full group in one pool: the scheduler's table is all there is (every uniform full model)."""
        return len(self.groups) == 1 and self.groups[0].kind == "full"

    @property
    def side(self) -> tuple[BlockGroup, ...]:
        return self.groups[1:]

    def request_bytes(self, tokens: int) -> int:
        """Bytes of the blocks one sequence of ``tokens`` computed tokens holds: each group's live entries
        (a window's freed ones excluded) × its pool's block bytes."""
        total = 0
        for g in self.groups:
            live = g.needed(tokens) - g.skipped(tokens)
            total += live * (self.state_bytes if g.pool else self.block_bytes)
        return total

    def describe(self) -> str:
        parts = "; ".join(g.describe() for g in self.groups)
        state = f", state block {self.state_bytes:,} B" if self.state_bytes else ""
        return f"{self.manager}: block {self.block_bytes:,} B{state}; {parts}"


def genai_tensor_bytes(layer: LayerKV, precision, block_size: int) -> tuple[int, int]:
    """Bytes of one block in one attention layer's key and value cache tensors (GenAI, MLA decompressed).

    u8 on the CPU plugin (shapes of the compiled paged model's ``key_cache.N`` / ``value_cache.N`` inputs,
    read by ``simkv validate --paged``): keys are quantised by channel — ``[blocks, H_kv, block + 8, S]`` (an
    f32 scale and zero point per channel and block) — values by token — ``[blocks, H_kv, block, S + 8]``.
    Other precisions: ``block`` tokens of K or V data (and metadata per token, if the precision has any).
    """
    heads, k_dim, v_dim = layer.cached("decompressed")
    if precision.name == "u8":
        return heads * (block_size + 8) * k_dim, heads * block_size * (v_dim + 8)
    k, v = k_v_bytes(layer, precision, "decompressed")
    meta = heads * precision.meta_bytes_per_head
    return block_size * (k + meta), block_size * (v + meta)


def conv_columns(model) -> tuple[int, int] | None:
    """(conv kernel K, columns vLLM keeps: K − 1) when the model gives its linear-attention dims, its Mamba-2 dims
    or its short-conv kernel — vLLM ``MambaStateShapeCalculator`` keeps ``conv_kernel − 1`` columns in every shape
    it builds (``gated_delta_net_state_shape``, ``mamba1_state_shape`` — Jamba's ``conv_state_shape = (divide(
    intermediate_size, tp), conv_kernel − 1)`` —, ``mamba2_state_shape``, ``short_conv_state_shape``) — else None
    (a model without those dims: all K counted).
    ``LayerKV.conv_elements`` counts ``conv_dim × K`` (transformers' ``[B, conv_dim, K]`` and GenAI's measured
    ``conv_state_table`` ``[?, conv_dim, K]``)."""
    dims = getattr(model, "linear_dims", None) or getattr(model, "mamba_dims", None)
    if dims:
        return dims[4], dims[4] - 1
    mamba1 = getattr(model, "mamba1_dims", None)
    if mamba1:
        return mamba1[2], mamba1[2] - 1
    kernel = getattr(model, "short_conv", 0)
    return (kernel, kernel - 1) if kernel else None


def vllm_state_bytes(model, layer: LayerKV) -> tuple[int, int]:
    """Bytes of a linear layer's (conv, recurrent) state for one sequence as vLLM keeps them: the conv's K − 1 of
    K columns (:func:`conv_columns`) in the model dtype (``mamba_cache_dtype`` auto), the recurrent state in the
    model's ``ssm_dtype`` where it names one (Nemotron-H's ``mamba_ssm_cache_dtype``: vllm/model_executor/
    models/config.py ``NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype``; mamba_utils.py
    ``_mamba_state_dtype``), else the model dtype. The one rule serving's vLLM pool and ``simkv models`` use."""
    dtype = DTYPE_BYTES.get(getattr(model, "dtype", "") or "", 2)
    ssm_dtype = getattr(model, "ssm_dtype", "")
    recurrent = DTYPE_BYTES.get(ssm_dtype, dtype) if ssm_dtype else dtype
    conv, rec = state_bytes(layer, dtype, recurrent)
    columns = conv_columns(model)
    if columns:
        kernel, kept = columns
        conv = conv * kept // kernel
    return conv, rec


def paged_kv(model, precision, block_size: int, manager: str = "genai", *, prefix_caching: bool = False) -> PagedKV:
    """The paged memory of ``model`` at ``precision`` and ``block_size`` tokens per block under ``manager``."""
    if manager not in KV_MANAGERS:
        raise ConfigError(f"unknown KV-cache manager {manager!r}; choose {', '.join(KV_MANAGERS)}")
    if block_size <= 0:
        raise ConfigError("block size must be positive")
    layers = model.kv_layers
    if not any(layer.caches_tokens for layer in layers):
        raise ConfigError(f"{model.name} has no attention layer: a paged KV pool needs one")
    return (_genai if manager == "genai" else _vllm)(model, precision, block_size, prefix_caching)


def _classes(layers, precision, mla: str) -> tuple[tuple[int, int, int, str], ...]:
    """Attention layers by (bytes per token, window, kind), counted, in order of first appearance."""
    out: dict[tuple[int, int, str], int] = {}
    for layer in layers:
        if layer.caches_tokens:
            key = (token_bytes((layer,), precision, mla=mla), layer.window or 0, layer.kind)
            out[key] = out.get(key, 0) + 1
    return tuple((count, b, w, kind) for (b, w, kind), count in out.items())


def _genai(model, precision, bs: int, prefix_caching: bool) -> PagedKV:
    layers = model.kv_layers
    tensors, attention = [], []
    for i, layer in enumerate(layers):
        if layer.caches_tokens:
            k, v = genai_tensor_bytes(layer, precision, bs)
            tensors += [(i, "k", k), (i, "v", v)]
            attention.append(i)
    block_bytes = sum(t[2] for t in tensors)
    groups = [BlockGroup("full", bs, 0, 0, tuple(attention), sum(t[2] for t in tensors))]
    linear = [i for i, layer in enumerate(layers) if layer.kind == "linear"]
    state_tensors: list[tuple[int, str, int]] = []
    for name, part in (("conv_state", 0), ("recurrent_state", 1)):  # conv_state_table.* then gated_delta_*
        for i in linear:
            nbytes = state_bytes(layers[i], GENAI_STATE_ELEMENT_BYTES, GENAI_STATE_ELEMENT_BYTES)[part]
            if nbytes:
                state_tensors.append((i, name, nbytes))
    la_bytes = sum(t[2] for t in state_tensors)
    if linear:
        if prefix_caching:
            multiplier = min(max(-(-la_bytes // block_bytes), LA_MULTIPLIER_MIN), LA_MULTIPLIER_MAX)
            groups.append(BlockGroup("checkpoint", bs * multiplier, 0, 1, tuple(linear), la_bytes))
        else:
            groups.append(BlockGroup("state", 0, 0, 1, tuple(linear), la_bytes))
    return PagedKV("genai", tuple(groups), block_bytes, tuple(tensors), la_bytes, tuple(state_tensors), True,
                   _classes(layers, precision, "decompressed"), la_bytes)


def _vllm(model, precision, bs: int, prefix_caching: bool) -> PagedKV:
    layers = model.kv_layers
    # one spec per layer: (kind, window, page bytes per token or per state)
    specs: dict[int, tuple[str, int, int]] = {}
    for i, layer in enumerate(layers):
        if layer.caches_tokens:
            specs[i] = (layer.kind, layer.window or 0, token_bytes((layer,), precision, mla="latent"))
        elif layer.kind == "linear":
            specs[i] = ("state", 0, sum(vllm_state_bytes(model, layer)))
    attn_kinds = {s[0] for s in specs.values() if s[0] != "state"}
    has_state = any(s[0] == "state" for s in specs.values())
    per_token = {s[2] for s in specs.values() if s[0] != "state"}
    if not has_state and attn_kinds == {"full"}:  # one type (or UniformTypeKVCacheSpecs): one group, pages summed
        ids = tuple(specs)
        tensors = tuple((i, "k", bs * specs[i][2]) for i in ids)
        total = sum(t[2] for t in tensors)
        return PagedKV("vllm", (BlockGroup("full", bs, 0, 0, ids, total),), total, tensors,
                       transient=False, token_classes=_classes(layers, precision, "latent"), group_size=len(ids))
    if has_state:
        if len(per_token) != 1:
            raise ConfigError("--kv-manager vllm: attention layers of different sizes beside Mamba layers are not "
                              "modelled (vLLM aligns one attention page to the Mamba page)")
        attn_1 = per_token.pop()
        mamba = max(s[2] for s in specs.values() if s[0] == "state")
        block = bs * -(-mamba // (bs * attn_1))
        bs = max(bs, block)
        page = bs * attn_1
        block_of = {i: (0 if s[0] == "state" else bs) for i, s in specs.items()}
    else:
        pages = {i: bs * s[2] for i, s in specs.items()}
        page = max(pages.values())
        block_of = {}
        for i, p in pages.items():
            if page % p:
                raise ConfigError("--kv-manager vllm: a layer's page size does not divide the largest one; vLLM "
                                  "cannot unify them by adjusting the block size")
            block_of[i] = bs * (page // p)
    # bucket layers by equal spec (in order of first appearance), then groups of group_size
    buckets: dict[tuple, list[int]] = {}
    for i, s in specs.items():
        buckets.setdefault((s[0], s[1], block_of[i]), []).append(i)
    sizes = [len(v) for v in buckets.values()]
    group_size = max(sizes) if max(sizes) < 1.5 * min(sizes) else min(sizes)
    groups = []
    for (kind, window, block), ids in buckets.items():
        n = -(-len(ids) // group_size)
        for k in range(n):
            members = tuple(ids[k::n])
            real = sum(specs[i][2] if kind == "state" else page for i in members)
            groups.append(BlockGroup(kind, block, window, 0, members, real))
    # the scheduler's own table: the first full group, else the first attention group
    first = next((g for g in groups if g.kind == "full"), None) or next(g for g in groups if g.kind != "state")
    groups.remove(first)
    groups.insert(0, first)
    tensors = tuple((i, "k", page) for i in range(group_size))
    return PagedKV("vllm", tuple(groups), group_size * page, tensors, transient=False,
                   token_classes=_classes(layers, precision, "latent"), group_size=group_size)


def overridden(kv: PagedKV, block_bytes: int | None, tensor_block_bytes) -> PagedKV:
    """A uniform model's layout with the bytes per block given by hand (``simkv validate --paged``, tests):
    ``tensor_block_bytes`` = (K, V) per layer, or ``block_bytes`` for all layers (K gets half a layer's
    share, V the rest; any remainder on the last V)."""
    from dataclasses import replace

    layers = [i for i, _, _ in kv.tensors[::2]]
    if tensor_block_bytes is None:
        per = int(block_bytes) // (2 * len(layers))
        tensor_block_bytes = (per, int(block_bytes) // len(layers) - per)
    k, v = tensor_block_bytes
    tensors = tuple(t for i in layers for t in ((i, "k", k), (i, "v", v)))
    total = int(block_bytes) if block_bytes else len(layers) * (k + v)
    if total - sum(t[2] for t in tensors):
        last = tensors[-1]
        tensors = tensors[:-1] + ((last[0], last[1], last[2] + total - sum(t[2] for t in tensors)),)
    return replace(kv, block_bytes=total, tensors=tensors, groups=(replace(kv.groups[0], real_bytes=total),))


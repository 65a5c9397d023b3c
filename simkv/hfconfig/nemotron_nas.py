"""Llama-Nemotron Super / Ultra (``nemotron-nas``, a Llama pruned by neural architecture search): each layer's
attention and FFN from its ``block_configs`` entry — ``attention.n_heads_in_group`` query heads per KV head
(``num_key_value_heads = num_attention_heads / n_heads_in_group``), ``attention.no_op`` a layer without attention
(no cache), ``ffn.ffn_mult`` the layer's MLP size ``int(2 · ffn_mult · hidden / 3)`` rounded up to a multiple of 256
(vLLM model_executor/models/nemotron_nas.py ``DeciLMDecoderLayer.__init__``, ``_ffn_mult_to_intermediate_size``,
``_find_multiple``). Head size ``hidden_size / num_attention_heads`` (``head_dim`` where given). Variants simkv does
not model are refused: attention or FFN replaced by a linear layer, windows, sinks, sparsity."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family
from simkv.kvspec import LayerKV

_REFUSED = {"replace_with_linear": False, "sparsify": None, "num_sink_tokens": None, "unshifted_sink": False,
            "use_prefill_window_in_sink_attention": False, "window_length": None}


def _blocks(c: Config, n: int) -> list[dict]:
    blocks = c.get("block_configs")
    if not isinstance(blocks, list) or len(blocks) != n or not all(
            isinstance(b, dict) and isinstance(b.get("attention"), dict) and isinstance(b.get("ffn"), dict)
            for b in blocks):
        raise c.fail(f"block_configs must be a list of {n} objects with attention and ffn")
    for i, b in enumerate(blocks):
        for part in ("attention", "ffn"):
            odd = [k for k, v in b[part].items() if k in _REFUSED and v not in (_REFUSED[k], None, False)]
            if odd:
                raise c.fail(f"block_configs[{i}].{part}.{odd[0]} = {b[part][odd[0]]!r}: a {part} variant simkv "
                             "does not model")
    return blocks


def nas_layers(c: Config, n: int) -> list[LayerKV]:
    heads = c.int("num_attention_heads", limits.MAX_HEADS)
    head_dim = c.int("head_dim", limits.MAX_HEAD_DIM, default=c.int("hidden_size", limits.MAX_WIDTH) // heads)
    out = []
    for i, b in enumerate(_blocks(c, n)):
        a = b["attention"]
        if a.get("no_op"):
            out.append(LayerKV("none"))
            continue
        group = a.get("n_heads_in_group")
        if not isinstance(group, int) or isinstance(group, bool) or group < 1 or heads % group:
            raise c.fail(f"block_configs[{i}].attention.n_heads_in_group must divide the {heads} heads, got {group!r}")
        out.append(LayerKV("full", heads // group, head_dim, head_dim))
    return out


def nas_intermediate(c: Config, n: int) -> tuple[int, ...]:
    hidden = c.int("hidden_size", limits.MAX_WIDTH)
    sizes = []
    for i, b in enumerate(_blocks(c, n)):
        f = b["ffn"]
        mult = f.get("ffn_mult")
        if f.get("no_op"):
            sizes.append(0)
            continue
        if not isinstance(mult, (int, float)) or isinstance(mult, bool) or not 0 < mult <= 64:
            raise c.fail(f"block_configs[{i}].ffn.ffn_mult must be a number in (0, 64], got {mult!r}")
        size = int(2 * mult * hidden / 3)
        sizes.append(-(-size // 256) * 256)
    return tuple(sizes)


FAMILIES = {
    "nemotron-nas": Family({}, layers=nas_layers, per_layer_mlp=nas_intermediate, reads=("block_configs",),
                           source="vLLM model_executor/models/nemotron_nas.py DeciLMDecoderLayer"),
}

"""``simkv models``: the model presets (built in, and the config.json files of simkv/data/configs), each one's
layer groups with their bytes per token, and the KV precisions; ``simkv models --model NAME|PATH [--json]``: one
model's groups, bytes per token under each runtime, fixed state per sequence, weights by format, and the fields
read from its file."""

from __future__ import annotations

import argparse
import json
import sys

from simkv.flags import Mode
from simkv.units import format_bytes

#: How each runtime holds a model's cache, for ``--model`` (docs/DESIGN.md §3c, §4c, §7; docs/guide/models.md):
#: (KV element type: the model's dtype or a fixed one, MLA form, frees what left a window, state element bytes
#: (conv, recurrent): None = the KV element's). A sparse-attention indexer's key cache (DeepSeek-V3.2, GLM-5) is
#: read only as vLLM lays it out (simkv.kvspec.indexer_bytes): the other runtimes' bytes are then null ("—").
RUNTIMES = {
    "transformers": ("model", "latent", True, (None, 4)),  # DynamicCache; torch delta rule keeps f32 states
    "vllm": ("model", "latent", True, None),  # MLAAttentionSpec, SlidingWindowSpec; states: vllm_state_bytes
    "openvino": ("f16", "decompressed", False, (None, 4)),  # stateful export: every token of every layer
    "genai": ("f16", "decompressed", False, (None, 4)),  # paged, no sliding-window freeing
}


#: The modes of ``simkv models`` (simkv.flags: every flag declares the ones that use it).
MODELS_MODES = (
    Mode("list", "the list of presets (no --model)", lambda a: not a.model, "what"),
    Mode("one", "one model (--model)", lambda a: bool(a.model), "what", ("--model", "llama-3-8b")),
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("models", help="list model presets, their layer groups, and precisions; or one model's "
                       "(--model NAME|PATH)", modes=MODELS_MODES)
    p.add_argument("--model", metavar="NAME|PATH", modes="one", help="one preset or config.json (or its folder): its "
                   "groups, bytes per token under each runtime, state per sequence, weights by format, fields read")
    p.add_argument("--json", action="store_true", modes="one", help="with --model: print JSON")
    return p


def main(args: argparse.Namespace) -> int:
    if getattr(args, "model", None):
        return _one(args.model, args.json)
    from simkv.hfconfig import all_presets
    from simkv.precision import PRECISIONS

    f16 = PRECISIONS["f16"]
    presets = all_presets()
    width = max(16, 2 + max(map(len, presets)))
    print(f"{'model':<{width}}{'layers':>7}{'heads':>7}{'kv_heads':>10}{'head_dim':>10}{'f16 KV/token':>15}")
    for m in presets.values():
        kv_heads, head_dim = cached_shape(m)
        print(f"{m.name:<{width}}{m.layers:>7}{m.heads:>7}{kv_heads:>10}{head_dim:>10}"
              f"{format_bytes(f16.kv_bytes_per_token(m)):>15}")
    print("\nlayer groups: layers x f16 bytes of one layer = the group's, per token (MLA: its latent; a window or "
          "chunk of W tokens holds at most W where the runtime frees what left it) or, for a linear-attention "
          "state, per request (conv f16, recurrent f32):")
    for m in presets.values():
        for i, (spec, ids) in enumerate(m.groups):
            print(f"  {m.name if i == 0 else '':<{width}}{group_line(spec, len(ids), f16)}")
    print("\nprecisions: " + ", ".join(f"{p.name} ({p.bits} bit{'; ' + p.note if p.note else ''})" for p in PRECISIONS.values()))
    return 0


def cached_shape(model) -> tuple[str, str]:
    """The KV heads and head size a model's cache holds, as the bytes per token count them: an MLA model's layers
    cache one latent of ``kv_lora_rank + qk_rope_head_dim`` values, not per-head K and V (those are its
    decompressed form, shown in its group line)."""
    latent = {spec.latent for spec, _ in model.groups if spec.latent is not None}
    if len(latent) == 1 and all(spec.latent is not None or not spec.caches_tokens for spec, _ in model.groups):
        rank, rope = latent.pop()
        return "1 latent", f"{rank}+{rope}"
    return str(model.kv_heads), str(model.head_dim)


def describe_model(name: str) -> dict:
    """Everything ``--model`` shows, as data (the JSON form)."""
    from simkv.hfconfig import resolve_model
    from simkv.hfconfig.reader import field_report
    from simkv.kvspec import state_bytes, token_bytes
    from simkv.precision import get_precision
    from simkv.scenario import DTYPE_PRECISION
    from simkv.errors import ConfigError
    from simkv.models import vllm_kv_precision
    from simkv.serving.kv.groups import vllm_state_bytes

    m = resolve_model(name)
    own = DTYPE_PRECISION.get(m.dtype.lower(), "f16")
    kv = {rt: get_precision(own if dtype == "model" else dtype) for rt, (dtype, *_) in RUNTIMES.items()}
    vllm_refused = None
    try:  # vLLM's kv_cache_dtype "auto": the checkpoint's KV format (fp8) where its quantization config names one
        kv["vllm"] = get_precision(vllm_kv_precision(m))
    except ConfigError as err:  # a layout simkv does not model: vLLM's columns are null, the reason beside them
        vllm_refused = str(err)

    def state(spec, rt):
        if rt == "vllm":
            return sum(vllm_state_bytes(m, spec))
        conv, rec = RUNTIMES[rt][3]
        each = kv[rt].bits / 8
        return sum(state_bytes(spec, conv or each, rec or each))

    indexer = any(layer.indexer for layer in m.kv_layers)
    held = [rt for rt in RUNTIMES if (rt == "vllm" or not indexer) and not (rt == "vllm" and vllm_refused)]

    def each(values: dict) -> dict:
        return {rt: values[rt] if rt in held else None for rt in RUNTIMES}

    groups = []
    for spec, ids in m.groups:
        groups.append({
            "layers": list(ids), "count": len(ids), "kind": spec.kind, "describe": spec.describe(),
            "kv_heads": spec.kv_heads, "k_dim": spec.k_dim, "v_dim": spec.v_dim, "window": spec.window,
            "latent": list(spec.latent) if spec.latent else None, "sinks": spec.sinks, "reuses": spec.reuses,
            "bytes_per_token": each({rt: len(ids) * token_bytes([spec], kv[rt], mla=RUNTIMES[rt][1])
                                     for rt in held}),
            "state_bytes_per_sequence": each({rt: len(ids) * state(spec, rt) for rt in held}),
        })
    out = {
        "model": m.name, "source": m.source, "describe": m.describe(), "layers": m.layers, "heads": m.heads,
        "hidden": m.hidden, "dtype": m.dtype or None,
        "kv_precision": {rt: p.name for rt, p in kv.items()}, "vllm_kv_refused": vllm_refused,
        "frees_windows": {rt: r[2] for rt, r in RUNTIMES.items()},
        "kv_bytes_per_token": each({rt: sum(g["bytes_per_token"][rt] for g in groups) for rt in held}),
        "state_bytes_per_sequence": each({rt: sum(g["state_bytes_per_sequence"][rt] for g in groups) for rt in held}),
        "groups": groups,
        "weights": _weights(m),
        "fields": field_report(m.source) if m.source else None,
    }
    return out


def _weights(m) -> dict:
    """The weights by format, or why they are not sized (``refused``: the KV above is still read)."""
    from simkv.models import CHECKPOINT, params_by_format, weights_bytes

    scheme = m.weight_scheme.describe() if m.weight_scheme else None
    if m.weights_refused:
        return {"scheme": scheme, "refused": m.weights_refused}
    return {"scheme": scheme, "params_by_format": params_by_format(m, CHECKPOINT), "bytes": weights_bytes(m, CHECKPOINT),
            "params": m.weight_params, "active_params": m.active_params}


def _one(name: str, as_json: bool) -> int:
    from simkv.errors import SimkvError

    try:
        d = describe_model(name)
    except SimkvError as err:
        print(f"simkv models: error: {err}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(d, indent=1))
        return 0
    print(f"{d['describe']}")
    if d["source"]:
        print(f"  source      {d['source']}" + (f" (model_type {d['fields']['model_type']}, read by "
                                               f"{d['fields']['reader']})" if d["fields"] else ""))
    rts = list(RUNTIMES)
    print(f"  {'group':<58}" + "".join(f"{rt:>14}" for rt in rts))
    for g in d["groups"]:
        label = f"{g['count']} x {g['describe']}"
        print(f"  {label[:58]:<58}" + "".join(f"{_bytes(g['bytes_per_token'][rt]):>14}" for rt in rts))
        if any(g["state_bytes_per_sequence"].values()):
            print(f"  {'  state per sequence':<58}" + "".join(
                f"{_bytes(g['state_bytes_per_sequence'][rt]):>14}" for rt in rts))
    print(f"  {'KV bytes per token (every token kept)':<58}" + "".join(
        f"{_bytes(d['kv_bytes_per_token'][rt]):>14}" for rt in rts))
    print(f"  {'KV element type':<58}" + "".join(f"{d['kv_precision'][rt]:>14}" for rt in rts))
    print(f"  {'frees what left a window':<58}" + "".join(
        f"{'yes' if d['frees_windows'][rt] else 'no':>14}" for rt in rts))
    if d["vllm_kv_refused"]:
        print(f"  vllm        {d['vllm_kv_refused']}")
    w = d["weights"]
    if "refused" in w:
        print(f"  weights     not sized: {w['refused']}")
    else:
        formats = ", ".join(f"{k} {v:,}" for k, v in sorted(w["params_by_format"].items()))
        print(f"  weights     {format_bytes(w['bytes'])} as stored ({w['scheme'] or d['dtype'] or 'one precision'}): "
              f"{formats or 'no weights (a custom shape)'} parameters")
    if d["fields"]:
        print(f"  fields read {', '.join(d['fields']['read'])}")
        if d["fields"]["neutral"]:
            print(f"  not needed  {', '.join(d['fields']['neutral'])}")
    return 0


def _bytes(value) -> str:
    """A byte count, or "—" where the runtime does not hold the model's cache (null in the JSON)."""
    return "—" if value is None else format_bytes(value)


def group_line(spec, count: int, precision) -> str:
    """One group: its bytes (simkv.kvspec's sums) and what its layers keep."""
    from simkv.kvspec import state_bytes, token_bytes

    if spec.kind == "linear":
        one, unit = sum(state_bytes(spec, precision.bits / 8)), "request"
    elif spec.caches_tokens:
        one, unit = token_bytes([spec], precision), "token"
    else:
        one, unit = 0, "token"
    note = ""
    if spec.latent:
        full = token_bytes([spec], precision, mla="decompressed")
        note = f"; as decompressed: {format_bytes(full)} x {count} = {format_bytes(full * count)}/token"
    if spec.window:
        note += f"; <= {spec.window:,} tokens"
    return (f"{count:>4} x {format_bytes(one):>10} = {format_bytes(one * count):>10}/{unit:<9} "
            f"{spec.describe()}{note}")

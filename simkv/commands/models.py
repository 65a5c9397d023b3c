"""``simkv models``: the model presets (built in, and the config.json files of data/configs), each one's layer
groups with their bytes per token, and the KV precisions."""

from __future__ import annotations

import argparse

from simkv.units import format_bytes


def add_parser(sub) -> argparse.ArgumentParser:
    return sub.add_parser("models", help="list model presets, their layer groups, and precisions")


def main(args: argparse.Namespace) -> int:
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

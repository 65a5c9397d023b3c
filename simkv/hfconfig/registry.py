"""Every family simkv reads, in one table: each module's ``FAMILIES`` (model_type → :class:`~simkv.hfconfig.base.
Family`), the model types refused with their reason, and the multimodal wrappers whose ``text_config`` names no
model type. The docs' family table (docs/guide/models.md, :func:`family_table`) and the refusal messages are
generated from here."""

from __future__ import annotations

from simkv.hfconfig import (deepseek, gemma, gemma3n, gemma4, gpt_oss, hybrid, lfm2, llama, llama4, mimo_v2, nemotron_h,
                            nemotron_nas, qwen, qwen3_next, refused, step)
from simkv.hfconfig.base import COMMON, Family

MODULES = (llama, qwen, qwen3_next, gemma, gemma3n, gemma4, gpt_oss, llama4, deepseek, mimo_v2, nemotron_nas, step, hybrid,
           nemotron_h, lfm2)
FAMILIES: dict[str, Family] = {name: family for module in MODULES for name, family in module.FAMILIES.items()}
#: The module each model type is read by.
MODULE_OF = {name: module.__name__.rpartition(".")[2] for module in MODULES for name in module.FAMILIES}
REFUSED = refused.REFUSED
#: The text model type of a multimodal wrapper whose ``text_config`` does not name one (its ``sub_configs``).
WRAPPERS = {"gemma3": "gemma3_text", "llama4": "llama4_text", "mistral3": "mistral", "qwen3_vl": "qwen3_vl_text",
            "qwen3_vl_moe": "qwen3_vl_moe_text", "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text",
            "gemma4": "gemma4_text", "gemma3n": "gemma3n_text", "kimi_k25": "kimi_k2"}


def family_table() -> str:
    """The Markdown table of every family (model type, module, the fields it reads beyond the common ones, its
    source) and every refused model type: what docs/guide/models.md shows (a test keeps it current)."""
    rows = ["| model_type | module | fields read besides the common ones | source |", "|---|---|---|---|"]
    for name, family in FAMILIES.items():
        extra = sorted(set(family.understood()) - set(COMMON))
        rows.append(f"| `{name}` | `{MODULE_OF[name]}` | {', '.join(f'`{k}`' for k in extra) or '—'} | "
                    f"{family.source} |")
    rows += ["", "| refused model_type | why |", "|---|---|"]
    rows += [f"| `{name}` | {reason} |" for name, reason in REFUSED.items()]
    return "\n".join(rows) + "\n"

"""StepFun Step-3.7: full and sliding-window layers from ``layer_types`` (trailing MTP entries trimmed: transformers
5.23 ``Step3p7TextConfig.__post_init__`` splits off ``num_nextn_predict_layers`` of them), every layer
``num_key_value_heads`` x ``head_dim`` (modeling_step3p7.py), MoE from layer 3 on (``mlp_layer_types`` /
``moe_layers_enum``, default ``range(3, n)``) with one shared expert of ``share_expert_dim``."""

from __future__ import annotations

from simkv import limits
from simkv.hfconfig.base import Config, Family


def _trimmed(c: Config, n: int, window) -> list[str]:
    types = c.get("layer_types")
    extra = c.int("num_nextn_predict_layers", limits.MAX_LAYERS, minimum=0, default=0)
    if isinstance(types, list) and len(types) == n + extra:
        return types[:n]
    if types is None:
        return ["full_attention"] * n
    return types


def _check(c: Config) -> None:
    sliding = c.get("num_sliding_attention_heads")
    if sliding is not None and sliding != c.get("num_attention_heads"):
        raise c.fail(f"num_sliding_attention_heads {sliding!r} differs from num_attention_heads: per-kind query "
                     "heads are not read")
    if c.get("attention_other_setting") is not None:
        raise c.fail("attention_other_setting (per-kind heads and sizes of the sliding layers) is not read")


def step_moe(c: Config, n: int) -> list[int]:
    kinds = c.get("mlp_layer_types")
    if isinstance(kinds, list):
        return [i for i, k in enumerate(kinds[:n]) if k == "sparse"]
    enum = c.get("moe_layers_enum")
    if enum is not None:
        items = enum.split(",") if isinstance(enum, str) else enum
        return sorted({int(i) for i in items if str(i).strip()} & set(range(n)))
    return list(range(3, n))


FAMILIES = {
    "step3p7": Family({"num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                       "intermediate_size": 11264, "vocab_size": 128815, "tie_word_embeddings": False,
                       "max_position_embeddings": 128000, "num_experts_per_tok": 8,
                       "moe_intermediate_size": 1280, "share_expert_dim": 1280,
                       "sliding_window": None},
                      types=_trimmed, moe_layers=step_moe, check=_check,
                      shared=lambda c, n: c.int("share_expert_dim", limits.MAX_WIDTH),
                      reads=("num_nextn_predict_layers", "mlp_layer_types", "moe_layers_enum", "share_expert_dim",
                             "num_sliding_attention_heads", "attention_other_setting", "use_moe_router_bias",
                             "moe_router_scaling_factor", "swiglu_limits", "swiglu_limits_shared",
                             "mtp_layer_types", "mtp_mlp_layer_types"),
                      source="transformers 5.23 configuration_step3p7.py Step3p7TextConfig, modeling_step3p7.py"),
}

"""CPU vs GPU OpenVINO policies and KV precision: peak memory and where the bytes go, metadata included.

    python -m experiments.precision [--quick] [--out out/precision]     (or: python -m experiments)

One session (1,024-token prompt, 2,048 generated; ``--quick``: 256) per model ×
policy × the KV precisions simkv models for that plugin (simkv.precision: the CPU plugin stores
u8/u4 with an f32 scale + zero-point per token per head; the GPU plugin's i8
with an f16 pair; f32/f16/bf16 are data only), under ``openvino-cpu`` (doubling,
old freed at once, model-wide f32 past view) and ``openvino-gpu`` (staggered
additive headroom, old freed at the next inference, two i32 beam tables per
primitive). The final allocation is split by buffer kind from the ledger
(alloc − free bytes per tensor): K/V data, quantisation scales, beam tables and
the CPU plugin's past view — so the metadata's share is visible, not folded
into "KV bytes".

Writes ``precision.csv`` and the figure ``precision`` (HTML, PNG, SVG).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simkv import build_scenario, simulate
from simkv.ledger import ALLOC, FREE, TENSOR_CODE
from simkv.lab.output import main_for, save_figure, write_csv
from simkv.lab.palette import policy_color

MODELS = ("llama-3-8b", "qwen2.5-7b", "phi-3.5-mini")
PRECISIONS = {"openvino-cpu": ("f32", "bf16", "f16", "u8", "u4"), "openvino-gpu": ("f32", "f16", "i8")}
#: Buffer kinds (ledger tensors) and their colours (kinds, not policies).
KINDS = {"K/V data": ("k", "v"), "scales + zero points": ("k_scale", "v_scale"),
         "beam tables": ("k_beam", "v_beam"), "past view (CPU)": ("past_view",)}
#: Greys and patterns, so that no buffer kind looks like a policy's colour (simkv.lab.palette).
KIND_STYLE = {"K/V data": ("#d9d9d9", ""), "scales + zero points": ("#252525", ""), "beam tables": ("#969696", "/"),
              "past view (CPU)": ("#636363", "x")}
FIGURE_MODEL = "llama-3-8b"


def live_bytes(ledger) -> dict[str, int]:
    """Bytes still allocated at the end, per buffer kind (alloc − free over the whole ledger)."""
    rows = ledger.rows
    signed = np.where(rows["op"] == ALLOC, rows["bytes"], np.where(rows["op"] == FREE, -rows["bytes"], 0))
    out = {}
    for kind, tensors in KINDS.items():
        mask = np.isin(rows["tensor"], [TENSOR_CODE[t] for t in tensors])
        out[kind] = int(signed[mask].sum())
    return out


def run(out: Path, quick: bool) -> None:
    """CPU vs GPU OpenVINO policies and KV precision, metadata included."""
    decode = 256 if quick else 2048
    models = (FIGURE_MODEL,) if quick else MODELS
    rows = []
    for model in models:
        for policy, precisions in PRECISIONS.items():
            for precision in precisions:
                res = simulate(build_scenario(model=model, policy=policy, precision=precision, prompt=1024, decode=decode,
                                              device_memory="16GiB"))  # the 16 GiB the results were measured on
                m, parts = res.metrics, live_bytes(res.ledger)
                final = sum(parts.values())
                assert final == m.final_allocated_bytes, "ledger and metrics disagree"  # conservation
                rows.append({"model": model, "policy": policy, "precision": precision, "prompt": 1024, "decode": decode,
                             "kv_bytes_per_token": res.scenario.precision.kv_bytes_per_token(res.scenario.model),
                             "peak_allocated_bytes": m.peak_allocated_bytes, "final_allocated_bytes": final,
                             **{f"final {k} bytes": v for k, v in parts.items()},
                             "metadata_pct": round(100 * (final - parts["K/V data"]) / final, 6),
                             "realloc_count": m.realloc_count, "bytes_copied": m.bytes_copied})
    write_csv(out / "precision.csv", rows)
    save_figure(figure([r for r in rows if r["model"] == FIGURE_MODEL], decode), out / "precision")


def figure(rows: list[dict], decode: int) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.1, subplot_titles=(
        "final allocation by buffer kind", "peak allocated"))
    x = [f"{r['policy'].removeprefix('openvino-').upper()} {r['precision']}" for r in rows]
    for kind in KINDS:
        fig.add_bar(x=x, y=[r[f"final {kind} bytes"] / 2**20 for r in rows], name=kind,
                    marker={"color": KIND_STYLE[kind][0], "pattern": {"shape": KIND_STYLE[kind][1]},
                            "line": {"color": "#252525", "width": 0.5}}, row=1, col=1,
                    hovertemplate="%{x}: %{y:,.1f} MiB<extra>" + kind + "</extra>")
    for policy in PRECISIONS:
        mine = [r for r in rows if r["policy"] == policy]
        fig.add_scatter(x=[r["precision"] for r in mine], y=[r["peak_allocated_bytes"] / 2**20 for r in mine],
                        name=policy, mode="markers+text", marker={"color": policy_color(policy), "size": 12},
                        row=1, col=2, textposition="top center",
                        text=[f"{r['metadata_pct']:.1f} % meta" for r in mine], textfont={"size": 10})
    fig.update_yaxes(title_text="MiB", row=1, col=1)
    fig.update_yaxes(title_text="MiB", row=1, col=2)
    fig.update_xaxes(title_text="plugin and KV precision", row=1, col=1)
    fig.update_xaxes(title_text="KV precision (labels: metadata share of the final allocation)", row=1, col=2,
                     categoryorder="array", categoryarray=["f32", "bf16", "f16", "i8", "u8", "u4"])
    fig.update_layout(template="plotly_white", barmode="stack", width=1300, height=560,
                      legend={"orientation": "h", "y": -0.2},
                      title=f"{rows[0]['model']}: 1,024-token prompt + {decode:,} generated, OpenVINO CPU vs GPU policies")
    return fig


if __name__ == "__main__":
    main_for(run, __doc__, "precision")

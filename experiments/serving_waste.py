"""Waste breakdown on the Azure traces: contiguous max-length, contiguous OpenVINO policies, paged (the vLLM paper's analysis).

    python -m experiments.serving_waste [--quick] [--out out/serving_waste]     (or: python -m experiments)

The vLLM paper (Kwon et al., SOSP'23, §2.3 and Fig. 2) measured that earlier serving systems kept only
20.4–38.2 % of their KV memory holding tokens. This redoes that analysis on public traces: the Azure LLM
inference trace 2023, conversation (19,366 requests) and code (8,819 requests) services, one hour each
(``simkv/data/traces``; ``--quick``: the first 120 requests of each), served by ``simkv.serving.serve`` with
llama-2-7b shapes, f16 KV, the ``h100-sxm`` preset (its memory minus the int8 weights), continuous batching,
and four memory modes:

* ``paged`` — OpenVINO GenAI's block pool with its defaults (block 32, dynamic pool: sized for the first
  prompts, grown by 8 blocks and copied when a sequence needs one, never shrunk; 256 batched tokens);
* ``max-length`` — contiguous per-request buffers reserved for the model's whole 4,096-token context
  (``static`` policy, ``max_prompt_len`` 4,096, no rounding), as serving systems did before paging; requests
  longer than the context are REJECTED (counted in the CSV);
* ``openvino-cpu`` / ``openvino-gpu`` — contiguous per-request buffers grown by the OpenVINO plugins' own rules
  (doubling; additive staggered headroom), one stateful session per request on a shared device budget.

Waste = allocated − used (the tokens' KV), time-weighted over the run (each step weighted by its simulated
duration), split as the serving step table does (``simkv/serving/engine/core.py``, ``contiguous.py``):

* **reserved, unused** — paged: free blocks of the pool (the dynamic pool grows for bursts and never shrinks);
  contiguous: headroom the request's own later tokens will fill (the paper's "reservation");
* **internal** — paged: the unfilled tail of each sequence's last block; contiguous: allocated room the request
  never fills (over-provisioning beyond its final length, metadata: the paper's "internal fragmentation");
* **transient** — in-step peak above the allocation (paged: the CPU plugin's scratch copies of the pool when it
  grows; contiguous: old and new buffers alive together while one is reallocated).

Writes ``waste.csv`` (one row per trace × memory mode), ``wall_times.csv`` (CPU seconds per run, measured:
nondeterministic) and the figure ``waste`` (HTML, PNG, SVG).
"""

from __future__ import annotations

import time
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simkv.cost import get_device
from simkv.lab.output import main_for, save_figure, write_csv
from simkv.lab.palette import policy_color
from simkv.lab.traces import AZURE_CODE, AZURE_CONV
from simkv.models import get_model
from simkv.precision import get_precision
from simkv.scenario import resolve_weights_memory
from simkv.serving import ServingSpec, load_trace, serve

NONDETERMINISTIC = ("wall_times.csv",)
TRACES = {"conversation": AZURE_CONV, "code": AZURE_CODE}
QUICK_REQUESTS = 80
MODEL, PRECISION, DEVICE, CONTEXT = "llama-2-7b", "f16", "h100-sxm", 4096
#: Memory mode → (memory, policy, policy options). Colours: simkv.lab.palette (paged, max-length, openvino-*).
MODES = {
    "paged": ("paged", None, None),
    "max-length": ("contiguous", "static", {"max_prompt_len": CONTEXT, "min_response_len": 0, "prefill_chunk": 1}),
    "openvino-cpu": ("contiguous", "openvino-cpu", None),
    "openvino-gpu": ("contiguous", "openvino-gpu", None),
}
#: Waste parts (quantities, not policies: greys and patterns so none looks like a policy colour).
PARTS = {"used": ("tokens' KV (used)", "#d9d9d9", ""),
         "reserved": ("reserved, unused", "#969696", "/"),
         "internal": ("internal", "#252525", ""),
         "transient": ("transient (in-step)", "#636363", "x")}
GIB = 2**30


def measure(trace: str, requests: list, mode: str) -> tuple[dict, float]:
    """One serving run: its waste row and the CPU seconds it took."""
    memory, policy, options = MODES[mode]
    model = get_model(MODEL)
    spec = ServingSpec(requests, model, get_precision(PRECISION), memory=memory, device=DEVICE,
                       weights_bytes=resolve_weights_memory(model, None, None, get_device(DEVICE)), max_context=0,
                       **({"policy": policy, "policy_options": options} if policy else {}))
    t0 = time.process_time()
    m = serve(spec).metrics
    cpu = time.process_time() - t0
    alloc = m["mean_allocated_bytes"]
    used = alloc - m["waste_bytes"]
    row = {"trace": trace, "memory": mode, "requests": m["requests_total"], "finished": m["requests_finished"],
           "rejected": m["requests_rejected"], "ignored": m["requests_ignored"], "preemptions": m["preemptions"],
           "mean_allocated_bytes": alloc, "mean_used_bytes": used,
           "reserved_bytes": m["waste_reserved_bytes"], "internal_bytes": m["waste_internal_bytes"],
           "transient_bytes": m["waste_transient_bytes"],
           "waste_pct_of_allocated": round(100 * m["waste_bytes"] / alloc, 6) if alloc else 0.0,
           "used_pct_of_allocated": round(100 * used / alloc, 6) if alloc else 0.0,
           "reserved_pct_of_allocated": round(100 * m["waste_reserved_bytes"] / alloc, 6) if alloc else 0.0,
           "internal_pct_of_allocated": round(100 * m["waste_internal_bytes"] / alloc, 6) if alloc else 0.0,
           # paged: last-block slack as a share of the blocks in use (the vLLM paper's < 4 %)
           "internal_pct_of_in_use": round(m["waste_internal_pct_of_in_use"], 6) if memory == "paged" else None,
           "peak_allocated_bytes": m["peak_allocated_bytes"], "bytes_copied": m["bytes_copied"],
           "ttft_p99_s": m["ttft_p99_s"], "tpot_p99_s": m["tpot_p99_s"], "oom_step": m["oom_step"]}
    # conservation: used + reserved + internal = allocated (time-weighted means, each rounded once)
    assert abs(used + row["reserved_bytes"] + row["internal_bytes"] - alloc) <= 2, row
    return row, cpu


def run(out: Path, quick: bool) -> None:
    """Every trace × memory mode; CSVs and the stacked waste figure."""
    rows, times = [], []
    for trace, path in TRACES.items():
        requests = load_trace(path, limit=QUICK_REQUESTS if quick else None)
        for mode in MODES:
            row, cpu = measure(trace, requests, mode)
            rows.append(row)
            times.append({"trace": trace, "memory": mode, "requests": row["requests"], "cpu_s": round(cpu, 3)})
    write_csv(out / "waste.csv", rows)
    write_csv(out / "wall_times.csv", times)
    save_figure(figure(rows), out / "waste")


def figure(rows: list[dict]) -> go.Figure:
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    fig = make_subplots(rows=2, cols=len(traces), row_heights=[0.68, 0.32], vertical_spacing=0.14,
                        horizontal_spacing=0.08,
                        subplot_titles=[f"{t} trace ({rows[[r['trace'] for r in rows].index(t)]['requests']:,} "
                                        "requests): mean memory" for t in traces]
                        + ["share of allocated holding tokens" for _ in traces])
    for col, trace in enumerate(traces, start=1):
        mine = [r for r in rows if r["trace"] == trace]
        x = [r["memory"] for r in mine]
        values = {"used": [r["mean_used_bytes"] for r in mine], "reserved": [r["reserved_bytes"] for r in mine],
                  "internal": [r["internal_bytes"] for r in mine], "transient": [r["transient_bytes"] for r in mine]}
        for part, (label, colour, pattern) in PARTS.items():
            fig.add_bar(x=x, y=[v / GIB for v in values[part]], name=label, legendgroup=part, showlegend=col == 1,
                        marker={"color": colour, "pattern": {"shape": pattern}, "line": {"color": "#252525", "width": 0.5}},
                        hovertemplate="%{x}: %{y:,.2f} GiB<extra>" + label + "</extra>", row=1, col=col)
        fig.add_scatter(x=x, y=[0] * len(x), mode="text", showlegend=False, hoverinfo="skip", row=1, col=col,
                        text=[f"{r['rejected']:,} rejected" if r["rejected"] else "" for r in mine],
                        textposition="bottom center", textfont={"size": 10, "color": "#d62728"})
        for r in mine:
            fig.add_scatter(x=[r["memory"]], y=[r["used_pct_of_allocated"]], mode="markers+text", name=r["memory"],
                            legendgroup=r["memory"], showlegend=col == 1, row=2, col=col,
                            marker={"color": policy_color(r["memory"]), "size": 13, "line": {"color": "#333", "width": 1}},
                            text=[f"{r['used_pct_of_allocated']:.1f} %"], textposition="top center",
                            textfont={"size": 10}, hovertemplate="%{x}: %{y:.1f} % of allocated used<extra></extra>")
        fig.update_yaxes(title_text="GiB (time-weighted mean)" if col == 1 else None, row=1, col=col)
        fig.update_yaxes(title_text="% of allocated" if col == 1 else None, range=[0, 118], row=2, col=col)
        fig.update_xaxes(title_text="memory mode", row=2, col=col)
    fig.update_layout(template="plotly_white", barmode="stack", width=1300, height=820,
                      legend={"orientation": "h", "y": -0.12},
                      title=f"KV memory waste serving the Azure LLM traces 2023: {MODEL} shapes, {PRECISION} KV, "
                            f"{DEVICE}, continuous batching")
    return fig


if __name__ == "__main__":
    main_for(run, __doc__, "serving_waste")

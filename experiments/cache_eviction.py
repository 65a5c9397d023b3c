"""GenAI cache eviction on conversation traffic: requests served, KV in use, preemptions, TTFT and TPOT per budget.

    python -m experiments.cache_eviction [--quick] [--out out/cache_eviction]     (or: python -m experiments)

OpenVINO GenAI's ``use_cache_eviction`` (docs/DESIGN.md §4d, docs/guide/cache-eviction.md) keeps a request's first
``start`` and last ``recent`` tokens and at most ``max`` in all, dropping whole blocks after the forward of each
step once past the prompt. This serves two workloads with qwen3-8b shapes under continuous batching (GenAI's
scheduler, ``simkv.serving.serve``) on two presets, without eviction and at three budgets:

* workloads — ``azure-conv``: the first 2,000 requests of the Azure LLM conversation trace 2023
  (``simkv/data/traces``, arrival times as recorded); ``long-chats``: 24 synthetic chats of 6 turns, each turn's
  prompt the whole history (GenAI's stateless requests re-send it) plus 200-600 new tokens, 300-900 generated, a turn
  every 20 s, chats starting over the first minute (``--quick``: 100 trace requests, 6 chats of 3 turns, eviction
  off and at 672 only);
* devices — ``xeon-8480`` (GenAI's CPU: block 32, u8 KV) and ``h100-sxm`` (block 16, f16 KV), each with the
  weights beside the KV (bf16) and two pools: GenAI's dynamic pool, and a fixed pool of 20,000 (CPU) or 12,000
  (H100) tokens' blocks, small enough that requests queue and are preempted without eviction;
* eviction — off; ``max`` 1,024, 672 (GenAI's default) and 256 tokens with GenAI's other defaults (``start`` 32,
  ``recent`` 128, SnapKV window 8: a prompt of 33-39 tokens would stop ``step()``, §4d; the first 2,000 trace
  requests have none); and 672 with the SnapKV window off (``snapkv=0``), which registers scores in every prompt
  chunk past ``start``.

Writes ``eviction.csv`` (one row per workload × device × pool × eviction: requests served, preemptions, peak and
time-weighted mean KV in blocks in use, peak and mean allocated, TTFT and TPOT p50/p99, blocks dropped, where a run
stopped), ``eviction.md`` (the table the guide shows) and one figure per workload (HTML, PNG, SVG).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simkv.cost import get_device
from simkv.lab.output import main_for, save_figure, write_csv
from simkv.lab.traces import AZURE_CONV
from simkv.hfconfig import resolve_model
from simkv.precision import get_precision
from simkv.scenario import resolve_weights_memory
from simkv.serving import Request, SchedulerConfig, ServingSpec, load_trace, serve
from simkv.serving.sched.eviction import parse_cache_eviction

MODEL = "qwen3-8b"
#: device → (block size, KV precision, tokens of the fixed pool)
DEVICES = {"xeon-8480": (32, "u8", 20_000), "h100-sxm": (16, "f16", 12_000)}
#: label → the --cache-eviction value (None: off)
BUDGETS = {"off": None, "1024": "max=1024", "672": "max=672", "256": "max=256", "672, snapkv 0": "max=672,snapkv=0"}
#: ``--quick``: off and GenAI's default only (the figure's lines then have two points)
QUICK_BUDGETS = ("off", "672")
TRACE_REQUESTS, QUICK_TRACE_REQUESTS = 2000, 100
GIB = 2**30


def long_chats(quick: bool) -> list[Request]:
    """Synthetic chats: each turn adds 200-600 tokens to the history it re-sends and generates 300-900 (seed 0)."""
    rng = np.random.default_rng(0)
    chats, turns = (6, 3) if quick else (24, 6)
    reqs = []
    for c in range(chats):
        start = float(rng.uniform(0, 60))
        for t in range(turns):
            reqs.append((start + 20.0 * t, int(rng.integers(200, 601)), int(rng.integers(300, 901)), f"chat{c}"))
    reqs.sort(key=lambda r: r[0])
    return [Request(i, p, g, arrival_s=round(a, 6), session=s) for i, (a, p, g, s) in enumerate(reqs)]


def workloads(quick: bool) -> dict[str, list[Request]]:
    return {"azure-conv": load_trace(AZURE_CONV, limit=QUICK_TRACE_REQUESTS if quick else TRACE_REQUESTS),
            "long-chats": long_chats(quick)}


def measure(workload: str, requests: list[Request], device: str, pool: str, budget: str) -> dict:
    """One serving run's row."""
    block, precision, fixed_tokens = DEVICES[device]
    model = resolve_model(MODEL)
    eviction = parse_cache_eviction(BUDGETS[budget])
    cfg = SchedulerConfig(block_size=block, num_kv_blocks=fixed_tokens // block if pool == "fixed" else 0,
                          cache_eviction=eviction)
    spec = ServingSpec(requests, model, get_precision(precision), "continuous", "paged", cfg, device=device,
                       weights_bytes=resolve_weights_memory(model, None, None, get_device(device)), max_context=0)
    result = serve(spec)
    m, steps = result.metrics, result.steps
    peak_blocks = int(steps["blocks_used"].max()) if len(steps) else 0
    return {"workload": workload, "device": device, "pool": pool, "eviction": budget,
            "cache_eviction": eviction.label() if eviction else "", "requests": m["requests_total"],
            "served": m["requests_finished"], "preemptions": m["preemptions"],
            "peak_kv_bytes": peak_blocks * result.block_bytes, "mean_kv_bytes": m["mean_in_use_bytes"],
            "peak_allocated_bytes": m["peak_allocated_bytes"], "mean_allocated_bytes": m["mean_allocated_bytes"],
            "ttft_p50_s": m["ttft_p50_s"], "ttft_p99_s": m["ttft_p99_s"], "tpot_p50_s": m["tpot_p50_s"],
            "tpot_p99_s": m["tpot_p99_s"], "evicted_blocks": result.evicted_blocks, "steps": m["steps"],
            "stopped_at_step": result.runtime_stop["step"] if result.runtime_stop else None}


def run(out: Path, quick: bool) -> None:
    """Every workload × device × pool × budget: the CSV, the markdown table, a figure per workload."""
    rows = []
    budgets = QUICK_BUDGETS if quick else BUDGETS
    for name, requests in workloads(quick).items():
        for device in DEVICES:
            for pool in ("dynamic", "fixed"):
                for budget in budgets:
                    rows.append(measure(name, requests, device, pool, budget))
    write_csv(out / "eviction.csv", rows)
    (out / "eviction.md").write_text(table(rows), encoding="utf-8")
    for name in dict.fromkeys(r["workload"] for r in rows):
        save_figure(figure([r for r in rows if r["workload"] == name], name), out / f"eviction_{name}")


def _ms(v) -> str:
    return "–" if v is None else f"{v * 1000:,.0f}" if v >= 1 else f"{v * 1000:.1f}"


def table(rows: list[dict]) -> str:
    """The rows as a markdown table (KV in GiB, latencies in ms)."""
    head = ("| workload | device | pool | eviction (max) | served | preemptions | peak KV GiB | mean KV GiB | "
            "mean allocated GiB | TTFT p50 / p99 ms | TPOT p50 / p99 ms | blocks dropped |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        served = f"{r['served']:,} / {r['requests']:,}"
        if r["stopped_at_step"] is not None:
            served += f" (step() throws at step {r['stopped_at_step']:,})"
        lines.append(f"| {r['workload']} | {r['device']} | {r['pool']} | {r['eviction']} | {served} | "
                     f"{r['preemptions']:,} | {r['peak_kv_bytes'] / GIB:.2f} | {r['mean_kv_bytes'] / GIB:.2f} | "
                     f"{r['mean_allocated_bytes'] / GIB:.2f} | {_ms(r['ttft_p50_s'])} / {_ms(r['ttft_p99_s'])} | "
                     f"{_ms(r['tpot_p50_s'])} / {_ms(r['tpot_p99_s'])} | {r['evicted_blocks']:,} |")
    return head + "\n".join(lines) + "\n"


def figure(rows: list[dict], workload: str) -> go.Figure:
    """Per device and pool, against the budget: KV in use (peak, mean), TTFT p99, TPOT p99, requests served."""
    seen = {r["eviction"] for r in rows}
    budgets = [b for b in BUDGETS if "snapkv" not in b and b in seen]
    fig = make_subplots(rows=2, cols=2, horizontal_spacing=0.1, vertical_spacing=0.16,
                        subplot_titles=("KV in blocks in use: peak (solid), mean (dotted), GiB", "TTFT p99, s",
                                        "TPOT p99, ms", "requests served, % (preemptions on hover)"))
    colours = {"xeon-8480": "#1f77b4", "h100-sxm": "#d62728"}
    for device in DEVICES:
        for pool, marker in (("dynamic", "circle"), ("fixed", "square")):
            mine = {r["eviction"]: r for r in rows if r["device"] == device and r["pool"] == pool}
            pts = [mine[b] for b in budgets]
            label = f"{device}, {pool} pool"
            style = {"color": colours[device], "dash": "solid" if pool == "dynamic" else "dash"}
            common = dict(x=budgets, legendgroup=label, marker={"symbol": marker, "size": 8})
            fig.add_scatter(y=[r["peak_kv_bytes"] / GIB for r in pts], name=label, line=style, row=1, col=1, **common)
            fig.add_scatter(y=[r["mean_kv_bytes"] / GIB for r in pts], name=label, showlegend=False,
                            line={**style, "dash": "dot"}, row=1, col=1, **common)
            fig.add_scatter(y=[r["ttft_p99_s"] for r in pts], name=label, showlegend=False, line=style, row=1, col=2,
                            **common)
            fig.add_scatter(y=[(r["tpot_p99_s"] or 0) * 1000 for r in pts], name=label, showlegend=False, line=style,
                            row=2, col=1, **common)
            fig.add_scatter(y=[100 * r["served"] / r["requests"] for r in pts], name=label, showlegend=False,
                            line=style, row=2, col=2, text=[f"{r['preemptions']:,} preemptions" for r in pts],
                            hovertemplate="%{x}: %{y:.1f} % served, %{text}<extra>" + label + "</extra>", **common)
    for col in (1, 2):
        fig.update_xaxes(title_text="cache eviction max (tokens)", row=2, col=col)
    fig.update_yaxes(type="log", row=1, col=2)
    n = rows[0]["requests"]
    fig.update_layout(template="plotly_white", width=1250, height=820, legend={"orientation": "h", "y": -0.12},
                      title=f"GenAI cache eviction, {workload} ({n:,} requests): {MODEL} shapes, continuous batching, "
                            "start 32, recent 128")
    return fig


if __name__ == "__main__":
    main_for(run, __doc__, "cache_eviction")

"""Beam search memory: gather copy (Hugging Face) vs beam tables (OpenVINO) vs copy-on-write blocks (paged).

    python -m experiments.beam_memory [--quick] [--out out/beam_memory]     (or: python -m experiments)

The same beam workload — one request, a prompt of P tokens, beam width W, D decode inferences — under
three ways of keeping W beams' KV cache, llama-3-8b shapes, f16 KV:

* **gather copy** — ``hf-dynamic`` (transformers ``DynamicCache``; ``policies/hf_dynamic.py``): every step with
  a ``beam_idx`` runs ``reorder_cache``, an ``index_select`` of every layer's K and V into new tensors at the
  stored length, then the forward's ``torch.cat`` reallocates again. Workload ``prefill:P, fork:W,
  reorder × (D − 2), select:0`` (``simkv run --ops``): a reorder on every step, as ``generate()``'s beam search
  does. Differences from transformers: its prompt is expanded to W rows before the prefill (here the prefill
  is one row and the fork gathers it, one extra copy of W·P tokens), and it does not gather a final select.
* **beam table** — ``openvino-cpu`` and ``openvino-gpu`` (``policies/openvino_cpu.py``,
  ``openvino_gpu.py``; DESIGN §2–3): the stateful model's ``Gather(beam_idx)`` is fused into the attention
  node, which keeps i32 beam tables ``[B, cap]`` instead of moving KV. Same ``--ops`` workload. CPU: a
  same-width reorder allocates nothing and copies no KV (beam table rows only); a change of width (fork,
  select) rebuilds every layer at ``cap = 2L`` with the new batch (measured, ``simkv validate``). GPU: a change
  of width disables in-place for that step (full copy; read in source, not run here).
* **copy-on-write blocks** — paged serving (``simkv.serving``: OpenVINO GenAI continuous batching, block 32,
  dynamic pool) with one request ``Request(prompt=P, max_new_tokens=D + 1, beam=W)`` — D + 1 generated tokens
  store P + D positions, as the sessions above. Modelled as W sequences sharing the prompt's blocks: the last,
  partly filled prompt block is copied on each beam's first write (CoW), every beam then owns its generated
  blocks. GenAI's real beam search also shares generated blocks by lineage (beams forking from beams) and
  copies a partly filled block at each fork; that is not observable through its API (DESIGN §4b) and not
  modelled, so the paged memory here is an upper bound and its copies a lower bound. ``peak in blocks`` is
  the blocks the request holds at its peak (what a shared pool must have free); the dynamic pool's own peak
  (``peak allocated, pool``) adds its growth headroom and the CPU plugin's transient scratch copies.

Peak allocated is the in-step peak (old and new buffers alive together included); bytes copied is every KV
byte moved (gathers, reallocation copies, CoW blocks; the paged pool's growth copies are in the CSV apart).

Writes ``beam.csv`` and the figure ``beam`` (HTML, PNG, SVG).
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simkv import build_scenario, simulate
from simkv.lab.output import main_for, save_figure, write_csv
from simkv.lab.palette import policy_color
from simkv.models import get_model
from simkv.precision import get_precision
from simkv.serving import Request, ServingSpec, serve

MODEL, PRECISION = "llama-3-8b", "f16"
#: (prompt, decode inferences): a chat answer and a long generation. Prompts not a multiple of 32, so the
#: paged model's shared last prompt block is copied on write.
SHAPES = ((1000, 256), (200, 1000))
WIDTHS = (1, 2, 4, 8)
QUICK_SHAPES, QUICK_WIDTHS = ((100, 24),), (1, 2, 4)
SESSION_POLICIES = {"hf-dynamic": "gather copy", "openvino-cpu": "beam table", "openvino-gpu": "beam table"}
MIB, GIB = 2**20, 2**30


def beam_ops(prompt: int, decode: int, width: int) -> str:
    """The ``simkv run --ops`` text of a beam search: fork, a reorder every step, select."""
    if width == 1:
        return f"prefill:{prompt},decode:{decode}"
    return ",".join([f"prefill:{prompt}", f"fork:{width}", *["reorder"] * (decode - 2), "select:0"])


def session_row(policy: str, prompt: int, decode: int, width: int) -> dict:
    res = simulate(build_scenario(model=MODEL, precision=PRECISION, policy=policy,
                                  ops=beam_ops(prompt, decode, width), device_memory="16GiB"))  # as measured
    m = res.metrics
    return {"mechanism": SESSION_POLICIES[policy], "policy": policy, "prompt": prompt, "decode": decode,
            "beam": width, "peak_allocated_bytes": m.peak_allocated_bytes, "pool_peak_allocated_bytes": None,
            "bytes_copied": m.bytes_copied, "pool_growth_bytes_copied": None, "cow_blocks": None,
            "realloc_count": m.realloc_count}


def paged_row(prompt: int, decode: int, width: int) -> dict:
    model = get_model(MODEL)
    res = serve(ServingSpec([Request(id=0, prompt=prompt, max_new_tokens=decode + 1, arrival_step=0, beam=width)],
                            model, get_precision(PRECISION), max_context=0))
    m, steps = res.metrics, res.steps
    cow = m["bytes_copied"] - m["pool_bytes_copied"]  # step copies = pool growth (ledger COPY rows) + CoW blocks
    return {"mechanism": "copy-on-write blocks", "policy": "paged", "prompt": prompt, "decode": decode, "beam": width,
            "peak_allocated_bytes": int(steps["blocks_used"].max()) * res.block_bytes,
            "pool_peak_allocated_bytes": m["peak_allocated_bytes"], "bytes_copied": cow,
            "pool_growth_bytes_copied": m["pool_bytes_copied"], "cow_blocks": cow // res.block_bytes,
            "realloc_count": m["realloc_count"]}


def run(out: Path, quick: bool) -> None:
    """Every shape × beam width × mechanism; the CSV and the figure."""
    rows = []
    for prompt, decode in QUICK_SHAPES if quick else SHAPES:
        for width in QUICK_WIDTHS if quick else WIDTHS:
            rows += [session_row(p, prompt, decode, width) for p in SESSION_POLICIES]
            rows.append(paged_row(prompt, decode, width))
    write_csv(out / "beam.csv", rows)
    save_figure(figure(rows), out / "beam")


def figure(rows: list[dict]) -> go.Figure:
    shapes = list(dict.fromkeys((r["prompt"], r["decode"]) for r in rows))
    fig = make_subplots(rows=2, cols=len(shapes), vertical_spacing=0.13, horizontal_spacing=0.08,
                        subplot_titles=[f"prompt {p:,} + {d:,} decode steps: peak memory" for p, d in shapes]
                        + ["KV bytes copied" for _ in shapes])
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    for col, shape in enumerate(shapes, start=1):
        for policy in policies:
            mine = [r for r in rows if (r["prompt"], r["decode"]) == shape and r["policy"] == policy]
            name = f"{policy} ({mine[0]['mechanism']})" + (", peak in blocks" if policy == "paged" else "")
            colour = policy_color(policy)
            x = [r["beam"] for r in mine]
            fig.add_scatter(x=x, y=[r["peak_allocated_bytes"] / MIB for r in mine], mode="lines+markers", name=name,
                            legendgroup=policy, showlegend=col == 1, line={"color": colour}, row=1, col=col,
                            hovertemplate="beam %{x}: %{y:,.0f} MiB<extra>" + policy + "</extra>")
            if policy == "paged":
                fig.add_scatter(x=x, y=[r["pool_peak_allocated_bytes"] / MIB for r in mine], mode="lines+markers",
                                name="paged, dynamic pool's peak allocated", legendgroup="paged-pool",
                                showlegend=col == 1, line={"color": colour, "dash": "dot"},
                                marker={"symbol": "circle-open"}, row=1, col=col,
                                hovertemplate="beam %{x}: %{y:,.0f} MiB<extra>paged pool</extra>")
            # a log axis cannot show 0: no copy is drawn at the axis floor (hover says 0)
            fig.add_scatter(x=x, y=[max(r["bytes_copied"], 2**20) / GIB for r in mine], mode="lines+markers",
                            name=name, legendgroup=policy, showlegend=False, line={"color": colour}, row=2, col=col,
                            customdata=[r["bytes_copied"] / GIB for r in mine],
                            hovertemplate="beam %{x}: %{customdata:,.3f} GiB<extra>" + policy + "</extra>")
        fig.update_xaxes(type="log", tickvals=sorted({r["beam"] for r in rows}), row=1, col=col)
        fig.update_xaxes(type="log", tickvals=sorted({r["beam"] for r in rows}), title_text="beam width", row=2,
                         col=col)
        fig.update_yaxes(title_text="MiB" if col == 1 else None, rangemode="tozero", row=1, col=col)
        fig.update_yaxes(title_text="GiB (log; floor = no copy)" if col == 1 else None, type="log", row=2, col=col)
    fig.update_layout(template="plotly_white", width=1300, height=820, legend={"orientation": "h", "y": -0.12},
                      title=f"Beam search memory, one request: {MODEL} shapes, {PRECISION} KV")
    return fig


if __name__ == "__main__":
    main_for(run, __doc__, "beam_memory")

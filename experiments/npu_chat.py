"""NPU memory and TTFT of a long chat, with and without NPUW's prefix caching.

    python -m experiments.npu_chat [--quick] [--out out/npu_chat]     (or: python -m experiments)

One chat on ``openvino-npu`` (GenAI's stateful pipeline over NPUW's LLMCompiledModel, read in source:
policies/openvino_npu.py), llama-3-8b shapes, f16 KV, int4 weights, priced on the ``core-ultra-155h-npu``
device file (simkv/data/devices/: its efficiencies are assumed, no NPU here — the ratios between the configurations
matter, not the absolute seconds). MAX_PROMPT_LEN 8192, MIN_RESPONSE_LEN 1024, chunk 1024, NPUW's defaults
otherwise. The chat: a 1,500-token first prompt and a 200-token answer, then turns of 300 user tokens and
200-token answers while the history fits MAX_PROMPT_LEN. On the NPU GenAI prefills the *whole* history every
turn; the configurations:

* **no prefix cache** — every turn computes the whole history, chunk by chunk (each chunk the same fixed
  shape: its cost does not shrink with the tokens it holds);
* **prefix cache** (block 256, 128 blocks) — a turn restores the blocks the earlier prefills stored (whole
  chunks only: the restore is cut down to a multiple of 1,024) and computes the rest;
* **prefix cache, 16 blocks** — the cache fills (16 × 256 = 4,096 tokens) and evicts its least recently used
  leaves; later turns restore less;
* **prefix cache, chunk 2,048** — twice the chunk: fewer, larger fixed-shape calls, and restores cut down to
  multiples of 2,048 tokens.

A turn's re-tokenized history that differs from the last one in its tail (``--turn-divergence``) changes
nothing here: the NPU pipeline never trims, and the differing tokens are always the end of the last answer,
which no stored block holds (blocks are stored only for whole chunks that a prefill computed).

Memory is what the pipeline holds (the generate model's past KV of 9,215 tokens, the present outputs, the
prefix-cache blocks in host memory; the staging copy at a turn's first generate step is the peak's excess).
TTFT of a turn is its prefill step (the chunks it runs, the blocks it restores).

Writes ``npu_chat.csv`` (one row per configuration and turn) and the figure ``npu_chat`` (HTML, PNG, SVG).
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simkv import build_scenario, simulate
from simkv.cost import get_device
from simkv.latency import session_times
from simkv.lab.output import main_for, save_figure, write_csv
from simkv.ledger import PHASE_CODE, TENSOR_CODE
from simkv.shipped import DEVICE_DIR

DEVICE = DEVICE_DIR / "core-ultra-155h-npu.json"
MODEL, WEIGHTS = "llama-3-8b", "int4"
BASE = {"max_prompt_len": 8192, "min_response_len": 1024, "prefill_chunk_size": 1024}
CONFIGS = {
    "no prefix cache": ({}, 0),
    "prefix cache": ({"prefix_caching": True}, 0),
    "prefix cache, 16 blocks": ({"prefix_caching": True, "prefix_max_blocks": 16}, 0),
    "prefix cache, chunk 2,048": ({"prefix_caching": True, "prefill_chunk_size": 2048}, 0),
}
COLORS = {"no prefix cache": "#7f7f7f", "prefix cache": "#2ca02c", "prefix cache, 16 blocks": "#ff7f0e",
          "prefix cache, chunk 2,048": "#1f77b4"}
PROMPT, ANSWER, TURN = 1500, 200, 300
MIB = 2**20


def turns_that_fit(limit: int) -> int:
    """Further turns while the history GenAI prefills, ``PROMPT + ANSWER + (t - 1)(TURN + ANSWER) + TURN`` at
    turn t, stays within MAX_PROMPT_LEN (GenAI refuses a longer one)."""
    return (limit - PROMPT - ANSWER - TURN) // (TURN + ANSWER) + 1


def rows_of(name: str, options: dict, divergence: int, quick: bool) -> list[dict]:
    limit = 4096 if quick else BASE["max_prompt_len"]
    policy_options = {**BASE, "max_prompt_len": limit, **options}
    turns = turns_that_fit(limit)
    scenario = build_scenario(model=MODEL, policy="openvino-npu", policy_options=policy_options, prompt=PROMPT,
                              decode=ANSWER, turns=turns, turn_tokens=TURN, turn_divergence=divergence)
    result = simulate(scenario)
    times = session_times(result, get_device(str(DEVICE)), weights_precision=WEIGHTS)
    plan = scenario.policy.plan(scenario.workload)
    steps, rows = result.steps, result.ledger.rows
    blocks = (rows["tensor"] == TENSOR_CODE["k_block"]) | (rows["tensor"] == TENSOR_CODE["v_block"])
    out = []
    prefills = [i for i, p in enumerate(steps["phase"]) if p in (PHASE_CODE["prefill"], PHASE_CODE["turn"])]
    for turn, i in enumerate(prefills):
        held = rows[blocks & (rows["step"] <= i)]
        block_bytes = int(held["bytes"][held["op"] == 0].sum() - held["bytes"][held["op"] == 2].sum())
        first_decode = i + 1 if i + 1 < len(steps) else i
        out.append({
            "config": name, "turn": turn, "history_tokens": plan[i].history,
            "restored_tokens": len(plan[i].restored) * scenario.policy.block, "prefill_calls": plan[i].calls,
            "ttft_s": float(times.step_s[i]), "held_bytes": int(steps["steady"][i]), "prefix_block_bytes": block_bytes,
            "peak_bytes": int(max(steps["peak"][i], steps["peak"][first_decode])),
        })
    return out


def run(out: Path, quick: bool) -> None:
    """Every configuration's chat; the CSV and the figure."""
    rows = [r for name, (options, divergence) in CONFIGS.items() for r in rows_of(name, options, divergence, quick)]
    write_csv(out / "npu_chat.csv", rows)
    save_figure(figure(rows), out / "npu_chat")


def figure(rows: list[dict]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.09,
                        subplot_titles=["TTFT of each turn (the whole history prefilled)",
                                        "memory held after the turn's prefill (peak dotted)"])
    for name in CONFIGS:
        mine = [r for r in rows if r["config"] == name]
        x = [r["history_tokens"] for r in mine]
        fig.add_scatter(x=x, y=[r["ttft_s"] for r in mine], mode="lines+markers", name=name, legendgroup=name,
                        line={"color": COLORS[name]}, row=1, col=1,
                        customdata=[[r["restored_tokens"], r["prefill_calls"]] for r in mine],
                        hovertemplate="history %{x:,}: %{y:.2f} s, %{customdata[0]:,} restored, "
                        "%{customdata[1]} chunks<extra>" + name + "</extra>")
        fig.add_scatter(x=x, y=[r["held_bytes"] / MIB for r in mine], mode="lines+markers", name=name,
                        legendgroup=name, showlegend=False, line={"color": COLORS[name]}, row=1, col=2,
                        hovertemplate="history %{x:,}: %{y:,.0f} MiB<extra>" + name + "</extra>")
        fig.add_scatter(x=x, y=[r["peak_bytes"] / MIB for r in mine], mode="lines", name=name, legendgroup=name,
                        showlegend=False, line={"color": COLORS[name], "dash": "dot"}, row=1, col=2,
                        hovertemplate="history %{x:,}: peak %{y:,.0f} MiB<extra>" + name + "</extra>")
    fig.update_xaxes(title_text="chat history (tokens)")
    fig.update_yaxes(title_text="s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="MiB", rangemode="tozero", row=1, col=2)
    fig.update_layout(template="plotly_white", width=1300, height=560, legend={"orientation": "h", "y": -0.18},
                      title=f"A long chat on the NPU pipeline: {MODEL} shapes, f16 KV, {WEIGHTS} weights, "
                      "block 256")
    return fig


if __name__ == "__main__":
    main_for(run, __doc__, "npu_chat")

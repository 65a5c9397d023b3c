"""Today's models: KV bytes per request per runtime at 4k / 32k / 128k, and the Azure conversation hour on one H100.

    python -m experiments.layer_kinds [--quick] [--out out/layer_kinds]     (or: python -m experiments)

Every preset (``simkv models``), bf16 KV, one request of 4,096, 32,768 and 131,072 tokens, as each runtime
keeps it (docs/DESIGN.md §3c, §4c, §7; the rules are the policies' and the paged managers'):

* ``transformers`` — ``hf-dynamic`` (transformers 5.23 ``DynamicCache``), a single session ``prefill:n-1,decode:1``:
  a sliding or chunked layer holds its window W (W−1 kept + the new token), MLA its latent, a linear layer
  its conv state (bf16) and recurrent state (f32); the bytes the cache holds after the step (the step
  table's ``steady``: exact-size tensors);
* ``openvino-stateful`` — ``openvino-gpu`` the same way: every layer keeps every token (a window only masks),
  MLA decompressed per head, states in the inference precision; the tokens' bytes (``used``: without the
  plugin's preallocated headroom, which is the allocator's, not the layer kind's);
* ``paged-genai`` — GenAI continuous batching (block 32): one block spans every attention layer and every
  block is kept, MLA decompressed, one state block per sequence (``simkv.serving.kv.groups``);
* ``paged-vllm`` — vLLM's hybrid manager (block 16): per-group tables, blocks that left a window or chunk
  freed, MLA as its latent, a Mamba / linear state as one page per request.

A context beyond the model's own (``ModelSpec.context``, from its config) is still computed (the formulas do
not care) and flagged in ``beyond_context``.

Then the Azure LLM inference trace 2023, conversation hour (19,366 requests; ``--quick``: the first 100),
served by continuous batching on the ``h100-sxm`` preset by gemma-3-27b, gpt-oss-20b, qwen3-30b-a3b,
qwen3-next-80b-a3b and llama-3.1-8b under each paged manager, with bf16 KV and 1-byte weights (int8 / FP8),
except qwen3-next-80b: at 1 byte its 80 B parameters (74 GiB) leave ~5 GiB of the device for KV, and the first
1,000 requests alone queue for minutes (TTFT p99 327 s, 2,199 preemptions, measured), so it gets 4-bit weights
(37 GiB, as AWQ / GPTQ checkpoints serve it on one GPU). Reported: live requests per GiB of KV in use (time-weighted
over the run's simulated steps), peak allocated (with the CPU plugin's untouched scratch copies of a growing pool)
and the pools' own peak, TTFT and TPOT p50 / p99, preemptions, and the step where the device ran out of memory, if it
did (GenAI reserves room for every queued prompt without a memory check: the run ends there, docs/guide/serving.md).

Writes ``kv_per_request.csv``, ``azure_hour.csv``, ``wall_times.csv`` (CPU seconds: nondeterministic) and the
figure ``kv_per_request`` (HTML, PNG, SVG).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simkv.hfconfig import get_model, preset_names
from simkv.lab.output import main_for, save_figure, write_csv
from simkv.lab.traces import AZURE_CONV
from simkv.precision import get_precision
from simkv.scenario import build_scenario, resolve_weights_memory, simulate
from simkv.serving import SchedulerConfig, ServingSpec, load_trace, serve
from simkv.serving.kv.groups import paged_kv

NONDETERMINISTIC = ("wall_times.csv",)
CONTEXTS = (4096, 32768, 131072)
PRECISION = "bf16"
#: Single-session runtimes: (policy, its options, step-table column read after the last step). The GPU
#: plugin's device limits (largest single allocation, 90 % headroom line) are the device's, not the layer kind's.
SESSIONS = {"transformers": ("hf-dynamic", None, "steady"),
            "openvino-stateful": ("openvino-gpu", {"max_alloc_bytes": 0, "headroom_limit": 0.0}, "used")}
#: Paged managers and their block sizes (GenAI on CPU: 32; vLLM's default: 16).
PAGED = {"paged-genai": ("genai", 32), "paged-vllm": ("vllm", 16)}
RUNTIMES = (*SESSIONS, *PAGED)
SERVED = ("gemma-3-27b", "gpt-oss-20b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "llama-3.1-8b")
DEVICE, WEIGHTS = "h100-sxm", "int8"
#: Per-model weight precision where 1 byte per parameter leaves the device (almost) no KV room.
WEIGHTS_OF = {"qwen3-next-80b-a3b": "int4"}
QUICK_REQUESTS = 100
GIB = 2**30
COLORS = {"transformers": "#ff7f0e", "openvino-stateful": "#1f77b4", "paged-genai": "#2ca02c", "paged-vllm": "#9467bd"}


def request_bytes(model_name: str, runtime: str, context: int) -> int:
    """Bytes one request of ``context`` tokens holds under a runtime."""
    if runtime in PAGED:
        manager, block = PAGED[runtime]
        return paged_kv(get_model(model_name), get_precision(PRECISION), block, manager).request_bytes(context)
    policy, options, column = SESSIONS[runtime]
    scenario = build_scenario(model=model_name, policy=policy, policy_options=options, precision=PRECISION,
                              ops=f"prefill:{context - 1},decode:1", device_memory="64TiB", weights_memory=0)
    result = simulate(scenario)
    if result.oom is not None:
        raise RuntimeError(f"{model_name} {runtime} {context}: {result.oom}")
    return int(result.steps[column][-1])


def per_request_rows() -> list[dict]:
    rows = []
    for name in preset_names():
        model = get_model(name)
        for context in CONTEXTS:
            row = {"model": name, "context": context, "beyond_context": bool(model.context and context > model.context)}
            for runtime in RUNTIMES:
                row[f"{runtime}_bytes"] = request_bytes(name, runtime, context)
            rows.append(row)
    return rows


def serve_hour(name: str, manager: str, requests: list) -> tuple[dict, float]:
    model = get_model(name)
    spec = ServingSpec(requests, model, get_precision(PRECISION), device=DEVICE,
                       weights_bytes=resolve_weights_memory(model, None, WEIGHTS_OF.get(name, WEIGHTS)),
                       paged=SchedulerConfig(kv_manager=manager))
    t0 = time.process_time()
    result = serve(spec)
    cpu = time.process_time() - t0
    m, steps = result.metrics, result.steps
    weight = steps["step_s"]
    in_use = float((weight * steps["used_bytes"]).sum()) / GIB
    live = float((weight * steps["requests"]).sum())
    row = {"model": name, "manager": manager, "requests": m["requests_total"], "finished": m["requests_finished"],
           "unfinished": m["requests_unfinished"], "ignored": m["requests_ignored"], "preemptions": m["preemptions"],
           "weights_gib": round(spec.weights_bytes / GIB, 3),
           "requests_per_kv_gib": round(live / in_use, 6) if in_use else None,
           "mean_in_use_gib": round(m["mean_in_use_bytes"] / GIB, 6),
           "peak_allocated_gib": round(m["peak_allocated_bytes"] / GIB, 6),
           "peak_pool_gib": round(m["peak_pool_bytes"] / GIB, 6),
           "oom_step": m["oom_step"],
           "ttft_p50_s": m["ttft_p50_s"], "ttft_p99_s": m["ttft_p99_s"],
           "tpot_p50_s": m["tpot_p50_s"], "tpot_p99_s": m["tpot_p99_s"], "sim_time_s": m["sim_time_s"]}
    return row, cpu


def run(out: Path, quick: bool) -> None:
    """The per-request table and figure, then the served hour per model and manager."""
    t0 = time.process_time()
    rows = per_request_rows()
    times = [{"part": "kv_per_request", "cpu_s": round(time.process_time() - t0, 3)}]
    write_csv(out / "kv_per_request.csv", rows)
    save_figure(figure(rows), out / "kv_per_request")
    requests = load_trace(AZURE_CONV, limit=QUICK_REQUESTS if quick else None)
    served = []
    for name in SERVED:
        for manager, _ in PAGED.values():
            row, cpu = serve_hour(name, manager, requests)
            served.append(row)
            times.append({"part": f"{name} {manager}", "cpu_s": round(cpu, 3)})
    write_csv(out / "azure_hour.csv", served)
    write_csv(out / "wall_times.csv", times)


def figure(rows: list[dict]) -> go.Figure:
    """GiB per request (log scale) per preset, one panel per context, one bar per runtime."""
    fig = make_subplots(rows=len(CONTEXTS), cols=1, shared_xaxes=True, vertical_spacing=0.05,
                        subplot_titles=[f"one request of {c:,} tokens" for c in CONTEXTS])
    for i, context in enumerate(CONTEXTS, start=1):
        mine = [r for r in rows if r["context"] == context]
        x = [r["model"] for r in mine]
        beyond = ["/" if r["beyond_context"] else "" for r in mine]  # hatched: beyond the model's context
        for runtime in RUNTIMES:
            y = np.array([r[f"{runtime}_bytes"] for r in mine]) / GIB
            fig.add_bar(x=x, y=y, name=runtime, legendgroup=runtime, showlegend=i == 1, row=i, col=1,
                        marker={"color": COLORS[runtime], "pattern": {"shape": beyond}},
                        hovertemplate="%{x}: %{y:,.3f} GiB<extra>" + runtime + "</extra>")
        fig.update_yaxes(type="log", title_text="GiB", row=i, col=1)
    fig.update_layout(template="plotly_white", barmode="group", width=1400, height=1100,
                      legend={"orientation": "h", "y": 1.06},
                      title="KV memory of one request by runtime, bf16 KV (hatched: beyond the model's own context)")
    return fig


if __name__ == "__main__":
    main_for(run, __doc__, "layer_kinds")

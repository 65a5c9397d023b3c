"""``simkv validate --serving``: OpenVINO GenAI served in real time on this CPU vs simkv's serving simulation.

Two stages, both on a random-weight model of a real head shape (default: hidden 1,024, 6 attention-only
layers, 16 query / 8 KV heads x 128; built locally by :mod:`.model`, no download), the real runs in fresh
processes pinned to one core (:mod:`.live`):

1. **Step times of fixed batches** (where an error comes from): decode at batch 1..32, prefill chunks of
   32..512 tokens and mixed steps (4 or 16 decodes beside a 64- or 128-token prompt chunk: the steps of a
   dynamic split-fuse run), median of ``repeats`` timed steps after warm-up, against
   :func:`simkv.cost.forward_cost` of the same step on the device preset (``host``: ``simkv calibrate``), a
   mixed step as one :func:`simkv.cost.step_cost` call over both parts' work (:func:`mixed_step_s`).
   Beside them, the two slopes the pipeline's own steps give — decode time per extra sequence and prefill
   time per extra token (least squares over the fixed batches) — and the preset's slopes for the same
   steps: the numbers a calibration of the paged pipeline would write, each from a measurement.
2. **End to end**: ``requests`` requests (prompts 32..256 tokens, 16..64 generated, Poisson arrivals from
   ``seed``) at each offered load ``busy`` (the arrival rate times the mean request's solo service time on
   the preset: 0.3 and 0.6, and an overloaded one for information), served live ``repeats`` times, each
   repeat in a fresh process, loads interleaved; the same requests simulated on the preset
   (:func:`simkv.serving.serve`: GenAI's continuous batching, the real run's scheduler config, the compiled
   model's block bytes). Compared per request (TTFT, TPOT, e2e): p50 and p90 of the real runs (median over
   repeats) and of the simulation, the paired ratios simulated / real per request (their median, p10 and
   p90), and the real runs' own spread ((max − min) / median over repeats of each percentile). An error
   counts only beyond the spread: a percentile is within when ``|error| <= max(bound, spread)`` (bounds:
   10 % on p50, 20 % on p90; step times 10 %). The overloaded load is reported, never judged.

The verdict (exit 0) is every fixed batch within 10 % and every judged percentile within its bound.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from simkv.errors import ConfigError, SimkvError

__all__ = ["LiveConfig", "workload", "predict_steps", "simulate_requests", "compare_requests", "validate_serving",
           "cli_main", "summary_lines"]

#: The issue's probe shape (hidden 1,024, 16/8 heads x 128) at 6 layers: steps of ~3-15 ms on one core.
DEFAULT_SHAPE = {"layers": 6, "heads": 16, "kv_heads": 8, "head_dim": 128, "hidden": 1024, "vocab": 512}
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)
PREFILL_CHUNKS = (32, 64, 128, 256, 512)
#: (decodes, prompt chunk) of the mixed steps timed: a chunk beside running decodes, as most steps of the end-to-end
#: stage are (prompts 32..256 under a 256-token budget).
MIXED_BATCHES = ((4, 64), (16, 64), (4, 128), (16, 128))
#: Bounds on a validation: requests per load, loads, repeats, simulated wall time of one live run.
MAX_REQUESTS, MAX_LOADS, MAX_REPEATS, MAX_RUN_S = 500, 6, 10, 600.0
#: |error| bounds (fractions): a fixed batch's step time, p50 and p90 end to end.
STEP_BOUND, P50_BOUND, P90_BOUND = 0.10, 0.10, 0.20
#: Loads at or above this offered busy fraction are shown for information, not judged.
OVERLOADED = 1.0
METRICS = ("ttft_s", "tpot_s", "e2e_s")
PROMPT_RANGE, NEW_RANGE = (32, 256), (16, 64)
DECODE_CONTEXT = 64


@dataclass(frozen=True)
class LiveConfig:
    """What ``simkv validate --serving`` runs (the command's flags)."""

    device: str = "host"
    layers: int = DEFAULT_SHAPE["layers"]
    heads: int = DEFAULT_SHAPE["heads"]
    kv_heads: int = DEFAULT_SHAPE["kv_heads"]
    head_dim: int = DEFAULT_SHAPE["head_dim"]
    hidden: int = DEFAULT_SHAPE["hidden"]
    vocab: int = DEFAULT_SHAPE["vocab"]
    stage: str = "both"  # steps | e2e | both
    requests: int = 80
    busy: tuple[float, ...] = (0.3, 0.6, 1.2)
    repeats: int = 3
    decode_batches: tuple[int, ...] = DECODE_BATCHES
    prefill_chunks: tuple[int, ...] = PREFILL_CHUNKS
    mixed_batches: tuple[tuple[int, int], ...] = MIXED_BATCHES
    step_warmup: int = 3
    step_repeats: int = 9
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 256
    cpu: int | None = 0
    seed: int = 0

    def check(self) -> None:
        if self.stage not in ("steps", "e2e", "both"):
            raise ConfigError("--stage must be steps, e2e or both")
        if not 1 <= self.requests <= MAX_REQUESTS:
            raise ConfigError(f"--requests must be in 1..{MAX_REQUESTS}")
        if not 1 <= len(self.busy) <= MAX_LOADS or not all(0 < b <= 4 for b in self.busy):
            raise ConfigError(f"--busy takes 1..{MAX_LOADS} loads in (0, 4]")
        if not 1 <= self.repeats <= MAX_REPEATS:
            raise ConfigError(f"--repeats must be in 1..{MAX_REPEATS}")
        if not all(1 <= b <= 256 for b in self.decode_batches) or not all(1 <= c <= 4096 for c in self.prefill_chunks):
            raise ConfigError("decode batches must be in 1..256 and prefill chunks in 1..4096")
        if not all(1 <= b <= 256 and 2 <= c <= 4096 for b, c in self.mixed_batches):
            raise ConfigError("mixed batches are DECODESxCHUNK with decodes in 1..256 and chunks in 2..4096")
        if not (0 <= self.step_warmup <= 50 and 1 <= self.step_repeats <= 100):
            raise ConfigError("--step-repeats must be in 1..100")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ConfigError("--max-num-batched-tokens and --max-num-seqs must be >= 1")

    def spec(self):
        from .model import GenaiModelSpec

        try:
            return GenaiModelSpec(layers=self.layers, heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim,
                                  hidden=self.hidden, vocab=self.vocab)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def scheduler(self):
        from simkv.serving.sched.config import SchedulerConfig

        return SchedulerConfig(cache_size=1, max_num_batched_tokens=self.max_num_batched_tokens,
                               max_num_seqs=self.max_num_seqs)


def cost_model(spec):
    """The toy decoder as a cost-model shape (attention-only: Q, K, V, O; embedding and head)."""
    from simkv.models import custom_model

    from ..openvino.toy import toy_model_spec

    base = custom_model(layers=spec.layers, heads=spec.heads, kv_heads=spec.kv_heads, head_dim=spec.head_dim)
    return toy_model_spec(base, spec.hidden_size, spec.vocab)


def workload(n: int, rate: float, seed: int) -> list:
    """``n`` requests (prompt and output lengths uniform in :data:`PROMPT_RANGE` / :data:`NEW_RANGE`, Poisson
    arrivals at ``rate`` per second, the first at 0), the same for every load of a seed but the arrival times."""
    from simkv.serving.requests import Request

    rng = np.random.default_rng(seed)
    prompts = rng.integers(PROMPT_RANGE[0], PROMPT_RANGE[1] + 1, n)
    news = rng.integers(NEW_RANGE[0], NEW_RANGE[1] + 1, n)
    gaps = rng.exponential(1.0, n)
    gaps[0] = 0.0
    arrivals = np.cumsum(gaps) / rate
    return [Request(i, int(prompts[i]), int(news[i]), arrival_s=round(float(arrivals[i]), 6)) for i in range(n)]


def _step_s(model, device, kv, weights_precision: str, *, batch, context, new) -> np.ndarray:
    from simkv.cost import forward_cost

    return np.asarray(forward_cost(model, device, kv, batch=batch, context=context, new=new,
                                   weights_precision=weights_precision, precision=weights_precision).seconds)


def mixed_step_s(model, device, kv, weights_precision: str, *, batch, context, chunk) -> np.ndarray:
    """One step of ``batch`` one-token queries of ``context`` cached tokens beside one ``chunk``-token prompt
    query of none, which samples its first token (arrays broadcast): one :func:`simkv.cost.forward_cost` of both
    groups, their attention work added, ``batch + 1`` logit rows — as the serving engine prices such a step."""
    from simkv.cost import forward_cost

    return np.asarray(forward_cost(model, device, kv, batch=batch, context=context, new=1, beside=((1, 0, chunk),),
                                   weights_precision=weights_precision, precision=weights_precision).seconds)


def solo_service_s(requests, model, device, kv, weights_precision: str, chunk: int) -> float:
    """Mean time one request takes alone on the preset: its prompt in chunks of ``chunk``, then its decode steps."""
    total = 0.0
    for r in requests:
        starts = np.arange(0, r.prompt, chunk)
        total += float(np.sum(_step_s(model, device, kv, weights_precision, batch=1, context=starts,
                                      new=np.minimum(chunk, r.prompt - starts))))
        ctx = r.prompt + np.arange(r.max_new_tokens - 1)
        total += float(np.sum(_step_s(model, device, kv, weights_precision, batch=1, context=ctx, new=1)))
    return total / len(requests)


def _fit(x, y) -> float:
    """Least-squares slope of y over x (0 with fewer than two distinct x)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    return float(np.polyfit(x, y, 1)[0]) if len(set(x.tolist())) > 1 else 0.0


def predict_steps(measured: dict, model, device, kv, weights_precision: str) -> dict:
    """Each fixed batch's measured median beside the preset's step time; the slopes of both."""
    rows = []

    def row(kind: str, size, times, pred) -> None:
        rows.append({"kind": kind, "size": size, "measured_ms": 1e3 * float(np.median(times)),
                     "predicted_ms": 1e3 * float(np.median(pred)),
                     "spread_pct": 100 * float(np.ptp(times) / np.median(times))})

    def contexts(d) -> np.ndarray:
        # The j-th timed step follows the prefill and the warm-up steps: P + warmup + j cached tokens.
        return d["context"] + d["first_step"] + np.arange(len(d["times_s"]))

    for d in measured["decode"]:
        row("decode", d["batch"], d["times_s"],
            _step_s(model, device, kv, weights_precision, batch=d["batch"], context=contexts(d), new=1))
    for p in measured["prefill"]:
        row("prefill", p["chunk"], p["times_s"],
            _step_s(model, device, kv, weights_precision, batch=1, context=0, new=p["chunk"]))
    for m in measured.get("mixed", []):
        row("mixed", f"{m['batch']}x{m['chunk']}", m["times_s"],
            mixed_step_s(model, device, kv, weights_precision, batch=m["batch"], context=contexts(m), chunk=m["chunk"]))
    for r in rows:
        r["error_pct"] = 100 * (r["predicted_ms"] / r["measured_ms"] - 1)
        r["within"] = abs(r["error_pct"]) <= 100 * STEP_BOUND
    slopes = {}
    for kind, unit in (("decode", "per_sequence_ms"), ("prefill", "per_token_ms")):
        sel = [r for r in rows if r["kind"] == kind]
        if len(sel) > 1:
            sizes = [r["size"] for r in sel]
            slopes[kind] = {f"measured_{unit}": _fit(sizes, [r["measured_ms"] for r in sel]),
                            f"predicted_{unit}": _fit(sizes, [r["predicted_ms"] for r in sel])}
    return {"rows": rows, "slopes": slopes}


def simulate_requests(requests, opts, model, kv, device: str, weights_bytes: int, layout) -> dict:
    """The same requests through simkv's serving engine on ``device``: per request TTFT / TPOT / e2e."""
    from simkv.serving.run import ServingSpec, serve

    res = serve(ServingSpec(list(requests), model, kv, "continuous", "paged", opts, device=device,
                            device_memory=1 << 50, weights_bytes=weights_bytes, block_bytes=layout.block_bytes,
                            tensor_block_bytes=layout.tensor_block_bytes[:2]))
    t = res.request_table
    return {m: t[m].astype(float).tolist() for m in METRICS} | {"makespan_s": float(np.nanmax(
        t["arrival_s"].astype(float) + t["e2e_s"].astype(float)))}


def real_metrics(requests, live: dict) -> dict:
    """Per request TTFT / TPOT / e2e of a live run (the definitions of simkv's request table)."""
    out: dict[str, list] = {m: [] for m in METRICS}
    by_id = {x["id"]: x for x in live["requests"]}
    for r in requests:
        x = by_id[r.id]
        first, last, n = x["first_s"], x["last_s"], x["generated"]
        ok = first is not None and n == r.max_new_tokens
        out["ttft_s"].append(first - r.arrival_s if first is not None else float("nan"))
        out["tpot_s"].append((last - first) / (n - 1) if ok and n > 1 else float("nan"))
        out["e2e_s"].append(last - r.arrival_s if ok else float("nan"))
    return out


def _pct(v, q) -> float:
    v = np.asarray(v, float)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, q)) if len(v) else float("nan")


def compare_requests(real_runs: list[dict], sim: dict, judged: bool) -> dict:
    """p50 / p90 of the real runs (median over repeats, with their spread) vs the simulation; paired ratios."""
    out = {}
    for m in METRICS:
        entry: dict = {}
        real = np.asarray([r[m] for r in real_runs], float)  # repeats x requests
        per_request = np.nanmedian(real, axis=0) if len(real) else np.array([])
        for q, bound in ((50, P50_BOUND), (90, P90_BOUND)):
            runs = np.array([_pct(r, q) for r in real])
            median = float(np.median(runs))
            spread = float(np.ptp(runs) / median) if median > 0 else float("nan")
            s = _pct(sim[m], q)
            err = s / median - 1 if median > 0 else float("nan")
            entry[f"p{q}"] = {"real_s": median, "real_runs_s": runs.tolist(), "simulated_s": s,
                              "error_pct": 100 * err, "spread_pct": 100 * spread,
                              "within": (bool(abs(err) <= max(bound, spread)) if judged else None)}
        ratio = np.asarray(sim[m], float) / per_request
        ratio = ratio[np.isfinite(ratio)]
        entry["paired_ratio"] = ({"median": float(np.median(ratio)), "p10": float(np.percentile(ratio, 10)),
                                  "p90": float(np.percentile(ratio, 90)), "requests": int(len(ratio))}
                                 if len(ratio) else None)
        out[m] = entry
    return out


def _versions() -> dict:
    from .runner import paged_versions

    return paged_versions()


def validate_serving(cfg: LiveConfig, progress: bool = False) -> dict:
    """Both stages (module docstring); the ``--json`` dict."""
    from dataclasses import replace

    from simkv.cost import get_device
    from simkv.models import weights_bytes as model_weights_bytes
    from simkv.precision import get_precision

    from ..openvino.ovmodel import inference_precision
    from .live import run_child, MAX_WALL_S
    from .model import model_dir
    from .real import PIPELINE_PROPERTIES, kv_layout
    from .runner import prompt_token_ids

    cfg.check()
    spec = cfg.spec()
    # a missing host preset is a one-line error before anything runs; the pipeline runs paged attention
    device = get_device(cfg.device).paged_kernel()
    t0 = time.perf_counter()
    path = model_dir(spec)
    layout = kv_layout(path, PIPELINE_PROPERTIES)
    kv = get_precision(layout.kv_precision)
    wp = inference_precision()
    model = cost_model(spec)
    weights_bytes = int(model_weights_bytes(model, wp))
    data: dict = {"device": device.name, "weights_precision": wp, "kv_precision": layout.kv_precision,
                  "block_bytes": layout.block_bytes,
                  "model": {k: v for k, v in asdict(spec).items() if k != "with_tokenizer"},
                  "params": spec.params, "cpu": cfg.cpu, "seed": cfg.seed}

    def say(msg: str) -> None:
        if progress:
            print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    if cfg.stage in ("steps", "both"):
        say("stage 1: fixed batches")
        measured = run_child({"kind": "steps", "model_path": str(path), "decode_batches": list(cfg.decode_batches),
                              "prefill_chunks": list(cfg.prefill_chunks), "context": DECODE_CONTEXT,
                              "mixed": [list(m) for m in cfg.mixed_batches],
                              "warmup": cfg.step_warmup, "repeats": cfg.step_repeats, "seed": cfg.seed},
                             cfg.cpu, MAX_WALL_S)
        data["steps"] = predict_steps(measured, model, device, kv, wp)
    if cfg.stage in ("e2e", "both"):
        opts = cfg.scheduler()
        base = workload(cfg.requests, 1.0, cfg.seed)
        solo = solo_service_s(base, model, device, kv, wp, cfg.max_num_batched_tokens)
        loads = []
        for busy in cfg.busy:
            rate = busy / solo
            reqs = [replace(r, arrival_s=round(r.arrival_s / rate, 6)) for r in base]
            sim = simulate_requests(reqs, opts, model, kv, cfg.device, weights_bytes, layout)
            if sim["makespan_s"] > MAX_RUN_S:
                raise ConfigError(f"at busy {busy} the run would take ~{sim['makespan_s']:.0f} s of wall time "
                                  f"(simulated); at most {MAX_RUN_S:.0f} s: fewer --requests or a lower --busy")
            loads.append({"busy": busy, "rate_per_s": rate, "requests": reqs, "sim": sim, "real": [], "live": []})
        ids = prompt_token_ids(base, cfg.seed)
        for rep in range(cfg.repeats):  # loads interleaved, each repeat a fresh process
            for load in loads:
                say(f"stage 2: busy {load['busy']}, repeat {rep + 1}/{cfg.repeats}")
                task = {"kind": "serve", "model_path": str(path), "opts": opts.genai(),
                        "requests": [{"id": r.id, "arrival_s": r.arrival_s, "max_new_tokens": r.max_new_tokens}
                                     for r in load["requests"]], "token_ids": [list(t) for t in ids]}
                live = run_child(task, cfg.cpu, MAX_WALL_S + 60)
                load["live"].append({k: live[k] for k in ("busy_s", "wall_s", "steps")})
                load["real"].append(real_metrics(load["requests"], live))
        data["serving"] = {
            "requests": cfg.requests, "repeats": cfg.repeats, "solo_service_s": solo, "scheduler": opts.genai(),
            "loads": [{"busy_offered": ld["busy"], "rate_per_s": ld["rate_per_s"], "judged": ld["busy"] < OVERLOADED,
                       "busy_measured": [x["busy_s"] / x["wall_s"] for x in ld["live"]],
                       "sim_makespan_s": ld["sim"]["makespan_s"],
                       "metrics": compare_requests(ld["real"], ld["sim"], ld["busy"] < OVERLOADED)}
                      for ld in loads]}
    data["versions"] = _versions()
    data["elapsed_s"] = time.perf_counter() - t0
    return data


def ok(data: dict) -> bool:
    steps = all(r["within"] for r in data.get("steps", {}).get("rows", []))
    e2e = all(q["within"] is not False for ld in data.get("serving", {}).get("loads", [])
              for m in ld["metrics"].values() for q in (m["p50"], m["p90"]))
    return steps and e2e


def summary_lines(data: dict) -> list[str]:
    m = data["model"]
    lines = [f"simkv validate --serving: OpenVINO GenAI ContinuousBatchingPipeline on CPU {data['cpu']} vs device "
             f"{data['device']} ({m['layers']} layers, hidden {m['hidden']}, {m['heads']}/{m['kv_heads']} heads x "
             f"{m['head_dim']}, weights {data['weights_precision']}, KV {data['kv_precision']})"]
    if "steps" in data:
        lines.append(f"  {'step':<18}{'measured ms':>12}{'simkv ms':>10}{'error':>9}{'spread':>8}")
        for r in data["steps"]["rows"]:
            name = f"{r['kind']} {_STEP_UNIT[r['kind']]} {r['size']}"
            lines.append(f"  {name:<18}{r['measured_ms']:>12.2f}{r['predicted_ms']:>10.2f}{r['error_pct']:>+8.1f}%"
                         f"{r['spread_pct']:>7.1f}%{'' if r['within'] else '  !'}")
        for kind, s in data["steps"]["slopes"].items():
            a, b = list(s.values())
            lines.append(f"  {kind} slope {list(s)[0].split('_', 1)[1][:-3].replace('_', ' ')}: measured "
                         f"{a:.4f} ms, simkv {b:.4f} ms")
    if "serving" in data:
        sv = data["serving"]
        lines.append(f"  end to end: {sv['requests']} requests x {sv['repeats']} repeats per load "
                     f"(error / real runs' spread; ! beyond both)")
        for ld in sv["loads"]:
            busy = ", ".join(f"{b:.0%}" for b in ld["busy_measured"])
            tag = "" if ld["judged"] else "  (overloaded: information)"
            lines.append(f"  busy {ld['busy_offered']:.0%} offered (measured {busy}){tag}")
            for name, mm in ld["metrics"].items():
                cells = []
                for q in ("p50", "p90"):
                    e = mm[q]
                    mark = " !" if e["within"] is False else ""
                    cells.append(f"{q} {1e3 * e['real_s']:8.1f} ms real {1e3 * e['simulated_s']:8.1f} ms simkv "
                                 f"{e['error_pct']:+6.1f}% / {e['spread_pct']:4.1f}%{mark}")
                pr = mm["paired_ratio"]
                ratio = f"ratio {pr['median']:.2f} [{pr['p10']:.2f}, {pr['p90']:.2f}]" if pr else "ratio -"
                lines.append(f"    {name[:-2].upper():<5}{'   '.join(cells)}   {ratio}")
    lines.append(f"  verdict: {'within bounds' if ok(data) else 'outside bounds'} ({data['elapsed_s']:.0f} s)")
    return lines


#: How a fixed batch's size reads in the summary.
_STEP_UNIT = {"decode": "batch", "prefill": "chunk", "mixed": "decodes x chunk"}


def _mixed(text: str) -> tuple:
    """``--mixed-batches`` (``DECODESxCHUNK,...``; empty: none) as (decodes, chunk) pairs."""
    try:
        pairs = tuple(tuple(int(v) for v in x.lower().split("x")) for x in text.split(",") if x.strip())
    except ValueError:
        pairs = ((),)
    if all(len(p) == 2 for p in pairs):
        return pairs
    raise ConfigError(f"--mixed-batches takes a comma-separated list of DECODESxCHUNK, not {text!r}")


def _floats(text: str, flag: str, kind=float) -> tuple:
    try:
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{flag} takes a comma-separated list of numbers, not {text!r}") from None


def config_from_args(args) -> LiveConfig:
    if args.trace or args.random or args.ir or args.report:
        raise ConfigError("--serving makes its own workload and model and has no HTML report: "
                          "drop --trace/--random/--ir/--report")

    def given(name, default):
        value = getattr(args, name, None)
        return default if value is None else value

    cfg = LiveConfig(device=args.device or "host", layers=given("layers", DEFAULT_SHAPE["layers"]),
                     heads=given("heads", DEFAULT_SHAPE["heads"]), kv_heads=given("kv_heads", DEFAULT_SHAPE["kv_heads"]),
                     head_dim=given("head_dim", DEFAULT_SHAPE["head_dim"]), hidden=given("hidden", DEFAULT_SHAPE["hidden"]),
                     vocab=DEFAULT_SHAPE["vocab"] if args.vocab == 1000 else args.vocab, stage=args.stage,
                     requests=args.requests, busy=_floats(args.busy, "--busy"), repeats=args.repeats,
                     decode_batches=_floats(args.decode_batches, "--decode-batches", int),
                     prefill_chunks=_floats(args.prefill_chunks, "--prefill-chunks", int),
                     mixed_batches=_mixed(args.mixed_batches),
                     step_repeats=args.step_repeats, max_num_batched_tokens=args.max_num_batched_tokens,
                     max_num_seqs=args.max_num_seqs, cpu=None if args.cpu < 0 else args.cpu, seed=args.seed)
    cfg.check()
    cfg.spec()
    return cfg


def cli_main(args) -> int:
    """``simkv validate --serving``: exit 0 only if every judged comparison is within its bound."""
    from .runner import MISSING_DEPS, _one_line, check_dependencies

    cfg = config_from_args(args)
    try:  # the CLI prints a SimkvError as one line and exits 2
        check_dependencies()
    except ImportError:
        raise ConfigError(MISSING_DEPS) from None
    try:
        data = validate_serving(cfg, progress=sys.stderr.isatty())
    except RuntimeError as err:
        raise SimkvError(_one_line(err)) from None
    from ..report import emit

    return emit(args, data, summary_lines=summary_lines, ok=ok)

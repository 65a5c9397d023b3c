"""``simkv validate`` (issue #3): a real OpenVINO CPU run against the ``openvino-cpu`` policy, event by event.

Also ``--runtime transformers`` (Hugging Face caches on torch CPU against ``hf-dynamic`` / ``hf-static``)
and ``--paged`` (OpenVINO GenAI continuous batching against the paged serving model). OpenVINO,
memray and torch are imported only when the command runs (the runners in simkv.validate's subpackages).
"""

from __future__ import annotations

import argparse
import sys

from simkv.errors import SimkvError
from simkv.flags import ANY, Mode, add_latency_arguments, add_scenario_arguments, workload_modes

VALIDATE_DEFAULTS = {"model": "custom", "prompt": 32, "decode": 1100}

#: The modes of ``simkv validate`` (simkv.flags: every flag declares the ones that use it).
VALIDATE_MODES = (
    Mode("openvino", "the OpenVINO CPU plugin (--runtime openvino, the default)",
         lambda a: not a.silicon and not a.paged and not a.serving and a.runtime == "openvino", "runtime"),
    Mode("transformers", "Hugging Face transformers (--runtime transformers)",
         lambda a: not a.silicon and not a.paged and not a.serving and a.runtime == "transformers", "runtime",
         ("--runtime", "transformers")),
    Mode("paged", "GenAI's continuous batching (--paged)",
         lambda a: not a.silicon and a.paged and not a.serving and a.runtime != "vllm", "runtime", ("--paged",)),
    Mode("live", "GenAI served in real time (--serving)", lambda a: not a.silicon and a.serving and a.runtime != "vllm", "runtime",
         ("--serving",)),
    Mode("vllm", "the real vLLM scheduler (--runtime vllm)", lambda a: not a.silicon and a.runtime == "vllm", "runtime",
         ("--runtime", "vllm")),
    Mode("silicon", "measured serving benchmarks (--silicon)", lambda a: bool(a.silicon), "runtime",
         ("--silicon", "experiments/data/silicon/h100_sxm_vllm_agg.csv", "--match", "no-such-row")),
    *workload_modes(lambda a: not a.silicon and not a.paged and not a.serving and a.runtime != "vllm"),
    # the transformers runner builds its chat turns without the trims (simkv/validate/transformers/runner.py)
    Mode("openvino-chat", "chat turns on the OpenVINO CPU plugin (--turns above 0, no --ops)",
         lambda a: not a.silicon and not a.paged and not a.serving and a.runtime == "openvino" and not a.ops and a.turns > 0, "turns",
         ("--turns", "1")),
)
#: A single session, on either runtime (not --paged).
SESSION = ("openvino", "transformers")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("validate", help="run a scenario on the real OpenVINO CPU plugin and compare with the simulator",
                       modes=VALIDATE_MODES, description=(
        "Run a scenario on OpenVINO's CPU plugin (a random-weight stateful decoder of the given shape, or --ir), "
        "record every KV-cache allocation and free with memray, measure RSS/VmSize/VmHWM/latency in a clean "
        "run (MALLOC_MMAP_THRESHOLD_ set), predict the same scenario with the openvino-cpu policy at the "
        "effective KV precision, and compare event by event. Exit 0 only if every KV event matched. "
        "Defaults: 4 layers, 8 heads (MHA) x 64, 32-token prompt, 1,100 generated tokens (5 reallocations). "
        "--runtime transformers runs Hugging Face DynamicCache / StaticCache on torch CPU instead and compares "
        "with hf-dynamic / hf-static."))
    # --paged builds its own toy model from the dimension flags, and its own workloads
    add_scenario_arguments(p, model=(*SESSION, "vllm"), workload=SESSION, layers=ANY, heads=ANY, kv_heads=ANY, head_dim=ANY,
                           sliding_window="transformers", turn_divergence="openvino-chat")
    p.set_defaults(**VALIDATE_DEFAULTS)
    helps = {
        "model": "preset or config.json whose dimensions the toy model takes (one of identical plain "
                 "attention layers), or 'custom' (default custom)",
        "layers": "attention layers (default 4)",
        "heads": "query heads (default 8)",
        "kv_heads": "key/value heads (default: --heads, MHA; fewer: GQA)",
        "head_dim": "head size (default 64)",
        "precision": "KV_CACHE_PRECISION hint: u8 u4 f16 bf16 f32 (default: the plugin's; the effective precision "
                     "is read from the compiled model)",
        "prompt": "prompt tokens (default 32)",
        "decode": "generated tokens (default 1100)",
    }
    for action in p._actions:
        if action.dest in helps:
            action.help = helps[action.dest]
    r = p.add_argument_group("real run")
    r.add_argument("--hidden", type=int, modes=(*SESSION, "live"), help="hidden size of the toy model (default heads x head-dim)")
    r.add_argument("--vocab", type=int, default=1000, modes=(*SESSION, "paged", "live"), help="vocabulary of the toy model (default 1000)")
    r.add_argument("--inference-precision", modes="openvino",
                   help="INFERENCE_PRECISION_HINT: bf16 f16 f32 (default: the plugin's)")
    r.add_argument("--ir", metavar="PATH", modes="openvino", help="validate an exported model (openvino_model.xml or "
                   "its folder); dimensions come from its state variables")
    r.add_argument("--mmap-threshold", type=int, default=65536, modes=SESSION,
                   help="MALLOC_MMAP_THRESHOLD_ of the clean run (default 65536)")
    r.add_argument("--slope-min-tokens", type=int, default=500, modes=SESSION,
                   help="quiet decode stretches at least this long give the resident slope (default 500)")
    r.add_argument("--seed", type=int, default=0, modes=(*SESSION, "paged", "live", "vllm"),
                   help="weights and token ids (default 0)")
    r.add_argument("--runtime", choices=("openvino", "transformers", "vllm"), default="openvino",
                   modes=(*SESSION, "vllm"),
                   help="openvino: the CPU plugin vs openvino-cpu (default); transformers: Hugging Face caches on "
                   "torch CPU vs hf-dynamic / hf-static (--precision f32 f16 bf16, default f32); vllm: the real vLLM "
                   "V1 scheduler (side venv: simkv setup vllm) vs --scheduler vllm, step by step (--trace or --random "
                   "N requests; --num-kv-blocks, --block-size, --max-model-len, the --paged flags)")
    from simkv.validate.transformers.archs import ARCHS  # imports no runtime

    r.add_argument("--arch", choices=tuple(ARCHS), modes="transformers",
                   help="--runtime transformers: a tiny random config of this architecture (per-layer sliding, "
                   "chunked, linear-attention and MLA caches) instead of the Llama shape; --model PATH takes any "
                   "config.json (or its folder) the same way")
    r.add_argument("--policy", choices=("hf-dynamic", "hf-static"), modes="transformers",
                   help="--runtime transformers: DynamicCache (hf-dynamic, default) or StaticCache (hf-static)")
    r.add_argument("--policy-opt", action="append", metavar="KEY=VALUE", modes="transformers",
                   help="--runtime transformers: max_cache_len=N for hf-static (default: the longest history)")
    add_latency_arguments(p, default="host", modes=("openvino", "live"), help="cost-model device the measured latency is "
                          "compared with: this host (after `simkv calibrate`), a preset or a preset file")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", modes=ANY, help="print the result as JSON on stdout")
    o.add_argument("--out", metavar="PATH.json", modes=(*SESSION, "paged", "live"), output=(".json",), help="write the JSON result to a file")
    o.add_argument("--report", metavar="PATH.html", modes=(*SESSION, "paged"), output=(".html", ".htm"),
                   help="write a self-contained HTML report")
    _add_paged_validate_arguments(p)
    _add_serving_validate_arguments(p)
    _add_silicon_validate_arguments(p)
    return p


def _add_paged_validate_arguments(p) -> None:
    """``simkv validate --paged`` (issue #8): OpenVINO GenAI continuous batching vs the paged model."""
    g = p.add_argument_group("paged (--paged: OpenVINO GenAI ContinuousBatchingPipeline vs the paged serving model)")
    g.add_argument("--paged", action="store_true", modes="paged",
                   help="validate the paged continuous-batching model step by step against GenAI's pipeline on CPU "
                        "(model flags shape its toy model: default 2 layers, 4 heads, 2 kv heads x 32)")
    g.add_argument("--trace", metavar="W.csv", modes=("paged", "vllm"),
                   help="the workload (serving CSV/JSONL with arrival_step)")
    g.add_argument("--random", type=int, metavar="N", modes=("paged", "vllm"),
                   help="N random workloads and configurations from --seed")
    g.add_argument("--num-kv-blocks", type=int, default=0, metavar="N", modes=("paged", "vllm"),
                   help="pool blocks (0 with --cache-size 0: dynamic pool)")
    g.add_argument("--cache-size", type=int, default=0, metavar="GIB", modes="paged",
                   help="pool size in whole GiB (GenAI's cache_size)")
    g.add_argument("--max-num-batched-tokens", type=int, default=256, metavar="N", modes=("paged", "vllm", "live"),
                   help="tokens per step (default 256)")
    g.add_argument("--max-num-seqs", type=int, default=256, metavar="N", modes=("paged", "vllm", "live"),
                   help="running requests in vLLM mode (split-fuse does not apply it; default 256)")
    g.add_argument("--no-dynamic-split-fuse", action="store_true", modes="paged",
                   help="vLLM mode: whole prompts, no chunks")
    g.add_argument("--prefix-caching", action="store_true", modes=("paged", "vllm"), help="enable_prefix_caching")
    g.add_argument("--cache-eviction", metavar="start=N,recent=N,max=N[,kvcrush=B]", modes="paged",
                   help="GenAI's cache eviction (use_cache_eviction; tokens, B in blocks; 'on': GenAI's defaults "
                        "start=32,recent=128,max=672): with --random, every workload runs with it")
    g.add_argument("--no-memray", action="store_true", modes="paged", help="skip recording the pool allocations (faster)")
    g.add_argument("--block-size", type=int, default=16, metavar="N", modes="vllm",
                   help="--runtime vllm: tokens per block (default 16)")
    g.add_argument("--max-model-len", type=int, default=4096, metavar="N", modes="vllm",
                   help="--runtime vllm: max_model_len (default 4096)")
    g.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs", modes="vllm",
                   help="--runtime vllm: fcfs | priority (the trace's priority column; --random draws 0..3)")
    g.add_argument("--long-prefill-token-threshold", type=int, default=0, metavar="N", modes="vllm",
                   help="--runtime vllm: most prompt tokens per request per step when several prefill (0: off)")


def _add_silicon_validate_arguments(p) -> None:
    """``simkv validate --silicon``: measured serving benchmarks vs the serving simulation (simkv/validate/silicon.py)."""
    s = p.add_argument_group("silicon (--silicon: measured serving benchmarks vs simkv's serving simulation)")
    s.add_argument("--silicon", metavar="PATH.csv", modes="silicon", help="simulate every row of a silicon_sample.csv (AIConfigurator's "
                   "columns: model, precision, TP, concurrency, ISL/OSL, measured TTFT/TPOT) as its benchmark ran it "
                   "and print measured vs predicted TTFT and TPOT, |error| per model and overall")
    s.add_argument("--configs", metavar="DIR", modes="silicon", help="--silicon: the models' config.json files (default: the folder "
                   "'configs' beside the CSV)")
    s.add_argument("--match", metavar="TEXT", modes="silicon", help="--silicon: only the rows whose id contains TEXT")
    s.add_argument("--workers", type=int, default=1, metavar="N", modes="silicon", help="--silicon: rows simulated in N processes "
                   "(default 1; the results do not depend on it)")
    s.add_argument("--vllm-scheduler", action="store_true", modes="silicon", help="--silicon: vLLM's scheduler (as simkv run "
                   "--scheduler vllm) instead of GenAI's continuous batching on vLLM's KV manager (the default: the same "
                   "step times, its own preemptions; about ten times slower)")
    s.add_argument("--beside", metavar="PRED.csv", modes="silicon", help="--silicon: another predictor's predictions of the same rows "
                   "(id, aic_ttft_ms, aic_tpot_ms: experiments/silicon_aic.py writes AIConfigurator's), its |error| "
                   "shown beside simkv's on the rows both predict")


def _add_serving_validate_arguments(p) -> None:
    """``simkv validate --serving``: GenAI served in real time vs the serving simulation (simkv/validate/genai/serving.py)."""
    g = p.add_argument_group("serving (--serving: OpenVINO GenAI served in real time vs the serving simulation on "
                             "--device, default host)")
    g.add_argument("--serving", action="store_true", modes="live",
                   help="time fixed batches and serve requests live on the real pipeline (pinned to --cpu), "
                        "simulate the same on --device and compare step times, TTFT, TPOT and e2e")
    g.add_argument("--stage", choices=("steps", "e2e", "both"), default="both", modes="live",
                   help="steps: fixed batches only; e2e: live serving only (default both)")
    g.add_argument("--requests", type=int, default=80, metavar="N", modes="live", help="requests per load (default 80)")
    g.add_argument("--busy", default="0.3,0.6,1.2", metavar="LIST", modes="live",
                   help="offered loads, fractions of one request's solo service time per arrival (default "
                        "0.3,0.6,1.2; from 1.0 on: overloaded, reported but not judged)")
    g.add_argument("--repeats", type=int, default=3, metavar="N", modes="live", help="live runs per load, each a fresh process (default 3)")
    g.add_argument("--decode-batches", default="1,2,4,8,16,32", metavar="LIST", modes="live", help="decode batches timed (default 1,2,4,8,16,32)")
    g.add_argument("--prefill-chunks", default="32,64,128,256,512", metavar="LIST", modes="live",
                   help="prefill chunks timed (default 32,64,128,256,512)")
    g.add_argument("--mixed-batches", default="4x64,16x64,4x128,16x128", metavar="LIST", modes="live",
                   help="mixed steps timed, DECODESxCHUNK: decodes beside one prompt chunk (default "
                        "4x64,16x64,4x128,16x128; empty: none)")
    g.add_argument("--step-repeats", type=int, default=9, metavar="N", modes="live", help="timed steps per fixed batch (default 9)")
    g.add_argument("--cpu", type=int, default=0, metavar="N", modes="live", help="core the real runs are pinned to (taskset; -1: unpinned)")


def main(args: argparse.Namespace) -> int:
    if args.silicon:  # measured serving benchmarks vs the serving simulation (simkv/validate/silicon.py)
        from simkv.validate.silicon import cli_main as silicon_main

        return silicon_main(args)
    if args.runtime == "vllm":  # the real vLLM V1 scheduler vs simkv's (simkv/validate/vllm/)
        from simkv.validate.vllm.compare import cli_main as vllm_main

        return vllm_main(args)
    if args.serving:  # OpenVINO GenAI served in real time vs the serving simulation (simkv/validate/genai/serving.py)
        from simkv.validate.genai.serving import cli_main as serving_main

        return serving_main(args)
    if args.paged:  # OpenVINO GenAI continuous batching vs the paged serving model (simkv/validate/genai/)
        from simkv.validate.genai.runner import cli_main

        return cli_main(args)
    from simkv.limits import check_flags
    from simkv.scenario import build_scenario
    from simkv.validate import model_dims

    check_flags(args)
    if args.model != "custom" and not args.ir:
        from simkv.hfconfig import get_model, preset_names

        # OpenVINO's toy decoder has identical plain layers; transformers builds a config file's model
        # layer by layer (simkv/validate/transformers/archs.py), but a preset stands for a full-size model.
        m = get_model(args.model)
        if m.layer_kv and (args.runtime != "transformers" or args.model in preset_names()):
            runtime = {"openvino": "OpenVINO"}.get(args.runtime, args.runtime)
            raise SimkvError(f"the {runtime} run builds a decoder of identical plain attention layers, which "
                             f"{m.name}'s are not ({m.describe().split(': ', 1)[1]})")
    if args.runtime == "transformers":  # Hugging Face caches on torch CPU (simkv/validate/transformers/)
        from simkv.validate.transformers.runner import command

        return command(args)
    given = [f"--{k.replace('_', '-')}" for k in ("layers", "heads", "kv_heads", "head_dim", "hidden")
             if getattr(args, k) is not None] + (["--model"] if args.model != "custom" else [])
    if args.ir and given:
        raise SimkvError(f"--ir takes the dimensions from the model: drop {', '.join(given)}")
    for name in ("vocab", "mmap_threshold", "slope_min_tokens"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise SimkvError(f"--{name.replace('_', '-')} must be positive")
    model = None if args.model == "custom" else args.model
    dims = model_dims(args)
    # Validates the shape and the workload before anything slow happens.
    sc = build_scenario(model=model, **dims, precision="u8", policy="openvino-cpu", prompt=args.prompt, decode=args.decode,
                        turns=args.turns, turn_tokens=args.turn_tokens, turn_decode=args.turn_decode,
                        beam=args.beam, turn_divergence=args.turn_divergence, ops=args.ops,
                        weights_memory=0)  # a host run: KV only
    m = sc.model  # ModelSpec has already rejected heads that are not a multiple of kv_heads
    from simkv.limits import check_validation

    from simkv.validate.openvino.toy import ToyDecoderSpec  # imports no openvino

    toy = 0 if args.ir else ToyDecoderSpec(layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim,
                                           hidden=args.hidden, vocab=args.vocab).params
    check_validation(m.layers, sc.workload, toy)  # --ir: its workload is bounded here, its own layers when read
    from simkv.validate.openvino.cleanrun import ValidateConfig  # these two import neither openvino nor memray
    from simkv.validate.openvino.runner import MISSING_DEPS, check_dependencies, run_validation

    try:
        check_dependencies()
    except ImportError:
        print(f"simkv validate: error: {MISSING_DEPS}", file=sys.stderr)
        return 2
    from simkv.validate.openvino.ovmodel import NotFusedError

    cfg = ValidateConfig(
        workload=str(sc.workload), layers=m.layers, heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim,
        hidden=args.hidden, vocab=args.vocab, seed=args.seed, kv_cache_precision=args.precision,
        inference_precision=args.inference_precision, ir=args.ir, mmap_threshold=args.mmap_threshold,
        slope_min_tokens=args.slope_min_tokens, progress=sys.stderr.isatty(), model_name=m.name, device=args.device,
    )
    try:
        data = run_validation(cfg)
    except NotFusedError as err:
        print(f"simkv validate: error: {str(err).split('. ')[0]}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"simkv validate: error: no such model: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # compile errors, unsupported precision hints, a failed clean run
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and not ln.startswith("Exception from ")]
        print(f"simkv validate: error: {lines[-1] if lines else repr(err)}", file=sys.stderr)
        return 2
    from simkv.validate.report import emit  # --out, --report, --json; exit 0 only if every KV event matched

    return emit(args, data)

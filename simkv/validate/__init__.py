"""Validation of simkv against real runtimes: run a workload for real, observe what it allocates, compare.

One subpackage per runtime, over the pieces they share (every module is imported explicitly, so
``import simkv`` never pulls in OpenVINO, torch or memray):

* :mod:`simkv.validate.openvino` -- ``simkv validate``: the OpenVINO CPU plugin's stateful KV cache
  vs the ``openvino-cpu`` policy, event by event, and the cost model's step times (``simkv calibrate``
  measures this host on the same toy decoder).
* :mod:`simkv.validate.genai` -- ``simkv validate --paged``: OpenVINO GenAI's continuous-batching
  pipeline vs simkv's paged serving model, step by step.
* :mod:`simkv.validate.transformers` -- ``simkv validate --runtime transformers``: Hugging Face caches on
  torch CPU vs ``hf-dynamic`` / ``hf-static``, event by event.
* :mod:`simkv.validate.silicon` -- ``simkv validate --silicon``: measured serving benchmarks (TTFT, TPOT) vs
  simkv's serving simulation of the same deployment, row by row; what each row ran (its checkpoint, its vLLM
  server's flags, with their sources) is the data of :mod:`simkv.validate.silicon_recipes`.

Shared:

* :mod:`simkv.validate.compare` -- event alignment (matched / missing / unexpected), resident
  slope, in-step peak, VmSize and latency comparison; pure numpy, no runtime.
* :mod:`simkv.validate.report` -- plotly figures and the HTML report of an event validator's JSON
  result, and ``emit`` (every validator's ``--out`` / ``--report`` / ``--json`` / summary output).
* :mod:`simkv.validate.memtrace` -- memray recording with in-stream step markers, and the process's
  RSS / VmSize / VmHWM.
* :mod:`simkv.validate.child` -- the child processes' environment, and the clean runs' allocator setting.

What each runtime does (formulas, event order, memory signals) is written up in docs/DESIGN.md;
``compare`` and ``report`` import neither a runtime nor memray. Nothing here imports the CLI or the
dashboard: the defaults the command shares with a runtime live here (:data:`VALIDATE_TOY`).
"""

#: A custom model's dimensions when ``simkv validate`` is not given them (the CLI's OpenVINO run and
#: ``--runtime transformers``; ``--paged`` shapes its own toy model).
VALIDATE_TOY = {"layers": 4, "heads": 8, "head_dim": 64}


def model_dims(args) -> dict:
    """The shape flags of a ``simkv validate`` command line, with :data:`VALIDATE_TOY` where a custom model
    leaves one out (a preset's own dimensions fill the rest later)."""
    dims = {k: getattr(args, k) for k in ("layers", "heads", "kv_heads", "head_dim")}
    if args.model == "custom":
        dims.update({k: v for k, v in VALIDATE_TOY.items() if dims[k] is None})
    return dims

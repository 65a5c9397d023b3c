"""``simkv validate --paged``: OpenVINO GenAI's ``ContinuousBatchingPipeline`` on CPU vs simkv's paged model.

* :mod:`.runner` -- the workload side (token ids, random cases), the step-by-step comparison, the command.
* :mod:`.model` -- the model directory GenAI loads (the toy stateful decoder and a tokenizer).
* :mod:`.real` -- the real pipeline, driven step by step, and its pool allocations.
* :mod:`.report` -- the result as the command shows it: verdict, summary lines, figure, HTML report.

What GenAI does is written up in docs/DESIGN.md §4b.
"""

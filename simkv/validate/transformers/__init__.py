"""``simkv validate --runtime transformers``: Hugging Face caches on torch CPU vs ``hf-dynamic`` / ``hf-static``.

* :mod:`.model` -- what to run (``HFValidateConfig``), the random-weight model, its cache, the driver.
* :mod:`.events` -- the KV events, read from memray's Python stacks.
* :mod:`.runner` -- the memray run, the clean run, the prediction and comparison, the command.

What transformers does is written up in docs/DESIGN.md §3b.
"""

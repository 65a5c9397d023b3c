"""``simkv validate --runtime transformers``: Hugging Face caches on torch CPU vs ``hf-dynamic`` / ``hf-static``.

* :mod:`.runner` -- the random-weight model, the driver, the KV events read from memray's Python
  stacks, the clean run, the comparison and the command.

What transformers does is written up in docs/DESIGN.md §3b.
"""

"""The schedulers of paged serving, side by side: each decides, per engine step, which requests run and how
many tokens each computes, and asks the KV pools (:mod:`simkv.serving.kv`) for blocks.

* :mod:`.config` — the one configuration (``SchedulerConfig``: GenAI's field names and simkv's extensions);
* :mod:`.group` — a request inside the engine (status, counters, block tables), what every scheduler and the
  engine's fast paths read and write;
* :mod:`.genai` — OpenVINO GenAI's continuous-batching rules (``ContinuousScheduler``).
"""

"""A request inside the serving engine: its status, counters and block tables, as every scheduler and the
engine's fast paths read and write them."""

from __future__ import annotations

RUNNING, FINISHED, IGNORED, REJECTED = "RUNNING", "FINISHED", "IGNORED", "REJECTED"
#: Still running when the simulation stopped (a step limit, or requests that never finish).
UNFINISHED = "UNFINISHED"


class Group:
    """A request in the pipeline (GenAI's ``SequenceGroup``): its sequences' block tables and counters."""

    __slots__ = ("req", "index", "P", "G", "n", "processed", "maxc", "generated", "scheduled", "waiting",
                 "tables", "status", "tokens", "full_hashes", "preemptions", "prefix_hit", "first_token_s",
                 "finish_s", "added_s", "added_step", "first_token_step", "finish_step", "seq_tokens", "dropped",
                 "side", "evicted", "scores", "snap")

    def __init__(self, req, index: int, prompt_tokens: int) -> None:
        self.req = req
        self.index = index  # position in the request order
        self.P = prompt_tokens
        self.G = req.max_new_tokens
        self.n = req.sequences
        self.processed = 0
        self.maxc = 0
        self.generated = 0
        self.scheduled = 0
        self.waiting = False
        self.tables: list[list[int]] = [[]]  # one block table per running sequence
        self.status = RUNNING
        self.tokens = None  # prompt token ids (prefix caching only)
        self.seq_tokens = None  # per sequence: prompt + generated tokens (prefix caching only)
        self.full_hashes = None
        self.preemptions = 0
        self.prefix_hit = 0
        self.first_token_s = self.finish_s = None
        self.added_s = 0.0
        self.added_step = 0
        self.first_token_step = self.finish_step = None
        self.dropped = 0  # leading blocks released because they left a sliding window (None in the tables)
        #: The side groups' tables (simkv.serving.kv.groups: vLLM's other groups, GenAI's linear-attention
        #: pool): per side group, one table per running sequence; None for a layout with one group.
        self.side: list[list[list]] | None = None
        #: GenAI's cache eviction (simkv.serving.sched.eviction): tokens evicted from the cache (the blocks held are
        #: the context's less these; 0 again after a full preemption), the tokens GenAI's attention scores span
        #: (start included; 0 while it keeps none) and the SnapKV scores it aggregated (both kept over preemptions).
        self.evicted = 0
        self.scores = 0
        self.snap = 0

    # sequence_group.hpp
    def can_generate(self) -> bool:
        return self.maxc >= self.P

    def available(self) -> int:
        return max(max(self.P, self.maxc) - self.processed, 1)

    def running_seqs(self) -> int:
        return len(self.tables)

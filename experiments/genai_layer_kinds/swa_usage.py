"""Does GenAI free KV blocks that left a sliding window? Track used blocks for one long Gemma-3 sequence (window 64)."""
import sys, numpy as np, openvino as ov, openvino_genai as g
sc = g.SchedulerConfig(); sc.num_kv_blocks = 64; sc.max_num_batched_tokens = 256   # fixed pool, 64 blocks x 32 tokens
pipe = g.ContinuousBatchingPipeline(sys.argv[1], sc, "CPU")
gc = g.GenerationConfig(); gc.max_new_tokens = 600; gc.ignore_eos = True
h = pipe.add_request(0, ov.Tensor(np.arange(5, 105, dtype=np.int64).reshape(1, -1)), gc)
s = 0
while pipe.has_non_finished_requests():
    pipe.step(); s += 1
    if s in (1, 50, 100, 200, 400, 600):
        m = pipe.get_metrics(); print(f"step {s}: context~{100 + s - 1} tokens, used blocks={m.cache_usage * 64 / 100:.0f} of 64 (usage {m.cache_usage:.1f}%)")

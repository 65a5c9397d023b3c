"""Run GenAI 2026.4.1 ContinuousBatchingPipeline on CPU with a tiny exported model; report pool sizes per step.
usage: python cb_probe.py MODEL_DIR N_REQ PROMPT MAX_NEW [prefix_caching 0/1] [cache_size_gb] [num_kv_blocks]"""
import sys, numpy as np, openvino as ov, openvino_genai as g
d, n, plen, max_new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pc = len(sys.argv) > 5 and sys.argv[5] == "1"
sc = g.SchedulerConfig(); sc.max_num_batched_tokens = 256; sc.enable_prefix_caching = pc
if len(sys.argv) > 6: sc.cache_size = int(sys.argv[6])
if len(sys.argv) > 7: sc.num_kv_blocks = int(sys.argv[7])
pipe = g.ContinuousBatchingPipeline(d, sc, "CPU")
gc = g.GenerationConfig(); gc.max_new_tokens = max_new; gc.ignore_eos = True
rng = np.random.default_rng(0)
base = rng.integers(5, 900, size=(1, plen)).astype(np.int64)
hs = [pipe.add_request(i, ov.Tensor(base.copy() if pc else rng.integers(5, 900, size=(1, plen)).astype(np.int64)), gc) for i in range(n)]
s = 0; last = None
while pipe.has_non_finished_requests():
    pipe.step(); s += 1
    m = pipe.get_metrics()
    cur = (m.cache_size_in_bytes, m.la_peak_pool_blocks)
    if cur != last:
        print(f"step {s}: cache_bytes={m.cache_size_in_bytes} la_peak_pool_blocks={m.la_peak_pool_blocks} usage={m.cache_usage:.1f}%", flush=True)
        last = cur
print("done steps", s, "statuses", sorted(set(str(h.get_status()) for h in hs)), "lens", sorted(set(len(h.read_all()[0].generated_ids) for h in hs)))

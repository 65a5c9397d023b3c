"""Probe 2: many concurrent requests -> one big dynamic KV reservation; under RLIMIT_AS it cannot be allocated.
usage: python oom_probe2.py MODEL_DIR LIMIT_MB N_REQ PROMPT MAX_NEW"""
import resource, sys, numpy as np, openvino as ov, openvino_genai as g
model_dir, limit_mb, n, plen, max_new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def vm():
    return {l.split(':')[0]: l.split(':')[1].strip() for l in open('/proc/self/status') if l.startswith(('VmSize','VmRSS','VmPeak'))}
sc = g.SchedulerConfig(); import os; sc.cache_size = int(os.environ.get("CACHE_GB","0")); sc.num_kv_blocks = 0; sc.max_num_batched_tokens = 4096
pipe = g.ContinuousBatchingPipeline(model_dir, sc, "CPU")
gc = g.GenerationConfig(); gc.max_new_tokens = 2; gc.ignore_eos = True
pipe.generate([ov.Tensor(np.array([[1, 2, 3]], dtype=np.int64))], [gc])
cur = int(vm()['VmSize'].split()[0]) // 1024
if limit_mb > 0:
    lim = (cur + limit_mb) << 20
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
print("VmSize after warmup", cur, "MiB; limit", limit_mb, flush=True)
gc = g.GenerationConfig(); gc.max_new_tokens = max_new; gc.ignore_eos = True
rng = np.random.default_rng(0)
hs = [pipe.add_request(i, ov.Tensor(rng.integers(5, 900, size=(1, plen)).astype(np.int64)), gc) for i in range(n)]
steps = 0
try:
    while pipe.has_non_finished_requests():
        pipe.step(); steps += 1
        if steps <= 3 or steps % 100 == 0:
            m = pipe.get_metrics(); print("step", steps, "cache_bytes", m.cache_size_in_bytes, "usage", round(m.cache_usage,1), vm(), flush=True)
    print("finished, statuses:", sorted(set(str(h.get_status()) for h in hs)), "steps", steps)
except BaseException as e:
    print("EXCEPTION out of step():", type(e).__name__, "|", str(e)[:500].replace("\n", " | "))
    print("after", steps, "steps; statuses:", sorted(set(str(h.get_status()) for h in hs)), vm())
    m = pipe.get_metrics(); print("metrics cache_bytes", m.cache_size_in_bytes)

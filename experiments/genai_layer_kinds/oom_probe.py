"""Probe: what does GenAI 2026.4.1 CB do on CPU when dynamic KV growth cannot be allocated?
Run under an address-space limit (RLIMIT_AS) so that a large allocation fails.
usage: python oom_probe.py MODEL_DIR LIMIT_MB PROMPT_TOKENS MAX_NEW [cache_size_gb]
"""
import resource, sys, os, time, traceback
import numpy as np
import openvino as ov
import openvino_genai as g

model_dir, limit_mb, prompt_len, max_new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cache_gb = int(sys.argv[5]) if len(sys.argv) > 5 else 0

def vm():
    d = {}
    for line in open('/proc/self/status'):
        k, v = line.split(':', 1)
        if k in ('VmPeak', 'VmSize', 'VmRSS', 'VmHWM'):
            d[k] = v.strip()
    return d

sc = g.SchedulerConfig()
sc.cache_size = cache_gb
sc.num_kv_blocks = 0
sc.max_num_batched_tokens = 256
sc.dynamic_split_fuse = True
pipe = g.ContinuousBatchingPipeline(model_dir, sc, "CPU")
# warm-up
gc = g.GenerationConfig(); gc.max_new_tokens = 2; gc.ignore_eos = True
pipe.generate([ov.Tensor(np.array([[1, 2, 3]], dtype=np.int64))], [gc])
print("after warmup", vm(), flush=True)
if limit_mb > 0:
    cur = int(vm()['VmSize'].split()[0]) // 1024
    lim = (cur + limit_mb) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    print(f"RLIMIT_AS set to VmSize+{limit_mb} MiB = {lim>>20} MiB", flush=True)
gc = g.GenerationConfig(); gc.max_new_tokens = max_new; gc.ignore_eos = True
ids = ov.Tensor(np.random.default_rng(0).integers(5, 900, size=(1, prompt_len)).astype(np.int64))
h = pipe.add_request(0, ids, gc)
steps = 0
t0 = time.time()
try:
    while pipe.has_non_finished_requests():
        pipe.step(); steps += 1
        m = pipe.get_metrics()
        if steps % int(os.environ.get("EVERY","50")) == 0:
            print(f"step {steps} cache_usage={m.cache_usage:.1f}% kv_bytes={m.cache_size_in_bytes}", vm(), flush=True)
    print("finished; status:", h.get_status(), "steps", steps)
    outs = h.read_all()
    print("generated", [len(o.generated_ids) for o in outs])
except BaseException as e:
    print("EXCEPTION from step():", type(e).__name__, str(e)[:600].replace('\n', ' | '), flush=True)
    print("steps done", steps, "status", h.get_status(), vm())

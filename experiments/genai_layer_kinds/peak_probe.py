"""Where does the transient VM come from? Track VmPeak/VmSize/VmHWM step by step (fixed or dynamic pool).
usage: python peak_probe.py MODEL_DIR CACHE_GB N_REQ PROMPT MAX_NEW"""
import sys, numpy as np, openvino as ov, openvino_genai as g
def vm():
    return {l.split(':')[0]: int(l.split(':')[1].split()[0]) >> 10 for l in open('/proc/self/status') if l.startswith(('VmPeak','VmSize','VmHWM','VmRSS'))}
model_dir, gb, n, plen, max_new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
sc = g.SchedulerConfig(); sc.cache_size = gb; import os; sc.max_num_batched_tokens = int(os.environ.get("MNBT","256"))
pipe = g.ContinuousBatchingPipeline(model_dir, sc, "CPU")
print("constructed", vm(), flush=True)
gc = g.GenerationConfig(); gc.max_new_tokens = max_new; gc.ignore_eos = True
rng = np.random.default_rng(0)
hs = []
for i in range(n):
    hs.append(pipe.add_request(i, ov.Tensor(rng.integers(5, 900, size=(1, plen)).astype(np.int64)), gc))
s = 0
while pipe.has_non_finished_requests():
    before = vm(); pipe.step(); s += 1; after = vm()
    if s <= 4 or after['VmPeak'] > before['VmPeak']:
        print(f"step {s}: cache_bytes={pipe.get_metrics().cache_size_in_bytes>>20}MiB before={before} after={after}", flush=True)

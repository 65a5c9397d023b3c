"""Is the CPU-plugin transient (VmPeak += KV pool size at infer) repeated on every infer, or only after set_tensor of new tensors?"""
import sys, resource, numpy as np, openvino as ov, openvino_genai as g
def vm():
    return {l.split(':')[0]: int(l.split(':')[1].split()[0]) >> 10 for l in open('/proc/self/status') if l.startswith(('VmPeak','VmSize','VmRSS'))}
sc = g.SchedulerConfig(); sc.cache_size = 1; sc.max_num_batched_tokens = 256
pipe = g.ContinuousBatchingPipeline(sys.argv[1], sc, "CPU")
gc = g.GenerationConfig(); gc.max_new_tokens = 50; gc.ignore_eos = True
h = pipe.add_request(0, ov.Tensor(np.arange(5, 105, dtype=np.int64).reshape(1, -1)), gc)
pipe.step(); v = vm(); print("after step 1", v, flush=True)
lim = (v['VmSize'] + 200) << 20
resource.setrlimit(resource.RLIMIT_AS, (lim, lim)); print("RLIMIT_AS = VmSize + 200 MiB (pool is 1024 MiB)", flush=True)
s = 1
try:
    while pipe.has_non_finished_requests():
        pipe.step(); s += 1
    print("finished", s, "steps under the limit:", vm())
except Exception as e:
    print("step", s + 1, "failed:", str(e)[:300].replace("\n", " | "))

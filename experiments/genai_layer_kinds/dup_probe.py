"""Does the CPU plugin duplicate the KV cache tensors GenAI passes in (set_tensor)? Compare VmSize/RSS deltas.
usage: python dup_probe.py MODEL_DIR CACHE_GB"""
import sys, numpy as np, openvino as ov, openvino_genai as g
def vm():
    return {l.split(':')[0]: int(l.split(':')[1].split()[0]) >> 10 for l in open('/proc/self/status') if l.startswith(('VmSize','VmRSS','VmHWM'))}
model_dir, gb = sys.argv[1], int(sys.argv[2])
print("start", vm(), flush=True)
sc = g.SchedulerConfig(); sc.cache_size = gb; sc.max_num_batched_tokens = 256
pipe = g.ContinuousBatchingPipeline(model_dir, sc, "CPU")
m = pipe.get_metrics(); print("constructed", vm(), "cache_bytes", m.cache_size_in_bytes, flush=True)
gc = g.GenerationConfig(); gc.max_new_tokens = 4; gc.ignore_eos = True
pipe.generate([ov.Tensor(np.array([[1, 2, 3]], dtype=np.int64))], [gc])
m = pipe.get_metrics(); print("after 1st generate", vm(), "cache_bytes", m.cache_size_in_bytes, flush=True)
pipe.generate([ov.Tensor(np.array([[1, 2, 3]], dtype=np.int64))], [gc])
print("after 2nd generate", vm(), flush=True)

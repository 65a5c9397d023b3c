"""Dynamic pool (cache_size=0, no prefix caching): is the KV memory released after generate() (clear_cache)?"""
import sys, numpy as np, openvino as ov, openvino_genai as g
def vm():
    return {l.split(':')[0]: int(l.split(':')[1].split()[0]) >> 10 for l in open('/proc/self/status') if l.startswith(('VmSize','VmRSS'))}
sc = g.SchedulerConfig(); sc.max_num_batched_tokens = 4096
pipe = g.ContinuousBatchingPipeline(sys.argv[1], sc, "CPU")
gc = g.GenerationConfig(); gc.max_new_tokens = 2; gc.ignore_eos = True
pipe.generate([ov.Tensor(np.ones((1, 3), dtype=np.int64))], [gc]); print("warm", vm())
rng = np.random.default_rng(0)
ids = [ov.Tensor(rng.integers(5, 900, size=(1, 4000)).astype(np.int64)) for _ in range(64)]
gc.max_new_tokens = 4000
pipe.generate(ids[:8], [gc]*8); print("after big generate (8x(4000+4000))", vm(), "metric", pipe.get_metrics().cache_size_in_bytes >> 20, "MiB")
gc.max_new_tokens = 2
pipe.generate([ov.Tensor(np.ones((1, 3), dtype=np.int64))], [gc]); print("after tiny generate", vm(), "metric", pipe.get_metrics().cache_size_in_bytes)

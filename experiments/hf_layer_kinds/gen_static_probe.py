"""What cache does generate() build? Prints the class and per-layer preallocated shapes.
Usage: python gen_static_probe.py"""
import torch, transformers as T
from tiny_models import build
torch.set_num_threads(1)
for arch in ["gemma3", "qwen3_next", "deepseek_v3"]:
    model, cfg = build(arch)
    ids = torch.randint(3, 90, (1, 6))
    for impl in [None, "static"]:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, min_new_tokens=5,
                             do_sample=False, cache_implementation=impl, return_dict_in_generate=True)
        c = out.past_key_values
        desc = []
        for l in c.layers:
            if getattr(l, "keys", None) is not None:
                desc.append(f"{type(l).__name__}(K{list(l.keys.shape)},V{list(l.values.shape)},max={getattr(l,'max_cache_len',None)})")
            elif hasattr(l, "conv_states"):
                desc.append(f"{type(l).__name__}(conv{list(l.conv_states[0].shape)},rec{list(l.recurrent_states[0].shape)})")
        print(f"{arch:12s} cache_implementation={impl!s:7s} -> {type(c).__name__}: " + ", ".join(desc))

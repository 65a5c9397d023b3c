"""H100 measurements for simkv's h100-sxm cost preset: a few points, not a grid fit.

1. achieved HBM bandwidth: a large device-to-device copy (bytes read + written);
2. achieved dense bf16 matmul throughput (8192^3, random data);
3. engine-grade decode steps of random-weight Llama shapes (bf16 weights and KV, preallocated KV,
   fused SDPA, the whole step captured in one CUDA graph, no framework overhead), batch x context;
4. prefill through a plain eager forward (batch 1).
Times: CUDA events, warm-up, median of repeats.
"""
import json
import os

import torch
import torch.nn.functional as F

dev = "cuda"
torch.manual_seed(0)
out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}


def med_time(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    ts.sort()
    return ts[len(ts) // 2]


# 1. bandwidth
n = 2 << 30  # 2 GiB per buffer
src = torch.randn(n // 2, dtype=torch.bfloat16, device=dev)
dst = torch.empty_like(src)
t = med_time(lambda: dst.copy_(src))
out["copy_bytes_read_plus_written"] = 2 * n
out["copy_s"] = t
out["hbm_achieved_Bps"] = 2 * n / t
del src, dst
# 2. matmul
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
b = torch.randn_like(a)
t = med_time(lambda: a @ b, reps=30)
out["bf16_matmul_flops"] = 2 * 8192**3 / t
del a, b
print(json.dumps(out), flush=True)

MODELS = {
    "llama-2-7b": dict(layers=32, hidden=4096, heads=32, kv=32, hd=128, inter=11008, vocab=32000),
    "llama-3-8b": dict(layers=32, hidden=4096, heads=32, kv=8, hd=128, inter=14336, vocab=128256),
}


class Model:
    def __init__(self, m):
        self.m = m
        h, L = m["hidden"], m["layers"]
        qkv = (m["heads"] + 2 * m["kv"]) * m["hd"]

        def mk(*s):
            return torch.randn(*s, dtype=torch.bfloat16, device=dev) * 0.02

        self.wqkv = [mk(h, qkv) for _ in range(L)]
        self.wo = [mk(m["heads"] * m["hd"], h) for _ in range(L)]
        self.wgu = [mk(h, 2 * m["inter"]) for _ in range(L)]
        self.wd = [mk(m["inter"], h) for _ in range(L)]
        self.norm = torch.ones(h, dtype=torch.bfloat16, device=dev)
        self.emb = mk(m["vocab"], h)
        self.head = mk(h, m["vocab"])

    def rms(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.norm)

    def layer(self, i, x, kc, vc, pos, causal):
        m = self.m
        B, T, _ = x.shape
        qkv = self.rms(x) @ self.wqkv[i]
        q, k, v = qkv.split([m["heads"] * m["hd"], m["kv"] * m["hd"], m["kv"] * m["hd"]], dim=-1)
        q = q.view(B, T, m["heads"], m["hd"]).transpose(1, 2)
        k = k.view(B, T, m["kv"], m["hd"]).transpose(1, 2)
        v = v.view(B, T, m["kv"], m["hd"]).transpose(1, 2)
        kc[:, :, pos:pos + T] = k
        vc[:, :, pos:pos + T] = v
        att = F.scaled_dot_product_attention(
            q, kc[:, :, :pos + T], vc[:, :, :pos + T], is_causal=causal, enable_gqa=m["kv"] != m["heads"]
        )
        x = x + att.transpose(1, 2).reshape(B, T, -1) @ self.wo[i]
        g, u = (self.rms(x) @ self.wgu[i]).chunk(2, dim=-1)
        return x + (F.silu(g) * u) @ self.wd[i]

    def forward(self, ids, caches, pos, causal):
        x = self.emb[ids]
        for i in range(self.m["layers"]):
            x = self.layer(i, x, caches[i][0], caches[i][1], pos, causal)
        return self.rms(x[:, -1]) @ self.head


KV_BUDGET = 48 << 30
rows = []
for name, m in MODELS.items():
    model = Model(m)
    kv_tok = 2 * m["layers"] * m["kv"] * m["hd"] * 2
    for B in (1, 8, 32, 128, 256):
        for C in (128, 1024, 4096, 16384):
            if B * (C + 1) * kv_tok > KV_BUDGET:
                continue
            caches = [
                (torch.randn(B, m["kv"], C + 1, m["hd"], dtype=torch.bfloat16, device=dev),
                 torch.randn(B, m["kv"], C + 1, m["hd"], dtype=torch.bfloat16, device=dev))
                for _ in range(m["layers"])
            ]
            ids = torch.randint(0, m["vocab"], (B, 1), device=dev)
            with torch.no_grad():
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(2):
                        model.forward(ids, caches, C, False)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    model.forward(ids, caches, C, False)
                t = med_time(g.replay, reps=30)
                t_eager = med_time(lambda: model.forward(ids, caches, C, False), reps=10)
            row = dict(model=name, kind="decode", batch=B, context=C, step_s=t, eager_step_s=t_eager)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del caches, g
            torch.cuda.empty_cache()
    for P in (128, 512, 2048, 8192):
        caches = [
            (torch.empty(1, m["kv"], P, m["hd"], dtype=torch.bfloat16, device=dev),
             torch.empty(1, m["kv"], P, m["hd"], dtype=torch.bfloat16, device=dev))
            for _ in range(m["layers"])
        ]
        ids = torch.randint(0, m["vocab"], (1, P), device=dev)
        with torch.no_grad():
            t = med_time(lambda: model.forward(ids, caches, 0, True), reps=10)
        row = dict(model=name, kind="prefill", batch=1, prompt=P, step_s=t)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del caches
    del model
    torch.cuda.empty_cache()
out["rows"] = rows
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "h100.json"), "w"), indent=1)

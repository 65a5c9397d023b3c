"""Stateful (non-CB) export on the CPU plugin: which allocations hold a hybrid model's linear-attention states?

Ground truth for docs/DESIGN.md §4c, independent of simkv's classifier: one memray session per operation;
after each operation every live posix_memalign buffer whose size equals a state's is read (ctypes) and
matched by content (sorted element values) with ``query_state()`` of each conv / ssm variable. Prints each
operation's allocations and frees of the buffers that ever held a state, with the state's name.

    python stateful_states.py DIR OPS [KEY=VALUE ...]
    python stateful_states.py out/qwen3next8 prefill:10,decode:2,fork:4,decode:2,select:2,decode:1
    python stateful_states.py out/qwen3next prefill:8,decode:1 INFERENCE_PRECISION_HINT=f32 DT=f32

DT is the states' runtime element type (bf16 on an AVX512-BF16 CPU, f32 with f32 inference).
Research only (simkv validate --ir does this with simkv/validate/openvino/statebufs.py).
"""
import ctypes
import os
import sys
import tempfile

import memray
import numpy as np
import openvino as ov

ir, ops_text = sys.argv[1], sys.argv[2]
cfg, dt = {"PERFORMANCE_HINT": "LATENCY"}, "bf16"
for kv in sys.argv[3:]:
    k, v = kv.split("=")
    if k == "DT":
        dt = v
    else:
        cfg[k] = v
cm = ov.Core().compile_model(ov.Core().read_model(ir + "/openvino_model.xml"), "CPU", cfg)
req = cm.create_infer_request()
names = {n for i in cm.inputs for n in i.get_names()}
ops = []
for tok in ops_text.split(","):
    k, _, v = tok.partition(":")
    ops += [("decode", 1)] * int(v) if k == "decode" else [(k, int(v) if v else 0)]


def short(name):
    return name.split("present.")[-1]


def sig_value(a):
    a = np.ascontiguousarray(a, dtype=np.float32).ravel()
    bits = {"bf16": lambda: (a.view(np.uint32) >> 16).astype(np.uint16),
            "f16": lambda: a.astype(np.float16).view(np.uint16), "f32": lambda: a.view(np.uint32)}[dt]()
    return np.sort(bits).tobytes()


def sig_memory(address, size):
    return np.sort(np.frombuffer(ctypes.string_at(address, size), dtype=np.uint32 if dt == "f32" else np.uint16)).tobytes()


events, descs, labels, live = {}, [], {}, {}  # live: address -> (size, site, born op)
length, batch, rng, tmp = 0, 1, np.random.default_rng(0), tempfile.mkdtemp()
for seq, (kind, n) in enumerate(ops):
    if kind != "reset":
        beam = {"fork": lambda: np.zeros(n, np.int32), "select": lambda: np.array([n], np.int32),
                "reorder": lambda: np.arange(batch, dtype=np.int32)[::-1].copy()}.get(kind, lambda: np.arange(batch, dtype=np.int32))()
        tokens = n if kind in ("prefill", "chat", "decode") else 1
        b = len(beam)
        feed = {"input_ids": rng.integers(5, 900, size=(b, tokens)).astype(np.int64),
                "attention_mask": np.ones((b, length + tokens), np.int64), "beam_idx": beam}
        if "position_ids" in names:
            feed["position_ids"] = np.tile(np.arange(length, length + tokens, dtype=np.int64), (b, 1))
    path = f"{tmp}/op{seq}.bin"
    with memray.Tracker(path, native_traces=True):
        req.reset_state() if kind == "reset" else req.infer(feed)
    descs.append("reset" if kind == "reset" else f"{kind}({n}) B{batch}->{b} L{length}->{length + tokens}")
    if kind == "reset":
        length, batch = 0, 1
    else:
        length, batch = length + tokens, b
    out = events.setdefault(seq, [])
    for r in memray.FileReader(path).get_allocation_records():
        a = memray.AllocatorType(r.allocator).name
        if a in ("FREE", "MUNMAP"):
            if r.address in live:
                size, site, born = live.pop(r.address)
                out.append(("-", size, site, r.address, born))
        elif a == "POSIX_MEMALIGN":
            live[r.address] = (r.size, r.native_stack_id, seq)
            out.append(("+", r.size, r.native_stack_id, r.address, seq))
        else:
            live.pop(r.address, None)
    os.remove(path)
    values = {short(s.name): s.state.data for s in req.query_state() if "conv" in s.name or "ssm" in s.name}
    for name, value in values.items():
        nbytes, sig = value.size * (4 if dt == "f32" else 2), sig_value(value)
        for address, (size, _site, born) in live.items():
            if size == nbytes and sig_memory(address, size) == sig and any(sig):
                labels.setdefault((address, born), set()).add(name)
for seq, desc in enumerate(descs):
    print(f"--- op {seq}: {desc}")
    for sign, size, site, address, born in events[seq]:
        name = labels.get((address, born))
        if name:
            print(f"    {sign}{size:>8} site {site:>6} @{address & 0xffffff:06x} born op {born} {sorted(name)}")

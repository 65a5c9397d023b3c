"""Check that generate() (cache built by generate itself) produces the same per-step cache allocation/free
sequence as the manual loop, for steps 0..3. Reads out/*_f32_generate_P6N3.txt and out/*_f32_dynamic_P6N12.txt
(produced by run_all.sh). Usage: python compare_generate_manual.py"""
import re
def events(path, maxstep):
    out, step = [], None
    for line in open(path):
        m = re.match(r"-- step (-?\d+)", line)
        if m:
            step = int(m.group(1)); continue
        if line.startswith("## ") and "cache events" not in line and out:
            break
        if step is not None and 0 <= step <= maxstep and re.match(r"\s+L\d+\s+[+-]", line):
            out.append((step, re.sub(r"\s+", " ", line.strip())))
    return out
for a in ["gemma3", "gpt_oss", "llama4", "qwen3_next", "deepseek_v3"]:
    g = events(f"out/{a}_f32_generate_P6N3.txt", 3)
    m = events(f"out/{a}_f32_dynamic_P6N12.txt", 3)
    print(f"{a:12s} generate == manual loop (cache events, steps 0-3): {g == m} ({len(g)} events)")

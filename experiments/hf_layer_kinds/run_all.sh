#!/bin/bash
# Reproduce every measurement in REPORT.md. Outputs go to out/. ~2 min on 2 cores.
set -e
cd "$(dirname "$0")"
PY=${PY:-python}
mkdir -p out
$PY verify_allocator.py            > out/verify_allocator.txt
$PY layer_map.py                   > out/layer_map.txt 2>&1
$PY config_derivation.py           > out/config_derivation.txt 2>&1
$PY gen_static_probe.py            > out/gen_static_probe.txt 2>&1
$PY compare_static_dynamic.py      > out/compare_static_dynamic.txt 2>&1
for a in gemma3 gpt_oss llama4 qwen3_next deepseek_v3; do
  for d in f32 bf16; do
    $PY trace_run.py $a --dtype $d -P 6 -N 12                              > out/${a}_${d}_dynamic_P6N12.txt 2>&1
    $PY trace_run.py $a --dtype $d -P 6 -N 12 --cache static --max-cache-len 24 > out/${a}_${d}_static_P6N12_M24.txt 2>&1
  done
  $PY trace_run.py $a -P 2 -N 6                                            > out/${a}_f32_dynamic_P2N6.txt 2>&1
  $PY trace_run.py $a -P 6 -N 3 --cache none --generate                    > out/${a}_f32_generate_P6N3.txt 2>&1
done
$PY trace_run.py gemma3     -B 2 -P 6 -N 2 --reorder                       > out/gemma3_f32_dynamic_B2_reorder.txt 2>&1
$PY trace_run.py gemma3     -B 2 -P 6 -N 2 --reorder --cache static --max-cache-len 12 > out/gemma3_f32_static_B2_reorder.txt 2>&1
$PY trace_run.py qwen3_next -B 2 -P 6 -N 2 --reorder                       > out/qwen3_next_f32_dynamic_B2_reorder.txt 2>&1
$PY trace_run.py qwen3_next -P 6 -N 3 --quiet-layers --all-events 2 --grep "qwen3_next.py:(329|33[0-9]|5[3-7][0-9]) |cu:" > out/qwen3_next_f32_step2_linear_transients.txt 2>&1
$PY trace_run.py deepseek_v3 -P 6 -N 3 --quiet-layers --all-events 2 --grep "deepseek_v3.py:(41[0-9]|42[0-4]|45[0-9]|46[0-3]) |cu:" > out/deepseek_v3_f32_step2_mla_transients.txt 2>&1
$PY trace_run.py gemma3 -P 6 -N 3 --quiet-layers --all-events 2 --grep "gemma3.py:(259|27[0-9]|28[0-9]|29[0-1]) |cu:" > out/gemma3_f32_step2_attn_transients.txt 2>&1
$PY trace_run.py gpt_oss -P 6 -N 3 --quiet-layers --all-events 2 --grep "gpt_oss.py:(23[0-9]|24[0-9]|25[0-5]) |cu:|moe.py" > out/gpt_oss_f32_step2_attn_moe.txt 2>&1
for P in 1 2 3 4 5 8; do $PY trace_run.py gemma3 -P $P -N 5 --quiet-layers > out/gemma3_f32_sliding_P${P}.txt 2>&1; done

$PY no_config_cache.py             > out/no_config_cache.txt 2>&1
$PY compare_generate_manual.py      > out/compare_generate_manual.txt 2>&1
echo done

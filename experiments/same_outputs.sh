#!/usr/bin/env bash
# Run a fixed set of `simkv` command lines (the README's examples, --json and ledger / step-table / request
# files, error paths, every --help) against one source tree and keep everything they print and write, so
# that a refactoring can be checked byte for byte against the tree it started from:
#
#   experiments/same_outputs.sh OLD_TREE /tmp/old && experiments/same_outputs.sh . /tmp/new && diff -r /tmp/old /tmp/new
#
# TREE is put first on PYTHONPATH; PY (default: python3) must have simkv's dependencies. Takes ~20 s here.
set -u
TREE=$(cd "$1" && pwd); OUT=$2; PY=${PY:-python3}
rm -rf "$OUT"; mkdir -p "$OUT"; cd "$OUT" || exit 2
export PYTHONPATH=$TREE COLUMNS=100 PYTHONHASHSEED=0
ln -s "$TREE/data/traces/azure_llm_2023_conv.csv" trace.csv  # one relative path in every output
T=trace.csv
i=0
run() { i=$((i+1)); "$PY" -m simkv.cli "$@" > "c$i.out" 2> "c$i.err"; echo "rc=$?" >> "c$i.out"; echo "$i: $*" >> cmds.txt; }
run run
run run --json
run run --help
run run --policy fixed
run run --policy openvino-cpu --precision u8 --model custom --layers 4 --kv-heads 8 --head-dim 64 --prompt 32 --decode 4200 --json
run run --policy fixed --policy-opt tokens=256 --json
run run --model llama-2-7b --turns 3 --turn-tokens 100 --beam 4 --json --ledger l3.csv
run run --ops prefill:512,decode:100,reset,prefill:64,decode:10 --policy openvino-gpu --policy-opt reset=keep --json
run run --ledger ledger.csv --engine reference --decode 300
run run --policy openvino-cpu --precision u4 --beam 3 --turns 2 --json --ledger l4.csv
run run --policy hf-dynamic --precision bf16 --model mistral-7b --decode 5000 --json
run run --policy exact --decode 500 --json
run run --policy hf-static --precision bf16 --decode 500 --policy-opt max_cache_len=4096 --json
run run --policy geometric --json --timeline tl.html
run run --trace $T --limit 2000 --model llama-2-7b --device h100-sxm --max-context 0 --steps steps.csv --requests requests.csv
run run --trace $T --limit 2000 --model llama-2-7b --device h100-sxm --max-context 0 --json
run run --trace $T --limit 300 --model llama-2-7b --device h100-sxm --max-context 0 --memory contiguous --policy openvino-gpu --json --steps steps2.csv --requests req2.csv
run run --trace $T --limit 500 --model llama-2-7b --device h100-sxm --max-context 0 --num-kv-blocks 3000 --prefix-caching --json
run run --trace $T --limit 500 --model llama-2-7b --device h100-sxm --max-context 0 --cache-size 2 --no-dynamic-split-fuse --json
run run --synthetic --requests 200 --rate 4 --seed 3 --json --steps steps3.csv
run run --synthetic --requests 100 --rate 4 --memory contiguous --policy openvino-cpu --json
run policies
run models
run devices
run cost
run cost --json
run run --model nope
run run --prompt -3
run validate --help
run sweep --help
run tune --help
run cost --help
run calibrate --help
run app --help
run sweep --policy fixed --param tokens=32:512:96 --param decode=200,400 --out sw.parquet --workers 1
run tune --trace $T --samples 40 --json --workers 1
run --help

#!/bin/bash
# bench_attention split check: the new file and the old (cuDNN SDPA only, no FA4 staged), 8,192 and 32,768 tokens
set -u
cp .devjob/old_bench_attention.py benchmarks/bench_attention_old.py
for f in bench_attention bench_attention_old; do
  echo "== $f"; python3 benchmarks/$f.py --seq_lens 8192,32768 --reps 3 --out $OUT/$f 2>&1 | tail -4
done

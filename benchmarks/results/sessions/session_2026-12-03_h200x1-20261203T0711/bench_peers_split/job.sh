#!/bin/bash
# bench_peers split check: the peers' worker after the split (fe0c097) and before (0cb3915), qwen3-tiny, 1 GPU
set -u
for v in new old; do
  f=benchmarks/bench_peers.py; c=fe0c097
  [[ $v == old ]] && { cp .devjob/old_bench_peers.py benchmarks/bench_peers_old.py; f=benchmarks/bench_peers_old.py; c=0cb3915; }
  echo "== $(date -u +%T) $v $f"
  python3 $f --systems trl_fsdp2_cp,alst --model qwen3-tiny --seq_len 4096 --gpus 1 --steps 3 --session smoke_$v \
    --out $OUT/$v --commit $c --timeout_s 150 2>&1 | tail -5
done
echo "== $(date -u +%T) done"

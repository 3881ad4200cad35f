#!/bin/bash
# Device job, session of 2026-12-03 05:00 (issue 27), at main 5fa5529:
# 1. the longest 8x80 GB plan, 4 of 36 layers ([0, 17, 34, 35]) (~14 min: build 70 s, ~6 min a step)
# 2. the rehearse GPU test (~2 min; layer_clock/rehearsal_rank changed since its last run)
# 3. if time is left: the 262k check with the new rules, 4 layers against all 36, same tree (~4 min)
set -u
RES=/tmp/res; mkdir -p $RES
C=5fa5529
P=benchmarks/results/sessions/session_2026-12-03_h200x1-20261203T0235/qwen3-8b_max_8x80gb_1024gb/run.yaml
RES=$RES bash benchmarks/bench_rehearse.sh $C $P:0:4 gpu_test
mkdir -p $RES/offload_check
RES=$RES/offload_check REHEARSE_ARGS="--seq_len 262144" bash benchmarks/bench_rehearse.sh $C $P:0:4 $P:0

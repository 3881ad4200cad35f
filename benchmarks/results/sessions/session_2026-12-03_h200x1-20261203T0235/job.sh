#!/bin/bash
# Device job, session 2026-12-03, after the first machine was taken away (tree be970f5, issue 27), on the device time
# left (~13 min): the rehearse GPU test, then the offloaded-layer extrapolation check of the longest 8x80 GB plan's
# config at 262,144 tokens: 3 of 36 layers against all 36, same tree. The longest length itself (~11 min) waits for
# the next session's device time.
set -u
RES=/tmp/res; mkdir -p $RES
S=benchmarks/results/sessions/session_2026-12-03_h200x1-20261203T0235
RES=$RES bash benchmarks/bench_rehearse.sh be970f5 gpu_test
mkdir -p $RES/offload_check
RES=$RES/offload_check REHEARSE_ARGS="--seq_len 262144" bash benchmarks/bench_rehearse.sh be970f5 \
  $S/qwen3-8b_max_8x80gb_1024gb/run.yaml:0:3 $S/qwen3-8b_max_8x80gb_1024gb/run.yaml:0

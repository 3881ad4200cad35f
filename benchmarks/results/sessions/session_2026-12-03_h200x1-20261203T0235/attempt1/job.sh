#!/bin/bash
# Device job, session 2026-12-03 (tree be970f5, issue 27): the planner's longest 8x80 GB plan (3 of 36 layers), the full
# 8x141 rank for the --layers check, the rehearse GPU test, then the offloaded-layer extrapolation check at 262,144.
set -u
RES=/tmp/res; mkdir -p $RES
C=be970f5
S=benchmarks/results/sessions/session_2026-12-03_h200x1-20261203T0235
RES=$RES bash benchmarks/bench_rehearse.sh $C $S/qwen3-8b_max_8x80gb_1024gb/run.yaml:0:3 qwen3-8b_1m_8x141gb:0 gpu_test
mkdir -p $RES/offload_check
RES=$RES/offload_check REHEARSE_ARGS="--seq_len 262144" bash benchmarks/bench_rehearse.sh $C \
  $S/qwen3-8b_max_8x80gb_1024gb/run.yaml:0:3 $S/qwen3-8b_max_8x80gb_1024gb/run.yaml:0

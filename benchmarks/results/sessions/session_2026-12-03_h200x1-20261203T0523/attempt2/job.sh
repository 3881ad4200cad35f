#!/bin/bash
# Device job, session of 2026-12-03 05:00 (issue 27), at main 5fa5529, with ~900 s of device time left:
# 1. the longest 8x80 GB plan, 3 of 36 layers ([0, 34, 35]) (~11 min: build 61 s, ~4.6 min a step)
#    (4 layers took 350.7 s for step 1 this session; two of those do not fit the budget left)
# 2. the rehearse GPU test (~2 min) if the budget lasts
set -u
RES=/tmp/res; mkdir -p $RES
C=5fa5529
P=benchmarks/results/sessions/session_2026-12-03_h200x1-20261203T0235/qwen3-8b_max_8x80gb_1024gb/run.yaml
RES=$RES bash benchmarks/bench_rehearse.sh $C $P:0:3 gpu_test

#!/bin/bash
# Device job for the next session (issue 27). Replace COMMIT with main's short sha at the start of that session.
# Budget: stage (~50 s) + call 2 (590 s) + call 3 (~250 s) = ~900 s; make call 3 at once (a machine idle 30 s is gone).
# 1. the longest 8x80 GB plan, 4 of 36 layers ([0, 17, 34, 35]): build 61-77 s, step 1 351 s, step 2 ~350 s
#    (each step now logs its extrapolation against the plan, so a lost machine still leaves step 1's numbers)
# 2. the rehearse GPU test (~2.5 min)
# 3. if time is left: the 262k check, 4 layers against all 36, same tree (~4 min)
set -u
RES=/tmp/res; mkdir -p $RES
C=47e3140
P=benchmarks/results/sessions/session_2026-12-03_h200x1-20261203T0235/qwen3-8b_max_8x80gb_1024gb/run.yaml
RES=$RES bash benchmarks/bench_rehearse.sh $C $P:0:4 gpu_test
mkdir -p $RES/offload_check
RES=$RES/offload_check REHEARSE_ARGS="--seq_len 262144" bash benchmarks/bench_rehearse.sh $C $P:0:4 $P:0

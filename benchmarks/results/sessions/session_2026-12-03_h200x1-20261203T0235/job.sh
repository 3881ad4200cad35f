#!/bin/bash
# Device job, session 2026-12-03, second machine (tree be970f5, issue 27): the planner's longest 8x80 GB plan, 3 of
# 36 layers (~11 min). The first machine was taken away after its step 1 (attempt1/).
set -u
RES=/tmp/res; mkdir -p $RES
S=benchmarks/results/sessions/session_2026-12-03_h200x1-20261203T0235
RES=$RES bash benchmarks/bench_rehearse.sh be970f5 $S/qwen3-8b_max_8x80gb_1024gb/run.yaml:0:3

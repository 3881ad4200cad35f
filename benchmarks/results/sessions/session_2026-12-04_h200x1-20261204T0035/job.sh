#!/usr/bin/env bash
# This session's GPU job (one H200): the GPU tests that exercise what changed on the CPU side (the step's loss
# weights and micro-batches, the lr scheduler, the checkpoint save, the rehearsal's timed step). Run from a copy in
# /tmp/proj so a detached job survives the next call's fresh tree:
#   call 1: bash benchmarks/results/sessions/session_2026-12-04_h200x1-20261204T0035/job.sh start
#   call 2: bash benchmarks/results/sessions/session_2026-12-04_h200x1-20261204T0035/job.sh wait
set -uo pipefail
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:/tmp/proj PYTHONUNBUFFERED=1
RUN_DIR=/tmp/gputests
if [[ ${1:-start} == start ]]; then
  bash .whl/install.sh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
  rm -rf /tmp/proj && mkdir -p /tmp/proj && cp -r . /tmp/proj && cd /tmp/proj
  git rev-parse --short HEAD > /tmp/commit.txt 2>/dev/null || true
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  RUN_DIR=$RUN_DIR bash launch/detach.sh python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py \
    tests/gpu/test_checkpoint_gpu.py tests/gpu/test_rehearse_gpu.py --durations=15
fi
cd /tmp/proj
RUN_DIR=$RUN_DIR bash launch/wait.sh 520; rc=$?
cp $RUN_DIR/log "$OUT/gpu_tests.log" 2>/dev/null
exit $rc

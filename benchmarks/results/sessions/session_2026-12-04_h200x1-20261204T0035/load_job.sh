#!/usr/bin/env bash
# The host peak of loading a Qwen3-8B-sized checkpoint directory into ZeRO-3 partitions, 8 ranks on one node
# (gloo ranks on the device's 16 cores and 128 GB: one GPU cannot hold 8 NCCL ranks). Two calls:
#   call 1: bash .../load_job.sh start COMMIT      call 2: bash .../load_job.sh wait
set -uo pipefail
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:/tmp/proj PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
RUN_DIR=/tmp/loadjob
if [[ ${1:-start} == start ]]; then
  bash .whl/install.sh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
  rm -rf /tmp/proj && mkdir -p /tmp/proj /tmp/loadout && cp -r . /tmp/proj && cd /tmp/proj
  OUT=/tmp/loadout RUN_DIR=$RUN_DIR bash launch/detach.sh python benchmarks/bench_load.py --geometry qwen3-8b \
    --nproc 8 --dir /tmp/qwen3-8b-hf --cpu --commit "$2"
fi
cd /tmp/proj
RUN_DIR=$RUN_DIR bash launch/wait.sh 540; rc=$?
cp /tmp/loadout/load.jsonl /tmp/loadout/load.log "$OUT/" 2>/dev/null; cp $RUN_DIR/log "$OUT/load_job.log"
exit $rc

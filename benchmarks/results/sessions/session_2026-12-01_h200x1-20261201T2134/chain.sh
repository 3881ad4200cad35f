#!/bin/bash
# session 12 (2026-12-01 evening), 1 x H200: tests/gpu beside four held-out validate runs, one after another
set -uo pipefail
rm -rf /tmp/snap && mkdir -p /tmp/snap && cp -a "$PWD"/. /tmp/snap/ && rm -rf /tmp/snap/.whl /tmp/snap/.sdist /tmp/snap/.fa4b
cd /tmp/snap
C=cb8a57b
E=benchmarks/results/planner_predictions_2026-12-01e.jsonl
J=benchmarks/results/planner_predictions_2026-12-01j.jsonl
RES=/tmp/res/gt RUN_DIR=/tmp/s_gt launch/detach.sh bash benchmarks/gpu_session.sh $C gpu_tests
cat > /tmp/val.sh <<EOS
cd /tmp/snap
GPUS=1 PREDICTIONS=$E VALIDATE_PLANS=279552:64:model=qwen3-4b+host_mem_gb=120 bash benchmarks/gpu_session.sh $C validate
GPUS=1 PREDICTIONS=$J VALIDATE_PLANS=92160:80:model=qwen3-4b+host_mem_gb=64 bash benchmarks/gpu_session.sh $C validate
GPUS=1 PREDICTIONS=$J VALIDATE_PLANS=112640:40:model=qwen3-1.7b+host_mem_gb=32 bash benchmarks/gpu_session.sh $C validate
GPUS=1 PREDICTIONS=$E VALIDATE_PLANS=326656:80:model=qwen3-4b+host_mem_gb=120 bash benchmarks/gpu_session.sh $C validate
EOS
cp /tmp/val.sh /tmp/res/chain_val.sh 2>/dev/null || { mkdir -p /tmp/res; cp /tmp/val.sh /tmp/res/chain_val.sh; }
RES=/tmp/res RUN_DIR=/tmp/s_val launch/detach.sh bash /tmp/val.sh
sleep 20; tail -5 /tmp/s_val/log /tmp/s_gt/log

#!/bin/bash
# session 13 (2026-12-01 night), 1 x H200: three held-out validate runs one after another
# (l: 4B 92160:80 and 8B 96256:141; e: 4B 326656:80)
set -uo pipefail
rm -rf /tmp/snap && mkdir -p /tmp/snap && cp -a "$PWD"/. /tmp/snap/ && rm -rf /tmp/snap/.whl /tmp/snap/.sdist /tmp/snap/.fa4b
cd /tmp/snap
C=799e2ac
L=benchmarks/results/planner_predictions_2026-12-01l.jsonl
E=benchmarks/results/planner_predictions_2026-12-01e.jsonl
mkdir -p /tmp/res
cat > /tmp/val.sh <<EOS
cd /tmp/snap
nvidia-smi --query-gpu=name,memory.total --format=csv > /tmp/res/env.txt; free -g >> /tmp/res/env.txt; nproc >> /tmp/res/env.txt
GPUS=1 PREDICTIONS=$L,$E VALIDATE_PLANS=92160:80:model=qwen3-4b+host_mem_gb=64,96256:141:host_mem_gb=128,326656:80:model=qwen3-4b+host_mem_gb=120 bash benchmarks/gpu_session.sh $C validate
EOS
cp /tmp/val.sh /tmp/res/chain_val.sh; cp "$0" /tmp/res/chain.sh 2>/dev/null || true
RES=/tmp/res RUN_DIR=/tmp/s_val launch/detach.sh bash /tmp/val.sh
sleep 30; tail -5 /tmp/s_val/log

#!/bin/bash
# session 14 (2026-12-02), 1 x H200: the 8B's longest on 1 x 141 GB + 128 GB (prediction 2026-12-02, held out) alone;
# then pytest tests/gpu in two concurrent processes (test_gpu.py | the attention and fused-ops files, MASTER_PORT apart)
# beside g's 0.6B at 354,304 on 20 GB + 40 GB (held out). Peaks are per process (max_memory_reserved, ru_maxrss).
set -uo pipefail
rm -rf /tmp/snap && mkdir -p /tmp/snap && cp -a "$PWD"/. /tmp/snap/ && rm -rf /tmp/snap/.whl /tmp/snap/.sdist /tmp/snap/.fa4b
cd /tmp/snap
C=0e2d329
mkdir -p /tmp/res
cat > /tmp/val.sh <<EOS
cd /tmp/snap
nvidia-smi --query-gpu=name,memory.total --format=csv > /tmp/res/env.txt; free -g >> /tmp/res/env.txt; nproc >> /tmp/res/env.txt
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-02.jsonl VALIDATE_PLANS=156672:141:host_mem_gb=128 bash benchmarks/gpu_session.sh $C validate
echo "== \$(date -u +%H:%M:%S) gpu tests start" >> /tmp/res/session.txt
MASTER_PORT=29611 python3 -m pytest -q -rs -p no:cacheprovider --durations=20 tests/gpu/test_gpu.py > /tmp/res/gpu_tests_a.log 2>&1 &
MASTER_PORT=29622 python3 -m pytest -q -rs -p no:cacheprovider --durations=20 tests/gpu/test_attention_gpu.py tests/gpu/test_fused_ops_gpu.py > /tmp/res/gpu_tests_b.log 2>&1 &
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01g.jsonl VALIDATE_PLANS=354304:20:model=qwen3-0.6b+host_mem_gb=40 bash benchmarks/gpu_session.sh $C validate
wait
echo "== \$(date -u +%H:%M:%S) gpu tests done" >> /tmp/res/session.txt
tail -3 /tmp/res/gpu_tests_a.log /tmp/res/gpu_tests_b.log
EOS
cp /tmp/val.sh /tmp/res/chain_val.sh; cp "$0" /tmp/res/chain.sh 2>/dev/null || true
RES=/tmp/res RUN_DIR=/tmp/s_val launch/detach.sh bash /tmp/val.sh
sleep 20; tail -5 /tmp/s_val/log

cd /tmp/snap
nvidia-smi --query-gpu=name,memory.total --format=csv > /tmp/res/env.txt; free -g >> /tmp/res/env.txt; nproc >> /tmp/res/env.txt
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-02.jsonl VALIDATE_PLANS=156672:141:host_mem_gb=128 bash benchmarks/gpu_session.sh 0e2d329 validate
echo "== $(date -u +%H:%M:%S) gpu tests start" >> /tmp/res/session.txt
MASTER_PORT=29611 python3 -m pytest -q -rs -p no:cacheprovider --durations=20 tests/gpu/test_gpu.py > /tmp/res/gpu_tests_a.log 2>&1 &
MASTER_PORT=29622 python3 -m pytest -q -rs -p no:cacheprovider --durations=20 tests/gpu/test_attention_gpu.py tests/gpu/test_fused_ops_gpu.py > /tmp/res/gpu_tests_b.log 2>&1 &
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01g.jsonl VALIDATE_PLANS=354304:20:model=qwen3-0.6b+host_mem_gb=40 bash benchmarks/gpu_session.sh 0e2d329 validate
wait
echo "== $(date -u +%H:%M:%S) gpu tests done" >> /tmp/res/session.txt
tail -3 /tmp/res/gpu_tests_a.log /tmp/res/gpu_tests_b.log

cd /tmp/snap
nvidia-smi --query-gpu=name,memory.total --format=csv > /tmp/res/env.txt; free -g >> /tmp/res/env.txt; nproc >> /tmp/res/env.txt
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01l.jsonl,benchmarks/results/planner_predictions_2026-12-01e.jsonl VALIDATE_PLANS=92160:80:model=qwen3-4b+host_mem_gb=64,96256:141:host_mem_gb=128,326656:80:model=qwen3-4b+host_mem_gb=120 bash benchmarks/gpu_session.sh 799e2ac validate

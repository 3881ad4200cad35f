cd /tmp/snap
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01e.jsonl VALIDATE_PLANS=279552:64:model=qwen3-4b+host_mem_gb=120 bash benchmarks/gpu_session.sh cb8a57b validate
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01j.jsonl VALIDATE_PLANS=92160:80:model=qwen3-4b+host_mem_gb=64 bash benchmarks/gpu_session.sh cb8a57b validate
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01j.jsonl VALIDATE_PLANS=112640:40:model=qwen3-1.7b+host_mem_gb=32 bash benchmarks/gpu_session.sh cb8a57b validate
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01e.jsonl VALIDATE_PLANS=326656:80:model=qwen3-4b+host_mem_gb=120 bash benchmarks/gpu_session.sh cb8a57b validate
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01j.jsonl VALIDATE_PLANS=96256:141:host_mem_gb=128 bash benchmarks/gpu_session.sh cb8a57b validate

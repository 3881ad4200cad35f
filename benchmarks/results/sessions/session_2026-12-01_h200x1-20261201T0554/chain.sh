GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01e.jsonl VALIDATE_PLANS=274432:40:model=qwen3-1.7b+host_mem_gb=60,259072:20:model=qwen3-0.6b+host_mem_gb=40 bash benchmarks/gpu_session.sh 93dd38e validate
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01g.jsonl VALIDATE_PLANS=292864:40:model=qwen3-1.7b+host_mem_gb=60 bash benchmarks/gpu_session.sh 93dd38e validate
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01i.jsonl VALIDATE_PLANS=362496:20:model=qwen3-0.6b+host_mem_gb=40 bash benchmarks/gpu_session.sh 93dd38e validate
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01e.jsonl VALIDATE_PLANS=279552:64:model=qwen3-4b+host_mem_gb=120 bash benchmarks/gpu_session.sh 93dd38e validate
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01g.jsonl VALIDATE_PLANS=354304:20:model=qwen3-0.6b+host_mem_gb=40 bash benchmarks/gpu_session.sh 93dd38e validate
GPUS=1 PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01e.jsonl VALIDATE_PLANS=326656:80:model=qwen3-4b+host_mem_gb=120 bash benchmarks/gpu_session.sh 93dd38e validate

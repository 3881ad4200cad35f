#!/bin/bash
# session 12, last device minutes: the GPU test of the pinned-cache rule beside the held-out run of prediction k
set -uo pipefail
mkdir -p $OUT/res
python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_gpu.py -k pinned_cache > $OUT/res/pinned_cache_test.log 2>&1 &
GPUS=1 RES=$OUT/res PREDICTIONS=benchmarks/results/planner_predictions_2026-12-01k.jsonl \
  VALIDATE_PLANS=65536:40:model=qwen3-1.7b+host_mem_gb=24 bash benchmarks/gpu_session.sh 3a87e3e validate
wait
tail -3 $OUT/res/pinned_cache_test.log

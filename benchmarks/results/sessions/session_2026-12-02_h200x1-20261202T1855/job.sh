#!/bin/bash
# Device job for session 2026-12-02 18:45 (tree f5e072d): GPU tests in two parallel groups, then rehearsals.
set -u
RES=/tmp/res; mkdir -p $RES
echo "== $(date -u +%H:%M:%S) gpu tests (two groups side by side)"
python3 -m pytest -q tests/gpu/test_gpu.py tests/gpu/test_rehearse_gpu.py --durations=30 > $RES/gpu_tests_a.log 2>&1 &
a=$!
python3 -m pytest -q tests/gpu/test_attention_gpu.py tests/gpu/test_fused_ops_gpu.py tests/gpu/test_checkpoint_gpu.py --durations=30 > $RES/gpu_tests_b.log 2>&1 &
b=$!
wait $a; echo "group a rc $? $(tail -1 $RES/gpu_tests_a.log)"
wait $b; echo "group b rc $? $(tail -1 $RES/gpu_tests_b.log)"
echo "== $(date -u +%H:%M:%S) plan longest 8x80"
python3 -m ds_longctx.cli plan --model qwen3-8b --gpus 8 --gpu_mem_gb 80 --host_mem_gb 1024 --find_max_len \
  --out runs/longest_8x80gb > $RES/longest_plan.log 2>&1; echo "plan rc $?"
cp -r runs/longest_8x80gb $RES/
RES=$RES bash benchmarks/bench_rehearse.sh f5e072d qwen3-8b_1m_2x8x80gb:8 qwen3-8b_max_2x141gb:0:3 \
  qwen3-8b_max_4x80gb:0:3 runs/longest_8x80gb/run.yaml:0:3

#!/bin/bash
# Device job, session 2026-12-02 22:56 (tree 3fced72): the rehearsal GPU test, then the rehearsals issue 27 still needs.
set -u
RES=/tmp/res; mkdir -p $RES
export DS_LONGCTX_COMMIT=3fced72
echo "== $(date -u +%H:%M:%S) pytest tests/gpu/test_rehearse_gpu.py"
python3 -m pytest -q tests/gpu/test_rehearse_gpu.py --durations=5 > $RES/gpu_test_rehearse.log 2>&1
echo "rc $? $(tail -1 $RES/gpu_test_rehearse.log)"
RES=$RES bash benchmarks/bench_rehearse.sh 3fced72 qwen3-8b_1m_2x8x80gb:8 qwen3-8b_max_2x141gb:0:3 qwen3-8b_max_4x80gb:0:3 \
  qwen3-8b_1m_8x141gb:0:6

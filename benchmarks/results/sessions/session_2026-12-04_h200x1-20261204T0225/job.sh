#!/usr/bin/env bash
# This session's GPU job (one H200), detached from a copy in /tmp/proj so it outlives each call:
#   call 1: carry [".fa4a"]                             bash .fa4a/stage.sh
#   call 2: carry [".whl", ".sdist", ".fa4b"]           bash <this> start
#   call 3..: carry [".whl", ".sdist", ".fa4b"]         bash <this> wait          (until rc appears)
# Order: 2, the rehearsal test, 3, then the rest of 1 (a first machine idled out after 10 min of this job).
# 1. GPU tests touched by this tree since the last full GPU run (2616a8c: test_gpu, test_checkpoint_gpu,
#    test_rehearse_gpu, 19 passed): the rehearsal (rehearsal_rank changed), the attention and fused-op kernels
#    (not run last session), and test_gpu's lever-vs-HF, varlen and chunked-loss tests (labels now come from the
#    rows). The checkpoint, offload and optimizer-state tests cover code unchanged since 2616a8c.
# 2. Qwen3-4B at 131,072 tokens on one H200: ds_longctx (plan defaults, FA4) beside ALST's single-GPU recipe.
# 3. A masked step against an unmasked one: Qwen3-0.6B geometry, 131,072 tokens, 10% of tokens trained.
set -uo pipefail
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/proj PYTHONUNBUFFERED=1
RUN_DIR=/tmp/job RES=/tmp/res
here=$(dirname "$0")
if [[ ${1:-start} == start ]]; then
  { bash .whl/install.sh && bash .fa4b/install.sh; } > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
  rm -rf /tmp/proj $RES && mkdir -p /tmp/proj $RES && cp -r . /tmp/proj && cd /tmp/proj
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  RUN_DIR=$RUN_DIR bash launch/detach.sh bash "$here/job.sh" run
  cd - > /dev/null
elif [[ $1 == run ]]; then
  cd /tmp/proj
  python benchmarks/bench_peers.py --systems ds_longctx,alst --model qwen3-4b --seq_len 131072 --gpus 1 --steps 3 \
    --session h200x1-20261204T0225 --out $RES/peers \
    --ds_longctx_args "--config /tmp/proj/benchmarks/results/sessions/session_2026-12-04_h200x1-20261204T0225/plan_qwen3-4b_131072_1x141/run.yaml" > $RES/peers.log 2>&1
  echo "peers rc $?"
  python -m pytest -q -p no:cacheprovider tests/gpu/test_rehearse_gpu.py > $RES/gpu_test_rehearse.log 2>&1
  echo "rehearse test rc $?"
  python benchmarks/bench_masked_step.py --model qwen3-0.6b --seq_len 131072 --steps 4 --out $RES/masked \
    --train_args "--config /tmp/proj/benchmarks/results/sessions/session_2026-12-04_h200x1-20261204T0225/plan_qwen3-0.6b_131072_1x141/run.yaml" \
    > $RES/masked.log 2>&1
  echo "masked rc $?"
  python -m pytest -q -p no:cacheprovider --durations=20 tests/gpu/test_attention_gpu.py \
    tests/gpu/test_fused_ops_gpu.py "tests/gpu/test_gpu.py::test_every_lever_on_gpu_matches_plain_hf" \
    "tests/gpu/test_gpu.py::test_packed_varlen_matches_per_document" \
    "tests/gpu/test_gpu.py::test_chunked_loss_cuda_matches_plain" > $RES/gpu_tests.log 2>&1
  echo "gpu tests rc $?"
  exit 0
fi
cd /tmp/proj 2>/dev/null || exit 1
RUN_DIR=$RUN_DIR bash launch/wait.sh ${WAIT_S:-540}; rc=$?
cp $RUN_DIR/log "$OUT/job.log" 2>/dev/null; cp $RES/gpu_tests.log "$OUT/" 2>/dev/null
tar czf "$OUT/res.tgz" -C $RES . 2>/dev/null
exit $rc

#!/usr/bin/env bash
# This session's GPU job (one H200), detached from a copy in /tmp/proj so it outlives each call:
#   call 1: carry [".fa4a"]                           bash .fa4a/stage.sh
#   call 2: carry [".whl", ".sdist", ".fa4b"]         bash .whl/install.sh && bash .fa4b/install.sh
#   call 3: carry [".flaa"]                           bash .flaa/install.sh
#   call 4: carry [".flab"]                           bash <this> start
#   call 5..: no carry                                bash <this> wait   (until rc appears)
# Steps, most needed first, each under its own timeout (what finished comes back with every wait):
#  1. issue 43: a 2-process CPU checkpoint resumed on 1 GPU (tests/gpu/test_reshard_gpu.py)
#  2. issue 44: the gated-delta layer against the full-attention layer, 131,072 and 1,048,576 tokens
#  3. issue 44: FLA against the torch path, and the hybrid engine against plain HF (tests/gpu/test_qwen3_5_gpu.py)
#  4. issue 45: Qwen3-30B-A3B, 4 of 48 layers at full width, planned for 1 x 141 GB at 131,072 tokens, 3 steps
#  5. issue 44: Qwen3.5-4B planned for 1 x 141 GB at 131,072 tokens, 3 steps
#  6. rehearsals of the committed 1M configs (each rank role, 4 layers): 30B-A3B 8x80, Qwen3.5-4B 8x80 / 8x141
#  7. issue 44: Qwen3.5-4B at the longest length its plan finds for 1 x 141 GB (301,056; ~190 s predicted), 1 step
#  8. the GPU tests not run since 2616a8c (checkpoint, offload, optimizer state, rehearse)
#  9. issue 45: the 4-layer 30B-A3B at its longest for 1 x 141 GB (1,375,232 tokens, ~446 s predicted), 1 step
set -uo pipefail
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/proj
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
RUN_DIR=/tmp/job RES=/tmp/res
here=$(cd "$(dirname "$0")" && pwd)
if [[ ${1:-start} == start ]]; then
  bash .flab/install.sh > /tmp/install_fla.log 2>&1; tail -2 /tmp/install_fla.log
  rm -rf /tmp/proj $RES && mkdir -p /tmp/proj $RES && cp -r . /tmp/proj && cd /tmp/proj
  rm -rf .fa4a .fa4b .flaa .flab .whl .sdist
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  RUN_DIR=$RUN_DIR bash launch/detach.sh bash "/tmp/proj/${here#$OLDPWD/}/job.sh" run
  exit 0
elif [[ $1 == run ]]; then
  cd /tmp/proj
  step() { local name=$1 limit=$2; shift 2; echo "== $name $(date +%T)"
           timeout "$limit" "$@" > "$RES/$name.log" 2>&1; echo "$name rc $? $(date +%T)"; }
  cat > /tmp/plan_train.sh <<'SH'
name=$1 steps=$2; shift 2  # name steps plan-args...: plan for 1 x 141 GB, then train on it
python -m ds_longctx.cli plan "$@" --gpus 1 --gpu_mem_gb 141 --out "$RES/$name/plan" && \
  python -m ds_longctx.cli train --nproc 1 --config "$RES/$name/plan/run.yaml" --steps "$steps" \
    --output_dir "$RES/$name/run"
SH
  export RES
  python - <<'PY'
import json
cfg = json.load(open("ds_longctx/models/qwen3-30b-a3b.json"))
cfg["num_hidden_layers"] = 4
json.dump(cfg, open("/tmp/qwen3-30b-a3b-4layers.json", "w"))
PY
  step reshard_gpu 300 python -m pytest -q -s -p no:cacheprovider tests/gpu/test_reshard_gpu.py
  step linear_attention 600 python benchmarks/bench_linear_attention.py --seq_lens 131072,1048576 --out $RES \
    --commit $COMMIT
  step qwen35_kernels 600 python -m pytest -q -s -p no:cacheprovider tests/gpu/test_qwen3_5_gpu.py \
    -k "matches_the_torch_path or matches_plain_hf"
  step moe_131k 600 bash /tmp/plan_train.sh moe_131k 3 --model /tmp/qwen3-30b-a3b-4layers.json --seq_len 131072
  step qwen35_131k 600 bash /tmp/plan_train.sh qwen35_131k 3 --model qwen3.5-4b --seq_len 131072
  for c in qwen3-30b-a3b_1m_8x80gb qwen3.5-4b_1m_8x80gb qwen3.5-4b_1m_8x141gb; do
    step "rehearse_$c" 900 python -m ds_longctx.cli rehearse --config ds_configs/$c/run.yaml --rank roles --layers 4 \
      --out $RES/rehearsal_$c.jsonl
  done
  step qwen35_longest 900 bash /tmp/plan_train.sh qwen35_longest 1 --model qwen3.5-4b --find_max_len
  step gpu_tests 1500 python -m pytest -q -p no:cacheprovider --durations=20 tests/gpu/test_checkpoint_gpu.py \
    tests/gpu/test_gpu.py tests/gpu/test_rehearse_gpu.py
  step moe_longest 1200 bash /tmp/plan_train.sh moe_longest 1 --model /tmp/qwen3-30b-a3b-4layers.json --find_max_len
  exit 0
fi
cd /tmp/proj 2>/dev/null || exit 1
RUN_DIR=$RUN_DIR bash launch/wait.sh ${WAIT_S:-540}; rc=$?
cp $RUN_DIR/log "$OUT/job.log" 2>/dev/null
tar czf "$OUT/res.tgz" --exclude='*.pt' --exclude='checkpoints' -C $RES . 2>/dev/null
exit $rc

#!/usr/bin/env bash
# This session's GPU job (one H200), detached from a copy in /tmp/proj so it outlives each call:
#   call 1: carry [".fa4a"]                           bash .fa4a/stage.sh
#   call 2: carry [".whl", ".sdist", ".fa4b"]         bash .whl/install.sh && bash .fa4b/install.sh
#   call 3: carry [".flaa"]                           bash .flaa/install.sh
#   call 4: carry [".flab"]                           COMMIT=<sha> bash <this> start
#   call 5..: no carry                                bash <this> wait   (until rc appears)
# Steps, most needed first, each under its own timeout (what finished comes back with every wait):
#  1. issue 45: rehearse ds_configs/qwen3-30b-a3b_1m_8x80gb_1024gb, each rank role, 4 of 48 layers
#  2. issue 45: Qwen3-30B-A3B at full width, 1 layer, at the longest length its plan finds for 1 x 141 GB, 1 step
#  3. issue 44: rehearse ds_configs/qwen3.5-4b_1m_8x80gb, each rank role, 4 of 32 layers (one of each kind)
#  4. issue 44: rehearse ds_configs/qwen3.5-4b_1m_8x141gb, each rank role, 2 of 32 layers (one of each kind)
#  5. issue 44: Qwen3.5-4B at the longest length its plan finds for 1 x 141 GB, 1 step
#  6. GPU tests of the placement budget path (a world of one rehearsed against its real run; every lever vs HF)
# FLA's Triton autotune results are kept on disk (TRITON_CACHE_AUTOTUNING=1), so only the first Qwen3.5 process tunes.
set -uo pipefail
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/proj
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown} TRITON_CACHE_AUTOTUNING=1
export DS_LONGCTX_COMMIT=$COMMIT
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
cfg["num_hidden_layers"] = 1
json.dump(cfg, open("/tmp/qwen3-30b-a3b-1layer.json", "w"))
PY
  rehearse() { local c=$1 k=$2; step "rehearse_$c" 1200 python -m ds_longctx.cli rehearse \
    --config ds_configs/$c/run.yaml --rank roles --layers "$k" --out "$RES/rehearsal_$c.jsonl"; }
  rehearse qwen3-30b-a3b_1m_8x80gb_1024gb 4
  step moe_longest 900 bash /tmp/plan_train.sh moe_longest 1 --model /tmp/qwen3-30b-a3b-1layer.json --find_max_len
  rehearse qwen3.5-4b_1m_8x80gb 4
  rehearse qwen3.5-4b_1m_8x141gb 2
  step qwen35_longest 900 bash /tmp/plan_train.sh qwen35_longest 1 --model qwen3.5-4b --find_max_len
  step gpu_tests 900 python -m pytest -q -p no:cacheprovider --durations=10 \
    "tests/gpu/test_rehearse_gpu.py::test_a_world_of_one_rehearsed_peaks_as_the_real_run" \
    "tests/gpu/test_gpu.py::test_every_lever_on_gpu_matches_plain_hf"
  exit 0
fi
cd /tmp/proj 2>/dev/null || exit 1
RUN_DIR=$RUN_DIR bash launch/wait.sh ${WAIT_S:-540}; rc=$?
cp $RUN_DIR/log "$OUT/job.log" 2>/dev/null
tar czf "$OUT/res.tgz" --exclude='*.pt' --exclude='checkpoints' -C $RES . 2>/dev/null
exit $rc

#!/usr/bin/env bash
# One device session's GPU work on one H200, as stages run in order, detached from a copy in /tmp/proj so it outlives
# each call; what finished comes back with every `wait` (tar of /tmp/res under $OUT). Calls, back to back:
#   1: carry [".fa4a"]                    bash .fa4a/stage.sh
#   2: carry [".whl", ".sdist", ".fa4b"]  bash .whl/install.sh; bash .fa4b/install.sh
#   3: carry [".flaa"]                    bash .flaa/install.sh              (FLA: only for the qwen35_* stages)
#   4: carry [".flab"]                    COMMIT=<sha> STAGES="..." bash benchmarks/device_job.sh start
#   5..: no carry                         WAIT_S=240 bash benchmarks/device_job.sh wait   (until rc appears)
# The machine is given back after 30 s without a call, and the detached job dies with it: make each call right after
# the last returns (read what came back while the next wait runs). Keep waits at 240 s: after waits of 420 s and
# more the next call, made at once, can find a fresh machine (benchmarks/results/sessions/README.md, T1845).
# Without FLA, call 4 is `COMMIT=<sha> STAGES="..." NO_FLA=1 bash benchmarks/device_job.sh start` (no carry).
# answer_loss on sessions prepared here (the same bytes, no device minute spent on them): `ds-longctx data prepare
# --sessions 40 --out .alsess --min_tokens 131072 --max_tokens 262144` (~1 min; .alsess listed in .git/info/exclude),
# then call 4 carries [".alsess"]: `COMMIT=<sha> STAGES=answer_loss AL_STEPS=100 SESSIONS=.alsess NO_FLA=1 bash ...`.
# Stages (STAGES, space-separated, in that order):
#   answer_loss      issue 40: benchmarks/answer_loss.sh (STEPS=$AL_STEPS, default 100: ~21 min at 131,072 tokens)
#   qwen35_longest   issue 44: Qwen3.5-4B at the longest length its plan finds for 1 x 141 GB + 128 GB host, 1 step,
#                    the allocator recorded
#   rehearse:C:K[:R] `ds-longctx rehearse` of ds_configs/C, each rank role (or rank R), K of its layers
#                    (rehearsal_C.jsonl)
#   plan_run:M:N:K   model M planned for 1 x 141 GB + 128 GB host at N tokens, K steps, the allocator recorded
#   moe_longest      issue 45: Qwen3-30B-A3B at full width, MOE_LAYERS (default 1) of 48 layers, at the longest length
#                    its plan finds for 1 x 141 GB + 128 GB host, 1 step, the allocator recorded
#                    (memory/rank0_peak.txt: what holds the peak, by the line that allocated it)
#   attn:S,..:H:KV   benchmarks/bench_attention.py at those lengths with H q / KV kv heads a rank (attn/)
#   disk_tier        issue 58: benchmarks/disk_tier.sh (Qwen3-8B, the disk plan's longest length, 1 step)
#   gpu_tests        pytest tests/gpu, whole (about 15 min on one H200)
#   gpu_some         pytest tests/gpu -k "$K" (default: the placement budget path: a world of one rehearsed against
#                    its real run; every lever against plain HF; FA4's kernel pair at head_dim 256, Qwen3.5's full
#                    layers, against fp32 SDPA: what `auto` needs before it may pick FA4 and the attention cache there)
# TRITON_CACHE_AUTOTUNING=1 keeps FLA's Triton autotune results on disk: only the first Qwen3.5 process tunes.
set -uo pipefail
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/proj
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown} TRITON_CACHE_AUTOTUNING=1
export DS_LONGCTX_COMMIT=$COMMIT
RUN_DIR=/tmp/job RES=/tmp/res
GPU_SOME="test_a_world_of_one_rehearsed_peaks_as_the_real_run or test_every_lever_on_gpu_matches_plain_hf"
GPU_SOME+=" or (test_kernel_pair_matches_sdpa_dense and 256) or test_fa4_with_the_attention_kept_at_head_dim_256"
if [[ ${1:-start} == start ]]; then
  [[ -n ${NO_FLA:-} ]] || { bash .flab/install.sh > /tmp/install_fla.log 2>&1; tail -2 /tmp/install_fla.log; }
  rm -rf /tmp/proj $RES && mkdir -p /tmp/proj $RES && cp -r . /tmp/proj && cd /tmp/proj
  rm -rf .fa4a .fa4b .flaa .flab .whl .sdist
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  RUN_DIR=$RUN_DIR bash launch/detach.sh env STAGES="${STAGES:?name the stages}" bash benchmarks/device_job.sh run
  exit 0
elif [[ $1 == run ]]; then
  cd /tmp/proj && mkdir -p $RES
  step() { local name=$1 limit=$2; shift 2; echo "== $name $(date +%T)"
           timeout "$limit" "$@" > "$RES/$name.log" 2>&1; echo "$name rc $? $(date +%T)"; }
  plan_train() {  # name steps train-args -- plan-args: plan for 1 x 141 GB + 128 GB host, then train on it
    local name=$1 steps=$2; shift 2; local extra=(); while [[ $1 != -- ]]; do extra+=("$1"); shift; done; shift
    python -m ds_longctx.cli plan "$@" --gpus 1 --gpu_mem_gb 141 --host_mem_gb 128 --out "$RES/$name/plan" && \
      python -m ds_longctx.cli train --nproc 1 --config "$RES/$name/plan/run.yaml" --steps "$steps" \
        --output_dir "$RES/$name/run" "${extra[@]}"
  }
  export -f plan_train; export RES
  for s in $STAGES; do
    case $s in
      answer_loss) step answer_loss 1700 env RES="$RES/answer_loss" STEPS="${AL_STEPS:-100}" \
                     bash benchmarks/answer_loss.sh ;;
      qwen35_longest) step qwen35_longest 900 bash -c \
                        'plan_train qwen35_longest 1 --memory_snapshot_steps 1 -- --model qwen3.5-4b --find_max_len' ;;
      rehearse:*:*) IFS=: read -r _ c k r <<< "$s"
                    step "rehearse_$c${r:+_rank$r}" 1200 python -m ds_longctx.cli rehearse \
                      --config "ds_configs/$c/run.yaml" --rank "${r:-roles}" --layers "$k" \
                      --out "$RES/rehearsal_$c.jsonl" ;;
      moe_longest) python - "${MOE_LAYERS:-1}" <<'PY'
import json, sys
cfg = json.load(open("ds_longctx/models/qwen3-30b-a3b.json"))
cfg["num_hidden_layers"] = int(sys.argv[1])
json.dump(cfg, open("/tmp/qwen3-30b-a3b-reduced.json", "w"))
PY
                   step moe_longest 900 bash -c 'plan_train moe_longest 1 --memory_snapshot_steps 1 -- \
                     --model /tmp/qwen3-30b-a3b-reduced.json --find_max_len' ;;
      plan_run:*:*:*) IFS=: read -r _ m n k <<< "$s"  # the plan for 1 x 141 GB + 128 GB host at n tokens, k steps
                      step "plan_run_${m}_$n" 900 bash -c \
                        "plan_train plan_run_${m}_$n $k --memory_snapshot_steps 1 -- --model $m --seq_len $n" ;;
      attn:*:*:*) IFS=: read -r _ lens h kv <<< "$s"  # kernel rates at one Ulysses shape (q / kv heads a rank)
                  step "attn_${h}_$kv" 600 python benchmarks/bench_attention.py --seq_lens "$lens" \
                    --heads "$h" --kv_heads "$kv" --out "$RES/attn" ;;
      disk_tier) step disk_tier 1200 env RES="$RES/disk_tier" NVME_PATH=/tmp/ds_longctx_nvme NVME_GB=${NVME_GB:-50} \
                   bash benchmarks/disk_tier.sh ;;
      gpu_tests) step gpu_tests 1500 python -m pytest -q -p no:cacheprovider --durations=15 tests/gpu ;;
      gpu_some) step gpu_some 900 python -m pytest -q -p no:cacheprovider --durations=10 tests/gpu \
                  -k "${K:-$GPU_SOME}" ;;
      *) echo "unknown stage $s" ;;
    esac
  done
  exit 0
fi
cd /tmp/proj 2>/dev/null || exit 1
RUN_DIR=$RUN_DIR bash launch/wait.sh "${WAIT_S:-240}"; rc=$?
for f in metrics.jsonl eval_curve.jsonl answer_loss.jsonl; do  # answer_loss so far: back even if the lease ends
  [[ -f /tmp/answer_loss/run/$f ]] && mkdir -p $RES/answer_loss && cp /tmp/answer_loss/run/$f $RES/answer_loss/
done
cp $RUN_DIR/log "$OUT/job.log" 2>/dev/null
tar czf "$OUT/res.tgz" --exclude='*.pt' --exclude='*.pickle' --exclude='checkpoints' --exclude='cache' -C $RES . \
  2>/dev/null
exit $rc

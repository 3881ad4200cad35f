#!/bin/bash
# One device session's GPU work as a list of stages, run in order, each stage's output under $RES (outside $OUT, so it
# outlives one device call). Start it detached after the wheels are installed, then collect across calls:
#   RUN_DIR=/tmp/session launch/detach.sh bash benchmarks/gpu_session.sh COMMIT hf_trainer gpu_tests peers ...
#   RUN_DIR=/tmp/session launch/wait.sh 540; tar czf $OUT/res.tgz --exclude=books --exclude=cache \
#     --exclude='*.pickle' -C /tmp res session      (every call; each file back is at most 16 MiB)
# Make each next call at once: the machine goes back 30 s after a call, and a call then starts a fresh one with no
# /tmp/res. launch/wait.sh exits 2 at once there (no job in RUN_DIR); a hand-written wait loop waits its whole time
# for nothing (results/sessions/session_2026-12-01_h200x2-20261201T0924/chain.sh lost the rest of that session's device time so).
# Stages:
#   hf_trainer  benchmarks/bench_hf_trainer.py: launch/trl_sft.py, ds-longctx train and LoRA at 131,072 tokens
#   gpu_tests   pytest tests/gpu (whole log)
#   gpu_some    pytest tests/gpu -k "$K" (the checks of one change, before the whole suite)
#   env         what the machine offers issue 12's NVMe placement: DeepSpeed's async I/O op (libaio) and GDS op
#               compatibility, the disks (seconds)
#   peers       benchmarks/bench_peers.py at LEN: TRL FSDP2 + CP, then ds_longctx with the plan's placement (defaults:
#               fused_ops auto = compile on GPU)
#   fused       ds_longctx at LEN with kernels.fused_ops none, then liger (the lever off and the other kernel)
#   alst        benchmarks/bench_peers.py at LEN: DeepSpeed ALST
#   ours        ds_longctx alone at LEN with its plan's run.yaml (2 x 141 GB): the 524k row beside alst
#   capped      ds_longctx at LEN planned within this session's ALST peak + 10% (`--gpu_mem_gb` = 1.1 x ALST's
#               peak_gpu_bytes, so the plan, at 0.9 of that, sits at ALST's peak; 141 when ALST has no clean line):
#               issue 11's 262k memory line. Run it after alst.
#   budget64    the plan for 262,144 tokens on 2 x 64 GB (optimizer offload), 2 steps, with the allocator recorded
#               (logging.memory_snapshot_steps 2): what holds the memory at each rank's peak (issue 12's excess)
#   validate    held-out planner runs, predicted and committed before (benchmarks/results/sessions/2026-12-01/planner_predictions_2026-12-01f.jsonl,
#               the planner of daa32ac): 262k on 64 and 80 GB budgets (optimizer offload), 196k on 64 GB; 2 steps each
#               (VALIDATE_PLANS: some of them; or others with PREDICTIONS=their file and GPUS=the GPUs they were
#               predicted for). On 1 x H200, e's four, g's two, j's three, l's two and 2026-12-02's one have run
#               (planner_runs_2026-12-01c, e, f, 2026-12-02): every 1 x H200 prediction that is still today's plan
#               (`--check`); d's 4B at 256,000 on 64 GB never ran and its plan has moved since.
#               PREDICTIONS takes several files, comma-separated (each spec measured against the one that is today's
#               plan), so one validate stage runs plans predicted in different files. Before the session, on CPU:
#               `python benchmarks/bench_planner.py --check FILE[,FILE]` says which are still held out
#               (benchmarks/results/planner_runs.jsonl holds every committed prediction, its `todays_plan` column the
#               same answer as of its `checked_at`)
#   longest     the planner's longest on 2 x 141 GB + 256 GB (`plan --find_max_len` of cdf5c8c: 860,160 tokens, tiled
#               layer, pinned pool, the attention backward over 4 KV-head groups, optimizer on GPU;
#               predictions_2026-12-01h), 1 step: issue 12's longest.jsonl row. Ran at b11b708 (882.8 s, host +0.2%,
#               GPU -31.6%: DeepSpeed made the Adam moments at step 1's end; planner_runs_2026-12-01d.md). With
#               optimizer.state_at_build (the default since) one step holds them: ~17 min of x2 time with the build.
#               Without the grouped backward: LONGEST=833536:141
#               LONGEST_PREDICTIONS=benchmarks/results/sessions/2026-12-01/planner_predictions_2026-12-01f.jsonl
#   profile     benchmarks/bench_profile.py at LEN with the plan's run.yaml (FA4, cache placement, compiled fused ops:
#               the defaults): issue 11's "after" profile table (3 steps, the last profiled)
#   layer_onoff the tiled layer on and off in one engine build (bench_levers.py at LEN, every checkpoint offloaded:
#               tiled MLP vs tiled layer, 2 steps each): its step-time cost and what it takes off the peak
#   snapshot    each run.yaml of SNAPSHOT_CONFIGS (comma-separated) for 2 steps on GPUS (default 2) GPUs with the
#               allocator recorded (--memory_snapshot_steps 2): what holds the memory at the peak, where a plan missed
#               (e.g. the 1 x H200 plans of planner_runs_2026-12-01.md, under session_2026-12-01_h200x1-*/plans/)
#   tiled       held-out runs of the tiled layer (levers/tiled_layer.py), predicted in
#               benchmarks/results/sessions/2026-11-30/planner_predictions_2026-11-30b.jsonl: 262k on 141 and 80 GB, 393k on 141 GB with the
#               pinned pool; 2 steps each (TILED_PLANS: some of them)
# LEN (default 131072) and STEPS (default 4) set the peers' length and steps.
set -uo pipefail
RES=${RES:-/tmp/res}
mkdir -p "$RES"
COMMIT=$1
shift
SESSION=${SESSION:-h200x$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')-$(date -u +%Y%m%dT%H%M)}
LEN=${LEN:-131072}
# the plan's placement at this length on 2 x 141 GB (`ds-longctx plan --model qwen3-8b --seq_len LEN --gpus 2
# --gpu_mem_gb 141`), as a user would run it
PLACEMENT=$(python3 -m ds_longctx.cli plan --model qwen3-8b --seq_len "$LEN" --gpus 2 --gpu_mem_gb 141 \
  --out "$RES/plan_$LEN" | sed -n 's/^placement per layer: \([^ ]*\).*/\1/p')
echo "session $SESSION commit $COMMIT placement $PLACEMENT" | tee -a "$RES/session.txt"
peers() {  # SYSTEMS [ds_longctx args]
  python3 benchmarks/bench_peers.py --systems "$1" --model qwen3-8b --seq_len "$LEN" --gpus 2 --steps "${STEPS:-4}" \
    --session "$SESSION" --out "$RES" --commit "$COMMIT" --timeout_s 900 --ds_longctx_args "${2:-}"
}
for stage in "$@"; do
  echo "== $(date -u +%H:%M:%S) stage $stage" | tee -a "$RES/session.txt"
  case $stage in
    hf_trainer) python3 benchmarks/bench_hf_trainer.py --model qwen3-8b --seq_len "$LEN" --gpus 2 --gpu_mem_gb 141 \
                  --steps 3 --out "$RES" --commit "$COMMIT" ;;
    env) { python3 -c "from deepspeed.ops.op_builder import AsyncIOBuilder as A; print('async_io compatible:', A().is_compatible(verbose=True))"
           python3 -c "from deepspeed.ops.op_builder import GDSBuilder as G; print('gds compatible:', G().is_compatible(verbose=True))"
           ldconfig -p | grep -i aio; ls /usr/include/libaio.h; df -h /tmp "$RES"; lsblk; } > "$RES/env.txt" 2>&1
         cat "$RES/env.txt" ;;
    gpu_tests) python3 -m pytest -q -rs -p no:cacheprovider --durations=20 tests/gpu > "$RES/gpu_tests.log" 2>&1
               tail -3 "$RES/gpu_tests.log" ;;
    gpu_some) python3 -m pytest -q -rs -p no:cacheprovider tests/gpu -k "$K" > "$RES/gpu_some.log" 2>&1
              tail -3 "$RES/gpu_some.log" ;;
    peers) peers trl_fsdp2_cp && peers ds_longctx "--placement $PLACEMENT" ;;
    fused) peers ds_longctx "--placement $PLACEMENT --fused_ops none" &&
           peers ds_longctx "--placement $PLACEMENT --fused_ops liger" ;;
    alst) peers alst ;;
    ours) peers ds_longctx "--config $RES/plan_$LEN/run.yaml" ;;
    capped) CAP=$(python3 - "$RES/peers.jsonl" "$SESSION" "$LEN" <<'EOF'
import json, os, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()] if os.path.exists(sys.argv[1]) else []
ok = [r for r in rows if r["session"] == sys.argv[2] and r["system"] == "alst" and r["seq_len"] == int(sys.argv[3])
      and not r.get("error") and r.get("peak_gpu_bytes")]
print(min(141, int(ok[-1]["peak_gpu_bytes"] * 1.1 / 1e9)) if ok else 141)
EOF
)
            echo "capped: --gpu_mem_gb $CAP" | tee -a "$RES/session.txt"
            python3 -m ds_longctx.cli plan --model qwen3-8b --seq_len "$LEN" --gpus 2 --gpu_mem_gb "$CAP" \
              --out "$RES/plan_${LEN}_cap$CAP" > "$RES/plan_${LEN}_cap$CAP.txt" &&
            peers ds_longctx "--config $RES/plan_${LEN}_cap$CAP/run.yaml" ;;
    budget64) python3 -m ds_longctx.cli plan --model qwen3-8b --seq_len 262144 --gpus 2 --gpu_mem_gb 64 \
                --out "$RES/plan_262144_64gb" > /dev/null &&
              python3 -m ds_longctx.cli train --config "$RES/plan_262144_64gb/run.yaml" --nproc 2 --steps 2 \
                --memory_snapshot_steps 2 --output_dir "$RES/budget64" > "$RES/budget64.log" 2>&1
              tail -3 "$RES/budget64.log"; cat "$RES/budget64/memory/rank0_peak.txt" ;;
    snapshot) IFS=, read -ra configs <<< "${SNAPSHOT_CONFIGS:?give SNAPSHOT_CONFIGS=path/run.yaml[,path/run.yaml]}"
              for cfg in "${configs[@]}"; do
                name=$(basename "$(dirname "$cfg")")
                python3 -m ds_longctx.cli train --config "$cfg" --nproc "${GPUS:-2}" --steps 2 --memory_snapshot_steps 2 \
                  --output_dir "$RES/snapshot_$name" > "$RES/snapshot_$name.log" 2>&1
                tail -2 "$RES/snapshot_$name.log"; head -30 "$RES/snapshot_$name/memory/rank0_peak.txt"
              done ;;
    validate) python3 benchmarks/bench_planner.py --plans "${VALIDATE_PLANS:-262144:64,262144:80,196608:64}" \
                --predictions "${PREDICTIONS:-benchmarks/results/sessions/2026-12-01/planner_predictions_2026-12-01f.jsonl}" --steps 2 \
                --gpus "${GPUS:-2}" --timeout_s 1200 --out "$RES" --commit "$COMMIT" ;;
    longest) python3 benchmarks/bench_planner.py --plans "${LONGEST:-860160:141}" --steps 1 --timeout_s 3600 \
               --longest "$RES/longest.jsonl" --out "$RES" --commit "$COMMIT" \
               --predictions "${LONGEST_PREDICTIONS:-benchmarks/results/sessions/2026-12-01/planner_predictions_2026-12-01h.jsonl}" ;;
    profile) python3 -m torch.distributed.run --nproc_per_node 2 --master_port 29533 benchmarks/bench_profile.py \
               --label plan --steps 3 --out "$RES" --commit "$COMMIT" --config "$RES/plan_$LEN/run.yaml" \
               --output_dir "$RES/profile_run_$LEN" > "$RES/profile_$LEN.log" 2>&1
             tail -25 "$RES/profile_$LEN.log" ;;
    layer_onoff) python3 -m torch.distributed.run --nproc_per_node 2 --master_port 29534 benchmarks/bench_levers.py \
                   --model qwen3-8b --seq_len "$LEN" --sp_size 2 --variants offload+tiled,offload+layer --steps 2 \
                   --first_steps 2 --out "$RES" --commit "$COMMIT" > "$RES/layer_onoff_$LEN.log" 2>&1
                 tail -6 "$RES/layer_onoff_$LEN.log" ;;
    tiled) python3 benchmarks/bench_planner.py --plans "${TILED_PLANS:-262144:141:tiled_layer,262144:80:tiled_layer,393216:141:tiled_layer+pinned_pool}" \
             --predictions benchmarks/results/sessions/2026-11-30/planner_predictions_2026-11-30b.jsonl --steps 2 --timeout_s 1800 \
             --out "$RES" --commit "$COMMIT" ;;
    *) echo "unknown stage $stage" ;;
  esac
  echo "== $(date -u +%H:%M:%S) stage $stage done ($?)" | tee -a "$RES/session.txt"
done

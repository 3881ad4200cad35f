#!/bin/bash
# Rehearsals of committed configs on this machine's one GPU (ds-longctx rehearse), in order, each appending its row to
# $RES/rehearsal.jsonl and its output to $RES/<name>.log. A 1M-token rank's step is minutes: start it detached and
# collect across device calls:
#   RES=/tmp/res RUN_DIR=/tmp/rh launch/detach.sh bash benchmarks/bench_rehearse.sh COMMIT SPEC [SPEC ...]
#   RUN_DIR=/tmp/rh launch/wait.sh 540; tar czf $OUT/res.tgz -C /tmp res        (every call)
# SPEC = config[:rank[:layers]]: a directory under ds_configs/ (or a run.yaml path), the rank (default 0; `roles`),
# the decoder layers to run (default all), e.g.  qwen3-8b_1m_8x141gb:0  qwen3-8b_1m_8x141gb:0:6
# `gpu_test` as a SPEC runs tests/gpu/test_rehearse_gpu.py (the world of one against the real run).
# COMMIT is recorded in every row (the device's .git may be a stale copy of the tree). REHEARSE_ARGS: more options for
# every rehearsal (e.g. "--seq_len 131072" for a quick check of the path); STEPS: steps per rank (default 2).
set -uo pipefail
RES=${RES:-/tmp/res}
mkdir -p "$RES"
export DS_LONGCTX_COMMIT=$1
shift
STEPS=${STEPS:-2}
for spec in "$@"; do
  if [[ $spec == gpu_test ]]; then
    echo "== $(date -u +%H:%M:%S) pytest tests/gpu/test_rehearse_gpu.py"
    python3 -m pytest -q tests/gpu/test_rehearse_gpu.py > "$RES/gpu_test_rehearse.log" 2>&1
    echo "rc $? $(tail -1 "$RES/gpu_test_rehearse.log")"
    continue
  fi
  IFS=: read -r cfg rank layers <<< "$spec"
  [[ -d ds_configs/$cfg ]] && path=ds_configs/$cfg/run.yaml || path=$cfg
  name=$(basename "$(dirname "$path")")_r${rank:-0}${layers:+_l$layers}
  echo "== $(date -u +%H:%M:%S) $name: ds-longctx rehearse --config $path --rank ${rank:-0} ${layers:+--layers $layers}"
  python3 -m ds_longctx.cli rehearse --config "$path" --rank "${rank:-0}" ${layers:+--layers "$layers"} \
    --steps "$STEPS" --out "$RES/rehearsal.jsonl" ${REHEARSE_ARGS:-} > "$RES/$name.log" 2>&1
  echo "rc $? $(grep -c . "$RES/rehearsal.jsonl" 2>/dev/null) rows"
  tail -4 "$RES/$name.log"
done
echo "== $(date -u +%H:%M:%S) done"

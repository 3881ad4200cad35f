#!/usr/bin/env bash
# Start ds_longctx.train under DeepSpeed's launcher: NGPU processes on this node, one per GPU.
# Run from the repository root (CONFIG is relative to it):
#   launch/deepspeed.sh                                  # NGPU=8, the 1M-token Qwen3-8B config for 8x141 GB
#   NGPU=2 CONFIG=ds_configs/qwen3-8b_max_2x141gb/run.yaml launch/deepspeed.sh --steps 10
#   DRY_RUN=1 launch/deepspeed.sh --steps 10             # print the command, run nothing
# Arguments after the script override run-config keys (--key value, see RunConfig). MASTER_PORT, when set, is the
# rendezvous port (default 29500). On CPU: DS_ACCELERATOR=cpu (gloo); --num_gpus works there, --include does not.
set -euo pipefail

NGPU=${NGPU:-8}
CONFIG=${CONFIG:-ds_configs/qwen3-8b_1m_8x141gb/run.yaml}

if [[ ! -f "$CONFIG" ]]; then
  echo "launch/deepspeed.sh: CONFIG=$CONFIG is not a file;" \
       "run from the repository root or set CONFIG to a run.yaml" >&2
  exit 2
fi
cmd=(deepspeed --num_gpus "$NGPU" ${MASTER_PORT:+--master_port "$MASTER_PORT"}
     --module ds_longctx.train --config "$CONFIG" "$@")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q' "${cmd[0]}"; printf ' %q' "${cmd[@]:1}"; printf '\n'
  exit 0
fi
exec "${cmd[@]}"

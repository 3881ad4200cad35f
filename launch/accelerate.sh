#!/usr/bin/env bash
# Start ds_longctx.train under `accelerate launch` with the DeepSpeed plugin: NGPU processes, one per GPU.
# Run from the repository root (CONFIG is relative to it):
#   launch/accelerate.sh                                 # NGPU=8, the 1M-token Qwen3-8B config for 8x141 GB
#   NGPU=2 CONFIG=ds_configs/qwen3-8b_max_2x141gb/run.yaml launch/accelerate.sh --steps 10
#   DRY_RUN=1 launch/accelerate.sh --steps 10            # print the command, run nothing
# Arguments after the script override run-config keys (--key value, see RunConfig). ACCELERATE_CONFIG defaults to
# launch/accelerate.yaml; DS_CONFIG to the ds_config.json beside CONFIG (train.py derives the same dict from
# CONFIG; accelerate only hands the path to the processes). MASTER_PORT, when set, is the rendezvous port.
# On CPU this works with DS_ACCELERATOR=cpu: for a DEEPSPEED config accelerate starts the processes through
# torch.distributed.run, and train.py initialises gloo itself (it never builds an accelerate Accelerator).
set -euo pipefail

NGPU=${NGPU:-8}
CONFIG=${CONFIG:-ds_configs/qwen3-8b_1m_8x141gb/run.yaml}
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-$(dirname "${BASH_SOURCE[0]}")/accelerate.yaml}
DS_CONFIG=${DS_CONFIG:-$(dirname "$CONFIG")/ds_config.json}

if [[ ! -f "$CONFIG" ]]; then
  echo "launch/accelerate.sh: CONFIG=$CONFIG is not a file;" \
       "run from the repository root or set CONFIG to a run.yaml" >&2
  exit 2
fi
cmd=(accelerate launch --config_file "$ACCELERATE_CONFIG" --num_processes "$NGPU"
     ${MASTER_PORT:+--main_process_port "$MASTER_PORT"} --deepspeed_config_file "$DS_CONFIG"
     -m ds_longctx.train --config "$CONFIG" "$@")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q' "${cmd[0]}"; printf ' %q' "${cmd[@]:1}"; printf '\n'
  exit 0
fi
exec "${cmd[@]}"

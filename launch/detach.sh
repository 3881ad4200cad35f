#!/usr/bin/env bash
# Start a long job detached from this shell (setsid), so it outlives the command that started it: the 1M-token
# runs take minutes per step, longer than one device call. Output goes to $RUN_DIR/log, the exit status to
# $RUN_DIR/rc when it ends, the process-group id to $RUN_DIR/pid. Follow it with launch/wait.sh.
#   RUN_DIR=/tmp/run1m NGPU=8 launch/detach.sh launch/deepspeed.sh --steps 2
#   RUN_DIR=/tmp/run1m launch/wait.sh 540      # back-to-back calls keep the machine busy until rc appears
# Stop it: kill -- -$(cat $RUN_DIR/pid)
set -euo pipefail

RUN_DIR=${RUN_DIR:-runs/detached}
if [[ $# -eq 0 ]]; then
  echo "launch/detach.sh: give the command to run, e.g. launch/detach.sh launch/deepspeed.sh --steps 2" >&2
  exit 2
fi
if [[ -f "$RUN_DIR/pid" && ! -f "$RUN_DIR/rc" ]] && kill -0 "$(cat "$RUN_DIR/pid")" 2>/dev/null; then
  echo "launch/detach.sh: a job is still running in RUN_DIR=$RUN_DIR (pid $(cat "$RUN_DIR/pid"));" \
       "wait for it (launch/wait.sh), stop it (kill -- -PID) or choose another RUN_DIR" >&2
  exit 2
fi
mkdir -p "$RUN_DIR"
rm -f "$RUN_DIR/rc"
printf '%q ' "$@" > "$RUN_DIR/command"
echo >> "$RUN_DIR/command"
# setsid: a new session and process group (its pid = the group id), so the job survives this shell and
# `kill -- -PID` stops every process it started
setsid bash -c '"$@" > "$0/log" 2>&1; echo $? > "$0/rc"' "$RUN_DIR" "$@" < /dev/null > /dev/null 2>&1 &
echo $! > "$RUN_DIR/pid"
echo "started: $(cat "$RUN_DIR/command")in RUN_DIR=$RUN_DIR (pid $(cat "$RUN_DIR/pid"))"

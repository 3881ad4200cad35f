#!/usr/bin/env bash
# Wait up to SECONDS (default 540) for a job started by launch/detach.sh, printing the end of its log.
#   RUN_DIR=/tmp/run1m launch/wait.sh 540
# Exit status: the job's own when it has ended; 75 when it is still running after SECONDS (call again);
# 2 when RUN_DIR holds no job.
set -euo pipefail

RUN_DIR=${RUN_DIR:-runs/detached}
SECONDS_MAX=${1:-540}
if [[ ! -f "$RUN_DIR/pid" ]]; then
  echo "launch/wait.sh: no job in RUN_DIR=$RUN_DIR (start one with launch/detach.sh)" >&2
  exit 2
fi
end=$((SECONDS + SECONDS_MAX))
while [[ ! -f "$RUN_DIR/rc" && $SECONDS -lt $end ]]; do
  if ! kill -0 "$(cat "$RUN_DIR/pid")" 2>/dev/null; then
    sleep 1  # the job's shell writes rc as it exits
    [[ -f "$RUN_DIR/rc" ]] || { echo "launch/wait.sh: job $(cat "$RUN_DIR/pid") is gone without an exit status" >&2; exit 1; }
    break
  fi
  sleep 2
done
# progress bars rewrite one line with \r: show each update as its own line
tr '\r' '\n' < "$RUN_DIR/log" 2>/dev/null | grep -v '^\s*$' | tail -n 15 || true
if [[ -f "$RUN_DIR/rc" ]]; then
  rc=$(cat "$RUN_DIR/rc")
  echo "launch/wait.sh: job ended with status $rc after $(cat "$RUN_DIR/command")"
  exit "$rc"
fi
echo "launch/wait.sh: still running after ${SECONDS_MAX}s (pid $(cat "$RUN_DIR/pid")); call again"
exit 75

#!/usr/bin/env bash
# Stops the run in WORKDIR on every worker the way a preemption does: SIGTERM, upon which the run
# writes a checkpoint and exits (on one host; with several it just exits). Rerunning launch/run.sh
# with the same WORKDIR resumes it.
#
#   launch/stop.sh          STOP_WAIT_S (default 600) bounds the wait for the checkpoint
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

case "${1:-}" in
  "") ;;
  -h | --help) sed -n '2,6p' "$0"; exit 0 ;;
  *) die "unknown option $1 (see launch/stop.sh --help)" ;;
esac
STOP_WAIT_S="${STOP_WAIT_S:-600}"
preflight TPU_NAME ZONE WORKDIR
check_workdir

read -r -d '' body <<'EOF' || true
if ! pid="$(running)"; then
  echo "$host: no run going in $WORKDIR"
  exit 0
fi
kill -TERM "$pid"
echo "$host: sent SIGTERM to $pid; waiting for its checkpoint"
waited=0
while running >/dev/null; do
  if [ "$waited" -ge "$STOP_WAIT_S" ]; then
    echo "$host: pid $pid still going after $STOP_WAIT_S s; see $WORKDIR/logs/$host.log" >&2
    exit 1
  fi
  sleep 1
  waited=$((waited + 1))
done
echo "$host: stopped after ${waited} s; last lines of its log:"
tail -n 3 "$WORKDIR/logs/$host.log"
EOF
say "stopping the run in $WORKDIR on every worker of $TPU_NAME"
tpu_script all "$(remote_header WORKDIR STOP_WAIT_S)
$body"

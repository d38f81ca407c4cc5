#!/usr/bin/env bash
# Shows whether the run in WORKDIR is going on a worker, and the end of its log.
#
#   launch/logs.sh [-f] [-n LINES] [WORKER]     WORKER: 0 (default), 1, ...; -f: follow (Ctrl-C ends)
set -euo pipefail
SHOW_SCRIPTS="${SHOW_SCRIPTS:-0}"  # this one is run often: only the gcloud command is shown
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# FOLLOW and NUM_LINES travel to the worker through remote_header.
FOLLOW=0
NUM_LINES=40
worker=0
# shellcheck disable=SC2034
while (( $# > 0 )); do
  case "$1" in
    -f | --follow) FOLLOW=1 ;;
    -n) shift; NUM_LINES="${1:-}" ;;
    -h | --help) sed -n '2,4p' "$0"; exit 0 ;;
    [0-9]*) worker="$1" ;;
    *) die "unknown option $1 (see launch/logs.sh --help)" ;;
  esac
  shift
done
[[ "$NUM_LINES" =~ ^[0-9]+$ ]] || die "-n needs a number of lines"
[[ "$worker" =~ ^[0-9]+$ ]] || die "WORKER must be a worker number: 0, 1, ..."
preflight TPU_NAME ZONE WORKDIR
check_workdir

read -r -d '' body <<'EOF' || true
log="$WORKDIR/logs/$host.log"
if pid="$(running)"; then echo "$host: running (pid $pid)"; else echo "$host: not running"; fi
if [ ! -f "$log" ]; then
  echo "$host: no log at $log (has launch/run.sh started this WORKDIR?)" >&2
  exit 1
fi
if [ -f "$WORKDIR/logs/$host.backup.log" ]; then
  echo "--- backup: $(grep upload "$WORKDIR/logs/$host.backup.log" | tail -n 1 || echo "no upload yet")"
fi
echo "--- $log"
if [ "$FOLLOW" = 1 ]; then tail -n "$NUM_LINES" -f "$log"; else tail -n "$NUM_LINES" "$log"; fi
EOF
tpu_script "$worker" "$(remote_header WORKDIR NUM_LINES FOLLOW)
$body"

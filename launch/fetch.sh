#!/usr/bin/env bash
# Copies results.json, metrics.jsonl, tensorboard/ and the worker logs of WORKDIR to this machine
# (checkpoints stay behind), into LOCAL_DIR (default runs/<last part of WORKDIR> in this checkout).
#
#   launch/fetch.sh                 from worker 0 of TPU_NAME (process 0 writes every report)
#   launch/fetch.sh --from-backup   from BACKUP_URL, which outlives the TPU VM
# Safe to run while the run is going; results.json appears when it has finished.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

from_backup=0
case "${1:-}" in
  "") ;;
  --from-backup) from_backup=1 ;;
  -h | --help) sed -n '2,7p' "$0"; exit 0 ;;
  *) die "unknown option $1 (see launch/fetch.sh --help)" ;;
esac

if [[ $from_backup == 1 ]]; then
  preflight BACKUP_URL
  LOCAL_DIR="${LOCAL_DIR:-$REPO_ROOT/runs/$(basename "${WORKDIR:-$BACKUP_URL}")}"
  mkdir -p "$LOCAL_DIR"
  say "copying $BACKUP_URL (without checkpoints) to $LOCAL_DIR"
  show_and_run gcloud storage rsync --recursive --exclude='^checkpoints/.*' "$BACKUP_URL" "$LOCAL_DIR"
else
  preflight TPU_NAME ZONE WORKDIR
  check_workdir
  LOCAL_DIR="${LOCAL_DIR:-$REPO_ROOT/runs/$(basename "$WORKDIR")}"
  mkdir -p "$LOCAL_DIR"
  say "copying $WORKDIR from worker 0 of $TPU_NAME to $LOCAL_DIR"
  missing=()
  for item in results.json metrics.jsonl; do
    tpu_vm scp --worker=0 "$TPU_NAME:$WORKDIR/$item" "$LOCAL_DIR/" || missing+=("$item")
  done
  for item in tensorboard logs; do
    tpu_vm scp --worker=0 --recurse "$TPU_NAME:$WORKDIR/$item" "$LOCAL_DIR/" || missing+=("$item")
  done
  if (( ${#missing[@]} > 0 )); then
    warn "not copied: ${missing[*]} (results.json is written when the run has finished; launch/logs.sh shows how far it is)"
  fi
fi
say "fetched into $LOCAL_DIR"
if [[ -f "$LOCAL_DIR/results.json" ]]; then
  echo "  tensorboard --logdir $LOCAL_DIR/tensorboard"
fi

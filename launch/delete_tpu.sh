#!/usr/bin/env bash
# Deletes the TPU VM TPU_NAME (and its queued resource, when it was created with --queued).
# Its disks go with it, WORKDIR included: run launch/fetch.sh first, or keep a BACKUP_URL mirror.
#
#   launch/delete_tpu.sh [--yes]     --yes: do not ask for confirmation
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

quiet=()
case "${1:-}" in
  "") ;;
  -y | --yes) quiet=(--quiet) ;;
  -h | --help) sed -n '2,5p' "$0"; exit 0 ;;
  *) die "unknown option $1 (see launch/delete_tpu.sh --help)" ;;
esac
preflight TPU_NAME ZONE

if SHOW_AS="gcloud compute tpus queued-resources describe $TPU_NAME (does it exist?)" \
  queued_resources describe "$TPU_NAME" --format='value(name)' >/dev/null 2>&1; then
  say "deleting queued resource $TPU_NAME and its TPU VM"
  queued_resources delete "$TPU_NAME" --force ${quiet[@]+"${quiet[@]}"}
else
  say "deleting TPU VM $TPU_NAME"
  tpu_vm delete "$TPU_NAME" ${quiet[@]+"${quiet[@]}"}
fi

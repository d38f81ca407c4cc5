#!/usr/bin/env bash
# Creates the TPU VM TPU_NAME (ACCELERATOR_TYPE, RUNTIME_VERSION) in ZONE.
#
#   launch/create_tpu.sh [--spot | --preemptible] [--queued] [-- EXTRA_GCLOUD_FLAGS...]
#
#   --spot         Spot VM: much cheaper, may be preempted at any time (then delete it and create it
#                  again; run.sh resumes the run when WORKDIR survived, see BACKUP_URL in the README)
#   --preemptible  the older preemptible kind (at most 24 h); not with --queued
#   --queued       ask through a queued resource: waits for capacity instead of failing at once
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

provisioning=""
queued=0
extra=()
while (( $# > 0 )); do
  case "$1" in
    --spot | --preemptible) provisioning="$1" ;;
    --queued) queued=1 ;;
    --) shift; extra+=("$@"); break ;;
    -h | --help) sed -n '2,9p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see launch/create_tpu.sh --help)" ;;
  esac
  shift
done
preflight TPU_NAME ZONE
if [[ $queued == 1 && $provisioning == --preemptible ]]; then
  die "--preemptible is not available for queued resources; use --spot"
fi
flags=(--accelerator-type="$ACCELERATOR_TYPE")
if [[ -n "$provisioning" ]]; then flags+=("$provisioning"); fi
flags+=(${extra[@]+"${extra[@]}"})

if [[ $queued == 0 ]]; then
  say "creating TPU VM $TPU_NAME ($ACCELERATOR_TYPE, $RUNTIME_VERSION${provisioning:+, ${provisioning#--}}) in $ZONE"
  tpu_vm create "$TPU_NAME" --version="$RUNTIME_VERSION" "${flags[@]}"
else
  say "requesting $ACCELERATOR_TYPE through queued resource $TPU_NAME in $ZONE"
  queued_resources create "$TPU_NAME" --node-id="$TPU_NAME" --runtime-version="$RUNTIME_VERSION" "${flags[@]}"
  say "waiting for the queued resource to become ACTIVE (Ctrl-C stops waiting; the request stays queued)"
  while true; do
    state="$(SHOW_AS="gcloud compute tpus queued-resources describe $TPU_NAME (state)" \
      queued_resources describe "$TPU_NAME" --format='value(state.state)')"
    case "$state" in
      ACTIVE) break ;;
      FAILED | SUSPENDED | SUSPENDING) die "queued resource $TPU_NAME is $state; see: gcloud compute tpus queued-resources describe $TPU_NAME --zone=$ZONE" ;;
      *) say "$state; asking again in 60 s" && sleep 60 ;;
    esac
  done
fi
say "TPU VM $TPU_NAME is ready. Next: launch/install.sh, then WORKDIR=runs/NAME launch/run.sh"

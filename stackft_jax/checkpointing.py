"""Orbax checkpoints: where each kind lives and how a run finds its place again.

    WORKDIR/checkpoints/<phase>/<step>/   periodic, inside a phase: parameters, optimizer state, and the
                                          JSON state of the loop (stop tracker, best metric, wall time)
    WORKDIR/checkpoints/<phase>_end/      the phase boundary: final parameters and the phase's record
    WORKDIR/checkpoints/best/<step>/      parameters with the best dev metric so far

Resume order, per phase: a readable `<phase>_end` means the phase is done; else the latest readable
periodic checkpoint;
else the phase starts from the previous phase's parameters (or the pretrained backbone) with a fresh
optimizer. Orbax writes each checkpoint to a temporary directory and renames it when complete, so a
process killed mid-save leaves the previous checkpoint intact (the temporary directory is removed when
the phase's checkpoints are next opened).

A checkpoint that cannot be read (a truncated or deleted file: a full disk, a bad copy, a storage fault)
is moved to `WORKDIR/checkpoints/unreadable/`, never deleted, and the next older one is tried; an
unreadable `<phase>_end` sends the phase back to its start (its periodic checkpoints are deleted once the
boundary checkpoint is written: they hold the optimizer state, most of a run's disk use).
"""

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import Sharding

log = logging.getLogger(__name__)
T = TypeVar("T")


def unreadable_dir(workdir: str | Path) -> Path:
    return Path(workdir).absolute() / "checkpoints" / "unreadable"


def _move_aside(path: Path, workdir: Path, error: Exception) -> None:
    """Moves an unreadable checkpoint out of the way (process 0 moves; every process waits for it)."""
    # checkpoints/phase2/4 -> unreadable/phase2-4-<time>, checkpoints/phase1_end -> phase1_end-<time>
    name = "-".join(path.relative_to(workdir / "checkpoints").parts)
    target = unreadable_dir(workdir) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if jax.process_index() == 0:
        log.warning(
            "checkpoint %s is unreadable (%s: %s); moved to %s, trying an older one",
            path,
            type(error).__name__,
            str(error).splitlines()[0][:300] if str(error) else "",
            target,
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"moved aside {path}")


def _newest_readable(
    manager: ocp.CheckpointManager, workdir: Path, restore: Callable[[int], T]
) -> tuple[int, T] | None:
    """`restore(step)` of the newest step that restores; unreadable ones are moved aside."""
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            return step, restore(step)
        except Exception as error:  # orbax/tensorstore raise many types for a damaged file
            _move_aside(Path(manager.directory) / str(step), workdir, error)
            manager.reload()
    return None


def abstract_like(tree: Any, sharding: Sharding) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def _manager(directory: Path, *, max_to_keep: int, async_save: bool) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=async_save,
            create=True,
            cleanup_tmp_directories=True,  # what a kill during a save left behind
        ),
    )


class PhaseCheckpoints:
    """Periodic checkpoints of one phase; keeps the newest `max_to_keep`."""

    def __init__(self, workdir: str | Path, phase: str, *, max_to_keep: int, async_save: bool):
        self.workdir = Path(workdir).absolute()
        self.manager = _manager(
            self.workdir / "checkpoints" / phase, max_to_keep=max_to_keep, async_save=async_save
        )

    def restore_latest(self, abstract_state: dict[str, Any]) -> tuple[int, dict[str, Any], dict] | None:
        """(step, state, loop meta) of the newest readable checkpoint, or None."""
        found = _newest_readable(self.manager, self.workdir, lambda step: self.restore(step, abstract_state))
        if found is None:
            return None
        step, (state, meta) = found
        return step, state, meta

    def save(self, step: int, state: dict[str, Any], meta: dict[str, Any]) -> None:
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
        )

    def restore(self, step: int, abstract_state: dict[str, Any]) -> tuple[dict[str, Any], dict]:
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()
            ),
        )
        return restored.state, restored.meta

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def phase_end_path(workdir: str | Path, phase: str) -> Path:
    return Path(workdir).absolute() / "checkpoints" / f"{phase}_end"


def save_phase_end(workdir: str | Path, phase: str, params: Any, record: dict[str, Any]) -> None:
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        checkpointer.save(
            phase_end_path(workdir, phase),
            args=ocp.args.Composite(params=ocp.args.StandardSave(params), record=ocp.args.JsonSave(record)),
        )


def load_phase_end(workdir: str | Path, phase: str, abstract_params: Any) -> tuple[Any, dict] | None:
    """The phase's final parameters and record, or None if it has not finished (or its boundary
    checkpoint is unreadable: then it is moved aside and the phase resumes from its periodic ones)."""
    path = phase_end_path(workdir, phase)
    if not path.exists():
        return None
    try:
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
            restored = checkpointer.restore(
                path,
                args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(abstract_params), record=ocp.args.JsonRestore()
                ),
            )
    except Exception as error:  # orbax/tensorstore raise many types for a damaged file
        _move_aside(path, Path(workdir).absolute(), error)
        return None
    return restored.params, restored.record


def discard_periodic(workdir: str | Path, phase: str) -> None:
    """Deletes a finished phase's periodic checkpoints (parameters and optimizer state: most of a run's
    disk use); its boundary checkpoint holds all that later phases need."""
    if jax.process_index() == 0:
        shutil.rmtree(Path(workdir).absolute() / "checkpoints" / phase, ignore_errors=True)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"discarded {phase} periodic checkpoints")


class BestCheckpoint:
    """Parameters with the best dev metric; the new one is written before the old one is deleted."""

    def __init__(self, workdir: str | Path, *, async_save: bool):
        self.workdir = Path(workdir).absolute()
        self.manager = _manager(self.workdir / "checkpoints" / "best", max_to_keep=1, async_save=async_save)

    def __enter__(self) -> "BestCheckpoint":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def restore_latest(self, abstract_params: Any) -> tuple[int, Any] | None:
        """(global step, parameters) of the newest readable best checkpoint, or None."""
        return _newest_readable(
            self.manager,
            self.workdir,
            lambda step: (
                self.manager.restore(
                    step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params))
                ).params
            ),
        )

    def save(self, global_step: int, params: Any, meta: dict[str, Any]) -> None:
        self.manager.save(
            global_step,
            args=ocp.args.Composite(params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta)),
        )

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    def discard_between(self, after: int, up_to: int) -> None:
        """Forgets saves in (after, up_to], the steps a resumed phase will run again (and save again
        where dev improves); saves of later phases stay."""
        for step in self.manager.all_steps():
            if after < step <= up_to:
                self.manager.delete(step)

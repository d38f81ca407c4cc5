"""Orbax checkpoints: where each kind lives and how a run finds its place again.

    WORKDIR/checkpoints/<phase>/<step>/   periodic, inside a phase: parameters, optimizer state, and the
                                          JSON state of the loop (stop tracker, best metric, wall time)
    WORKDIR/checkpoints/<phase>_end/      the phase boundary: final parameters and the phase's record
    WORKDIR/checkpoints/best/<step>/      parameters with the best dev metric so far

Resume order, per phase: a `<phase>_end` means the phase is done; else the latest periodic checkpoint;
else the phase starts from the previous phase's parameters (or the pretrained backbone) with a fresh
optimizer. Orbax writes each checkpoint to a temporary directory and renames it when complete, so a
process killed mid-save leaves the previous checkpoint intact.
"""

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.sharding import Sharding


def abstract_like(tree: Any, sharding: Sharding) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


class PhaseCheckpoints:
    """Periodic checkpoints of one phase; keeps the newest `max_to_keep`."""

    def __init__(self, workdir: str | Path, phase: str, *, max_to_keep: int, async_save: bool):
        self.manager = ocp.CheckpointManager(
            Path(workdir).absolute() / "checkpoints" / phase,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
            ),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: dict[str, Any], meta: dict[str, Any]) -> None:
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
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
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), record=ocp.args.JsonSave(record)
            ),
        )


def load_phase_end(
    workdir: str | Path, phase: str, abstract_params: Any
) -> tuple[Any, dict] | None:
    path = phase_end_path(workdir, phase)
    if not path.exists():
        return None
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        restored = checkpointer.restore(
            path,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract_params), record=ocp.args.JsonRestore()
            ),
        )
    return restored.params, restored.record


class BestCheckpoint:
    """Parameters with the best dev metric; the new one is written before the old one is deleted."""

    def __init__(self, workdir: str | Path, *, async_save: bool):
        self.manager = ocp.CheckpointManager(
            Path(workdir).absolute() / "checkpoints" / "best",
            options=ocp.CheckpointManagerOptions(
                max_to_keep=1, enable_async_checkpointing=async_save, create=True
            ),
        )

    def save(self, global_step: int, params: Any, meta: dict[str, Any]) -> None:
        self.manager.save(
            global_step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta)
            ),
        )

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    def discard_after(self, global_step: int) -> None:
        """Forgets saves newer than a restored checkpoint: the resumed run will make them again."""
        for step in self.manager.all_steps():
            if step > global_step:
                self.manager.delete(step)

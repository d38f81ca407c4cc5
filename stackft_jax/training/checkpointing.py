"""Orbax checkpoints: where each kind lives and how a run finds its place again.

    WORKDIR/checkpoints/<phase>/<step>/   periodic, inside a phase: the parameters the phase trains,
                                          optimizer state, and the JSON state of the loop (stop tracker,
                                          best metric, wall time)
    WORKDIR/checkpoints/<phase>_end/      the phase boundary: the final values of the parameters the
                                          phase trains, and the phase's record
    WORKDIR/checkpoints/best/<step>/      all parameters, with the best dev metric so far

A phase's checkpoints hold only the parameters it trains: the frozen ones (a frozen backbone: most of a
model) are bit-identical to the phase's starting parameters, which a resumed run rebuilds anyway (the
pretrained weights, then each earlier boundary). A fingerprint of those frozen values is saved beside
them and checked on restore, so a phase never resumes on top of other weights (say, a model folder that
changed since the run began).

Resume order, per phase: a readable `<phase>_end` means the phase is done; else the latest readable
periodic checkpoint;
else the phase starts from the previous phase's parameters (or the pretrained backbone) with a fresh
optimizer. Orbax writes each checkpoint to a temporary directory and renames it when complete, so a
process killed mid-save leaves the previous checkpoint intact (the temporary directory is removed when
the phase's checkpoints are next opened).

Every checkpoint carries a checksum of its arrays (`content_sha256`, sha256 over each array's name,
dtype, shape and bytes), written beside them at save (in its JSON item) and checked when it is read
back: orbax notices a truncated file, but bytes flipped inside an array's data read back as other
numbers. A checkpoint written before checksums has none and is read as before.

A checkpoint that cannot be read (a truncated or deleted file: a full disk, a bad copy, a storage fault)
or whose arrays differ from its checksum is moved to `WORKDIR/checkpoints/unreadable/`, never deleted,
and the next older one is tried (a warning names it); an
unreadable `<phase>_end` sends the phase back to its start (its periodic checkpoints are deleted once the
boundary checkpoint is written: they hold the optimizer state, most of a run's disk use).
"""

import hashlib
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import Sharding

from stackft_jax.runtime import cli_errors, records, sharding
from stackft_jax.training.optim import path_str

log = logging.getLogger(__name__)
T = TypeVar("T")


class FrozenParametersChanged(cli_errors.DataError):
    """A checkpoint's phase started from other frozen parameters than this run's (or changed them)."""


def trained_part(params: Any, trained: Any) -> dict[str, Any]:
    """The leaves of `params` that `trained` (a bool per leaf) marks, in the same nesting; subtrees
    without any are left out."""

    def keep(tree: Any, mask: Any) -> Any:
        if isinstance(tree, dict):
            kept = {key: keep(value, mask[key]) for key, value in tree.items()}
            return {key: value for key, value in kept.items() if value is not None} or None
        return tree if mask else None

    return keep(params, trained) or {}


def with_trained_part(params: Any, part: dict[str, Any]) -> Any:
    """`params` with the leaves of `part` (a `trained_part`, matched by path, so a part read back with
    string keys fits a model's integer-keyed layers) put in their places."""
    replacing = {path_str(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(part)[0]}
    merged = jax.tree_util.tree_map_with_path(lambda path, leaf: replacing.pop(path_str(path), leaf), params)
    if replacing:
        raise ValueError(f"a checkpoint holds parameters the model does not have: {sorted(replacing)[:3]}")
    return merged


def marks_of(params: Any, part: dict[str, Any]) -> Any:
    """The `trained` marks (a bool per leaf of `params`) of the leaves `part` holds."""
    names = {path_str(path) for path, _ in jax.tree_util.tree_flatten_with_path(part)[0]}
    return jax.tree_util.tree_map_with_path(lambda path, _: path_str(path) in names, params)


def hash_leaves(h: Any, tree: Any, skip: Any = None) -> None:
    """Feeds `h` (a hashlib object) every leaf of `tree` (names, dtypes, shapes and bytes), but those
    that `skip` (a bool per leaf) marks."""
    marks = jax.tree.leaves(skip) if skip is not None else None
    for i, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(tree)[0]):
        if marks is not None and marks[i]:
            continue
        array = sharding.local_copy(leaf)
        h.update(f"{jax.tree_util.keystr(path)}|{array.dtype}|{array.shape}".encode())
        h.update(np.ascontiguousarray(array).tobytes())


CHECKSUM = "content_sha256"  # the key of a checkpoint's checksum in its JSON item


class ChecksumMismatch(cli_errors.DataError):
    """A checkpoint's arrays read back differ from the checksum written when it was saved."""


def content_digest(tree: Any) -> str:
    """sha256 over every leaf's name, dtype, shape and bytes, in name order: a tree read back with
    string keys (`layers/"10"`) hashes as the integer-keyed tree it was saved from."""
    h = hashlib.sha256()
    leaves = sorted(jax.tree_util.tree_flatten_with_path(tree)[0], key=lambda item: path_str(item[0]))
    for path, leaf in leaves:
        array = np.ascontiguousarray(sharding.local_copy(leaf))
        h.update(f"{path_str(path)}|{array.dtype}|{array.shape}".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def verify(tree: Any, recorded: dict[str, Any]) -> None:
    """Raises ChecksumMismatch when `tree`, read back from a checkpoint, differs from the checksum its
    JSON item `recorded` holds (a checkpoint without one predates checksums: accepted)."""
    expected = recorded.get(CHECKSUM) if isinstance(recorded, dict) else None
    if expected is not None and content_digest(tree) != expected:
        raise ChecksumMismatch(
            "its arrays differ from the checksum written when it was saved (bytes changed on disk since)"
        )


def frozen_fingerprint(params: Any, trained: Any) -> str:
    """A hash of the leaves `trained` does not mark: names, shapes, dtypes and bytes."""
    h = hashlib.blake2b(digest_size=16)
    hash_leaves(h, params, skip=trained)
    return h.hexdigest()


def _changed_frozen(where: str) -> FrozenParametersChanged:
    return FrozenParametersChanged(
        f"{where} was saved by a phase that started from other frozen parameters than this run's (the "
        "model folder or an earlier phase's checkpoint changed since the run began); it holds only the "
        "trained parameters, so it cannot be used with these: rerun in a new --workdir"
    )


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
    """Periodic checkpoints of one phase; keeps the newest `max_to_keep`. A state's parameters are
    saved as their `trained_part`; `frozen` fingerprints the rest, the phase's starting values."""

    def __init__(
        self,
        workdir: str | Path,
        phase: str,
        *,
        trained: Any,
        frozen: str,
        max_to_keep: int,
        async_save: bool,
    ):
        self.workdir = Path(workdir).absolute()
        self.trained, self.frozen = trained, frozen
        self.manager = _manager(
            self.workdir / "checkpoints" / phase, max_to_keep=max_to_keep, async_save=async_save
        )

    def restore_latest(
        self, abstract_state: dict[str, Any], start_params: Any
    ) -> tuple[int, dict[str, Any], dict] | None:
        """(step, state, loop meta) of the newest readable checkpoint, its frozen parameters taken from
        `start_params`; or None."""
        abstract = {**abstract_state, "params": trained_part(abstract_state["params"], self.trained)}

        def verified(step: int) -> tuple[dict[str, Any], dict]:
            state, meta = self.restore(step, abstract)
            verify(state, meta)
            return state, meta

        found = _newest_readable(self.manager, self.workdir, verified)
        if found is None:
            return None
        step, (state, meta) = found
        where = Path(self.manager.directory) / str(step)
        if "frozen_fingerprint" not in meta:
            raise FrozenParametersChanged(
                f"{where} was written by a stackft_jax older than checkpoints of trained parameters "
                "alone: finish the run with that version, or rerun in a new --workdir"
            )
        if meta["frozen_fingerprint"] != self.frozen:
            raise _changed_frozen(str(where))
        return step, {**state, "params": with_trained_part(start_params, state["params"])}, meta

    def save(self, step: int, state: dict[str, Any], meta: dict[str, Any]) -> None:
        state = {**state, "params": trained_part(state["params"], self.trained)}
        meta = {**meta, "frozen_fingerprint": self.frozen, CHECKSUM: content_digest(state)}
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


def save_phase_end(
    workdir: str | Path, phase: str, params: Any, trained: Any, record: dict[str, Any], *, frozen: str
) -> None:
    """The phase's trained parameters (`trained_part`), its record, and `frozen`, the fingerprint of
    the frozen parameters it started from and ended with."""
    part = trained_part(params, trained)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        checkpointer.save(
            phase_end_path(workdir, phase),
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(part),
                record=ocp.args.JsonSave(record),
                frozen=ocp.args.JsonSave({"fingerprint": frozen, CHECKSUM: content_digest(part)}),
            ),
        )


def load_phase_end(
    workdir: str | Path, phase: str, start_params: Any, trained: Any, *, frozen: str, sharding: Sharding
) -> tuple[Any, dict] | None:
    """The phase's final parameters (its trained ones over `start_params`, the parameters it starts
    from, whose frozen leaves hash to `frozen`) and record, or None if it has not finished (or its
    boundary checkpoint is unreadable: then it is moved aside and the phase resumes from its periodic
    ones)."""
    path = phase_end_path(workdir, phase)
    if not path.exists():
        return None
    try:
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
            restored = checkpointer.restore(
                path,
                args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(
                        abstract_like(trained_part(start_params, trained), sharding)
                    ),
                    record=ocp.args.JsonRestore(),
                    frozen=ocp.args.JsonRestore(),
                ),
            )
        verify(restored.params, restored.frozen)
    except Exception as error:  # orbax/tensorstore raise many types for a damaged file
        _move_aside(path, Path(workdir).absolute(), error)
        return None
    if restored.frozen["fingerprint"] != frozen:
        raise _changed_frozen(str(path))
    return with_trained_part(start_params, restored.params), restored.record


def read_phase_end(workdir: str | Path, phase: str) -> tuple[dict[str, Any], dict, str]:
    """A finished phase's boundary checkpoint as written, onto one device: (trained part, record,
    fingerprint of the frozen parameters it started from)."""
    path = phase_end_path(workdir, phase)
    one_device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    try:
        with ocp.StandardCheckpointer() as checkpointer:  # whatever devices or processes wrote it
            target = jax.tree.map(
                lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one_device),
                checkpointer.metadata(path / "params").item_metadata,
            )
            part = checkpointer.restore(path / "params", target)
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
            restored = checkpointer.restore(
                path, args=ocp.args.Composite(record=ocp.args.JsonRestore(), frozen=ocp.args.JsonRestore())
            )
        verify(part, restored.frozen)
    except Exception as error:  # orbax/tensorstore raise many types for a damaged file
        raise unreadable(path, error) from None
    return part, restored.record, restored.frozen["fingerprint"]


def unreadable(path: Path, error: Exception) -> records.DamagedRecord:
    """The one line for a checkpoint a command that only reads (predict, export) cannot use."""
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    return records.damaged(path, f"{type(error).__name__}: {first}", records.RESUME_CHECKPOINT)


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

        def verified(step: int) -> Any:
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(abstract_params), meta=ocp.args.JsonRestore()
                ),
            )
            verify(restored.params, restored.meta)
            return restored.params

        return _newest_readable(self.manager, self.workdir, verified)

    def save(self, global_step: int, params: Any, meta: dict[str, Any]) -> None:
        meta = {**meta, CHECKSUM: content_digest(params)}
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

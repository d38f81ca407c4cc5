"""What binds a workdir to one run: the config it was started with, and the lock of the live process.

    WORKDIR/config.json            the first run's config (plus the global batch size it trained with)
    WORKDIR/config_history.jsonl   configs replaced by a rerun with --allow_config_change
    WORKDIR/locks/process-<i>.lock held by process i of the live run (an flock: the kernel releases it
                                   when the process dies, so a killed run never blocks its rerun)

A rerun resumes only the run its workdir belongs to: if a key that changes results differs from the
recorded config, the rerun is refused before any work, with the differing keys listed.
"""

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
HISTORY_FILE = "config_history.jsonl"
# Keys of the record that change how a run is watched or stored, never what it computes: they may
# differ on a rerun.
RESULT_NEUTRAL_KEYS = frozenset(
    f"config.{key}"
    for key in (
        "log_every_steps",
        "checkpoint_every_steps",
        "keep_checkpoints",
        "async_checkpointing",
        "eval_per_device_batch_size",
        "data.cache_dir",
        "model.allow_pickle",
        "compilation_cache_dir",
        "phase1.feature_cache_dir",
    )
)


class WorkdirInUse(RuntimeError):
    """Another live process holds the workdir."""


class ConfigMismatch(ValueError):
    """The workdir belongs to a run with another config."""


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}, "c": [{"d": 2}]} -> {"a.b": 1, "c.0.d": 2} (lists of blocks by index)."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            flat.update(flatten({str(i): v for i, v in enumerate(value)}, f"{name}."))
        else:
            flat[name] = value
    return flat


def config_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple]:
    """{key: (recorded value, current value)} for every key that changes results and differs (a key
    present on one side only shows `<absent>` on the other)."""
    old, new = flatten(recorded), flatten(current)
    absent = "<absent>"
    return {
        key: (old.get(key, absent), new.get(key, absent))
        for key in sorted(old.keys() | new.keys())
        if key not in RESULT_NEUTRAL_KEYS
        and not (key.startswith("config.phases.") and key.endswith(".feature_cache_dir"))
        and old.get(key, absent) != new.get(key, absent)
    }


def _write_json_atomically(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


# What a run leaves once it has done any work; a workdir with none of these (a run refused by a check
# after binding, e.g. a phase rule that labels no parameter) holds nothing a new config could mix with.
PROGRESS = ("checkpoints", "metrics.jsonl", "results.json", "predictions", "feature_cache")


def holds_progress(workdir: Path) -> bool:
    return any((workdir / name).exists() for name in PROGRESS)


def bind_config(
    workdir: Path,
    record: dict[str, Any],
    *,
    allow_change: bool,
    compare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """Records `record` (the config and what else decides results) as the workdir's on its first run;
    on a rerun, refuses a record that differs in a key that changes results, unless `allow_change` (or
    the workdir holds no progress yet), which records the new one and appends the old one to
    config_history.jsonl. `compare` maps a record (the recorded one, or `record` itself) to what is
    compared: train.run resolves both into the keys the run uses (spec.binding_form)."""
    path = workdir / CONFIG_FILE
    original = record
    # JSON round trip: the comparison sees what a later rerun will read back (tuples become lists).
    record = json.loads(json.dumps(record))
    if path.exists():
        recorded = json.loads(path.read_text())
        differences = (
            config_differences(recorded, record)
            if compare is None
            else config_differences(*(json.loads(json.dumps(compare(r))) for r in (recorded, original)))
        )
        if not differences:
            return
        if not allow_change and holds_progress(workdir):
            listed = "\n".join(
                f"  {key}: {old!r} recorded, {new!r} now" for key, (old, new) in differences.items()
            )
            raise ConfigMismatch(
                f"{workdir} belongs to a run with another config; rerunning into it would mix the two "
                f"runs' checkpoints and results. Keys that differ:\n{listed}\n"
                "Use a new --workdir for the new config, or pass --allow_config_change (train.run: "
                "allow_config_change=True) to continue this run with the new values on purpose."
            )
        if not allow_change:
            log.warning("%s: replacing the config of a run that did no work (%s)", workdir, list(differences))
        if jax.process_index() == 0:
            with (workdir / HISTORY_FILE).open("a") as f:
                f.write(json.dumps({"replaced_at": time.time(), "record": recorded}) + "\n")
    if jax.process_index() == 0:
        _write_json_atomically(path, record)


@contextlib.contextmanager
def exclusive(workdir: Path) -> Iterator[None]:
    """Holds this process's lock on `workdir` for the duration; refuses a workdir a live process holds.
    On file systems without flock support the run goes on unlocked."""
    lock_dir = workdir / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / f"process-{jax.process_index()}.lock"
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise WorkdirInUse(
                f"{workdir} is in use by a live run ({holder}; lock {path}). Wait for it to finish or "
                "stop it; a killed run releases the lock by itself."
            ) from None
        except OSError:  # no flock on this file system (some FUSE mounts): run unlocked
            locked = False
        if locked:
            f.seek(0)
            f.truncate()
            f.write(
                f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
            )
            f.flush()
        try:
            yield
        finally:
            if locked:
                f.seek(0)
                f.truncate()
                fcntl.flock(f, fcntl.LOCK_UN)

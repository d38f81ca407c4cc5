"""What binds a workdir to one run: the config it was started with, and the lock of the live process.

    WORKDIR/config.json            the first run's config (plus the global batch size it trained with)
    WORKDIR/config_history.jsonl   configs replaced by a rerun with --allow_config_change
    WORKDIR/data_files.json        size, modification time and sha256 of each split file the run read
    WORKDIR/replaced-<time>/       a run's progress set aside when --allow_config_change changed its
                                   strategy or phases (the new plan starts from scratch)
    WORKDIR/locks/process-<i>.lock held by process i of the live run (an flock: the kernel releases it
                                   when the process dies, so a killed run never blocks its rerun)

A rerun resumes only the run its workdir belongs to: if a key that changes results differs from the
recorded config, or a data file's content changed, the rerun is refused before any work, naming the
differing keys or the file. A grid workdir is bound to its grid config the same way (GRID below). A
workdir is new, empty, or its kind's own by these marker files (`refuse_foreign`): another tool's folder,
an export, a model folder, or a grid's folder for a run (a run's for a grid) is refused before anything
is written into it. The records are read through runtime/records.py: a damaged one is one line.
"""

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax

from stackft_jax.config import spec
from stackft_jax.config.spec import RunSpec
from stackft_jax.runtime import cli_errors, records

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
DATA_FILE = "data_files.json"
HISTORY_FILE = "config_history.jsonl"
# Keys of the record that change how a run is watched or stored, never what it computes: they may
# differ on a rerun.
RESULT_NEUTRAL_KEYS = frozenset(f"config.{key}" for key in spec.RESULT_NEUTRAL_KEYS)


class WorkdirInUse(cli_errors.UsageError):
    """Another live process holds the workdir."""


class ConfigMismatch(cli_errors.UsageError):
    """The workdir belongs to a run with another config, or read other data."""


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


def config_differences(
    recorded: Mapping[str, Any], current: Mapping[str, Any], *, neutral: frozenset[str] = RESULT_NEUTRAL_KEYS
) -> dict[str, tuple]:
    """{key: (recorded value, current value)} for every key that changes results and differs (a key
    present on one side only shows `<absent>` on the other)."""
    old, new = flatten(recorded), flatten(current)
    absent = "<absent>"
    return {
        key: (old.get(key, absent), new.get(key, absent))
        for key in sorted(old.keys() | new.keys())
        if key not in neutral
        and not any(key.startswith(f"{n}.") for n in neutral)
        # A location, wherever a record kept it (phase blocks did before it became a run option).
        and not key.endswith(".feature_cache_dir")
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


def _is_run_workdir(folder: Path) -> bool:
    """A run's workdir: its binding (config.json holding `config` and `global_batch_size`, which an
    encoder's config.json never has), or its fingerprints, or a results.json holding its config."""
    if (folder / DATA_FILE).is_file():
        return True
    for name, keys in (
        (CONFIG_FILE, ("config", "global_batch_size")),
        ("results.json", ("config", "phases")),
    ):
        try:
            record = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and all(key in record for key in keys):
            return True
    return False


def run_holding(path: str | Path) -> Path | None:
    """The run or grid workdir that `path` is or lies inside (None: none): what export, predict and
    ensemble must never write into, whatever --overwrite says, since a run's files are read by its
    resume, ensembles and grid reports."""
    target = Path(path).expanduser().resolve()
    for folder in (target, *target.parents):
        if folder.is_dir() and (_is_run_workdir(folder) or (folder / GRID.config_file).is_file()):
            return folder
    return None


def refuse_run_target(flag: str, path: str | Path) -> None:
    """Refuses `--flag=path` inside a run's (or a grid's) workdir (UsageError naming it)."""
    run = run_holding(path)
    if run is not None:
        where = "is" if run == Path(path).expanduser().resolve() else "is inside"
        what = "grid" if (run / GRID.config_file).is_file() and not _is_run_workdir(run) else "run"
        raise cli_errors.UsageError(
            f"--{flag}={path} {where} the workdir of the {what} {run}; a command never writes into a "
            f"{what}'s folder (even with --overwrite): choose a path outside it"
        )


@dataclasses.dataclass(frozen=True)
class Binding:
    """What a workdir of one kind records and compares: a run's config, or a grid's."""

    what: str  # "a run", "a grid": in the refusal
    config_file: str
    history_file: str
    neutral_keys: frozenset[str]  # keys that may differ on a rerun
    progress: tuple[str, ...]  # entries that show the workdir did work
    keys: tuple[str, ...]  # what its recorded config file holds (records.read_json)
    remedy: str  # what to do when that file is damaged


RUN = Binding(
    "a run", CONFIG_FILE, HISTORY_FILE, RESULT_NEUTRAL_KEYS, PROGRESS, ("config",), records.RESTORE_CONFIG
)
# A grid's cells are runs; its report, ensembles and paper figures come from them. These keys only shape
# the report (which rows, the paper's figures, the statistics' settings): changing them on a grid workdir
# rewrites the report and retrains nothing.
GRID_REPORT_ONLY_KEYS = (
    "paper_results",
    "comparisons",
    "equivalence_margin",
    "bootstrap_samples",
    "tuned_recipes",
)
GRID = Binding(
    "a grid",
    "grid_config.json",
    "grid_config_history.jsonl",
    frozenset(f"grid.{key}" for key in GRID_REPORT_ONLY_KEYS),
    ("runs", "ensembles", "report.json", "report.md"),
    ("grid",),
    records.RESTORE_GRID_CONFIG,
)


# What a run's lock leaves in a folder before anything else (a run refused before binding its workdir).
_LOCKS = "locks"
# What launch/run.sh writes into WORKDIR before the run starts: each host's log and pid.
_LAUNCH_LOGS = "logs"
EXPORT_RECORD = "head_config.json"  # an export folder's (trained/opening.py HEAD_CONFIG)


def _kind_of(folder: Path) -> str:
    """What `folder` is, by its marker files: "new" (absent, empty, or only a refused run's locks/ and the
    launch scripts' logs/), "run", "grid", "export", "model", or "other"."""
    if not folder.exists():
        return "new"
    entries = {p.name for p in folder.iterdir()}
    if entries <= {_LOCKS, _LAUNCH_LOGS}:
        return "new"
    if EXPORT_RECORD in entries:
        return "export"
    if GRID.config_file in entries or _holds_grid_runs(folder, entries):
        return "grid"
    if _is_run_workdir(folder):
        return "run"
    weights = (".safetensors", ".bin", ".msgpack", ".h5")
    if CONFIG_FILE in entries and any(name.endswith(weights) for name in entries):
        return "model"
    return "other"


# What a grid's folder holds (a grid's runs copied without its grid_config.json are one too); "examples":
# its runs' prediction keys and labels, once per grid (experiments/grid.py EXAMPLES).
_GRID_ENTRIES = frozenset(
    {*GRID.progress, GRID.config_file, GRID.history_file, "figures", "feature_cache", "examples", _LOCKS}
)


def _holds_grid_runs(folder: Path, entries: set[str]) -> bool:
    runs = folder / "runs"
    return (
        runs.is_dir()
        and all(name in _GRID_ENTRIES or name.startswith("replaced-") for name in entries)
        and all(run.is_dir() and _kind_of(run) in ("new", "run") for run in runs.iterdir())
    )


_WHAT = {
    "export": f"an export folder ({EXPORT_RECORD}); predict reads it with --model",
    "model": "a model folder (config.json and weights); a run reads it with --config.model.name_or_path",
    "grid": f"a grid's workdir ({GRID.config_file}, runs/); python -m stackft_jax.experiment continues it",
    "run": f"a run's workdir ({CONFIG_FILE}, {DATA_FILE}); python -m stackft_jax.main continues it",
}


def refuse_foreign(workdir: str | Path, binding: Binding) -> None:
    """A workdir is new, empty, or one of `binding`'s kind (a run's for `RUN`, a grid's for `GRID`), by
    its marker files; any other folder is refused (UsageError naming what it is) before anything is
    written into it: a rerun must never mix its files with another tool's, run's or grid's."""
    folder = Path(workdir)
    if folder.exists() and not folder.is_dir():
        return  # the caller's own one line: a workdir is a folder
    kind = _kind_of(folder)
    own = "run" if binding is RUN else "grid"
    if kind in ("new", own):
        return
    if kind == "other":
        names = sorted(p.name for p in folder.iterdir())
        listed = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        what = f"holds files this tool did not write ({listed})"
    else:
        what = f"is {_WHAT[kind]}"
    raise cli_errors.UsageError(
        f"--workdir={workdir} {what}; a {'grid' if own == 'grid' else 'run'}'s workdir is a new or empty "
        f"folder or {binding.what}'s own: choose a new --workdir (nothing was written)"
    )


def bind_config(
    workdir: Path,
    record: dict[str, Any],
    *,
    allow_change: bool,
    binding: Binding = RUN,
    compare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, tuple]:
    """Records `record` (the config and what else decides results) as the workdir's on its first run;
    on a rerun, refuses a record that differs in a key that changes results, unless `allow_change` (or
    the workdir holds no progress yet), which records the new one and appends the old one to the
    history file. Returns the differences it allowed ({}: none). `compare` maps a record (the recorded
    one, or `record` itself) to what is compared: `bind_run` resolves both into the keys the run uses
    (spec.binding_form)."""
    original = record
    workdir = Path(workdir)
    path = workdir / binding.config_file
    # JSON round trip: the comparison sees what a later rerun will read back (tuples become lists).
    record = json.loads(json.dumps(record))
    differences: dict[str, tuple] = {}
    recorded = None
    if path.exists():
        try:
            recorded = records.read_json(path, binding.remedy, keys=binding.keys)
        except records.DamagedRecord:
            if not allow_change:
                raise
            _set_aside_damaged(workdir, path, binding)
            recorded = None
    if recorded is not None:
        differences = (
            config_differences(recorded, record, neutral=binding.neutral_keys)
            if compare is None
            else config_differences(
                *(json.loads(json.dumps(compare(r))) for r in (recorded, original)),
                neutral=binding.neutral_keys,
            )
        )
        if not differences:
            return {}
        progress = any((workdir / name).exists() for name in binding.progress)
        if not allow_change and progress:
            listed = "\n".join(
                f"  {key}: {old!r} recorded, {new!r} now" for key, (old, new) in differences.items()
            )
            raise ConfigMismatch(
                f"{workdir} belongs to {binding.what} with another config; rerunning into it would mix "
                f"the old and new results. Keys that differ:\n{listed}\n"
                "Use a new --workdir for the new config, or pass --allow_config_change (in Python: "
                "allow_config_change=True) to continue with the new values on purpose."
            )
        if not allow_change:
            log.warning("%s: replacing the config of a run that did no work (%s)", workdir, list(differences))
        if jax.process_index() == 0:
            with (workdir / binding.history_file).open("a") as f:
                f.write(json.dumps({"replaced_at": time.time(), "record": recorded}) + "\n")
    if jax.process_index() == 0:
        workdir.mkdir(parents=True, exist_ok=True)
        _write_json_atomically(path, record)
    return differences


def _set_aside_damaged(workdir: Path, path: Path, binding: Binding) -> None:
    """--allow_config_change over a damaged record: what it bound cannot be compared, so a run's
    progress is set aside (WORKDIR/replaced-<time>/) and the damaged file is kept there beside it; a
    grid's runs stay (each keeps its own binding) and only its damaged record moves there. The caller
    then writes the new record in its place."""
    if jax.process_index() != 0:
        return
    reason = f"--allow_config_change over the damaged {path.name}"
    target = set_aside_progress(workdir, reason) if binding is RUN else None
    if target is None:
        target = workdir / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        target.mkdir(parents=True, exist_ok=True)
    os.replace(path, target / path.name)
    log.warning("%s: %s is damaged; kept as %s, and this command's record replaces it", workdir, path, target)


# Keys whose change makes another phase plan: the old plan's checkpoints and best must not be resumed.
RESTARTING_PREFIXES = ("config.strategy", "config.phases.", "config.unfreezing.")


def restarting_keys(differences: Mapping[str, tuple]) -> list[str]:
    """The differing keys that make another phase plan, the strategy first (what the user changed;
    the phase keys follow from it)."""
    rank = {p: i for i, p in enumerate(RESTARTING_PREFIXES)}
    found = [
        (rank[p], key) for key in differences for p in RESTARTING_PREFIXES if key == p or key.startswith(p)
    ]
    return [key for _, key in sorted(found)]


def set_aside_progress(workdir: Path, reason: str) -> Path | None:
    """Moves the run's checkpoints, metrics, predictions and results to WORKDIR/replaced-<time>/ (kept,
    not deleted), so a new phase plan starts from scratch. Feature caches stay (keyed by backbone)."""
    moving = [workdir / name for name in PROGRESS if name != "feature_cache" and (workdir / name).exists()]
    if not moving or jax.process_index() != 0:
        return None
    target = workdir / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}"
    target.mkdir(parents=True, exist_ok=True)
    for path in moving:
        os.replace(path, target / path.name)
    log.warning(
        "%s: %s; the earlier run's progress is moved to %s and this one starts over", workdir, reason, target
    )
    return target


def _fingerprint(path: Path, recorded: Mapping[str, Any] | None) -> dict[str, Any]:
    """Size, mtime and sha256 of a file; an unchanged size and mtime reuse the recorded hash."""
    stat = path.stat()
    if recorded and recorded.get("bytes") == stat.st_size and recorded.get("mtime_ns") == stat.st_mtime_ns:
        return dict(recorded)
    digest = _sha256(str(path), stat.st_size, stat.st_mtime_ns)
    return {"path": str(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """Keyed by size and mtime too: a grid checks one file for each of its runs, hashing it once."""
    del size, mtime_ns
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


TOKENIZER_KEY = "tokenizer"  # data_files.json's entry for the model folder's tokenizer files


def _tokenizer_record(model_dir: Path) -> dict[str, Any]:
    from stackft_jax.data import tokenization  # transformers: only when a run binds its files

    return {"path": str(model_dir), "files": tokenization.tokenizer_fingerprint(model_dir)}


def current_fingerprints(
    files: Mapping[str, str], model_dir: Path | None, recorded: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What data_files.json records for these split files (`{"data.dev_file": path}`) and the tokenizer
    of `model_dir`: the input a run's results come from."""
    recorded = recorded or {}
    current: dict[str, Any] = {
        key: _fingerprint(Path(file), recorded.get(key))
        for key, file in files.items()
        if file and Path(file).is_file()
    }
    if model_dir is not None:
        current[TOKENIZER_KEY] = _tokenizer_record(model_dir)
    return current


def fingerprint_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """One line per input whose content differs from its record. A file at another path is another
    config (compared there); a record without a tokenizer entry predates it and is accepted."""
    changes = []
    for key, now in current.items():
        old = recorded.get(key)
        if not old:
            continue
        if key == TOKENIZER_KEY:
            if old.get("files") != now["files"]:
                differing = sorted(
                    name
                    for name in old["files"].keys() | now["files"].keys()
                    if old["files"].get(name) != now["files"].get(name)
                )
                changes.append(
                    f"the tokenizer files of {now['path']} ({', '.join(differing)}) changed since this "
                    "workdir's run tokenized its data"
                )
        elif old["path"] == now["path"] and old["sha256"] != now["sha256"]:
            changes.append(
                f"config.{key} = {now['path']!r} changed since this workdir's run read it "
                f"({old['bytes']} -> {now['bytes']} bytes, sha256 {old['sha256'][:12]} -> "
                f"{now['sha256'][:12]})"
            )
    return changes


def read_fingerprints(workdir: Path) -> dict[str, Any]:
    path = Path(workdir) / DATA_FILE
    if not path.exists():
        return {}
    recorded = records.read_json(path, records.RESTORE_DATA_FILES)
    if not isinstance(recorded, dict) or not all(isinstance(v, dict) for v in recorded.values()):
        raise records.damaged(path, "not a record of files", records.RESTORE_DATA_FILES)
    return recorded


def tokenizer_changes(workdir: Path, model_dir: Path) -> list[str]:
    """How the tokenizer files of `model_dir` now differ from those the run in `workdir` recorded
    (data_files.json); [] when they match or it recorded none. Reads only: predict and export ask it
    as a rerun's binding does, since the run's parameters expect the ids of its own tokenizer."""
    recorded = read_fingerprints(workdir).get(TOKENIZER_KEY)
    if not recorded:
        return []
    return fingerprint_changes({TOKENIZER_KEY: recorded}, {TOKENIZER_KEY: _tokenizer_record(model_dir)})


def input_changes(workdir: Path, run_spec: RunSpec) -> list[str]:
    """How the data and tokenizer files `run_spec` names now differ from those the finished run in
    `workdir` recorded (data_files.json); [] when they match or it recorded none. Reads only. A grid asks
    this of every finished or reused run: results scored on other input must not be reported or copied
    as this grid's."""
    recorded = read_fingerprints(workdir)
    folder = None
    if TOKENIZER_KEY in recorded:  # runs recorded before tokenizer fingerprints never resolve the model
        try:
            folder = model_dir(run_spec)
        except (OSError, ValueError):  # no such folder now: training would say so
            folder = None
    return fingerprint_changes(recorded, current_fingerprints(data_files(run_spec), folder, recorded))


def bind_data(
    workdir: Path, files: Mapping[str, str], *, allow_change: bool, model_dir: Path | None = None
) -> None:
    """Records a fingerprint of each split file (`{"data.dev_file": path}`) and of the tokenizer files of
    `model_dir` on the first run; a rerun over changed content is refused, naming it, unless no progress
    yet: the run's checkpoints, best and metrics came from the old input. With `allow_change` the old
    progress is set aside (replaced-<time>/) and the old record goes to the config history, as for a
    change of strategy: nothing of the old input is mixed with the new."""
    workdir = Path(workdir)
    try:
        recorded = read_fingerprints(workdir)
    except records.DamagedRecord:
        if not allow_change:
            raise
        _set_aside_damaged(workdir, workdir / DATA_FILE, RUN)
        recorded = {}
    current = current_fingerprints(files, model_dir, recorded)
    changes = fingerprint_changes(recorded, current) if holds_progress(workdir) else []
    if changes and not allow_change:
        raise ConfigMismatch(
            f"{changes[0]}; its checkpoints and metrics come from the old content. Restore it, use a new "
            "--workdir, or pass --allow_config_change to start over on the new content"
        )
    if changes and jax.process_index() == 0:
        with (workdir / HISTORY_FILE).open("a") as f:
            f.write(json.dumps({"replaced_at": time.time(), DATA_FILE: recorded}) + "\n")
        set_aside_progress(workdir, f"--allow_config_change over changed input: {changes[0]}")
    if current != recorded and jax.process_index() == 0:
        _write_json_atomically(workdir / DATA_FILE, current)


def bind_run(workdir: Path, run_spec: RunSpec, *, global_batch_size: int, allow_change: bool) -> None:
    """Binds `workdir` to the run `run_spec` describes (RUN: its config and global batch size, then its
    data files), or refuses it (ConfigMismatch). Both configs are compared resolved (spec.binding_form):
    only what the run uses binds it, and a key newer than the record reads as its value now (a record
    lacking it predates it). A change to another phase plan sets the old plan's progress aside."""
    record = {"config": run_spec.raw, "global_batch_size": global_batch_size}

    def binding(r: dict) -> dict:
        if r is record:
            form = spec.binding_form(run_spec)
        else:
            try:
                form = spec.recorded_binding_form(r["config"], run_spec.raw)
            except ValueError as error:
                raise ConfigMismatch(
                    f"{workdir}/{CONFIG_FILE}: its recorded config no longer resolves ({error}); "
                    "use a new --workdir"
                ) from None
        return {**form, "global_batch_size": r.get("global_batch_size")}

    changed = bind_config(workdir, record, allow_change=allow_change, compare=binding)
    restarting = restarting_keys(changed)
    if restarting:  # another phase plan: the old one's checkpoints and best go
        set_aside_progress(workdir, f"--allow_config_change changed {restarting[0]}")
    bind_data(workdir, data_files(run_spec), allow_change=allow_change, model_dir=model_dir(run_spec))


def data_files(run_spec: RunSpec) -> dict[str, str]:
    return {f"data.{split}_file": run_spec.data.file(split) for split in spec.SPLITS}


def model_dir(run_spec: RunSpec) -> Path:
    from stackft_jax.models import bert  # flax: predict checks its targets with this module first

    return bert.resolve_model_dir(run_spec.model.name_or_path)


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

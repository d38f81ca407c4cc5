"""The one place a command reads the records a run or a grid left: results.json, config.json,
data_files.json, metrics.jsonl, grid_config.json, an export's manifest, and (through `damaged`) the
checkpoint arrays. Damage (a truncated or non-JSON file, a record of the wrong shape, a line cut in the
middle) becomes one `DamagedRecord` line naming the file and what to do, exit 1. Nothing here writes:
the damaged file stays as it is, for the user to restore, inspect or move aside.

    results = records.read_json(workdir / "results.json", records.RERUN_RESULTS.format(workdir=workdir))
"""

import json
from pathlib import Path
from typing import Any

from stackft_jax.runtime.cli_errors import DataError

# What to do, per record. `{workdir}` is the run's folder.
RERUN_RESULTS = (
    "rerun the run to score it again from its checkpoints: "
    "python -m stackft_jax.main --config={workdir}/config.json --workdir={workdir}"
)
RESTORE_CONFIG = (
    "restore it (config_history.jsonl keeps the configs it replaced), or rerun with --allow_config_change "
    "to record this command's config (the run's progress is then set aside and it starts over)"
)
RESTORE_DATA_FILES = (
    "restore it, or rerun with --allow_config_change to record the files as they are now (the run's "
    "progress is then set aside and it starts over)"
)
RESTORE_GRID_CONFIG = (
    "restore it (grid_config_history.jsonl keeps the configs it replaced), or rerun with "
    "--allow_config_change to record this command's grid config"
)
FIX_METRICS = "it holds the run's evaluations: mend or delete that line, or rerun the run in a new --workdir"
RESUME_CHECKPOINT = (
    "rerun the run's command (python -m stackft_jax.main with its --workdir): it moves a damaged "
    "checkpoint aside and resumes from the previous one"
)
LEFT_AS_IS = "the file is left as it is"


class DamagedRecord(DataError):
    """A record a command reads is truncated, not JSON, or not the record it should be."""


def damaged(path: str | Path, problem: str, remedy: str) -> DamagedRecord:
    """The one line for a damaged record: where, what is wrong, what to do."""
    return DamagedRecord(f"{path} is damaged ({problem}); {remedy} ({LEFT_AS_IS})")


def _problem(error: Exception) -> str:
    if isinstance(error, json.JSONDecodeError):
        cut = error.pos >= len(error.doc.rstrip()) or error.msg.startswith("Unterminated string")
        what = "truncated" if cut else "not JSON"
        return f"{what}: {error.msg} at line {error.lineno} column {error.colno}"
    if isinstance(error, UnicodeDecodeError):
        return f"not text: the byte at offset {error.start} is no UTF-8"
    return f"{type(error).__name__}: {error}"


def parse_json(text: str, path: str | Path, remedy: str, *, keys: tuple[str, ...] = ()) -> Any:
    """`text` (the content of `path`) as JSON; with `keys`, an object holding each of them."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise damaged(path, _problem(error), remedy) from None
    if keys:
        if not isinstance(value, dict):
            raise damaged(path, f"a JSON {type(value).__name__} where an object is expected", remedy)
        missing = [key for key in keys if key not in value]
        if missing:
            raise damaged(path, f"no {', '.join(map(repr, missing))} in it", remedy)
    return value


def read_json(path: str | Path, remedy: str, *, keys: tuple[str, ...] = ()) -> Any:
    """The JSON record in `path` (FileNotFoundError when there is none: the caller says what that
    means); damage is a DamagedRecord naming `path` and `remedy`."""
    try:
        text = Path(path).read_bytes().decode()
    except UnicodeDecodeError as error:
        raise damaged(path, _problem(error), remedy) from None
    return parse_json(text, path, remedy, keys=keys)


def read_jsonl(path: str | Path, remedy: str) -> tuple[list[dict[str, Any]], bool]:
    """(records, whether the last line was cut) of a JSON-lines file written by appending: a last line
    without its newline that does not parse is what a process killed mid-write leaves, so it is left
    out (and reported); any other line that does not parse is damage, named by its line number."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    cut = bool(lines) and lines[-1] != b""  # the text after the last newline
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode())
        except ValueError as error:
            if cut and number == len(lines):
                return records, True
            raise damaged(f"{path}:{number}", _problem(error).split(" at line")[0], remedy) from None
        if not isinstance(record, dict):
            raise damaged(f"{path}:{number}", f"a JSON {type(record).__name__}, not a record", remedy)
        records.append(record)
    return records, False

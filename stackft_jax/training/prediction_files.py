"""Prediction files: WORKDIR/predictions/<split>.jsonl, one JSON record per example in file order.

A run writes them plain; a grid compresses each finished run's to `<split>.jsonl.gz` (`compress`), so
that the per-run records a grid commits stay light. `path` finds either and `read` reads either.

Every record has a `key` (data/task_spec.py: the example's id or line in its file plus a hash of its
text), the same in every run over the same file, so that ensembles and paired significance tests can
match two runs example by example, and a file of other data is noticed. The rest is the task's
(sentence tasks: `prediction`, `label`, and for classification `probabilities`).

    from stackft_jax.training import prediction_files
    for a, b in prediction_files.paired("runs/s0/predictions/dev.jsonl", "runs/s1/predictions/dev.jsonl"):
        ...
"""

import gzip
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stackft_jax.runtime import records as run_records

COMPRESSED = ".gz"


def path(workdir: str | Path, split: str) -> Path:
    """WORKDIR/predictions/<split>.jsonl, or its compressed form where only that exists."""
    plain = Path(workdir) / "predictions" / f"{split}.jsonl"
    compressed = plain.with_name(plain.name + COMPRESSED)
    return compressed if compressed.is_file() and not plain.is_file() else plain


def _sibling(file: Path) -> Path:
    """The other form of a prediction file: x.jsonl <-> x.jsonl.gz."""
    return file.with_suffix("") if file.suffix == COMPRESSED else file.with_name(file.name + COMPRESSED)


def _write_bytes(file: Path, data: bytes) -> None:
    """`data` as `file` (gzip where it ends in .gz, with no time or name in the header: the same records
    give the same bytes), written whole (tmp file + rename); the other form beside it is removed, so a
    split never has two files that could disagree."""
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(file.name + ".tmp")
    with tmp.open("wb") as raw:
        if file.suffix == COMPRESSED:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
                f.write(data)
        else:
            raw.write(data)
    os.replace(tmp, file)
    _sibling(file).unlink(missing_ok=True)


def write(file: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Writes the records as JSON lines (compressed where `file` ends in .gz)."""
    _write_bytes(Path(file), "".join(json.dumps(record) + "\n" for record in records).encode())


def compress(workdir: str | Path) -> list[Path]:
    """Replaces each WORKDIR/predictions/*.jsonl by its gzip form (the same bytes once unpacked, about a
    tenth of them on disk); returns the compressed files."""
    written = []
    for plain in sorted((Path(workdir) / "predictions").glob("*.jsonl")):
        _write_bytes(_sibling(plain), plain.read_bytes())
        written.append(_sibling(plain))
    return written


def read(file: str | Path) -> dict[str, dict[str, Any]]:
    """key -> record, in file order; a record without a key, or a key twice, is an error at its line;
    a damaged file (cut, not JSON) is one line naming it (records.py): the run writes it again."""
    records: dict[str, dict[str, Any]] = {}
    file = Path(file)
    remedy = run_records.RERUN_RESULTS.format(workdir=file.parent.parent)  # WORKDIR/predictions/<file>
    try:
        with gzip.open(file, "rt") if file.suffix == COMPRESSED else file.open() as f:
            lines = list(f)
    except (EOFError, gzip.BadGzipFile, UnicodeDecodeError) as error:
        raise run_records.damaged(file, f"{type(error).__name__}: {error}", remedy) from None
    for number, line in enumerate(lines, start=1):
        record = run_records.parse_json(line, f"{file}:{number}", remedy)
        key = record.get("key") if isinstance(record, dict) else None
        if key is None:
            raise ValueError(f"{file}:{number}: record has no `key`")
        if key in records:
            raise ValueError(f"{file}:{number}: key {key!r} appears twice")
        records[key] = record
    return records


def paired(file_a: str | Path, file_b: str | Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The two files' records matched by key, in `file_a`'s order. Files of different examples (other
    data, another split, an edited file) are an error naming a key that only one of them has."""
    a, b = read(file_a), read(file_b)
    only_a, only_b = [k for k in a if k not in b], [k for k in b if k not in a]
    if only_a or only_b:
        file, key = (file_a, only_a[0]) if only_a else (file_b, only_b[0])
        raise ValueError(
            f"{file_a} and {file_b} hold different examples ({len(only_a)} keys only in the first, "
            f"{len(only_b)} only in the second), e.g. {key!r} only in {file}"
        )
    return [(record, b[key]) for key, record in a.items()]

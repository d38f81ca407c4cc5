"""Prediction files: WORKDIR/predictions/<split>.jsonl, one JSON record per example in file order.

A run writes them plain; a grid keeps each finished run's compact (`compact`: `<split>.npz`, its keys and
labels once per grid in GRID/examples/, compact_predictions.py), so that the per-run records a grid
commits stay light. Grids from before that hold `<split>.jsonl.gz`. `path` finds any of the three forms,
`read` reads any, and a split never has two (writing one form removes the others).

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
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stackft_jax.runtime import records as run_records
from stackft_jax.training import compact_predictions

PLAIN, COMPRESSED, COMPACT = ".jsonl", ".jsonl.gz", compact_predictions.SUFFIX
FORMS = (PLAIN, COMPRESSED, COMPACT)  # the order `path` prefers them in


def _split_of(file: Path) -> str:
    for suffix in sorted(FORMS, key=len, reverse=True):  # .jsonl.gz before .jsonl
        if file.name.endswith(suffix):
            return file.name.removesuffix(suffix)
    raise ValueError(f"{file}: not a prediction file (it ends in none of {', '.join(FORMS)})")


def _forms(file: Path) -> list[Path]:
    """Every form of the prediction file's split, `file`'s own included."""
    return [file.with_name(_split_of(file) + suffix) for suffix in FORMS]


def path(workdir: str | Path, split: str) -> Path:
    """WORKDIR/predictions/<split>.jsonl, or the form of it that exists (.jsonl.gz, .npz)."""
    plain = Path(workdir) / "predictions" / f"{split}{PLAIN}"
    return next((f for f in _forms(plain) if f.is_file()), plain)


def drop_other_forms(file: str | Path) -> None:
    """Removes the split's files of other forms than `file`: a split never has two that could disagree."""
    for other in _forms(Path(file)):
        if other != Path(file):
            other.unlink(missing_ok=True)


def write(
    file: str | Path, records: Iterable[dict[str, Any]], examples_dir: str | Path | None = None
) -> None:
    """Writes the records in `file`'s form: JSON lines, gzip-compressed where it ends in .jsonl.gz (with
    no time or name in the header: the same records give the same bytes), compact where it ends in .npz
    (its examples in `examples_dir`, by default where `file`'s present form keeps them). Written whole
    (tmp file + rename); the split's other forms are removed."""
    file = Path(file)
    if file.name.endswith(COMPACT):
        if examples_dir is None:
            if not file.is_file():
                raise ValueError(f"{file}: a new compact prediction file needs the folder for its examples")
            examples_dir = compact_predictions.examples_file(file).parent
        compact_predictions.write(file, list(records), examples_dir)
    else:
        data = "".join(json.dumps(record) + "\n" for record in records).encode()
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(file.name + ".tmp")
        with tmp.open("wb") as raw:
            if file.name.endswith(COMPRESSED):
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
                    f.write(data)
            else:
                raw.write(data)
        os.replace(tmp, file)
    drop_other_forms(file)


def compact(workdir: str | Path, examples_dir: str | Path, *, source: str | Path | None = None) -> list[Path]:
    """Makes each split of WORKDIR/predictions compact, its examples in `examples_dir` (a grid's
    examples/ folder), read from the same split of `source`'s predictions (default: WORKDIR's own, in
    any form); returns the files written. A split already compact against `examples_dir` is left."""
    workdir, examples_dir = Path(workdir), Path(examples_dir)
    folder = Path(source if source is not None else workdir) / "predictions"
    splits = sorted({_split_of(f) for f in folder.glob("*") if f.is_file() and f.name.endswith(FORMS)})
    written = []
    for split in splits:
        origin, target = path(folder.parent, split), workdir / "predictions" / f"{split}{COMPACT}"
        if origin == target:
            shared = compact_predictions.examples_file(target)
            if shared.is_file() and shared.parent.resolve() == examples_dir.resolve():
                continue
        write(target, list(read(origin).values()), examples_dir)
        written.append(target)
    return written


def read(file: str | Path) -> dict[str, dict[str, Any]]:
    """key -> record, in file order; a record without a key, or a key twice, is an error at its line
    (its record's number, in a compact file); a damaged file (cut, not JSON, not an archive) is one line
    naming it (records.py): the run writes it again."""
    records: dict[str, dict[str, Any]] = {}
    file = Path(file)
    remedy = run_records.RERUN_RESULTS.format(workdir=file.parent.parent)  # WORKDIR/predictions/<file>
    try:
        if file.name.endswith(COMPACT):
            lines: list[Any] = list(compact_predictions.read(file))
        else:
            with gzip.open(file, "rt") if file.name.endswith(COMPRESSED) else file.open() as f:
                lines = [run_records.parse_json(line, f"{file}:{n}", remedy) for n, line in enumerate(f, 1)]
    except (EOFError, gzip.BadGzipFile, UnicodeDecodeError, zipfile.BadZipFile) as error:
        raise run_records.damaged(file, f"{type(error).__name__}: {error}", remedy) from None
    for number, record in enumerate(lines, start=1):
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

"""Prediction files: WORKDIR/predictions/<split>.jsonl, one JSON record per example in file order.

Every record has a `key` (data/task_spec.py: the example's id or line in its file plus a hash of its
text), the same in every run over the same file, so that ensembles and paired significance tests can
match two runs example by example, and a file of other data is noticed. The rest is the task's
(sentence tasks: `prediction`, `label`, and for classification `probabilities`).

    from stackft_jax.training import prediction_files
    for a, b in prediction_files.paired("runs/s0/predictions/dev.jsonl", "runs/s1/predictions/dev.jsonl"):
        ...
"""

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def path(workdir: str | Path, split: str) -> Path:
    return Path(workdir) / "predictions" / f"{split}.jsonl"


def write(file: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Writes the records, replacing the file whole (tmp file + rename)."""
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(".jsonl.tmp")
    with tmp.open("w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    os.replace(tmp, file)


def read(file: str | Path) -> dict[str, dict[str, Any]]:
    """key -> record, in file order; a record without a key, or a key twice, is an error at its line."""
    records: dict[str, dict[str, Any]] = {}
    with Path(file).open() as f:
        for number, line in enumerate(f, start=1):
            record = json.loads(line)
            key = record.get("key")
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

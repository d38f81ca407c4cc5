"""Compact prediction files: a split's records as column arrays in a `.npz`, and what describes the
example rather than the run (`key`, `label`, `label_name`) kept once, in an examples file its runs share.

A grid's runs (and its ensembles) score the same dev and test files: as JSON lines, each of its prediction
files repeats every example's key and label, and a classification run's probabilities are written as
17-digit decimals. Here each run keeps only its own columns; the grid keeps the examples once:

    GRID/examples/<split>-<digest>.npz        key, label, label_name of each example, in file order
    GRID/runs/<run>/predictions/<split>.npz   the run's other fields (prediction, probabilities, ...)

An examples file is named by a digest of its content, so runs over other data (or another order) get an
examples file of their own, and a run's file names it by its path relative to the run's file (an
ensemble two folders below the grid finds it as a run does). Lossless: `read` gives back the records
`write` was given, value for value and in field order; floats bit for bit (float32 where every value of
a column is one, as a run's softmax probabilities are; float64 otherwise, as an ensemble's means are).
A row of probabilities keeps its last entry as the difference, in float bits, from 1 minus the others:
mostly zero or a few ulps, so it costs about a byte instead of four. Every committed grid report is
recomputed from these files to the digit (tests/test_committed_reports.py).

Columns by the JSON type of their values: int, float, str (a vocabulary and indices), equal-length float
rows (probabilities), lists of any of these (a tagger's tags: lengths and the flattened items), and JSON
for anything else. Files are written whole (tmp + rename) and byte for byte the same for the same records
(zip entries sorted, with a fixed time), so that rewriting a committed grid's files changes nothing.
"""

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

SUFFIX = ".npz"
# The fields that describe the example, not the run: the same in every run over the same file.
EXAMPLE_FIELDS = ("key", "label", "label_name")
FORMAT = "stackft_jax compact predictions 1"
_HEADER = "header"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can carry: no clock in the bytes


def _smallest_int(values: np.ndarray) -> np.ndarray:
    """`values` (integers) in the narrowest integer dtype that holds them all."""
    low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
    for dtype in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.int64):
        if np.iinfo(dtype).min <= low and high <= np.iinfo(dtype).max:
            return values.astype(dtype)
    raise OverflowError(f"integers from {low} to {high} do not fit in 64 bits")


def _float_array(values: Sequence[Any]) -> np.ndarray:
    """float32 where that keeps every value bit for bit, else float64."""
    wide = np.asarray(values, dtype=np.float64)
    narrow = wide.astype(np.float32)
    return narrow if np.array_equal(narrow.astype(np.float64), wide, equal_nan=True) else wide


def _complement(rows: np.ndarray) -> np.ndarray:
    """1 minus the sum of each row's entries but the last, summed left to right (elementwise IEEE
    arithmetic: the same bits on every machine)."""
    total = np.zeros(len(rows), dtype=rows.dtype)
    for column in range(rows.shape[1] - 1):
        total = total + rows[:, column]
    return rows.dtype.type(1) - total


def _bits(values: np.ndarray) -> np.ndarray:
    return values.view(np.int32 if values.dtype == np.float32 else np.int64)


def _all(values: Sequence[Any], kind: type) -> bool:
    return all(type(v) is kind for v in values)  # `type is`: a bool is not an int, an int not a float


def _encode(name: str, values: Sequence[Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The column's description for the header; its arrays are added to `arrays` under `name`."""
    if values and _all(values, int) and all(-(2**63) <= v < 2**63 for v in values):
        arrays[name] = _smallest_int(np.asarray(values, dtype=np.int64))
        return {"kind": "int"}
    if values and _all(values, float):
        arrays[name] = _float_array(values)
        return {"kind": "float"}
    if values and _all(values, str):
        vocabulary = list(dict.fromkeys(values))
        if vocabulary != list(values):  # not a column of distinct strings (keys): indices needed
            index = {v: i for i, v in enumerate(vocabulary)}
            arrays[name] = _smallest_int(np.asarray([index[v] for v in values], dtype=np.int64))
        return {"kind": "str", "vocabulary": vocabulary}
    if values and _all(values, list):
        lengths = {len(v) for v in values}
        flat = [item for v in values for item in v]
        if len(lengths) == 1 and lengths != {0} and _all(flat, float):  # rows, e.g. class probabilities
            rows = _float_array(values)
            if rows.shape[1] == 1:
                arrays[name] = rows
                return {"kind": "rows"}
            arrays[name] = rows[:, :-1]
            arrays[f"{name}.last"] = _smallest_int(_bits(rows[:, -1]) - _bits(_complement(rows)))
            return {"kind": "rows"}
        arrays[f"{name}.lengths"] = _smallest_int(np.asarray([len(v) for v in values], dtype=np.int64))
        return {"kind": "list", "items": _encode(f"{name}.items", flat, arrays)}
    return {"kind": "json", "values": list(values)}


def _decode(name: str, column: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Any]:
    kind = column["kind"]
    if kind in ("int", "float"):
        return arrays[name].tolist()
    if kind == "str":
        vocabulary = column["vocabulary"]
        return list(vocabulary) if name not in arrays else [vocabulary[i] for i in arrays[name].tolist()]
    if kind == "rows":
        stored = arrays[name]
        if f"{name}.last" not in arrays:
            return stored.tolist()
        full = np.concatenate([stored, np.zeros((len(stored), 1), dtype=stored.dtype)], axis=1)
        last = _bits(_complement(full)) + arrays[f"{name}.last"].astype(np.int64).astype(_bits(stored).dtype)
        full[:, -1] = last.view(stored.dtype)
        return full.tolist()
    if kind == "list":
        lengths = arrays[f"{name}.lengths"].tolist()
        flat = _decode(f"{name}.items", column["items"], arrays)
        ends = np.cumsum([0, *lengths]).tolist()
        return [flat[start:end] for start, end in zip(ends[:-1], ends[1:], strict=True)]
    if kind == "json":
        return column["values"]
    raise ValueError(f"column {name!r} has an unknown kind {kind!r}")


def _columns(records: Sequence[dict[str, Any]], fields: Sequence[str]) -> tuple[dict, dict[str, np.ndarray]]:
    arrays: dict[str, np.ndarray] = {}
    columns = {f: _encode(f, [r[f] for r in records], arrays) for f in fields}
    return columns, arrays


def _save(file: Path, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """An .npz (np.load reads it) of the header and arrays, the same bytes for the same content."""
    entries = {_HEADER: np.asarray(json.dumps(header, sort_keys=True)), **arrays}
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w") as archive:
        for name in sorted(entries):
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asarray(entries[name], order="C"), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            archive.writestr(info, buffer.getvalue(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    os.replace(tmp, file)


def _load(file: Path, *, header_only: bool = False) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    with np.load(file, allow_pickle=False) as archive:
        names = [_HEADER] if header_only else archive.files
        arrays = {name: archive[name] for name in names}
    header = json.loads(str(arrays.pop(_HEADER)[()]))
    return header, arrays


def _digest(fields: Sequence[str], records: Sequence[dict[str, Any]]) -> str:
    content = json.dumps({"fields": list(fields), "rows": [[r[f] for f in fields] for r in records]})
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def write(file: str | Path, records: Sequence[dict[str, Any]], examples_dir: str | Path) -> Path:
    """Writes the records as FILE (<split>.npz), their example fields into EXAMPLES_DIR (shared: written
    only where that content is not there yet); returns the examples file. Every record must have the
    same fields in the same order (one run's evaluator writes them), else a ValueError names the first
    that differs."""
    file, examples_dir = Path(file), Path(examples_dir)
    fields = list(records[0]) if records else []
    for number, record in enumerate(records, start=1):
        if list(record) != fields:
            raise ValueError(f"{file}: record {number} has the fields {list(record)}, record 1 has {fields}")
    shared = [f for f in fields if f in EXAMPLE_FIELDS]
    digest = _digest(shared, records)
    examples = examples_dir / f"{file.name.removesuffix(SUFFIX)}-{digest}{SUFFIX}"
    if not examples.is_file():
        columns, arrays = _columns(records, shared)
        header = {"format": FORMAT, "rows": len(records), "digest": digest, "columns": columns}
        _save(examples, header, arrays)
    columns, arrays = _columns(records, [f for f in fields if f not in EXAMPLE_FIELDS])
    reference = Path(os.path.relpath(examples, file.parent)).as_posix()
    header = {"format": FORMAT, "rows": len(records), "fields": fields, "examples": reference,
              "examples_digest": digest, "columns": columns}  # fmt: skip
    _save(file, header, arrays)
    return examples


def examples_file(file: str | Path) -> Path:
    """The examples file a compact prediction file reads its keys and labels from (it may be missing)."""
    header, _ = _load(Path(file), header_only=True)
    return Path(file).parent / header["examples"]


def read(file: str | Path) -> list[dict[str, Any]]:
    """The records `write` was given, in their order. A missing, altered or mismatched examples file is a
    ValueError naming it."""
    file = Path(file)
    header, arrays = _load(file)
    if header.get("format") != FORMAT:
        raise ValueError(f"{file}: not a compact prediction file of this version ({header.get('format')!r})")
    rows = header["rows"]
    examples = file.parent / header["examples"]
    if not examples.is_file():
        raise ValueError(
            f"{file}: its examples file {header['examples']} is missing: a compact prediction file is read "
            "beside its grid's examples/ folder (copy the grid, or that folder with the run)"
        )
    shared_header, shared_arrays = _load(examples)
    columns = {
        **{f: _decode(f, c, shared_arrays) for f, c in shared_header["columns"].items()},
        **{f: _decode(f, c, arrays) for f, c in header["columns"].items()},
    }
    fields = header["fields"]
    if any(len(columns[f]) != rows for f in fields):
        raise ValueError(f"{file}: {rows} records announced, its columns or {examples} hold another number")
    by_row = zip(*(columns[f] for f in fields), strict=True)
    records = [dict(zip(fields, values, strict=True)) for values in by_row] if fields else []
    digest = _digest(list(shared_header["columns"]), records)
    if digest != header["examples_digest"] or digest != shared_header["digest"]:
        raise ValueError(f"{examples}: its content is not the examples {file} was written with (edited?)")
    return records

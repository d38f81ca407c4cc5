"""Readers for the GLUE sentence(-pair) tasks: QQP, MRPC, STS-B and SST-2.

Every physical line is one row: the csv module runs with QUOTE_NONE because MRPC texts contain
unbalanced `"`. GLUE QQP wraps texts that contain quotes CSV-style (`"What is ""the cloud""?"`);
QUOTE_NONE keeps that text as is, exactly as Hugging Face's GLUE loader and BERT's run_classifier
read it, so a local file and `datasets` give the same inputs. Columns are found by header name; a
file without the label column (the GLUE test files) gets label -1.
"""

import csv
import itertools
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from stackft_jax.data.tasks import Example, TaskSpec
from stackft_jax.data.text_files import decoded_lines

UNLABELED = -1
_STSB_SCORE_RANGE = (0.0, 5.0)


def _rows(path: str | Path, config_key: str) -> Iterator[tuple[int, list[str]]]:
    """Yields (line number, fields) for every non-blank line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{config_key} = {str(path)!r}: no such file")
    reader = csv.reader(decoded_lines(path), delimiter="\t", quoting=csv.QUOTE_NONE)
    try:
        for fields in reader:
            if fields:
                yield reader.line_num, fields
    except csv.Error as e:
        raise ValueError(f"{path}:{reader.line_num}: {e}") from e


def _class_label(value: str, where: str, num_classes: int) -> int:
    try:
        label = int(value)
    except ValueError:
        raise ValueError(f"{where}: label {value!r} is not an integer") from None
    if not 0 <= label < num_classes:
        raise ValueError(f"{where}: label {label} is outside [0, {num_classes - 1}]")
    return label


def _score_label(value: str, where: str) -> float:
    try:
        score = float(value)
    except ValueError:
        raise ValueError(f"{where}: score {value!r} is not a number") from None
    low, high = _STSB_SCORE_RANGE
    if not low <= score <= high:  # also rejects nan
        raise ValueError(f"{where}: score {score} is outside [{low}, {high}]")
    return score


def _read_with_header(
    path: str | Path,
    rows: Iterator[tuple[int, list[str]]],
    header_row: tuple[int, list[str]],
    *,
    text_a: str,
    text_b: str | None,
    label: str,
    parse_label: Callable[[str, str], int | float],
) -> list[Example]:
    """Reads the rows after the header, picking columns by name; no label column: unlabeled."""
    header_line, header = header_row
    wanted = [text_a] + ([text_b] if text_b else [])
    missing = [name for name in wanted if name not in header]
    if missing:
        raise ValueError(f"{path}:{header_line}: header {header} lacks column(s) {missing}")
    col_a = header.index(text_a)
    col_b = header.index(text_b) if text_b else None
    col_label = header.index(label) if label in header else None
    examples = []
    for line, fields in rows:
        where = f"{path}:{line}"
        if len(fields) != len(header):
            raise ValueError(
                f"{where}: expected {len(header)} tab-separated columns like the header, "
                f"got {len(fields)}"
            )
        text_b_value = fields[col_b] if col_b is not None else None
        label_value = parse_label(fields[col_label], where) if col_label is not None else UNLABELED
        examples.append(Example(fields[col_a], text_b_value, label_value))
    return examples


def _first_row(path: str | Path, rows: Iterator[tuple[int, list[str]]]) -> tuple[int, list[str]]:
    first = next(rows, None)
    if first is None:
        raise ValueError(f"{path}: file is empty")
    return first


def read_qqp(path: str | Path, config_key: str) -> list[Example]:
    """QQP in any of three layouts, told apart by the first line.

    - GLUE train/dev and the Quora release: header `id qid1 qid2 question1 question2 is_duplicate`;
    - GLUE test: header `id question1 question2`, no labels;
    - BiMPM split (Wang et al. 2017), no header: `is_duplicate<TAB>question1<TAB>question2<TAB>id`.
    """
    rows = _rows(path, config_key)
    first_line, first = _first_row(path, rows)
    if "question1" in first:
        return _read_with_header(
            path,
            rows,
            (first_line, first),
            text_a="question1",
            text_b="question2",
            label="is_duplicate",
            parse_label=lambda v, where: _class_label(v, where, 2),
        )
    if len(first) == 4 and first[0] in ("0", "1"):
        examples = []
        for line, fields in itertools.chain([(first_line, first)], rows):
            where = f"{path}:{line}"
            if len(fields) != 4:
                raise ValueError(
                    f"{where}: expected 4 tab-separated columns (label, question1, question2, id) "
                    f"like the first line, got {len(fields)}"
                )
            label = _class_label(fields[0], where, 2)
            examples.append(Example(text_a=fields[1], text_b=fields[2], label=label))
        return examples
    raise ValueError(
        f"{path}:{first_line}: unrecognized QQP layout: expected a header with question1/question2 "
        f"(GLUE, Quora release) or 4 columns starting with a 0/1 label (BiMPM split), got "
        f"{len(first)} columns {first[:3]}..."
    )


def read_mrpc(path: str | Path, config_key: str) -> list[Example]:
    """GLUE MRPC: header `Quality #1 ID #2 ID #1 String #2 String` (test: `index` for `Quality`)."""
    rows = _rows(path, config_key)
    return _read_with_header(
        path,
        rows,
        _first_row(path, rows),
        text_a="#1 String",
        text_b="#2 String",
        label="Quality",
        parse_label=lambda v, where: _class_label(v, where, 2),
    )


def read_stsb(path: str | Path, config_key: str) -> list[Example]:
    """GLUE STS-B: header `index genre ... sentence1 sentence2 score`; float scores in [0, 5]."""
    rows = _rows(path, config_key)
    return _read_with_header(
        path,
        rows,
        _first_row(path, rows),
        text_a="sentence1",
        text_b="sentence2",
        label="score",
        parse_label=_score_label,
    )


def read_sst2(path: str | Path, config_key: str) -> list[Example]:
    """GLUE SST-2: header `sentence label` (test: `index sentence`)."""
    rows = _rows(path, config_key)
    return _read_with_header(
        path,
        rows,
        _first_row(path, rows),
        text_a="sentence",
        text_b=None,
        label="label",
        parse_label=lambda v, where: _class_label(v, where, 2),
    )


READERS: dict[str, Callable[..., list[Example]]] = {
    "qqp": read_qqp,
    "mrpc": read_mrpc,
    "stsb": read_stsb,
    "sst2": read_sst2,
}

# Column names in the Hugging Face `nyu-mll/glue` configs: (text_a, text_b); the label is `label`.
HF_COLUMNS: dict[str, tuple[str, str | None]] = {
    "qqp": ("question1", "question2"),
    "mrpc": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"),
    "sst2": ("sentence", None),
}


def examples_from_hf(task: TaskSpec, rows: Mapping[str, Any]) -> list[Example]:
    """Converts a `datasets.Dataset` (or a dict of columns) of a GLUE config to examples."""
    col_a, col_b = HF_COLUMNS[task.name]
    texts_a = list(rows[col_a])
    texts_b = list(rows[col_b]) if col_b else [None] * len(texts_a)
    cast = float if task.kind == "regression" else int
    labels = [cast(v) for v in rows["label"]]  # GLUE test labels are already -1
    return [Example(a, b, y) for a, b, y in zip(texts_a, texts_b, labels, strict=True)]

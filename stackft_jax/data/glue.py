"""The GLUE sentence(-pair) tasks QQP, MRPC, STS-B and SST-2: file readers and task specs.

Every physical line is one row: the csv module runs with QUOTE_NONE because MRPC texts contain
unbalanced `"`. GLUE QQP wraps texts that contain quotes CSV-style (`"What is ""the cloud""?"`);
QUOTE_NONE keeps that text as is, exactly as Hugging Face's GLUE loader and BERT's run_classifier
read it, so a local file and `datasets` give the same inputs. Columns are found by header name; a
file without the label column (the GLUE test files) gets label -1. Example keys use the file's id
columns (QQP `id`, MRPC `#1 ID`/`#2 ID`, STS-B and test files `index`), else the line number.
"""

import csv
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from stackft_jax.data.sentence_task import UNLABELED, Example, SentenceTask
from stackft_jax.data.task_spec import example_key
from stackft_jax.data.text_files import decoded_lines, first_line
from stackft_jax.models import objectives
from stackft_jax.runtime.cli_errors import DataError

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
        raise DataError(f"{path}:{reader.line_num}: {e}") from e


def _class_label(value: str, where: str, num_classes: int) -> int:
    try:
        label = int(value)
    except ValueError:
        raise DataError(f"{where}: label {value!r} is not an integer") from None
    if not 0 <= label < num_classes:
        raise DataError(f"{where}: label {label} is outside [0, {num_classes - 1}]")
    return label


def _score_label(value: str, where: str) -> float:
    try:
        score = float(value)
    except ValueError:
        raise DataError(f"{where}: score {value!r} is not a number") from None
    low, high = _STSB_SCORE_RANGE
    if not low <= score <= high:  # also rejects nan
        raise DataError(f"{where}: score {score} is outside [{low}, {high}]")
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
    ids: tuple[tuple[str, ...], ...],
) -> list[Example]:
    """Reads the rows after the header, picking columns by name; no label column: unlabeled. The key's
    id is the first of `ids` (column groups) the header has, else the line number."""
    header_line, header = header_row
    wanted = [text_a] + ([text_b] if text_b else [])
    missing = [name for name in wanted if name not in header]
    if missing:
        raise DataError(f"{path}:{header_line}: header {header} lacks column(s) {missing}")
    col_a = header.index(text_a)
    col_b = header.index(text_b) if text_b else None
    col_label = header.index(label) if label in header else None
    id_columns = next(([header.index(c) for c in group] for group in ids if set(group) <= set(header)), [])
    examples = []
    for line, fields in rows:
        where = f"{path}:{line}"
        if len(fields) != len(header):
            raise DataError(
                f"{where}: expected {len(header)} tab-separated columns like the header, got {len(fields)}"
            )
        text_b_value = fields[col_b] if col_b is not None else None
        label_value = parse_label(fields[col_label], where) if col_label is not None else UNLABELED
        source_id = "_".join(fields[c] for c in id_columns) if id_columns else f"line{line}"
        key = example_key(source_id, fields[col_a], text_b_value)
        examples.append(Example(fields[col_a], text_b_value, label_value, key))
    return examples


def _first_row(path: str | Path, rows: Iterator[tuple[int, list[str]]]) -> tuple[int, list[str]]:
    first = next(rows, None)
    if first is None:
        raise DataError(f"{path}: file is empty")
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
            ids=(("id",),),
        )
    if len(first) == 4 and first[0] in ("0", "1"):
        examples = []
        for line, fields in itertools.chain([(first_line, first)], rows):
            where = f"{path}:{line}"
            if len(fields) != 4:
                raise DataError(
                    f"{where}: expected 4 tab-separated columns (label, question1, question2, id) "
                    f"like the first line, got {len(fields)}"
                )
            label = _class_label(fields[0], where, 2)
            key = example_key(fields[3], fields[1], fields[2])
            examples.append(Example(text_a=fields[1], text_b=fields[2], label=label, key=key))
        return examples
    raise DataError(
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
        ids=(("#1 ID", "#2 ID"),),
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
        ids=(("index",),),
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
        ids=(("index",),),
    )


def _first_fields(path: Path) -> list[str]:
    line = first_line(path)
    return [] if line is None else line.rstrip("\r\n").split("\t")


def _sniff_header(*columns: str) -> Callable[[Path], str | None]:
    """A `SentenceTask.sniffer`: the GLUE layout whose header holds `columns`."""

    def sniff(path: Path) -> str | None:
        return "GLUE TSV with header" if set(columns) <= set(_first_fields(path)) else None

    return sniff


def sniff_qqp(path: Path) -> str | None:
    first = _first_fields(path)
    if {"question1", "question2"} <= set(first):
        return "GLUE/Quora TSV with header"
    if len(first) == 4 and first[0] in ("0", "1"):
        return "BiMPM TSV"
    return None


def examples_from_hf(
    rows: Mapping[str, Any], *, columns: tuple[str, str | None], label_type: type
) -> list[Example]:
    """A split of a Hugging Face `nyu-mll/glue` config (a `datasets.Dataset` or a dict of columns):
    texts from `columns`, the label from `label` (already -1 in test splits), the key's id from `idx`."""
    col_a, col_b = columns
    texts_a = list(rows[col_a])
    texts_b = list(rows[col_b]) if col_b else [None] * len(texts_a)
    labels = [label_type(v) for v in rows["label"]]
    return [
        Example(a, b, y, example_key(str(i), a, b))
        for a, b, y, i in zip(texts_a, texts_b, labels, rows["idx"], strict=True)
    ]


def _glue_task(
    name: str,
    *,
    reader: Callable[..., list[Example]],
    columns: tuple[str, str | None],
    metrics: tuple[str, ...],
    sniffer: Callable[[Path], str | None],
    class_names: tuple[str, ...] = (),
    regression: bool = False,
) -> SentenceTask:
    """A task of the `nyu-mll/glue` dataset: two classes, or a score; `columns` are its hub columns."""
    label_type = float if regression else int
    return SentenceTask(
        name=name,
        objective=objectives.REGRESSION if regression else objectives.CLASSIFICATION,
        num_outputs=1 if regression else 2,
        metrics=metrics,
        sentence_pair=columns[1] is not None,
        label_dtype=np.float32 if regression else np.int32,
        reader=reader,
        hf_dataset=("nyu-mll/glue", name),
        examples_from_hf=functools.partial(examples_from_hf, columns=columns, label_type=label_type),
        sniffer=sniffer,
        class_names=class_names,
    )


# Class names as the Hugging Face GLUE dataset names them.
QQP = _glue_task(
    "qqp",
    reader=read_qqp,
    columns=("question1", "question2"),
    metrics=("accuracy", "f1"),
    sniffer=sniff_qqp,
    class_names=("not_duplicate", "duplicate"),
)
MRPC = _glue_task(
    "mrpc",
    reader=read_mrpc,
    columns=("sentence1", "sentence2"),
    metrics=("accuracy", "f1"),
    sniffer=_sniff_header("#1 String", "#2 String"),
    class_names=("not_equivalent", "equivalent"),
)
STSB = _glue_task(
    "stsb",
    reader=read_stsb,
    columns=("sentence1", "sentence2"),
    regression=True,
    metrics=("pearson", "spearman"),
    sniffer=_sniff_header("sentence1", "sentence2"),
)
SST2 = _glue_task(
    "sst2",
    reader=read_sst2,
    columns=("sentence", None),
    metrics=("accuracy",),
    sniffer=_sniff_header("sentence"),
    class_names=("negative", "positive"),
)

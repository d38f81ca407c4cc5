"""Tasks with one label per text or text pair (GLUE's QQP, MRPC, STS-B, SST-2; Yahoo Answers topics).

Encoded as `[CLS] a [SEP] (b [SEP])` (tokenization.encode_texts) plus `labels` [N]: int32 classes, or
float32 scores for regression. A row is an example. Prediction records:
`{"key", "prediction", "prediction_name" (classification), "label" and "label_name" (labelled splits),
"probabilities" (classification)}`.

Inputs to predict (predict.py): the task's own files (`sniffer` tells them apart), or one example per
line: a JSON object `{"text_a": ..., "text_b": ..., "label": ...}` (`text_b` for pair tasks only, `label`
optional: a class name or id, or a score), or plain text (`text_a<TAB>text_b` for pair tasks).
"""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stackft_jax.data import batching, metrics, tokenization
from stackft_jax.data.task_spec import Split, TaskSpec, example_key, hub_rows
from stackft_jax.data.text_files import json_object
from stackft_jax.models import objectives
from stackft_jax.models.objectives import Objective
from stackft_jax.runtime.cli_errors import DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

UNLABELED = -1


@dataclasses.dataclass(frozen=True)
class Example:
    """One input. `label` is UNLABELED (-1) in unlabelled (test) files; `key`: task_spec.example_key."""

    text_a: str
    text_b: str | None
    label: int | float
    key: str


@dataclasses.dataclass(frozen=True)
class SentenceTask(TaskSpec):
    name: str
    objective: Objective
    num_outputs: int
    metrics: tuple[str, ...]
    sentence_pair: bool
    label_dtype: type[np.generic]  # np.int32 (classes) or np.float32 (scores)
    reader: Callable[..., list[Example]]  # (path, *, config_key) -> examples
    hf_dataset: tuple[str, ...]  # arguments of datasets.load_dataset
    # (rows of one Hugging Face split) -> examples
    examples_from_hf: Callable[[Mapping[str, Any]], list[Example]]
    sniffer: Callable[[Path], str | None]  # TaskSpec.input_layout: which of the reader's layouts, or None
    # Class names of prediction records (the Hugging Face dataset's); (): `output_names`. Kept apart
    # from `output_names`, which results.json records and ensembles compare across runs.
    class_names: tuple[str, ...] = ()

    def read_file(self, path: Path, *, config_key: str) -> list[Example]:
        return self.reader(path, config_key=config_key)

    def read_hub(self, split: str, *, config_key: str) -> list[Example]:
        return self.examples_from_hf(hub_rows(self.hf_dataset, split, config_key=config_key))

    def encode(
        self,
        tokenizer: "PreTrainedTokenizerBase",
        examples: Sequence[Example],
        *,
        max_seq_length: int,
        options: Mapping[str, Any],
    ) -> batching.Dataset:
        if self.sentence_pair and any(e.text_b is None for e in examples):
            raise DataError(f"task {self.name!r} takes sentence pairs but an example has no text_b")
        arrays = tokenization.encode_texts(
            tokenizer,
            [e.text_a for e in examples],
            [e.text_b for e in examples] if self.sentence_pair else None,
            max_seq_length=max_seq_length,
        )
        arrays["labels"] = np.asarray([e.label for e in examples], dtype=self.label_dtype)
        return arrays

    def is_labelled(self, examples: Sequence[Example]) -> bool:
        return any(e.label != UNLABELED for e in examples)

    def score(self, split: Split, rows: Mapping[str, np.ndarray]) -> dict[str, float]:
        predictions = rows["predictions"]
        return metrics.compute_metrics(self.metrics, predictions, split.arrays["labels"][: len(predictions)])

    @property
    def prediction_names(self) -> tuple[str, ...] | None:
        """The names of prediction records' classes; None for regression."""
        if self.objective is not objectives.CLASSIFICATION:
            return None
        return self.class_names or self.output_names

    def prediction_records(self, split: Split, rows: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        names = self.prediction_names
        records = []
        for i, example in enumerate(split.examples):
            record: dict[str, Any] = {"key": example.key, "prediction": rows["predictions"][i].item()}
            if names is not None:
                record["prediction_name"] = names[record["prediction"]]
            if split.labelled:
                record["label"] = example.label
                if names is not None and example.label != UNLABELED:
                    record["label_name"] = names[example.label]
            if "probabilities" in rows:
                record["probabilities"] = rows["probabilities"][i].tolist()
            records.append(record)
        return records

    def input_layout(self, path: Path) -> str | None:
        return self.sniffer(path)

    def clean_text(self, text: str) -> str:
        """A text of a line input as the task's file reader would have read it."""
        return text

    def parse_label(self, value: Any, where: str) -> int | float:
        """A `label` of a JSON input line: a class name or id, or a score."""
        if self.objective is not objectives.CLASSIFICATION:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DataError(f"{where}: label {value!r} is not a number (task {self.name!r} scores)")
            return float(value)
        names = self.prediction_names
        if isinstance(value, str) and value in names:
            return names.index(value)
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
            return value
        raise DataError(
            f"{where}: label {value!r} is not a class the model knows: {list(names)} "
            f"(or ids 0-{len(names) - 1})"
        )

    def example_from_line(self, line: str, *, index: int, where: str) -> Example:
        record = json_object(line, where)
        label: int | float = UNLABELED
        if record is None:
            text = line.rstrip("\r\n")
            texts = text.split("\t") if self.sentence_pair else [text]
            if len(texts) != (2 if self.sentence_pair else 1):
                raise DataError(
                    f"{where}: task {self.name!r} takes a text pair: expected text_a<TAB>text_b or a JSON "
                    f'object {{"text_a": ..., "text_b": ...}}, got {len(texts)} tab-separated field(s)'
                )
        else:
            fields = ("text_a", "text_b") if self.sentence_pair else ("text_a",)
            extra = "text_b" if not self.sentence_pair and "text_b" in record else None
            missing = [f for f in fields if not isinstance(record.get(f), str)]
            if missing or extra:
                raise DataError(
                    f"{where}: task {self.name!r} takes JSON objects with string field(s) {list(fields)}"
                    + (f" and no {extra!r}" if extra else f"; this one lacks {missing}")
                )
            texts = [record[f] for f in fields]
            if record.get("label") is not None:
                label = self.parse_label(record["label"], where)
        text_a = self.clean_text(texts[0])
        text_b = self.clean_text(texts[1]) if self.sentence_pair else None
        number = where.rpartition(":")[2]
        return Example(text_a, text_b, label, example_key(f"line{number}", text_a, text_b))

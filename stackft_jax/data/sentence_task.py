"""Tasks with one label per text or text pair (GLUE's QQP, MRPC, STS-B, SST-2; Yahoo Answers topics).

Encoded as `[CLS] a [SEP] (b [SEP])` (tokenization.encode_texts) plus `labels` [N]: int32 classes, or
float32 scores for regression. A row is an example. Prediction records:
`{"key", "prediction", "label" (labelled splits), "probabilities" (classification)}`.
"""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stackft_jax import metrics
from stackft_jax.data import batching, tokenization
from stackft_jax.data.task_spec import Split, TaskSpec, hub_rows
from stackft_jax.objectives import Objective

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
            raise ValueError(f"task {self.name!r} takes sentence pairs but an example has no text_b")
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

    def prediction_records(self, split: Split, rows: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        records = []
        for i, example in enumerate(split.examples):
            record: dict[str, Any] = {"key": example.key, "prediction": rows["predictions"][i].item()}
            if split.labelled:
                record["label"] = example.label
            if "probabilities" in rows:
                record["probabilities"] = rows["probabilities"][i].tolist()
            records.append(record)
        return records

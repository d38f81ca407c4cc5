"""Task registry: what each sentence(-pair) task is, and where its examples come from.

A task is chosen by name (config key `data.task`). Examples come from a local file when the config
names one (`data.train_file`, `data.dev_file`, `data.test_file`), otherwise from the Hugging Face
`datasets` cache.
"""

import dataclasses
from pathlib import Path

SPLITS = ("train", "dev", "test")
_HF_SPLIT_NAMES = {"train": "train", "dev": "validation", "test": "test"}


@dataclasses.dataclass(frozen=True)
class Example:
    """One input. `label` is -1 for unlabeled (test) examples."""

    text_a: str
    text_b: str | None
    label: int | float


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str  # "classification" | "regression"
    num_outputs: int  # classes for classification, 1 for regression
    metrics: tuple[str, ...]
    sentence_pair: bool
    hf_dataset: tuple[str, str]  # arguments of datasets.load_dataset


TASKS: dict[str, TaskSpec] = {
    "qqp": TaskSpec(
        name="qqp",
        kind="classification",
        num_outputs=2,
        metrics=("accuracy", "f1"),
        sentence_pair=True,
        hf_dataset=("nyu-mll/glue", "qqp"),
    ),
    "mrpc": TaskSpec(
        name="mrpc",
        kind="classification",
        num_outputs=2,
        metrics=("accuracy", "f1"),
        sentence_pair=True,
        hf_dataset=("nyu-mll/glue", "mrpc"),
    ),
    "stsb": TaskSpec(
        name="stsb",
        kind="regression",
        num_outputs=1,
        metrics=("pearson", "spearman"),
        sentence_pair=True,
        hf_dataset=("nyu-mll/glue", "stsb"),
    ),
    "sst2": TaskSpec(
        name="sst2",
        kind="classification",
        num_outputs=2,
        metrics=("accuracy",),
        sentence_pair=False,
        hf_dataset=("nyu-mll/glue", "sst2"),
    ),
}


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(
            f"unknown task {name!r} in config key `data.task`; choose one of {sorted(TASKS)}"
        )
    return TASKS[name]


def load_examples(task: TaskSpec, split: str, path: str | Path | None) -> list[Example]:
    """Reads `split` of `task` from `path`, or from the `datasets` cache when `path` is None."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    # Imported here because glue.py imports Example from this module.
    from stackft_jax.data import glue

    config_key = f"data.{split}_file"
    if path is not None:
        examples = glue.READERS[task.name](path, config_key=config_key)
        if not examples:
            raise ValueError(f"{config_key} = {str(path)!r}: the file holds no examples (a header only?)")
        return examples

    import datasets

    hf_split = _HF_SPLIT_NAMES[split]
    try:
        rows = datasets.load_dataset(*task.hf_dataset, split=hf_split)
    except Exception as e:  # offline, not cached, or no network: all mean "give a local file"
        raise FileNotFoundError(
            f"could not load {'/'.join(task.hf_dataset)} split {hf_split!r} with `datasets` "
            f"(is it cached? offline runs need the cache): {e}. "
            f"Set `{config_key}` to a local file instead."
        ) from e
    return glue.examples_from_hf(task, rows)

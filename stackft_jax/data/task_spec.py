"""What a task is (`TaskSpec`) and how one split of it is loaded (`load_split`).

A task spec owns everything that differs between tasks: reading its files (and its Hugging Face dataset
when online), encoding examples as per-row arrays, its objective (objectives.py: loss and predictions),
its scores, and the per-example records of its prediction files. Nothing outside a task's module asks
which task it is. Family modules (glue.py, conll.py, ...) implement it; tasks.py registers them by name.

An encoded split is a dict of numpy arrays with a leading row dimension N. Every task has
`input_ids`, `token_type_ids`, `segment_ids` [N, max_seq_length] (tokenization.py) and `lengths` [N];
the rest is the task's own
(`labels` [N] for a sentence task; `labels`, `word_starts` [N, max_words] and `num_words` [N] for
tagging). A row is usually one example; a long sentence of a tagging task may take several rows.
"""

import abc
import dataclasses
import hashlib
import logging
import math
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stackft_jax.data import batching, tokenization
from stackft_jax.models.objectives import Objective
from stackft_jax.runtime.cli_errors import ConfigError, DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
_HF_SPLIT_NAMES = {"train": "train", "dev": "validation", "test": "test"}


# The `config.data.*` keys that only some tasks read, with their default (config/defaults.py).
TASK_DATA_KEYS = {
    "classes": "society_culture+science_mathematics",
    "dev_fraction": 0.1,
    "truncation": "head",
    "document_context": False,
    "entity_f1": "conlleval",
}


class TaskSpec(abc.ABC):
    """A task: subclass it for a family of tasks, make one instance per task, register it in tasks.py.

    Examples may be of any type with a `key: str` attribute: stable across runs that read the same file
    (the file's id column or line number, plus a short hash of the input text), unique within a split.
    """

    name: str  # the registry name, config key `data.task`
    objective: Objective
    num_outputs: int  # what the head outputs per example or word: classes, tags, or 1 (regression)
    metrics: tuple[str, ...]  # score names; the first is the primary one (best checkpoint, early stop)
    # > 0: a task without a dev split of its own (or run without a dev file) holds out this fraction of
    # train as dev (`read_splits`); 0: dev comes from the dev file or the hub's validation split.
    dev_fraction: float = 0.0
    # The task-specific `config.data.*` keys (TASK_DATA_KEYS) this task reads; set to anything but their
    # default, the others are refused (spec.py), not silently ignored.
    data_keys: tuple[str, ...] = ()
    # Scores a report shows beside its metric, where their convention differs (CoNLL: strict IOB2 F1
    # beside conlleval's); none by default.
    beside_metrics: Mapping[str, tuple[str, ...]] = types.MappingProxyType({})

    def configure(self, data_config: Mapping[str, Any]) -> "TaskSpec":
        """The task as `config.data` sets it up (a subset of classes, a held-out dev fraction, ...);
        errors name the config key. Tasks without such keys are the same task: `self`."""
        return self

    @property
    def gap_metric(self) -> str:
        """The metric of the phase-1 train/dev gap rule (`max_train_dev_gap`) when the phase's
        `gap_metric` key is empty: the primary one."""
        return self.metrics[0]

    def rule_metric(self, name: str) -> str:
        """The score a run's rule named `name` reads (the phase-1 gap rule's `gap_metric`): `name`,
        unless the task's config maps it (CoNLL's `f1` under `data.entity_f1="strict"`)."""
        return name

    @property
    def legacy_gap_metric(self) -> str:
        """What that rule compared in runs recorded before phases had a `gap_metric` key (spec.py reads
        their configs as what they ran)."""
        return self.gap_metric

    @property
    def output_names(self) -> tuple[str, ...]:
        """A name per output (class or tag names); heads may use them (a CRF's IOB2 constraints)."""
        return tuple(str(i) for i in range(self.num_outputs))

    def describe(self) -> dict[str, Any]:
        """What results.json records of the task: how its outputs are named and how it is scored."""
        return {"name": self.name, "objective": self.objective.name, "outputs": list(self.output_names)}

    @abc.abstractmethod
    def read_file(self, path: Path, *, config_key: str) -> list[Any]:
        """The examples of a local file, in file order; errors name `path:line` (or `config_key`)."""

    @abc.abstractmethod
    def read_hub(self, split: str, *, config_key: str) -> list[Any]:
        """The examples of `split` ("train", "dev" or "test") of the task's Hugging Face dataset; use
        `hub_rows` so that an offline machine gets an error naming `config_key`."""

    def encoding_options(self, data_config: Mapping[str, Any]) -> dict[str, Any]:
        """The `config.data` values that `encode` depends on (they are part of the cache key)."""
        return {}

    @abc.abstractmethod
    def encode(
        self,
        tokenizer: "PreTrainedTokenizerBase",
        examples: Sequence[Any],
        *,
        max_seq_length: int,
        options: Mapping[str, Any],
    ) -> batching.Dataset:
        """Per-row arrays (module docstring), right-padded to `max_seq_length` tokens."""

    @abc.abstractmethod
    def is_labelled(self, examples: Sequence[Any]) -> bool:
        """False for unlabelled splits (GLUE test files): they are predicted, not scored."""

    @abc.abstractmethod
    def score(self, split: "Split", rows: Mapping[str, np.ndarray]) -> dict[str, float]:
        """The task's metrics from the objective's per-row predictions `rows`, in row order. `rows` may
        cover only the split's first rows (the train subset scored for the train/dev gap). An undefined
        score is NaN, with a warning, never a silent 0."""

    @abc.abstractmethod
    def prediction_records(self, split: "Split", rows: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        """One JSON-ready record per example, in file order, with its `key` (predictions.py)."""

    # Reading inputs to predict (predict.py): the task's own files, or one example per line.

    @abc.abstractmethod
    def input_layout(self, path: Path) -> str | None:
        """The name of the task's own file layout `path` is in, told by its first record (say "GLUE
        TSV with header"), or None: not a file of this task (predict then reads it line by line, and
        refuses it if another task's `input_layout` claims it)."""

    def read_input_file(self, path: Path) -> list[Any]:
        """The examples of a file in one of the task's own layouts, labelled or not, every one of them
        in file order (a label the model does not know is an error at its line, never dropped)."""
        return self.read_file(path, config_key="--input")

    @abc.abstractmethod
    def example_from_line(self, line: str, *, index: int, where: str) -> Any:
        """One example from one line of a line-per-example input: a JSON object of the task's fields
        (labels optional), or the task's plain text form. `index`: the example's position in the input
        from 0; `where`: `file:line` for errors and keys."""


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of a task, read and encoded."""

    name: str  # "train", "dev" or "test"
    examples: Sequence[Any]  # as the task read them, in file order
    arrays: batching.Dataset  # encoded rows (module docstring)
    labelled: bool

    @property
    def num_rows(self) -> int:
        return batching.num_rows(self.arrays)


def example_key(source_id: str, *texts: str | None) -> str:
    """`<source_id>-<8 hex digits of the texts' hash>`: matches across runs over the same file, and
    differs when the same id holds other text (a different file)."""
    h = hashlib.sha256()
    for text in texts:
        # \x00 separates texts and \x01 marks a missing one, so no two inputs collide.
        h.update(b"\x00" + (b"\x01" if text is None else text.encode()))
    return f"{source_id}-{h.hexdigest()[:8]}"


def hub_rows(dataset: tuple[str, ...], split: str, *, config_key: str) -> Any:
    """`datasets.load_dataset(*dataset)` for `split`; any failure (offline, not cached) is an error
    that asks for the local file of `config_key`."""
    import datasets

    hf_split = _HF_SPLIT_NAMES[split]
    try:
        return datasets.load_dataset(*dataset, split=hf_split)
    except Exception as e:  # offline, not cached, or no network: all mean "give a local file"
        raise FileNotFoundError(
            f"could not load {'/'.join(dataset)} split {hf_split!r} with `datasets` "
            f"(is it cached? offline runs need the cache): {e}. "
            f"Set `{config_key}` to a local file instead."
        ) from e


def read_examples(task: TaskSpec, split: str, path: str | Path | None) -> list[Any]:
    """`split` of `task` from the local file `path`, or from the Hugging Face dataset when None.
    A split without examples, or with two examples of one key, is an error naming the file."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    config_key = f"data.{split}_file"
    if path is None:
        examples = task.read_hub(split, config_key=config_key)
    else:
        examples = task.read_file(Path(path), config_key=config_key)
    source = _source(task, split, path)
    if not examples:
        raise DataError(f"{source}: the file holds no examples (a header only?)")
    seen: dict[str, int] = {}
    for position, example in enumerate(examples):
        first = seen.setdefault(example.key, position)
        if first != position:
            raise DataError(
                f"{source}: examples {first} and {position} share the key {example.key!r} (the same id "
                "and text twice); prediction files need one key per example"
            )
    return examples


def dev_is_held_out(task: TaskSpec, dev_path: str | Path | None) -> bool:
    """Whether dev is a slice of train: the task holds one out and no dev file is given."""
    return dev_path is None and task.dev_fraction > 0


def hold_out(examples: Sequence[Any], fraction: float) -> tuple[list[Any], list[Any]]:
    """(rest, held out): the `ceil(fraction * n)` examples whose keys hash lowest, both in file order.
    The slice depends only on the keys, not on the run's seed, so every run over the same file (and
    every member of an ensemble) holds out the same examples."""
    order = sorted(range(len(examples)), key=lambda i: hashlib.sha256(examples[i].key.encode()).digest())
    held = set(order[: math.ceil(fraction * len(examples))])
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


# The split a run selects on (the loop's evaluations, best checkpoint, stop rules, phase boundaries) when
# `data.selection_fraction` > 0: a slice of train, so that dev and test are only reported.
SELECTION = "selection"


def check_selection_fraction(fraction: float) -> None:
    """0 (off), or a share of train in (0, 0.5]: one that leaves train at least as large as the slice."""
    if fraction != 0 and not 0 < fraction <= 0.5:
        raise ConfigError(
            f"config key 'data.selection_fraction' = {fraction!r}: 0 (off) or a share of train in (0, 0.5]"
        )


def selection_split(datasets: Mapping[str, Any]) -> str:
    """The split that selection reads: the selection slice where the run holds one out, else dev."""
    return SELECTION if SELECTION in datasets else "dev"


def hold_out_selection(examples: Sequence[Any], fraction: float, seed: int) -> tuple[list[Any], list[Any]]:
    """(rest, selection slice): the `ceil(fraction * n)` examples whose keys, salted with `seed`, hash
    lowest, both in file order: fixed by the seed and the file, the same for every run of a grid (every
    strategy and training seed selects on the same examples), and disjoint from dev's hold-out, whose
    unsalted hash picks from what remains."""
    order = sorted(
        range(len(examples)),
        key=lambda i: hashlib.sha256(f"selection:{seed}:{examples[i].key}".encode()).digest(),
    )
    held = set(order[: math.ceil(fraction * len(examples))])
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


def read_splits(
    task: TaskSpec,
    paths: Mapping[str, str | Path | None],
    *,
    selection_fraction: float = 0.0,
    selection_seed: int = 0,
) -> dict[str, list[Any]]:
    """The examples of train, dev, (only when `paths` gives a file) test and (only when
    `selection_fraction` > 0) the selection slice. The selection slice is taken out of train first
    (`hold_out_selection`); then, when `dev_is_held_out`, dev is `hold_out(train, task.dev_fraction)`
    of what is left and train loses those examples too."""
    examples = {"train": read_examples(task, "train", paths.get("train"))}
    if selection_fraction:
        examples["train"], examples[SELECTION] = hold_out_selection(
            examples["train"], selection_fraction, selection_seed
        )
        if not examples["train"] or not examples[SELECTION]:
            raise DataError(
                f"data.selection_fraction={selection_fraction} of {len(examples['train'])} train examples "
                "leaves train or the selection slice empty"
            )
        log.info(
            "selection: %d examples held out of train (data.selection_fraction=%s, seed %s)",
            len(examples[SELECTION]),
            selection_fraction,
            selection_seed,
        )
    if dev_is_held_out(task, paths.get("dev")):
        examples["train"], examples["dev"] = hold_out(examples["train"], task.dev_fraction)
        if not examples["train"] or not examples["dev"]:
            raise DataError(
                f"data.dev_fraction={task.dev_fraction} of {len(examples['train']) + len(examples['dev'])} "
                "train examples leaves train or dev empty"
            )
        log.info(
            "dev: %d examples held out of train (data.dev_fraction=%s), %d left to train",
            len(examples["dev"]),
            task.dev_fraction,
            len(examples["train"]),
        )
    else:
        examples["dev"] = read_examples(task, "dev", paths.get("dev"))
    if paths.get("test"):
        examples["test"] = read_examples(task, "test", paths["test"])
    return examples


def _source(task: TaskSpec, split: str, path: str | Path | None) -> str:
    if path is None:
        return f"the Hugging Face dataset of task {task.name!r}, split {split!r}"
    return f"data.{split}_file = {str(path)!r}"


def encode_examples(
    task: TaskSpec,
    tokenizer: tokenization.Tokenizer,
    examples: Sequence[Any],
    *,
    max_seq_length: int,
    options: Mapping[str, Any] | None = None,
    cache_dir: str | Path | None = None,
) -> batching.Dataset:
    """`task.encode`, through the on-disk cache when `cache_dir` is given."""
    options = dict(options or {})
    return tokenization.cached(
        lambda: task.encode(tokenizer.loaded, examples, max_seq_length=max_seq_length, options=options),
        cache_dir=cache_dir,
        name=f"{task.name}-{max_seq_length}",
        identity=f"{task.name}|{max_seq_length}|{sorted(options.items())!r}",
        tokenizer=tokenizer,
        examples=examples,
    )


def load_split(
    task: TaskSpec,
    split: str,
    path: str | Path | None,
    *,
    tokenizer: tokenization.Tokenizer,
    max_seq_length: int,
    options: Mapping[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    examples: Sequence[Any] | None = None,
) -> Split:
    """Reads (unless `examples` are given: `read_splits`) and encodes one split. Training and model
    selection need labels: an unlabelled train or dev file is an error naming its config key."""
    if examples is None:
        examples = read_examples(task, split, path)
    labelled = task.is_labelled(examples)
    if not labelled and split != "test":
        raise DataError(f"{_source(task, split, path)}: the {split} split has no labels")
    arrays = encode_examples(
        task, tokenizer, examples, max_seq_length=max_seq_length, options=options, cache_dir=cache_dir
    )
    return Split(split, examples, arrays, labelled)

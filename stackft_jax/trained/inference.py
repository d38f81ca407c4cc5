"""Predictions of a trained model (trained.py) on new examples: the task's own input files or one example
per line, encoded as the run encoded its splits and scored by the run's evaluator (evaluation.py: all
devices, length-sorted batches gathered back into input order). The command is predict.py.
"""

import dataclasses
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from stackft_jax.data.task_spec import Split, TaskSpec
from stackft_jax.data.text_files import decoded_lines
from stackft_jax.runtime.cli_errors import DataError


def read_input(task: TaskSpec, path: Path) -> list[Any]:
    """The examples of `path`: a file of the task's own layouts (`input_layout`), else one per line.
    Refused, naming the file (and line): no file, no examples, bad bytes, another task's file, an
    unknown class or tag, labels on some examples only."""
    if not path.is_file():
        raise FileNotFoundError(f"--input={path}: no such file")
    if path.stat().st_size == 0:
        raise DataError(f"{path}:1: the file is empty")
    layout = task.input_layout(path)
    if layout is not None:
        examples = task.read_input_file(path)
    else:
        from stackft_jax.data import tasks  # every task family: only to name the task a file belongs to

        for other in tasks.TASKS.values():
            other_layout = other.input_layout(path) if other.name != task.name else None
            if other_layout is not None:
                raise DataError(
                    f"{path}: a {other.name} file ({other_layout}), but the model was trained on {task.name}"
                )
        examples = list(examples_from_lines(task, decoded_lines(path), source=str(path)))
    if not examples:
        raise DataError(f"{path}: no examples (blank lines only)")
    labelled = sum(task.is_labelled([example]) for example in examples)
    if 0 < labelled < len(examples):
        raise DataError(
            f"{path}: {labelled} of {len(examples)} examples have labels: label all (to score them) or none"
        )
    return examples


def examples_from_lines(
    task: TaskSpec, lines: Iterable[str], *, source: str, start: int = 0
) -> Iterator[Any]:
    """One example per non-blank line (`task.example_from_line`); `start`: the first one's index."""
    index = start
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield task.example_from_line(line, index=index, where=f"{source}:{number}")
            index += 1


@dataclasses.dataclass(frozen=True)
class Prediction:
    records: list[dict[str, Any]]  # one per example, in input order (predictions.py)
    scores: dict[str, float]  # the task's scores and loss; empty for an unlabelled input


class Predictor:
    """A loaded model and its evaluator (evaluation.py): `predict(examples)` as many times as needed
    (each length bucket compiles once)."""

    def __init__(self, source, *, per_device_batch_size: int | None = None):
        import jax

        from stackft_jax.data import batching, tokenization
        from stackft_jax.runtime import sharding
        from stackft_jax.training import evaluation  # jax: once a model is opened, after the input is checked

        self.source, self.task, run_spec = source, source.task, source.run_spec
        self.loaded = source.load()
        mesh = sharding.make_mesh()
        self.global_batch_size = sharding.global_batch_size(
            per_device_batch_size or run_spec.eval_per_device_batch_size, mesh
        )
        self.evaluator = evaluation.build_evaluator(
            self.task,
            self.loaded.graphdef,
            mesh,
            global_batch_size=self.global_batch_size,
            buckets=batching.length_buckets(run_spec.max_seq_length),
        )
        self.params = jax.device_put(self.loaded.params, sharding.replicated(mesh))
        self.tokenizer = tokenization.load_tokenizer(source.model_dir)

    def predict(self, examples: list[Any], *, progress: bool = True) -> Prediction:
        from stackft_jax.data import task_spec  # transformers: only when predicting

        run_spec = self.source.run_spec
        arrays = task_spec.encode_examples(
            self.task,
            self.tokenizer,
            examples,
            max_seq_length=run_spec.max_seq_length,
            options=self.task.encoding_options(run_spec.data.as_mapping()),
        )
        check_ids_fit(arrays, examples, self.loaded.bert_config.vocab_size, self.source.model_dir)
        split = Split("input", examples, arrays, self.task.is_labelled(examples))
        done = self.evaluator.evaluate(self.params, split, progress=progress)
        return Prediction(self.task.prediction_records(split, done.rows), done.scores)


def check_ids_fit(arrays: dict[str, Any], examples: list[Any], vocab_size: int, model_dir: Path) -> None:
    """Refuses an input whose token ids reach beyond the encoder's embedding table (as training does,
    tokenization.check_ids_fit), naming the first such example and id: a lookup there reads no row of
    the table and predicts NaN."""
    import numpy as np

    ids = np.asarray(arrays["input_ids"])
    beyond = np.argwhere(ids >= vocab_size)
    if beyond.size:
        row, column = (int(i) for i in beyond[0])
        # A sentence split into windows (word tagging): the window's sentence.
        index = int(arrays["sentence_index"][row]) if "sentence_index" in arrays else row
        token = int(ids[row, column])
        raise DataError(
            f"--input example {index + 1} ({examples[index].key}): token id {token} is beyond "
            f"the encoder's embedding table ({vocab_size} rows, vocab_size in {model_dir}/config.json): the "
            "tokenizer files and the weights come from different models"
        )


def stream(
    predictor: Predictor, lines: IO[str], write: Callable[[dict[str, Any]], None], *, source: str = "<stdin>"
) -> int:
    """Answers lines as they come: each prediction takes the lines already waiting (up to a batch), so
    a person typing sees each answer at once and a pipe still fills batches. A bad line is reported on
    stderr and skipped; returns how many were."""
    waiting: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in lines:
            waiting.put(line)
        waiting.put(None)

    threading.Thread(target=read, daemon=True).start()
    number, index, done, refused = 0, 0, False, 0
    while not done:
        chunk = [waiting.get()]
        while chunk[-1] is not None and len(chunk) < predictor.global_batch_size and not waiting.empty():
            chunk.append(waiting.get())
        done = chunk[-1] is None
        examples = []
        for line in chunk[:-1] if done else chunk:
            number += 1
            if not line.strip():
                continue
            try:
                examples.append(
                    predictor.task.example_from_line(line, index=index, where=f"{source}:{number}")
                )
                index += 1
            except ValueError as error:
                print(f"error: {error}", file=sys.stderr, flush=True)
                refused += 1
        if examples:
            for record in predictor.predict(examples, progress=False).records:
                write(record)
    return refused

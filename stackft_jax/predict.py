"""Predictions of a trained model on new inputs:

    python -m stackft_jax.predict --workdir=runs/demo --input=pairs.tsv --output=pairs.jsonl
    python -m stackft_jax.predict --model=exports/demo --input=- --output=-      # type, read answers

The model is a run's (`--workdir`: what its results.json `final` scored, `--params=best|last`, or the end
of any finished `--phase`) or an export's (`--model`, export.py). Inputs are the task's own files (GLUE
TSV, Yahoo CSV, CoNLL), labelled or not, or one example per line (data/task_spec.py `example_from_line`:
JSON objects or the task's plain text; `--input=-` reads standard input and answers each line as it
comes). The output is JSONL, one record per example in input order, the records of the run's own
`predictions/<split>.jsonl`; a labelled input is also scored (`--scores`). The run's evaluator does the
work: all devices, length-sorted batches gathered back into input order, the persistent compilation cache.

Every refusal (an unfinished run, a file of another task, bad bytes, an unknown class or tag, an output
that exists) is one line before the model is built. Nothing is written to the workdir.
"""

import dataclasses
import json
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from absl import app, flags

from stackft_jax.data.task_spec import Split, TaskSpec
from stackft_jax.data.text_files import decoded_lines

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A run's workdir (python -m stackft_jax.main --workdir=...).")
flags.DEFINE_string(
    "model", None, "An export folder (python -m stackft_jax.export --out=...), instead of --workdir."
)
flags.DEFINE_string(
    "input", None, "The file to predict, in the task's own format or one example per line; - : stdin."
)
flags.DEFINE_string("output", None, "Where the JSONL predictions go; - : stdout.")
flags.DEFINE_string("scores", None, "Where the scores of a labelled input go (JSON); they are printed too.")
flags.DEFINE_enum(
    "params", None, ["best", "last"], "Which parameters of a finished run (default: what it scored)."
)
flags.DEFINE_string(
    "phase", None, "A finished phase whose end parameters predict (e.g. phase1: the stacked head)."
)
flags.DEFINE_integer(
    "per_device_batch_size", None, "Examples per device and batch (default: the run's eval batch)."
)
flags.DEFINE_bool("overwrite", False, "Replace non-empty --output/--scores files.")
STDIN = "-"


def read_input(task: TaskSpec, path: Path) -> list[Any]:
    """The examples of `path`: a file of the task's own layouts (`input_layout`), else one per line.
    Refused, naming the file (and line): no file, no examples, bad bytes, another task's file, an
    unknown class or tag, labels on some examples only."""
    if not path.is_file():
        raise FileNotFoundError(f"--input={path}: no such file")
    if path.stat().st_size == 0:
        raise ValueError(f"{path}:1: the file is empty")
    layout = task.input_layout(path)
    if layout is not None:
        examples = task.read_input_file(path)
    else:
        from stackft_jax.data import tasks

        for other in tasks.TASKS.values():
            other_layout = other.input_layout(path) if other.name != task.name else None
            if other_layout is not None:
                raise ValueError(
                    f"{path}: a {other.name} file ({other_layout}), but the model was trained on {task.name}"
                )
        examples = list(examples_from_lines(task, decoded_lines(path), source=str(path)))
    if not examples:
        raise ValueError(f"{path}: no examples (blank lines only)")
    labelled = sum(task.is_labelled([example]) for example in examples)
    if 0 < labelled < len(examples):
        raise ValueError(
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

        from stackft_jax import evaluation, sharding
        from stackft_jax.data import batching, tokenization

        self.source, self.task, config = source, source.task, source.config
        self.loaded = source.load()
        mesh = sharding.make_mesh()
        self.global_batch_size = sharding.global_batch_size(
            per_device_batch_size or config.eval_per_device_batch_size, mesh
        )
        self.evaluator = evaluation.build_evaluator(
            self.task,
            self.loaded.graphdef,
            mesh,
            global_batch_size=self.global_batch_size,
            buckets=batching.length_buckets(config.max_seq_length),
        )
        self.params = jax.device_put(self.loaded.params, sharding.replicated(mesh))
        self.tokenizer = tokenization.load_tokenizer(source.model_dir)

    def predict(self, examples: list[Any], *, progress: bool = True) -> Prediction:
        from stackft_jax.data import task_spec

        config = self.source.config
        arrays = task_spec.encode_examples(
            self.task,
            self.tokenizer,
            examples,
            max_seq_length=config.max_seq_length,
            options=self.task.encoding_options(config.data),
        )
        split = Split("input", examples, arrays, self.task.is_labelled(examples))
        done = self.evaluator.evaluate(self.params, split, progress=progress)
        return Prediction(self.task.prediction_records(split, done.rows), done.scores)


def stream(
    predictor: Predictor, lines: IO[str], write: Callable[[dict[str, Any]], None], *, source: str = "<stdin>"
) -> None:
    """Answers lines as they come: each prediction takes the lines already waiting (up to a batch), so
    a person typing sees each answer at once and a pipe still fills batches. A bad line is reported on
    stderr and skipped."""
    waiting: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in lines:
            waiting.put(line)
        waiting.put(None)

    threading.Thread(target=read, daemon=True).start()
    number, index, done = 0, 0, False
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
        if examples:
            for record in predictor.predict(examples, progress=False).records:
                write(record)


def _check_target(flag: str, path: str | None) -> None:
    if path and path != STDIN and not FLAGS.overwrite:
        target = Path(path)
        if target.is_dir() or (target.is_file() and target.stat().st_size > 0):
            raise ValueError(f"--{flag}={path} exists and is not empty: pass --overwrite to replace it")


def _open_source():
    from stackft_jax import trained

    if bool(FLAGS.workdir) == bool(FLAGS.model):
        raise app.UsageError("give one of --workdir (a run) or --model (an export)")
    if FLAGS.model:
        if FLAGS.params or FLAGS.phase:
            raise ValueError(
                "--params and --phase choose among a workdir's parameters; an export holds one set"
            )
        return trained.open_export(FLAGS.model)
    return trained.open_workdir(FLAGS.workdir, params=FLAGS.params, phase=FLAGS.phase)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not FLAGS.input or not FLAGS.output:
        raise app.UsageError("--input and --output are required (- for stdin / stdout)")
    from stackft_jax import xla_flags

    xla_flags.apply_cpu_defaults()  # before JAX starts a backend
    try:
        source = _open_source()
        _check_target("output", FLAGS.output)
        _check_target("scores", FLAGS.scores)
        examples = None if FLAGS.input == STDIN else read_input(source.task, Path(FLAGS.input))
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    from stackft_jax import compilation_cache, predictions

    compilation_cache.enable(source.config.compilation_cache_dir)
    predictor = Predictor(source, per_device_batch_size=FLAGS.per_device_batch_size)
    print(f"{source.path}: {predictor.loaded.which} parameters, task {source.task.name}", file=sys.stderr)
    if examples is None:
        out = sys.stdout if FLAGS.output == STDIN else Path(FLAGS.output).open("w")
        stream(predictor, sys.stdin, lambda r: print(json.dumps(r), file=out, flush=True))
        return
    done = predictor.predict(examples)
    if FLAGS.output == STDIN:
        for record in done.records:
            print(json.dumps(record))
    else:
        predictions.write(FLAGS.output, done.records)
    print(f"{len(done.records)} predictions: {FLAGS.output}", file=sys.stderr)
    if done.scores:
        print("scores: " + " ".join(f"{k}={v:.4f}" for k, v in done.scores.items()), file=sys.stderr)
        if FLAGS.scores:
            Path(FLAGS.scores).write_text(json.dumps(done.scores, indent=2) + "\n")
    elif FLAGS.scores:
        print(f"--scores={FLAGS.scores}: the input has no labels, nothing scored", file=sys.stderr)


if __name__ == "__main__":
    app.run(main)

"""Predictions of a trained model on new inputs:

    python -m stackft_jax.predict --workdir=runs/demo --input=pairs.tsv --output=pairs.jsonl
    python -m stackft_jax.predict --model=exports/demo --input=- --output=-      # type, read answers

The model is a run's (`--workdir`: what its results.json `final` scored, `--params=best|last`, or the end
of any finished `--phase`) or an export's (`--model`, export.py). Inputs are the task's own files (GLUE
TSV, Yahoo CSV, CoNLL), labelled or not, or one example per line (data/task_spec.py `example_from_line`:
JSON objects or the task's plain text; `--input=-` reads standard input and answers each line as it
comes). The output is JSONL, one record per example in input order, the records of the run's own
`predictions/<split>.jsonl`; a labelled input is also scored (`--scores`). `--decode=iob2` has a
softmax word tagger predict well-formed IOB2 sequences only (models/word_scores.py), without retraining.
The run's evaluator does the work: all devices, length-sorted batches gathered back into input order,
the persistent compilation cache.

Every refusal (an unfinished run, a file of another task, bad bytes, an unknown class or tag, an output
that exists, a damaged record or checkpoint, tokenizer files other than those the run or export
recorded) is one line before the model is built; an input whose token ids reach beyond the encoder's
embedding table is refused naming the example and the id. Nothing is written to the workdir.
"""

import json
import sys
from pathlib import Path

from absl import app, flags

from stackft_jax.runtime import cli_errors
from stackft_jax.runtime.cli_errors import UsageError
from stackft_jax.trained import inference

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
flags.DEFINE_enum(
    "decode",
    None,
    ["iob2"],
    "iob2: a softmax word tagger (token_mlp, bilstm) predicts the most probable well-formed IOB2 tag "
    "sequence (Viterbi under IOB2 constraints) instead of each word's argmax; the parameters are the run's.",
)
flags.DEFINE_bool("overwrite", False, "Replace non-empty --output/--scores files.")
STDIN = "-"


def _check_target(flag: str, path: str | None) -> None:
    if path and path != STDIN:
        if Path(path).is_dir():
            raise UsageError(f"--{flag}={path} is a folder: name a file")
        from stackft_jax.training import workdirs  # flax; only for a target that exists

        workdirs.refuse_run_target(flag, path)  # a run's predictions feed its ensembles and reports
        cli_errors.refuse_to_replace(flag, path, overwrite=FLAGS.overwrite)


def _check_distinct_files() -> None:
    """--input, --output and --scores name three different files: one written over another loses it."""
    named = [
        (f, p) for f, p in (("input", FLAGS.input), ("output", FLAGS.output), ("scores", FLAGS.scores)) if p
    ]
    seen: dict[Path, str] = {}
    for flag, path in named:
        if path == STDIN:
            continue
        first = seen.setdefault(Path(path).expanduser().resolve(), flag)
        if first != flag:
            raise UsageError(f"--{first} and --{flag} name one file ({path}): name another file for --{flag}")


def _open_source():
    from stackft_jax.trained import opening  # orbax and flax: after the flags are checked

    if bool(FLAGS.workdir) == bool(FLAGS.model):
        raise UsageError("give one of --workdir (a run) or --model (an export)")
    if FLAGS.model:
        if FLAGS.params or FLAGS.phase:
            raise UsageError(
                "--params and --phase choose among a workdir's parameters; an export holds one set"
            )
        source = opening.open_export(FLAGS.model)
    else:
        source = opening.open_workdir(FLAGS.workdir, params=FLAGS.params, phase=FLAGS.phase)
    return source if FLAGS.decode is None else opening.with_iob2_decoding(source)


@cli_errors.guarded
def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise UsageError(f"unexpected arguments: {argv[1:]}")
    if not FLAGS.input or not FLAGS.output:
        raise UsageError("--input and --output are required (- for stdin / stdout)")
    from stackft_jax.runtime import logs  # after the flags: a mistake answers at once

    if FLAGS.per_device_batch_size is not None and FLAGS.per_device_batch_size < 1:
        raise UsageError(
            f"--per_device_batch_size={FLAGS.per_device_batch_size}: give a positive number of examples "
            "(or leave it out for the run's eval batch)"
        )

    logs.setup()
    # Every refusal comes before the model is built.
    _check_distinct_files()
    source = _open_source()
    _check_target("output", FLAGS.output)
    _check_target("scores", FLAGS.scores)
    examples = None if FLAGS.input == STDIN else inference.read_input(source.task, Path(FLAGS.input))
    from stackft_jax.runtime import compilation_cache
    from stackft_jax.training import prediction_files  # after the input is read and checked

    compilation_cache.enable(source.run_spec.compilation_cache_dir)
    predictor = inference.Predictor(source, per_device_batch_size=FLAGS.per_device_batch_size)
    print(f"{source.path}: {predictor.loaded.which} parameters, task {source.task.name}", file=sys.stderr)
    if examples is None:
        out = sys.stdout if FLAGS.output == STDIN else Path(FLAGS.output).open("w")
        refused = inference.stream(predictor, sys.stdin, lambda r: print(json.dumps(r), file=out, flush=True))
        if refused:  # a script piping lines in learns that some got no answer
            raise cli_errors.DataError(f"{refused} input line(s) refused (above); the others were answered")
        return
    done = predictor.predict(examples)
    if FLAGS.output == STDIN:
        for record in done.records:
            print(json.dumps(record))
    else:
        prediction_files.write(FLAGS.output, done.records)
    print(f"{len(done.records)} predictions: {FLAGS.output}", file=sys.stderr)
    if done.scores:
        print("scores: " + " ".join(f"{k}={v:.4f}" for k, v in done.scores.items()), file=sys.stderr)
        if FLAGS.scores:
            Path(FLAGS.scores).write_text(json.dumps(done.scores, indent=2) + "\n")
    elif FLAGS.scores:
        print(f"--scores={FLAGS.scores}: the input has no labels, nothing scored", file=sys.stderr)


if __name__ == "__main__":
    app.run(main, flags_parser=cli_errors.parse_flags)

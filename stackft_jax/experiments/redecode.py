"""Softmax taggers' runs rescored with IOB2-constrained decoding from their saved parameters: what the
constraint alone changes, the weights held fixed (head option `iob2_decoding`, models/word_scores.py).

    python -m stackft_jax.experiments.redecode \
        --runs='docs/grids/budget_curves_conll/runs/*name=token_mlp*' \
        --input=../shared/data/conll2003/eng.testb --split=test --out=docs/iob2_decoding_test.json

Each run (a finished workdir that still holds its checkpoints) predicts --input with the parameters its
results.json `final` scored, decoded under the constraints (predict --decode=iob2). Beside each, the
run's own scores of that split as trained (results.json `final[split]`). A cell is the runs whose folder
names differ only in `-seedN`; per cell, the constrained minus the unconstrained score, paired by seed,
with its seed-level t-interval (statistics.t_interval). Prints a table; writes JSON.
"""

import glob
import json
import re
import statistics
from pathlib import Path
from typing import Any

from absl import app, flags

from stackft_jax.experiments import statistics as array_statistics
from stackft_jax.runtime import cli_errors
from stackft_jax.runtime.cli_errors import UsageError

FLAGS = flags.FLAGS
flags.DEFINE_string("runs", None, "A glob of finished runs' workdirs (quote it).")
flags.DEFINE_string("input", None, "The labelled file to predict, in the task's format (e.g. eng.testb).")
flags.DEFINE_string("split", None, "The split --input is in the runs' results.json (test, dev).")
flags.DEFINE_string("out", None, "Where the JSON goes.")
METRICS = ("f1", "strict_f1")
_SEED = re.compile(r"-seed\d+$")


def rescore(run: Path, input_file: Path, split: str) -> dict[str, Any]:
    """One run's `split` scores as trained and under IOB2-constrained decoding."""
    from stackft_jax.trained import inference, opening  # jax: after the flags are checked

    source = opening.with_iob2_decoding(opening.open_workdir(run))
    trained = source.results["final"].get(split)
    if trained is None:
        raise UsageError(f"{run}/results.json scored no {split!r} split")
    done = inference.Predictor(source).predict(inference.read_input(source.task, input_file), progress=False)
    return {
        "params": source.params,
        "trained": {m: trained[m] for m in METRICS},
        "iob2": {m: done.scores[m] for m in METRICS},
    }


def cells(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per cell (run names without `-seedN`): the mean scores and the paired difference per metric."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for name, row in sorted(rows.items()):
        grouped.setdefault(_SEED.sub("", name), []).append(row)
    out = {}
    for cell, runs in grouped.items():
        out[cell] = {"n": len(runs)}
        for metric in METRICS:
            differences = [r["iob2"][metric] - r["trained"][metric] for r in runs]
            out[cell][metric] = {
                "trained_mean": statistics.mean(r["trained"][metric] for r in runs),
                "iob2_mean": statistics.mean(r["iob2"][metric] for r in runs),
                "difference": array_statistics.t_interval(differences),
            }
    return out


def table(per_cell: dict[str, dict[str, Any]]) -> list[str]:
    def interval(t: dict[str, Any]) -> str:
        if t["ci_low"] is None:
            return f"{100 * t['mean']:+.2f}"
        return f"{100 * t['mean']:+.2f} [{100 * t['ci_low']:+.2f}, {100 * t['ci_high']:+.2f}]"

    lines = [
        "| cell | seeds | f1 trained -> iob2 | difference [95% t-interval] | strict_f1 trained -> iob2 "
        "| difference [95% t-interval] |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for cell, row in per_cell.items():
        parts = [
            f"{row[m]['trained_mean']:.4f} -> {row[m]['iob2_mean']:.4f} | {interval(row[m]['difference'])}"
            for m in METRICS
        ]
        lines.append(f"| {cell} | {row['n']} | {parts[0]} | {parts[1]} |")
    return lines


@cli_errors.guarded
def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise UsageError(f"unexpected arguments: {argv[1:]}")
    if not (FLAGS.runs and FLAGS.input and FLAGS.split and FLAGS.out):
        raise UsageError("--runs, --input, --split and --out are required")
    runs = sorted(Path(p) for p in glob.glob(FLAGS.runs) if Path(p).is_dir())
    if not runs:
        raise UsageError(f"--runs={FLAGS.runs!r} matches no folder")
    input_file = Path(FLAGS.input)
    if not input_file.is_file():
        raise FileNotFoundError(f"--input={input_file}: no such file")
    from stackft_jax.runtime import logs

    logs.setup()
    rows = {}
    for run in runs:
        rows[run.name] = rescore(run, input_file, FLAGS.split)
        print(f"{run.name}: {rows[run.name]}", flush=True)
    per_cell = cells(rows)
    Path(FLAGS.out).write_text(
        json.dumps(
            {"input": str(input_file), "split": FLAGS.split, "runs": rows, "cells": per_cell}, indent=1
        )
        + "\n"
    )
    print("\n".join(table(per_cell)))


if __name__ == "__main__":
    app.run(main, flags_parser=cli_errors.parse_flags)

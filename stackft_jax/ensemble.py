"""Ensembles of finished classification runs: their saved class probabilities averaged, example by example.

    python -m stackft_jax.ensemble --workdirs=runs/a,runs/b --out=runs/ens [--weights=equal|dev]

A run is finished when its WORKDIR/results.json exists; its WORKDIR/predictions/{dev,test}.jsonl hold
each example's `key`, `label` and `probabilities` (predictions.py). Members must have scored the same
examples (same keys and labels, on dev and, when any has one, on test), under the same task and label
names, with class probabilities; anything else is refused with a one-line error (exit status 2).
So is an --out that exists and is not this ensemble's own earlier output (a finished run, another
ensemble, any non-empty folder), and a run named twice.

Weights: `equal` (the default), or `dev`: the weights on a 0.1 grid over the simplex (up to 5 members)
that score best on dev by the task's primary metric, ties going to the weights nearest to equal. Test
never influences them. Every member's metrics are recomputed from its prediction files with the task's
metric functions and must equal its own results.json.

OUT/results.json lists each member's dev/test metrics beside the ensemble's, with the weights;
OUT/predictions/{dev,test}.jsonl have the members' format, so an ensemble pairs with a single run.
The library is experiments/ensemble.py.
"""

import argparse
import sys
from collections.abc import Sequence

from stackft_jax.experiments import ensembling
from stackft_jax.runtime import cli_errors


@cli_errors.guarded  # a user's mistake: one line and its exit status (cli_errors.py)
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stackft_jax.ensemble", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--workdirs", required=True, help="finished runs' workdirs, comma-separated")
    parser.add_argument("--out", required=True, help="folder for results.json and predictions/")
    parser.add_argument(
        "--weights", default="equal", choices=ensembling.WEIGHT_RULES, help="equal, or chosen on dev"
    )
    args = parser.parse_args(argv)
    workdirs = [w for w in args.workdirs.split(",") if w]
    ensembling.check_out(args.out, workdirs)
    ensembled = ensembling.ensemble(workdirs, weights=args.weights)
    results_file = ensembling.write(args.out, ensembled)
    print(ensembling.table(ensembled))
    print(f"weights: {ensembled['weights']}  ({results_file})")


if __name__ == "__main__":
    main(sys.argv[1:])

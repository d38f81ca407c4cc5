"""A 2 x 2-seed grid of the tiny random BERT (configs/tiny.py), and the ensemble of its two cells, for
tests: seconds per run.

  python -m stackft_jax.experiment --config=configs/experiments/tiny.py --workdir=/tmp/tiny_grid
"""

import ml_collections

from stackft_jax.config import config_cli


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = "configs/tiny.py:phase1.num_steps=3,phase2.num_steps=3"  # every run's config
    c.axes = "strategy=finetune_only|stack_and_finetune"  # "key=value|value|...; key=..."
    c.ensembles = "strategy=finetune_only+stack_and_finetune"  # per seed: "key=value+value; ..."
    c.num_seeds = 2  # seeds 0 .. num_seeds-1 per cell
    c.baseline = "strategy=finetune_only"  # the cell the other values are compared with
    c.metric = "accuracy"  # the dev metric of the comparisons
    config_cli.apply_items(c, arg, {})
    return c

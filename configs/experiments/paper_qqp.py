"""Wang et al. 2019's QQP experiment as a grid: their heads x the three strategies x 5 seeds.

Full scale (bert-base-uncased, GLUE QQP from the Hugging Face hub, the budgets of configs/quora.py):
  python -m stackft_jax.experiment --config=configs/experiments/paper_qqp.py --workdir=runs/paper_qqp
CPU-sized (embedded MiniLM, the shared QQP subset, configs/quora.py's `mini` budgets):
  python -m stackft_jax.experiment --config=configs/experiments/paper_qqp.py:small \
    --workdir=runs/paper_qqp_small
The report (WORKDIR/report.md) compares every strategy with finetune_only, per head, paired by seed.
"""

import ml_collections

from stackft_jax import config_cli


def small(c: ml_collections.ConfigDict) -> None:
    c.base = (
        "configs/quora.py:mini,data.train_file=../shared/data/qqp/train.tsv,"
        "data.dev_file=../shared/data/qqp/dev.tsv"
    )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = "configs/quora.py"  # the experiment config every run starts from: FILE.py[:presets,key=value]
    c.axes = (  # "key=value|value|...; key=..." over any config keys
        "strategy=finetune_only|stack_only|stack_and_finetune; "
        "head.name=cls_mlp|bimpm|bimpm_no_context|sim_transformer"
    )
    c.num_seeds = 5  # seeds 0 .. num_seeds-1 per cell
    c.baseline = "strategy=finetune_only"  # the cell every other value of this axis is compared with
    c.metric = "accuracy"  # the dev metric of the comparisons (the paper's measure)
    config_cli.apply_items(c, arg, {"small": small})
    return c

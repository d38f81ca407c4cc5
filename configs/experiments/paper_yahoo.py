"""Wang et al. 2019's Yahoo Answers experiment (two classes) as a grid: DenseNet and Highway-LSTM heads x
the three strategies x 5 seeds; their ensemble is built from the finished runs afterwards.

Full scale (bert-base-uncased, the Hugging Face yahoo_answers_topics dataset, configs/yahoo.py budgets):
  python -m stackft_jax.experiment --config=configs/experiments/paper_yahoo.py --workdir=runs/paper_yahoo
CPU-sized (embedded MiniLM, the shared two-class files, 150 + 150 steps of batch 16, 128 tokens):
  python -m stackft_jax.experiment --config=configs/experiments/paper_yahoo.py:small \
    --workdir=runs/paper_yahoo_small
The paper's ensemble of the two stack-and-finetune heads, per seed k:
  R=runs/paper_yahoo_small/runs/strategy=stack_and_finetune
  python -m stackft_jax.ensemble --workdirs=$R-name=densenet-seed0,$R-name=highway_lstm-seed0 \
    --out=runs/paper_yahoo_small/ensemble-seed0
"""

import ml_collections

from stackft_jax import config_cli


def small(c: ml_collections.ConfigDict) -> None:
    c.base = (
        "configs/yahoo.py:mini,data.train_file=../shared/data/yahoo_answers/train.csv,"
        "data.dev_file=../shared/data/yahoo_answers/dev.csv"
    )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = "configs/yahoo.py"  # the experiment config every run starts from: FILE.py[:presets,key=value]
    c.axes = (  # "key=value|value|...; key=..." over any config keys
        "strategy=finetune_only|stack_only|stack_and_finetune; head.name=densenet|highway_lstm"
    )
    c.num_seeds = 5  # seeds 0 .. num_seeds-1 per cell
    c.baseline = "strategy=finetune_only"  # the cell every other value of this axis is compared with
    c.metric = "accuracy"  # the dev metric of the comparisons: the paper's measure
    config_cli.apply_items(c, arg, {"small": small})
    return c

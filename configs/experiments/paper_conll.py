"""Wang et al. 2019's CoNLL-2003 NER experiment as a grid: their two heads plus the BiLSTM-CRF of Peters et
al. x the three strategies x 5 seeds.

Full scale (bert-base-cased, the Hugging Face conll2003 dataset, the budgets of configs/conll03.py):
  python -m stackft_jax.experiment --config=configs/experiments/paper_conll.py --workdir=runs/paper_conll
CPU-sized (embedded MiniLM, uncased; the original files; one epoch per phase):
  python -m stackft_jax.experiment --config=configs/experiments/paper_conll.py:small \
    --workdir=runs/paper_conll_small
Comparisons use entity F1 (seqeval, strict IOB2); token accuracy, the paper's measure, is in every run's
results.json and in the report's bootstrap column.
"""

import ml_collections

from stackft_jax import config_cli


def small(c: ml_collections.ConfigDict) -> None:
    c.base = ",".join(
        [
            "configs/conll03.py:mini",
            "data.train_file=../shared/data/conll2003/eng.train",
            "data.dev_file=../shared/data/conll2003/eng.testa",
            # 200 steps of 32 sentences per phase (6,400 sentences, 46% of an epoch): the pilot's
            # finetune-only curve (docs/grids/pilot_conll) and the CPU budget in the docstring.
            "phase1.num_steps=200",
            "phase2.num_steps=200",
            # The frozen backbone without dropout: its features are computed once for every cell and
            # seed (the grid's shared feature cache), so stack_only and phase 1 cost the head alone.
            "phase1.backbone_dropout=False",
            "phase1.feature_cache=True",
            "eval_every_steps=100",  # phase 1's gap rule sees two evaluations; phase ends are scored
            "checkpoint_every_steps=1000",  # resume at phase boundaries only
        ]
    )


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = "configs/conll03.py"  # the experiment config every run starts from: FILE.py[:presets,key=value]
    c.axes = (  # "key=value|value|...; key=..." over any config keys
        "strategy=finetune_only|stack_only|stack_and_finetune; head.name=token_mlp|bilstm|bilstm_crf"
    )
    c.num_seeds = 5  # seeds 0 .. num_seeds-1 per cell
    c.baseline = "strategy=finetune_only"  # the cell every other value of this axis is compared with
    c.metric = "f1"  # the dev metric of the comparisons: entity F1
    # The gain over finetune_only that Wang et al. 2019 report per cell, "<cell name>: <points>; ...".
    # Not found: their per-head tables could not be retrieved here (searched 2026-11-24). Their abstract
    # (arXiv 1907.05338) gives one number per task, for no named head or strategy pair:
    # "0.99% accuracy improvement in sequence labeling task".
    # So the report's paper layout says "not found" for every cell.
    c.paper_results = ""
    config_cli.apply_items(c, arg, {"small": small})
    return c

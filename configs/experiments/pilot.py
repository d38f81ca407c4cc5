"""Pilot learning curves that size the paper grids' CPU presets: the dev metric against examples seen,
for finetune-only and stack-and-finetune, the cheapest head and one paper head, one seed, with a
fine-tuning budget several times the grid's and dense dev evaluations.

  python -m stackft_jax.experiment --config=configs/experiments/pilot.py:qqp \
    --workdir=docs/grids/pilot_qqp
  python -m stackft_jax.experiment --config=configs/experiments/pilot.py:conll \
    --workdir=docs/grids/pilot_conll
  python -m stackft_jax.experiment --config=configs/experiments/pilot.py:yahoo \
    --workdir=docs/grids/pilot_yahoo

  python -m stackft_jax.experiment --config=configs/experiments/pilot.py:peft_rate \
    --workdir=docs/grids/pilot_peft_rate

Each report's figures/dev_curves.png is the curve (global step x the batch of 16 or 32 = examples seen;
stack-and-finetune's head-only steps come first, dashed line at the boundary). A grid's preset is
sized where the finetune-only curve flattens or at the CPU budget its docstring states, whichever
comes first.
"""

import ml_collections

from configs.experiments import paper_conll, paper_qqp, paper_yahoo
from stackft_jax.config import config_cli
from stackft_jax.runtime.cli_errors import ConfigError


def qqp(c: ml_collections.ConfigDict) -> None:
    """paper_qqp.py:short's runs with 8x its 60 fine-tuning steps (7,680 pairs), dev every 60 steps."""
    paper_qqp.short(c)
    c.base += ",phase2.num_steps=480,eval_every_steps=60"
    c.axes = "strategy=finetune_only|stack_and_finetune; head.name=cls_mlp|bimpm"


def conll(c: ml_collections.ConfigDict) -> None:
    """paper_conll.py:small's runs with 400 fine-tuning steps of 32 sentences and 200 head-only steps in
    phase 1 (the grid's budgets were chosen from this curve), dev every 50.

    One head: token_mlp is both the cheapest tagging head and the paper's (BERT + 2 dense layers); a
    second head doubles the pilot's cost (about an hour of a 2-core machine), which the grid then pays."""
    paper_conll.small(c)
    c.base += ",phase1.num_steps=200,phase2.num_steps=400,eval_every_steps=50"
    c.axes = "strategy=finetune_only|stack_and_finetune; head.name=token_mlp"
    c.num_seeds = 1
    c.metric = "f1"
    c.equivalence_margin = paper_conll.EQUIVALENCE_MARGIN


def yahoo(c: ml_collections.ConfigDict) -> None:
    """paper_yahoo.py:small's runs with 4x its 150 fine-tuning steps (2.7 epochs of 3,600), dev every 50."""
    paper_yahoo.small(c)
    c.base += ",phase2.num_steps=600,eval_every_steps=50"
    c.axes = "strategy=finetune_only|stack_and_finetune; head.name=cls_mlp|densenet"
    c.ensembles = ""
    c.equivalence_margin = paper_yahoo.EQUIVALENCE_MARGIN


def peft_rate(c: ml_collections.ConfigDict) -> None:
    """The rate of LoRA's and BitFit's parameters for configs/experiments/peft.py: QQP cls_mlp, seed 0,
    at that grid's 300 steps, `phase2.adaptation_learning_rate` 5e-4 (the preset's default, the LoRA
    paper's RoBERTa-base rate), 1e-3, 2e-3, 4e-3 and 8e-3 (the last two added when both kinds' dev
    accuracy still rose up to 2e-3: a workdir that ran the first three takes them with
    --allow_config_change); dev every 50 steps, no test split (a rate is chosen on dev). The QQP demo's
    LoRA run at 5e-4 ended at the majority class, so the grid's rate is the one whose cells learn; the
    report's dev curves show it."""
    paper_qqp.small(c)
    c.base += ",head=cls_mlp,eval_every_steps=50"
    c.axes = "strategy=lora|bitfit; phase2.adaptation_learning_rate=0.0005|0.001|0.002|0.004|0.008"
    c.baseline = "phase2.adaptation_learning_rate=0.0005"
    c.ensembles = ""


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = ""  # set by the task's preset (qqp, conll or yahoo): that paper grid's CPU-sized runs
    c.axes = ""  # the preset's strategies x heads
    c.ensembles = ""  # none: a pilot measures single runs
    c.num_seeds = 1  # one seed: a curve's shape, not a comparison
    c.baseline = "strategy=finetune_only"  # the cell the other strategy is compared with
    c.metric = "accuracy"  # the preset's dev metric (conll: entity F1)
    # TOST's margin (the preset's task's; one seed has no TOST, but the key binds the same everywhere)
    c.equivalence_margin = paper_qqp.EQUIVALENCE_MARGIN
    config_cli.apply_items(c, arg, {"qqp": qqp, "conll": conll, "yahoo": yahoo, "peft_rate": peft_rate})
    if not c.base:
        raise ConfigError("configs/experiments/pilot.py: name a task preset, e.g. pilot.py:qqp")
    return c

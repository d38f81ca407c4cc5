"""To tune, to stack, or to adapt a few parameters: full fine-tuning and stack-and-finetune against LoRA,
LoRA after a head phase, and BitFit, on QQP (cls_mlp) and CoNLL-2003 NER (token_mlp), 5 seeds, dev and
the held-out test split.

  finetune_only        everything, the new head at its own rate (the paper grids' baseline)
  stack_and_finetune   the head on the frozen encoder, then everything (Wang et al. 2019)
  lora                 LoRA (query and value, rank 8, alpha 16) and the new head (Hu et al. 2021)
  lp_lora              the head phase of stack_and_finetune, then LoRA (LP-FT's order)
  bitfit               the encoder's biases and the new head (Ben Zaken et al. 2022)

Each task keeps its paper grid's test preset (paper_qqp.py:test, paper_conll.py:test): the same data,
budgets (phase 2 and every single-phase strategy 300 steps; phase 1 on cached features), rates and
dev/test protocol, so their finetune_only and stack_and_finetune runs are the same resolved configs as
the paper grids' and are copied from those grids' committed runs instead of trained again
(--reuse_runs_from). LoRA's and BitFit's parameters train at `phase2.adaptation_learning_rate` 2e-3
(the head at 1e-3), chosen on QQP dev by the pilot `pilot.py:peft_rate` (docs/grids/pilot_peft_rate,
seed 0, 300 steps; dev accuracy at 5e-4 / 1e-3 / 2e-3 / 4e-3 / 8e-3: LoRA 0.749 / 0.766 / 0.775 /
0.751 / 0.627, the last the majority class; BitFit 0.723 / 0.735 / 0.749 / 0.748 / 0.753, flat from
2e-3 within 0.5 points at one seed), and used on CoNLL untuned:
  taskset -c 0 python -m stackft_jax.experiment --config=configs/experiments/peft.py:qqp \
    --workdir=docs/grids/peft_qqp --reuse_runs_from=docs/grids/paper_qqp_test --shard=0/2 &
  taskset -c 1 python -m stackft_jax.experiment --config=configs/experiments/peft.py:qqp \
    --workdir=docs/grids/peft_qqp --reuse_runs_from=docs/grids/paper_qqp_test --shard=1/2
  (and peft.py:conll into docs/grids/peft_conll from docs/grids/paper_conll_test)
Cost of the 15 new runs per task: a LoRA or BitFit step still runs the encoder's forward and the backward
through its activations, so on a CPU it costs most of a fine-tuning step (benchmarks/adaptation.py), and
lp_lora adds stack-and-finetune's cheap cached head phase: about as many core-hours as 15 finetune-only
runs of the paper grids' timings.json, about 1.6 for QQP (351 s per run) and 6.5 for CoNLL (1,566 s) at
load 4-8, plus each run's test pass. Measured for QQP (docs/grids/peft_qqp, one process per core, load
2-8 over two sessions): 1.9 core-hours, LoRA 271 s and BitFit 213 s per run, lp_lora 904 s (each of
its runs built its own feature cache then; they now share one, training/feature_cache.py). Measured for
CoNLL (docs/grids/peft_conll, one process per core): 2.94 core-hours, LoRA 658 s, lp_lora 753 s and
BitFit 708 s per run (seed 0's lp_lora built the cache the other four read).

The report compares each adapted strategy with finetune_only and with stack_and_finetune, and lp_lora
with lora; its compute table gives each cell's FLOPs (an adapted phase: the backbone's forward and the
backward's activation half, plus the kind's own matrices; training/compute.py) and each run's
results.json its trained-parameter count per phase. The
encoder is all-MiniLM-L6-v2, whose contrastive training data include 103,663 Quora duplicate-question
triplets: QQP numbers from it are not those of a BERT that never saw Quora (docs/qqp_grid_reading.md).
"""

import ml_collections

from configs.experiments import paper_conll, paper_qqp
from stackft_jax.config import config_cli

STRATEGIES = "strategy=finetune_only|stack_and_finetune|lora|lp_lora|bitfit"
COMPARISONS = "; ".join(
    [
        "strategy=lora vs strategy=finetune_only",
        "strategy=lora vs strategy=stack_and_finetune",
        "strategy=lp_lora vs strategy=lora",
        "strategy=lp_lora vs strategy=stack_and_finetune",
        "strategy=bitfit vs strategy=finetune_only",
        "baseline",
    ]
)
# Hu et al. 2021 (LoRA), Table 2, RoBERTa-base on GLUE dev: QQP accuracy 90.8 with LoRA against 91.9 with
# full fine-tuning. Another encoder, task scale and budget: beside our row for scale only.
LORA_PAPER_QQP = "strategy=lora vs strategy=finetune_only: -1.1 (LoRA paper, RoBERTa-base, GLUE QQP dev)"


# The adapted parameters' rate, from the QQP dev pilot (docstring); the other strategies do not read it.
ADAPTATION_RATE = "phase2.adaptation_learning_rate=0.002"


def qqp(c: ml_collections.ConfigDict) -> None:
    """QQP, cls_mlp: paper_qqp.py:test's runs (docs/grids/paper_qqp_test)."""
    grid = paper_qqp.get_config("test")
    c.base = f"{grid.base},head=cls_mlp,{ADAPTATION_RATE}"
    c.metric = grid.metric
    c.paper_results = LORA_PAPER_QQP


def conll(c: ml_collections.ConfigDict) -> None:
    """CoNLL-2003 NER, token_mlp: paper_conll.py:test's runs (docs/grids/paper_conll_test)."""
    grid = paper_conll.get_config("test")
    # The phase-1 gap rule of the stacked cells (stack_and_finetune, lp_*) read strict IOB2 F1, what entity
    # F1 meant when they ran (as paper_conll.py:test binds its stacked cells); rule-less cells read none.
    c.base = f"{grid.base},head=token_mlp,{ADAPTATION_RATE},data.entity_f1=strict"
    c.metric = grid.metric
    c.paper_results = ""
    c.equivalence_margin = grid.equivalence_margin


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = "configs/quora.py:head=cls_mlp"  # bert-base-uncased, GLUE QQP (the presets: the CPU grids)
    c.axes = STRATEGIES  # "key=value|value|...; key=..." over any config keys
    c.num_seeds = 5  # seeds 0 .. num_seeds-1 per cell
    c.baseline = "strategy=finetune_only"  # the cell every other value of this axis is compared with
    c.metric = "accuracy"  # the dev metric of the comparisons
    # Report-only (changing them retrains nothing): the report's rows, and published gains beside them.
    c.comparisons = COMPARISONS
    c.paper_results = LORA_PAPER_QQP
    c.equivalence_margin = paper_qqp.EQUIVALENCE_MARGIN  # TOST's margin behind any "level" in the docs
    config_cli.apply_items(c, arg, {"qqp": qqp, "conll": conll})
    return c

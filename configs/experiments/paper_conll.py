"""Wang et al. 2019's CoNLL-2003 NER experiment as a grid: their two heads plus the BiLSTM-CRF of Peters et
al. x the three strategies x 5 seeds.

Full scale (bert-base-cased, the Hugging Face conll2003 dataset, the budgets of configs/conll03.py):
  python -m stackft_jax.experiment --config=configs/experiments/paper_conll.py --workdir=runs/paper_conll
CPU-sized (embedded MiniLM, uncased; the original files), 3 seeds of token_mlp and bilstm_crf, committed
run by run so it resumes from the repository on any machine:
  taskset -c 0 python -m stackft_jax.experiment --config=configs/experiments/paper_conll.py:small \
    --workdir=docs/grids/paper_conll_small --shard=0/2 &
  taskset -c 1 python -m stackft_jax.experiment --config=configs/experiments/paper_conll.py:small \
    --workdir=docs/grids/paper_conll_small --shard=1/2
Comparisons use entity F1 (seqeval, strict IOB2); token accuracy, the paper's measure, is in every run's
results.json and in the report's bootstrap column.

The small preset's budget, from the pilot (configs/experiments/pilot.py:conll, committed in
docs/grids/pilot_conll: token_mlp, seed 0, dev every 50 steps of 32 sentences): finetune-only dev F1 is
0.770 / 0.839 / 0.859 / 0.862 / 0.863 at 100 / 200 / 300 / 350 / 400 steps, so the curve flattens at
about 300 steps (+0.4 points over the last 100): phase 2 and finetune-only get 300 steps (9,600
sentences, 68% of an epoch). Phase 1 and stack-only train the head alone on cached features, which costs
little, so they get 600 steps; the pilot's phase 1 (200 steps) was still rising (F1 0.46 -> 0.64), and the
paper's gap rule may stop it earlier. Cost, measured in the pilot at load 5-8 on the 2-core machine: 3.4 s
per fine-tuning step and about 60 s per full dev pass (3,250 sentences); head-only steps and evaluations
on cached features are a small part. Expected: about 20 minutes of one core per fine-tuning run and 5 per
stack-only run at that load (bilstm_crf somewhat more), so the 18 runs of 3 seeds take about 3 hours with
two shards on a busy machine, less on a quiet one (the report's cost table gives what they took).
--config.num_seeds=5 when the budget allows.
"""

import ml_collections

from configs.experiments import paper_qqp
from stackft_jax.config import config_cli


def small(c: ml_collections.ConfigDict) -> None:
    c.axes = "strategy=finetune_only|stack_only|stack_and_finetune; head.name=token_mlp|bilstm_crf"
    c.num_seeds = 3
    c.base = ",".join(
        [
            "configs/conll03.py:mini",
            "data.train_file=../shared/data/conll2003/eng.train",
            "data.dev_file=../shared/data/conll2003/eng.testa",
            # Where the pilot's finetune-only curve flattens (docstring); the head alone trains longer.
            "phase1.num_steps=600",
            "phase2.num_steps=300",
            # The frozen backbone without dropout: its features are computed once for every cell and
            # seed (the grid's shared feature cache), so stack_only and phase 1 cost the head alone.
            "phase1.backbone_dropout=False",
            "phase1.feature_cache=True",
            "eval_every_steps=150",  # phase 1's gap rule sees four evaluations; phase 2 two full passes
            "checkpoint_every_steps=1000",  # resume at phase boundaries only
        ]
    )


def test(c: ml_collections.ConfigDict) -> None:
    """The headline cells with the held-out test split (eng.testb) scored once per run, 5 seeds, and the
    gap rule on entity F1 (the task's own; `small` compared token accuracy, whose gap never fired):
    finetune-only and stack-and-finetune x token_mlp and bilstm_crf, and finetune-only at
    stack-and-finetune's FLOPs per head (`finetune_only@matched_flops:stack_and_finetune`, on one device
    447 steps for bilstm_crf and 451 for token_mlp, whose per-token head is counted: stack-and-finetune's
    300 fine-tuning steps plus its cached features' one forward over the 14,041 training sentences,
    which costs what about 147 fine-tuning steps of 32 cost). FLOPs rather than steps: its
    600 head-only steps on cached features cost under 1 % of a fine-tuning step each, and matching them
    step for step (900 steps) would triple the baseline's compute; 447-451 steps still cover the pilot's
    question whether finetune-only gains past 300 steps (F1 0.859 at 300, 0.863 at 400). Stack-and-finetune's
    phase 1 may now stop early on the entity-F1 gap; the matched budget is its planned one (no early stop).
      taskset -c 0 python -m stackft_jax.experiment --config=configs/experiments/paper_conll.py:test \
        --workdir=docs/grids/paper_conll_test &
      taskset -c 1 python -m stackft_jax.experiment --config=configs/experiments/paper_conll.py:test \
        --workdir=docs/grids/paper_conll_test
    (without --shard each process takes the next run no other holds, so the matched cells' longer runs
    do not leave one core idle; the first runs went as --shard=0/2 and 1/2)
    Cost, measured (the committed runs' results.json `wall_time_s`, one process per core of the 2-core
    machine): 9.28 hours of process wall time for the 30 runs; per run on average 901-1,003 s in the
    300-step cells (test pass included) and 1,314 s (token_mlp) and 1,561 s (bilstm_crf) in the matched
    ones. Read in docs/conll_grid_reading.md."""
    small(c)
    c.num_seeds = 5
    # The stacked cells' phase-1 gap rule read strict IOB2 F1, what entity F1 meant when they ran (their
    # configs predate `data.entity_f1`); binding it keeps the committed runs finished, not changed.
    c.axes = (
        "strategy=finetune_only|stack_and_finetune:strategy=stack_and_finetune,data.entity_f1=strict; "
        "head.name=token_mlp|bilstm_crf"
    )
    # The task's own gap metric, entity F1 (conll03.py:mini keeps the token accuracy `small` ran with).
    c.base += ",phase1.gap_metric=f1,data.test_file=../shared/data/conll2003/eng.testb"
    # Matched-budget cells, "key=value@matched_<steps|examples|flops>:compared" (experiments/budgets.py).
    c.matched = "strategy=finetune_only@matched_flops:stack_and_finetune"
    # Planned counting the light heads' FLOPs alone (bilstm_crf's as 0), as every matched cell was
    # before each head had its count: the steps its committed runs took (447 and 451 on one device).
    c.matched_light_heads = c.matched
    c.comparisons = "; ".join(
        [PAPER_CONTRAST, *paper_qqp.matched_contrasts(c.matched, "bilstm_crf", "token_mlp"), "baseline"]
    )


def test_no_cache(c: ml_collections.ConfigDict) -> None:
    """`test` plus finetune-only at stack-and-finetune's standalone cost without a feature cache, per head
    (paper_qqp.MATCHED_NO_CACHE: its 600 phase-1 steps charged a backbone forward over their 19,200
    sentences, more than the 14,041 of the split the plan cells' cache reads once), every head's FLOPs
    counted: on one device 504 steps for token_mlp and 542 for bilstm_crf (the plan cells: 451 and 447).
    Run in the test grid's workdir it keeps the 20 finetune-only runs and trains the 10 new ones (about
    4.7 process-hours: the committed matched runs' 1,314 and 1,561 s per run, scaled by steps; they took
    2.53, two processes on the 2-core machine on 2026-11-29, 859 and 960 s per run on average); its 10
    stack-and-finetune runs stay finished, `test`'s axes binding the strict F1 their gap rule read:
      taskset -c 0 python -m stackft_jax.experiment \
        --config=configs/experiments/paper_conll.py:test_no_cache \
        --workdir=docs/grids/paper_conll_test --allow_config_change &
      taskset -c 1 python -m stackft_jax.experiment \
        --config=configs/experiments/paper_conll.py:test_no_cache \
        --workdir=docs/grids/paper_conll_test --allow_config_change"""
    test(c)
    paper_qqp.add_no_cache_cells(c, "bilstm_crf", "token_mlp")


# TOST's margin behind any "level" in the docs: at most half the paper's one NER gain (+0.99, token
# accuracy), in the compared entity F1's units (0.45 point).
EQUIVALENCE_MARGIN = 0.0045
PAPER_CONTRAST = "strategy=stack_and_finetune-name=bilstm_crf vs strategy=finetune_only-name=token_mlp"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = "configs/conll03.py"  # the experiment config every run starts from: FILE.py[:presets,key=value]
    c.axes = (  # "key=value|value|...; key=..." over any config keys
        "strategy=finetune_only|stack_only|stack_and_finetune; head.name=token_mlp|bilstm|bilstm_crf"
    )
    c.num_seeds = 5  # seeds 0 .. num_seeds-1 per cell (the small preset: 3)
    c.baseline = "strategy=finetune_only"  # the cell every other value of this axis is compared with
    c.metric = "f1"  # the dev metric of the comparisons: entity F1
    # Report-only (changing them retrains nothing): the report's rows, "<cell> vs <cell>; ...; baseline"
    # (baseline: every cell against finetune_only with the same head). The paper's contrast: the
    # BiLSTM-CRF stacked and fine-tuned against BERT fine-tuned with its light head (token_mlp); this
    # grid's finetune_only trains the new head at its own rate, not BERT's one rate.
    c.comparisons = PAPER_CONTRAST + "; baseline"
    # The gain the paper reports per row, "<cell> vs <cell>: <points> (note); ...". Wang et al. 2019's
    # abstract (arXiv 1907.05338) gives one NER number, in token accuracy ("0.99% accuracy improvement in
    # sequence labeling task"), not the entity F1 compared here: so "not found" for every row. Their
    # per-head tables could not be retrieved here (searched 2026-11-24).
    c.paper_results = ""
    c.equivalence_margin = EQUIVALENCE_MARGIN
    config_cli.apply_items(c, arg, {"small": small, "test": test, "test_no_cache": test_no_cache})
    return c

"""Wang et al. 2019's Yahoo Answers experiment (two classes) as a grid: DenseNet and Highway-LSTM heads,
and their ensemble, x the three strategies x 5 seeds.

Full scale (bert-base-uncased, the Hugging Face yahoo_answers_topics dataset, configs/yahoo.py budgets):
  python -m stackft_jax.experiment --config=configs/experiments/paper_yahoo.py --workdir=runs/paper_yahoo
CPU-sized (embedded MiniLM, the shared two-class files, 150 + 150 steps of batch 16, 128 tokens),
committed run by run so it resumes from the repository on any machine:
  taskset -c 0 python -m stackft_jax.experiment --config=configs/experiments/paper_yahoo.py:small \
    --workdir=docs/grids/paper_yahoo_small --shard=0/2 &
  taskset -c 1 python -m stackft_jax.experiment --config=configs/experiments/paper_yahoo.py:small \
    --workdir=docs/grids/paper_yahoo_small --shard=1/2
The ensemble (the paper's: equal weights) is built per strategy and seed once every run has finished, in
WORKDIR/ensembles/, and reported as the cell `name=densenet+highway_lstm`. Other weights, e.g. chosen on
dev (which then scores them optimistically): python -m stackft_jax.ensemble --weights=dev
  --workdirs=WORKDIR/runs/<cell>-name=densenet-seed0,WORKDIR/runs/<cell>-name=highway_lstm-seed0 --out=...

The small preset's budget, from the pilot (configs/experiments/pilot.py:yahoo, committed in
docs/grids/pilot_yahoo: seed 0, dev (400 questions) every 50 steps of 16): finetune-only dev accuracy is
already 0.935 / 0.935 / 0.945 (cls_mlp) and 0.928 / 0.943 / 0.945 (DenseNet) at 50 / 100 / 150 steps,
and then moves between 0.915 and 0.940 up to 600 steps without rising: two classes of Yahoo Answers are
learned within the first few hundred questions, and later differences are a few of the 400 dev
examples (0.25 points each). So phase 2 and finetune-only keep 150 steps (2,400 questions, two thirds of
an epoch of the 3,600): the curve is flat there. Phase 1 and stack-only train the head alone on cached
features for 150 steps (stack-and-finetune DenseNet after phase 1: 0.9325). Cost, measured in the pilot
at load 4-5 on the 2-core machine: 1,100 to 1,400 s per 600-step run with 12 dev passes, about 2 s per
fine-tuning step; so about 6 minutes of one busy core per fine-tuning run (fewer quiet) and 1 to 2 per
stack-only run: the 30 runs take about 2.5 core-hours at that load (the report's cost table gives what
they took).
"""

import ml_collections

from configs.experiments import paper_qqp
from stackft_jax.config import config_cli


def small(c: ml_collections.ConfigDict) -> None:
    c.base = ",".join(
        [
            "configs/yahoo.py:mini",
            "data.train_file=../shared/data/yahoo_answers/train.csv",
            "data.dev_file=../shared/data/yahoo_answers/dev.csv",
            # The frozen backbone without dropout: its features are computed once for every cell and
            # seed (the grid's shared feature cache), so stack_only and phase 1 cost the head alone.
            "phase1.backbone_dropout=False",
            "phase1.feature_cache=True",
            "eval_every_steps=75",  # phase 1's gap rule sees two evaluations; phase ends are scored
            "checkpoint_every_steps=1000",  # resume at phase boundaries only
        ]
    )


def test(c: ml_collections.ConfigDict) -> None:
    """`small` with the held-out test split scored once per run, and the paper's light-head baseline
    (finetune-only cls_mlp) beside both ensemble members, 5 seeds: docs/grids/paper_yahoo_test. Budgets
    stay those chosen on dev for `small`. The cells the two grids share reproduce to the digit on the
    same software, XLA flags, CPU and thread count, not necessarily across them (docs/guarantees.md: 4
    of 12 QQP runs shared by two grids did not).

    Plus finetune-only at stack-and-finetune's FLOPs per head (`strategy=finetune_only@matched_flops:
    stack_and_finetune`, experiments/budgets.py): on one device 225 steps (226 with cls_mlp, whose head
    is counted),
    stack-and-finetune's 150 fine-tuning steps plus its cached features' one forward over the 3,600
    training questions, what 75 fine-tuning steps of 16 cost. FLOPs, not steps (300): the 150 head-only
    steps on cached features cost a small part of a fine-tuning step each; the question is whether the
    gain is extra compute. (Yahoo's finetune-only curve is flat from 50 to 600 steps in the pilot, so
    either budget tests the same.) Cost of the 15 matched runs, from the `small` grid's timings.json
    (means per run at load 4-5): finetune-only 416 s (DenseNet) and 312 s (Highway-LSTM) at 150 steps,
    cls_mlp about 360 s (the pilot's 2.4 s per step): at 225 steps about 620, 470 and 540 s, about 2.3
    core-hours with their test passes (the 30 other runs about 3). Measured: the 45 runs took 6.37
    hours of process wall time, one process per core (results.json `wall_time_s`; the report's compute
    table per cell), read in docs/yahoo_grid_reading.md:
      taskset -c 0 python -m stackft_jax.experiment --config=configs/experiments/paper_yahoo.py:test \
        --workdir=docs/grids/paper_yahoo_test &
      taskset -c 1 python -m stackft_jax.experiment --config=configs/experiments/paper_yahoo.py:test \
        --workdir=docs/grids/paper_yahoo_test"""
    small(c)
    c.base += ",data.test_file=../shared/data/yahoo_answers/test.csv"
    c.axes = "strategy=finetune_only|stack_and_finetune; head.name=cls_mlp|densenet|highway_lstm"
    # Matched-budget cells, "key=value@matched_<steps|examples|flops>:compared" (experiments/budgets.py).
    c.matched = "strategy=finetune_only@matched_flops:stack_and_finetune"
    # Planned counting the light heads' FLOPs alone (DenseNet's and Highway-LSTM's as 0), as every
    # matched cell was before each head had its count: the steps its committed runs took (225 and 226
    # on one device).
    c.matched_light_heads = c.matched
    # The paper's contrast: the ensemble (and each complex head) stacked and fine-tuned against BERT
    # fine-tuned with the light head. This grid's finetune_only trains the new head at its own rate
    # (phase2.new_head_learning_rate), not BERT's one rate: the stronger of the two baselines.
    c.comparisons = "; ".join(
        [f"{SF}-name={head} vs {FO}-name=cls_mlp" for head in (ENSEMBLE, "densenet", "highway_lstm")]
        + ENSEMBLE_VS_SINGLE
        + paper_qqp.matched_contrasts(c.matched, ENSEMBLE, "cls_mlp", "densenet", "highway_lstm")
        + ["baseline"]
    )
    c.paper_results = f"{SF}-name={ENSEMBLE} vs {FO}-name=cls_mlp: {ABSTRACT_GAIN}"


def test_no_cache(c: ml_collections.ConfigDict) -> None:
    """`test` plus finetune-only at stack-and-finetune's standalone cost without a feature cache, per head
    (paper_qqp.MATCHED_NO_CACHE: its 150 phase-1 steps charged a backbone forward over their 2,400
    questions, not one over the 3,600 of the split), every head's FLOPs counted: on one device 201 steps for
    cls_mlp, 202 for DenseNet and 207 for Highway-LSTM (the plan cells: 226, 225, 225). Run in the test
    grid's workdir it keeps the 45 finished runs and trains the 15 new ones (about 2.4 process-hours: the
    committed matched runs' 577-743 s per run, scaled by steps):
      taskset -c 0 python -m stackft_jax.experiment \
        --config=configs/experiments/paper_yahoo.py:test_no_cache \
        --workdir=docs/grids/paper_yahoo_test --allow_config_change &
      taskset -c 1 python -m stackft_jax.experiment \
        --config=configs/experiments/paper_yahoo.py:test_no_cache \
        --workdir=docs/grids/paper_yahoo_test --allow_config_change"""
    test(c)
    paper_qqp.add_no_cache_cells(c, ENSEMBLE, "cls_mlp", "densenet", "highway_lstm")


SF, FO, ENSEMBLE = "strategy=stack_and_finetune", "strategy=finetune_only", "densenet+highway_lstm"
# The ensemble against its members, both stacked and fine-tuned (ensemble vs single run).
ENSEMBLE_VS_SINGLE = [f"{SF}-name={ENSEMBLE} vs {SF}-name={head}" for head in ("densenet", "highway_lstm")]
# The one Yahoo number Wang et al. 2019 give (abstract, arXiv 1907.05338: "0.72% accuracy improvement in
# the text classification task"); their per-head tables could not be retrieved here (searched 2026-11-24).
# TOST's margin behind any "level" in the docs: at most half the paper's +0.72 (0.35 point of accuracy).
EQUIVALENCE_MARGIN = 0.0035
ABSTRACT_GAIN = "+0.72 (abstract: one number per task, head, ensemble and baseline recipe not named)"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = "configs/yahoo.py"  # the experiment config every run starts from: FILE.py[:presets,key=value]
    c.axes = (  # "key=value|value|...; key=..." over any config keys
        "strategy=finetune_only|stack_only|stack_and_finetune; head.name=densenet|highway_lstm"
    )
    c.ensembles = "head.name=densenet+highway_lstm"  # per strategy and seed: "key=value+value; ..."
    c.num_seeds = 5  # seeds 0 .. num_seeds-1 per cell
    c.baseline = "strategy=finetune_only"  # the cell every other value of this axis is compared with
    c.metric = "accuracy"  # the dev metric of the comparisons: the paper's measure
    # Report-only (changing them retrains nothing): the report's rows, "<cell> vs <cell>; ...; baseline"
    # (baseline: every cell against finetune_only with the same head). This grid has no light-head
    # (cls_mlp) cell: the paper's contrast against it is in the `test` preset.
    c.comparisons = "; ".join(
        [f"{SF}-name={ENSEMBLE} vs {FO}-name={head}" for head in ("densenet", "highway_lstm")]
        + ENSEMBLE_VS_SINGLE
        + ["baseline"]
    )
    # The gain the paper reports per row, "<cell> vs <cell>: <points> (note); ...": not found per row here.
    c.paper_results = ""
    c.equivalence_margin = EQUIVALENCE_MARGIN
    config_cli.apply_items(c, arg, {"small": small, "test": test, "test_no_cache": test_no_cache})
    return c

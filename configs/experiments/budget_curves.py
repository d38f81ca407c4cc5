"""Learning curves of the paper grids: every strategy of each task's test grid at three fine-tuning
budgets (the grid axis `budget_steps`: the last phase's steps; experiments/budget_curves.py), 5 seeds,
with a selection slice of train (`data.selection_fraction=0.1`) that chooses everything chosen inside
the grid (each curve's best budget, the best checkpoint, phase 1's gap rule), so dev and test are only
reported; test is scored once per run. The report gives each curve on the selection slice, dev and
test, its best budget, each cell against the baseline at the same budget (the comparisons), and each
curve at its best budget against the baseline's curve at its own (on test).

The three curves are committed (docs/grids/budget_curves_conll, docs/grids/budget_curves_yahoo,
docs/grids/budget_curves_qqp) and read in docs/budget_curves_reading.md (the issue capped the three at
25 CPU-hours: see each preset's cost). Commands, one process per core:
  taskset -c 0 python -m stackft_jax.experiment --config=configs/experiments/budget_curves.py:qqp \
    --workdir=docs/grids/budget_curves_qqp &
  taskset -c 1 python -m stackft_jax.experiment --config=configs/experiments/budget_curves.py:qqp \
    --workdir=docs/grids/budget_curves_qqp
and the same with `:conll` (docs/grids/budget_curves_conll) and `:yahoo` (docs/grids/budget_curves_yahoo).

Costs are estimated from the committed test grids' per-run wall times (results.json `wall_time_s`, one
process per core of the 2-core machine at load 4-5) as a fixed part plus a part per fine-tuning step.
One short run with the selection slice, timed on 2026-11-28 on that machine at a higher load (about 8
processes on 2 cores): QQP finetune-only cls_mlp, 60 steps (`budget_steps=60`, test grid base, slice
0.1: 15,747 pairs left to train, 1,750 to select on), 720 s of wall time: 491 s for the phase (130 s of
it compiling the train step, then 3-5 s per step) and about 100 s per 3,000-pair evaluation pass (dev,
test). At that load the estimates below about double. Alone on the machine, a 300-step fine-tuning run
took 275 s on CoNLL and 125-221 s on QQP (benchmarks/RESULTS.md §12); packed batches, which these
grids run, took 1.68x less process time than random batches in 16-token buckets on CoNLL (§15).
"""

import ml_collections

from configs.experiments import paper_conll, paper_qqp, paper_yahoo
from stackft_jax.config import config_cli
from stackft_jax.experiments.budget_curves import AXIS

SELECTION = ",data.selection_fraction=0.1"  # 10% of train: QQP 1,750 pairs, CoNLL 1,405 sentences, Yahoo 360
# The library's defaults for new runs where the test grids' `mini` presets keep what their committed
# runs ran: random batches computed packed (data/packing.py; benchmarks/RESULTS.md §15: the same
# examples per step, 90% real tokens on CoNLL-2003 against 29% in the doubling buckets; rare row counts
# padded up to the phase's plan), cached phases
# in buckets of 16 tokens, and the skip_update non-finite guard (training/steps.py).
NEW_RUN_KEYS = (
    ",batching.scheme=packed,batching.bucket_tokens=16,batching.loss_weighting=batch_mean"
    ",batching.min_row_share=0.05,nonfinite_guard=skip_update"
)


def _start_from(c: ml_collections.ConfigDict, test_grid: ml_collections.ConfigDict) -> None:
    """Every key of the task's test grid (base, seeds, baseline, metric, ensembles, margins) but its
    matched cells' heads convention: these grids have no matched cells (the presets empty `matched`)."""
    for key, value in test_grid.items():
        if key != "matched_light_heads":
            c[key] = value


def _at_each_budget(contrasts: list[str], budgets: tuple[int, ...]) -> str:
    """Report-only `comparisons`: each "<cell> vs <cell>" of a test grid at every budget (the same budget
    on both sides), then every cell against the baseline with the same other axes and budget."""
    rows = []
    for budget in budgets:
        for contrast in contrasts:
            cell, other = contrast.split(" vs ")
            rows.append(f"{cell}-{AXIS}={budget} vs {other}-{AXIS}={budget}")
    return "; ".join([*rows, "baseline"])


def qqp(c: ml_collections.ConfigDict) -> None:
    """QQP: the paper's layout and the same-head contrast at 300 / 600 fine-tuning steps, 3 seeds:
    finetune-only `cls_mlp` (the light head), finetune-only BiMPM (the paper's first pair head, which the
    test grid lacks) and stack-and-finetune BiMPM, with finetune-only BiMPM at BERT's one rate
    (`finetune_only_uniform`) added at 300 steps: 3 x 2 x 3 + 3 = 21 runs. Scores below are from an
    encoder trained on 103,663 Quora triplets.

    Recipes, from the dev grids (dev accuracy, 5 seeds): stack-and-finetune runs a 30-step cached
    phase 1, about 6 points above the 120-step one for stacked BiMPM in every seed
    (docs/grids/phase1_dropout_separate). Finetune-only trains the new head at its own rate (1e-3); for
    `cls_mlp` the two rates were level on dev, but for BiMPM BERT's one rate scored 2.89 [+1.27, +4.51]
    points higher (every seed, Holm 0.101; docs/grids/paper_qqp_small). The 18-run version ran the
    new-head rate for BiMPM only, on a sign misread of that row; the three `finetune_only_uniform`
    BiMPM runs at 300 steps (what the 25-hour cap left; 600 steps would pass it) give the same-head
    contrast against the recipe the dev grid scored higher as well (not shown after Holm there).

    What the 25 CPU-hours the issue allows for the curve grids and the matched cells left room for.
    Spent before this grid: CoNLL curve 5.5, CoNLL rescoring 0.4, Yahoo curve 6.7, CoNLL no-cache
    cells 2.53 process-hours, 0.3 on three Sim-Transformer runs set aside, and 3.1 on 26 runs of a
    48-run version of this grid (4 recipes x `cls_mlp` and BiMPM) lost with a session's machine before
    they were committed: 18.53, so 6.47 left. Measured on 2026-11-29, one process per core of a 2-core
    machine (results.json `wall_time_s`): finetune-only `cls_mlp` 793 / 1,207 s at 300 / 600 steps at
    seed 0 (265 / 253 s of it compiling), 386-418 / 707-717 s at seeds 1-2, which load their programs
    from the persistent compilation cache; finetune-only BiMPM 1,360 / 1,839 s at seed 0 (512 / 478 s
    compiling), 651-732 s at 300 steps later; stacked BiMPM 1,334 / 1,618 s at seed 0 (the 300-step
    run's including 204 s building the feature cache). The 21 runs took 6.11 process-hours: 4.94 for
    16 on that machine, 0.52 for two stacked runs on a later one that found the feature cache on disk,
    0.65 for the three one-rate BiMPM runs there (783-784 s each): 24.64 of the 25 in all.
    Sim-Transformer stays in the test grid (docs/grids/paper_qqp_test: stacked at 300 phase-2
    steps, fine-tuned at 300 and at matched FLOPs), as does `finetune_only_uniform` `cls_mlp`.
    Removing `exclude_cells` and adding the 120-step stacked recipe back to the axis restore the 48-run
    version (four recipes x two heads; with --allow_config_change in this workdir)."""
    _start_from(c, paper_qqp.get_config("test"))
    c.base += SELECTION + NEW_RUN_KEYS
    budgets = (300, 600)
    c.axes = "; ".join(
        [
            "recipe=finetune_only:strategy=finetune_only"
            "|finetune_only_uniform:strategy=finetune_only_uniform"
            "|stack_and_finetune_p1_30:strategy=stack_and_finetune,phase1.num_steps=30",
            "head.name=cls_mlp|bimpm",
            f"{AXIS}=" + "|".join(map(str, budgets)),
        ]
    )
    # The light head is the fine-tuned baseline of the paper's layout only: it is not stacked here, and
    # its one-rate recipe is in the test grid. BERT's one rate for BiMPM runs at 300 steps only (the cap).
    c.exclude_cells = "; ".join(
        [
            "recipe=stack_and_finetune_p1_30,head.name=cls_mlp",
            "recipe=finetune_only_uniform,head.name=cls_mlp",
            f"recipe=finetune_only_uniform,head.name=bimpm,{AXIS}=600",
        ]
    )
    c.num_seeds = 3
    c.baseline = "recipe=finetune_only"
    c.matched = ""  # the budget axis sets the steps (budget_curves.budgets_of refuses both)
    # At each budget: the paper's contrast (stacked BiMPM against the light head fine-tuned) and the
    # head alone (BiMPM against the light head, both fine-tuned); the baseline rows add the same-head
    # contrast (stacked BiMPM against fine-tuned BiMPM), the best-budget rows each curve at its best.
    # The same-head contrast against the one-rate BiMPM too (300 steps: the cell it has). The baseline
    # rows add one-rate against new-head-rate BiMPM.
    c.comparisons = (
        f"recipe=stack_and_finetune_p1_30-name=bimpm-{AXIS}=300"
        f" vs recipe=finetune_only_uniform-name=bimpm-{AXIS}=300; "
    ) + _at_each_budget(
        [
            "recipe=stack_and_finetune_p1_30-name=bimpm vs recipe=finetune_only-name=cls_mlp",
            "recipe=finetune_only-name=bimpm vs recipe=finetune_only-name=cls_mlp",
        ],
        budgets,
    )
    c.paper_results = ""


def conll(c: ml_collections.ConfigDict) -> None:
    """CoNLL-2003, the test grid's cells (finetune-only and stack-and-finetune x token_mlp and
    bilstm_crf, the gap rule on entity F1) at 150 / 300 / 600 fine-tuning steps: 4 x 3 x 5 = 60 runs.

    Ran 2026-11-28/29 (docs/grids/budget_curves_conll, read in docs/budget_curves_reading.md), one
    process per core of the 2-core machine: 5.5 process-hours in all (results.json `wall_time_s`, cell
    means: 135-410 s per token_mlp run, 207-627 s per bilstm_crf run), a quarter of the 21 hours
    estimated from the random-batch test grid at load 4-5."""
    _start_from(c, paper_conll.get_config("test"))
    c.base += SELECTION + NEW_RUN_KEYS
    budgets = (150, 300, 600)
    c.axes = (
        "strategy=finetune_only|stack_and_finetune; head.name=token_mlp|bilstm_crf; "
        + f"{AXIS}="
        + "|".join(map(str, budgets))
    )
    c.matched = ""
    # The paper's contrast (stacked BiLSTM-CRF against the light head fine-tuned) at each budget.
    c.comparisons = _at_each_budget([paper_conll.PAPER_CONTRAST], budgets)


def yahoo(c: ml_collections.ConfigDict) -> None:
    """Yahoo Answers, the test grid's cells (finetune-only and stack-and-finetune x cls_mlp, DenseNet,
    Highway-LSTM; the DenseNet + Highway-LSTM ensemble per budget) at 150 / 300 fine-tuning steps (the
    test grid's 150 and its double): 2 x 3 x 2 x 5 = 60 runs.

    Why two budgets: the issue's 25 CPU-hours for the three curve grids. Begun at 75 / 150 / 300, its
    first seed's finetune-only runs took 149-441 s with cls_mlp, 192-367 s with Highway-LSTM and
    246-930 s with DenseNet (one process per core, 2026-11-29), about 400 s a run: 10 process-hours for
    90 runs. Dropping the 75-step point (the shortest, below the test grid's budget) keeps 5 seeds at
    about 8 hours; the 75-step runs that had finished were left out of the grid.

    Ran 2026-11-29 (docs/grids/budget_curves_yahoo, read in docs/budget_curves_reading.md), one process
    per core: 6.5 process-hours for the 60 runs (results.json `wall_time_s`: 182-1062 s per run),
    plus 0.2 for the four dropped 75-step runs."""
    _start_from(c, paper_yahoo.get_config("test"))
    c.base += SELECTION + NEW_RUN_KEYS
    budgets = (150, 300)
    c.axes = "strategy=finetune_only|stack_and_finetune; head.name=cls_mlp|densenet|highway_lstm; " + (
        f"{AXIS}=" + "|".join(map(str, budgets))
    )
    c.matched = ""
    # The paper's contrast (the stacked ensemble, and each complex head, against the light head
    # fine-tuned) at each budget.
    sf, fo, ensemble = paper_yahoo.SF, paper_yahoo.FO, paper_yahoo.ENSEMBLE
    c.comparisons = _at_each_budget(
        [f"{sf}-name={head} vs {fo}-name=cls_mlp" for head in (ensemble, "densenet", "highway_lstm")], budgets
    )
    c.paper_results = ""


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """A preset is required (`:qqp`, `:conll` or `:yahoo`): each starts from its task's test grid."""
    c = ml_collections.ConfigDict()
    config_cli.apply_items(c, arg, {"qqp": qqp, "conll": conll, "yahoo": yahoo})
    return c

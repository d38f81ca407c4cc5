"""Does stack-and-finetune's phase 2 lose what phase 1 gave because phase 1 ran without dropout?

The CPU preset of the QQP grid (paper_qqp.py:small) trains phase 1 on cached features of the frozen
backbone, computed once without dropout, so that stack-only and phase 1 cost the head alone. Phase 2 then
switches the backbone's dropout (0.1) on under a head that never saw it, and in that grid phase 2 lowers
stack-and-finetune BiMPM's dev accuracy below its phase-1 score. One diagnostic run (seed 0) with the
backbone's dropout on in phase 1 ended phase 2 about 3 points higher. This grid asks it with seeds:
stack-and-finetune BiMPM with phase 1 on cached dropout-free features (`cached`, the grid's recipe) and
with the backbone run in training mode every phase-1 step (`dropout`, no cache: dearer), against
finetune-only BiMPM (the QQP grid's baseline; the same runs again, so the report pairs them by seed).

CPU-sized, everything else as paper_qqp.py:small (300 fine-tuning steps, 120 head-only steps). Its
`finetune_only` and `cached` cells are the QQP grid's finetune-only and stack-and-finetune BiMPM runs (the
same resolved configs), so they are copied from that grid's committed runs rather than trained again:
  taskset -c 0 python -m stackft_jax.experiment --config=configs/experiments/phase1_dropout.py:small \
    --workdir=docs/grids/phase1_dropout_small --reuse_runs_from=docs/grids/paper_qqp_small --shard=0/2 &
  taskset -c 1 python -m stackft_jax.experiment --config=configs/experiments/phase1_dropout.py:small \
    --workdir=docs/grids/phase1_dropout_small --reuse_runs_from=docs/grids/paper_qqp_small --shard=1/2
Cost: the 5 `dropout` runs, about 700 s each (the diagnostic run: phase 1 pays the backbone's forward
pass every step and on the 2,000 gap pairs), about 1 core-hour; without the copies 15 runs, about 2.4.
"""

import ml_collections

from configs.experiments import paper_qqp
from stackft_jax.config import config_cli

_RECIPES = (
    "recipe=finetune_only:strategy=finetune_only"
    "|cached:phase1.backbone_dropout=False,phase1.feature_cache=True"
    "|dropout:phase1.backbone_dropout=True,phase1.feature_cache=False"
)


def small(c: ml_collections.ConfigDict) -> None:
    paper_qqp.small(c)
    c.base += ",head=bimpm,strategy=stack_and_finetune"


def separate(c: ml_collections.ConfigDict) -> None:
    """`small` and the two cells that tell its two explanations apart. With dropout on in phase 1 the
    stacked BiMPM ended 2.4 points higher; either (a) the dropout mismatch: a head trained on dropout-free
    features loses in phase 2 when the backbone's dropout switches on, or (b) a weaker head: dropout makes
    phase 1's head weaker, and a weaker head leaves phase 2 more to do (docs/phase1_length.md: a 30-step
    phase 1, 0.62 on the frozen backbone, ended higher than 120 steps, 0.70).
      cached_no_dropout  cached phase 1 as `cached`, and no backbone dropout in phase 2 either
                         (model.dropout_rate=0: the cache is the same, fingerprinted without dropout): the
                         mismatch gone, the head as strong. Recovers under (a), not (b).
      cached_30_steps    cached phase 1 of 30 steps, dropout on in phase 2: a weaker head, the mismatch
                         kept. Recovers under (b), not (a).
    The other 15 runs are phase1_dropout_small's (the same configs), copied:
      taskset -c 0 python -m stackft_jax.experiment --config=configs/experiments/phase1_dropout.py:separate \
        --workdir=docs/grids/phase1_dropout_separate --reuse_runs_from=docs/grids/phase1_dropout_small \
        --shard=0/2 &   (and --shard=1/2 on the other core)
    Cost: the 10 new runs are stack-and-finetune BiMPM runs as `cached` (464 s per run in the QQP grid's
    timings.json, at load 4-5): about 1.3 core-hours planned; measured in docs/grids/phase1_dropout_separate
    (one process, a second grid on the other core): 1.70 core-hours. Read in docs/qqp_grid_reading.md:
    each change alone ended about 6 points above `cached`, in every seed."""
    small(c)
    c.axes = (
        _RECIPES
        + "|cached_no_dropout:phase1.backbone_dropout=False,phase1.feature_cache=True,model.dropout_rate=0.0"
        + "|cached_30_steps:phase1.backbone_dropout=False,phase1.feature_cache=True,phase1.num_steps=30"
    )
    # Each new cell against the recipe it changes (`cached`: does it recover?) and against `dropout`
    # (does it recover all of it? TOST at the grid's margin), then every recipe against finetune-only.
    c.comparisons = "; ".join(
        ["recipe=dropout vs recipe=cached"]
        + [f"recipe={new} vs recipe={old}" for new in _SEPARATING for old in ("cached", "dropout")]
        + ["baseline"]
    )


_SEPARATING = ("cached_no_dropout", "cached_30_steps")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = "configs/quora.py:head=bimpm,strategy=stack_and_finetune"  # bert-base-uncased, GLUE QQP
    c.axes = _RECIPES  # "label:key=value,...": each recipe sets its keys on the base
    c.num_seeds = 5  # seeds 0 .. num_seeds-1 per cell
    c.baseline = "recipe=finetune_only"  # the cell every other value of this axis is compared with
    c.metric = "accuracy"  # the dev metric of the comparisons (the paper's measure)
    # Report-only: the recipe change itself (dropout against the cached phase 1), then each recipe
    # against finetune-only.
    c.comparisons = "recipe=dropout vs recipe=cached; baseline"
    c.equivalence_margin = paper_qqp.EQUIVALENCE_MARGIN  # TOST's margin behind any "level" in the docs
    config_cli.apply_items(c, arg, {"small": small, "separate": separate})
    return c

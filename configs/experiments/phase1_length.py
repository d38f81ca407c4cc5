"""When to stop phase 1: stack-and-finetune with BiMPM on QQP, phase-1 length as the axis, phase 2 fixed.

Wang et al. stop phase 1 "before the head overfits" without saying when. This grid measures it: the
same phase 2 after phase 1s of different lengths, against fine-tuning from a freshly initialised head
(`num_steps=none`: finetune_only, the same fine-tuning budget). The train/dev gap rule is off here, so
the length is the only variable; the gap each length reached is in its runs' metrics.jsonl.

Full scale (bert-base-uncased, GLUE QQP from the Hugging Face hub, phase 2 as in configs/quora.py):
  python -m stackft_jax.experiment --config=configs/experiments/phase1_length.py --workdir=runs/phase1_length
CPU-sized (embedded MiniLM, the shared QQP subset, 16 pairs a step, 60 fine-tuning steps, 3 seeds;
docs/phase1_length.md reads its report, withdrawn: at 60 steps its finetune-only baseline never learned):
  python -m stackft_jax.experiment --config=configs/experiments/phase1_length.py:small \
    --workdir=runs/phase1_length_small
The same at 300 fine-tuning steps, where the baseline learns (its cell copied from the QQP grid's runs;
12 stack-and-finetune runs of about 460 s, 1.5 core-hours):
  python -m stackft_jax.experiment --config=configs/experiments/phase1_length.py:small_300 \
    --workdir=docs/grids/phase1_length_300 --reuse_runs_from=docs/grids/paper_qqp_small
"""

import ml_collections

from configs.experiments import paper_qqp
from stackft_jax.config import config_cli


def small(c: ml_collections.ConfigDict) -> None:
    # paper_qqp's first CPU-sized runs (60 fine-tuning steps, the budget this grid ran with; `small`
    # has since grown to 300); the axis below replaces their phase-1 length.
    paper_qqp.short(c)
    c.base += ",head=bimpm,strategy=stack_and_finetune,phase1.max_train_dev_gap=1.0"
    c.axes = "phase1.num_steps=none:strategy=finetune_only|30|60|120|240"
    c.num_seeds = 3


def small_300(c: ml_collections.ConfigDict) -> None:
    """`small` at paper_qqp.py:small's budget (300 fine-tuning steps), where finetune-only BiMPM learns in
    every seed: its baseline cell is that grid's finetune-only BiMPM (the same resolved config), so
    `--reuse_runs_from=docs/grids/paper_qqp_small` copies those runs instead of training them."""
    paper_qqp.small(c)
    c.base += ",head=bimpm,strategy=stack_and_finetune,phase1.max_train_dev_gap=1.0"
    c.axes = "phase1.num_steps=none:strategy=finetune_only|30|60|120|240"
    c.num_seeds = 3


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # The experiment config every run starts from; max_train_dev_gap=1.0 turns the gap rule off.
    c.base = "configs/quora.py:head=bimpm,strategy=stack_and_finetune,phase1.max_train_dev_gap=1.0"
    c.axes = "phase1.num_steps=none:strategy=finetune_only|500|2000|8000|32000"  # none: no phase 1
    c.num_seeds = 5  # seeds 0 .. num_seeds-1 per cell
    c.baseline = "phase1.num_steps=none"  # the cell every other value of this axis is compared with
    c.metric = "accuracy"  # the dev metric of the comparisons
    config_cli.apply_items(c, arg, {"small": small, "small_300": small_300})
    return c

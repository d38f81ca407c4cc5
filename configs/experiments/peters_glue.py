"""Peters, Ruder & Smith 2019 on GLUE: feature extraction (frozen BERT, a learned scalar mix of all its
layers, a task network on top) against fine-tuning (BERT + a small head, everything trained), 5 seeds.

One grid per task (`sst2`, the default; `mrpc`; `stsb`), each compared on the task's own measure
(accuracy, F1, Pearson). The feature-extraction network is the nearest this project has to the paper's:
a BiLSTM classifier (`highway_lstm`) for single sentences, ESIM for pairs; fine-tuning uses `cls_mlp`.

Full scale (bert-base-uncased, GLUE from the Hugging Face hub, the budgets of configs/glue.py):
  python -m stackft_jax.experiment --config=configs/experiments/peters_glue.py:mrpc --workdir=runs/peters_mrpc
CPU-sized (embedded MiniLM, the local TSVs under ../shared/data/glue/, 300 frozen-backbone or 200
fine-tuning steps of 16):
  python -m stackft_jax.experiment --config=configs/experiments/peters_glue.py:small,sst2 \
    --workdir=runs/peters_sst2_small
"""

import ml_collections

from stackft_jax.config import config_cli
from stackft_jax.runtime.cli_errors import ConfigError

# Per task: its measure and the task network of the feature-extraction side.
TASKS = {
    "sst2": {"metric": "accuracy", "frozen_head": "highway_lstm", "small_max_seq_length": 64},
    "mrpc": {"metric": "f1", "frozen_head": "esim", "small_max_seq_length": 96},
    "stsb": {"metric": "pearson", "frozen_head": "esim", "small_max_seq_length": 96},
}
# No feature cache here: with the scalar mix it would hold every layer of every training example (SST-2:
# 67k x 64 tokens x 7 layers x 384 floats, 46 GB), of which these budgets read a few thousand.
SMALL = (
    "model.name_or_path=embedded:minilm,per_device_batch_size=16,phase1.num_steps=300,"
    "phase2.num_steps=200,phase2.backbone_learning_rate=5e-5,eval_every_steps=100,checkpoint_every_steps=1000"
)


def _task_preset(task: str):
    def preset(c: ml_collections.ConfigDict) -> None:
        c.task = task

    return preset


def small(c: ml_collections.ConfigDict) -> None:
    c.scale = "small"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.task = "sst2"  # sst2 | mrpc | stsb (presets of the same names); sets `base`, `axes` and `metric`
    c.scale = "full"  # full | small (the `small` preset): bert-base on the hub, or MiniLM on local files
    c.num_seeds = 5  # seeds 0 .. num_seeds-1 per cell
    c.baseline = "method=fine_tuning"  # the cell every other value of this axis is compared with
    presets = {"small": small, **{task: _task_preset(task) for task in TASKS}}
    config_cli.apply_items(c, arg, presets)
    if c.task not in TASKS or c.scale not in ("full", "small"):
        raise ConfigError(
            f"config keys 'task' = {c.task!r} / 'scale' = {c.scale!r}: choose a task of {sorted(TASKS)}, "
            "and full or small"
        )
    task = TASKS[c.task]
    local = f",local,{SMALL},max_seq_length={task['small_max_seq_length']}" if c.scale == "small" else ""
    c.base = f"configs/glue.py:task={c.task}{local}"  # the experiment config every run starts from
    c.axes = (  # one axis; each value sets several keys (`label:key=value,...`)
        f"method=feature_extraction:strategy=stack_only,model.scalar_mix=True,head.name={task['frozen_head']}"
        "|fine_tuning:strategy=finetune_only,head.name=cls_mlp"
    )
    c.metric = task["metric"]  # the dev metric of the comparisons
    return c

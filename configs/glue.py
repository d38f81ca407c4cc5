"""GLUE tasks of Peters et al.: SST-2 (single sentence), MRPC (paraphrase), STS-B (regression).

  python -m stackft_jax.main --config=configs/glue.py:task=mrpc --workdir=runs/mrpc
  python -m stackft_jax.main --config=configs/glue.py:task=stsb,head=esim --workdir=runs/stsb
Offline, on the local GLUE TSVs:
  python -m stackft_jax.main --config=configs/glue.py:task=sst2 --workdir=runs/sst2 \
    --config.data.train_file=../shared/data/glue/SST-2/train.tsv \
    --config.data.dev_file=../shared/data/glue/SST-2/dev.tsv
`task=` and `head=` are shorthands for `data.task=` and `head.name=`.
"""

import ml_collections

from configs import common
from stackft_jax import config_cli

# Per task: metric conventions live in stackft_jax/data/tasks.py; these are training budgets.
TASK_DEFAULTS = {
    "sst2": {"max_seq_length": 64, "phase1.num_epochs": 1.0, "phase2.num_epochs": 3.0},
    "mrpc": {"max_seq_length": 128, "phase1.num_epochs": 3.0, "phase2.num_epochs": 3.0},
    "stsb": {"max_seq_length": 128, "phase1.num_epochs": 3.0, "phase2.num_epochs": 3.0},
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = common.get_config()
    c.model.name_or_path = "bert-base-uncased"
    items = common.expand_shorthands(arg)
    task = dict(i.split("=", 1) for i in items if "=" in i).get("data.task", "sst2")
    if task not in TASK_DEFAULTS:
        raise config_cli.ConfigError(
            f"config key 'data.task' takes one of {sorted(TASK_DEFAULTS)} in configs/glue.py, not {task!r}"
        )
    c.data.task = task
    for key, value in TASK_DEFAULTS[task].items():
        common.apply_arg(c, f"{key}={value}", {})
    c.eval_every_steps = 200
    c.checkpoint_every_steps = 200
    common.apply_arg(c, ",".join(items), {})
    return c

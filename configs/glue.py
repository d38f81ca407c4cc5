"""GLUE tasks of Peters et al.: SST-2 (single sentence), MRPC (paraphrase), STS-B (regression).

  python -m stackft_jax.main --config=configs/glue.py:task=mrpc --workdir=runs/mrpc
  python -m stackft_jax.main --config=configs/glue.py:task=stsb,head=esim --workdir=runs/stsb
Offline, on the local GLUE TSVs (`local`: ../shared/data/glue/<SST-2|MRPC|STS-B>/{train,dev}.tsv, relative
to the working directory; or name the files with data.train_file= and data.dev_file=):
  python -m stackft_jax.main --config=configs/glue.py:task=sst2,local --workdir=runs/sst2
`task=` and `head=` are shorthands for `data.task=` and `head.name=`.
"""

import ml_collections

from stackft_jax.config import config_cli, defaults
from stackft_jax.runtime.cli_errors import ConfigError

# Per task: metric conventions live in stackft_jax/data/tasks.py; these are training budgets.
TASK_DEFAULTS = {
    "sst2": {"max_seq_length": 64, "phase1.num_epochs": 1.0, "phase2.num_epochs": 3.0},
    "mrpc": {"max_seq_length": 128, "phase1.num_epochs": 3.0, "phase2.num_epochs": 3.0},
    "stsb": {"max_seq_length": 128, "phase1.num_epochs": 3.0, "phase2.num_epochs": 3.0},
}
LOCAL_FOLDERS = {"sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B"}  # under ../shared/data/glue/


def local(c: ml_collections.ConfigDict) -> None:
    """The GLUE TSVs of the chosen task under ../shared/data/glue/ (test sets there are unlabelled)."""
    folder = f"../shared/data/glue/{LOCAL_FOLDERS[c.data.task]}"
    c.data.train_file = f"{folder}/train.tsv"
    c.data.dev_file = f"{folder}/dev.tsv"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = defaults.get_config()
    c.model.name_or_path = "bert-base-uncased"
    items = config_cli.items_of(arg)
    task = dict(i.split("=", 1) for i in items if "=" in i).get("data.task", "sst2")
    if task not in TASK_DEFAULTS:
        raise ConfigError(
            f"config key 'data.task' takes one of {sorted(TASK_DEFAULTS)} in configs/glue.py, not {task!r}"
        )
    c.data.task = task
    for key, value in TASK_DEFAULTS[task].items():
        config_cli.apply_arg(c, f"{key}={value}", {})
    c.eval_every_steps = 200
    c.checkpoint_every_steps = 200
    config_cli.apply_arg(c, ",".join(items), {"local": local})
    return c

"""The task registry: every task by name (config key `data.task`).

A task is a `TaskSpec` (task_spec.py): it reads its files or its Hugging Face dataset, encodes examples
as per-row arrays, names its objective (objectives.py) and scores its predictions. A family module
defines its tasks; this file lists them.

Adding a task:
1. In its family module (or a new `data/<family>.py`), make a `TaskSpec` instance: a `SentenceTask`
   (sentence_task.py) when each text or text pair has one label, as glue.py does; otherwise a
   `TaskSpec` subclass of your own (read_file, read_hub, encode, is_labelled, score,
   prediction_records). Examples need a stable `key` (task_spec.example_key).
2. Add one line below. If no head fits its objective's outputs, add a head (models/heads/__init__.py).
"""

from stackft_jax.data import conll, glue, yahoo
from stackft_jax.data.task_spec import TaskSpec
from stackft_jax.runtime.cli_errors import ConfigError

TASKS: dict[str, TaskSpec] = {
    "qqp": glue.QQP,
    "mrpc": glue.MRPC,
    "stsb": glue.STSB,
    "sst2": glue.SST2,
    "conll2003": conll.CONLL2003,
    "yahoo_answers": yahoo.YAHOO_ANSWERS,
}


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r} in config key `data.task`; choose one of {sorted(TASKS)}")
    return TASKS[name]

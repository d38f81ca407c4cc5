"""A run's full parameters read back from its workdir, at the end of any finished phase.

A phase's boundary checkpoint holds only the parameters that phase trains (checkpointing.py), so the
model at a boundary is rebuilt the way the run built it: the initial model of the workdir's recorded
config (pretrained backbone, seeded head), then each phase's trained part in order, each checked
against the fingerprint of the frozen parameters it started from.

    from stackft_jax import run_params
    params = run_params.phase_params("runs/demo")             # after the last phase
    params = run_params.phase_params("runs/demo", "phase1")   # the stacked head on the frozen backbone
"""

import json
from pathlib import Path
from typing import Any

import ml_collections
from flax import nnx

from stackft_jax import checkpointing, phases, workdirs
from stackft_jax.data import tasks
from stackft_jax.models import bert


def recorded_config(workdir: str | Path) -> ml_collections.ConfigDict:
    """The config the workdir's run recorded (WORKDIR/config.json)."""
    path = Path(workdir) / workdirs.CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no recorded config (not a run's workdir)")
    config = ml_collections.ConfigDict(json.loads(path.read_text())["config"])
    config.phases = [ml_collections.ConfigDict(block) for block in config.phases]  # JSON left them dicts
    return config


def phase_params(workdir: str | Path, phase: str | None = None) -> dict[str, Any]:
    """The full parameters (a nested dict of arrays on one device) at the end of `phase` (a phase name
    of the run's strategy; None: its last phase), which must have finished."""
    from stackft_jax import train  # build_model: the run's own model construction

    config = recorded_config(workdir)
    task = tasks.get_task(config.data.task).configure(config.data)
    model, bert_config = train.build_model(config, task, bert.resolve_model_dir(config.model.name_or_path))
    params = nnx.to_pure_dict(nnx.state(model))
    plan = phases.expand(config, bert_config.num_hidden_layers, has_pooler=bert_config.family.has_pooler)
    names = [block.name for block, _ in plan]
    target = names[-1] if phase is None else phase
    if target not in names:
        raise ValueError(f"{workdir}: the run's phases are {names}, not {target!r}")
    for name in names[: names.index(target) + 1]:
        if not checkpointing.phase_end_path(workdir, name).is_dir():
            raise FileNotFoundError(f"{checkpointing.phase_end_path(workdir, name)}: {name} has not finished")
        part, _, frozen = checkpointing.read_phase_end(workdir, name)
        if checkpointing.frozen_fingerprint(params, checkpointing.marks_of(params, part)) != frozen:
            raise checkpointing.FrozenParametersChanged(
                f"{checkpointing.phase_end_path(workdir, name)}: its phase started from other frozen "
                f"parameters than the model {config.model.name_or_path!r} builds now (the model folder "
                "changed since the run)"
            )
        params = checkpointing.with_trained_part(params, part)
    return params

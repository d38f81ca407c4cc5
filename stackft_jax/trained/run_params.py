"""A run's full parameters read back from its workdir, at the end of any finished phase.

A phase's boundary checkpoint holds only the parameters that phase trains (checkpointing.py), so the
model at a boundary is rebuilt the way the run built it: the initial model of the workdir's recorded
config (pretrained backbone, seeded head), then each phase's trained part in order, each checked
against the fingerprint of the frozen parameters it started from.

    from stackft_jax.trained import run_params
    params = run_params.phase_params("runs/demo")             # after the last phase
    params = run_params.phase_params("runs/demo", "phase1")   # the stacked head on the frozen backbone
    step, params = run_params.best_params("runs/demo")         # checkpoints/best

Nothing here writes to the workdir (predict.py and export.py read runs that may still be training).
"""

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from stackft_jax.config import spec
from stackft_jax.config.spec import RunSpec
from stackft_jax.models import bert
from stackft_jax.runtime import records
from stackft_jax.training import build, checkpointing, workdirs


def recorded_spec(workdir: str | Path) -> RunSpec:
    """The config the workdir's run recorded (WORKDIR/config.json), resolved as a record: its data
    files need not exist now."""
    path = Path(workdir) / workdirs.CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no recorded config (not a run's workdir)")
    recorded = records.read_json(path, records.RESTORE_CONFIG, keys=("config",))["config"]
    return spec.resolve(spec.config_from_plain(recorded), recorded=True)


def phase_names(run_spec: RunSpec) -> list[str]:
    """The run's phases in order."""
    return [phase.name for phase in run_spec.phases]


def best_params(workdir: str | Path, like: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """(global step, all parameters) of the run's best-on-dev checkpoint (checkpoints/best), read
    without opening a checkpoint manager (which would tidy the folder). `like`: parameters of the
    run's model, whose tree (int layer keys) the result takes; None: build the run's initial model."""
    folder = Path(workdir).absolute() / "checkpoints" / "best"
    steps = sorted(int(p.name) for p in folder.glob("*") if p.name.isdigit() and (p / "params").is_dir())
    if not steps:
        raise FileNotFoundError(f"{folder}: no best checkpoint")
    if like is None:
        like = _initial_params(recorded_spec(workdir))
    one_device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one_device), like)
    path = folder / str(steps[-1])
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            params = checkpointer.restore(path / "params", target)
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
            meta = checkpointer.restore(path, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        checkpointing.verify(params, meta)
    except Exception as error:  # orbax/tensorstore raise many types for a damaged file
        raise checkpointing.unreadable(path, error) from None
    return steps[-1], params


def _initial_params(run_spec: RunSpec) -> dict[str, Any]:
    model_dir = bert.resolve_model_dir(run_spec.model.name_or_path)
    model, _ = build.build_model(run_spec, run_spec.task, model_dir, run_spec.adaptation)
    return nnx.to_pure_dict(nnx.state(model))


def phase_params(
    workdir: str | Path, phase: str | None = None, *, initial: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The full parameters (a nested dict of arrays on one device) at the end of `phase` (a phase name
    of the run's strategy; None: its last phase), which must have finished. `initial`: the run's
    initial parameters when the caller built its model already."""
    run_spec = recorded_spec(workdir)
    params = _initial_params(run_spec) if initial is None else initial
    names = phase_names(run_spec)
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
                f"parameters than the model {run_spec.model.name_or_path!r} builds now (the model folder "
                "changed since the run)"
            )
        params = checkpointing.with_trained_part(params, part)
    return params

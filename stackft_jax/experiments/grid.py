"""Running a grid (cells.py): each cell-seed's config resolved once (spec.resolve), every check made
before the first run trains, the workdir bound to the grid config, shards, and resume (a run finished
under its config is not run again). The grid config's keys and the command: experiment.py.

Nothing here imports jax at module level: `python -m stackft_jax.experiment` refuses a bad grid config
before jax starts.
"""

import dataclasses
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax
import ml_collections

from stackft_jax.config import config_cli, spec
from stackft_jax.config.spec import RunSpec
from stackft_jax.experiments import budget_curves, budgets
from stackft_jax.experiments.cells import (
    Ensemble,
    Run,
    baseline_of,
    check_grid,
    comparisons_of,
    ensembles_of,
    paper_results,
    runs_of,
    with_value,
)
from stackft_jax.models import objectives
from stackft_jax.runtime import compilation_cache, records
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.training import prediction_files, train, workdirs

log = logging.getLogger(__name__)


def run_config(grid: ml_collections.ConfigDict, run: Run) -> ml_collections.ConfigDict:
    """The base config with the run's axis values and seed (a bad key fails here, before any training);
    a matched-budget run's with the step count its compared cell's budget gives (budgets.py)."""
    overrides = run.overrides()
    if run.matched is not None:
        overrides += _matched_settings(grid, run)
    return config_cli.load(grid.base, overrides)


def _matched_settings(grid: ml_collections.ConfigDict, run: Run) -> list[str]:
    assert run.matched is not None
    key = run.matched.key
    cells = {(r.cell, r.seed): r for r in runs_of(grid) if r.matched is None}

    def load(value: str, extra: list[str]) -> ml_collections.ConfigDict:
        other = cells[with_value(run.cell, key, value), run.seed]  # the same other axis values and seed
        return config_cli.load(grid.base, [*other.overrides(), *extra])

    try:
        return budgets.settings(run.matched, load)
    except (ValueError, FileNotFoundError) as error:
        raise ConfigError(f"grid run {run.name}: {error}") from None


def run_spec(grid: ml_collections.ConfigDict, run: Run, *, recorded: bool = False) -> "RunSpec":
    """The run's config resolved (spec.resolve), a mistake named with the grid run. `recorded`: without
    the checks on data and model files (the report reads finished runs, whose files may be gone)."""
    return _resolved(run, run_config(grid, run), recorded=recorded)


def _resolved(run: Run, config: ml_collections.ConfigDict, *, recorded: bool = False) -> "RunSpec":

    try:
        return spec.resolve(config, recorded=recorded)
    except (ValueError, FileNotFoundError) as error:
        raise ConfigError(f"grid run {run.name}: {error}") from None


def _run_specs(
    grid: ml_collections.ConfigDict, runs: list[Run], workdir: Path, *, recorded: bool = False
) -> dict[Run, "RunSpec"]:
    """Each run's config, sharing the grid's feature cache, resolved once (`recorded`: see run_spec)."""
    configs = {run: run_config(grid, run) for run in runs}  # every cell's keys checked up front
    for config in configs.values():
        share_feature_cache(config, workdir)
    # Values and files too: cell 11's mistake fails before cell 1 trains.
    return {run: _resolved(run, config, recorded=recorded) for run, config in configs.items()}


def share_feature_cache(config: ml_collections.ConfigDict, workdir: str | Path) -> None:
    """Points a run without its own `feature_cache_dir` at the grid's: cells and seeds with the same
    backbone and data then build the frozen features once between them (the train features of a
    feature-cached phase; the dev and gap-subset features that every frozen-backbone phase evaluates on,
    loop.feature_caches). A phase that trains the backbone reads no cache."""
    if not config.feature_cache_dir:
        config.feature_cache_dir = str(Path(workdir) / "feature_cache")


def check_ensembles(
    grid: ml_collections.ConfigDict, ensembles: list[Ensemble], specs: Mapping[Run, "RunSpec"]
) -> None:
    """Ensembles average class probabilities and score the task's metrics (ensemble.py): every member
    must run a classification task, one of whose metrics is the grid's `metric`."""

    for member in dict.fromkeys(m for e in ensembles for m in e.members):
        task = specs[member].task
        where = f"config key 'ensembles' = {grid.ensembles!r}: grid run {member.name}"
        if task.objective is not objectives.CLASSIFICATION:
            raise ConfigError(
                f"{where} is a {task.objective.name} run (data.task={task.name}); ensembles average class "
                "probabilities, which only classification runs have"
            )
        if grid.metric not in task.metrics:
            raise ConfigError(
                f"{where}: an ensemble scores {task.name}'s metrics {list(task.metrics)}, not the grid's "
                f"metric {grid.metric!r}"
            )


def check_metric(grid: ml_collections.ConfigDict, specs: Mapping[Run, "RunSpec"]) -> None:
    """The grid's `metric` must be one every cell's task scores (results.json's `final.dev`)."""
    for run, resolved in specs.items():
        scored = [*resolved.task.metrics, "loss"]  # every run also reports its dev loss
        if grid.metric not in scored:
            raise ConfigError(
                f"config key 'metric' = {grid.metric!r}: grid run {run.name} "
                f"(data.task={resolved.task.name}) scores {scored}; choose one of those"
            )


@dataclasses.dataclass(frozen=True)
class GridPlan:
    """A grid whose every cell, metric, baseline and ensemble is checked, bound to its workdir."""

    grid: ml_collections.ConfigDict
    workdir: Path
    runs: list[Run]
    specs: dict[Run, "RunSpec"]  # each run's config, sharing the grid's feature cache, resolved
    allow_config_change: bool = False


def plan_grid(
    grid: ml_collections.ConfigDict, workdir: str | Path, *, allow_config_change: bool = False
) -> GridPlan:
    """Checks everything that can be checked before a run trains (a typo in cell 11 fails before cell 1
    trains), then binds the workdir to the grid config (workdirs.GRID): a grid workdir rerun with
    another grid config is refused, naming the differing keys, unless `allow_config_change`."""
    workdir = Path(workdir)
    if "axes" not in grid or "base" not in grid:
        raise ConfigError(
            "a run config, not a grid config (no `axes`/`base`): run it with python -m stackft_jax.main"
        )
    check_grid(grid)
    budget_curves.budgets_of(grid)  # a budget axis: positive step counts, increasing
    budget_curves.tuned_groups(grid)  # recipes chosen with the budget: groups of the baseline's axis
    runs = runs_of(grid)
    baseline_of(grid)
    ensembles = ensembles_of(grid)
    comparisons_of(grid)  # report-only keys, checked now so a typo fails before hours of training
    paper_results(grid)
    specs = _run_specs(grid, runs, workdir)
    check_metric(grid, specs)
    check_ensembles(grid, ensembles, specs)

    workdirs.refuse_foreign(workdir, workdirs.GRID)  # a run's or another tool's folder: before any write
    # The heads' FLOPs convention always recorded: a record without it reads as before the key.
    record = {"grid": {budgets.LIGHT_HEADS_KEY: "", **config_cli.to_plain(grid)}}
    changed = workdirs.bind_config(
        workdir,
        record,
        allow_change=allow_config_change,
        binding=workdirs.GRID,
        compare=binding_form,
    )
    if changed and (workdir / "ensembles").exists():  # built from the old grid's runs; the report rebuilds
        shutil.rmtree(workdir / "ensembles")
    return GridPlan(grid, workdir, runs, specs, allow_config_change)


def binding_form(record: Mapping) -> dict:
    """What binds a grid workdir (its grid_config.json): the grid's keys, with `base` as the run config it
    resolves to (spec.binding_form) rather than as written, so that a base spelled otherwise (a preset
    that moved into another file, a key written twice) binds alike when it gives every run the same
    config. A base that no longer resolves (a preset or file gone) is compared as written. A CoNLL base
    that does not name `data.entity_f1` binds as `strict`, what grids recorded before the key ran
    (config_cli.with_legacy_keys); a preset names it. Its matched cells planned by the light heads'
    FLOPs (`matched_light_heads`) bind as a sorted list; a grid recorded before that key, as naming every
    flops cell of its `matched`, as they all were (budgets.light_heads_binding)."""

    grid = dict(record["grid"])
    light = budgets.light_heads_binding(grid)
    grid.pop(budgets.LIGHT_HEADS_KEY, None)
    if light:
        grid[budgets.LIGHT_HEADS_KEY] = light
    if not grid.get("matched"):  # a grid recorded before the key binds as one without matched cells
        grid.pop("matched", None)
    try:
        config = config_cli.load(grid["base"], [])
        if "data.entity_f1" not in grid["base"] and "entity_f1" in spec.task_data_keys(config):
            config.data.entity_f1 = "strict"
        base = spec.resolve(config, recorded=True)
    except (ConfigError, ValueError, KeyError, FileNotFoundError, AttributeError):
        return {"grid": grid}
    grid["base"] = spec.binding_form(base)["config"]
    return {"grid": grid}


def finished(run_dir: Path, resolved: "RunSpec") -> bool:
    """The run has results, of this spec: its workdir's recorded config binds it as `resolved` would
    (spec.binding_form, as train.run compares them). A grid continued with --allow_config_change reruns
    a run whose cell's config changed: it resumes under the new values, as its workdir records."""

    if not (run_dir / "results.json").exists():
        return False
    recorded = run_dir / workdirs.CONFIG_FILE
    if not recorded.exists():
        return True
    config = records.read_json(recorded, records.RESTORE_CONFIG, keys=("config",))["config"]
    try:
        old = spec.recorded_binding_form(config, resolved.raw)
    except ValueError:  # it no longer resolves: train.run refuses the workdir, saying why
        return False
    # A JSON round trip on both sides, as workdirs.bind_config compares (tuples read back as lists).
    return not workdirs.config_differences(
        *(json.loads(json.dumps(f)) for f in (old, spec.binding_form(resolved)))
    )


# What a finished run's folder holds besides its record (results, predictions, metrics, config, timings):
# never copied from another grid, as a grid never commits them.
_NOT_RECORD = ("checkpoints", "tensorboard", "locks", "feature_cache", "replaced-*", "*.tmp")
REUSED_FROM = "reused_from.json"
# GRID/examples/: the keys and labels of the grid's compact prediction files, once per split and content.
EXAMPLES = "examples"


def _finished_runs(sources: list[Path]) -> list[Path]:
    """The finished runs of other grids' workdirs that recorded their config (without it a run cannot be
    shown to be the same run)."""
    found = []
    for source in sources:
        if not (source / "runs").is_dir():
            raise ConfigError(f"--reuse_runs_from={source}: not a grid workdir (no runs/ in it)")
        found += sorted(
            d
            for d in (source / "runs").iterdir()
            if (d / "results.json").is_file() and (d / "config.json").is_file()
        )
    return found


def reuse_run(plan: GridPlan, run: Run, sources: list[Path]) -> Path | None:
    """Copies `run` from a finished run in another grid's workdir (`sources`) that ran with the same
    resolved config (`finished`: what a rerun's binding compares), so grids that share cells train them
    once; returns that source once the copy is in place (made now, or by another process of this grid),
    or None (no such run, or a live process holds this run). The copy is the run's record without its
    checkpoints, naming its source in REUSED_FROM; a started run of this grid's own is set aside beside
    it (`<run>.replaced-<time>`)."""

    candidates = [d for d in _finished_runs(sources) if finished(d, plan.specs[run])]
    match = None
    for candidate in candidates:
        changes = workdirs.input_changes(candidate, plan.specs[run])
        if not changes:
            match = candidate
            break
        log.warning("grid run %s: not reusing %s, scored on other input (%s); training it here", run.name,
                    candidate, changes[0])  # fmt: skip
    if match is None:
        return None
    target = plan.workdir / "runs" / run.name
    if target.exists():
        try:
            with workdirs.exclusive(target):  # a live process's run stays its own
                if finished(target, plan.specs[run]):  # another process copied it meanwhile
                    return match
                target.rename(target.with_name(f"{target.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"))
        except workdirs.WorkdirInUse:
            return None
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(partial, ignore_errors=True)  # an earlier copy cut short
    shutil.copytree(match, partial, ignore=shutil.ignore_patterns(*_NOT_RECORD))
    prediction_files.compact(partial, plan.workdir / EXAMPLES, source=match)  # its examples, here
    provenance = {"source": str(match), "copied_at": time.time()}
    (partial / REUSED_FROM).write_text(json.dumps(provenance) + "\n")
    try:
        partial.rename(target)  # whole or not at all: a half copy never reads as finished
    except OSError:  # another process of this grid put it there first
        shutil.rmtree(partial)
    log.info("grid run %s: reused %s (the same resolved config)", run.name, match)
    return match


def run_grid(
    grid: ml_collections.ConfigDict,
    workdir: str | Path,
    *,
    shard: tuple[int, int] = (0, 1),
    allow_config_change: bool = False,
    reuse_runs_from: Sequence[str | Path] = (),
) -> bool:
    """Runs this shard's unfinished cell-seeds, each copied instead when its turn comes if a grid in
    `reuse_runs_from` finished it with the same config (reuse_run); True when every run of the grid (all
    shards) is finished.
    A run that another live process is training (its workdir lock) is left to it: several single-host
    processes over one workdir each take the next free run, so they share a grid without --shard."""

    sources = [Path(s) for s in reuse_runs_from]
    _finished_runs(sources)  # a mistyped source fails before any run, and before the workdir is bound
    if sources and jax.process_count() > 1:  # hosts must agree on every run they skip
        raise ConfigError(
            "--reuse_runs_from is single-host: the hosts of a multi-host grid would each copy and skip runs "
            "on their own"
        )
    plan = plan_grid(grid, workdir, allow_config_change=allow_config_change)

    index, count = shard
    runs, specs = plan.runs, plan.specs
    if not allow_config_change:  # with it, such a run retrains: train.run sets its old progress aside
        check_inputs(plan.workdir, runs, specs)
    # The cells share their shapes: a cell's later seeds (and a resumed grid) compile nothing.
    compilation_cache.enable(specs[runs[0]].compilation_cache_dir)
    for position, run in enumerate(runs):
        run_dir = plan.workdir / "runs" / run.name
        if shard_of(position, count) != index:
            continue
        # A finished run stays unless the data or tokenizer files it read changed since (check_inputs
        # refused that above, so here it is --allow_config_change: it trains again, its old progress
        # set aside). Reuse is looked up when the run's turn comes: the other grid may have finished it.
        done = finished(run_dir, specs[run]) and not workdirs.input_changes(run_dir, specs[run])
        if not done and not (sources and reuse_run(plan, run, sources)):
            log.info("grid run %d/%d: %s", position + 1, len(runs), run.name)
            try:
                train.run(specs[run], run_dir, allow_config_change=allow_config_change)
            except workdirs.WorkdirInUse as error:
                if jax.process_count() > 1:  # every host takes the same runs: a multi-host grid uses --shard
                    raise
                log.info("grid run %s is another process's (%s); taking the next", run.name, error)
                continue
        if jax.process_index() == 0:  # a grid's runs are committed one by one: their predictions compact
            prediction_files.compact(run_dir, plan.workdir / EXAMPLES)
    return all(finished(plan.workdir / "runs" / run.name, specs[run]) for run in runs)


def check_inputs(workdir: Path, runs: Sequence[Run], specs: Mapping[Run, "RunSpec"]) -> None:
    """Refuses a grid whose finished runs read other data or tokenizer files than the grid names now
    (ConfigMismatch naming the run and the file): their scores would be reported beside runs of the new
    content, against the new majority baseline."""
    for run in runs:
        run_dir = Path(workdir) / "runs" / run.name
        if not (run_dir / "results.json").is_file():
            continue
        changes = workdirs.input_changes(run_dir, specs[run])
        if changes:
            raise workdirs.ConfigMismatch(
                f"grid run {run.name}: {changes[0]}; its results come from the old content. Restore it, "
                "use a new grid workdir, or pass --allow_config_change to retrain such runs"
            )


FINISHED, STARTED, NOT_STARTED = "finished", "started", "not started"


def run_states(grid: ml_collections.ConfigDict, workdir: str | Path) -> list[tuple[int, Run, str]]:
    """Each cell-seed's position in the grid's order (what `--shard=i/N` splits), and its state in
    `workdir`: finished (results of this config), started (a folder without them: on the machine that
    ran it, it resumes from its checkpoints) or not started. Reads only; trains and writes nothing."""
    check_grid(grid)
    workdir = Path(workdir)
    runs = runs_of(grid)
    specs = _run_specs(grid, runs, workdir, recorded=True)
    states = []
    for position, run in enumerate(runs):
        run_dir = workdir / "runs" / run.name
        if finished(run_dir, specs[run]):
            state = FINISHED
        else:
            state = STARTED if run_dir.exists() else NOT_STARTED
        states.append((position, run, state))
    return states


def status_lines(states: list[tuple[int, Run, str]], shards: int) -> list[str]:
    """`states` (run_states) for a person: the counts, then every unfinished run with the shard of
    `shards` that runs it."""
    counts = {state: sum(1 for *_, s in states if s == state) for state in (FINISHED, STARTED, NOT_STARTED)}
    lines = [f"{counts[FINISHED]}/{len(states)} runs finished, {counts[STARTED]} started, "
             f"{counts[NOT_STARTED]} not started"]  # fmt: skip
    for position, run, state in states:
        if state != FINISHED:
            lines.append(f"  {state:<11}  shard {shard_of(position, shards)}/{shards}  {run.name}")
    return lines


def shard_of(position: int, shards: int) -> int:
    """The shard (of `shards`) that runs the cell-seed at `position` in the grid's order: every N-th, so
    each shard gets a share of every cell's seeds and a grid cut short stays comparable."""
    return position % shards


def parse_shard(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", text)
    if match is None or not 0 <= int(match[1]) < int(match[2]):
        raise ConfigError(f"--shard={text}: expected i/N with 0 <= i < N, e.g. --shard=0/2")
    return int(match[1]), int(match[2])

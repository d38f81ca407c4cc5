"""A grid of runs (axes x seeds) over one base config: its cells, their configs, running them.

The grid config's keys and the command are described in experiment.py.
"""

import dataclasses
import itertools
import json
import logging
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import ml_collections

from stackft_jax import config_cli

log = logging.getLogger(__name__)
_AXIS = re.compile(r"^\s*(?P<key>[\w.]+)\s*=\s*(?P<values>[^;]+?)\s*$")
# A value that sets several keys: `label:key=value,key=value` (the label names it in cells and reports).
_BUNDLE = re.compile(r"^(?P<label>[\w.+-]+):(?P<items>[\w.]+=.*)$")


@dataclasses.dataclass(frozen=True)
class Run:
    """One cell (axis values) at one seed."""

    cell: tuple[tuple[str, str], ...]  # (key, value) per axis, in axis order; a bundle's label as value
    seed: int
    settings: tuple[str, ...] = ()  # the cell's `key=value` overrides; (): one per (key, value)

    @property
    def cell_name(self) -> str:
        return "-".join(f"{key.split('.')[-1]}={value}" for key, value in self.cell) or "base"

    @property
    def name(self) -> str:
        return f"{self.cell_name}-seed{self.seed}"

    def overrides(self) -> list[str]:
        settings = self.settings or tuple(f"{key}={value}" for key, value in self.cell)
        return [*settings, f"seed={self.seed}"]


def _value_settings(key: str, value: str, where: str) -> tuple[str, list[str]]:
    """(label, overrides) of one axis value: `v` sets `key=v`; `label:k1=v1,k2=v2` sets both keys."""
    bundle = _BUNDLE.match(value)
    if bundle is None:
        if ":" in value and "=" in value:
            raise config_cli.ConfigError(f"{where}: {value!r} is not `label:key=value,key=value,...`")
        return value, [f"{key}={value}"]
    items = [item.strip() for item in bundle["items"].split(",")]
    if any("=" not in item or not item.split("=", 1)[0] for item in items):
        raise config_cli.ConfigError(f"{where}: {value!r} is not `label:key=value,key=value,...`")
    return bundle["label"], items


def parse_axes(axes: str) -> list[tuple[str, list[str]]]:
    """`"strategy=a|b; head.name=c|d"` -> [("strategy", ["a", "b"]), ("head.name", ["c", "d"])]; a
    bundled value (`method=frozen:strategy=stack_only,model.scalar_mix=True|...`) appears as its label."""
    return [(key, [label for label, _ in values]) for key, values in _parse_axes(axes)]


def _parse_axes(axes: str) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    parsed = []
    for part in filter(str.strip, axes.split(";")):
        match = _AXIS.match(part)
        where = f"config key 'axes': {part.strip()!r}"
        if match is None:
            raise config_cli.ConfigError(f"{where} is not `key=value1|value2|...`")
        values = [_value_settings(match["key"], v.strip(), where) for v in match["values"].split("|")]
        labels = [label for label, _ in values]
        if any(not label for label in labels) or len(set(labels)) != len(labels):
            raise config_cli.ConfigError(f"{where} has an empty or repeated value")
        parsed.append((match["key"], values))
    keys = [key for key, _ in parsed]
    if len(set(keys)) != len(keys):
        raise config_cli.ConfigError(f"config key 'axes' names a key twice: {keys}")
    return parsed


def runs_of(grid: ml_collections.ConfigDict) -> list[Run]:
    """Every cell-seed of the grid, seed by seed (the order shards split)."""
    axes = _parse_axes(grid.axes)
    keys = [key for key, _ in axes]
    runs = []
    for seed in range(grid.num_seeds):
        for values in itertools.product(*(v for _, v in axes)):
            cell = tuple((key, label) for key, (label, _) in zip(keys, values, strict=True))
            runs.append(Run(cell, seed, tuple(item for _, items in values for item in items)))
    return runs


def baseline_of(grid: ml_collections.ConfigDict) -> tuple[str, str]:
    """The baseline's (axis key, value); it must be one of the grid's axis values."""
    key, _, value = grid.baseline.partition("=")
    axes = dict(parse_axes(grid.axes))
    if key not in axes or value not in axes[key]:
        raise config_cli.ConfigError(
            f"config key 'baseline' = {grid.baseline!r}: expected `key=value` with key an axis and value "
            f"one of its values ({'; '.join(f'{k}={chr(124).join(v)}' for k, v in axes.items())})"
        )
    return key, value


@dataclasses.dataclass(frozen=True)
class Ensemble:
    """Runs of one seed that differ only in one axis' value, their class probabilities averaged."""

    run: Run  # where it stands in the report: that axis' value is the members' values joined by `+`
    members: tuple[Run, ...]


def _ensemble_specs(grid: ml_collections.ConfigDict) -> list[tuple[str, list[str]]]:
    """`"head.name=a+b; strategy=c+d"` -> [("head.name", ["a", "b"]), ("strategy", ["c", "d"])]."""
    axes = dict(parse_axes(grid.axes))
    specs: list[tuple[str, list[str]]] = []
    for part in filter(str.strip, grid.get("ensembles", "").split(";")):
        match = _AXIS.match(part)
        where = f"config key 'ensembles': {part.strip()!r}"
        if match is None:
            raise config_cli.ConfigError(f"{where} is not `key=value1+value2+...`")
        key, values = match["key"], [v.strip() for v in match["values"].split("+")]
        if key not in axes:
            raise config_cli.ConfigError(f"{where}: {key} is not an axis (axes: {', '.join(axes)})")
        unknown = [v for v in values if v not in axes[key]]
        if unknown:
            raise config_cli.ConfigError(
                f"{where}: {unknown[0]!r} is not a value of axis {key} ({'|'.join(axes[key])})"
            )
        if len(set(values)) != len(values) or len(values) < 2:
            raise config_cli.ConfigError(f"{where}: an ensemble needs two or more different values")
        if "+".join(values) in axes[key] or (key, values) in specs:  # its cell would be another's
            raise config_cli.ConfigError(f"{where} names a cell that the grid already has")
        specs.append((key, values))
    return specs


def _with_value(cell: tuple[tuple[str, str], ...], key: str, value: str) -> tuple[tuple[str, str], ...]:
    return tuple((k, value if k == key else v) for k, v in cell)


def ensembles_of(grid: ml_collections.ConfigDict) -> list[Ensemble]:
    """The grid's `ensembles` ("key=v1+v2; ..."): each one per combination of the other axes' values and
    per seed, equal weights (Wang et al.'s ensemble of two heads)."""
    specs = _ensemble_specs(grid)
    runs = runs_of(grid)
    by_cell_seed = {(run.cell, run.seed): run for run in runs}
    ensembles = []
    for key, values in specs:
        for run in (r for r in runs if dict(r.cell)[key] == values[0]):
            members = tuple(by_cell_seed[_with_value(run.cell, key, value), run.seed] for value in values)
            ensembles.append(Ensemble(Run(_with_value(run.cell, key, "+".join(values)), run.seed), members))
    return ensembles


def check_ensembles(
    grid: ml_collections.ConfigDict,
    ensembles: list[Ensemble],
    configs: Mapping[Run, ml_collections.ConfigDict],
) -> None:
    """Ensembles average class probabilities and score the task's metrics (ensemble.py): every member
    must run a classification task, one of whose metrics is the grid's `metric`."""
    from stackft_jax import objectives
    from stackft_jax.data import tasks

    for member in dict.fromkeys(m for e in ensembles for m in e.members):
        task = tasks.get_task(configs[member].data.task)
        where = f"config key 'ensembles' = {grid.ensembles!r}: grid run {member.name}"
        if task.objective is not objectives.CLASSIFICATION:
            raise config_cli.ConfigError(
                f"{where} is a {task.objective.name} run (data.task={task.name}); ensembles average class "
                "probabilities, which only classification runs have"
            )
        if grid.metric not in task.metrics:
            raise config_cli.ConfigError(
                f"{where}: an ensemble scores {task.name}'s metrics {list(task.metrics)}, not the grid's "
                f"metric {grid.metric!r}"
            )


def run_config(grid: ml_collections.ConfigDict, run: Run) -> ml_collections.ConfigDict:
    """The base config with the run's axis values and seed (a bad key fails here, before any training)."""
    return config_cli.load(grid.base, run.overrides())


def share_feature_cache(config: ml_collections.ConfigDict, workdir: str | Path) -> None:
    """Points each phase without its own `feature_cache_dir` (`phase1.*`, or a written phase's) at the
    grid's: cells and seeds with the same backbone and data then build the frozen features once between
    them (the train features of a feature-cached phase; the dev and gap-subset features that every
    frozen-backbone phase evaluates on, loop.feature_caches). A phase that trains the backbone reads
    no cache."""
    for block in [config.phase1, *config.phases]:
        if not block.feature_cache_dir:
            block.feature_cache_dir = str(Path(workdir) / "feature_cache")


# Keys the grid sets itself in every run: an axis over one would be overridden without a word.
GRID_SET_KEYS = ("seed",)


def check_grid(grid: ml_collections.ConfigDict) -> None:
    """The grid's own keys (not its cells'): seed count, axes over keys the grid sets."""
    if grid.num_seeds < 1:
        raise config_cli.ConfigError(f"config key 'num_seeds' = {grid.num_seeds}: run at least 1 seed")
    for key, values in _parse_axes(grid.axes):
        set_keys = {key} | {item.split("=", 1)[0].strip() for _, items in values for item in items}
        overridden = sorted(set_keys & set(GRID_SET_KEYS))
        if overridden:
            raise config_cli.ConfigError(
                f"config key 'axes': axis {key} sets {overridden[0]}, which the grid sets itself "
                f"(seeds 0..num_seeds-1 per cell); raise num_seeds instead"
            )


def check_metric(grid: ml_collections.ConfigDict, configs: Mapping[Run, ml_collections.ConfigDict]) -> None:
    """The grid's `metric` must be one every cell's task scores (results.json's `final.dev`)."""
    from stackft_jax.data import tasks

    for run, config in configs.items():
        task = tasks.get_task(config.data.task).configure(config.data)
        scored = [*task.metrics, "loss"]  # every run also reports its dev loss
        if grid.metric not in scored:
            raise config_cli.ConfigError(
                f"config key 'metric' = {grid.metric!r}: grid run {run.name} (data.task={task.name}) "
                f"scores {scored}; choose one of those"
            )


@dataclasses.dataclass(frozen=True)
class GridPlan:
    """A grid whose every cell, metric, baseline and ensemble is checked, bound to its workdir."""

    grid: ml_collections.ConfigDict
    workdir: Path
    runs: list[Run]
    configs: dict[Run, ml_collections.ConfigDict]
    allow_config_change: bool = False


def plan_grid(
    grid: ml_collections.ConfigDict, workdir: str | Path, *, allow_config_change: bool = False
) -> GridPlan:
    """Checks everything that can be checked before a run trains (a typo in cell 11 fails before cell 1
    trains), then binds the workdir to the grid config (workdirs.GRID): a grid workdir rerun with
    another grid config is refused, naming the differing keys, unless `allow_config_change`."""
    workdir = Path(workdir)
    if "axes" not in grid or "base" not in grid:
        raise config_cli.ConfigError(
            "a run config, not a grid config (no `axes`/`base`): run it with python -m stackft_jax.main"
        )
    check_grid(grid)
    runs = runs_of(grid)
    baseline_of(grid)
    ensembles = ensembles_of(grid)
    configs = {run: run_config(grid, run) for run in runs}  # every cell's keys checked up front
    for config in configs.values():
        share_feature_cache(config, workdir)
    from stackft_jax import spec, workdirs  # jax starts only once the grid is known to be valid

    for run, config in configs.items():  # values and files too: cell 11's typo fails before cell 1 trains
        try:
            spec.resolve(config)
        except (ValueError, FileNotFoundError) as error:
            raise config_cli.ConfigError(f"grid run {run.name}: {error}") from None
    check_metric(grid, configs)
    check_ensembles(grid, ensembles, configs)
    changed = workdirs.bind_config(
        workdir,
        {"grid": config_cli.to_plain(grid)},
        allow_change=allow_config_change,
        binding=workdirs.GRID,
    )
    if changed and (workdir / "ensembles").exists():  # built from the old grid's runs; the report rebuilds
        shutil.rmtree(workdir / "ensembles")
    return GridPlan(grid, workdir, runs, configs, allow_config_change)


def _finished(run_dir: Path, config: ml_collections.ConfigDict) -> bool:
    """The run has results, of this config (a grid continued with --allow_config_change reruns a run
    whose cell's config changed: it resumes under the new values, as its workdir records)."""
    from stackft_jax import workdirs

    if not (run_dir / "results.json").exists():
        return False
    recorded = run_dir / workdirs.CONFIG_FILE
    if not recorded.exists():
        return True
    old = {"config": json.loads(recorded.read_text())["config"]}
    return not workdirs.config_differences(
        old, json.loads(json.dumps({"config": config_cli.to_plain(config)}))
    )


def run_grid(
    grid: ml_collections.ConfigDict,
    workdir: str | Path,
    *,
    shard: tuple[int, int] = (0, 1),
    allow_config_change: bool = False,
) -> bool:
    """Runs this shard's unfinished cell-seeds; True when every run of the grid (all shards) is finished."""
    plan = plan_grid(grid, workdir, allow_config_change=allow_config_change)
    from stackft_jax import compilation_cache, train

    index, count = shard
    runs, configs = plan.runs, plan.configs
    # The cells share their shapes: a cell's later seeds (and a resumed grid) compile nothing.
    compilation_cache.enable(configs[runs[0]].compilation_cache_dir)
    for position, run in enumerate(runs):
        run_dir = plan.workdir / "runs" / run.name
        if position % count != index or _finished(run_dir, configs[run]):
            continue
        log.info("grid run %d/%d: %s", position + 1, len(runs), run.name)
        train.run(configs[run], run_dir, allow_config_change=allow_config_change)
    return all(_finished(plan.workdir / "runs" / run.name, configs[run]) for run in runs)


def parse_shard(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", text)
    if match is None or not 0 <= int(match[1]) < int(match[2]):
        raise config_cli.ConfigError(f"--shard={text}: expected i/N with 0 <= i < N, e.g. --shard=0/2")
    return int(match[1]), int(match[2])

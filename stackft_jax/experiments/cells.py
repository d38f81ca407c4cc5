"""A grid config's cells: its axes, the runs (cell x seed) they make, the baseline, the ensembles and
the paper's gains, read from the grid's own keys (`axes`, `exclude_cells`, `num_seeds`, `baseline`,
`ensembles`, `paper_results`; the command and the keys: experiment.py). Pure parsing: nothing here
reads a run's config or starts jax (grid.py runs the cells, report.py reads them back).
"""

import dataclasses
import difflib
import itertools
import math
import re

import ml_collections

from stackft_jax.experiments import statistics
from stackft_jax.experiments.budgets import Matched, parse_matched
from stackft_jax.runtime.cli_errors import ConfigError

_AXIS = re.compile(r"^\s*(?P<key>[\w.]+)\s*=\s*(?P<values>[^;]+?)\s*$")
# A value that sets several keys: `label:key=value,key=value` (the label names it in cells and reports).
_BUNDLE = re.compile(r"^(?P<label>[\w.+-]+):(?P<items>[\w.]+=.*)$")


@dataclasses.dataclass(frozen=True)
class Run:
    """One cell (axis values) at one seed."""

    cell: tuple[tuple[str, str], ...]  # (key, value) per axis, in axis order; a bundle's label as value
    seed: int
    settings: tuple[str, ...] = ()  # the cell's `key=value` overrides; (): one per (key, value)
    matched: Matched | None = None  # a matched-budget cell (budgets.py): its step count comes at load

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
            raise ConfigError(f"{where}: {value!r} is not `label:key=value,key=value,...`")
        return value, [f"{key}={value}"]
    items = [item.strip() for item in bundle["items"].split(",")]
    if any("=" not in item or not item.split("=", 1)[0] for item in items):
        raise ConfigError(f"{where}: {value!r} is not `label:key=value,key=value,...`")
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
            raise ConfigError(f"{where} is not `key=value1|value2|...`")
        values = [_value_settings(match["key"], v.strip(), where) for v in match["values"].split("|")]
        labels = [label for label, _ in values]
        if any(not label for label in labels) or len(set(labels)) != len(labels):
            raise ConfigError(f"{where} has an empty or repeated value")
        parsed.append((match["key"], values))
    keys = [key for key, _ in parsed]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"config key 'axes' names a key twice: {keys}")
    return parsed


EXCLUDE_KEY = "exclude_cells"


def excluded_cells(grid: ml_collections.ConfigDict) -> list[dict[str, str]]:
    """The grid's `exclude_cells`, "axis=value,axis=value; ...": partial cells that the product of `axes`
    leaves out (a cell goes when it has every value of one of them; a bundle is named by its label).
    Checked before any run: every key an axis, every value one of its values, some cell left."""
    axes = dict(parse_axes(grid.axes))
    specs = []
    for part in filter(str.strip, grid.get(EXCLUDE_KEY, "").split(";")):
        where = f"config key '{EXCLUDE_KEY}': {part.strip()!r}"
        spec: dict[str, str] = {}
        for item in part.split(","):
            key, sep, value = (text.strip() for text in item.partition("="))
            if not (sep and key and value) or key in spec:
                raise ConfigError(f"{where} is not `axis=value,axis=value,...` (each axis once)")
            if key not in axes:
                raise ConfigError(f"{where}: {key!r} is not an axis ({', '.join(axes)})")
            if value not in axes[key]:
                raise ConfigError(f"{where}: {value!r} is not a value of {key} ({'|'.join(axes[key])})")
            spec[key] = value
        specs.append(spec)
    return specs


def _is_excluded(cell: tuple[tuple[str, str], ...], specs: list[dict[str, str]]) -> bool:
    values = dict(cell)
    return any(all(values[key] == value for key, value in spec.items()) for spec in specs)


def runs_of(grid: ml_collections.ConfigDict) -> list[Run]:
    """Every cell-seed of the grid, seed by seed (the order shards split), the cells `exclude_cells`
    names left out of the axes' product; a seed's matched-budget cells (`matched`, budgets.py) after
    its axes' cells, so adding them moves no other run."""
    axes = _parse_axes(grid.axes)
    keys = [key for key, _ in axes]
    matched = parse_matched(grid, dict(parse_axes(grid.axes)))
    excluded = excluded_cells(grid)
    cells = []  # (cell, its settings) per combination of axis values that `exclude_cells` keeps
    for values in itertools.product(*(v for _, v in axes)):
        cell = tuple((key, label) for key, (label, _) in zip(keys, values, strict=True))
        if not _is_excluded(cell, excluded):
            cells.append((cell, tuple(item for _, items in values for item in items)))
    if not cells:
        raise ConfigError(f"config key '{EXCLUDE_KEY}' = {grid.get(EXCLUDE_KEY)!r} leaves out every cell")
    runs = []
    for seed in range(grid.num_seeds):
        runs.extend(Run(cell, seed, settings) for cell, settings in cells)
        for m in matched:  # one per combination of the other axes' values, with m.value's settings
            for cell, settings in cells:
                if dict(cell)[m.key] == m.value:
                    matched_cell = tuple((key, m.label if key == m.key else label) for key, label in cell)
                    runs.append(Run(matched_cell, seed, settings, matched=m))
    return runs


def baseline_of(grid: ml_collections.ConfigDict) -> tuple[str, str]:
    """The baseline's (axis key, value); it must be one of the grid's axis values."""
    key, _, value = grid.baseline.partition("=")
    axes = dict(parse_axes(grid.axes))
    if key not in axes or value not in axes[key]:
        raise ConfigError(
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
            raise ConfigError(f"{where} is not `key=value1+value2+...`")
        key, values = match["key"], [v.strip() for v in match["values"].split("+")]
        if key not in axes:
            raise ConfigError(f"{where}: {key} is not an axis (axes: {', '.join(axes)})")
        unknown = [v for v in values if v not in axes[key]]
        if unknown:
            raise ConfigError(f"{where}: {unknown[0]!r} is not a value of axis {key} ({'|'.join(axes[key])})")
        if len(set(values)) != len(values) or len(values) < 2:
            raise ConfigError(f"{where}: an ensemble needs two or more different values")
        if "+".join(values) in axes[key] or (key, values) in specs:  # its cell would be another's
            raise ConfigError(f"{where} names a cell that the grid already has")
        specs.append((key, values))
    return specs


def with_value(cell: tuple[tuple[str, str], ...], key: str, value: str) -> tuple[tuple[str, str], ...]:
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
            found = [by_cell_seed.get((with_value(run.cell, key, value), run.seed)) for value in values]
            if None in found:  # a member's cell is one `exclude_cells` leaves out: no ensemble there
                continue
            members = tuple(member for member in found if member is not None)
            ensembles.append(Ensemble(Run(with_value(run.cell, key, "+".join(values)), run.seed), members))
    return ensembles


# The metrics where lower is better (results.json's `final.dev.loss`); every task metric is higher-better.
LOWER_IS_BETTER = ("loss",)


def gain_sign(metric: str) -> float:
    """+1, or -1 where lower `metric` is better: a comparison's difference is `gain_sign * (cell - vs)`,
    so a positive difference is a gain whichever way the metric points."""
    return -1.0 if metric in LOWER_IS_BETTER else 1.0


@dataclasses.dataclass(frozen=True)
class ReportSettings:
    """The grid's report-only statistics keys, defaults filled in."""

    bootstrap_samples: int
    equivalence_margin: float


def report_settings(grid: ml_collections.ConfigDict) -> ReportSettings:
    """`bootstrap_samples` and `equivalence_margin` as the report uses them; an error names a bad one."""
    margin = grid.get("equivalence_margin", statistics.EQUIVALENCE_MARGIN)
    if not (isinstance(margin, int | float) and 0 < margin < math.inf):
        raise ConfigError(
            f"config key 'equivalence_margin' = {margin!r}: TOST's margin, a positive number in the "
            "metric's units (0.01: 1 point of a 0-1 metric)"
        )
    samples = grid.get("bootstrap_samples", statistics.BOOTSTRAP_SAMPLES)
    if not (isinstance(samples, int) and samples >= 100):
        raise ConfigError(
            f"config key 'bootstrap_samples' = {samples!r}: the two-level bootstrap's resamples, an "
            "integer of at least 100"
        )
    return ReportSettings(bootstrap_samples=samples, equivalence_margin=margin)


# Keys the grid sets itself in every run: an axis over one would be overridden without a word.
GRID_SET_KEYS = ("seed",)


# The keys experiment.py reads from a grid config. A grid file may hold keys of its own that its
# get_config derives these from (peters_glue.py's `task`, `scale`), so only a near miss is refused.
GRID_KEYS = (
    "base",
    "axes",
    "num_seeds",
    "baseline",
    "metric",
    "ensembles",
    "matched",
    "matched_light_heads",
    "comparisons",
    "paper_results",
    "equivalence_margin",
    "bootstrap_samples",
    "tuned_recipes",
    EXCLUDE_KEY,
)


def check_grid(grid: ml_collections.ConfigDict) -> None:
    """The grid's own keys (not its cells'): a misspelt key, seed count, axes over keys the grid sets."""
    for key in grid:
        close = difflib.get_close_matches(key, GRID_KEYS, n=1, cutoff=0.8)
        if key not in GRID_KEYS and close:
            raise ConfigError(f"config key '{key}' does not exist; did you mean '{close[0]}'?")
    if grid.num_seeds < 1:
        raise ConfigError(f"config key 'num_seeds' = {grid.num_seeds}: run at least 1 seed")
    report_settings(grid)  # report-only numbers: a bad one fails before the runs train, not at the report
    if parse_matched(grid, dict(parse_axes(grid.axes))) and excluded_cells(grid):
        # A matched cell takes its budget from the cells beside it, which a left-out cell may be.
        raise ConfigError(f"config keys 'matched' and '{EXCLUDE_KEY}' cannot be combined; set one of them")
    runs_of(grid)  # `exclude_cells` checked: its names, and a cell left
    for key, values in _parse_axes(grid.axes):
        set_keys = {key} | {item.split("=", 1)[0].strip() for _, items in values for item in items}
        overridden = sorted(set_keys & set(GRID_SET_KEYS))
        if overridden:
            raise ConfigError(
                f"config key 'axes': axis {key} sets {overridden[0]}, which the grid sets itself "
                f"(seeds 0..num_seeds-1 per cell); raise num_seeds instead"
            )


def _cells_by_name(grid: ml_collections.ConfigDict) -> dict[str, tuple[tuple[str, str], ...]]:
    """Every cell of the grid, its ensembles' included, by the name the report gives it."""
    cells = [r.cell for r in runs_of(grid)] + [e.run.cell for e in ensembles_of(grid)]
    return {Run(cell, 0).cell_name: cell for cell in dict.fromkeys(cells)}


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One row of the report's comparisons: `cell` against `other`, paired by seed."""

    cell: tuple[tuple[str, str], ...]
    other: tuple[tuple[str, str], ...]
    configured: bool  # named in the grid's `comparisons`; False: a same-other-axes baseline row

    @property
    def label(self) -> str:
        return f"{Run(self.cell, 0).cell_name} vs {Run(self.other, 0).cell_name}"


BASELINE_ROWS = "baseline"  # in `comparisons`: every cell against its baseline cell (the default)


def comparisons_of(grid: ml_collections.ConfigDict) -> list[Comparison]:
    """The grid's `comparisons`, "<cell name> vs <cell name>; baseline; ..." (cell names as the report
    prints them, ensembles' included): any two cells, in the order given; `baseline` stands for every
    cell against the cell with the baseline's value and the same other axis values (the rows of a grid
    without the key). Report-only: changing it retrains nothing (workdirs.GRID)."""
    key, base_value = baseline_of(grid)
    cells = _cells_by_name(grid)
    rows: dict[tuple, Comparison] = {}
    parts = [part.strip() for part in grid.get("comparisons", BASELINE_ROWS).split(";") if part.strip()]
    if not parts:  # a report without comparisons would say nothing of what the grid was run for
        raise ConfigError(
            f"config key 'comparisons' = {grid.comparisons!r} names no comparison: write "
            f"`<cell name> vs <cell name>; ...` and/or `{BASELINE_ROWS}` (the default)"
        )
    for part in parts:
        if part == BASELINE_ROWS:
            for cell in cells.values():
                other = with_value(cell, key, base_value)
                # A cell whose baseline cell `exclude_cells` leaves out has no baseline row.
                if dict(cell)[key] != base_value and other in cells.values():
                    rows.setdefault((cell, other), Comparison(cell, other, configured=False))
            continue
        names = [name.strip() for name in part.split(" vs ")]
        where = f"config key 'comparisons': {part!r}"
        if len(names) != 2:
            raise ConfigError(f"{where} is not `<cell name> vs <cell name>` or `{BASELINE_ROWS}`")
        unknown = [name for name in names if name not in cells]
        if unknown:
            raise ConfigError(f"{where}: no cell is named {unknown[0]!r} (cells: {', '.join(cells)})")
        if names[0] == names[1]:
            raise ConfigError(f"{where} compares a cell with itself")
        cell, other = cells[names[0]], cells[names[1]]
        rows[cell, other] = Comparison(cell, other, configured=True)
    return list(rows.values())


# "<comparison>: <gain> (note)": cell names hold no colon; a note may, but no semicolon (it separates).
_PAPER_RESULT = re.compile(
    r"^\s*(?P<name>[^:]+?)\s*:\s*(?P<gain>[+-]?\d+(?:\.\d*)?)\s*(?:\((?P<note>[^)]*)\))?\s*$"
)


def paper_results(grid: ml_collections.ConfigDict) -> dict[str, dict[str, float | str]]:
    """The grid's optional `paper_results`, "<comparison>: <gain in points> [(note)]; ...", keyed by the
    comparison's label ("<cell name> vs <cell name>"; a lone cell name means against its baseline
    cell): the gain the paper reports for it, with a note on where it stands (its source belongs in the
    grid config's comment). Report-only, like `comparisons`."""
    key, base_value = baseline_of(grid)
    cells = _cells_by_name(grid)
    gains: dict[str, dict[str, float | str]] = {}
    for part in filter(str.strip, grid.get("paper_results", "").split(";")):
        where = f"config key 'paper_results': {part.strip()!r}"
        match = _PAPER_RESULT.match(part)
        if match is None:
            raise ConfigError(f"{where} is not `<comparison>: <gain in points> [(note)]`")
        names = [n.strip() for n in match["name"].split(" vs ")]
        unknown = [n for n in names if n not in cells]
        if unknown or len(names) > 2:
            raise ConfigError(f"{where}: no cell is named {(unknown or names)[0]!r}")
        if len(names) == 1:
            names.append(Run(with_value(cells[names[0]], key, base_value), 0).cell_name)
        gains[" vs ".join(names)] = {"gain": float(match["gain"]), "note": match["note"] or ""}
    return gains

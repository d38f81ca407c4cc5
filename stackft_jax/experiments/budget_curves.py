"""Learning curves as a grid axis: the run key `budget_steps` (the last phase's step budget:
stack-and-finetune's phase 2, finetune-only's one phase) given as an axis of step counts,

    c.axes = "strategy=finetune_only|stack_and_finetune; budget_steps=300|600|1200"

makes every strategy a curve over those budgets. The report's comparisons pair cells at each budget
(the baseline row of each other-axes combination, budget included); this module adds, per curve (a cell
without its budget), the score at each budget on the selection split, dev and test, the curve's best
budget chosen on the selection split (`data.selection_fraction`; dev where the runs hold no slice, which
the report says), and each curve against the baseline's curve at both their best budgets, paired by seed
on test and dev (statistics.t_interval). Test is scored once per run and never chooses anything.

Reads the report's own run rows (`report["runs"]`: cell, seed, final scores), so it needs no run files.
"""

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from stackft_jax.experiments import statistics as array_statistics
from stackft_jax.experiments.cells import baseline_of, parse_axes
from stackft_jax.runtime.cli_errors import ConfigError

AXIS = "budget_steps"
SELECTION = "selection"  # data/task_spec.py SELECTION: the split budgets are chosen on


def budgets_of(grid: ml_collections.ConfigDict) -> list[int] | None:
    """The grid's budget axis values (None: no budget axis), checked: positive step counts in increasing
    order (one line, before any run)."""
    values = dict(parse_axes(grid.axes)).get(AXIS)
    if values is None:
        return None
    where = f"config key 'axes': {AXIS}={'|'.join(values)}"
    try:
        steps = [int(v) for v in values]
    except ValueError:
        raise ConfigError(f"{where}: budgets are step counts (integers)") from None
    if any(s <= 0 for s in steps):
        raise ConfigError(f"{where}: every budget must be a positive step count")
    if steps != sorted(steps):
        raise ConfigError(f"{where}: budgets must be in increasing order")
    if grid.get("matched"):
        raise ConfigError(f"{where}: a budget axis sets the step counts that `matched` cells would set")
    return steps


def _curve_key(cell: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in cell.items() if k != AXIS)


def _name(curve: tuple[tuple[str, str], ...]) -> str:
    return "-".join(f"{k.split('.')[-1]}={v}" for k, v in curve) or "base"


def curves(runs: Sequence[Mapping[str, Any]], grid: ml_collections.ConfigDict) -> dict[str, Any] | None:
    """The budget-curve part of report.json from its run rows; None for a grid without a budget axis."""
    steps = budgets_of(grid)
    if steps is None:
        return None
    metric = grid.metric
    by_curve: dict[tuple, dict[int, dict[int, Mapping[str, Any]]]] = {}
    for row in runs:
        budget = int(row["cell"][AXIS])
        by_curve.setdefault(_curve_key(row["cell"]), {}).setdefault(budget, {})[row["seed"]] = row["final"]
    held_out = all(SELECTION in final for c in by_curve.values() for b in c.values() for final in b.values())
    chooser = SELECTION if held_out else "dev"

    def score(final: Mapping[str, Any], split: str) -> float | None:
        value = final.get(split, {}).get(metric)
        return None if value is None else float(value)

    rows = []
    for curve, per_budget in by_curve.items():
        points = []
        for budget in sorted(per_budget):
            seeds = per_budget[budget]
            means = {}
            for split in (chooser, "dev", "test"):
                values = [v for v in (score(f, split) for f in seeds.values()) if v is not None]
                means[split] = statistics.mean(values) if values else None
            points.append(
                {"budget_steps": budget, "seeds": len(seeds), **{f"{k}_mean": v for k, v in means.items()}}
            )
        chosen = [p for p in points if p[f"{chooser}_mean"] is not None]
        best = max(chosen, key=lambda p: p[f"{chooser}_mean"])["budget_steps"] if chosen else None
        rows.append({"curve": dict(curve), "name": _name(curve), "points": points, "best_budget": best})
    return {
        "budgets": steps,
        "chosen_on": chooser,
        "curves": rows,
        "best_budget_comparisons": _best_budget_comparisons(by_curve, rows, grid, score),
    }


def _best_budget_comparisons(by_curve, rows, grid, score) -> list[dict[str, Any]]:
    """Each curve at its best budget against the baseline's curve (same other axes) at its own."""
    key, value = baseline_of(grid)
    if key == AXIS:
        return []
    best = {tuple(r["curve"].items()): r["best_budget"] for r in rows}
    comparisons = []
    for curve, budget in best.items():
        if dict(curve)[key] == value or budget is None:
            continue
        other = tuple((k, value if k == key else v) for k, v in curve)
        if best.get(other) is None:
            continue
        ours, theirs = by_curve[curve][budget], by_curve[other][best[other]]
        row = {"name": _name(curve), "other": _name(other), "budget": budget, "other_budget": best[other]}
        for split in ("test", "dev"):
            pairs = [
                (score(ours[s], split), score(theirs[s], split)) for s in sorted(set(ours) & set(theirs))
            ]
            differences = [a - b for a, b in pairs if a is not None and b is not None]
            if differences:
                row[split] = {"n": len(differences), **array_statistics.t_interval(differences)}
        comparisons.append(row)
    return comparisons


def _fmt(value: float | None, scale: float = 1.0, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{scale * value:+.2f}" if sign else f"{value:.4f}"


def lines(report: Mapping[str, Any], metric: str) -> list[str]:
    """report.md's learning-curve section."""
    part = report["budget_curves"]
    chooser = part["chosen_on"]
    out = [
        f"Learning curves (grid axis `{AXIS}`: the last phase's steps, experiments/budget_curves.py): "
        f"mean {metric} over seeds per budget on {chooser}, dev and test; each curve's best budget is "
        f"the one with the highest mean {chooser} {metric}"
        + (
            " (the runs hold out a selection slice of train, data.selection_fraction: dev and test choose "
            "nothing)."
            if chooser == SELECTION
            else " (the runs hold out no selection slice: dev chooses the budget and is reported, so dev "
            "at the best budget is optimistic; test is not)."
        ),
        "",
        f"| curve | budget steps | seeds | {chooser} | dev | test | best |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in part["curves"]:
        for p in row["points"]:
            best = "yes" if p["budget_steps"] == row["best_budget"] else ""
            out.append(
                f"| {row['name']} | {p['budget_steps']} | {p['seeds']} | {_fmt(p[f'{chooser}_mean'])} | "
                f"{_fmt(p['dev_mean'])} | {_fmt(p['test_mean'])} | {best} |"
            )
    if part["best_budget_comparisons"]:
        out += [
            "",
            f"Each curve at its best budget against the baseline's curve at its own (points of {metric}, "
            "paired by seed, seed-level t-interval 95%):",
            "",
            "| curve (budget) | vs (budget) | test: mean [95% CI] | dev: mean [95% CI] |",
            "| --- | --- | --- | --- |",
        ]
        for row in part["best_budget_comparisons"]:
            cells = []
            for split in ("test", "dev"):
                t = row.get(split)
                cells.append(
                    "-"
                    if t is None
                    else f"{_fmt(t['mean'], 100, True)} [{_fmt(t['ci_low'], 100, True)}, "
                    f"{_fmt(t['ci_high'], 100, True)}] (n={t['n']})"
                )
            out.append(
                f"| {row['name']} ({row['budget']}) | {row['other']} ({row['other_budget']}) | "
                f"{cells[0]} | {cells[1]} |"
            )
    return out

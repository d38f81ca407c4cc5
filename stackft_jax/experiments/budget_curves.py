"""Learning curves as a grid axis: the run key `budget_steps` (the last phase's step budget:
stack-and-finetune's phase 2, finetune-only's one phase) given as an axis of step counts,

    c.axes = "strategy=finetune_only|stack_and_finetune; budget_steps=300|600|1200"

makes every strategy a curve over those budgets. The report's comparisons pair cells at each budget
(the baseline row of each other-axes combination, budget included); this module adds, per curve (a cell
without its budget), the score at each budget on the selection split, dev and test, the curve's best
budget chosen on the selection split (`data.selection_fraction`; dev where the runs hold no slice, which
the report says), and each curve against the baseline's curve at both their best budgets, paired by seed
on test and dev (statistics.t_interval). Test is scored once per run and never chooses anything.

A strategy tried with several recipes (grid key `tuned_recipes`, "recipe=a|b; recipe=c|d": groups of one
axis' values, each group one strategy's recipes) is compared as a tuned strategy: per group and other
axes, the recipe and budget with the highest mean selection score, against the baseline's group chosen
the same way, paired by seed. Each strategy then gets the same small tuning budget (its recipes x the
budgets), spent on the selection slice.

Reads the report's own run rows (`report["runs"]`: cell, seed, final scores), so it needs no run files.
"""

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from stackft_jax.experiments import statistics as array_statistics
from stackft_jax.experiments.cells import baseline_of, parse_axes, report_settings
from stackft_jax.experiments.statistics import format_p
from stackft_jax.runtime.cli_errors import ConfigError

AXIS = "budget_steps"
SELECTION = "selection"  # data/task_spec.py SELECTION: the split budgets are chosen on
TUNED_KEY = "tuned_recipes"
PAIRED = (
    "mean [seed-level 95% t-interval], two-sided t-test p with Holm over the table's rows per split, "
    "TOST p at the grid's `equivalence_margin`"
)


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


def tuned_groups(grid: ml_collections.ConfigDict) -> tuple[str, list[list[str]]] | None:
    """The grid's `tuned_recipes` as (axis, groups of its values); None where unset. Checked before any
    run: one axis, the baseline's, whose every named value exists and is in one group at most, the
    baseline's value among them, on a grid with a budget axis."""
    text = grid.get(TUNED_KEY, "")
    if not text:
        return None
    where = f"config key '{TUNED_KEY}' = {text!r}"
    groups = [part.strip() for part in text.split(";") if part.strip()]
    keys = {group.partition("=")[0].strip() for group in groups}
    if len(keys) != 1 or any("=" not in group for group in groups):
        raise ConfigError(f"{where}: write `axis=value|value; axis=value|...`, one axis for every group")
    (key,) = keys
    axes = dict(parse_axes(grid.axes))
    baseline_key, baseline_value = baseline_of(grid)
    if AXIS not in axes:
        raise ConfigError(f"{where}: recipes are chosen with the budget, on a grid with a `{AXIS}` axis")
    if key not in axes or key == AXIS or key != baseline_key:
        raise ConfigError(f"{where}: groups values of the baseline's axis ({baseline_key}), not {key!r}")
    values = [[v.strip() for v in group.partition("=")[2].split("|")] for group in groups]
    named = [v for group in values for v in group]
    unknown = sorted(set(named) - set(axes[key]))
    if unknown or len(set(named)) != len(named):
        raise ConfigError(
            f"{where}: every value once, each one of {key}'s ({'|'.join(axes[key])})"
            + (f"; not one: {unknown[0]!r}" if unknown else "")
        )
    if baseline_value not in named:
        raise ConfigError(f"{where}: no group holds the baseline's value {baseline_value!r}")
    return key, values


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
    part = {
        "budgets": steps,
        "chosen_on": chooser,
        "curves": rows,
        "best_budget_comparisons": _best_budget_comparisons(by_curve, rows, grid, score),
    }
    tuned = tuned_groups(grid)
    return part if tuned is None else {**part, "tuned": _tuned(by_curve, tuned, grid, chooser, score)}


def _tuned(by_curve, tuned, grid, chooser, score) -> dict[str, Any]:
    """Per group of recipes and other axes, the recipe and budget with the highest mean `chooser` score
    (ties: the earlier recipe of the axis, then the smaller budget); each group's choice against the
    baseline group's with the same other axes, paired by seed on test and dev."""
    key, groups = tuned
    baseline_group = next(g for g in groups if baseline_of(grid)[1] in g)
    splits = list(dict.fromkeys((chooser, "dev", "test")))

    def mean(seeds: Mapping[int, Mapping[str, Any]], split: str) -> float | None:
        values = [v for v in (score(f, split) for f in seeds.values()) if v is not None]
        return statistics.mean(values) if values else None

    best: dict[tuple, tuple[float, dict[str, Any], Mapping[int, Any]]] = {}
    for curve, per_budget in by_curve.items():
        recipe = dict(curve)[key]
        group = next((g for g in groups if recipe in g), None)
        if group is None:  # a value of the axis that no group names: not tuned
            continue
        others = tuple((k, v) for k, v in curve if k != key)
        for budget, seeds in sorted(per_budget.items()):
            chosen = mean(seeds, chooser)
            at = (tuple(group), others)
            if chosen is None or (at in best and chosen <= best[at][0]):
                continue
            choice = {"group": f"{key}={'|'.join(group)}", "name": _name(others), key: recipe, AXIS: budget}
            choice |= {"seeds": len(seeds), **{f"{split}_mean": mean(seeds, split) for split in splits}}
            best[at] = (chosen, choice, seeds)

    comparisons = []
    for (group, others), (_, choice, seeds) in best.items():
        if group == tuple(baseline_group) or (tuple(baseline_group), others) not in best:
            continue
        _, other, other_seeds = best[(tuple(baseline_group), others)]
        row = {"group": choice["group"], "vs": other["group"], "name": choice["name"]}
        for split in ("test", "dev"):
            pairs = [
                (score(seeds[s], split), score(other_seeds[s], split))
                for s in sorted(set(seeds) & set(other_seeds))
            ]
            differences = [a - b for a, b in pairs if a is not None and b is not None]
            if differences:
                row[split] = _paired(differences, grid)
        comparisons.append(row)
    _holm(comparisons)
    return {"axis": key, "choices": [choice for _, choice, _ in best.values()], "comparisons": comparisons}


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
                row[split] = _paired(differences, grid)
        comparisons.append(row)
    _holm(comparisons)
    return comparisons


def _paired(differences: list[float], grid: ml_collections.ConfigDict) -> dict[str, Any]:
    """A paired row's split: its seed-level t-interval and two-sided p, and TOST at the grid's margin."""
    margin = report_settings(grid).equivalence_margin
    return {
        "n": len(differences),
        **array_statistics.t_interval(differences),
        "tost_p": array_statistics.tost(differences, margin)["p_value"],
    }


def _holm(rows: list[dict[str, Any]]) -> None:
    """Each split's t-test p Holm-corrected over the table's rows that have one (`p_holm`)."""
    for split in ("test", "dev"):
        tested = [row[split] for row in rows if row.get(split, {}).get("p_value") is not None]
        for t, p in zip(tested, array_statistics.holm([t["p_value"] for t in tested]), strict=True):
            t["p_holm"] = p


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
            f"paired by seed: {PAIRED}):",
            "",
            "| curve (budget) | vs (budget) | test: mean [95% CI] | dev: mean [95% CI] |",
            "| --- | --- | --- | --- |",
        ]
        for row in part["best_budget_comparisons"]:
            cells = _interval_cells(row)
            out.append(
                f"| {row['name']} ({row['budget']}) | {row['other']} ({row['other_budget']}) | "
                f"{cells[0]} | {cells[1]} |"
            )
    if part.get("tuned"):
        out += ["", *_tuned_lines(part["tuned"], metric, chooser)]
    return out


def _interval_cells(row: Mapping[str, Any]) -> list[str]:
    cells = []
    for split in ("test", "dev"):
        t = row.get(split)
        cells.append(
            "-"
            if t is None
            else f"{_fmt(t['mean'], 100, True)} [{_fmt(t['ci_low'], 100, True)}, "
            f"{_fmt(t['ci_high'], 100, True)}] (n={t['n']}), p {format_p(t['p_value'])} "
            f"(Holm {format_p(t.get('p_holm'))}), TOST p {format_p(t.get('tost_p'))}"
        )
    return cells


def _tuned_lines(tuned: Mapping[str, Any], metric: str, chooser: str) -> list[str]:
    """report.md's tuned strategies: each group's chosen recipe and budget, then the comparisons."""
    key = tuned["axis"]
    out = [
        f"Each strategy tuned on {chooser} (grid key `{TUNED_KEY}`: its recipes, values of `{key}`, x the "
        f"budgets; the pair with the highest mean {chooser} {metric} is its choice), and each choice "
        f"against the baseline's (points, paired by seed: {PAIRED}). The choice is made on {chooser} "
        "alone; dev and test only report it.",
        "",
        f"| strategy (recipes) | other axes | chosen {key} | chosen budget | {chooser} | dev | test |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in tuned["choices"]:
        out.append(
            f"| {c['group']} | {c['name']} | {c[key]} | {c[AXIS]} | {_fmt(c[f'{chooser}_mean'])} | "
            f"{_fmt(c['dev_mean'])} | {_fmt(c['test_mean'])} |"
        )
    if tuned["comparisons"]:
        out += [
            "",
            "| strategy (recipes) | vs | other axes | test: mean [95% CI] | dev: mean [95% CI] |",
            "| --- | --- | --- | --- | --- |",
        ]
        for row in tuned["comparisons"]:
            test, dev = _interval_cells(row)
            out.append(f"| {row['group']} | {row['vs']} | {row['name']} | {test} | {dev} |")
    return out

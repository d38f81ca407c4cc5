"""The report of a finished grid (grid.py, experiment.py): what the paper's single numbers lacked.

  per cell        mean, std, min, max and a 95% t-interval over seeds of the grid's `metric` on dev (and
                  on test when the runs scored a test file: of the same parameters, `final_params`)
  comparisons     every cell against the baseline cell with the same other axis values, paired by seed:
                  paired t-test and Wilcoxon signed-rank (scipy.stats), each Holm-corrected across the
                  table (statsmodels); almost stochastic order (deepsig: Dror et al. 2019, epsilon < 0.5
                  means the cell is better); and a paired bootstrap over dev *examples* of the accuracy
                  difference, averaged over seeds, from the saved per-example predictions
  ensembles       the grid's `ensembles`, built from the finished runs (ensemble.py, equal weights) and
                  written to WORKDIR/ensembles/<cell>-seed<k>/, are cells of their own in the table, the
                  comparisons and metric_by_cell.png (an axis value `a+b`); they have no dev curve
  majority class  accuracy of always predicting the most frequent dev label (tag, for tagging), from
                  the parsed labels of the prediction files
  boundaries      per cell and frozen-backbone phase, what its end recorded: head parameter norm, dev
                  ECE, train/dev gap (mean and std over seeds)
  figures         figures/metric_by_cell.png (means with intervals), figures/dev_curves.png (dev metric
                  against global step, phase boundaries dashed)

Written to WORKDIR/report.md and WORKDIR/report.json.
"""

import collections
import dataclasses
import json
import math
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
import scipy.stats

from stackft_jax import config_cli, ensemble, predictions
from stackft_jax.grid import Run, baseline_of, check_ensembles, ensembles_of, run_config, runs_of
from stackft_jax.report import json_safe

BOOTSTRAP_SAMPLES = 1000
ASO_ITERATIONS = 1000  # deepsig's default; each costs a few ms


@dataclasses.dataclass(frozen=True)
class RunResult:
    run: Run
    results: dict[str, Any]
    dev_predictions: Path
    metrics_file: Path | None  # None for an ensemble: no dev curve

    def score(self, split: str, metric: str) -> float | None:
        value = self.results["final"].get(split, {}).get(metric)
        return None if value is None else float(value)


def load_runs(grid: ml_collections.ConfigDict, workdir: str | Path) -> list[RunResult]:
    """Every run of the grid, read back; a missing or unfinished run is an error naming it."""
    loaded = []
    for run in runs_of(grid):
        run_dir = Path(workdir) / "runs" / run.name
        results_file = run_dir / "results.json"
        if not results_file.exists():
            raise FileNotFoundError(f"{results_file}: run {run.name} has not finished; rerun the grid")
        results = json.loads(results_file.read_text())
        loaded.append(RunResult(run, results, predictions.path(run_dir, "dev"), run_dir / "metrics.jsonl"))
    return loaded


def _write_ensemble(out: Path, ensembled: dict[str, Any]) -> None:
    # Staged beside and renamed into place file by file: two shards finishing at once may both write it.
    staging = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    ensemble.write(staging, ensembled)
    for file in sorted(f for f in staging.rglob("*") if f.is_file()):
        target = out / file.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(file, target)
    shutil.rmtree(staging)


def build_ensembles(grid: ml_collections.ConfigDict, workdir: str | Path) -> list[RunResult]:
    """Every ensemble of the grid, built from its finished members and written (again, the same) to
    WORKDIR/ensembles/<cell>-seed<k>/; read back as runs of their own cells."""
    workdir = Path(workdir)
    ensembles = ensembles_of(grid)
    check_ensembles(grid, ensembles, {m: run_config(grid, m) for e in ensembles for m in e.members})
    built = []
    for e in ensembles:
        try:
            ensembled = ensemble.ensemble([workdir / "runs" / m.name for m in e.members])
        except ensemble.EnsembleError as error:
            raise config_cli.ConfigError(f"grid ensemble {e.run.name}: {error}") from None
        out = workdir / "ensembles" / e.run.name
        _write_ensemble(out, ensembled)
        results = {"final": ensembled["ensemble"], "members": [m.name for m in e.members]}
        built.append(RunResult(e.run, results, predictions.path(out, "dev"), None))
    return built


def _interval(values: list[float]) -> dict[str, float | int | None]:
    n = len(values)
    mean = statistics.mean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    low = high = None
    if n > 1:
        low, high = (mean, mean)
        if std > 0:
            low, high = map(float, scipy.stats.t.interval(0.95, n - 1, loc=mean, scale=std / math.sqrt(n)))
    return {"n": n, "mean": mean, "std": std, "min": min(values), "max": max(values),
            "ci95_low": low, "ci95_high": high}  # fmt: skip


def cell_statistics(runs: list[RunResult], metric: str) -> list[dict[str, Any]]:
    by_cell: dict[tuple, list[RunResult]] = collections.defaultdict(list)
    for r in runs:
        by_cell[r.run.cell].append(r)
    cells = []
    for cell, members in by_cell.items():
        entry: dict[str, Any] = {"cell": dict(cell), "name": members[0].run.cell_name}
        for split in ("dev", "test"):
            scores = (m.score(split, metric) for m in members)
            values = [v for v in scores if v is not None and math.isfinite(v)]
            if values:
                entry[split] = _interval(values)
        cells.append(entry)
    return cells


BOUNDARY_MEASURES = ("head_param_norm", "dev_ece")


def boundary_statistics(runs: list[RunResult], metric: str) -> list[dict[str, Any]]:
    """Per cell and frozen-backbone phase, mean and std over seeds of what its boundary recorded
    (train.boundary_measurements): head parameter norm, dev ECE, train/dev gap in `metric`."""
    by_phase: dict[tuple, list[dict]] = collections.defaultdict(list)
    names = {}
    for r in runs:
        for phase in r.results["phases"]:
            if "boundary" in phase:
                by_phase[(r.run.cell, phase["phase"])].append({**phase["boundary"], "steps": phase["steps"]})
                names[r.run.cell] = r.run.cell_name
    rows = []
    for (cell, phase), boundaries in by_phase.items():
        row: dict[str, Any] = {"cell": dict(cell), "name": names[cell], "phase": phase}
        for measure in (*BOUNDARY_MEASURES, f"train_dev_gap_{metric}", "steps"):
            values = [b[measure] for b in boundaries if b.get(measure) is not None]
            if values:
                row[measure] = {"n": len(values), "mean": statistics.mean(values),
                                "std": statistics.stdev(values) if len(values) > 1 else 0.0}  # fmt: skip
        rows.append(row)
    return rows


def _example_scores(records: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray] | None:
    """(correct, weight) per example: classification 1/0 per example; tagging correct words and words
    per sentence; None for regression (no per-example accuracy)."""
    first = records[0]
    if isinstance(first["label"], list):
        correct = [sum(p == g for p, g in zip(r["prediction"], r["label"], strict=True)) for r in records]
        return np.asarray(correct, float), np.asarray([len(r["label"]) for r in records], float)
    if "probabilities" not in first:
        return None
    return np.asarray([r["prediction"] == r["label"] for r in records], float), np.ones(len(records))


def paired_bootstrap(
    cell_files: list[Path], baseline_files: list[Path], *, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0
) -> dict[str, float] | None:
    """Accuracy difference (cell - baseline, averaged over the seeds' run pairs) with a 95% percentile
    interval and a two-sided p over `samples` resamples of the dev examples, the same resample for
    every seed. None when the task has no per-example accuracy (regression)."""
    differences_by_seed = []
    weights = None
    for cell_file, baseline_file in zip(cell_files, baseline_files, strict=True):
        pairs = predictions.paired(cell_file, baseline_file)
        ours = _example_scores([a for a, _ in pairs])
        theirs = _example_scores([b for _, b in pairs])
        if ours is None or theirs is None:
            return None
        differences_by_seed.append(ours[0] - theirs[0])
        weights = ours[1]
    differences = np.mean(differences_by_seed, axis=0)  # per example, averaged over seeds
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(differences), size=(samples, len(differences)))
    resampled = differences[index].sum(axis=1) / weights[index].sum(axis=1)
    observed = float(differences.sum() / weights.sum())
    p = 2 * min(np.mean(resampled <= 0), np.mean(resampled >= 0))
    low, high = np.percentile(resampled, [2.5, 97.5])
    return {"difference": observed, "ci95_low": float(low), "ci95_high": float(high),
            "p_value": float(min(p, 1.0)), "samples": samples}  # fmt: skip


def comparisons(
    runs: list[RunResult], grid: ml_collections.ConfigDict, *, aso_iterations: int = ASO_ITERATIONS
) -> list[dict[str, Any]]:
    from deepsig import aso
    from statsmodels.stats.multitest import multipletests

    key, base_value = baseline_of(grid)
    by_cell_seed = {(r.run.cell, r.run.seed): r for r in runs}
    rows = []
    for cell in dict.fromkeys(r.run.cell for r in runs):
        values = dict(cell)
        if values[key] == base_value:
            continue
        baseline_cell = tuple((k, base_value if k == key else v) for k, v in cell)
        seeds = sorted(s for (c, s) in by_cell_seed if c == cell and (baseline_cell, s) in by_cell_seed)
        ours = [by_cell_seed[cell, s].score("dev", grid.metric) for s in seeds]
        theirs = [by_cell_seed[baseline_cell, s].score("dev", grid.metric) for s in seeds]
        differences = [a - b for a, b in zip(ours, theirs, strict=True)]
        row: dict[str, Any] = {
            "cell": values,
            "baseline": dict(baseline_cell),
            "seeds": seeds,
            "per_seed": differences,
            "mean_difference": statistics.mean(differences),
            "t_test_p": None,
            "wilcoxon_p": None,
            "aso_epsilon": None,
        }
        # Seed-level tests need pairs: one seed would give Wilcoxon p = 1 and ASO 0 (not evidence).
        if len(seeds) > 1 and len(set(differences)) > 1:
            row["t_test_p"] = float(scipy.stats.ttest_rel(ours, theirs).pvalue)
        if len(seeds) > 1 and any(differences):
            row["wilcoxon_p"] = float(scipy.stats.wilcoxon(ours, theirs).pvalue)
        if len(seeds) > 1:
            row["aso_epsilon"] = float(
                aso(ours, theirs, seed=0, show_progress=False, num_bootstrap_iterations=aso_iterations)
            )
        row["bootstrap"] = paired_bootstrap(
            [by_cell_seed[cell, s].dev_predictions for s in seeds],
            [by_cell_seed[baseline_cell, s].dev_predictions for s in seeds],
        )
        rows.append(row)
    for test in ("t_test_p", "wilcoxon_p"):
        tested = [row for row in rows if row[test] is not None]
        if tested:
            corrected = multipletests([row[test] for row in tested], method="holm")[1]
            for row, p in zip(tested, corrected, strict=True):
                row[test.replace("_p", "_p_holm")] = float(p)
    return rows


def majority_baseline(dev_predictions: Path) -> float | None:
    """Accuracy of the most frequent dev label (for tagging, tag), from the parsed labels."""
    records = list(predictions.read(dev_predictions).values())
    labels = [tag for r in records for tag in (r["label"] if isinstance(r["label"], list) else [r["label"]])]
    if "probabilities" not in records[0] and not isinstance(records[0]["label"], list):
        return None  # regression
    return collections.Counter(labels).most_common(1)[0][1] / len(labels)


def _dev_curve(metrics_file: Path, metric: str) -> list[tuple[int, float]]:
    points = []
    with metrics_file.open() as f:
        for line in f:
            record = json.loads(line)
            if record.get("split") == "dev" and record.get(metric) is not None:
                points.append((record["global_step"], record[metric]))
    return points


def write_figures(runs: list[RunResult], cells: list[dict[str, Any]], metric: str, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(cells)), 3.5))
    names = [c["name"] for c in cells]
    means = [c["dev"]["mean"] if "dev" in c else np.nan for c in cells]
    # Error bars from the intervals; a one-seed cell has none (its bar is empty).
    low = [
        c["dev"]["ci95_low"] if "dev" in c and c["dev"]["ci95_low"] is not None else m
        for c, m in zip(cells, means, strict=True)
    ]
    high = [
        c["dev"]["ci95_high"] if "dev" in c and c["dev"]["ci95_high"] is not None else m
        for c, m in zip(cells, means, strict=True)
    ]
    errors = [np.subtract(means, low), np.subtract(high, means)]
    ax.errorbar(range(len(cells)), means, yerr=errors, fmt="o", capsize=4)
    ax.set_xticks(range(len(cells)), names, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(f"dev {metric} (mean, 95% CI over seeds)")
    fig.tight_layout()
    by_cell = out / "metric_by_cell.png"
    fig.savefig(by_cell, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    for r in (r for r in runs if r.run.seed == min(x.run.seed for x in runs)):
        points = _dev_curve(r.metrics_file, metric)
        if points:
            steps, values = np.asarray(points).T
            line = ax.plot(steps, values, marker=".", label=r.run.cell_name)[0]
            boundary = 0
            for phase in r.results["phases"][:-1]:
                boundary += phase["steps"]
                ax.axvline(boundary, color=line.get_color(), linestyle="--", linewidth=0.8)
    ax.set_xlabel("global step (phase boundaries dashed)")
    ax.set_ylabel(f"dev {metric}")
    ax.legend(fontsize=6)
    fig.tight_layout()
    curves = out / "dev_curves.png"
    fig.savefig(curves, dpi=120)
    plt.close(fig)
    return [by_cell, curves]


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _markdown(grid: ml_collections.ConfigDict, report: dict[str, Any]) -> str:
    metric = grid.metric
    lines = [
        "# Experiment report",
        "",
        f"Base config `{grid.base}`; axes `{grid.axes}`; seeds 0-{grid.num_seeds - 1}; baseline "
        f"`{grid.baseline}`; metric `{metric}` on dev, of the parameters each run's `final_params` names "
        f"({', '.join(sorted(report['final_params']))}).",
        "",
        f"| cell | dev {metric} mean ± std | 95% CI | min | max | seeds | test mean |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in report["cells"]:
        dev, test = c.get("dev"), c.get("test")
        if dev is None:
            lines.append(f"| {c['name']} | undefined | - | - | - | 0 | - |")
            continue
        lines.append(
            f"| {c['name']} | {_fmt(dev['mean'])} ± {_fmt(dev['std'])} | [{_fmt(dev['ci95_low'])}, "
            f"{_fmt(dev['ci95_high'])}] | {_fmt(dev['min'])} | {_fmt(dev['max'])} | {dev['n']} | "
            f"{_fmt(test['mean']) if test else '-'} |"
        )
    if report["ensembles"]:
        lines += [
            "",
            f"Ensembles (`{grid.ensembles}`): a value `a+b` is the equal-weight average of those runs' class "
            "probabilities, seed by seed (`ensembles/<cell>-seed<k>/`).",
        ]
    if report["majority_baseline"] is not None:
        lines += [
            "",
            f"Majority-class dev accuracy (from the parsed labels): {report['majority_baseline']:.4f}",
        ]
    lines += [
        "",
        f"Paired by seed against the baseline (`{grid.baseline}`, same other axis values); differences in "
        f"dev {metric} points x100; p values Holm-corrected across the table; ASO epsilon < 0.5: the cell is "
        "better (deepsig); bootstrap: dev accuracy difference over resampled examples, averaged over seeds.",
        "",
        "| cell | vs | mean diff | per seed | t-test p (Holm) | Wilcoxon p (Holm) | ASO eps "
        "| bootstrap acc diff [95% CI], p |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["comparisons"]:
        boot = row["bootstrap"]
        boot_text = "-"
        if boot is not None:
            interval = f"[{100 * boot['ci95_low']:+.2f}, {100 * boot['ci95_high']:+.2f}]"
            boot_text = f"{100 * boot['difference']:+.2f} {interval}, {boot['p_value']:.3f}"
        cell, versus = (Run(tuple(row[k].items()), 0).cell_name for k in ("cell", "baseline"))
        per_seed = ", ".join(f"{100 * d:+.2f}" for d in row["per_seed"])
        lines.append(
            f"| {cell} | {versus} | {100 * row['mean_difference']:+.2f} | {per_seed} | "
            f"{_fmt(row.get('t_test_p_holm'), 3)} | {_fmt(row.get('wilcoxon_p_holm'), 3)} | "
            f"{_fmt(row['aso_epsilon'], 3)} | {boot_text} |"
        )
    if report["boundaries"]:
        gap = f"train_dev_gap_{metric}"
        lines += [
            "",
            "At the end of each frozen-backbone phase (mean ± std over seeds): the head's parameter norm, "
            f"dev expected calibration error, and train-subset minus dev {metric}.",
            "",
            f"| cell | phase | steps | head norm | dev ECE | train - dev {metric} |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for row in report["boundaries"]:
            shown = [
                f"{_fmt(row[m]['mean'], 3)} ± {_fmt(row[m]['std'], 3)}" if m in row else "-"
                for m in ("steps", "head_param_norm", "dev_ece", gap)
            ]
            lines.append(f"| {row['name']} | {row['phase']} | " + " | ".join(shown) + " |")
    lines += ["", "Figures: `figures/metric_by_cell.png`, `figures/dev_curves.png` (seed 0)."]
    return "\n".join(lines) + "\n"


def build_report(
    grid: ml_collections.ConfigDict, workdir: str | Path, *, aso_iterations: int = ASO_ITERATIONS
) -> dict[str, Any]:
    runs = load_runs(grid, workdir)
    ensembles = build_ensembles(grid, workdir)
    return {
        "grid": grid.to_dict(),
        "runs": [
            {"name": r.run.name, "cell": dict(r.run.cell), "seed": r.run.seed, "final": r.results["final"]}
            for r in runs
        ],
        "ensembles": [
            {
                "name": e.run.name,
                "cell": dict(e.run.cell),
                "seed": e.run.seed,
                "members": e.results["members"],
                "final": e.results["final"],
            }
            for e in ensembles
        ],
        "final_params": sorted({r.results.get("final_params", "last").split(" ")[0] for r in runs}),
        "cells": cell_statistics(runs + ensembles, grid.metric),
        "comparisons": comparisons(runs + ensembles, grid, aso_iterations=aso_iterations),
        "boundaries": boundary_statistics(runs, grid.metric),
        "majority_baseline": majority_baseline(runs[0].dev_predictions),
    }


def write_report(
    grid: ml_collections.ConfigDict, workdir: str | Path, *, aso_iterations: int = ASO_ITERATIONS
) -> Path:
    """report.json, report.md and the figures; returns report.md's path."""
    workdir = Path(workdir)
    report = build_report(grid, workdir, aso_iterations=aso_iterations)
    write_figures(load_runs(grid, workdir), report["cells"], grid.metric, workdir / "figures")
    # tmp file + rename: two shards finishing at once may both write the (same) report.
    for name, text in (("report.json", json.dumps(json_safe(report), indent=2) + "\n"),
                       ("report.md", _markdown(grid, report))):  # fmt: skip
        tmp = workdir / f"{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, workdir / name)
    return workdir / "report.md"

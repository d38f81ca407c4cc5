"""The grid report's figures (grid_report.py): figures/metric_by_cell.png, each cell's mean dev metric with
its 95% interval over seeds and each seed's score, and figures/dev_curves.png, the dev metric against
the global step of each cell's first seed, phase boundaries dashed. matplotlib's Agg backend: no
display needed.
"""

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from stackft_jax.experiments.cells import Run
from stackft_jax.runtime import records


class FinishedRun(Protocol):
    """What the dev curves read of a finished run (grid_report.RunResult has it)."""

    run: Run
    metrics_file: Path | None
    results: dict[str, Any]


def _dev_curve(metrics_file: Path, metric: str) -> list[tuple[int, float]]:
    points = []
    written, _ = records.read_jsonl(metrics_file, records.FIX_METRICS)  # a cut last line: drawn without it
    for record in written:
        if record.get("split") == "dev" and record.get(metric) is not None:
            points.append((record["global_step"], record[metric]))
    return points


def write(runs: list[FinishedRun], report: dict[str, Any], metric: str, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    cells = report["cells"]
    # One row per cell, in the table's order from the top: long cell names stay readable.
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.4 * len(cells)))
    rows = np.arange(len(cells))[::-1]
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
    ax.errorbar(means, rows, xerr=errors, fmt="o", capsize=4, label="mean, 95% CI over seeds")
    # Each seed's score beside its cell's interval, so a spread or an outlier shows.
    by_cell: dict[tuple, list[float]] = {}
    for r in (*report["runs"], *report["ensembles"]):
        score = r["final"].get("dev", {}).get(metric)
        if score is not None:
            by_cell.setdefault(tuple(r["cell"].items()), []).append(score)
    seeds = [
        (v, y) for c, y in zip(cells, rows, strict=True) for v in by_cell.get(tuple(c["cell"].items()), [])
    ]
    if seeds:
        values, ys = np.asarray(seeds).T
        ax.scatter(values, ys - 0.22, s=10, color="gray", alpha=0.7, label="one seed")
    ax.set_yticks(rows, [c["name"] for c in cells], fontsize=7)
    ax.set_xlabel(f"dev {metric}")
    ax.legend(fontsize=7, loc="best")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    by_cell_file = out / "metric_by_cell.png"
    fig.savefig(by_cell_file, dpi=120)
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
    if ax.lines:  # runs that logged no mid-phase dev score draw no curve
        ax.legend(fontsize=6)
    fig.tight_layout()
    curves = out / "dev_curves.png"
    fig.savefig(curves, dpi=120)
    plt.close(fig)
    return [by_cell_file, curves]

"""The grid report's figures (report.py): figures/metric_by_cell.png, each cell's mean dev metric with
its 95% interval over seeds, and figures/dev_curves.png, the dev metric against the global step of each
cell's first seed, phase boundaries dashed. matplotlib's Agg backend: no display needed.
"""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from stackft_jax.experiments.report import RunResult


def _dev_curve(metrics_file: Path, metric: str) -> list[tuple[int, float]]:
    points = []
    with metrics_file.open() as f:
        for line in f:
            record = json.loads(line)
            if record.get("split") == "dev" and record.get(metric) is not None:
                points.append((record["global_step"], record[metric]))
    return points


def write(runs: list["RunResult"], cells: list[dict[str, Any]], metric: str, out: Path) -> list[Path]:
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

"""report.md: the grid report (report.py) as markdown tables with captions that say what each
number is: cells, comparisons (valid or not, tests and what they can show), the paper's layout, costs,
phase boundaries."""

import math
from pathlib import Path
from typing import Any

import ml_collections

from stackft_jax.experiments import statistics as array_statistics
from stackft_jax.experiments.cells import Run
from stackft_jax.models import objectives
from stackft_jax.training import degenerate

TESTS = array_statistics.SEED_TESTS


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _flags_text(flagged: dict[str, int], n: int) -> str:
    return ", ".join(f"{flag} {count}/{n}" for flag, count in flagged.items())


def _interval_text(boot: dict[str, float] | None, *, with_p: bool = True) -> str:
    if boot is None:
        return "-"
    text = f"{100 * boot['difference']:+.2f} [{100 * boot['ci95_low']:+.2f}, {100 * boot['ci95_high']:+.2f}]"
    return f"{text}, {array_statistics.format_p(boot['p_value'], boot['samples'])}" if with_p else text


def _p_text(row: dict[str, Any], test: str) -> str:
    """Raw and Holm-corrected p; † when the test cannot reach 0.05 at this row's seed count and family."""
    raw = row[f"{test}_p"]
    text = "-" if raw is None else f"{raw:.3f} ({row[f'{test}_p_holm']:.3f})"
    return text if row["can_reach_alpha"][test] else f"{text} †"


def _cell_lines(metric: str, report: dict[str, Any]) -> list[str]:
    lines = [
        f"| cell | dev {metric} mean ± std | 95% CI | min | max | seeds | test {metric} mean ± std "
        "| degenerate runs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in report["cells"]:
        dev, test = c.get("dev"), c.get("test")
        flags = "; ".join(
            f"**{split}**: {_flags_text(flagged, c['runs'])}"
            for split, flagged in c.get("degenerate", {}).items()
        )
        test_text = f"{_fmt(test['mean'])} ± {_fmt(test['std'])}" if test else "-"
        if dev is None:
            lines.append(f"| {c['name']} | undefined | - | - | - | 0 | {test_text} | {flags} |")
            continue
        lines.append(
            f"| {c['name']} | {_fmt(dev['mean'])} ± {_fmt(dev['std'])} | [{_fmt(dev['ci95_low'])}, "
            f"{_fmt(dev['ci95_high'])}] | {_fmt(dev['min'])} | {_fmt(dev['max'])} | {dev['n']} | "
            f"{test_text} | {flags} |"
        )
    return lines


def _comparison_lines(grid: ml_collections.ConfigDict, report: dict[str, Any]) -> list[str]:
    rows = report["comparisons"]
    family = {test: sum(row[f"{test}_p"] is not None for row in rows) for test in TESTS}
    samples = next((row["bootstrap"]["samples"] for row in rows if row["bootstrap"]), None)
    tagging = report["objective"] == objectives.WORD_TAGGING.name
    entity_counts = " (from per-sentence entity counts)" if tagging and grid.metric != "accuracy" else ""
    lines = [
        f"Paired by seed against the baseline (`{grid.baseline}`, same other axis values); differences in "
        f"{grid.metric} points x100, dev unless named test. **valid**: `no` when a run of either cell is "
        "degenerate on dev (its flags are in the cell table): that difference is struck through and is not "
        "a result, whatever its sign.",
        "",
        "Seed-level tests, each Holm-corrected within its own family, the comparisons of this table that "
        f"have it (t-test {family['t_test']}, Wilcoxon {family['wilcoxon']}, sign flip "
        f"{family['sign_flip']}), shown as `raw (Holm)`: paired t-test; Wilcoxon signed-rank (two-sided, "
        "exact); exact sign-flip permutation test over seeds (one-sided: the cell better than the "
        "baseline). Smallest attainable p at n seeds: t-test 0 (continuous), Wilcoxon 2/2^n (0.0625 at 5), "
        "sign flip 1/2^n (0.031 at 5), bootstrap 1/B; after Holm over m tests, a test can reach 0.05 only "
        "if its smallest p x m <= 0.05: † marks a p that cannot, at that row's seed count. ASO epsilon < "
        "0.5: the cell is better (deepsig, no p).",
        "",
        f"Bootstrap: two-level, {samples or '-'} resamples of the seeds and then, within each resampled "
        f"seed, of its examples (the same examples for both runs of the pair), recomputing the reported "
        f"{grid.metric} on each resample{entity_counts}; the 95% interval covers seed-to-seed and example "
        "variance; p two-sided, not Holm-corrected, `< 1/B` when no resample reached 0.",
        "",
        "| cell | vs | valid | mean diff | per seed | test mean diff | t-test p | Wilcoxon p | sign-flip p "
        "| ASO eps | bootstrap diff [95% CI], p | test bootstrap |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        cell, versus = (Run(tuple(row[k].items()), 0).cell_name for k in ("cell", "baseline"))
        per_seed = ", ".join(f"{100 * d:+.2f}" for d in row["per_seed"])
        n = len(row["seeds"])
        mean = f"{100 * row['mean_difference']:+.2f}"
        valid = "yes"
        if not row["valid"]:
            mean = f"~~{mean}~~"
            valid = "no: " + "; ".join(
                f"{side} {_flags_text(flagged, n)}" for side, flagged in row["degenerate"].items() if flagged
            )
        test_mean = row.get("test_mean_difference")
        lines.append(
            f"| {cell} | {versus} | {valid} | {mean} | {per_seed} | "
            f"{'-' if test_mean is None else f'{100 * test_mean:+.2f}'} | "
            + " | ".join(_p_text(row, test) for test in TESTS)
            + f" | {_fmt(row['aso_epsilon'], 3)} | {_interval_text(row['bootstrap'])} | "
            f"{_interval_text(row.get('test_bootstrap'))} |"
        )
    return lines


def _paper_lines(grid: ml_collections.ConfigDict, report: dict[str, Any]) -> list[str]:
    gains = report["paper_results"]
    lines = [
        "Paper layout: the gain over the baseline that the paper reports for each cell (grid key "
        "`paper_results`, its source in the grid config; `not found`: no per-cell value was found) beside "
        f"the measured gain in {grid.metric} points x100 (mean over seeds [two-level bootstrap 95% CI]).",
        "",
        "| cell | vs | paper gain | measured gain, dev [95% CI] | measured gain, test [95% CI] | valid |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["comparisons"]:
        cell, versus = (Run(tuple(row[k].items()), 0).cell_name for k in ("cell", "baseline"))
        paper = f"{gains[cell]:+.2f}" if cell in gains else "not found"
        dev = _interval_text(row["bootstrap"], with_p=False)
        if row["bootstrap"] is None:
            dev = f"{100 * row['mean_difference']:+.2f}"
        test = _interval_text(row.get("test_bootstrap"), with_p=False)
        lines.append(f"| {cell} | {versus} | {paper} | {dev} | {test} | {'yes' if row['valid'] else 'no'} |")
    return lines


def _by_type_lines(metric: str, report: dict[str, Any]) -> list[str]:
    """The metric per type (entity type for tagging) and split, where the runs score one."""
    lines = []
    for split in ("dev", "test"):
        rows = [c for c in report["cells"] if c.get(f"{split}_by_type")]
        if not rows:
            continue
        types = sorted({kind for c in rows for kind in c[f"{split}_by_type"]})
        lines += [
            "",
            f"{split} {metric} per type (each run's `{metric}_<type>`, mean ± std over seeds):",
            "",
            "| cell | " + " | ".join(types) + " |",
            "| --- |" + " --- |" * len(types),
        ]
        for c in rows:
            shown = [c[f"{split}_by_type"].get(kind) for kind in types]
            lines.append(
                f"| {c['name']} | "
                + " | ".join("-" if v is None else f"{_fmt(v['mean'])} ± {_fmt(v['std'])}" for v in shown)
                + " |"
            )
    return lines


def _cost_lines(report: dict[str, Any]) -> list[str]:
    lines = [
        "What each cell cost (per run: mean over seeds; an ensemble costs its members together): "
        "optimizer steps, training examples seen (steps x global batch), wall seconds of training and "
        "evaluation over every process lifetime (results.json).",
        "",
        "| cell | seeds | train steps | examples seen | wall s per run | wall s, all seeds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["costs"]:
        lines.append(
            f"| {row['name']} | {row['n']} | {row['train_steps']['mean']:.0f} | "
            f"{row['examples_seen']['mean']:.0f} | {row['wall_time_s']['mean']:.1f} | "
            f"{row['wall_time_s']['total']:.1f} |"
        )
    return lines


def _reuse_lines(report: dict[str, Any]) -> list[str]:
    reused = [r for r in report["runs"] if "reused_from" in r]
    if not reused:
        return []
    sources = sorted({str(Path(r["reused_from"]).parent.parent) for r in reused})
    return [
        "",
        f"{len(reused)} of the {len(report['runs'])} runs were trained by another grid with the same "
        f"resolved config and copied here (`--reuse_runs_from`; each run's `reused_from.json` names "
        f"its source): from {', '.join(f'`{s}`' for s in sources)}. Their cost is what they cost there.",
    ]


def render(grid: ml_collections.ConfigDict, report: dict[str, Any]) -> str:
    """report.md of report.build_report's report."""
    metric = grid.metric
    lines = [
        "# Experiment report",
        "",
        f"Base config `{grid.base}`; axes `{grid.axes}`; seeds 0-{grid.num_seeds - 1}; baseline "
        f"`{grid.baseline}`; metric `{metric}` on dev (and test where the runs scored one), of the "
        f"parameters each run's `final_params` names ({', '.join(sorted(report['final_params']))}).",
        "",
        *_cell_lines(metric, report),
        *_by_type_lines(metric, report),
    ]
    if report["ensembles"]:
        lines += [
            "",
            f"Ensembles (`{grid.ensembles}`): a value `a+b` is the equal-weight average of those runs' class "
            "probabilities, seed by seed (`ensembles/<cell>-seed<k>/`).",
        ]
    if report["majority_baseline"] is not None:
        floor_name = (
            "All-`O` dev token accuracy (the most frequent tag on every word, from the parsed labels)"
            if report["objective"] == objectives.WORD_TAGGING.name
            else "Majority-class dev accuracy (from the parsed labels)"
        )
        lines += [
            "",
            f"{floor_name}: "
            f"{report['majority_baseline']:.4f}. Degenerate runs (stackft_jax/training/degenerate.py): dev "
            f"predictions {100 * degenerate.ONE_CLASS_SHARE:.0f}% or more one class (`one_class`), F1 0 or "
            "undefined, or "
            "accuracy at or below this baseline.",
        ]
        if metric != "accuracy" and report["majority_in_metric"] is not None:
            lines[-1] += (
                f" In the reported `{metric}`, always predicting that label (tag) scores "
                f"{report['majority_in_metric']:.4f}."
            )
    lines += ["", *_comparison_lines(grid, report)]
    if report["comparisons"]:
        lines += ["", *_paper_lines(grid, report)]
    if report["costs"]:
        lines += ["", *_cost_lines(report)]
    lines += _reuse_lines(report)
    if report["boundaries"]:
        floor, gap = report["majority_in_metric"], f"train_dev_gap_{metric}"
        lines += [
            "",
            "At the end of each frozen-backbone phase (mean ± std over seeds): its steps; how many of the "
            "cell's runs a stop rule (train/dev gap, patience) ended (one that fires at the budget's last "
            "step counts, though it ended the phase no sooner); the head's "
            f"dev {metric}, and how many runs ended the phase with it at or below always predicting the "
            f"majority label ({_fmt(floor)}): a head that has not learned the task is not overfitting, so "
            "a gap rule that stopped it there fired on the noise of its train subset; the head's parameter "
            f"norm, dev expected calibration error, and train-subset minus dev {metric}.",
            "",
            f"| cell | phase | steps | stopped by a rule | dev {metric} | at or below majority | head norm "
            f"| dev ECE | train - dev {metric} |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in report["boundaries"]:
            shown = {
                m: f"{_fmt(row[m]['mean'], 3)} ± {_fmt(row[m]['std'], 3)}" if m in row else "-"
                for m in ("steps", f"dev_{metric}", "head_param_norm", "dev_ece", gap)
            }
            at_floor = "-" if row["head_at_floor"] is None else f"{row['head_at_floor']}/{row['n']}"
            lines.append(
                f"| {row['name']} | {row['phase']} | {shown['steps']} | {row['stopped_by_rule']}/{row['n']} "
                f"| {shown[f'dev_{metric}']} | {at_floor} | {shown['head_param_norm']} | {shown['dev_ece']} "
                f"| {shown[gap]} |"
            )
    lines += ["", "Figures: `figures/metric_by_cell.png`, `figures/dev_curves.png` (seed 0)."]
    return "\n".join(lines) + "\n"

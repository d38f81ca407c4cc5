"""report.md: the grid report (report.py) as markdown tables with captions that say what each
number is: cells, comparisons (valid or not, tests and what they can show), the paper's layout, costs,
phase boundaries."""

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections

from stackft_jax.data.task_spec import SELECTION
from stackft_jax.experiments import budget_curves
from stackft_jax.experiments import statistics as array_statistics
from stackft_jax.experiments.cells import gain_sign
from stackft_jax.models import objectives
from stackft_jax.training import degenerate

TESTS = array_statistics.SEED_TESTS
ALPHA = 0.05


# What a score's name means where a convention decides it (the report says so beside its tables).
CONVENTIONS = {
    "f1": "entity F1 under conlleval's convention (seqeval's default mode: an `I-` tag that opens an "
    "entity counts as its start), the one the field reports CoNLL-2003 in",
    "strict_f1": "entity F1 under strict IOB2 (seqeval mode=strict: an entity opened by `I-` is no entity)",
}


def conventions_line(report: dict[str, Any], metric: str) -> list[str]:
    """Which entity F1 each column is, for a tagging report that shows more than one."""
    names = [metric, *report.get("beside_metrics", [])]
    if report["objective"] != objectives.WORD_TAGGING.name or len(names) < 2:
        return []
    said = "; ".join(f"`{name}`: {CONVENTIONS[name]}" for name in names if name in CONVENTIONS)
    return [
        "",
        f"Metrics: {said}. `{metric}` is the primary (every test, interval and figure); "
        f"{', '.join(f'`{n}`' for n in names[1:])} beside it, from the same predictions. A CRF decodes "
        "well-formed IOB2 only, so the two agree for its runs; they differ where an unconstrained head "
        "opens entities with `I-`.",
    ]


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _flags_text(flagged: dict[str, int], n: int) -> str:
    return ", ".join(f"{flag} {count}/{n}" for flag, count in flagged.items())


def _interval_text(boot: dict[str, float] | None, *, with_p: bool = True) -> str:
    """A bootstrap's difference [95% percentile interval] ±MC error, and its p."""
    if boot is None:
        return "-"
    text = f"{100 * boot['difference']:+.2f} [{100 * boot['ci95_low']:+.2f}, {100 * boot['ci95_high']:+.2f}]"
    if "mc_error" in boot:
        text += f" ±{100 * boot['mc_error']:.2f}"
    return f"{text}, {array_statistics.format_p(boot['p_value'], boot['samples'])}" if with_p else text


def t_text(interval: dict[str, Any] | None) -> str:
    """A t-interval: mean [95% t-interval] in points x100 (the report's primary interval)."""
    if interval is None:
        return "-"
    mean = f"{100 * interval['mean']:+.2f}"
    if interval["ci_low"] is None:
        return f"{mean} [-]"
    return f"{mean} [{100 * interval['ci_low']:+.2f}, {100 * interval['ci_high']:+.2f}]"


def _p_text(row: dict[str, Any], test: str) -> str:
    """Raw and Holm-corrected p; † when the test cannot reach 0.05 at this row's seed count and family."""
    raw = row[f"{test}_p"]
    text = "-" if raw is None else f"{raw:.3f} ({row[f'{test}_p_holm']:.3f})"
    return text if row["can_reach_alpha"][test] else f"{text} †"


def _tost_text(tost: dict[str, Any]) -> str:
    if tost["p_value"] is None:
        return "-"
    verdict = "equivalent" if tost["equivalent"] else "not shown"
    return f"{tost['p_value']:.3f} ({verdict})"


def _beside_cell_text(c: dict[str, Any], beside: list[str]) -> str:
    """A cell's `beside` metrics, dev and test mean ± std, as table columns."""
    shown = []
    for other in beside:
        for split in ("dev", "test"):
            found = c.get("beside", {}).get(other, {}).get(split)
            shown.append(f" {_fmt(found['mean'])} ± {_fmt(found['std'])} |" if found else " - |")
    return "".join(shown)


def _cell_lines(metric: str, report: dict[str, Any]) -> list[str]:
    compute = {row["name"]: row["compute"] for row in report.get("compute", [])}
    measures = sorted({k for c in compute.values() for k in c})
    beside = report.get("beside_metrics", [])
    beside_header = "".join(f" {split} {m} mean ± std |" for m in beside for split in ("dev", "test"))
    lines = [
        f"| cell | dev {metric} mean ± std | 95% CI | min | max | seeds | test {metric} mean ± std "
        "| test 95% CI | degenerate runs |" + beside_header + "".join(f" compute: {m} |" for m in measures),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        + " --- |" * (len(measures) + 2 * len(beside)),
    ]
    for c in report["cells"]:
        dev, test = c.get("dev"), c.get("test")
        flags = "; ".join(
            f"**{split}**: {_flags_text(flagged, c['runs'])}"
            for split, flagged in c.get("degenerate", {}).items()
        )
        test_text = f"{_fmt(test['mean'])} ± {_fmt(test['std'])}" if test else "-"
        test_ci = f"[{_fmt(test['ci95_low'])}, {_fmt(test['ci95_high'])}]" if test else "-"
        cell_compute = compute.get(c["name"], {})
        compute_text = _beside_cell_text(c, beside) + "".join(
            f" {cell_compute[m]:.4g} |" if m in cell_compute else " - |" for m in measures
        )
        if dev is None:
            lines.append(
                f"| {c['name']} | undefined | - | - | - | 0 | {test_text} | {test_ci} | {flags} |"
                + compute_text
            )
            continue
        lines.append(
            f"| {c['name']} | {_fmt(dev['mean'])} ± {_fmt(dev['std'])} | [{_fmt(dev['ci95_low'])}, "
            f"{_fmt(dev['ci95_high'])}] | {_fmt(dev['min'])} | {_fmt(dev['max'])} | {dev['n']} | "
            f"{test_text} | {test_ci} | {flags} |{compute_text}"
        )
    if not measures:
        lines += ["", "Compute per cell: not shown (a run without a record of what it computed)."]
    return lines


def _ratio_text(row: dict[str, Any]) -> str:
    ratio = row.get("compute_ratio")
    if not ratio:
        return "-"
    return ", ".join(f"{k} x{v:.2f}" for k, v in ratio.items())


def _unreachable_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What the exact tests cannot show at the table's seed counts: their smallest two-sided p."""
    counts = sorted({len(row["seeds"]) for row in rows})
    lines = []
    for n in counts:
        smallest = array_statistics.smallest_p("sign_flip", n)
        if smallest > ALPHA:
            lines.append(
                f"At {n} seeds the exact two-sided sign-flip and Wilcoxon tests cannot reach {ALPHA}: their "
                f"smallest attainable p is 2/2^{n} = {smallest:.4f}, whatever the differences; the t-test "
                "(continuous) can."
            )
    return lines


def _difference_order(metric: str) -> str:
    if gain_sign(metric) < 0:
        return f"`vs` minus cell (lower {metric} is better: a positive difference is a gain)"
    return "cell minus `vs`"


def _comparison_lines(grid: ml_collections.ConfigDict, report: dict[str, Any]) -> list[str]:
    rows = report["comparisons"]
    family = {test: sum(row[f"{test}_p"] is not None for row in rows) for test in TESTS}
    samples = next((row["bootstrap"]["samples"] for row in rows if row["bootstrap"]), None)
    margin = report["statistics"]["equivalence_margin"]
    tagging = report["objective"] == objectives.WORD_TAGGING.name
    entity_counts = " (from per-sentence entity counts)" if tagging and grid.metric != "accuracy" else ""
    lines = [
        f"Comparisons (grid key `comparisons`: `{grid.get('comparisons', 'baseline')}`; `baseline`: every "
        f"cell against the `{grid.baseline}` cell with the same other axis values), paired by seed; "
        f"differences in {grid.metric} points x100, {_difference_order(grid.metric)}. **valid**: `no` when a "
        "run of either cell is degenerate on dev (its flags are in the cell table): that difference is "
        "struck through and is not a result, whatever its sign.",
        "",
        "**Primary interval: the seed-level paired t-interval** (mean of the per-seed differences [95% "
        "t-interval, n-1 degrees of freedom], scipy.stats), on dev and, where the runs scored it, on test "
        "(nothing is selected on test). Every test is two-sided. Seed-level tests, each Holm-corrected "
        f"within its own family, the comparisons of this table that have it (t-test {family['t_test']}, "
        f"Wilcoxon {family['wilcoxon']}, sign flip {family['sign_flip']}), shown as `raw (Holm)`: paired "
        "t-test; Wilcoxon signed-rank (exact); exact sign-flip permutation test over seeds. Smallest "
        "attainable p at n seeds: t-test 0 (continuous), Wilcoxon and sign flip 2/2^n (0.0625 at 5, 0.25 "
        "at 3), bootstrap 1/B; after Holm over m tests, a test can reach 0.05 only if its smallest p x m "
        "<= 0.05: † marks a p that cannot, at that row's seed count. TOST: two one-sided t-tests that the "
        f"difference lies within ±{100 * margin:.2f} points (grid key `equivalence_margin`); `equivalent` "
        "only at p < 0.05; a non-significant difference is not evidence of no difference. ASO epsilon < "
        "0.5: the cell is better (deepsig, no p).",
        "",
        f"Bootstrap (second interval): two-level, {samples or '-'} resamples of the seeds and then, within "
        "each resampled seed, of its examples (the same examples for both runs of the pair), recomputing "
        f"the reported {grid.metric} on each resample{entity_counts}; percentile 95% interval, `±` its "
        "endpoints' Monte-Carlo standard error; p two-sided, not Holm-corrected, `< 1/B` when no resample "
        "reached 0. With 3-5 seeds a percentile bootstrap over seeds covers less than its nominal 95%: "
        "read the t-interval first.",
        "",
        *(
            [
                "Test is read as dev is: its t-test p Holm-corrected over the table's "
                f"{sum('test' in row for row in rows)} test rows, shown `raw (Holm)`, and TOST at the same "
                "margin.",
                "",
            ]
            if any("test" in row for row in rows)
            else []
        ),
        "| cell | vs | valid | per seed | dev mean [95% t-interval] | t-test p | Wilcoxon p | sign-flip p "
        "| TOST p | ASO eps | bootstrap diff [95% CI] ±MC, p | test mean [95% t-interval], t-test p (Holm) "
        "| test TOST p | test bootstrap | compute ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        per_seed = ", ".join(f"{100 * d:+.2f}" for d in row["per_seed"])
        n = len(row["seeds"])
        mean = t_text(row["t_interval"])
        valid = "yes"
        if not row["valid"]:
            mean = f"~~{mean}~~"
            valid = "no: " + "; ".join(
                f"{side} {_flags_text(flagged, n)}" for side, flagged in row["degenerate"].items() if flagged
            )
        test = row.get("test")
        test_text = test_tost = "-"
        if test is not None:
            p = test["t_interval"]["p_value"]
            p_text = "-" if p is None else f"{p:.3f} ({test['t_test_p_holm']:.3f})"
            test_text = f"{t_text(test['t_interval'])}, {p_text}"
            test_tost = _tost_text(test["tost"])
        lines.append(
            f"| {row['name']} | {row['versus']} | {valid} | {per_seed} | {mean} | "
            + " | ".join(_p_text(row, test) for test in TESTS)
            + f" | {_tost_text(row['tost'])} | {_fmt(row['aso_epsilon'], 3)} | "
            f"{_interval_text(row['bootstrap'])} | {test_text} | {test_tost} | "
            f"{_interval_text(row.get('test_bootstrap'))} | {_ratio_text(row)} |"
        )
    unreachable = _unreachable_lines(rows)
    return lines + (["", *unreachable] if unreachable else []) + _power_lines(rows) + _beside_lines(report)


def _power_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What the table could detect: per split, the smallest true difference a two-sided paired t-test at
    0.05 finds with 80% power at each row's seeds and per-seed SD (median and range over the rows)."""
    found = []
    for split in ("dev", "test"):
        values = [
            (row if split == "dev" else row.get("test", {})).get("detectable_at_80_power")
            for row in rows
            if row["valid"]
        ]
        values = sorted(v for v in values if v is not None)
        if values:
            median = (
                values[len(values) // 2] if len(values) % 2 else sum(values[len(values) // 2 - 1 :][:2]) / 2
            )
            found.append(f"{split} {100 * median:.2f} (rows {100 * values[0]:.2f} to {100 * values[-1]:.2f})")
    if not found:
        return []
    seeds = sorted({len(row["seeds"]) for row in rows})
    return [
        "",
        "Power: the smallest true difference a two-sided paired t-test at 0.05 detects with 80% power, at "
        f"each valid row's {'/'.join(map(str, seeds))} seeds and its per-seed SD (statsmodels TTestPower), "
        f"in points x100, median over the table's rows: {'; '.join(found)}. A smaller effect than its "
        "row's is one this grid would usually miss; a row whose interval holds 0 says nothing about it.",
    ]


def _beside_lines(report: dict[str, Any]) -> list[str]:
    """The comparisons again in each `beside` metric: per seed and t-interval, dev and test."""
    lines = []
    for other in report.get("beside_metrics", []):
        lines += [
            "",
            f"The same comparisons in `{other}` (seed-level t-interval, points x100; the tests above are on "
            "the primary metric only):",
            "",
            f"| cell | vs | dev {other} per seed | dev mean [95% t-interval], p | test {other} per seed "
            "| test mean [95% t-interval], p |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for row in report["comparisons"]:
            shown = row.get("beside", {}).get(other, {})
            cells = []
            for split in ("dev", "test"):
                found = shown.get(split)
                if found is None:
                    cells += ["-", "-"]
                    continue
                p = found["t_interval"]["p_value"]
                cells += [
                    ", ".join(f"{100 * d:+.2f}" for d in found["per_seed"]),
                    f"{t_text(found['t_interval'])}, {'-' if p is None else f'{p:.3f}'}",
                ]
            lines.append(f"| {row['name']} | {row['versus']} | " + " | ".join(cells) + " |")
    return lines


def _paper_lines(grid: ml_collections.ConfigDict, report: dict[str, Any]) -> list[str]:
    gains = report["paper_results"]
    beside = report.get("beside_metrics", [])
    lines = [
        "Paper layout: the gain that the paper reports for each comparison (grid key `paper_results`, its "
        "source in the grid config; `not found`: the paper gives no number for it) beside the measured "
        f"gain in {grid.metric} points x100, mean over seeds [95% seed-level t-interval]. The paper's own "
        "contrasts (`comparisons` named in the grid config) come first. The seed-level interval is "
        "conditional on the test items; beside it, the two-level bootstrap (seeds, then test items) also "
        "covers their sampling.",
        "",
        "| cell | vs | paper gain | measured gain, dev [95% t-interval] | measured gain, test [95% "
        "t-interval] | test, two-level bootstrap [95%] | valid |"
        + "".join(f" {other}: dev, test [95% t-interval] |" for other in beside),
        "| --- | --- | --- | --- | --- | --- | --- |" + " --- |" * len(beside),
    ]
    rows = sorted(report["comparisons"], key=lambda row: not row["configured"])
    for row in rows:
        paper = gains.get(f"{row['name']} vs {row['versus']}")
        paper_text = "not found"
        if paper is not None:
            paper_text = f"{paper['gain']:+.2f}" + (f" ({paper['note']})" if paper["note"] else "")
        test = row.get("test")
        test_text = "-" if test is None else t_text(test["t_interval"])
        beside_text = "".join(
            " "
            + ", ".join(
                t_text(row.get("beside", {}).get(other, {}).get(s, {}).get("t_interval"))
                for s in ("dev", "test")
            )
            + " |"
            for other in beside
        )
        lines.append(
            f"| {row['name']} | {row['versus']} | {paper_text} | {t_text(row['t_interval'])} | {test_text} | "
            f"{_interval_text(row.get('test_bootstrap'), with_p=False)} | {'yes' if row['valid'] else 'no'} |"
            + beside_text
        )
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


def _parameter_lines(report: dict[str, Any]) -> list[str]:
    lines = [
        "What each phase trained (results.json `phases[i].parameters`): parameters given a learning rate, "
        "of the model's total (the encoder with any adaptation parameters, and the head).",
        "",
        "| cell | trained per phase | model total |",
        "| --- | --- | --- |",
    ]
    for row in report["trained_parameters"]:
        trained = "; ".join(
            f"{p['phase']} {p['trained']:,} ({100 * p['trained'] / p['total']:.2f}%)" for p in row["phases"]
        )
        lines.append(f"| {row['name']} | {trained} | {row['phases'][-1]['total']:,} |")
    return lines


def _matched_lines(report: dict[str, Any]) -> list[str]:
    lines = [
        "Matched budgets (grid key `matched`, experiments/budgets.py): each matched cell runs the step "
        "count at which it costs what its compared cell plans to cost when it runs alone (its whole step "
        "budgets and its own feature-cache build; a rule `<unit>.no_cache`: the same budgets with no "
        "feature cache, each frozen step running the backbone forward), fixed before either runs. In a "
        "grid, runs that read a feature cache another run built are charged nothing for it, so the "
        "compared cell's realized cost (the compute table) can be lower than the plan the matched cell got. "
        "A FLOPs budget counts every head's FLOPs (models/flops.py), or, in a cell planned before every "
        "head had its count (grid key `matched_light_heads`), the light heads' alone (cls_mlp, linear, "
        "token_mlp; every other head 0), the steps it ran: the column `heads counted` says which. The "
        "realized cost counts every head.",
        "",
        "| matched cell | rule | heads counted | compared cell | its planned budget | matched steps | "
        "its realized cost |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["matched_budgets"]:
        realized = row["compared_realized"]
        heads = _HEADS_COUNTED.get(row.get("head_flops", ""), row.get("head_flops") or "-")
        lines.append(
            f"| {row['name']} | {row['rule']} | {heads} | {row['compared']} | {row['planned_budget']:.4g} | "
            f"{row['steps']:.0f} | {'-' if realized is None else f'{realized:.4g}'} |"
        )
    return lines


_HEADS_COUNTED = {"every": "every head", "light": "light heads only"}  # matched_budget.head_flops


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


def _boundary_lines(report: Mapping[str, Any], metric: str) -> list[str]:
    """The frozen-backbone phases' boundary table. Its "dev" columns are the split the runs' gap rule read:
    the selection slice where they held one out (data.selection_fraction), which the labels then say."""
    read = "selection" if any(SELECTION in row["final"] for row in report["runs"]) else "dev"
    at_dev = "" if read == "dev" else ", on dev"
    floor, gap = report["majority_in_metric"], f"train_dev_gap_{metric}"
    beside = report.get("beside_metrics", [])
    scored = [f"{kind}{m}" for m in beside for kind in ("dev_", "train_dev_gap_")]
    lines = [
        "At the end of each frozen-backbone phase (mean ± std over seeds): its steps; how many of the "
        f"cell's runs a stop rule (train/{read} gap, patience) ended (one that fires at the budget's last "
        "step counts, though it ended the phase no sooner); the head's "
        f"{read} {metric}, and how many runs ended the phase with it at or below always predicting the "
        f"majority label ({_fmt(floor)}{at_dev}): a head that has not learned the task is not "
        "overfitting, so a gap rule that stopped it there fired on the noise of its train subset; the "
        f"head's parameter norm, {read} expected calibration error, and train-subset minus {read} {metric}"
        + (
            f"; and {read} and train - {read} in {', '.join(beside)}: each as the run recorded it at the "
            "boundary (`-`: not recorded; runs from before conlleval's F1 recorded strict F1 only)."
            if beside
            else "."
        ),
        "",
        f"| cell | phase | steps | stopped by a rule | {read} {metric} | at or below majority | head norm "
        f"| {read} ECE | train - {read} {metric} |"
        + "".join(
            f" {m.replace('train_dev_gap_', f'train - {read} ').replace('dev_', f'{read} ', 1)} |"
            for m in scored
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |" + " --- |" * len(scored),
    ]
    for row in report["boundaries"]:
        shown = {
            m: f"{_fmt(row[m]['mean'], 3)} ± {_fmt(row[m]['std'], 3)}" if m in row else "-"
            for m in ("steps", f"dev_{metric}", "head_param_norm", "dev_ece", gap, *scored)
        }
        at_floor = "-" if row["head_at_floor"] is None else f"{row['head_at_floor']}/{row['n']}"
        lines.append(
            f"| {row['name']} | {row['phase']} | {shown['steps']} | {row['stopped_by_rule']}/{row['n']} "
            f"| {shown[f'dev_{metric}']} | {at_floor} | {shown['head_param_norm']} | {shown['dev_ece']} "
            f"| {shown[gap]} |" + "".join(f" {shown[m]} |" for m in scored)
        )
    return lines


def render(grid: ml_collections.ConfigDict, report: dict[str, Any]) -> str:
    """report.md of report.build_report's report."""
    metric = grid.metric
    lines = [
        "# Experiment report",
        "",
        f"Base config `{grid.base}`; axes `{grid.axes}`"
        + (f" less the cells `{grid.exclude_cells}`" if grid.get("exclude_cells") else "")
        + f"; seeds 0-{grid.num_seeds - 1}; baseline "
        f"`{grid.baseline}`; metric `{metric}` on dev (and test where the runs scored one), of the "
        f"parameters each run's `final_params` names ({', '.join(sorted(report['final_params']))}).",
        "",
        *_cell_lines(metric, report),
        *conventions_line(report, metric),
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
    if report.get("trained_parameters"):
        lines += ["", *_parameter_lines(report)]
    if report.get("matched_budgets"):
        lines += ["", *_matched_lines(report)]
    if report.get("budget_curves"):
        lines += ["", *budget_curves.lines(report, grid.metric)]
    lines += _reuse_lines(report)
    if report["boundaries"]:
        lines += ["", *_boundary_lines(report, metric)]
    lines += ["", "Figures: `figures/metric_by_cell.png`, `figures/dev_curves.png` (seed 0)."]
    if report.get("rescored_runs"):
        lines[-1] += (
            f" {report['rescored_runs']} runs were rescored from their prediction files after they ran "
            "(results.json `rescored`): their final scores are as the tables show; their dev curves and "
            "boundary scores are as logged during training, strict IOB2 entity F1."
        )
    return "\n".join(lines) + "\n"

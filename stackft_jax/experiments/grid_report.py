"""The report of a finished grid (grid.py, the command experiment.py): what the paper's single numbers lacked.

  per cell        mean, std, min, max and a 95% t-interval over seeds of the grid's `metric` on dev and,
                  beside it, on test when the runs scored a test file (of the same parameters,
                  `final_params`); how many of its runs are degenerate, flag by flag (degenerate.py)
  comparisons     the grid's `comparisons` (cells.comparisons_of: any two cells; by default every cell
                  against the baseline cell with the same other axis values), paired by seed: the
                  per-seed differences in `metric` and, first, their 95% seed-level t-interval and
                  two-sided p (dev; test beside it where both sides scored it); Wilcoxon signed-rank and
                  an exact two-sided sign-flip test over seeds, each Holm-corrected across the table
                  (statsmodels), with each test's smallest attainable p at its seed count; TOST at the
                  grid's `equivalence_margin`; almost stochastic order (deepsig: Dror et al. 2019,
                  epsilon < 0.5 means the cell is better); a two-level paired bootstrap (seeds, then
                  examples) of `metric` itself, recomputed from the saved per-example predictions, with
                  its endpoints' Monte-Carlo error (statistics.py); the two cells' compute ratio
                  (training/compute.py). A comparison by or against a cell with a
                  degenerate run is marked not `valid`: it is no evidence either way
  ensembles       the grid's `ensembles`, built from the finished runs (ensemble.py, equal weights) and
                  written to WORKDIR/ensembles/<cell>-seed<k>/, are cells of their own in the table, the
                  comparisons and metric_by_cell.png (an axis value `a+b`); they have no dev curve
  majority class  accuracy of always predicting the most frequent dev label (tag, for tagging), from
                  the parsed labels of the prediction files; each run's task (classification,
                  regression, tagging) is its resolved spec's (grid.run_spec), never guessed from them
  costs           per cell: train steps, training examples seen and wall seconds (results.json)
  compute         per cell, the mean over seeds of the totals training/compute.py's run_compute gives
                  (none for runs whose record lacks its config)
  matched budgets per matched-budget cell (budgets.py): the compared cell's planned cost alone that it
                  was given, its steps, and the compared cell's realized cost in the grid
  paper layout    the paper's reported gain per comparison (the grid's optional `paper_results`,
                  "<cell> vs <cell>: <gain in points> (note); ...") beside the measured gain and its
                  t-interval, dev and test
  boundaries      per cell and frozen-backbone phase, what its end recorded: head parameter norm, dev
                  ECE, train/dev gap (mean and std over seeds)
  figures         figures/metric_by_cell.png (means with intervals), figures/dev_curves.png (dev metric
                  against global step, phase boundaries dashed): figures.py

Everything is read from files small enough to commit per run: results.json, predictions/{dev,test}.jsonl,
metrics.jsonl (and timings.json); no checkpoint. Written to WORKDIR/report.md (markdown.py) and
WORKDIR/report.json.
"""

import collections
import dataclasses
import functools
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

from stackft_jax.config import config_cli, phases
from stackft_jax.data.task_spec import TaskSpec
from stackft_jax.experiments import budget_curves, budgets, ensembling, figures, markdown
from stackft_jax.experiments import statistics as array_statistics
from stackft_jax.experiments.cells import (
    Run,
    comparisons_of,
    ensembles_of,
    gain_sign,
    paper_results,
    report_settings,
    runs_of,
)
from stackft_jax.experiments.grid import EXAMPLES, REUSED_FROM, check_ensembles, run_spec
from stackft_jax.models import objectives
from stackft_jax.runtime import records
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.training import compute, degenerate, prediction_files, workdirs
from stackft_jax.training.run_report import json_safe

ASO_ITERATIONS = 1000  # deepsig's default; each costs a few ms


@dataclasses.dataclass(frozen=True)
class RunResult:
    run: Run
    results: dict[str, Any]
    folder: Path  # results.json and predictions/: the run's workdir, or the ensemble's folder
    metrics_file: Path | None  # None for an ensemble: no dev curve
    task: TaskSpec  # the run's task, configured (its spec; an ensemble's members')

    @property
    def dev_predictions(self) -> Path:
        return prediction_files.path(self.folder, "dev")

    @functools.cached_property  # build_report asks twice per run
    def reused_from(self) -> str | None:
        """The other grid's run this one was copied from (grid.reuse_run), or None: trained here."""
        file = self.folder / REUSED_FROM
        if not file.is_file():
            return None
        return records.read_json(file, f"copy the run again (delete {self.folder})", keys=("source",))[
            "source"
        ]

    def score(self, split: str, metric: str) -> float | None:
        value = self.results["final"].get(split, {}).get(metric)
        return None if value is None else float(value)

    @functools.cached_property  # every comparison with this run's cell asks again
    def compute_totals(self) -> dict[str, float] | None:
        """Its training compute's totals (`total.flops`, ...: training/compute.py run_compute) and its
        standalone FLOPs (`standalone.own_cache.flops`, `standalone.no_cache.flops`), or None."""
        found = compute.run_compute(self.folder)
        if found is None:
            return None
        standalone = {kind: {"flops": cost["flops"]} for kind, cost in found.get("standalone", {}).items()}
        return _numeric_leaves({"total": found["total"], "standalone": standalone})

    @functools.cached_property
    def _records(self) -> dict[str, list[dict[str, Any]]]:
        files = {split: prediction_files.path(self.folder, split) for split in self.results["final"]}
        return {
            split: list(prediction_files.read(file).values())
            for split, file in files.items()
            if file.is_file()
        }

    def degenerate(self, split: str) -> list[str]:
        """The split's degenerate flags, recomputed from its prediction file (ensembles and runs from
        before results.json held them are judged the same way); [] when it was not scored."""
        records = self._records.get(split)
        return (
            []
            if records is None
            else degenerate.flags(records, self.results["final"][split], self.task.objective.name)
        )


def load_runs(grid: ml_collections.ConfigDict, workdir: str | Path) -> list[RunResult]:
    """Every run of the grid, read back with its resolved spec's task; a missing or unfinished run is an
    error naming it."""

    loaded = []
    for run in runs_of(grid):
        run_dir = Path(workdir) / "runs" / run.name
        results_file = run_dir / "results.json"
        if not results_file.exists():
            raise FileNotFoundError(f"{results_file}: run {run.name} has not finished; rerun the grid")
        results = records.read_json(
            results_file, records.RERUN_RESULTS.format(workdir=run_dir), keys=("final",)
        )
        resolved = run_spec(grid, run, recorded=True)
        task = resolved.task  # the report needs no data file
        changes = workdirs.input_changes(run_dir, resolved)
        if changes:  # its scores are not comparable with the baseline of the files now
            raise workdirs.ConfigMismatch(
                f"grid run {run.name}: {changes[0]}; its results come from the old content: restore it, "
                "or rerun the grid with --allow_config_change to retrain such runs"
            )
        loaded.append(RunResult(run, results, run_dir, run_dir / "metrics.jsonl", task))
    return loaded


def _write_ensemble(out: Path, ensembled: dict[str, Any]) -> None:
    # Staged beside and renamed into place file by file: two shards finishing at once may both write it.
    # Its predictions compact, as the grid's runs' are (committed with them), their examples the runs'.
    staging = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    ensembling.write(staging, ensembled)
    prediction_files.compact(staging, out.parent.parent / EXAMPLES)
    for file in sorted(f for f in staging.rglob("*") if f.is_file()):
        target = out / file.relative_to(staging)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(file, target)
        if target.parent.name == "predictions":
            prediction_files.drop_other_forms(target)  # the form an older report wrote
    shutil.rmtree(staging)


def build_ensembles(grid: ml_collections.ConfigDict, workdir: str | Path) -> list[RunResult]:
    """Every ensemble of the grid, built from its finished members and written (again, the same) to
    WORKDIR/ensembles/<cell>-seed<k>/; read back as runs of their own cells."""
    workdir = Path(workdir)
    ensembles = ensembles_of(grid)
    specs = {m: run_spec(grid, m, recorded=True) for e in ensembles for m in e.members}
    check_ensembles(grid, ensembles, specs)
    built = []
    for e in ensembles:
        try:
            ensembled = ensembling.ensemble([workdir / "runs" / m.name for m in e.members])
        except ensembling.EnsembleError as error:
            raise ConfigError(f"grid ensemble {e.run.name}: {error}") from None
        out = workdir / "ensembles" / e.run.name
        _write_ensemble(out, ensembled)
        results = {"final": ensembled["ensemble"], "members": [m.name for m in e.members]}
        built.append(RunResult(e.run, results, out, None, specs[e.members[0]].task))
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


def _by_type(members: list[RunResult], split: str, metric: str) -> dict[str, dict[str, float]]:
    """The metric per type, mean and std over the cell's runs, where the runs score one (`f1_PER`, ...:
    entity F1 per entity type for tagging); {} otherwise."""
    prefix = f"{metric}_"
    finals = [m.results["final"].get(split, {}) for m in members]
    types = sorted({key[len(prefix) :] for final in finals for key in final if key.startswith(prefix)})
    by_type = {}
    for kind in types:
        values = [float(f[prefix + kind]) for f in finals if prefix + kind in f]
        if len(values) == len(finals):
            interval = _interval(values)
            by_type[kind] = {"mean": interval["mean"], "std": interval["std"]}
    return by_type


def _runs_by_cell(runs: list[RunResult]) -> dict[tuple, list[RunResult]]:
    """The runs of each cell, cells in the order their first run comes."""
    by_cell: dict[tuple, list[RunResult]] = collections.defaultdict(list)
    for r in runs:
        by_cell[r.run.cell].append(r)
    return by_cell


def beside_metrics(runs: list[RunResult], metric: str) -> tuple[str, ...]:
    """The scores the report shows beside `metric` (TaskSpec.beside_metrics: CoNLL's strict IOB2 F1
    beside conlleval's), those the runs recorded."""
    wanted = runs[0].task.beside_metrics.get(metric, ()) if runs else ()
    return tuple(m for m in wanted if all(m in r.results["final"].get("dev", {}) for r in runs))


def _cell_intervals(members: list[RunResult], split: str, metric: str) -> dict[str, Any] | None:
    scores = (m.score(split, metric) for m in members)
    values = [v for v in scores if v is not None and math.isfinite(v)]
    return _interval(values) if values else None


def cell_statistics(runs: list[RunResult], metric: str, beside: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    by_cell = _runs_by_cell(runs)
    cells = []
    for cell, members in by_cell.items():
        entry: dict[str, Any] = {"cell": dict(cell), "name": members[0].run.cell_name, "runs": len(members)}
        for split in ("dev", "test"):
            interval = _cell_intervals(members, split, metric)
            if interval is not None:
                entry[split] = interval
            for other in beside:
                interval = _cell_intervals(members, split, other)
                if interval is not None:
                    entry.setdefault("beside", {}).setdefault(other, {})[split] = interval
            by_type = _by_type(members, split, metric)
            if by_type:
                entry[f"{split}_by_type"] = by_type
            flagged = _flag_counts(members, split)
            if flagged:
                entry.setdefault("degenerate", {})[split] = flagged
        cells.append(entry)
    return cells


COST_MEASURES = ("train_steps", "examples_seen", "wall_time_s")
TIMINGS_FILE = "timings.json"  # timing.FILE_NAME; importing timing would start jax


def _cost(r: RunResult, by_name: dict[str, RunResult]) -> dict[str, float] | None:
    """What one run cost (results.json; timings.json's total for the wall time of runs from before
    results.json kept it); an ensemble costs its members together."""
    if "members" in r.results:
        parts = [_cost(by_name[name], by_name) for name in r.results["members"]]
        return None if None in parts else {m: sum(part[m] for part in parts) for m in COST_MEASURES}
    results = r.results
    steps = results.get("train_steps", sum(phase["steps"] for phase in results["phases"]))
    examples = results.get("examples_seen")
    if examples is None and "global_batch_size" in results:
        examples = steps * results["global_batch_size"]
    wall = results.get("wall_time_s")
    timings = r.folder / TIMINGS_FILE
    if wall is None and timings.is_file():
        wall = records.read_json(timings, records.RERUN_RESULTS.format(workdir=r.folder), keys=("total_s",))[
            "total_s"
        ]
    if examples is None or wall is None:
        return None
    return {"train_steps": steps, "examples_seen": examples, "wall_time_s": wall}


def cost_statistics(runs: list[RunResult], ensembles: list[RunResult]) -> list[dict[str, Any]]:
    """Per cell, the mean over seeds of train steps, training examples seen and wall seconds (training
    and evaluation, every process lifetime), and their sum over seeds."""
    by_name = {r.run.name: r for r in runs}
    by_cell: dict[tuple, list[dict]] = collections.defaultdict(list)
    names = {}
    for r in runs + ensembles:
        cost = _cost(r, by_name)
        names[r.run.cell] = r.run.cell_name
        if cost is not None:
            by_cell[r.run.cell].append(cost)
    rows = []
    for cell, costs in by_cell.items():
        row: dict[str, Any] = {"cell": dict(cell), "name": names[cell], "n": len(costs)}
        for measure in COST_MEASURES:
            row[measure] = {"mean": statistics.mean(c[measure] for c in costs),
                            "total": sum(c[measure] for c in costs)}  # fmt: skip
        rows.append(row)
    return rows


BOUNDARY_MEASURES = ("head_param_norm", "dev_ece")


def boundary_statistics(
    runs: list[RunResult], metric: str, floor: float | None, beside: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Per cell and frozen-backbone phase, mean and std over seeds of what its boundary recorded
    (boundaries.measure): head parameter norm, dev ECE, dev `metric`, train/dev gap in `metric`; and
    counts of the runs whose phase a rule stopped (`stopped_by_rule`, at its last step too) and whose head
    left the phase with dev `metric` at or below `floor`, the majority class's (`head_at_floor`: a stop
    rule that fires there fired on noise, not on overfitting). The `beside` metrics' dev score and gap too,
    where the boundary recorded them (runs from before CoNLL's conlleval F1 recorded strict F1 only)."""
    by_phase: dict[tuple, list[dict]] = collections.defaultdict(list)
    names = {}
    for r in runs:
        for phase in r.results["phases"]:
            if "boundary" in phase:
                by_phase[(r.run.cell, phase["phase"])].append(
                    {
                        **phase["boundary"],
                        "steps": phase["steps"],
                        **{f"dev_{m}": phase["boundary"].get("dev", {}).get(m) for m in (metric, *beside)},
                        "stopped_by_rule": phase.get("stop_reason", phases.budget_reason(phase["steps"]))
                        != phases.budget_reason(phase["steps"]),
                    }
                )
                names[r.run.cell] = r.run.cell_name
    rows = []
    for (cell, phase), boundaries in by_phase.items():
        row: dict[str, Any] = {"cell": dict(cell), "name": names[cell], "phase": phase, "n": len(boundaries)}
        scored = [f"{kind}{m}" for m in (metric, *beside) for kind in ("dev_", "train_dev_gap_")]
        for measure in (*BOUNDARY_MEASURES, *scored, "steps"):
            values = [b[measure] for b in boundaries if b.get(measure) is not None]
            if values:
                interval = _interval(values)
                row[measure] = {key: interval[key] for key in ("n", "mean", "std")}
        row["stopped_by_rule"] = sum(b["stopped_by_rule"] for b in boundaries)
        dev = [b[f"dev_{metric}"] for b in boundaries if b[f"dev_{metric}"] is not None]
        row["head_at_floor"] = (
            None if floor is None or not dev else sum(degenerate.at_or_below(d, floor) for d in dev)
        )
        rows.append(row)
    return rows


TESTS = array_statistics.SEED_TESTS
ALPHA = 0.05


def _flag_counts(runs: list[RunResult], split: str) -> dict[str, int]:
    """How many of the runs raise each degenerate flag on `split` (degenerate.py)."""
    counts = collections.Counter(flag for r in runs for flag in r.degenerate(split))
    return {flag: counts[flag] for flag in degenerate.FLAGS if counts[flag]}


def _paired_counts(
    ours: list[RunResult], theirs: list[RunResult], split: str, metric: str
) -> tuple[np.ndarray, np.ndarray, Any] | None:
    """Per-example counts of `metric` [seeds, examples, k] of both sides, paired by example key, and the
    metric of their totals; None when a side has no labelled `split` predictions or the metric is no
    function of sums (array_statistics.example_counts)."""
    cell_counts, baseline_counts, metric_of_totals = [], [], None
    for a, b in zip(ours, theirs, strict=True):
        files = [prediction_files.path(r.folder, split) for r in (a, b)]
        if not all(f.is_file() for f in files):
            return None
        pairs = prediction_files.paired(*files)
        if "label" not in pairs[0][0]:
            return None
        tagging = a.task.objective is objectives.WORD_TAGGING
        x = array_statistics.example_counts([r for r, _ in pairs], metric, tagging=tagging)
        y = array_statistics.example_counts([r for _, r in pairs], metric, tagging=tagging)
        if x is None or y is None:
            return None
        cell_counts.append(x.counts)
        baseline_counts.append(y.counts)
        metric_of_totals = x.metric
    return np.stack(cell_counts), np.stack(baseline_counts), metric_of_totals


def _bootstrap(
    ours: list[RunResult], theirs: list[RunResult], split: str, metric: str, samples: int
) -> dict | None:
    paired = _paired_counts(ours, theirs, split, metric)
    if paired is None:
        return None
    return array_statistics.two_level_bootstrap(*paired, samples=samples)


def _seed_tests(ours: list[float], theirs: list[float], aso_iterations: int, margin: float) -> dict[str, Any]:
    """The seed-level statistics of one comparison, all two-sided: the t-interval (primary) and its p,
    Wilcoxon, the exact sign flip, TOST at `margin`, and ASO."""
    from deepsig import aso

    differences = [a - b for a, b in zip(ours, theirs, strict=True)]
    interval = array_statistics.t_interval(differences)
    tests: dict[str, Any] = {f"{t}_p": None for t in TESTS} | {"aso_epsilon": None}
    tests["t_interval"] = interval
    tests["tost"] = array_statistics.tost(differences, margin)
    # Seed-level tests need pairs: one seed would give Wilcoxon p = 1 and ASO 0 (not evidence).
    if len(ours) < 2:
        return tests
    tests["t_test_p"] = interval["p_value"]
    if any(differences):
        tests["wilcoxon_p"] = float(scipy.stats.wilcoxon(ours, theirs).pvalue)
        tests["sign_flip_p"] = array_statistics.sign_flip_test(differences, "two-sided")
    tests["aso_epsilon"] = float(
        aso(ours, theirs, seed=0, show_progress=False, num_bootstrap_iterations=aso_iterations)
    )
    return tests


def _run_compute(r: RunResult, by_name: dict[str, RunResult]) -> dict[str, float] | None:
    """What one run computed, as training/compute.py's run_compute reads it from the run's record: its
    totals (`total.flops`, `total.examples_forward`, ...); an ensemble computes its members together.
    None where it finds nothing."""
    if "members" in r.results:
        parts = [_run_compute(by_name[name], by_name) for name in r.results["members"]]
        if not parts or None in parts:
            return None
        return {k: sum(part[k] for part in parts) for k in set.intersection(*(set(p) for p in parts))}
    return r.compute_totals


def _numeric_leaves(tree: Any, prefix: str = "") -> dict[str, float]:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _numeric_leaves(sub, f"{prefix}{key}.").items()}
    if isinstance(tree, (int, float)) and not isinstance(tree, bool):
        return {prefix[:-1]: float(tree)}
    return {}


def _mean_compute(runs: list[RunResult], by_name: dict[str, RunResult]) -> dict[str, float] | None:
    computes = [_run_compute(r, by_name) for r in runs]
    if not computes or None in computes:
        return None
    keys = sorted(set.intersection(*(set(c) for c in computes)))
    return {k: statistics.mean(c[k] for c in computes) for k in keys}


def parameter_statistics(runs: list[RunResult]) -> list[dict[str, Any]]:
    """Per cell, how many parameters each phase trained and how many the model has (results.json
    `phases[i].parameters`; the same at every seed), from the cell's first run that recorded them: a cell
    whose runs predate the record is left out."""
    rows: dict[str, dict[str, Any]] = {}
    for r in runs:
        counted = [
            {"phase": p["phase"], **p["parameters"]} for p in r.results.get("phases", []) if "parameters" in p
        ]
        if counted and r.run.cell_name not in rows:
            rows[r.run.cell_name] = {"cell": dict(r.run.cell), "name": r.run.cell_name, "phases": counted}
    return list(rows.values())


def matched_budget_statistics(runs: list[RunResult]) -> list[dict[str, Any]]:
    """Per matched-budget cell (budgets.py), the budget it was given: the compared cell's planned cost
    alone (whole step budgets, its own feature-cache build) in the rule's unit, and the steps that bought
    it (means over seeds), beside the compared cell's realized cost in that unit (compute.py: a run that
    read a shared cache another run built is charged nothing for it), and which heads its FLOPs budget
    counted (`head_flops`: every | light, "" for another rule; a run recorded before the key: light,
    config_cli.with_legacy_keys). From results.json's `config.matched_budget`."""
    by_cell = _runs_by_cell(runs)
    rows = []
    for cell, members in by_cell.items():
        matched = members[0].run.matched
        if matched is None:
            continue
        recorded = [config_cli.with_legacy_keys(m.results["config"])["matched_budget"] for m in members]
        compared_cell = tuple((k, matched.compared if k == matched.key else v) for k, v in cell)
        realized = _mean_compute(by_cell.get(compared_cell, []), {}) or {}
        rows.append(
            {
                "cell": dict(cell),
                "name": members[0].run.cell_name,
                "rule": matched.rule_text,
                "head_flops": "+".join(sorted({b.get("head_flops", "") for b in recorded})),
                "compared": Run(compared_cell, 0).cell_name,
                "planned_budget": statistics.mean(float(b["budget"]) for b in recorded),
                "steps": statistics.mean(m.results["train_steps"] for m in members),
                "compared_realized": realized.get(f"total.{budgets.RULES[matched.rule]}"),
            }
        )
    return rows


def compute_statistics(runs: list[RunResult], ensembles: list[RunResult]) -> list[dict[str, Any]]:
    """Per cell, the mean over seeds of each total run_compute gives."""
    by_name = {r.run.name: r for r in runs}
    rows = []
    for cell, members in _runs_by_cell(runs + ensembles).items():
        mean = _mean_compute(members, by_name)
        if mean is not None:
            rows.append({"cell": dict(cell), "name": members[0].run.cell_name, "compute": mean})
    return rows


def _compute_ratio(
    ours: list[RunResult], theirs: list[RunResult], by_name: dict[str, RunResult]
) -> dict | None:
    """Each compute measure of the cell over the other's (means over the paired seeds); None without."""
    a, b = _mean_compute(ours, by_name), _mean_compute(theirs, by_name)
    if a is None or b is None:
        return None
    return {k: a[k] / b[k] for k in sorted(a.keys() & b.keys()) if b[k]}


def _split_statistics(
    ours_runs: list[RunResult], theirs_runs: list[RunResult], split: str, metric: str, margin: float
) -> dict[str, Any] | None:
    """A comparison's per-seed differences in `metric` on `split`, their t-interval and two-sided p,
    TOST at `margin` and the smallest difference the t-test detects at 80% power; None when a run of
    either side did not score it."""
    scores = [
        (a.score(split, metric), b.score(split, metric)) for a, b in zip(ours_runs, theirs_runs, strict=True)
    ]
    if not scores or any(a is None or b is None for a, b in scores):
        return None
    differences = [gain_sign(metric) * (a - b) for a, b in scores]
    return {
        "per_seed": differences,
        "mean_difference": statistics.mean(differences),
        "t_interval": array_statistics.t_interval(differences),
        "tost": array_statistics.tost(differences, margin),
        "detectable_at_80_power": array_statistics.minimum_detectable_difference(differences),
    }


def _holm(rows: list[dict[str, Any]], p_of: Any, write: Any) -> None:
    """Holm over the rows whose p (`p_of(row)`) exists, each corrected p handed to `write(row, p)`."""
    tested = [row for row in rows if p_of(row) is not None]
    for row, p in zip(tested, array_statistics.holm([p_of(row) for row in tested]), strict=True):
        write(row, p)


def comparisons(
    runs: list[RunResult],
    grid: ml_collections.ConfigDict,
    *,
    aso_iterations: int = ASO_ITERATIONS,
    beside: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The grid's comparisons (cells.comparisons_of: its `comparisons`, by default every cell against its
    baseline cell), paired by seed: the reported metric's per-seed differences, the seed-level
    t-interval and two-sided tests, TOST, a two-level bootstrap (dev; test when both sides scored it),
    and the compute ratio where training/compute.py gives one; on test, its t-test p Holm-corrected over
    the table's test rows and TOST, as on dev; each split's smallest difference detectable at 80% power;
    the `beside` metrics' t-intervals. A comparison by or against a cell with a degenerate run is not
    `valid`."""
    settings = report_settings(grid)
    samples, margin = settings.bootstrap_samples, settings.equivalence_margin
    by_cell_seed = {(r.run.cell, r.run.seed): r for r in runs}
    by_name = {r.run.name: r for r in runs}
    rows = []
    for comparison in comparisons_of(grid):
        cell, other = comparison.cell, comparison.other
        seeds = sorted(s for (c, s) in by_cell_seed if c == cell and (other, s) in by_cell_seed)
        # A seed whose metric is undefined on either side (F1 without gold positives) pairs nothing.
        seeds = [
            s
            for s in seeds
            if None not in (by_cell_seed[c, s].score("dev", grid.metric) for c in (cell, other))
        ]
        if not seeds:  # nothing to pair: the cell table shows its metric as undefined
            continue
        ours_runs = [by_cell_seed[cell, s] for s in seeds]
        theirs_runs = [by_cell_seed[other, s] for s in seeds]
        # Signed so that a gain is positive (a lower loss): the differences, ASO's direction.
        ours = [gain_sign(grid.metric) * r.score("dev", grid.metric) for r in ours_runs]
        theirs = [gain_sign(grid.metric) * r.score("dev", grid.metric) for r in theirs_runs]
        differences = [a - b for a, b in zip(ours, theirs, strict=True)]
        flagged = {"cell": _flag_counts(ours_runs, "dev"), "baseline": _flag_counts(theirs_runs, "dev")}
        row: dict[str, Any] = {
            "name": ours_runs[0].run.cell_name,
            "versus": theirs_runs[0].run.cell_name,
            "configured": comparison.configured,
            "cell": dict(cell),
            "baseline": dict(other),
            "seeds": seeds,
            "per_seed": differences,
            "mean_difference": statistics.mean(differences),
            "degenerate": flagged,
            "valid": not flagged["cell"] and not flagged["baseline"],
            **_seed_tests(ours, theirs, aso_iterations, margin),
            "detectable_at_80_power": array_statistics.minimum_detectable_difference(differences),
            "bootstrap": _bootstrap(ours_runs, theirs_runs, "dev", grid.metric, samples),
        }
        for other in beside:
            splits = {s: _split_statistics(ours_runs, theirs_runs, s, other, margin) for s in ("dev", "test")}
            row.setdefault("beside", {})[other] = {
                s: {"per_seed": found["per_seed"], "t_interval": found["t_interval"]}
                for s, found in splits.items()
                if found is not None
            }
        test = _split_statistics(ours_runs, theirs_runs, "test", grid.metric, margin)
        if test is not None:
            row["test"] = test
            row["test_mean_difference"] = test["mean_difference"]
            row["test_bootstrap"] = _bootstrap(ours_runs, theirs_runs, "test", grid.metric, samples)
        ratio = _compute_ratio(ours_runs, theirs_runs, by_name)
        if ratio is not None:
            row["compute_ratio"] = ratio
        rows.append(row)
    _holm(
        [row["test"] for row in rows if "test" in row],
        lambda test: test["t_interval"]["p_value"],
        lambda test, p: test.__setitem__("t_test_p_holm", p),
    )
    for test in TESTS:
        tested = [row for row in rows if row[f"{test}_p"] is not None]
        _holm(
            tested,
            lambda row, test=test: row[f"{test}_p"],
            lambda row, p, test=test: row.__setitem__(f"{test}_p_holm", p),
        )
        for row in rows:  # what the test could show at this row's seed count, in this Holm family
            n = len(row["seeds"])
            row.setdefault("smallest_p", {})[test] = array_statistics.smallest_p(test, n)
            row.setdefault("can_reach_alpha", {})[test] = array_statistics.can_reach(
                test, n, max(1, len(tested)), alpha=ALPHA
            )
    return rows


def majority_floor(run: RunResult, metric: str) -> tuple[float | None, float | None]:
    """Always predicting the most frequent dev label (tagging: tag), from the parsed labels of the run's
    dev predictions: its accuracy (the floor degenerate.py flags runs against) and the report's `metric`
    of it, the same floor in the unit the table shows (all-`O` entity F1 is 0); (None, None) for
    regression, and None for a metric that is no function of counts."""
    if run.task.objective is objectives.REGRESSION:
        return None, None
    tagging = run.task.objective is objectives.WORD_TAGGING
    records = list(prediction_files.read(run.dev_predictions).values())
    labels = [tag for r in records for tag in (r["label"] if tagging else [r["label"]])]
    majority = collections.Counter(labels).most_common(1)[0][0]
    constant = [{**r, "prediction": [majority] * len(r["label"]) if tagging else majority} for r in records]
    counts = array_statistics.example_counts(constant, metric, tagging=tagging)
    return degenerate.majority_share(labels), None if counts is None else array_statistics.metric_of(counts)


def build_report(
    grid: ml_collections.ConfigDict, workdir: str | Path, *, aso_iterations: int = ASO_ITERATIONS
) -> dict[str, Any]:
    runs = load_runs(grid, workdir)
    ensembles = build_ensembles(grid, workdir)
    majority, floor = majority_floor(runs[0], grid.metric)
    beside = beside_metrics(runs, grid.metric)
    # Only where runs recorded them: reports of grids from before the record keep their form.
    trained = parameter_statistics(runs)
    matched = matched_budget_statistics(runs)
    report = {
        "grid": grid.to_dict(),
        "runs": [
            {
                "name": r.run.name,
                "cell": dict(r.run.cell),
                "seed": r.run.seed,
                "final": r.results["final"],
                "degenerate": {split: r.degenerate(split) for split in r.results["final"]},
                **({"reused_from": r.reused_from} if r.reused_from else {}),
            }
            for r in runs
        ],
        "ensembles": [
            {
                "name": e.run.name,
                "cell": dict(e.run.cell),
                "seed": e.run.seed,
                "members": e.results["members"],
                "final": e.results["final"],
                "degenerate": {split: e.degenerate(split) for split in e.results["final"]},
            }
            for e in ensembles
        ],
        "final_params": sorted({r.results.get("final_params", "last").split(" ")[0] for r in runs}),
        "cells": cell_statistics(runs + ensembles, grid.metric, beside),
        "comparisons": comparisons(runs + ensembles, grid, aso_iterations=aso_iterations, beside=beside),
        "beside_metrics": list(beside),
        **({"rescored_runs": rescored} if (rescored := sum("rescored" in r.results for r in runs)) else {}),
        "statistics": {
            "primary_interval": "seed-level paired t-interval, 95%, two-sided (scipy.stats.ttest_1samp)",
            "tests": "all two-sided",
            "power": "smallest true difference a two-sided paired t-test at 0.05 detects with 80% power, "
            "at the row's seeds and per-seed SD (statsmodels TTestPower)",
            **dataclasses.asdict(report_settings(grid)),
        },
        "costs": cost_statistics(runs, ensembles),
        "compute": compute_statistics(runs, ensembles),
        **({"trained_parameters": trained} if trained else {}),
        **({"matched_budgets": matched} if matched else {}),
        "paper_results": paper_results(grid),
        "boundaries": boundary_statistics(runs, grid.metric, floor, beside),
        "objective": runs[0].task.objective.name,
        "majority_baseline": majority,
        "majority_in_metric": floor,
    }
    curves = budget_curves.curves(report["runs"], grid)  # a grid with a budget axis
    return report if curves is None else {**report, "budget_curves": curves}


def write_report(
    grid: ml_collections.ConfigDict, workdir: str | Path, *, aso_iterations: int = ASO_ITERATIONS
) -> Path:
    """report.json, report.md and the figures; returns report.md's path."""
    workdir = Path(workdir)
    report = build_report(grid, workdir, aso_iterations=aso_iterations)
    figures.write(load_runs(grid, workdir), report, grid.metric, workdir / "figures")
    # tmp file + rename: two shards finishing at once may both write the (same) report.
    for name, text in (("report.json", json.dumps(json_safe(report), indent=2) + "\n"),
                       ("report.md", markdown.render(grid, report))):  # fmt: skip
        tmp = workdir / f"{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, workdir / name)
    return workdir / "report.md"

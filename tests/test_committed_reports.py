"""The committed grid reports (docs/grids/) are what their per-run files say: each report's statistics
are recomputed from the committed results, predictions (compact: training/compact_predictions.py) and
configs alone, once per grid, and must match to the digit; and every comparison's t-interval and
two-sided p follow from the runs' results.json by scipy alone."""

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from stackft_jax.config import config_cli
from stackft_jax.experiments import grid_report, statistics

REPO = Path(__file__).resolve().parent.parent

# The committed grid folder and the grid config (with preset) that wrote its report.
COMMITTED = {
    "docs/grids/paper_qqp_short": "configs/experiments/paper_qqp.py:short",
    "docs/grids/paper_qqp_small": "configs/experiments/paper_qqp.py:small",
    "docs/grids/paper_qqp_test": "configs/experiments/paper_qqp.py:test_no_cache",
    "docs/grids/phase1_dropout_small": "configs/experiments/phase1_dropout.py:small",
    "docs/grids/phase1_dropout_separate": "configs/experiments/phase1_dropout.py:separate",
    "docs/grids/paper_conll_small": "configs/experiments/paper_conll.py:small",
    "docs/grids/paper_conll_test": "configs/experiments/paper_conll.py:test_no_cache",
    "docs/grids/paper_yahoo_small": "configs/experiments/paper_yahoo.py:small",
    "docs/grids/paper_yahoo_test": "configs/experiments/paper_yahoo.py:test_no_cache",
    "docs/grids/pilot_qqp": "configs/experiments/pilot.py:qqp",
    "docs/grids/pilot_conll": "configs/experiments/pilot.py:conll",
    "docs/grids/pilot_yahoo": "configs/experiments/pilot.py:yahoo",
    "docs/grids/pilot_peft_rate": "configs/experiments/pilot.py:peft_rate",
    "docs/grids/peft_qqp": "configs/experiments/peft.py:qqp",
    "docs/grids/peft_conll": "configs/experiments/peft.py:conll",
    "docs/grids/budget_curves_conll": "configs/experiments/budget_curves.py:conll",
    "docs/grids/budget_curves_yahoo": "configs/experiments/budget_curves.py:yahoo",
    "docs/grids/budget_curves_qqp": "configs/experiments/budget_curves.py:qqp",
}
# What a grid folder holds besides the committed files (.gitignore): never read by a report.
NOT_COMMITTED = ("checkpoints", "tensorboard", "locks", "feature_cache")


@pytest.mark.slow
@pytest.mark.parametrize("folder", sorted(COMMITTED))
def test_a_committed_report_is_recomputed_from_its_per_run_files(folder, tmp_path):
    committed = REPO / folder
    if not (committed / "report.json").exists():
        pytest.fail(f"{folder}/report.json is not committed: remove the grid from COMMITTED or run it")
    copy = tmp_path / "grid"
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns(*NOT_COMMITTED, "report.*", "figures"))
    # What is recomputed from: the compact prediction files alone, their keys and labels in examples/.
    assert not list(copy.glob("*/*/predictions/*.jsonl*")) and list(copy.glob("runs/*/predictions/dev.npz"))
    grid = config_cli.load(COMMITTED[folder], [], kind="grid")
    grid_report.write_report(grid, copy)
    for name in ("report.json", "report.md"):
        assert (copy / name).read_text() == (committed / name).read_text(), name


def _dev_scores(folder: Path, run_names: list[str], metric: str, split: str) -> list[float] | None:
    """Each run's `metric` on `split` as its own committed results.json (or ensemble's) records it."""
    scores = []
    for name in run_names:
        for kind in ("runs", "ensembles"):
            results = folder / kind / name / "results.json"
            if results.is_file():
                recorded = json.loads(results.read_text())
                final = recorded["ensemble"] if kind == "ensembles" else recorded["final"]
                break
        else:
            raise AssertionError(f"{folder}: no committed run or ensemble {name}")
        value = final.get(split, {}).get(metric)
        if value is None:
            return None
        scores.append(float(value))
    return scores


@pytest.mark.parametrize("folder", sorted(COMMITTED))
def test_every_comparisons_t_interval_and_p_are_recomputed_from_the_per_run_files(folder):
    # Independently of report.py: per-seed differences from each run's committed results.json, the paired
    # t-interval and two-sided p by scipy, the exact two-sided sign flip by enumerating the sign vectors.
    committed = REPO / folder
    report_json = json.loads((committed / "report.json").read_text())
    metric = report_json["grid"]["metric"]
    assert report_json["statistics"]["tests"] == "all two-sided"
    assert report_json["comparisons"], folder
    for row in report_json["comparisons"]:
        for split, stats in (("dev", row), ("test", row.get("test"))):
            if stats is None:
                continue
            ours = _dev_scores(committed, [f"{row['name']}-seed{s}" for s in row["seeds"]], metric, split)
            theirs = _dev_scores(committed, [f"{row['versus']}-seed{s}" for s in row["seeds"]], metric, split)
            assert ours is not None and theirs is not None, (row["name"], row["versus"])
            d = np.subtract(ours, theirs)
            assert stats["per_seed"] == pytest.approx(d.tolist(), abs=1e-12)
            interval = stats["t_interval"]
            if len(d) > 1 and not statistics.has_spread(d):
                # Equal per-seed differences (to float rounding): no t-test, the interval the point.
                assert interval["p_value"] is None and interval["ci_low"] == interval["ci_high"]
            elif len(d) > 1:
                t = scipy.stats.ttest_1samp(d, 0.0)
                ci = t.confidence_interval(0.95)
                assert (interval["ci_low"], interval["ci_high"]) == (
                    pytest.approx(ci.low),
                    pytest.approx(ci.high),
                )
                assert interval["p_value"] == pytest.approx(t.pvalue)
                if split == "dev":
                    assert row["t_test_p"] == pytest.approx(t.pvalue)
            if split == "dev" and row["sign_flip_p"] is not None:
                # Every sign assignment, ties to 1e-9 (scipy's permutation_test breaks exact ties such as
                # |-5/3000| vs |+5/3000| by float rounding), counted two-sided.
                means = np.asarray(list(itertools.product((1, -1), repeat=len(d)))) @ d / len(d)
                exact = np.mean(np.abs(means) >= abs(d.mean()) - 1e-9)
                assert row["sign_flip_p"] == pytest.approx(exact)

"""Learning curves as a grid axis (experiments/budget_curves.py, run key `budget_steps`): the step
counts each cell gets, bad axes refused before any run, and a tiny grid end to end with the selection
split."""

import json

import pytest

from stackft_jax.config import config_cli, spec
from stackft_jax.experiments import budget_curves, cells, grid, grid_report
from tests.test_experiment import ASO_ITERATIONS, _grid


def _budget_grid(**changes):
    settings = {
        "base": "configs/tiny.py:phase1.num_steps=2,phase1.backbone_dropout=false,phase1.feature_cache=true,"
        "data.selection_fraction=0.2,data.test_file=tests/fixtures/qqp/dev.tsv,eval_every_steps=100",
        "axes": "strategy=finetune_only|stack_and_finetune; budget_steps=1|3",
        "num_seeds": 2,
        "bootstrap_samples": 100,
    }
    return _grid(**(settings | changes))


def test_the_budget_sets_the_last_phases_steps():
    g = _budget_grid()
    runs = cells.runs_of(g)
    assert [r.cell_name for r in runs[:4]] == [
        "strategy=finetune_only-budget_steps=1",
        "strategy=finetune_only-budget_steps=3",
        "strategy=stack_and_finetune-budget_steps=1",
        "strategy=stack_and_finetune-budget_steps=3",
    ]
    stacked = spec.resolve(grid.run_config(g, runs[3]))
    assert [(p.name, p.num_steps) for p in stacked.phases] == [("phase1", 2), ("phase2", 3)]
    (alone,) = spec.resolve(grid.run_config(g, runs[0])).phases
    assert alone.num_steps == 1


@pytest.mark.parametrize(
    ("axis", "message"),
    [
        ("3|1", "in increasing order"),
        ("0|3", "positive step count"),
        ("-1|3", "positive step count"),
        ("a|3", "step counts"),
    ],
)
def test_a_bad_budget_axis_is_one_line_before_any_run(axis, message, tmp_path):
    g = _budget_grid(axes=f"strategy=finetune_only|stack_and_finetune; budget_steps={axis}")
    with pytest.raises(config_cli.ConfigError, match=message) as error:
        grid.plan_grid(g, tmp_path)
    assert "\n" not in str(error.value) and not (tmp_path / "runs").exists()


def test_a_negative_budget_in_a_run_config_is_named():
    with pytest.raises(config_cli.ConfigError, match="'budget_steps' = -2"):
        spec.resolve(config_cli.load("configs/tiny.py", ["budget_steps=-2"]))


@pytest.mark.slow
def test_a_budget_axis_grid_with_the_selection_split_end_to_end(tmp_path):
    """8 tiny runs: each scores the selection slice, dev and test once; the report gives each strategy's
    curve, its best budget chosen on the slice, and the best-budget comparison on test."""
    g = _budget_grid()
    assert grid.run_grid(g, tmp_path)
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())
    part = report["budget_curves"]
    assert part["budgets"] == [1, 3] and part["chosen_on"] == "selection"
    by_name = {row["name"]: row for row in part["curves"]}
    assert set(by_name) == {"strategy=finetune_only", "strategy=stack_and_finetune"}
    for row in part["curves"]:
        runs = [
            r for r in report["runs"] if budget_curves._curve_key(r["cell"]) == tuple(row["curve"].items())
        ]
        assert len(runs) == 4 and all(set(r["final"]) == {"dev", "test", "selection"} for r in runs)
        means = {
            p["budget_steps"]: sum(r["final"]["selection"]["accuracy"] for r in runs
                                   if r["cell"]["budget_steps"] == str(p["budget_steps"])) / 2
            for p in row["points"]
        }  # fmt: skip
        assert row["best_budget"] == max(means, key=means.get)
    (comparison,) = part["best_budget_comparisons"]
    assert comparison["name"] == "strategy=stack_and_finetune" and comparison["test"]["n"] == 2
    text = (tmp_path / "report.md").read_text()
    assert "Learning curves (grid axis `budget_steps`" in text and "dev and test choose nothing" in text
    # Phase 1's gap rule read the slice, so the boundary table names it, not dev.
    assert "| stopped by a rule | selection accuracy |" in text and "| dev ECE |" not in text


@pytest.mark.parametrize(
    ("preset", "runs", "budgets", "seeds", "paper_rows"),
    [
        ("qqp", 72, [300, 600], 3, 16),  # 2 pair heads x 2 stacked recipes x 2 baselines x 2 budgets
        ("conll", 60, [150, 300, 600], 5, 3),
        ("yahoo", 90, [75, 150, 300], 5, 9),  # the ensemble and both complex heads x 3 budgets
    ],
)
def test_the_learning_curve_grids_hold_out_selection_and_span_their_budgets(
    preset, runs, budgets, seeds, paper_rows
):
    g = config_cli.load(f"configs/experiments/budget_curves.py:{preset}", [], kind="grid")
    assert budget_curves.budgets_of(g) == budgets and g.num_seeds == seeds
    cells.check_grid(g)
    configured = [c for c in cells.comparisons_of(g) if c.configured]
    assert len(configured) == paper_rows
    # The paper's contrasts pair cells at one budget, never across budgets.
    assert all(dict(c.cell)["budget_steps"] == dict(c.other)["budget_steps"] for c in configured)
    found = cells.runs_of(g)
    assert len(found) == runs
    config = grid.run_config(g, found[-1])
    assert config.data.selection_fraction == 0.1 and config.budget_steps == budgets[-1]
    assert (config.batching.scheme, config.batching.bucket_tokens, config.batching.loss_weighting) == (
        "packed",
        16,
        "batch_mean",
    )
    assert config.nonfinite_guard == "skip_update"
    assert config.data.test_file  # test scored once per run

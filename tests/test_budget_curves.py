"""Learning curves as a grid axis (experiments/budget_curves.py, run key `budget_steps`): the step
counts each cell gets, bad axes refused before any run, and a tiny grid end to end with the selection
split."""

import json

import pytest
import scipy.stats

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
        ("qqp", 21, [300, 600], 3, 5),  # the paper's layout and the head alone x 2 budgets, + one-rate BiMPM
        ("conll", 60, [150, 300, 600], 5, 3),
        ("yahoo", 60, [150, 300], 5, 6),  # the ensemble and both complex heads x 2 budgets
    ],
)
def test_the_learning_curve_grids_hold_out_selection_and_span_their_budgets(
    preset, runs, budgets, seeds, paper_rows
):
    g = config_cli.load(f"configs/experiments/budget_curves.py:{preset}", [], kind="grid")
    assert budget_curves.budgets_of(g) == budgets and g.num_seeds == seeds
    cells.check_grid(g)
    assert budget_curves.tuned_groups(g) is None  # each strategy runs the recipe its dev grid chose
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


RECIPES = (
    "recipe=a:strategy=finetune_only|b:strategy=finetune_only_uniform|c:strategy=stack_and_finetune"
    "|d:strategy=stack_and_finetune,phase1.num_steps=1"
)


def _recipe_grid(**changes):
    settings = {"axes": f"{RECIPES}; budget_steps=1|3", "baseline": "recipe=a", "num_seeds": 3}
    return _budget_grid(**(settings | {"tuned_recipes": "recipe=a|b; recipe=c|d"} | changes))


def test_each_strategy_is_tuned_on_the_selection_slice_and_compared_with_the_baselines_pick():
    """Synthetic run rows: each group's pick is its recipe and budget with the best mean selection
    score, whatever dev and test say, and the comparison pairs the two picks' runs by seed."""
    g = _recipe_grid()
    # (selection, dev, test) accuracy by recipe, budget and seed: b at 3 steps wins finetune-only on
    # the slice though a at 3 is better on test; c at 1 wins stacking.
    scores = {
        ("a", "1"): [(0.60, 0.7, 0.70), (0.61, 0.7, 0.71), (0.62, 0.7, 0.72)],
        ("a", "3"): [(0.70, 0.9, 0.90), (0.71, 0.9, 0.91), (0.72, 0.9, 0.92)],
        ("b", "1"): [(0.50, 0.6, 0.60), (0.50, 0.6, 0.60), (0.50, 0.6, 0.60)],
        ("b", "3"): [(0.80, 0.8, 0.80), (0.81, 0.8, 0.82), (0.82, 0.8, 0.81)],
        ("c", "1"): [(0.75, 0.8, 0.83), (0.76, 0.8, 0.855), (0.77, 0.8, 0.835)],
        ("c", "3"): [(0.70, 0.9, 0.95), (0.70, 0.9, 0.95), (0.70, 0.9, 0.95)],
        ("d", "1"): [(0.40, 0.9, 0.99), (0.40, 0.9, 0.99), (0.40, 0.9, 0.99)],
        ("d", "3"): [(0.74, 0.9, 0.99), (0.75, 0.9, 0.99), (0.76, 0.9, 0.99)],
    }
    splits = ("selection", "dev", "test")
    runs = [
        {
            "cell": {"recipe": recipe, "budget_steps": budget},
            "seed": seed,
            "final": {split: {"accuracy": v} for split, v in zip(splits, row, strict=True)},
        }
        for (recipe, budget), rows in scores.items()
        for seed, row in enumerate(rows)
    ]
    tuned = budget_curves.curves(runs, g)["tuned"]
    picks = {c["group"]: (c["recipe"], c["budget_steps"]) for c in tuned["choices"]}
    assert picks == {"recipe=a|b": ("b", 3), "recipe=c|d": ("c", 1)}
    (row,) = tuned["comparisons"]
    assert (row["group"], row["vs"]) == ("recipe=c|d", "recipe=a|b")
    differences = [0.83 - 0.80, 0.855 - 0.82, 0.835 - 0.81]
    expected = scipy.stats.ttest_1samp(differences, 0.0)
    assert row["test"]["mean"] == pytest.approx(0.03) and row["test"]["n"] == 3
    assert row["test"]["p_value"] == pytest.approx(expected.pvalue)
    assert row["test"]["p_holm"] == pytest.approx(expected.pvalue)  # one row: Holm changes nothing
    assert row["test"]["tost_p"] > 0.05  # a 3-point gain is not level within the default 1 point
    text = "\n".join(budget_curves.lines({"budget_curves": budget_curves.curves(runs, g)}, "accuracy"))
    assert "| recipe=c|d | base | c | 1 | 0.7600 | 0.8000 | 0.8400 |" in text


@pytest.mark.parametrize(
    ("tuned", "message"),
    [
        ("recipe=a|b; recipe=c|e", "not one: 'e'"),
        ("recipe=a|b; recipe=b|c", "every value once"),
        ("recipe=b; recipe=c|d", "no group holds the baseline's value 'a'"),
        ("recipe=a|b; budget_steps=1", "one axis for every group"),
        ("budget_steps=1|3", "groups values of the baseline's axis"),
        ("recipe a|b", "one axis for every group"),
    ],
)
def test_bad_tuned_recipes_are_one_line_before_any_run(tuned, message, tmp_path):
    with pytest.raises(config_cli.ConfigError, match=message) as error:
        grid.plan_grid(_recipe_grid(tuned_recipes=tuned), tmp_path)
    assert "\n" not in str(error.value) and not (tmp_path / "runs").exists()


def test_tuned_recipes_need_a_budget_axis(tmp_path):
    g = _recipe_grid(axes=RECIPES)
    with pytest.raises(config_cli.ConfigError, match="on a grid with a `budget_steps` axis"):
        grid.plan_grid(g, tmp_path)

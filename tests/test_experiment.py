"""The experiment command: grid parsing, the report's statistics on hand-made runs, and a real tiny grid
that resumes after SIGKILL without rerunning finished cells and gives the same report when sharded."""

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import ml_collections
import numpy as np
import pytest
import scipy.stats

from stackft_jax.config import config_cli, phases, spec
from stackft_jax.data import metrics
from stackft_jax.experiments import cells, grid, grid_report, markdown
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.training import degenerate, prediction_files, workdirs
from tests.conftest import REPO

ASO_ITERATIONS = 50  # deepsig's default of 1000 takes half a minute per comparison


def _grid(**changes) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(
        {
            "base": "configs/tiny.py",
            "axes": "strategy=finetune_only|stack_and_finetune; head.name=cls_mlp|esim",
            "num_seeds": 3,
            "baseline": "strategy=finetune_only",
            "metric": "accuracy",
            "ensembles": "",
        }
    )
    c.update(changes)
    return c


def test_axes_cells_and_their_order():
    runs = cells.runs_of(_grid())
    assert len(runs) == 12 and [r.seed for r in runs[:4]] == [0, 0, 0, 0]  # seed by seed
    assert runs[1].name == "strategy=finetune_only-name=esim-seed0"
    assert runs[1].overrides() == ["strategy=finetune_only", "head.name=esim", "seed=0"]
    config = grid.run_config(_grid(), runs[1])
    assert (config.strategy, config.head.name, config.seed) == ("finetune_only", "esim", 0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"axes": "strategy"}, "is not `key=value1|value2|...`"),
        ({"axes": "strategy=a|a"}, "empty or repeated value"),
        ({"axes": "seed=1|2; seed=3|4"}, "names a key twice"),
        ({"baseline": "strategy=nope"}, "config key 'baseline'"),
    ],
)
def test_bad_grids_are_named(changes, message):
    with pytest.raises(ConfigError, match=message):
        cells.runs_of(_grid(**changes))
        cells.baseline_of(_grid(**changes))


def test_exclude_cells_leaves_cells_out_of_the_product_and_their_rows_with_them():
    # A strategy tried with one head only: the stacked cls_mlp cell goes, seed by seed order stays.
    g = _grid(
        exclude_cells="strategy=stack_and_finetune,head.name=cls_mlp", ensembles="head.name=cls_mlp+esim"
    )
    runs = cells.runs_of(g)
    assert [r.name for r in runs[:3]] == [
        "strategy=finetune_only-name=cls_mlp-seed0",
        "strategy=finetune_only-name=esim-seed0",
        "strategy=stack_and_finetune-name=esim-seed0",
    ]
    assert len(runs) == 9 and not any(r.cell_name == "strategy=stack_and_finetune-name=cls_mlp" for r in runs)
    assert [c.label for c in cells.comparisons_of(g)] == [
        "strategy=stack_and_finetune-name=esim vs strategy=finetune_only-name=esim"
    ]
    # The ensemble whose cls_mlp member is left out is not built; the fine-tuned one is.
    assert {e.run.cell_name for e in cells.ensembles_of(g)} == {"strategy=finetune_only-name=cls_mlp+esim"}
    # A cell whose baseline cell is left out keeps its runs and gets no baseline row.
    g = _grid(
        exclude_cells="strategy=finetune_only,head.name=esim; strategy=stack_and_finetune,head.name=cls_mlp"
    )
    assert [r.cell_name for r in cells.runs_of(g)[:2]] == [
        "strategy=finetune_only-name=cls_mlp",
        "strategy=stack_and_finetune-name=esim",
    ]
    assert cells.comparisons_of(g) == []
    assert cells.check_grid(g) is None


@pytest.mark.parametrize(
    ("exclude", "message"),
    [
        ("strategy", "is not `axis=value,axis=value,...`"),
        ("strategy=finetune_only,strategy=stack_and_finetune", "(each axis once)"),
        ("head=cls_mlp", "'head' is not an axis (strategy, head.name)"),
        ("head.name=bimpm", "'bimpm' is not a value of head.name (cls_mlp|esim)"),
        ("strategy=finetune_only; strategy=stack_and_finetune", "leaves out every cell"),
    ],
)
def test_bad_exclude_cells_are_one_line_before_any_run(exclude, message, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        grid.run_grid(_grid(exclude_cells=exclude), tmp_path)
    assert "\n" not in str(error.value) and not (tmp_path / "runs").exists()


def test_exclude_cells_is_refused_beside_matched_cells(tmp_path):
    g = _grid(
        exclude_cells="head.name=esim", matched="strategy=finetune_only@matched_steps:stack_and_finetune"
    )
    with pytest.raises(ConfigError, match="'matched' and 'exclude_cells' cannot be combined"):
        grid.run_grid(g, tmp_path)
    assert not (tmp_path / "runs").exists()


def test_a_bad_key_in_an_axis_fails_before_training(tmp_path):
    with pytest.raises(ConfigError, match="phase1.num_stepz"):
        grid.run_grid(_grid(axes="phase1.num_stepz=1|2", baseline="phase1.num_stepz=1"), tmp_path)
    assert not (tmp_path / "runs").exists()


def test_a_bad_value_in_a_later_cell_fails_before_any_cell_trains(tmp_path):
    # Keys are checked when the configs are built; values and files by spec.resolve, for every
    # cell before the first trains. The command line prints one line and exits 2.
    missing = tmp_path / "no_such_dev.tsv"
    grid_file = tmp_path / "bad_grid.py"
    grid_file.write_text(
        "import ml_collections\n\n\ndef get_config(arg=None):\n"
        "    return ml_collections.ConfigDict({'base': 'configs/tiny.py', 'num_seeds': 2,\n"
        "        'axes': 'strategy=finetune_only|stack_only; '\n"
        f"                'data.dev_file=tests/fixtures/qqp/dev.tsv|{missing}',\n"
        "        'baseline': 'strategy=finetune_only', 'metric': 'accuracy'})\n"
    )
    workdir = tmp_path / "grid"
    proc = subprocess.run(
        [sys.executable, "-m", "stackft_jax.experiment", f"--config={grid_file}", f"--workdir={workdir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1
    assert "-dev_file=" in error_lines[0] and "config.data.dev_file: no such file" in error_lines[0]
    assert not (workdir / "runs").exists()


@pytest.mark.slow  # runs a grid end to end
def test_a_grid_shares_one_feature_cache_between_its_cells(tmp_path):
    g = _grid(
        base="configs/tiny.py:strategy=stack_only,phase1.backbone_dropout=false,phase1.feature_cache=true,"
        "phase1.num_steps=3",
        axes="phase1.learning_rate=0.001|0.01",
        num_seeds=1,
        baseline="phase1.learning_rate=0.001",
    )
    assert grid.run_grid(g, tmp_path)
    # Both cells (same seed, so the same random backbone) read one cache per split.
    assert len(list((tmp_path / "feature_cache").glob("*/meta.json"))) == 2
    assert not list((tmp_path / "runs").glob("*/feature_cache"))
    recorded = json.loads((tmp_path / "runs" / "learning_rate=0.01-seed0" / "config.json").read_text())
    assert recorded["config"]["feature_cache_dir"] == str(tmp_path / "feature_cache")

    explicit = config_cli.load("configs/tiny.py:phase1.feature_cache=true,feature_cache_dir=/x", [])
    grid.share_feature_cache(explicit, tmp_path)
    assert explicit.feature_cache_dir == "/x"  # a run's own folder wins
    # A written phase block no longer has the key: it is the run's (a recorded one reads as such).
    with pytest.raises(config_cli.ConfigError, match="feature_cache_dir is a run option now"):
        phases.block("head", rules=[(".*", "all")], learning_rates={"all": 1.0}, feature_cache_dir="/y")
    old = config_cli.to_plain(config_cli.load("configs/tiny.py:three_phases", []))
    del old["feature_cache_dir"]  # a record from before the move
    old["phases"][0]["feature_cache_dir"] = "/y"
    assert spec.config_from_plain(old).feature_cache_dir == "/y"


@pytest.mark.slow
def test_frozen_phases_of_a_grid_share_their_dev_and_gap_subset_features(tmp_path):
    g = _grid(
        base="configs/tiny.py:strategy=stack_only,phase1.num_steps=4,phase1.gap_eval_examples=8,eval_every_steps=2",
        axes="phase1.learning_rate=0.001|0.01",
        num_seeds=1,
        baseline="phase1.learning_rate=0.001",
    )
    assert grid.run_grid(g, tmp_path)
    # Training runs the backbone (with dropout); every evaluation of both cells reads one dev and one
    # gap-subset cache, built once for the grid.
    assert len(list((tmp_path / "feature_cache").glob("*/meta.json"))) == 2
    assert not list((tmp_path / "runs").glob("*/feature_cache"))


@pytest.mark.slow
def test_a_bundled_axis_value_sets_several_keys_and_is_named_by_its_label(tmp_path):
    g = _grid(
        base="configs/tiny.py:phase1.num_steps=2,phase2.num_steps=2",
        axes="method=frozen:strategy=stack_only,model.scalar_mix=True|tuned:strategy=finetune_only",
        num_seeds=1,
        baseline="method=tuned",
    )
    assert cells.parse_axes(g.axes) == [("method", ["frozen", "tuned"])]
    assert [r.overrides() for r in cells.runs_of(g)] == [
        ["strategy=stack_only", "model.scalar_mix=True", "seed=0"],
        ["strategy=finetune_only", "seed=0"],
    ]
    assert grid.run_grid(g, tmp_path)
    recorded = json.loads((tmp_path / "runs" / "method=frozen-seed0" / "config.json").read_text())["config"]
    assert (recorded["strategy"], recorded["model"]["scalar_mix"]) == ("stack_only", True)
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    (row,) = json.loads((tmp_path / "report.json").read_text())["comparisons"]
    assert (row["cell"], row["baseline"]) == ({"method": "frozen"}, {"method": "tuned"})
    assert "| method=frozen | method=tuned |" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("value", ["frozen:strategy=a,=b", "frozen:=1", "frozen:strategy=a,b"])
def test_a_malformed_bundle_is_named(value):
    with pytest.raises(ConfigError, match="label:key=value"):
        cells.runs_of(_grid(axes=f"method={value}|tuned:strategy=finetune_only", baseline="method=tuned"))


@pytest.mark.parametrize("preset", ["", "mrpc", "stsb", "small,sst2", "small,mrpc", "mrpc,small"])
def test_peters_glue_grids_build_every_cell(preset):
    g = config_cli.load("configs/experiments/peters_glue.py" + (f":{preset}" if preset else ""), [])
    task = next((t for t in ("mrpc", "stsb") if t in preset), "sst2")
    assert g.metric == {"sst2": "accuracy", "mrpc": "f1", "stsb": "pearson"}[task]
    frozen, tuned = (grid.run_config(g, run) for run in cells.runs_of(g)[:2])
    assert frozen.data.task == tuned.data.task == task
    assert (frozen.strategy, frozen.model.scalar_mix) == ("stack_only", True)
    assert (tuned.strategy, tuned.model.scalar_mix, tuned.head.name) == ("finetune_only", False, "cls_mlp")
    small = "small" in preset
    assert (frozen.model.name_or_path == "embedded:minilm") == small
    assert (frozen.data.train_file or "").startswith("../shared/data/glue/") == small


@pytest.mark.parametrize(
    "task, grid_file, heads",
    [
        ("qqp", "paper_qqp", {"cls_mlp", "bimpm"}),
        ("conll", "paper_conll", {"token_mlp"}),  # the cheapest tagging head is the paper's
        ("yahoo", "paper_yahoo", {"cls_mlp", "densenet"}),
    ],
)
def test_pilot_curves_extend_the_paper_grids_runs(task, grid_file, heads):
    g = config_cli.load(f"configs/experiments/pilot.py:{task}", [])
    paper = config_cli.load(f"configs/experiments/{grid_file}.py:small", [])
    reference = grid.run_config(paper, cells.runs_of(paper)[0])
    configs = [grid.run_config(g, run) for run in cells.runs_of(g)]
    assert g.num_seeds == 1 and {(c.strategy, c.head.name) for c in configs} == {
        (s, h) for s in ("finetune_only", "stack_and_finetune") for h in heads
    }
    for c in configs:  # the grid's runs and data, a longer fine-tuning budget, dense evaluations
        assert (c.data.train_file, c.data.dev_file) == (reference.data.train_file, reference.data.dev_file)
        assert (c.max_seq_length, c.per_device_batch_size) == (
            reference.max_seq_length,
            reference.per_device_batch_size,
        )
        assert c.phase2.num_steps > reference.phase2.num_steps and c.eval_every_steps < c.phase2.num_steps / 4
    with pytest.raises(ConfigError, match="name a task preset"):
        config_cli.load("configs/experiments/pilot.py", [])


@pytest.mark.parametrize("preset", ["", "small", "small_300"])
def test_phase1_length_grid_varies_phase1_alone(preset):
    g = config_cli.load("configs/experiments/phase1_length.py" + (f":{preset}" if preset else ""), [])
    configs = [grid.run_config(g, run) for run in cells.runs_of(g) if run.seed == 0]
    baseline, *lengths = configs
    assert (baseline.strategy, baseline.head.name) == ("finetune_only", "bimpm")
    assert {(c.strategy, c.head.name, c.phase1.max_train_dev_gap) for c in lengths} == {
        ("stack_and_finetune", "bimpm", 1.0)
    }
    steps = [c.phase1.num_steps for c in lengths]
    assert steps == sorted(steps) and len(set(steps)) == len(steps) == 4
    assert len({c.phase2.num_steps for c in configs}) == 1  # the same fine-tuning budget everywhere
    assert (baseline.model.name_or_path == "embedded:minilm") == preset.startswith("small")
    if preset == "small":  # the budget its committed report (docs/phase1_length_report.md) ran with
        assert baseline.phase2.num_steps == 60 and baseline.phase1.gap_eval_examples == 500
    if preset == "small_300":  # the QQP grid's finetune-only BiMPM, whose runs it reuses
        qqp = config_cli.load("configs/experiments/paper_qqp.py:small", [])
        (same,) = [
            grid.run_spec(qqp, run, recorded=True)
            for run in cells.runs_of(qqp)
            if run.name == "strategy=finetune_only-name=bimpm-seed0"
        ]
        mine = grid.run_spec(g, cells.runs_of(g)[0], recorded=True)
        assert spec.binding_form(mine) == spec.binding_form(same)


@pytest.mark.parametrize("preset", ["", "small"])
def test_phase1_dropout_grid_varies_phase1s_dropout_alone(preset):
    g = config_cli.load("configs/experiments/phase1_dropout.py" + (f":{preset}" if preset else ""), [])
    baseline, cached, dropout = [grid.run_config(g, run) for run in cells.runs_of(g) if run.seed == 0]
    assert (baseline.strategy, cached.strategy, dropout.strategy) == (
        "finetune_only",
        "stack_and_finetune",
        "stack_and_finetune",
    )
    assert (cached.phase1.backbone_dropout, cached.phase1.feature_cache) == (False, True)
    assert (dropout.phase1.backbone_dropout, dropout.phase1.feature_cache) == (True, False)
    plain = [config_cli.to_plain(c) for c in (cached, dropout)]
    for c in plain:
        del c["phase1"]["backbone_dropout"], c["phase1"]["feature_cache"]
    assert plain[0] == plain[1]  # nothing else differs
    assert {c.head.name for c in (baseline, cached, dropout)} == {"bimpm"}
    if preset == "small":  # the QQP grid's cells, so its runs can be reused
        qqp = config_cli.load("configs/experiments/paper_qqp.py:small", [])
        (same,) = [
            grid.run_config(qqp, run)
            for run in cells.runs_of(qqp)
            if run.name == "strategy=stack_and_finetune-name=bimpm-seed0"
        ]
        assert config_cli.to_plain(same) == config_cli.to_plain(cached)


def test_report_summarises_phase_boundaries(tmp_path):
    g = _grid(axes="strategy=finetune_only|stack_and_finetune", num_seeds=2)
    for run in cells.runs_of(g):
        boundary = None
        if run.cell[0][1] == "stack_and_finetune":
            norm = 3.0 + run.seed
            boundary = {
                "head_param_norm": norm,
                "dev_ece": 0.1,
                "train_dev_gap_accuracy": 0.02 * (run.seed + 1),
            }
        _fake_run(tmp_path, run, 0.7, [True, False], boundary)
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    (row,) = json.loads((tmp_path / "report.json").read_text())["boundaries"]
    assert (row["name"], row["phase"], row["steps"]["mean"]) == ("strategy=stack_and_finetune", "phase1", 2)
    assert row["head_param_norm"]["mean"] == pytest.approx(3.5) and row["head_param_norm"]["n"] == 2
    assert row["head_param_norm"]["std"] == pytest.approx(np.std([3.0, 4.0], ddof=1))
    assert row["train_dev_gap_accuracy"]["mean"] == pytest.approx(0.03)
    text = (tmp_path / "report.md").read_text()
    assert (
        "| strategy=stack_and_finetune | phase1 | 2.000 ± 0.000 | 0/2 | - | - | 3.500 ± 0.707 "
        "| 0.100 ± 0.000 | 0.030 ± 0.014 |" in text
    )


def test_one_seed_gets_no_seed_level_tests(tmp_path):
    g = _grid(axes="strategy=finetune_only|stack_and_finetune", num_seeds=1)
    for run in cells.runs_of(g):
        better = run.cell[0][1] == "stack_and_finetune"
        _fake_run(tmp_path, run, 0.75 if better else 0.5, [True, True, better, False])
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    (row,) = json.loads((tmp_path / "report.json").read_text())["comparisons"]
    assert row["t_test_p"] is row["wilcoxon_p"] is row["aso_epsilon"] is None
    assert row["bootstrap"]["difference"] == pytest.approx(0.25)  # examples still pair up


def test_shard_syntax():
    assert grid.parse_shard("1/3") == (1, 3)
    for bad in ("3/3", "1", "-1/2"):
        with pytest.raises(ConfigError, match="--shard"):
            grid.parse_shard(bad)


def _fake_run(
    workdir, run: cells.Run, accuracy: float, correct: list[bool], boundary: dict | None = None
) -> None:
    """A finished run's files as train.run writes them: results.json, dev predictions, metrics.jsonl."""
    results = {
        "final": {"dev": {"accuracy": accuracy}},
        "final_params": "last",
        "phases": [{"phase": "phase1", "steps": 2}, {"phase": "phase2", "steps": 2}],
    }
    if boundary is not None:
        results["phases"][0]["boundary"] = boundary
    records = [
        {"key": f"ex{i}", "prediction": int(ok), "label": 1, "probabilities": [1 - ok, float(ok)]}
        for i, ok in enumerate(correct)
    ]
    _write_run(workdir, run, results, records)


def _write_run(workdir, run: cells.Run, results: dict, records: list[dict]) -> None:
    run_dir = workdir / "runs" / run.name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(results))
    prediction_files.write(prediction_files.path(run_dir, "dev"), records)
    accuracy = results["final"]["dev"]["accuracy"]
    curve = [{"split": "dev", "global_step": s, "accuracy": accuracy} for s in (2, 4)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))


def test_report_statistics_on_hand_made_runs(tmp_path):
    g = _grid(axes="strategy=finetune_only|stack_and_finetune", num_seeds=3)
    base = {0: 0.70, 1: 0.72, 2: 0.71}
    ours = {0: 0.74, 1: 0.73, 2: 0.75}
    for run in cells.runs_of(g):
        table = ours if run.cell[0][1] == "stack_and_finetune" else base
        # 4 dev examples; the baseline gets examples 0-1 right, the other cell 0-2 (+25 points).
        correct = [True, True, run.cell[0][1] == "stack_and_finetune", False]
        _fake_run(tmp_path, run, table[run.seed], correct)
    path = grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())

    cell = next(c for c in report["cells"] if c["cell"]["strategy"] == "stack_and_finetune")["dev"]
    values = list(ours.values())
    assert cell["mean"] == pytest.approx(np.mean(values)) and cell["std"] == pytest.approx(
        np.std(values, ddof=1)
    )
    half_width = scipy.stats.t.ppf(0.975, 2) * np.std(values, ddof=1) / math.sqrt(3)
    assert cell["ci95_high"] == pytest.approx(np.mean(values) + half_width)
    assert (cell["min"], cell["max"], cell["n"]) == (0.73, 0.75, 3)

    (row,) = report["comparisons"]
    assert row["per_seed"] == pytest.approx([0.04, 0.01, 0.04])
    expected_p = scipy.stats.ttest_rel(values, list(base.values())).pvalue
    assert row["t_test_p"] == pytest.approx(expected_p) and row["t_test_p_holm"] == pytest.approx(expected_p)
    assert row["wilcoxon_p"] == pytest.approx(scipy.stats.wilcoxon(values, list(base.values())).pvalue)
    assert 0.0 <= row["aso_epsilon"] < 0.5  # better in every seed
    assert row["bootstrap"]["difference"] == pytest.approx(0.25)
    assert row["bootstrap"]["ci95_low"] >= 0.0  # no resample can favour the baseline
    assert report["majority_baseline"] == 1.0  # every parsed label is 1
    text = path.read_text()
    assert "| strategy=stack_and_finetune | 0.7400 ± 0.0100 |" in text and "+3.00" in text
    assert (tmp_path / "figures" / "metric_by_cell.png").stat().st_size > 1000
    assert (tmp_path / "figures" / "dev_curves.png").stat().st_size > 1000


def test_a_report_of_a_grid_with_cells_left_out(tmp_path):
    # Learning curves of three cells (the stacked cls_mlp cell left out): the report's cells, rows
    # and curves are those of the runs that exist.
    g = _grid(
        axes="strategy=finetune_only|stack_and_finetune; head.name=cls_mlp|esim; budget_steps=1|3",
        exclude_cells="strategy=stack_and_finetune,head.name=cls_mlp",
        comparisons="strategy=stack_and_finetune-name=esim-budget_steps=3 vs "
        "strategy=finetune_only-name=cls_mlp-budget_steps=3; baseline",
        bootstrap_samples=100,
    )
    for run in cells.runs_of(g):
        stacked = dict(run.cell)["strategy"] == "stack_and_finetune"
        accuracy = 0.70 + 0.01 * run.seed + 0.05 * stacked + 0.02 * (dict(run.cell)["budget_steps"] == "3")
        _fake_run(tmp_path, run, accuracy, [True, True, stacked, False])
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["cells"]) == 6 and len(report["runs"]) == 18
    rows = [(r["name"], r["versus"]) for r in report["comparisons"]]
    assert rows == [
        (
            "strategy=stack_and_finetune-name=esim-budget_steps=3",
            "strategy=finetune_only-name=cls_mlp-budget_steps=3",
        ),
        (
            "strategy=stack_and_finetune-name=esim-budget_steps=1",
            "strategy=finetune_only-name=esim-budget_steps=1",
        ),
        (
            "strategy=stack_and_finetune-name=esim-budget_steps=3",
            "strategy=finetune_only-name=esim-budget_steps=3",
        ),
    ]
    assert all(r["per_seed"] == pytest.approx([0.05] * 3) for r in report["comparisons"])
    curves = report["budget_curves"]
    assert [c["name"] for c in curves["curves"]] == [
        "strategy=finetune_only-name=cls_mlp",
        "strategy=finetune_only-name=esim",
        "strategy=stack_and_finetune-name=esim",
    ]
    (best,) = curves["best_budget_comparisons"]
    assert (best["name"], best["other"], best["budget"], best["other_budget"]) == (
        "strategy=stack_and_finetune-name=esim",
        "strategy=finetune_only-name=esim",
        3,
        3,
    )
    assert (
        "less the cells `strategy=stack_and_finetune,head.name=cls_mlp`"
        in (tmp_path / "report.md").read_text()
    )


DEV_LABELS = [1, 0, 1, 0]


def _fake_classifier(workdir, run: cells.Run, p1: list[float]) -> None:
    """A finished QQP run whose probability of class 1 on the four dev examples is `p1`; its results.json
    holds the metrics of those predictions (an ensemble recomputes and checks them)."""
    predicted = [int(p > 0.5) for p in p1]
    final = metrics.compute_metrics(("accuracy", "f1"), np.asarray(predicted), np.asarray(DEV_LABELS))
    # The config train.run records: an ensemble resolves it to know each member's task.
    config = config_cli.to_plain(grid.run_config(_grid(), run))
    results = {"config": config, "final": {"dev": final}, "phases": []}
    records = [
        {"key": f"ex{i}", "prediction": y, "label": label, "probabilities": [1 - p, p]}
        for i, (p, y, label) in enumerate(zip(p1, predicted, DEV_LABELS, strict=True))
    ]
    _write_run(workdir, run, results, records)


# Probability of class 1 per (strategy, head); predictions and, in comments, the two heads' average's.
ENSEMBLE_P1 = {
    ("finetune_only", "cls_mlp"): [0.9, 0.6, 0.4, 0.2],  # 1 1 0 0
    ("finetune_only", "esim"): [0.3, 0.2, 0.8, 0.9],  # 0 0 1 1; average 0.6 0.4 0.6 0.55: 1 0 1 1, 0.75
    ("stack_and_finetune", "cls_mlp"): [0.9, 0.3, 0.4, 0.2],  # 1 0 0 0
    ("stack_and_finetune", "esim"): [0.4, 0.2, 0.8, 0.1],  # 0 0 1 0; average 0.65 0.25 0.6 0.15: 1.0
}
# Seed 1 only: 0 0 0 0; averaged with cls_mlp 0.65 0.25 0.425 0.15: 1 0 0 0, 0.75.
STACKED_ESIM_SEED1 = [0.4, 0.2, 0.45, 0.1]


@pytest.mark.slow
def test_ensemble_cells_on_hand_made_runs(tmp_path):
    g = _grid(num_seeds=2, ensembles="head.name=cls_mlp+esim")
    for run in cells.runs_of(g):
        cell = tuple(dict(run.cell).values())
        seed1 = run.seed == 1 and cell == ("stack_and_finetune", "esim")
        _fake_classifier(tmp_path, run, STACKED_ESIM_SEED1 if seed1 else ENSEMBLE_P1[cell])
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())

    stacked = "strategy=stack_and_finetune-name=cls_mlp+esim"
    assert [c["name"] for c in report["cells"]][4:] == ["strategy=finetune_only-name=cls_mlp+esim", stacked]
    cell = report["cells"][5]["dev"]
    assert (cell["n"], cell["mean"], cell["min"], cell["max"]) == (2, 0.875, 0.75, 1.0)
    assert cell["std"] == pytest.approx(np.std([1.0, 0.75], ddof=1))
    assert report["cells"][4]["dev"]["mean"] == 0.75
    entry = next(e for e in report["ensembles"] if e["name"] == f"{stacked}-seed0")
    assert entry["members"] == [
        "strategy=stack_and_finetune-name=cls_mlp-seed0",
        "strategy=stack_and_finetune-name=esim-seed0",
    ]

    # Against the ensemble of the baseline strategy, same seed; the bootstrap reads the ensembles' files:
    # per example, seed 0 differs by 0 0 0 +1 and seed 1 by 0 0 -1 +1, so (0.5 / 4) on average.
    row = next(r for r in report["comparisons"] if r["cell"]["head.name"] == "cls_mlp+esim")
    assert row["baseline"] == {"strategy": "finetune_only", "head.name": "cls_mlp+esim"}
    assert (row["seeds"], row["per_seed"]) == ([0, 1], [0.25, 0.0])
    assert row["bootstrap"]["difference"] == pytest.approx(0.125)
    assert len(report["comparisons"]) == 3

    out = tmp_path / "ensembles" / f"{stacked}-seed0"
    averaged = [
        r["probabilities"][1] for r in prediction_files.read(prediction_files.path(out, "dev")).values()
    ]
    assert averaged == pytest.approx([0.65, 0.25, 0.6, 0.15])
    text = (tmp_path / "report.md").read_text()
    assert f"| {stacked} | 0.8750 ± 0.1768 |" in text and "`ensembles/<cell>-seed<k>/`" in text

    # A rerun (a finished grid, or --report_only) writes the same ensembles again.
    written = {f: f.read_bytes() for f in (tmp_path / "ensembles").rglob("*") if f.is_file()}
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    assert {f: f.read_bytes() for f in (tmp_path / "ensembles").rglob("*") if f.is_file()} == written
    assert len(written) == 8  # results.json and dev predictions of 2 strategies x 2 seeds, nothing staged


@pytest.mark.parametrize(
    ("ensembles", "message"),
    [
        ("head.name", "is not `key=value1+value2+...`"),
        ("head.nam=cls_mlp+esim", "head.nam is not an axis"),
        ("head.name=cls_mlp+bimpm", "'bimpm' is not a value of axis head.name"),
        ("head.name=cls_mlp", "two or more different values"),
        ("strategy=finetune_only+finetune_only", "two or more different values"),
        ("head.name=cls_mlp+esim; head.name=cls_mlp+esim", "already has"),
    ],
)
def test_bad_ensembles_are_named_before_training(tmp_path, ensembles, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        grid.run_grid(_grid(ensembles=ensembles), tmp_path)
    assert "config key 'ensembles'" in str(error.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"base": "configs/tiny.py:conll", "metric": "f1"}, "is a word_tagging run (data.task=conll2003)"),
        ({"metric": "loss"}, "not the grid's metric 'loss'"),
    ],
)
def test_ensembles_need_class_probabilities_and_the_grids_metric(tmp_path, changes, message):
    g = _grid(
        axes="strategy=finetune_only|stack_and_finetune",
        ensembles="strategy=finetune_only+stack_and_finetune",
    )
    g.update(changes)
    with pytest.raises(ConfigError, match=re.escape(message)):
        grid.run_grid(g, tmp_path)
    assert not (tmp_path / "runs").exists()


def test_holm_correction_across_the_table(tmp_path):
    g = _grid(axes="strategy=finetune_only|stack_only|stack_and_finetune", num_seeds=3)
    scores = {
        "finetune_only": [0.70, 0.72, 0.71],
        "stack_only": [0.60, 0.65, 0.61],
        "stack_and_finetune": [0.74, 0.73, 0.76],
    }
    for run in cells.runs_of(g):
        _fake_run(tmp_path, run, scores[run.cell[0][1]][run.seed], [True, False])
    rows = grid_report.comparisons(grid_report.load_runs(g, tmp_path), g, aso_iterations=ASO_ITERATIONS)
    raw = sorted(row["t_test_p"] for row in rows)
    holm = sorted(row["t_test_p_holm"] for row in rows)
    assert holm[0] == pytest.approx(min(1.0, 2 * raw[0]))  # the smallest p times the number of tests
    assert holm[1] == pytest.approx(max(holm[0], raw[1]))


def _fake_recorded_run(workdir, g, run: cells.Run, accuracy: float) -> None:
    """A fake finished run with the config.json train.run records (what reuse compares)."""
    _fake_run(workdir, run, accuracy, [True, False])
    record = {"config": grid.run_spec(g, run).raw, "global_batch_size": 4}
    (workdir / "runs" / run.name / "config.json").write_text(json.dumps(record))
    (workdir / "runs" / run.name / "checkpoints").mkdir()  # never copied


def _fake_training(monkeypatch, g, workdir) -> list[str]:
    """train.run replaced by one that takes the real workdir lock and writes a finished run's files (so
    the grid logic is tested without training); returns the names of the runs it 'trained'."""
    from stackft_jax.training import train, workdirs

    trained = []

    def fake_train(run_spec, run_dir, **_):
        with workdirs.exclusive(Path(run_dir)):
            trained.append(Path(run_dir).name)
            run = next(r for r in cells.runs_of(g) if r.name == Path(run_dir).name)
            _fake_recorded_run(workdir, g, run, 0.75)

    monkeypatch.setattr(train, "run", fake_train)
    return trained


@pytest.mark.slow
def test_a_grid_reuses_the_runs_another_grid_finished_with_the_same_config(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    first, second = tmp_path / "first", tmp_path / "second"
    old = _grid(axes="strategy=finetune_only|stack_only", num_seeds=2)
    for run in cells.runs_of(old):
        _fake_recorded_run(first, old, run, 0.7 + 0.01 * run.seed)
    (first / "runs" / "strategy=stack_only-seed1" / "config.json").unlink()  # config unknown: not reused
    new = _grid(
        axes="recipe=ft:strategy=finetune_only|sf:strategy=stack_and_finetune|so:strategy=stack_only",
        num_seeds=2,
        baseline="recipe=ft",
    )
    started = second / "runs" / "recipe=ft-seed1"
    started.mkdir(parents=True)  # a run begun here: set aside, not overwritten
    trained = _fake_training(monkeypatch, new, second)
    with pytest.raises(ConfigError, match="not a grid workdir"):
        grid.run_grid(new, second, reuse_runs_from=[tmp_path])
    assert grid.run_grid(new, second, reuse_runs_from=[first]) is True
    assert trained == ["recipe=sf-seed0", "recipe=sf-seed1", "recipe=so-seed1"]
    copy = second / "runs" / "recipe=ft-seed1"
    assert not (copy / "checkpoints").exists() and (copy / "results.json").is_file()
    assert json.loads((copy / grid.REUSED_FROM).read_text())["source"] == str(
        first / "runs" / "strategy=finetune_only-seed1"
    )
    assert [p.name.split(".replaced-")[0] for p in (second / "runs").glob("*.replaced-*")] == [started.name]
    plan = grid.plan_grid(new, second)  # a process that looked before the copy was in place keeps it:
    assert grid.reuse_run(plan, plan.runs[0], [first]) == first / "runs" / "strategy=finetune_only-seed0"
    assert len(list((second / "runs").iterdir())) == 7 and not list((second / "runs").glob("*.tmp"))

    grid_report.write_report(new, second, aso_iterations=ASO_ITERATIONS)
    report = json.loads((second / "report.json").read_text())
    assert sum("reused_from" in r for r in report["runs"]) == 3
    assert "3 of the 6 runs were trained by another grid" in (second / "report.md").read_text()
    assert f"from `{first}`" in (second / "report.md").read_text()


def test_a_run_another_process_holds_is_not_copied_over(monkeypatch, tmp_path):
    from stackft_jax.training import workdirs

    monkeypatch.chdir(REPO)
    old = _grid(axes="strategy=finetune_only", num_seeds=1, baseline="strategy=finetune_only")
    (run,) = cells.runs_of(old)
    _fake_recorded_run(tmp_path / "first", old, run, 0.7)
    plan = grid.plan_grid(old, tmp_path / "second")
    with workdirs.exclusive(tmp_path / "second" / "runs" / run.name):
        assert grid.reuse_run(plan, run, [tmp_path / "first"]) is None
    assert grid.reuse_run(plan, run, [tmp_path / "first"]) is not None


def test_processes_sharing_a_grid_leave_each_other_their_runs(monkeypatch, tmp_path):
    """A run whose workdir lock a live process holds is skipped, not failed: processes over one workdir
    each take the next free run. (train.run is replaced by one that takes the real lock and writes a
    finished run's files, so the test trains nothing.)"""
    from stackft_jax.training import workdirs

    monkeypatch.chdir(REPO)
    g = _grid(axes="strategy=finetune_only|stack_only", num_seeds=1)
    trained = _fake_training(monkeypatch, g, tmp_path)
    held = tmp_path / "runs" / "strategy=finetune_only-seed0"
    with workdirs.exclusive(held):  # a live process's run (flock: per open file, so this process too)
        assert grid.run_grid(g, tmp_path) is False
    assert trained == ["strategy=stack_only-seed0"]
    assert grid.run_grid(g, tmp_path) is True
    assert trained == ["strategy=stack_only-seed0", "strategy=finetune_only-seed0"]


def test_an_unfinished_run_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="has not finished"):
        grid_report.load_runs(_grid(), tmp_path)


def _experiment(workdir, *args: str, wait: bool = True):
    cmd = [sys.executable, "-m", "stackft_jax.experiment", "--config=configs/experiments/tiny.py",
           f"--workdir={workdir}", *args]  # fmt: skip
    if not wait:
        return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)


def _comparable(report: dict) -> dict:
    """What two executions of one grid must agree on: everything but wall times (costs, and the compute
    ratios, which include each run's wall seconds)."""
    comparable = {key: report[key] for key in ("runs", "ensembles", "cells", "majority_baseline")}
    comparable["comparisons"] = [
        {k: v for k, v in row.items() if k != "compute_ratio"} for row in report["comparisons"]
    ]
    return comparable


@pytest.mark.slow
def test_a_killed_grid_resumes_and_shards_give_the_same_report(tmp_path):
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    proc = _experiment(whole, wait=False)
    first = whole / "runs" / "strategy=finetune_only-seed0" / "results.json"
    deadline = time.time() + 600
    while not first.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    finished_at = first.stat().st_mtime_ns
    done = _experiment(whole)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert first.stat().st_mtime_ns == finished_at  # the finished cell was read back, not rerun
    assert "grid run 1/4" not in done.stderr
    # configs/experiments/tiny.py ensembles its two strategies, seed by seed.
    ensembled = json.loads(
        (whole / "ensembles" / "strategy=finetune_only+stack_and_finetune-seed1" / "results.json").read_text()
    )
    assert [m["workdir"] for m in ensembled["members"]] == [
        str(whole / "runs" / f"strategy={s}-seed1") for s in ("finetune_only", "stack_and_finetune")
    ]
    report = json.loads((whole / "report.json").read_text())
    assert report["cells"][-1]["name"] == "strategy=finetune_only+stack_and_finetune"
    assert report["cells"][-1]["dev"]["n"] == 2
    assert report["comparisons"][-1]["cell"] == {"strategy": "finetune_only+stack_and_finetune"}

    shards = [_experiment(sharded, f"--shard={i}/2", wait=False) for i in range(2)]
    outputs = [p.communicate(timeout=900)[0] for p in shards]
    assert all(p.returncode == 0 for p in shards), outputs
    if not (sharded / "report.json").exists():  # both shards finished before the other: report now
        assert _experiment(sharded, "--report_only").returncode == 0
    reports = [json.loads((w / "report.json").read_text()) for w in (whole, sharded)]
    assert _comparable(reports[0]) == _comparable(reports[1])


def _scored_run(workdir, run: cells.Run, splits: dict[str, tuple[list, list]], **results) -> None:
    """A finished run scored on each split's (predicted, labels), its results.json's metrics computed from
    them as train.run does: classification (ints) or tagging (tag-name lists)."""
    records, final = {}, {}
    for split, (predicted, labels) in splits.items():
        if isinstance(labels[0], list):
            final[split] = metrics.entity_scores(labels, predicted)
            records[split] = [{"key": f"s{i}", "prediction": p, "label": y}
                              for i, (p, y) in enumerate(zip(predicted, labels, strict=True))]  # fmt: skip
        else:
            final[split] = metrics.compute_metrics(
                ("accuracy", "f1"), np.asarray(predicted), np.asarray(labels)
            )
            records[split] = [
                {"key": f"e{i}", "prediction": p, "label": y, "probabilities": [1.0 - p, float(p)]}
                for i, (p, y) in enumerate(zip(predicted, labels, strict=True))
            ]
    run_dir = workdir / "runs" / run.name
    run_dir.mkdir(parents=True, exist_ok=True)
    body = {"final": final, "final_params": "last", "phases": [{"phase": "phase2", "steps": 3}]} | results
    (run_dir / "results.json").write_text(json.dumps(body))
    for split, split_records in records.items():
        prediction_files.write(prediction_files.path(run_dir, split), split_records)
    (run_dir / "metrics.jsonl").write_text("")


LABELS_12 = [1, 0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 1]  # majority (0) 7/12


def _learned(seed: int, wrong: int) -> list[int]:
    """LABELS_12 with `wrong` examples flipped, starting at a seed-dependent place."""
    predicted = list(LABELS_12)
    for i in range(wrong):
        j = (seed + 3 * i) % len(predicted)
        predicted[j] = 1 - predicted[j]
    return predicted


def test_a_degenerate_baseline_is_flagged_and_its_comparisons_are_not_wins(tmp_path):
    g = _grid(axes="strategy=finetune_only|stack_only|stack_and_finetune", num_seeds=3)
    for run in cells.runs_of(g):
        strategy = run.cell[0][1]
        predicted = {"finetune_only": [0] * 12, "stack_only": _learned(run.seed, 3)}.get(
            strategy, _learned(run.seed, 1)
        )
        _scored_run(tmp_path, run, {"dev": (predicted, LABELS_12)})
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())
    collapsed = next(c for c in report["cells"] if c["name"] == "strategy=finetune_only")
    assert collapsed["degenerate"] == {"dev": {"one_class": 3, "f1_zero": 3, "at_or_below_majority": 3}}
    assert all("degenerate" not in c for c in report["cells"] if c["name"] != "strategy=finetune_only")
    assert report["runs"][0]["degenerate"] == {"dev": ["one_class", "f1_zero", "at_or_below_majority"]}
    for row in report["comparisons"]:
        assert row["mean_difference"] > 0 and row["valid"] is False
        assert row["degenerate"] == {"cell": {}, "baseline": collapsed["degenerate"]["dev"]}
    text = (tmp_path / "report.md").read_text()
    assert "| strategy=finetune_only | 0.5833 ± 0.0000 |" in text
    assert report["majority_in_metric"] == report["majority_baseline"] == 7 / 12
    assert "In the reported" not in text  # the metric is accuracy: the baseline line says it already
    assert "Majority-class dev accuracy (from the parsed labels): 0.5833." in text
    assert "entity counts" not in text
    assert "**dev**: one_class 3/3, f1_zero 3/3, at_or_below_majority 3/3 |" in text
    # The gain is struck through and named invalid, in the comparisons and the paper layout alike.
    assert "| strategy=stack_and_finetune | strategy=finetune_only | no: baseline one_class 3/3" in text
    gain = f"{100 * (11 / 12 - 7 / 12):+.2f}"
    assert f"~~{gain} [{gain}, {gain}]~~" in text  # the t-interval of a gain without spread is the point
    assert "| not found |" in text and text.count("| no |") == 2


def test_a_phase_one_stopped_with_its_head_at_the_majority_class_is_counted(tmp_path):
    # QQP's BiMPM: the gap rule (train subset 0.544 vs dev 0.510) stopped phase 1 at step 100 of 120 with
    # a head below the majority class (0.627): noise on 500 train examples, not overfitting.
    g = _grid(axes="strategy=finetune_only|stack_and_finetune", num_seeds=3)
    for run in cells.runs_of(g):
        results = {}
        if run.cell[0][1] == "stack_and_finetune":
            noise_stop = run.seed == 1
            phase1 = {
                "phase": "phase1",
                "steps": 100 if noise_stop else 120,
                "stop_reason": "train/dev accuracy gap 0.0343 exceeded max_train_dev_gap=0.03"
                if noise_stop
                else "step budget of 120 steps",
                "boundary": {"dev": {"accuracy": 0.5 if noise_stop else 0.75}, "head_param_norm": 1.0},
            }
            results["phases"] = [phase1, {"phase": "phase2", "steps": 3}]
        _scored_run(tmp_path, run, {"dev": (_learned(run.seed, 2), LABELS_12)}, **results)
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    (row,) = json.loads((tmp_path / "report.json").read_text())["boundaries"]
    assert (row["n"], row["stopped_by_rule"], row["head_at_floor"]) == (3, 1, 1)
    assert row["dev_accuracy"]["mean"] == pytest.approx((0.5 + 0.75 + 0.75) / 3)
    text = (tmp_path / "report.md").read_text()
    assert "majority label (0.5833)" in text
    assert "| strategy=stack_and_finetune | phase1 | 113.333 ± 11.547 | 1/3 | 0.667 ± 0.144 | 1/3 |" in text


def test_the_bootstrap_recomputes_entity_f1_and_test_is_shown_beside_dev(tmp_path):
    gold = [
        ["B-PER", "I-PER", "O"],
        ["O", "B-LOC", "O", "B-ORG"],
        ["B-PER", "O"],
        ["O", "B-LOC", "I-LOC"],
    ] * 3
    # A tagging grid: the report reads each run's task from its resolved config, not from the records.
    g = _grid(
        base="configs/tiny.py:conll",
        axes="strategy=finetune_only|stack_and_finetune",
        num_seeds=2,
        metric="f1",
    )

    def tagged(seed: int, misses: int) -> list[list[str]]:
        predicted = [list(s) for s in gold]
        for i in range(misses):  # drop one gold entity's B- tag per miss
            sentence = predicted[(seed + 2 * i) % len(predicted)]
            first = next((j for j, t in enumerate(sentence) if t.startswith("B-")), None)
            if first is not None:
                sentence[first] = "O"
        return predicted

    for run in cells.runs_of(g):
        misses = 5 if run.cell[0][1] == "finetune_only" else 2
        dev = tagged(run.seed, misses)
        if run.cell[0][1] == "finetune_only":  # an I- start: an entity for conlleval's f1, none for strict
            dev[2][0] = "I-PER"
        _scored_run(tmp_path, run, {"dev": (dev, gold), "test": (tagged(1, misses), gold)})
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())
    (row,) = report["comparisons"]
    # The bootstrap's observed difference is the reported metric's (entity F1), seed by seed averaged.
    assert row["valid"] and row["bootstrap"]["difference"] == pytest.approx(row["mean_difference"])
    assert row["bootstrap"]["ci95_low"] <= row["mean_difference"] <= row["bootstrap"]["ci95_high"]
    assert row["test_mean_difference"] > 0
    assert row["test_bootstrap"]["difference"] == pytest.approx(row["test_mean_difference"])
    cell = report["cells"][1]
    assert cell["test"]["n"] == 2 and cell["test"]["std"] == 0.0
    text = (tmp_path / "report.md").read_text()
    assert f"| {_fmt4(cell['test']['mean'])} ± 0.0000 |" in text
    assert f"| {100 * row['test_mean_difference']:+.2f} [" in text  # the test t-interval beside dev's
    # Entity F1 per type, mean and std over seeds, in report.json and as a table per split.
    runs = [r for r in cells.runs_of(g) if r.cell == cells.runs_of(g)[-1].cell]
    per_seed = [json.loads((tmp_path / "runs" / r.name / "results.json").read_text()) for r in runs]
    assert set(cell["dev_by_type"]) == {"LOC", "ORG", "PER"}
    assert cell["dev_by_type"]["PER"]["mean"] == pytest.approx(
        np.mean([results["final"]["dev"]["f1_PER"] for results in per_seed])
    )
    assert "dev f1 per type" in text and "test f1 per type" in text and "| cell | LOC | ORG | PER |" in text
    # The floor in both units: all-O token accuracy (what the flags compare) and all-O entity F1, 0.
    o_share = sum(t == "O" for s in gold for t in s) / sum(len(s) for s in gold)
    assert report["majority_baseline"] == pytest.approx(o_share) and report["majority_in_metric"] == 0.0
    assert f"the most frequent tag on every word, from the parsed labels): {o_share:.4f}." in text
    assert "(from per-sentence entity counts)" in text
    assert "In the reported `f1`, always predicting that label (tag) scores 0.0000." in text
    # Strict IOB2 F1 beside conlleval's, said which is which; the baseline's extra I- start (dev) is a right
    # entity for conlleval only, so its strict F1 is lower and the strict difference larger.
    assert report["beside_metrics"] == ["strict_f1"] and set(row["beside"]["strict_f1"]) == {"dev", "test"}
    strict_dev = row["beside"]["strict_f1"]["dev"]["t_interval"]["mean"]
    assert strict_dev > row["mean_difference"]
    assert "`strict_f1`: entity F1 under strict IOB2" in text and "| dev strict_f1 mean ± std |" in text
    assert f"{100 * strict_dev:+.2f} [" in text
    # Test read as dev: TOST at the grid's margin, the t-test p Holm-corrected over the test rows (one).
    assert row["test"]["tost"]["margin"] == report["statistics"]["equivalence_margin"]


@pytest.mark.slow
def test_test_rows_are_read_as_dev_holm_over_the_test_table_tost_and_a_power_line(tmp_path):
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.weightstats import ttost_paired

    g = _grid(
        axes="strategy=finetune_only|stack_only|stack_and_finetune", num_seeds=3, equivalence_margin=0.2
    )
    wrong = {"finetune_only": (3, 4, 3), "stack_only": (2, 2, 3), "stack_and_finetune": (1, 0, 2)}
    for run in cells.runs_of(g):
        misses = wrong[run.cell[0][1]][run.seed]
        _scored_run(
            tmp_path,
            run,
            {
                "dev": (_learned(run.seed, misses), LABELS_12),
                "test": (_learned(run.seed + 1, misses), LABELS_12),
            },
        )
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())
    rows = report["comparisons"]
    tests = [row["test"] for row in rows]
    raw = [t["t_interval"]["p_value"] for t in tests]
    assert len(rows) == 2 and None not in raw
    assert [t["t_test_p_holm"] for t in tests] == pytest.approx(list(multipletests(raw, method="holm")[1]))
    for t in tests:
        d = np.asarray(t["per_seed"])
        assert t["tost"]["p_value"] == pytest.approx(ttost_paired(d, np.zeros_like(d), -0.2, 0.2)[0])
        assert t["detectable_at_80_power"] > 0  # defined at 3 seeds with spread (its value: test_statistics)
    text = (tmp_path / "report.md").read_text()
    assert "t-test p Holm-corrected over the table's 2 test rows" in text
    assert "| test TOST p |" in text and "Power: the smallest true difference" in text
    holm = f"{raw[0]:.3f} ({tests[0]['t_test_p_holm']:.3f})"
    assert holm in text


def _fmt4(value: float) -> str:
    return f"{value:.4f}"


def test_report_states_what_tests_can_show_at_five_seeds(tmp_path):
    g = _grid(axes="strategy=finetune_only|stack_and_finetune", num_seeds=5)
    for run in cells.runs_of(g):
        better = run.cell[0][1] == "stack_and_finetune"
        _scored_run(tmp_path, run, {"dev": (_learned(run.seed, 1 if better else 3), LABELS_12)})
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    (row,) = json.loads((tmp_path / "report.json").read_text())["comparisons"]
    assert row["per_seed"] == pytest.approx([2 / 12] * 5)  # better at every seed, by the same amount
    # Two-sided: better at all 5 seeds gives the sign flip 2/32, which cannot reach 0.05, and the report
    # says so.
    assert row["sign_flip_p"] == pytest.approx(2 / 32) and row["wilcoxon_p"] == pytest.approx(0.0625)
    assert row["smallest_p"] == {"t_test": 0.0, "wilcoxon": 0.0625, "sign_flip": 2 / 32}
    assert row["can_reach_alpha"] == {"t_test": True, "wilcoxon": False, "sign_flip": False}
    assert row["t_test_p"] is None  # no spread in the differences
    text = (tmp_path / "report.md").read_text()
    assert text.count("0.062 (0.062) †") == 2
    assert "Wilcoxon and sign flip 2/2^n (0.0625 at 5" in text
    assert "At 5 seeds the exact two-sided sign-flip and Wilcoxon tests cannot reach 0.05" in text
    assert "per type" not in text  # accuracy has no per-type scores


def test_costs_per_cell_and_the_papers_gains(tmp_path):
    g = _grid(
        axes="strategy=finetune_only|stack_and_finetune",
        num_seeds=2,
        paper_results="strategy=stack_and_finetune: +4.7",
    )
    for run in cells.runs_of(g):
        stacked = run.cell[0][1] == "stack_and_finetune"
        costs = {"train_steps": 6 if stacked else 3, "examples_seen": 96 if stacked else 48,
                 "wall_time_s": 10.0 + run.seed}  # fmt: skip
        _scored_run(tmp_path, run, {"dev": (_learned(run.seed, 1 if stacked else 2), LABELS_12)}, **costs)
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())
    stacked = next(c for c in report["costs"] if c["name"] == "strategy=stack_and_finetune")
    assert (stacked["n"], stacked["train_steps"]["mean"], stacked["examples_seen"]["total"]) == (2, 6, 192)
    assert stacked["wall_time_s"] == {"mean": 10.5, "total": 21.0}
    assert report["paper_results"] == {
        "strategy=stack_and_finetune vs strategy=finetune_only": {"gain": 4.7, "note": ""}
    }
    text = (tmp_path / "report.md").read_text()
    assert "| strategy=stack_and_finetune | 2 | 6 | 96 | 10.5 | 21.0 |" in text
    assert "| strategy=stack_and_finetune | strategy=finetune_only | +4.70 | +8.33 [" in text
    noted = _grid(axes="strategy=finetune_only|stack_and_finetune", paper_results=(
        "strategy=stack_and_finetune vs strategy=finetune_only: +4.7 (abstract, per task)"))  # fmt: skip
    assert cells.paper_results(noted) == {
        "strategy=stack_and_finetune vs strategy=finetune_only": {"gain": 4.7, "note": "abstract, per task"}
    }

    with pytest.raises(ConfigError, match="no cell is named 'strategy=nope'"):
        cells.paper_results(_grid(paper_results="strategy=nope: 1.0"))


# A grid keeps its finished runs' predictions compact (prediction_files.compact), their keys and labels in
# the grid's examples/ folder, committed with them.
COMMITTABLE = ("results.json", "config.json", "metrics.jsonl", "timings.json", "predictions/dev.npz",
               "predictions/test.npz")  # fmt: skip


@pytest.mark.slow
def test_the_report_needs_only_the_committable_files_of_each_run(tmp_path, caplog):
    # A real tiny grid, one seed, scored on a labelled test file too; its runs reduced to the small files
    # one commits per run (no checkpoints, caches or events): `--report_only` gives the same report.
    grid_file = tmp_path / "tiny_with_test.py"
    grid_file.write_text(
        "from configs.experiments import tiny\n\n\ndef get_config(arg=None):\n"
        "    c = tiny.get_config()\n    c.num_seeds = 1\n"
        f"    c.base += ',data.test_file={REPO / 'tests/fixtures/qqp/dev.tsv'}'\n    return c\n"
    )
    g = config_cli.load(str(grid_file), [])
    full, committed = tmp_path / "full", tmp_path / "committed"
    with caplog.at_level("INFO"):
        assert grid.run_grid(g, full)
    for run_dir in (full / "runs").iterdir():
        results = json.loads((run_dir / "results.json").read_text())
        steps = 3 * len(results["phases"])  # 3 steps per phase: finetune_only 1 phase, stack_and_finetune 2
        assert results["train_steps"] == steps
        assert results["examples_seen"] == steps * results["global_batch_size"]
        for split in ("dev", "test"):  # the flags train.run wrote are the ones its prediction files give
            records = list(prediction_files.read(prediction_files.path(run_dir, split)).values())
            flags = degenerate.flags(records, results["final"][split], "classification")
            assert results["degenerate"][split] == flags
        for name in COMMITTABLE:
            (committed / "runs" / run_dir.name / name).parent.mkdir(parents=True, exist_ok=True)
            (committed / "runs" / run_dir.name / name).write_bytes((run_dir / name).read_bytes())
    shutil.copytree(full / grid.EXAMPLES, committed / grid.EXAMPLES)
    last = [r for r in caplog.records if r.name == "stackft_jax.training.train"][-1]
    flagged = json.loads((full / "runs" / "strategy=stack_and_finetune-seed0" / "results.json").read_text())
    if flagged["degenerate"]["dev"]:  # a degenerate run says so in its last line
        assert last.levelname == "WARNING" and flagged["degenerate"]["dev"][0] in last.getMessage()

    grid_report.write_report(g, full, aso_iterations=ASO_ITERATIONS)  # one seed: no ASO either way
    proc = subprocess.run(
        [sys.executable, "-m", "stackft_jax.experiment", f"--config={grid_file}", f"--workdir={committed}",
         "--report_only"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    reports = [json.loads((w / "report.json").read_text()) for w in (full, committed)]
    keys = ("runs", "ensembles", "cells", "comparisons", "costs", "majority_baseline")
    assert {k: reports[0][k] for k in keys} == {k: reports[1][k] for k in keys}
    assert "test" in reports[1]["cells"][0] and "test_mean_difference" in reports[1]["comparisons"][0]
    assert len(reports[1]["costs"]) == 3  # two cells and their ensemble
    assert not list(committed.rglob("checkpoints")) and (committed / "report.md").is_file()


def test_status_lists_what_is_left_and_writes_nothing(tmp_path):
    g = _grid(axes="strategy=finetune_only|stack_and_finetune", num_seeds=2)
    runs = cells.runs_of(g)
    _scored_run(tmp_path, runs[0], {"dev": (_learned(0, 1), LABELS_12)})  # finished
    (tmp_path / "runs" / runs[1].name).mkdir()  # started: a folder, no results
    states = grid.run_states(g, tmp_path)
    assert [(position, run, state) for position, run, state in states] == [
        (0, runs[0], "finished"),
        (1, runs[1], "started"),
        (2, runs[2], "not started"),
        (3, runs[3], "not started"),
    ]
    assert grid.status_lines(states, 2) == [
        "1/4 runs finished, 1 started, 2 not started",
        f"  started      shard 1/2  {runs[1].name}",
        f"  not started  shard 0/2  {runs[2].name}",
        f"  not started  shard 1/2  {runs[3].name}",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # no binding, no report


CROSS = "strategy=stack_and_finetune-name=esim vs strategy=finetune_only-name=cls_mlp"


def test_configured_comparisons_pair_any_two_cells_with_a_t_interval_first(tmp_path):
    g = _grid(num_seeds=3, comparisons=f"{CROSS}; baseline", bootstrap_samples=200)
    wrong = {("finetune_only", "cls_mlp"): 3, ("finetune_only", "esim"): 5,
             ("stack_and_finetune", "cls_mlp"): 3, ("stack_and_finetune", "esim"): 1}  # fmt: skip
    for run in cells.runs_of(g):
        strategy, head = dict(run.cell)["strategy"], dict(run.cell)["head.name"]
        # Seed 1 of the stacked esim cell misses one more: the cross row's differences vary by seed.
        misses = (
            wrong[strategy, head]
            + (run.seed == 2)
            + (run.seed == 1 and strategy == "stack_and_finetune" and head == "esim")
        )
        _scored_run(tmp_path, run, {"dev": (_learned(run.seed, misses), LABELS_12)})
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())
    rows = report["comparisons"]
    # The configured cross-head row first, then the same-head baseline rows.
    assert [f"{r['name']} vs {r['versus']}" for r in rows] == [
        CROSS,
        "strategy=stack_and_finetune-name=cls_mlp vs strategy=finetune_only-name=cls_mlp",
        "strategy=stack_and_finetune-name=esim vs strategy=finetune_only-name=esim",
    ]
    assert [r["configured"] for r in rows] == [True, False, False]
    cross = rows[0]
    by_name = {r["name"]: r for r in report["runs"]}
    expected = [
        by_name[f"strategy=stack_and_finetune-name=esim-seed{s}"]["final"]["dev"]["accuracy"]
        - by_name[f"strategy=finetune_only-name=cls_mlp-seed{s}"]["final"]["dev"]["accuracy"]
        for s in range(3)
    ]
    assert cross["per_seed"] == pytest.approx(expected)
    t = scipy.stats.ttest_1samp(expected, 0.0)
    interval = t.confidence_interval(0.95)
    assert cross["t_interval"]["ci_low"] == pytest.approx(interval.low)
    assert cross["t_interval"]["ci_high"] == pytest.approx(interval.high)
    assert cross["t_test_p"] == pytest.approx(t.pvalue)
    # At least the grid's bootstrap_samples, doubled (up to 8 times) while its MC error is above 0.05 point.
    assert 200 <= cross["bootstrap"]["samples"] <= 1600 and cross["bootstrap"]["mc_error"] > 0
    assert cross["tost"]["margin"] == 0.01
    text = (tmp_path / "report.md").read_text()
    assert "| strategy=stack_and_finetune-name=esim | strategy=finetune_only-name=cls_mlp | yes |" in text
    assert f"{100 * np.mean(expected):+.2f} [{100 * interval.low:+.2f}, {100 * interval.high:+.2f}]" in text
    assert "**Primary interval: the seed-level paired t-interval**" in text
    assert "Compute per cell: not shown" in text  # no experiments/compute.py in this version


@pytest.mark.parametrize(
    ("comparisons", "message"),
    [
        ("strategy=nope vs strategy=finetune_only-name=cls_mlp", "no cell is named 'strategy=nope'"),
        ("strategy=finetune_only-name=cls_mlp", "is not `<cell name> vs <cell name>`"),
        (f"{CROSS.split(' vs ')[1]} vs {CROSS.split(' vs ')[1]}", "compares a cell with itself"),
    ],
)
def test_bad_comparisons_are_named_before_training(tmp_path, comparisons, message):
    with pytest.raises(config_cli.ConfigError, match=re.escape(message)):
        grid.plan_grid(_grid(comparisons=comparisons), tmp_path)
    assert not (tmp_path / "grid_config.json").exists()


def test_an_ensemble_can_be_compared_with_a_single_run():
    g = _grid(
        ensembles="head.name=cls_mlp+esim",
        comparisons="strategy=stack_and_finetune-name=cls_mlp+esim vs strategy=finetune_only-name=cls_mlp",
    )
    (row,) = cells.comparisons_of(g)
    assert row.cell == (("strategy", "stack_and_finetune"), ("head.name", "cls_mlp+esim"))
    assert row.other == (("strategy", "finetune_only"), ("head.name", "cls_mlp")) and row.configured
    # Without the key: today's rows, every cell (ensembles too) against its same-head baseline.
    default = cells.comparisons_of(_grid(ensembles="head.name=cls_mlp+esim"))
    assert [r.label for r in default] == [
        "strategy=stack_and_finetune-name=cls_mlp vs strategy=finetune_only-name=cls_mlp",
        "strategy=stack_and_finetune-name=esim vs strategy=finetune_only-name=esim",
        "strategy=stack_and_finetune-name=cls_mlp+esim vs strategy=finetune_only-name=cls_mlp+esim",
    ]


def test_report_only_keys_change_on_a_finished_grid_without_refusal_or_retraining(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    old = _grid(axes="strategy=finetune_only|stack_and_finetune", num_seeds=2)
    trained = _fake_training(monkeypatch, old, tmp_path)
    assert grid.run_grid(old, tmp_path) and len(trained) == 4
    recorded = (tmp_path / "grid_config.json").read_text()
    new = _grid(
        axes="strategy=finetune_only|stack_and_finetune",
        num_seeds=2,
        comparisons="baseline; strategy=finetune_only vs strategy=stack_and_finetune",
        paper_results="strategy=stack_and_finetune: +4.7 (abstract)",
        equivalence_margin=0.02,
        bootstrap_samples=100,
    )
    assert grid.run_grid(new, tmp_path) and len(trained) == 4  # nothing retrained, nothing refused
    assert (tmp_path / "grid_config.json").read_text() == recorded
    grid_report.write_report(new, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["comparisons"]) == 2 and report["statistics"]["equivalence_margin"] == 0.02
    # A key that changes what trains still binds the workdir.
    with pytest.raises(workdirs.ConfigMismatch, match="grid.num_seeds"):
        grid.plan_grid(_grid(axes="strategy=finetune_only|stack_and_finetune", num_seeds=3), tmp_path)


SF = "strategy=stack_and_finetune"


@pytest.mark.parametrize(
    ("preset", "contrast"),
    [
        (
            "paper_qqp.py",
            "strategy=stack_and_finetune-name=bimpm vs strategy=finetune_only_uniform-name=cls_mlp",
        ),
        (
            "paper_qqp.py:small",
            "strategy=stack_and_finetune-name=sim_transformer vs strategy=finetune_only-name=cls_mlp",
        ),
        (
            "paper_qqp.py:test",
            f"{SF}-name=sim_transformer vs strategy=finetune_only_uniform-name=sim_transformer",
        ),
        (
            "paper_yahoo.py:small",
            f"{SF}-name=densenet+highway_lstm vs {SF}-name=densenet",
        ),
        (
            "paper_yahoo.py:test",
            "strategy=stack_and_finetune-name=densenet+highway_lstm vs strategy=finetune_only-name=cls_mlp",
        ),
        (
            "paper_conll.py",
            "strategy=stack_and_finetune-name=bilstm_crf vs strategy=finetune_only-name=token_mlp",
        ),
        (
            "paper_conll.py:small",
            "strategy=stack_and_finetune-name=bilstm_crf vs strategy=finetune_only-name=token_mlp",
        ),
    ],
)
def test_paper_presets_name_the_papers_contrasts_beside_the_same_head_rows(preset, contrast):
    g = config_cli.load(str(REPO / "configs/experiments" / preset), [], kind="grid")
    rows = cells.comparisons_of(g)
    labels = [r.label for r in rows]
    assert contrast in labels and rows[labels.index(contrast)].configured
    assert any(not r.configured for r in rows)  # the same-head baseline rows stay
    for label in cells.paper_results(g):  # every paper figure stands beside a row the report prints
        assert label in labels


def test_compute_per_cell_and_the_compute_ratio_of_each_comparison(tmp_path, monkeypatch):
    # training/compute.py's run_compute reads a run's record (tests/test_compute.py); here a stand-in
    # with round numbers: the report shows each total per cell and every comparison's ratios.
    from stackft_jax.training import compute

    monkeypatch.setattr(
        compute, "run_compute", lambda run_dir: json.loads((Path(run_dir) / "compute.json").read_text())
    )
    g = _grid(axes="strategy=finetune_only|stack_and_finetune", num_seeds=2, bootstrap_samples=100)
    for run in cells.runs_of(g):
        stacked = run.cell[0][1] == "stack_and_finetune"
        _scored_run(tmp_path, run, {"dev": (_learned(run.seed, 1 if stacked else 2), LABELS_12)})
        compute = {"total": {"flops": 3e12 if stacked else 1e12, "examples": 96 if stacked else 48}}
        (tmp_path / "runs" / run.name / "compute.json").write_text(json.dumps(compute))
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())
    by_cell = {row["name"]: row["compute"] for row in report["compute"]}
    assert by_cell["strategy=stack_and_finetune"] == {"total.examples": 96.0, "total.flops": 3e12}
    (row,) = report["comparisons"]
    assert row["compute_ratio"] == {"total.examples": 2.0, "total.flops": 3.0}
    text = (tmp_path / "report.md").read_text()
    assert "compute: total.flops |" in text and "total.examples x2.00, total.flops x3.00" in text


def test_a_grid_refuses_runs_scored_on_other_data_and_does_not_reuse_them(monkeypatch, tmp_path):
    from stackft_jax.training import train, workdirs

    monkeypatch.chdir(REPO)
    dev = tmp_path / "dev.tsv"
    shutil.copy(REPO / "tests" / "fixtures" / "qqp" / "dev.tsv", dev)
    g = _grid(
        base=f"configs/tiny.py:data.dev_file={dev}",
        axes="strategy=finetune_only|stack_only",
        num_seeds=1,
        baseline="strategy=finetune_only",
    )
    trained = []

    def fake_train(run_spec, run_dir, **_):  # a finished run with the fingerprints train.run records
        run_dir = Path(run_dir)
        trained.append(f"{run_dir.parent.parent.name}/{run_dir.name}")
        run = next(r for r in cells.runs_of(g) if r.name == run_dir.name)
        _fake_recorded_run(run_dir.parent.parent, g, run, 0.75)
        model = workdirs.model_dir(run_spec)
        workdirs.bind_data(run_dir, workdirs.data_files(run_spec), allow_change=False, model_dir=model)

    monkeypatch.setattr(train, "run", fake_train)
    first, second = tmp_path / "first", tmp_path / "second"
    assert grid.run_grid(g, first) is True
    dev.write_text("".join(dev.read_text().splitlines(keepends=True)[:-1]))  # one example fewer
    changed = f"config.data.dev_file = '{dev}' changed since this workdir's run read it"
    with pytest.raises(workdirs.ConfigMismatch, match=f"^grid run strategy=finetune_only-seed0: {changed}"):
        grid.run_grid(g, first)
    with pytest.raises(workdirs.ConfigMismatch, match=f"^grid run strategy=finetune_only-seed0: {changed}"):
        grid_report.write_report(g, first, aso_iterations=ASO_ITERATIONS)
    assert not (first / "report.json").exists()
    # Another grid on the new content trains its runs instead of copying those scored on the old.
    assert grid.run_grid(g, second, reuse_runs_from=[first]) is True
    assert trained[2:] == ["second/strategy=finetune_only-seed0", "second/strategy=stack_only-seed0"]
    assert not list((second / "runs").glob(f"*/{grid.REUSED_FROM}"))


def test_a_mistyped_reuse_source_is_refused_before_the_grid_workdir_is_bound(tmp_path):
    with pytest.raises(config_cli.ConfigError, match="not a grid workdir"):
        grid.run_grid(_grid(num_seeds=1), tmp_path / "grid", reuse_runs_from=[tmp_path / "nope"])
    assert not (tmp_path / "grid").exists()


@pytest.mark.parametrize(
    ("preset", "paper"), [("qqp", "paper_qqp.py:test"), ("conll", "paper_conll.py:test")]
)
def test_the_peft_grid_shares_its_two_baseline_cells_with_the_paper_grid(preset, paper, tmp_path):
    """configs/experiments/peft.py: the adapted cells train their kind; finetune_only and stack_and_finetune
    resolve to the paper grid's runs of the same head and seed, so --reuse_runs_from copies them."""
    peft = config_cli.load(f"configs/experiments/peft.py:{preset}", [], kind="grid")
    ours = grid._run_specs(peft, grid.runs_of(peft), tmp_path / "peft")
    theirs = config_cli.load(f"configs/experiments/{paper}", [], kind="grid")
    paper_specs = {
        r.name: s for r, s in grid._run_specs(theirs, grid.runs_of(theirs), tmp_path / "paper").items()
    }
    head = "cls_mlp" if preset == "qqp" else "token_mlp"
    by_name = {r.name: s for r, s in ours.items()}
    assert len(by_name) == 25
    for strategy in ("finetune_only", "stack_and_finetune"):
        twin = paper_specs[f"strategy={strategy}-name={head}-seed3"]
        assert spec.binding_form(by_name[f"strategy={strategy}-seed3"]) == spec.binding_form(twin)
    for strategy, kind in (("lora", "lora"), ("lp_lora", "lora"), ("bitfit", "bitfit")):
        run = by_name[f"strategy={strategy}-seed0"]
        assert run.phases[-1].adaptation == kind and run.data.test_file


def test_the_report_shows_what_each_phase_trained_where_runs_recorded_it(tmp_path):
    """results.json `phases[i].parameters` per cell (the same at every seed); a report whose runs
    predate the record keeps its form: no key, no table."""
    g = _grid(axes="strategy=finetune_only|lora", baseline="strategy=finetune_only", num_seeds=2)
    g.bootstrap_samples = 100
    counts = {
        "finetune_only": [{"phase": "finetune", "steps": 3, "parameters": {"trained": 1000, "total": 1000}}],
        "lora": [{"phase": "lora", "steps": 3, "parameters": {"trained": 25, "total": 1040}}],
    }
    for run in cells.runs_of(g):
        strategy = run.cell[0][1]
        _scored_run(tmp_path, run, {"dev": (_learned(run.seed, 2), LABELS_12)}, phases=counts[strategy])
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["trained_parameters"] == [
        {"cell": {"strategy": "finetune_only"}, "name": "strategy=finetune_only",
         "phases": [{"phase": "finetune", "trained": 1000, "total": 1000}]},
        {"cell": {"strategy": "lora"}, "name": "strategy=lora",
         "phases": [{"phase": "lora", "trained": 25, "total": 1040}]},
    ]  # fmt: skip
    assert "| strategy=lora | lora 25 (2.40%) | 1,040 |" in (tmp_path / "report.md").read_text()

    for run in cells.runs_of(g):  # the same runs without the record
        _scored_run(tmp_path, run, {"dev": (_learned(run.seed, 2), LABELS_12)})
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    assert "trained_parameters" not in json.loads((tmp_path / "report.json").read_text())
    assert "trained per phase" not in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_the_report_gives_each_matched_cell_its_planned_budget_beside_the_realized_one(tmp_path):
    """A matched cell gets the compared cell's planned cost alone (budgets.py); the report prints that
    plan, the steps it bought and what the compared cell's runs realized in the same unit."""
    g = _grid(
        axes="strategy=finetune_only|stack_and_finetune",
        matched="strategy=finetune_only@matched_steps:stack_and_finetune",
        num_seeds=1,
        bootstrap_samples=100,
    )
    assert grid.run_grid(g, tmp_path)
    grid_report.write_report(g, tmp_path, aso_iterations=ASO_ITERATIONS)
    report = json.loads((tmp_path / "report.json").read_text())
    stacked_run = tmp_path / "runs" / "strategy=stack_and_finetune-seed0"
    stacked = json.loads((stacked_run / "results.json").read_text())
    planned = stacked["config"]["phase1"]["num_steps"] + stacked["config"]["phase2"]["num_steps"]  # 6 + 6
    [row] = report["matched_budgets"]
    assert row == {
        "cell": {"strategy": "finetune_only@matched_steps:stack_and_finetune"},
        "name": "strategy=finetune_only@matched_steps:stack_and_finetune",
        "rule": "steps",
        "head_flops": "",  # a steps rule counts no FLOPs
        "compared": "strategy=stack_and_finetune",
        "planned_budget": float(planned),
        "steps": planned,
        "compared_realized": stacked["train_steps"],
    }
    assert (
        "| strategy=finetune_only@matched_steps:stack_and_finetune | steps | - | "
        f"strategy=stack_and_finetune | {planned} | {planned} | {stacked['train_steps']} |"
    ) in (tmp_path / "report.md").read_text()


def test_the_matched_table_says_which_heads_each_flops_budget_counted():
    row = {"name": "m", "rule": "flops", "compared": "c", "planned_budget": 2e12, "steps": 10.0}
    row["compared_realized"] = None
    rows = [row | {"head_flops": "every"}, row | {"name": "old", "head_flops": "light"}]
    lines = markdown._matched_lines({"matched_budgets": rows})
    assert "| m | flops | every head | c | 2e+12 | 10 | - |" in lines
    assert "| old | flops | light heads only | c | 2e+12 | 10 | - |" in lines
    assert any("`matched_light_heads`" in line for line in lines)

"""Ensembles of finished runs: hand-checked averages and dev-chosen weights, refusals, real CLI runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stackft_jax.config import config_cli
from stackft_jax.experiments import ensembling
from stackft_jax.training import prediction_files

REPO = Path(__file__).resolve().parent.parent

# Two QQP runs over four dev and two test examples; p1 is each run's probability of class 1.
DEV_LABELS = [1, 0, 1, 0]
TEST_LABELS = [1, 0]
P1 = {
    "a": {"dev": [0.9, 0.65, 0.4, 0.2], "test": [0.2, 0.3]},  # dev predictions 1 1 0 0
    "b": {"dev": [0.3, 0.1, 0.8, 0.9], "test": [0.9, 0.1]},  # dev predictions 0 0 1 1
}
# Worked by hand: a dev acc 2/4, F1 (tp 1, fp 1, fn 1) 0.5; test acc 1/2, F1 0 (no tp).
# b dev acc 2/4, F1 0.5; test acc 2/2, F1 1.
FINAL = {
    "a": {
        "dev": {"accuracy": 0.5, "f1": 0.5, "loss": 0.7},
        "test": {"accuracy": 0.5, "f1": 0.0, "loss": 0.7},
    },
    "b": {
        "dev": {"accuracy": 0.5, "f1": 0.5, "loss": 0.7},
        "test": {"accuracy": 1.0, "f1": 1.0, "loss": 0.1},
    },
}


def _write_run(workdir, name, *, task="qqp", final=None, p1=None, labels=None, keys=None, data=None):
    p1 = p1 or P1[name]
    for split, split_labels in (labels or {"dev": DEV_LABELS, "test": TEST_LABELS}).items():
        records = [
            {
                "key": (keys or {}).get(split, [f"{split}{i}" for i in range(len(split_labels))])[i],
                "prediction": int(p > 0.5),
                "label": label,
                "probabilities": [1 - p, p],
            }
            for i, (p, label) in enumerate(zip(p1[split], split_labels, strict=True))
        ]
        prediction_files.write(prediction_files.path(workdir, split), records)
    seed = 0 if name == "a" else 1
    # The config a run records (train.run): the members' task, head, strategy and seed are read from it.
    config = config_cli.load(
        str(REPO / "configs/tiny.py"), [f"data.task={task}", "strategy=stack_and_finetune", f"seed={seed}"]
    )
    results = {
        "config": config_cli.to_plain(config),
        "strategy": "stack_and_finetune",
        "seed": seed,
        "final": final or FINAL[name],
    }
    if data is not None:
        results["data"] = data
    (workdir / "results.json").write_text(json.dumps(results))
    return workdir


@pytest.fixture
def runs(tmp_path):
    return [_write_run(tmp_path / name, name) for name in ("a", "b")]


def test_equal_weights_average_the_probabilities(runs, tmp_path):
    result = ensembling.ensemble(runs)
    # Averaged p1: dev 0.6 0.375 0.6 0.55 -> 1 0 1 1: acc 3/4, F1 (tp 2, fp 1) 0.8; test 0.55 0.2 -> 1 0.
    assert result["ensemble"] == {
        "dev": {"accuracy": 0.75, "f1": pytest.approx(0.8)},
        "test": {"accuracy": 1.0, "f1": 1.0},
    }
    assert [(m["weight"], m["dev"], m["test"]) for m in result["members"]] == [
        (0.5, {"accuracy": 0.5, "f1": 0.5}, {"accuracy": 0.5, "f1": 0.0}),
        (0.5, {"accuracy": 0.5, "f1": 0.5}, {"accuracy": 1.0, "f1": 1.0}),
    ]
    dev = result["predictions"]["dev"]
    assert [r["prediction"] for r in dev] == [1, 0, 1, 1]
    assert dev[1]["probabilities"] == pytest.approx([0.625, 0.375])

    ensembling.write(tmp_path / "ens", result)
    written = json.loads((tmp_path / "ens" / "results.json").read_text())
    assert written["ensemble"]["dev"]["accuracy"] == 0.75 and "predictions" not in written
    # The ensemble's prediction files pair with a member's, example by example.
    pairs = prediction_files.paired(
        prediction_files.path(tmp_path / "ens", "dev"), prediction_files.path(runs[0], "dev")
    )
    assert [a["label"] for a, _ in pairs] == DEV_LABELS


def test_dev_weights_are_chosen_on_dev_never_on_test(runs):
    result = ensembling.ensemble(runs, weights="dev")
    # Dev accuracy is 1 exactly for w_a in {0.6, 0.7} (e.g. 0.6: p1 0.66 0.43 0.56 0.48); 0.6 is nearer
    # to equal weights. On test, w_a = 0 would score 1.0; with 0.6 test p1 is 0.48 0.22 -> acc 1/2.
    assert [m["weight"] for m in result["members"]] == [0.6, 0.4]
    assert result["ensemble"]["dev"] == {"accuracy": 1.0, "f1": 1.0}
    assert result["ensemble"]["test"] == {"accuracy": 0.5, "f1": 0.0}
    assert result["weights"].startswith("dev: best dev accuracy")


def test_simplex_grid_covers_every_split_of_ten_tenths():
    grid = ensembling._simplex_grid(3)
    assert grid.shape == (66, 3)
    assert grid.sum(axis=1) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"task": "mrpc"}, "ran data.task='qqp' but {b} ran 'mrpc'"),
        ({"keys": {"dev": ["dev0", "dev1", "dev2", "other"]}}, "the runs scored different examples"),
        ({"labels": {"dev": [1, 0, 1, 1], "test": TEST_LABELS}}, "differ on example 'dev3': label 0 vs 1"),
        ({"data": {"label_names": ["x", "y"]}}, "has label names None but {b} has ['x', 'y']"),
        (
            {"final": {**FINAL["b"], "dev": {"accuracy": 0.75, "f1": 0.5}}},
            "gives accuracy=0.5 but {b}/results.json has final.dev.accuracy=0.75",
        ),
    ],
)
def test_incompatible_runs_are_refused_naming_the_mismatch(runs, tmp_path, change, message):
    other = _write_run(tmp_path / "other", "b", **change)
    with pytest.raises(ensembling.EnsembleError) as error:
        ensembling.ensemble([runs[0], other])
    assert message.format(b=other) in str(error.value)


def test_unfinished_and_regression_runs_are_refused(runs, tmp_path):
    (tmp_path / "unfinished").mkdir()
    with pytest.raises(ensembling.EnsembleError, match="unfinished: no results.json"):
        ensembling.ensemble([runs[0], tmp_path / "unfinished"])
    # The task comes from the run's recorded config (resolved), not from the records' shape.
    regression = _write_run(tmp_path / "stsb", "b", task="stsb")
    with pytest.raises(ensembling.EnsembleError, match="data.task='stsb', a regression task"):
        ensembling.ensemble([runs[0], regression])
    file = prediction_files.path(runs[1], "dev")
    prediction_files.write(file, [{"key": "dev0", "prediction": 2.5, "label": 3.0}])
    with pytest.raises(
        ensembling.EnsembleError, match="has no `probabilities`, which the classification run"
    ):
        ensembling.ensemble(runs)
    with pytest.raises(ensembling.EnsembleError, match="at least two runs"):
        ensembling.ensemble(runs[:1])


def _ensemble_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "stackft_jax.ensemble", *args], cwd=REPO, capture_output=True, text=True
    )


def test_cli_refusal_is_one_line_with_status_2(runs, tmp_path):
    other = _write_run(tmp_path / "other", "b", task="mrpc")
    proc = _ensemble_cli(f"--workdirs={runs[0]},{other}", f"--out={tmp_path / 'ens'}")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"error: {runs[0]} ran data.task='qqp' but {other} ran 'mrpc'\n"
    assert not (tmp_path / "ens").exists()


@pytest.mark.slow
def test_ensemble_of_two_real_tiny_runs(uninterrupted, run_cli, tmp_path):
    seed1 = tmp_path / "seed1"
    proc = run_cli(seed1, "--config.seed=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "ens"
    proc = _ensemble_cli(f"--workdirs={uninterrupted},{seed1}", f"--out={out}", "--weights=dev")
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    for member, workdir in zip(results["members"], (uninterrupted, seed1), strict=True):
        own = json.loads((workdir / "results.json").read_text())["final"]["dev"]
        assert member["dev"] == {k: own[k] for k in ("accuracy", "f1")}
    assert sum(m["weight"] for m in results["members"]) == pytest.approx(1.0)
    assert (
        len(prediction_files.paired(prediction_files.path(out, "dev"), prediction_files.path(seed1, "dev")))
        == 16
    )
    assert "ensemble" in proc.stdout and str(seed1) in proc.stdout

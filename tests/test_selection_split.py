"""The selection split (data.selection_fraction): a fixed, seeded slice of train that selection reads, so
that dev and test are only reported."""

import json

import pytest

from configs import tiny
from stackft_jax.config import config_cli, spec
from stackft_jax.data import task_spec, tasks
from stackft_jax.training import prediction_files, train

TRAIN = {"train": tiny.FIXTURES / "qqp" / "train.tsv", "dev": tiny.FIXTURES / "qqp" / "dev.tsv"}


def _keys(examples) -> set[str]:
    return {e.key for e in examples}


def test_the_slice_is_disjoint_from_train_and_fixed_by_its_seed():
    task = tasks.get_task("qqp")
    everything = task_spec.read_splits(task, TRAIN)
    split = task_spec.read_splits(task, TRAIN, selection_fraction=0.2, selection_seed=0)
    assert len(split["selection"]) == 8 and len(split["train"]) == 32  # ceil(0.2 * 40) of 40
    assert not _keys(split["selection"]) & _keys(split["train"])
    assert _keys(split["selection"]) | _keys(split["train"]) == _keys(everything["train"])
    assert _keys(split["dev"]) == _keys(everything["dev"])  # dev is its own file: untouched
    again = task_spec.read_splits(task, TRAIN, selection_fraction=0.2, selection_seed=0)
    other = task_spec.read_splits(task, TRAIN, selection_fraction=0.2, selection_seed=1)
    assert [e.key for e in again["selection"]] == [e.key for e in split["selection"]]
    assert _keys(other["selection"]) != _keys(split["selection"])


def test_a_held_out_dev_comes_from_what_the_slice_leaves():
    task = tasks.get_task("qqp")
    task = type(task).__new__(type(task))
    task.__dict__.update(tasks.get_task("qqp").__dict__, dev_fraction=0.25)
    split = task_spec.read_splits(task, {"train": TRAIN["train"]}, selection_fraction=0.2)
    assert (len(split["train"]), len(split["dev"]), len(split["selection"])) == (24, 8, 8)
    assert not _keys(split["dev"]) & _keys(split["selection"])


@pytest.mark.parametrize("fraction", [0.6, -0.1, 1.0])
def test_a_fraction_outside_zero_to_a_half_is_one_line_before_any_run(fraction):
    config = config_cli.load("configs/tiny.py", [f"data.selection_fraction={fraction}"])
    with pytest.raises(config_cli.ConfigError, match=r"'data.selection_fraction' = .*\(0, 0.5\]$"):
        spec.resolve(config)


def test_recorded_runs_without_the_key_read_as_off():
    current = spec.resolve(config_cli.load("configs/tiny.py", []))
    old = current.raw | {
        "data": {k: v for k, v in current.raw["data"].items() if not k.startswith("selection")}
    }
    assert spec.resolve(spec.config_from_plain(old), recorded=True).data.selection_fraction == 0.0
    assert spec.recorded_binding_form(old, current.raw) == spec.binding_form(current)


@pytest.mark.slow
def test_selection_reads_the_slice_and_dev_and_test_are_only_reported(tmp_path):
    """The phase-1 gap rule (any gap exceeds -1) stops at its first evaluation, of the slice; every
    evaluation of the loop is of the slice; final scoring reports dev and test and scores the slice."""
    config = tiny.get_config()
    config.data.test_file = str(tiny.FIXTURES / "qqp" / "test.tsv")
    config.data.selection_fraction = 0.2
    config.phase1.max_train_dev_gap = -1.0
    config.phase1.num_steps = 9
    results = train.run(config, tmp_path)
    phase1 = results["phases"][0]
    assert phase1["steps"] == 3 and "gap" in phase1["stop_reason"]
    evaluated = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    splits = {r["split"] for r in evaluated if "split" in r}
    assert "selection" in splits and "dev" not in splits
    assert set(results["final"]) == {"dev", "selection"}  # the fixture's test file has no labels
    assert results["data"]["num_examples"] == {"train": 32, "dev": 16, "test": 3, "selection": 8}
    assert results["data"]["selection_fraction"] == 0.2
    scored = prediction_files.read(prediction_files.path(tmp_path, "selection"))
    held = task_spec.read_splits(tasks.get_task("qqp"), TRAIN, selection_fraction=0.2)["selection"]
    assert set(scored) == _keys(held)
    # the stop rule's read: train subset minus the slice's score at its first evaluation
    first = {
        r["split"]: r["accuracy"]
        for r in evaluated
        if r.get("split") in ("selection", "train_subset") and r["phase"] == "phase1"
    }
    gap = first["train_subset"] - first["selection"]
    assert f"accuracy gap {gap:.4f} exceeded" in phase1["stop_reason"]

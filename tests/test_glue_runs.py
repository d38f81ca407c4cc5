"""configs/glue.py end to end on the tiny model: single-sentence SST-2, regression STS-B, pair heads."""

import numpy as np
import pytest

from configs import glue, tiny
from stackft_jax.training import prediction_files, train

FIXTURES = tiny.FIXTURES
WORDS = "the a film plot dog cat runs sleeps good bad funny dull bright quiet park river".split()


def _sentences(n, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(3, 9))) + " ." for _ in range(n)]


def _write_sst2(path, n=24):
    rows = [f"{s}\t{i % 2}" for i, s in enumerate(_sentences(n, 0))]
    path.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")


def _write_stsb(path, n=24):
    a, b = _sentences(n, 1), _sentences(n, 2)
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    rows = [
        f"{i}\tmain\tinvented\t2024\t{i:04d}\tnone\tnone\t{a[i]}\t{b[i]}\t{(i * 0.37) % 5:.3f}"
        for i in range(n)
    ]
    path.write_text(header + "\n" + "\n".join(rows) + "\n")


def _tiny_glue(task: str, train_file, head: str = "cls_mlp"):
    config = glue.get_config(f"task={task},head={head}")
    reference = tiny.get_config()
    for key in (
        "model",
        "max_seq_length",
        "per_device_batch_size",
        "eval_per_device_batch_size",
        "log_every_steps",
        "eval_every_steps",
        "checkpoint_every_steps",
        "async_checkpointing",
    ):
        config[key] = reference[key]
    for name in config.head:
        if isinstance(config.head[name], type(config.head)):
            config.head[name] = reference.head[name]
    config.phase1 = reference.phase1
    config.phase2 = reference.phase2
    config.data.train_file = config.data.dev_file = str(train_file)
    return config


@pytest.mark.slow
def test_sst2_single_sentence_and_an_unlabelled_test_file(tmp_path):
    _write_sst2(tmp_path / "sst2.tsv")
    config = _tiny_glue("sst2", tmp_path / "sst2.tsv")
    config.data.test_file = str(FIXTURES / "sst2" / "test.tsv")  # GLUE's test layout: no labels
    results = train.run(config, tmp_path / "run")
    assert set(results["final"]) == {"dev"} and set(results["final"]["dev"]) == {"accuracy", "loss"}
    # Predicted, not scored: keyed by the file's `index` column, without labels.
    test = list(prediction_files.read(prediction_files.path(tmp_path / "run", "test")).values())
    assert [r["key"].split("-")[0] for r in test] == ["0", "1", "2"]
    assert all(set(r) == {"key", "prediction", "prediction_name", "probabilities"} for r in test)


@pytest.mark.slow
def test_stsb_regression_with_a_pair_head(tmp_path):
    _write_stsb(tmp_path / "stsb.tsv")
    config = _tiny_glue("stsb", tmp_path / "stsb.tsv", "esim")
    config.strategy = "finetune_only"
    results = train.run(config, tmp_path / "run")
    dev = results["final"]["dev"]
    assert set(dev) == {"pearson", "spearman", "loss"}
    assert -1.0 <= dev["pearson"] <= 1.0 and np.isfinite(dev["loss"])
    assert results["phases"][0]["stop_reason"].startswith("step budget")


@pytest.mark.slow
def test_stsb_gap_rule_compares_pearson(tmp_path):
    """The phase-1 gap rule reads the task's declared gap metric: on STS-B (no accuracy) it fires on
    pearson instead of scoring train rows to no effect."""
    _write_stsb(tmp_path / "stsb.tsv")
    config = _tiny_glue("stsb", tmp_path / "stsb.tsv")
    config.phase1.max_train_dev_gap = -2.0  # any pearson gap (at least -2) exceeds this
    config.phase1.num_steps = 9
    results = train.run(config, tmp_path / "run")
    phase1 = results["phases"][0]
    assert phase1["steps"] == config.eval_every_steps
    assert phase1["stop_reason"].startswith("train/dev pearson gap")


def test_unknown_glue_task_names_the_choices():
    with pytest.raises(ValueError, match="mrpc"):
        glue.get_config("task=cola")

"""Rescoring a CoNLL run recorded before conlleval's entity F1, from its own prediction files: both F1s
in `final`, the scores recorded during training kept under their strict names, nothing else touched."""

import json

import pytest

from stackft_jax.data import metrics
from stackft_jax.training import prediction_files, scoring

GOLD = [["B-PER", "I-PER", "O"], ["B-ORG", "O"], ["O", "B-LOC"]]
# An I- start (sentence 1): an ORG for conlleval's f1, no entity for strict IOB2.
PREDICTED = [["B-PER", "I-PER", "O"], ["I-ORG", "O"], ["O", "O"]]


def _recorded_run(tmp_path, config_data: dict) -> dict:
    strict = metrics.entity_scores(GOLD, PREDICTED)
    old_scores = {k.removeprefix("strict_"): v for k, v in strict.items() if k.startswith("strict_")}
    old_scores |= {"accuracy": strict["accuracy"], "loss": 0.25}
    results = {
        "config": {"data": config_data},
        "task": {"objective": "word_tagging", "scoring": "seqeval strict IOB2"},
        "final": {"dev": dict(old_scores)},
        "degenerate": {"dev": []},
        "best": {"dev": dict(old_scores), "metric": "f1", "value": old_scores["f1"]},
        "phases": [{"phase": "phase1", "boundary": {"dev": dict(old_scores), "train_dev_gap_f1": 0.03,
                                                    "train_dev_gap_accuracy": 0.01, "head_param_norm": 2.0}}],
    }  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(results))
    pairs = enumerate(zip(GOLD, PREDICTED, strict=True))
    records = [{"key": str(i), "label": g, "prediction": p} for i, (g, p) in pairs]
    prediction_files.write(tmp_path / "predictions" / "dev.jsonl.gz", records)
    return results


def test_a_recorded_conll_run_gets_both_f1s_and_keeps_what_training_recorded_as_strict(tmp_path):
    before = _recorded_run(tmp_path, {"task": "conll2003"})
    assert scoring.rescore_entity_scores(tmp_path)
    after = json.loads((tmp_path / "results.json").read_text())
    dev = after["final"]["dev"]
    # conlleval: PER and the I-opened ORG right, LOC missed: 2 of 2 predicted, 2 of 3 gold.
    assert dev["f1"] == pytest.approx(0.8) and dev["precision"] == 1.0
    # strict: PER only: 1 of 1 predicted, 1 of 3 gold; the recorded value, now under its name.
    assert dev["strict_f1"] == pytest.approx(0.5) == before["final"]["dev"]["f1"]
    assert dev["loss"] == 0.25 and after["degenerate"] == {"dev": []}
    assert after["best"]["metric"] == "strict_f1" and after["best"]["dev"]["strict_f1"] == pytest.approx(0.5)
    assert "f1" not in after["best"]["dev"]
    boundary = after["phases"][0]["boundary"]
    assert boundary["train_dev_gap_strict_f1"] == 0.03 and boundary["train_dev_gap_accuracy"] == 0.01
    assert boundary["head_param_norm"] == 2.0 and "train_dev_gap_f1" not in boundary
    assert "conlleval" in after["task"]["scoring"] and "rescored" in after
    assert not scoring.rescore_entity_scores(tmp_path)  # once only


def test_a_run_that_recorded_its_entity_f1_choice_is_not_rescored(tmp_path):
    _recorded_run(tmp_path, {"task": "conll2003", "entity_f1": "conlleval"})
    assert not scoring.rescore_entity_scores(tmp_path)

"""Each degenerate flag on hand-built prediction records, and a run that learned raises none."""

import math
import warnings

import numpy as np
import pytest

from stackft_jax.data import metrics
from stackft_jax.training import degenerate


def _classified(predicted: list[int], labels: list[int]) -> tuple[list[dict], dict]:
    records = [{"key": str(i), "prediction": p, "label": y, "probabilities": [0.5, 0.5]}
               for i, (p, y) in enumerate(zip(predicted, labels, strict=True))]  # fmt: skip
    with warnings.catch_warnings():  # F1 without a positive label warns (test_undefined_f1)
        warnings.simplefilter("ignore")
        scores = metrics.compute_metrics(("accuracy", "f1"), np.asarray(predicted), np.asarray(labels))
    return records, scores


LABELS = [0] * 63 + [1] * 37  # QQP's balance: the majority class scores 0.63


def test_a_collapsed_classifier_raises_every_classification_flag():
    records, scores = _classified([0] * 100, LABELS)
    assert degenerate.flags(records, scores, "classification") == [
        "one_class",
        "f1_zero",
        "at_or_below_majority",
    ]


def test_a_classifier_that_learned_is_not_flagged():
    predicted = [0] * 55 + [1] * 8 + [1] * 30 + [0] * 7  # 85% right, both classes predicted
    records, scores = _classified(predicted, LABELS)
    assert degenerate.flags(records, scores, "classification") == []


def test_nearly_one_class_is_flagged_at_the_threshold():
    predicted = [0] * 99 + [1]  # 99% one class, the one positive right
    records, scores = _classified(predicted, LABELS[:62] + [0] * 37 + [1])
    assert degenerate.flags(records, scores, "classification") == ["one_class"]
    predicted = [0] * 98 + [1] * 2
    records, scores = _classified(predicted, LABELS[:61] + [0] * 37 + [1, 1])
    assert degenerate.flags(records, scores, "classification") == []


def test_below_the_majority_class_with_both_classes_predicted():
    predicted = [1] * 30 + [0] * 33 + [0] * 20 + [1] * 17  # 50% right, below 63%
    records, scores = _classified(predicted, LABELS)
    assert degenerate.flags(records, scores, "classification") == ["at_or_below_majority"]


def test_undefined_f1():
    records, scores = _classified([0, 1, 0, 0], [0, 0, 0, 0])  # no positive label: F1 undefined
    assert math.isnan(scores["f1"])
    assert "f1_undefined" in degenerate.flags(records, scores, "classification")
    assert "f1_undefined" in degenerate.flags(
        records, {**scores, "f1": None}, "classification"
    )  # as results.json has it


GOLD = [["B-PER", "I-PER", "O", "O"], ["O", "B-LOC", "O", "O", "O"], ["O", "O", "O"]]


def _tagged(predicted: list[list[str]]) -> tuple[list[dict], dict]:
    records = [
        {"key": str(i), "prediction": p, "label": g}
        for i, (g, p) in enumerate(zip(GOLD, predicted, strict=True))
    ]
    return records, metrics.entity_scores(GOLD, predicted)


def test_an_all_o_tagger_is_flagged():
    records, scores = _tagged([["O"] * len(g) for g in GOLD])
    assert degenerate.flags(records, scores, "word_tagging") == ["one_class", "f1_zero", "at_or_below_all_o"]


def test_a_tagger_that_finds_entities_is_not_flagged():
    records, scores = _tagged(
        [["B-PER", "I-PER", "O", "O"], ["O", "B-LOC", "O", "O", "O"], ["O", "O", "B-ORG"]]
    )
    assert degenerate.flags(records, scores, "word_tagging") == []


def test_a_tagger_at_the_all_o_accuracy_with_entities_is_flagged():
    # One entity right (F1 > 0) but as many words wrong elsewhere: token accuracy equals all-O's 9/12.
    predicted = [["B-PER", "I-PER", "B-LOC", "B-LOC"], ["O", "O", "O", "O", "O"], ["O", "O", "O"]]
    records, scores = _tagged(predicted)
    assert scores["accuracy"] == pytest.approx(degenerate.all_o_accuracy(GOLD)) == 9 / 12
    assert degenerate.flags(records, scores, "word_tagging") == ["at_or_below_all_o"]


def _regressed(predicted: list[float]) -> tuple[list[dict], dict]:
    labels = [0.5, 1.5, 2.5, 3.5, 4.5]
    records = [
        {"key": str(i), "prediction": p, "label": y}
        for i, (p, y) in enumerate(zip(predicted, labels, strict=True))
    ]
    with warnings.catch_warnings():  # scipy warns that r is undefined for constant input
        warnings.simplefilter("ignore")
        scores = {"pearson": metrics.pearson(np.asarray(predicted), np.asarray(labels))}
    return records, scores


def test_constant_regression_predictions():
    records, scores = _regressed([2.0] * 5)
    assert degenerate.flags(records, scores, "regression") == ["constant_predictions", "pearson_undefined"]
    records, scores = _regressed([2.0, 2.001, 2.0, 2.001, 2.0])  # nearly constant, r defined
    assert degenerate.flags(records, scores, "regression") == ["constant_predictions"]
    records, scores = _regressed([0.4, 1.7, 2.2, 3.9, 4.1])
    assert degenerate.flags(records, scores, "regression") == []


def test_the_objective_decides_how_records_are_read():
    records, scores = _classified([0] * 100, LABELS)
    # The same records read as a regression: constant predictions, no class or majority flags.
    assert degenerate.flags(records, scores, "regression") == ["constant_predictions", "f1_zero"]
    with pytest.raises(ValueError, match="objective 'tagging': choose one of"):
        degenerate.flags(records, scores, "tagging")


def test_the_warning_names_each_flagged_split():
    assert degenerate.warning({"dev": [], "test": []}) is None
    text = degenerate.warning({"dev": ["one_class", "f1_zero"], "test": []})
    assert text.startswith("DEGENERATE run (dev: one_class, f1_zero)")

"""Degenerate runs: a score that says nothing about the strategy, because the model did not learn the task.

A run is flagged, per scored split, from its prediction records (predictions.py) and its scores:

  one_class              classification or tagging: ONE_CLASS_SHARE or more of the predictions are one class
                         (tag)
  constant_predictions   regression: the predictions' spread is below CONSTANT_SPREAD of the labels'
  f1_zero                the split's `f1` (binary F1, or entity F1 for tagging) is 0
  f1_undefined           ... or undefined (null / NaN)
  pearson_undefined      regression: Pearson r is undefined (null / NaN): a constant side
  at_or_below_majority   classification: accuracy at or below always predicting the most frequent label
  at_or_below_all_o      tagging: token accuracy at or below tagging every word `O` (the most frequent tag
                         when the tags have no `O`)

scoring.py writes the flags to results.json (`final.<split>.degenerate`) and warns in the run's last log
line; experiments/report.py marks flagged cells and every comparison against or by one.
"""

import collections
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# Collapsed QQP heads predicted one class for 100% of dev; a head that learned anything on a task whose
# dev labels are not themselves >= 99% one class predicts another class for more than 1 in 100 examples.
ONE_CLASS_SHARE = 0.99
# Predictions whose standard deviation is under 1% of the labels' carry no ranking worth a correlation.
CONSTANT_SPREAD = 0.01
_TOLERANCE = 1e-12
OBJECTIVES = ("classification", "regression", "word_tagging")  # objectives.py's, by name (no jax here)

FLAGS = (
    "one_class",
    "constant_predictions",
    "f1_zero",
    "f1_undefined",
    "pearson_undefined",
    "at_or_below_majority",
    "at_or_below_all_o",
)


def _undefined(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def at_or_below(score: float, baseline: float) -> bool:
    """`score` no better than `baseline` (within rounding): what a run that learned nothing scores."""
    return score <= baseline + _TOLERANCE


def majority_share(labels: Sequence[Any]) -> float:
    """Share of the most frequent value (the accuracy of always predicting it)."""
    return collections.Counter(labels).most_common(1)[0][1] / len(labels)


def all_o_accuracy(gold: Sequence[Sequence[str]]) -> float:
    """Token accuracy of tagging every word `O` (of the most frequent tag when there is no `O`)."""
    tags = [tag for sentence in gold for tag in sentence]
    if "O" not in tags:
        return majority_share(tags)
    return tags.count("O") / len(tags)


def flags(records: Sequence[Mapping[str, Any]], scores: Mapping[str, Any], objective: str) -> list[str]:
    """The degenerate flags (in FLAGS order) of one split's labelled prediction records and its scores
    (results.json's `final.<split>`), for the task's objective (objectives.Objective.name:
    classification, regression or word_tagging); [] for a run that learned something."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}: choose one of {OBJECTIVES}")
    if not records or "label" not in records[0]:
        return []
    raised = set()
    for name, flag in (("f1", "f1"), ("pearson", "pearson")):
        if name in scores:
            if _undefined(scores[name]):
                raised.add(f"{flag}_undefined")
            elif flag == "f1" and at_or_below(scores[name], 0.0):
                raised.add("f1_zero")
    if objective == "word_tagging":  # tag names per word
        predicted = [tag for r in records for tag in r["prediction"]]
        gold = [r["label"] for r in records]
        if majority_share(predicted) >= ONE_CLASS_SHARE:
            raised.add("one_class")
        accuracy = np.mean(
            [p == g for r in records for p, g in zip(r["prediction"], r["label"], strict=True)]
        )
        if at_or_below(accuracy, all_o_accuracy(gold)):
            raised.add("at_or_below_all_o")
    elif objective == "classification":
        predicted = [r["prediction"] for r in records]
        labels = [r["label"] for r in records]
        if majority_share(predicted) >= ONE_CLASS_SHARE:
            raised.add("one_class")
        accuracy = np.mean([p == g for p, g in zip(predicted, labels, strict=True)])
        if at_or_below(accuracy, majority_share(labels)):
            raised.add("at_or_below_majority")
    else:  # regression
        predicted = np.asarray([r["prediction"] for r in records], float)
        labels = np.asarray([r["label"] for r in records], float)
        if np.std(predicted) <= CONSTANT_SPREAD * np.std(labels):
            raised.add("constant_predictions")
    return [flag for flag in FLAGS if flag in raised]


def warning(split_flags: Mapping[str, Sequence[str]]) -> str | None:
    """The run's closing warning naming every split's flags; None when no split is flagged."""
    flagged = {split: list(f) for split, f in split_flags.items() if f}
    if not flagged:
        return None
    named = "; ".join(f"{split}: {', '.join(f)}" for split, f in flagged.items())
    return (
        f"DEGENERATE run ({named}): its score says the model did not learn the task "
        "(stackft_jax/training/degenerate.py); do not compare it as a result"
    )

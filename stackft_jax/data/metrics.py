"""Task metrics on host arrays of predictions and gold labels (padding already removed)."""

import warnings
from collections.abc import Callable, Sequence

import numpy as np
import scipy.stats
from sklearn.metrics import f1_score


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(predictions == labels))


def binary_f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """F1 of the positive class (label 1), as GLUE reports for QQP and MRPC; NaN (undefined, with a
    warning) when the labels hold no positive example, where any number would mislead."""
    if not np.any(labels == 1):
        warnings.warn(
            f"F1 is undefined: the {len(labels)} labels hold no positive example (one class only); "
            "reported as NaN (null in the JSON files)",
            stacklevel=2,
        )
        return float("nan")
    return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0))


def macro_f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """The unweighted mean of every class's F1, over the classes in `labels` or `predictions` (a class
    never predicted scores 0 there)."""
    return float(f1_score(labels, predictions, average="macro", zero_division=0.0))


def pearson(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(scipy.stats.pearsonr(predictions, labels).statistic)


def spearman(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(scipy.stats.spearmanr(predictions, labels).statistic)


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "f1": binary_f1,
    "macro_f1": macro_f1,
    "pearson": pearson,
    "spearman": spearman,
}


def compute_metrics(names: Sequence[str], predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    return {name: METRICS[name](predictions, labels) for name in names}


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """Sequence labelling (IOB2 tag names per sentence): entity-level micro precision, recall and F1 by
    seqeval in strict IOB2 mode (an entity counts only if its B-/I- tags are well formed and its span
    and type match exactly), F1 per entity type (`f1_PER`, ...), and token accuracy.

    Recall and F1 are undefined without gold entities (as `binary_f1` without positives): NaN with a
    warning, overall and for each type the gold tags lack; precision is NaN only when nothing is
    predicted either."""
    from seqeval.metrics import accuracy_score
    from seqeval.metrics.v1 import precision_recall_fscore_support, unique_labels
    from seqeval.scheme import IOB2

    if [len(s) for s in gold] != [len(s) for s in predicted]:
        raise ValueError("gold and predicted tag sequences differ in number or length")
    gold, predicted = [list(s) for s in gold], [list(s) for s in predicted]
    scores = {"accuracy": float(accuracy_score(gold, predicted)) if gold else float("nan")}
    gold_types = {tag[2:] for sentence in gold for tag in sentence if tag != "O"}
    if not gold_types:
        warnings.warn(
            f"entity recall and F1 are undefined: the gold tags of {len(gold)} sentences hold no entity; "
            "reported as NaN (null in the JSON files)",
            stacklevel=2,
        )
    kwargs = {"scheme": IOB2, "mode": "strict", "zero_division": 0}
    nan = float("nan")
    if any(tag != "O" for sentence in predicted for tag in sentence) or gold_types:
        precision, recall, f1, _ = precision_recall_fscore_support(gold, predicted, average="micro", **kwargs)
        per_type = precision_recall_fscore_support(gold, predicted, average=None, **kwargs)[2]
        for name, value in zip(unique_labels(gold, predicted, IOB2), per_type, strict=True):
            scores[f"f1_{name}"] = float(value) if name in gold_types else nan
    else:
        precision = recall = f1 = nan
    if not gold_types:
        recall = f1 = nan
    scores.update(f1=float(f1), precision=float(precision), recall=float(recall))
    return scores


ENTITY_SCORING = "seqeval strict IOB2 (entity-level micro P/R/F1), token accuracy"

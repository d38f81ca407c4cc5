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


def pearson(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(scipy.stats.pearsonr(predictions, labels).statistic)


def spearman(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(scipy.stats.spearmanr(predictions, labels).statistic)


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "f1": binary_f1,
    "pearson": pearson,
    "spearman": spearman,
}


def compute_metrics(
    names: Sequence[str], predictions: np.ndarray, labels: np.ndarray
) -> dict[str, float]:
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    return {name: METRICS[name](predictions, labels) for name in names}

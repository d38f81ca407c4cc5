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


ENTITY_F1 = ("conlleval", "strict")  # config key data.entity_f1: which entity F1 a run's rules read
STRICT_PREFIX = "strict_"  # the strict IOB2 scores' names: strict_f1, strict_precision, strict_f1_PER, ...


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """Sequence labelling (IOB2 tag names per sentence): entity-level micro precision, recall and F1 under
    two conventions, F1 per entity type under each, and token accuracy.

    `f1`, `precision`, `recall`, `f1_PER`, ...: conlleval's convention (seqeval's default mode), the one
    the field reports CoNLL-2003 in: an `I-` tag that opens an entity (after `O` or another type) starts
    one. `strict_f1`, `strict_precision`, `strict_recall`, `strict_f1_PER`, ...: seqeval in strict IOB2
    mode, where such an entity does not count. On well-formed IOB2 sequences (a CRF's constrained decode)
    the two agree; an unconstrained head's ill-formed `I-` starts score under conlleval only.

    Recall and F1 are undefined without gold entities (as `binary_f1` without positives): NaN with a
    warning, overall and for each type the gold tags lack; precision is NaN only when nothing is
    predicted either."""
    from seqeval.metrics import accuracy_score

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
    for prefix, strict in (("", False), (STRICT_PREFIX, True)):
        scores.update(_entity_prf(gold, predicted, gold_types, strict=strict, prefix=prefix))
    return scores


def _entity_prf(
    gold: list[list[str]], predicted: list[list[str]], gold_types: set[str], *, strict: bool, prefix: str
) -> dict[str, float]:
    """Micro P/R/F1 and per-type F1 (names with `prefix`) in seqeval's strict IOB2 or default mode."""
    from seqeval.metrics import sequence_labeling, v1
    from seqeval.scheme import IOB2

    nan = float("nan")
    scores: dict[str, float] = {}
    if not (any(tag != "O" for sentence in predicted for tag in sentence) or gold_types):
        return {f"{prefix}f1": nan, f"{prefix}precision": nan, f"{prefix}recall": nan}
    if strict:
        kwargs = {"scheme": IOB2, "mode": "strict", "zero_division": 0}
        precision, recall, f1, _ = v1.precision_recall_fscore_support(
            gold, predicted, average="micro", **kwargs
        )
        per_type = v1.precision_recall_fscore_support(gold, predicted, average=None, **kwargs)[2]
        names = v1.unique_labels(gold, predicted, IOB2)
    else:
        prf = sequence_labeling.precision_recall_fscore_support
        precision, recall, f1, _ = prf(gold, predicted, average="micro", zero_division=0)
        per_type = prf(gold, predicted, average=None, zero_division=0)[2]
        # seqeval orders the types sorted over both sides' entities
        names = sorted({e[0] for s in (gold, predicted) for e in sequence_labeling.get_entities(s)})
    for name, value in zip(names, per_type, strict=True):
        scores[f"{prefix}f1_{name}"] = float(value) if name in gold_types else nan
    if not gold_types:
        recall = f1 = nan
    scores.update(
        {f"{prefix}f1": float(f1), f"{prefix}precision": float(precision), f"{prefix}recall": float(recall)}
    )
    return scores


ENTITY_SCORING = (
    "entity-level micro P/R/F1: conlleval's convention (seqeval default mode; f1, precision, recall, "
    "f1_<type>) and strict IOB2 (seqeval mode=strict; strict_f1, ...); token accuracy"
)

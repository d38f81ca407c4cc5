"""What a phase hands on at its end: the check that its frozen parameters are unchanged, and, for a
frozen-backbone phase, the boundary measurements of the head it trained (results.json's
`phases[i].boundary`, the grid report's boundary table)."""

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from stackft_jax.data.task_spec import Split, selection_split
from stackft_jax.runtime import sharding
from stackft_jax.training import calibration, checkpointing, evaluation, feature_cache


def check_frozen(phase_name: str, params: Any, trained: Any, frozen: str) -> None:
    """Refuses a phase's last parameters whose frozen part (not marked in `trained`) no longer has the
    fingerprint `frozen` it started with: its checkpoints store only the trained part and rely on it."""
    if checkpointing.frozen_fingerprint(params, trained) != frozen:
        raise checkpointing.FrozenParametersChanged(f"{phase_name} changed parameters its rules freeze")


def _norm_on_host(tree: Any) -> float:
    """The global L2 norm of replicated arrays, from this process's copy (eager device ops would compile
    one program each)."""
    leaves = [sharding.local_copy(x).astype(np.float64) for x in jax.tree.leaves(tree)]
    return float(np.sqrt(sum(np.sum(np.square(x)) for x in leaves)))


def measure(
    evaluator: evaluation.Evaluator,
    datasets: Mapping[str, Split],
    metrics: Sequence[str],
    params: Any,
    *,
    features: Mapping[str, feature_cache.FeatureCache],
    dev: evaluation.Evaluation | None,
    train: evaluation.Evaluation | None,
    train_examples: int,
) -> dict[str, Any]:
    """What a frozen-backbone phase hands on: the head's parameter norm (Tomihari & Sato 2024 tie LP-FT's
    behaviour to it), dev expected calibration error (classification; else None) and the train/dev gap
    per metric of `metrics` (train subset minus dev). `dev`/`train`: evaluations of `params` already
    taken (else taken here, from `features` where cached; the train subset: the first `train_examples`)."""
    selection = datasets[selection_split(datasets)]  # dev, or the selection slice
    if dev is None:
        dev = evaluator.evaluate(params, selection, features=features.get("dev"))
    if train is None:
        train = evaluator.evaluate(
            params, datasets["train"], limit=train_examples, features=features.get("train")
        )
    measured = {
        "head_param_norm": _norm_on_host(params["head"]),
        "dev_ece": (
            calibration.expected_calibration_error(*evaluation.probabilities_and_labels(selection, dev))
            if "probabilities" in dev.rows
            else None
        ),
    }
    for metric in metrics:
        if dev.scores.get(metric) is not None and train.scores.get(metric) is not None:
            measured[f"train_dev_gap_{metric}"] = float(train.scores[metric] - dev.scores[metric])
    train_rows = len(train.rows["predictions"])
    return {**measured, "dev": dev.scores, "train_subset": train.scores, "train_examples": train_rows}

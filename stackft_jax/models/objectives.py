"""Objectives: how a head's outputs become a training loss and per-example predictions.

A task names its objective (`TaskSpec.objective`); `steps.py` calls `loss` in the train and eval steps
and `predict` in the eval step, both inside `jit`. Rows whose `example_mask` is 0 (the padding rows of
the last eval batch) count zero.

  CLASSIFICATION  head outputs logits [batch, classes]; softmax cross-entropy; predictions are the
                  argmax class and the class probabilities.
  REGRESSION      head outputs [batch, 1]; squared error; the prediction is the output.
  WORD_TAGGING    head outputs a `WordScores` (per-word scores over tags, packed left); the outputs own
                  the loss and the decoding, so a softmax tagger (per-word cross-entropy, argmax) and a
                  CRF (sequence negative log-likelihood, Viterbi) are the same objective. The loss is
                  averaged per word.

Adding an objective: write its `loss` and `predict` below and one `Objective(...)` constant.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import optax

from stackft_jax.models.crf import PAD_TAG

Batch = dict[str, jax.Array]
# (head outputs, batch) -> (summed loss, statistics). The statistics hold `loss_sum`, `count` (what
# the loss is averaged over: real examples, or real words) and, where predictions can be right or
# wrong, `correct` (the train loop's running accuracy is correct / count).
LossFn = Callable[[Any, Batch], tuple[jax.Array, dict[str, jax.Array]]]
# (head outputs, batch) -> per-row arrays, leading dim batch (what evaluation gathers and the task scores).
PredictFn = Callable[[Any, Batch], dict[str, jax.Array]]


@dataclasses.dataclass(frozen=True)
class Objective:
    name: str
    loss: LossFn
    predict: PredictFn


class WordScores(Protocol):
    """What a tagging head returns (models/word_scores.py): scores for the words of each row, packed left
    ([batch, width, ...], width <= max_words: the batch's `Features.word_width`); positions at or past
    `num_words` are padding and must not matter."""

    def negative_log_likelihood(self, labels: jax.Array, num_words: jax.Array) -> jax.Array:
        """-log p(labels) per row [batch], summed over the row's words; `labels` [batch, >= width]."""
        ...

    def decode(self, num_words: jax.Array) -> jax.Array:
        """The best tags [batch, width] int32, PAD_TAG (-1) at padding."""
        ...


def _summed(per_row: jax.Array, count: jax.Array, **stats: jax.Array) -> tuple[jax.Array, dict]:
    loss_sum = per_row.sum()
    return loss_sum, {"loss_sum": loss_sum, "count": count, **stats}


def classification_loss(logits: jax.Array, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    mask = batch["example_mask"]
    per_example = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    correct = (jnp.argmax(logits, -1) == batch["labels"]) * mask
    return _summed(per_example * mask, mask.sum(), correct=correct.sum())


def classification_predictions(logits: jax.Array, batch: Batch) -> dict[str, jax.Array]:
    return {"predictions": jnp.argmax(logits, -1), "probabilities": jax.nn.softmax(logits, -1)}


def regression_loss(outputs: jax.Array, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    mask = batch["example_mask"]
    return _summed(jnp.square(outputs[:, 0] - batch["labels"]) * mask, mask.sum())


def regression_predictions(outputs: jax.Array, batch: Batch) -> dict[str, jax.Array]:
    return {"predictions": outputs[:, 0]}


def word_tagging_loss(scores: WordScores, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    mask = batch["example_mask"]
    num_words = batch["num_words"]
    words = num_words * mask
    nll = scores.negative_log_likelihood(batch["labels"], num_words) * mask
    tags = scores.decode(num_words)
    real = jnp.arange(tags.shape[1])[None, :] < words[:, None]
    correct = ((tags == batch["labels"][:, : tags.shape[1]]) & real).sum()
    return _summed(nll, words.sum().astype(jnp.float32), correct=correct.astype(jnp.float32))


def word_tagging_predictions(scores: WordScores, batch: Batch) -> dict[str, jax.Array]:
    """Tags for all `max_words` slots of the batch (the head scored only its first `width`): every
    batch of a split has the same row shape whatever its length bucket."""
    tags = scores.decode(batch["num_words"])
    slots = batch["labels"].shape[1]  # max_words, as word_starts
    return {"predictions": jnp.pad(tags, ((0, 0), (0, slots - tags.shape[1])), constant_values=PAD_TAG)}


CLASSIFICATION = Objective("classification", classification_loss, classification_predictions)
REGRESSION = Objective("regression", regression_loss, regression_predictions)
WORD_TAGGING = Objective("word_tagging", word_tagging_loss, word_tagging_predictions)

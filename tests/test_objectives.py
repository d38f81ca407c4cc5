"""Objectives on hand-worked batches: losses, counts, predictions; tagging outputs and word gathering."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from stackft_jax.models import crf, objectives
from stackft_jax.models.features import Features
from stackft_jax.models.word_scores import CrfWordScores, WordLogits

LN3 = math.log(3.0)


def test_classification_masks_padding_rows_and_predicts_probabilities():
    logits = jnp.array([[0.0, LN3], [0.0, 0.0]])  # p = (1/4, 3/4) and (1/2, 1/2)
    batch = {"labels": jnp.array([1, 0]), "example_mask": jnp.array([1.0, 0.0])}
    loss_sum, stats = objectives.CLASSIFICATION.loss(logits, batch)
    np.testing.assert_allclose(loss_sum, -math.log(0.75), rtol=1e-6)
    assert (float(stats["count"]), float(stats["correct"])) == (1.0, 1.0)
    predicted = objectives.CLASSIFICATION.predict(logits, batch)
    assert predicted["predictions"].tolist() == [1, 0]
    np.testing.assert_allclose(predicted["probabilities"], [[0.25, 0.75], [0.5, 0.5]], rtol=1e-6)


def test_regression_is_squared_error():
    outputs = jnp.array([[2.0], [5.0]])
    batch = {"labels": jnp.array([1.5, 0.0]), "example_mask": jnp.array([1.0, 0.0])}
    loss_sum, stats = objectives.REGRESSION.loss(outputs, batch)
    assert (float(loss_sum), float(stats["count"])) == (0.25, 1.0) and "correct" not in stats
    assert objectives.REGRESSION.predict(outputs, batch)["predictions"].tolist() == [2.0, 5.0]


TAGGING_BATCH = {
    # Row 0: two real words, then padding (label -1); row 1 is a padding row of an eval batch.
    "labels": jnp.array([[1, 1, -1], [0, 0, 0]]),
    "num_words": jnp.array([2, 3]),
    "example_mask": jnp.array([1.0, 0.0]),
}
# Word 0 prefers tag 1 (p = 3/4), word 1 prefers tag 0 (p(1) = 1/4); the padding word is huge.
TAGGING_LOGITS = jnp.array([[[0.0, LN3], [LN3, 0.0], [50.0, -50.0]], [[0.0, 0.0]] * 3])


def test_word_tagging_with_a_softmax_tagger_counts_real_words_only():
    scores = WordLogits(TAGGING_LOGITS)
    loss_sum, stats = objectives.WORD_TAGGING.loss(scores, TAGGING_BATCH)
    np.testing.assert_allclose(loss_sum, -math.log(0.75) - math.log(0.25), rtol=1e-6)
    assert (float(stats["count"]), float(stats["correct"])) == (2.0, 1.0)
    predictions = objectives.WORD_TAGGING.predict(scores, TAGGING_BATCH)["predictions"]
    assert predictions.tolist() == [[1, 0, -1], [0, 0, 0]]


def _potentials(transitions) -> crf.Potentials:
    return crf.Potentials(
        start=jnp.zeros(2), transitions=jnp.asarray(transitions, jnp.float32), end=jnp.zeros(2)
    )


def test_a_crf_head_owns_its_loss_and_decoding():
    # Without transition scores a CRF factorises over words: the softmax tagger's loss and tags.
    free = CrfWordScores(TAGGING_LOGITS, _potentials(np.zeros((2, 2))))
    loss_sum, stats = objectives.WORD_TAGGING.loss(free, TAGGING_BATCH)
    np.testing.assert_allclose(loss_sum, -math.log(0.75) - math.log(0.25), rtol=1e-5)
    assert float(stats["count"]) == 2.0
    assert objectives.WORD_TAGGING.predict(free, TAGGING_BATCH)["predictions"][0].tolist() == [1, 0, -1]
    # Forbid 1 -> 0 and reward 1 -> 1 by ln 2: the allowed paths (0,0), (0,1), (1,1) have weights
    # 3, 1 and 3 * 2, so Viterbi picks (1,1), against the per-word argmax, and p(1,1) = 6 / 10.
    potentials = _potentials([[0.0, 0.0], [crf.FORBIDDEN, math.log(2.0)]])
    loss_sum, _ = objectives.WORD_TAGGING.loss(CrfWordScores(TAGGING_LOGITS, potentials), TAGGING_BATCH)
    np.testing.assert_allclose(loss_sum, -math.log(0.6), rtol=1e-5)
    predicted = objectives.WORD_TAGGING.predict(CrfWordScores(TAGGING_LOGITS, potentials), TAGGING_BATCH)
    assert predicted["predictions"][0].tolist() == [1, 1, -1]


def test_word_states_gather_first_sub_tokens_packed_left():
    sequence = jnp.arange(6, dtype=jnp.float32)[None, :, None] * jnp.ones((2, 6, 2))  # state = position
    features = Features(
        sequence=sequence,
        pooled=jnp.zeros((2, 2)),
        attention_mask=jnp.ones((2, 6), jnp.int32),
        segment_ids=jnp.ones((2, 6), jnp.int32),
        word_starts=jnp.array([[1, 2, 4, 0], [1, 0, 0, 0]]),  # row 0: words at 1, 2 and 4 ("x ##y" at 2-3)
        num_words=jnp.array([3, 1]),
    )
    assert features.word_states()[..., 0].tolist() == [[1, 2, 4, 0], [1, 0, 0, 0]]
    sentence_features = features._replace(word_starts=None, num_words=None)
    with pytest.raises(ValueError, match="word_starts and num_words"):
        sentence_features.word_states()

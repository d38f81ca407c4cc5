"""What tagging heads return: per-word scores that own their loss and decoding (objectives.WordScores).

Both hold scores for a packed word sequence per row ([batch, width, num_tags]: the first sub-token
states that `Features.word_states` gathers, `Features.word_width` of them); positions at or past a row's
`num_words` are padding. `labels` may be wider (the dataset's `max_words` slots): the slots past `width`
are padding in every row and are ignored.

  WordLogits     independent per-word scores (a softmax tagger): cross-entropy summed over the words,
                 argmax per word; or, with `decode_potentials` (a head's `iob2_decoding`), the most
                 probable sequence those potentials allow (Viterbi over the log-probabilities).
  CrfWordScores  emissions plus a linear-chain CRF's potentials (models/crf.py): sequence negative
                 log-likelihood by the forward algorithm, Viterbi decoding.
"""

import flax.struct
import jax
import jax.numpy as jnp
import optax

from stackft_jax.models import crf

PAD_TAG = crf.PAD_TAG


def _real_words(scores: jax.Array, num_words: jax.Array) -> jax.Array:
    return jnp.arange(scores.shape[1])[None, :] < num_words[:, None]  # [batch, max_words]


@flax.struct.dataclass
class WordLogits:
    logits: jax.Array  # [batch, width, num_tags]
    # Fixed moves (crf.constraint_potentials) that decoding keeps to; None: argmax per word. Training
    # (per-word cross-entropy) never reads them.
    decode_potentials: crf.Potentials | None = None

    def negative_log_likelihood(self, labels: jax.Array, num_words: jax.Array) -> jax.Array:
        labels = labels[:, : self.logits.shape[1]]
        real = _real_words(self.logits, num_words)
        # Padding labels (-1) are replaced before indexing; their loss is masked out anyway.
        per_word = optax.softmax_cross_entropy_with_integer_labels(
            self.logits.astype(jnp.float32), jnp.where(real, labels, 0)
        )
        return jnp.sum(per_word * real, axis=1)

    def decode(self, num_words: jax.Array) -> jax.Array:
        if self.decode_potentials is not None:
            log_probabilities = jax.nn.log_softmax(self.logits.astype(jnp.float32), axis=-1)
            tags, _ = crf.decode(log_probabilities, num_words, self.decode_potentials)
            return tags.astype(jnp.int32)
        best = jnp.argmax(self.logits, axis=-1).astype(jnp.int32)
        return jnp.where(_real_words(self.logits, num_words), best, PAD_TAG)


@flax.struct.dataclass
class CrfWordScores:
    emissions: jax.Array  # [batch, width, num_tags]
    potentials: crf.Potentials  # the head's CRF.potentials(), constraints applied

    def negative_log_likelihood(self, labels: jax.Array, num_words: jax.Array) -> jax.Array:
        labels = labels[:, : self.emissions.shape[1]]
        log_z = crf.log_partition(self.emissions, num_words, self.potentials)
        return log_z - crf.sequence_score(self.emissions, labels, num_words, self.potentials)

    def decode(self, num_words: jax.Array) -> jax.Array:
        tags, _ = crf.decode(self.emissions, num_words, self.potentials)
        return tags.astype(jnp.int32)

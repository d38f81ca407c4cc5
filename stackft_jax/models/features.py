"""What a task head sees of the backbone: one named tuple, so every head has the same signature."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

# `segment_ids` values: the token belongs to the first text, the second text; 0 is neither (special
# tokens, padding). Tokenization (data/tokenization.py) writes them, the pair heads read them.
SEGMENT_A, SEGMENT_B = 1, 2


class Features(NamedTuple):
    """Backbone outputs plus the batch fields a head needs for masking, sentence splitting and words.

    sequence:        [batch, length, hidden] token states: the last encoder layer, or the learned
                     scalar mix of all layers when `model.scalar_mix` is on.
    pooled:          [batch, hidden] the pooler output (tanh dense on [CLS]); for a family without a
                     pooler (ELECTRA, DistilBERT) the last layer's [CLS] state (models/bert.py).
    attention_mask:  [batch, length] 1 for real tokens, 0 for padding.
    segment_ids:     [batch, length] which text a token belongs to: 1 the first, 2 the second, 0 special
                     tokens and padding (data/tokenization.py), for every family, token types or not.
    word_starts:     word-level tasks only: [batch, max_words] position of each labelled word's first
                     sub-token, packed left (data/word_pieces.py); None for sentence(-pair) tasks.
                     `max_words` is the dataset's word slots (max_seq_length - 2), whatever the batch's
                     length bucket.
    num_words:       word-level tasks only: [batch] labelled words per row.
    """

    sequence: jax.Array
    pooled: jax.Array
    attention_mask: jax.Array
    segment_ids: jax.Array
    word_starts: jax.Array | None = None
    num_words: jax.Array | None = None

    @property
    def word_width(self) -> int:
        """How many word slots can hold a word in this batch: min(max_words, length). A word's first
        sub-token is one of the row's tokens, so a row of a length-L bucket has at most L words; the
        slots past that are padding in every row, and the tagger's scans need not run over them."""
        if self.word_starts is None:
            raise ValueError("word_width needs a word-level task's batch (word_starts)")
        return min(self.word_starts.shape[1], self.sequence.shape[1])

    def word_states(self) -> jax.Array:
        """[batch, word_width, hidden]: each word's first sub-token state, packed left and zero past
        `num_words`, so a tagger (or a CRF) sees contiguous words and never a sub-token."""
        if self.word_starts is None or self.num_words is None:
            raise ValueError("word_states needs a word-level task's batch (word_starts and num_words)")
        starts = self.word_starts[:, : self.word_width]
        states = jnp.take_along_axis(self.sequence, starts[..., None], axis=1)
        real = jnp.arange(starts.shape[1])[None, :] < self.num_words[:, None]
        return jnp.where(real[..., None], states, 0)

"""What a task head sees of the backbone: one named tuple, so every head has the same signature."""

from typing import NamedTuple

import jax


class Features(NamedTuple):
    """Backbone outputs plus the batch fields a head needs for masking and sentence splitting.

    sequence:        [batch, length, hidden] token states: the last BERT layer, or the learned
                     scalar mix of all layers when `model.scalar_mix` is on.
    pooled:          [batch, hidden] BERT pooler output (tanh dense on [CLS]).
    attention_mask:  [batch, length] 1 for real tokens, 0 for padding.
    token_type_ids:  [batch, length] 0 for the first segment ([CLS] a [SEP]), 1 for the second (b [SEP]).
    """

    sequence: jax.Array
    pooled: jax.Array
    attention_mask: jax.Array
    token_type_ids: jax.Array

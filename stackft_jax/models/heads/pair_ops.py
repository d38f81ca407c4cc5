"""Pieces the sentence-pair heads (bimpm, sim_transformer, esim) share.

The encoder reads a pair jointly (BERT: `[CLS] a [SEP] b [SEP] pad...`, RoBERTa: `<s> a </s></s> b </s>`);
the pair heads want two separate, left-aligned sentences. `split_pair` cuts them out with static shapes;
`stack_pair` lets one shared layer run over both. Layers that are not pair-specific (masked pooling, the
BiLSTM) are in models/layers.py.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from stackft_jax.models.features import SEGMENT_A, SEGMENT_B, Features


class Sentence(NamedTuple):
    """One sentence of a pair, packed to the left of a [batch, length, ...] block.

    states:  [batch, length, hidden], zero at padding.
    mask:    [batch, length] bool, True for the first `lengths` positions.
    lengths: [batch] int32 number of real tokens (may be 0 for an empty sentence).
    """

    states: jax.Array
    mask: jax.Array
    lengths: jax.Array


def _pack(states: jax.Array, keep: jax.Array) -> Sentence:
    """Moves the kept positions of each row to the front, in order, and zeroes the rest."""
    length = states.shape[1]
    # A stable argsort of "not kept" lists kept positions first, each group in its original order.
    order = jnp.argsort(jnp.logical_not(keep).astype(jnp.int32), axis=1, stable=True)
    packed = jnp.take_along_axis(states, order[..., None], axis=1)
    lengths = keep.sum(axis=1, dtype=jnp.int32)
    mask = jnp.arange(length)[None, :] < lengths[:, None]
    return Sentence(jnp.where(mask[..., None], packed, 0), mask, lengths)


def split_pair(features: Features, dtype: jnp.dtype | None = None) -> tuple[Sentence, Sentence]:
    """Splits the joint encoding into P = the tokens of a and Q = the tokens of b.

    Special tokens ([CLS], [SEP], <s>, </s>) are left out: they are positions of the joint input, not
    words of either sentence (BiMPM and ESIM compare words). Which token belongs to which text comes
    from `segment_ids`, written at tokenization for every family, never from token type ids (RoBERTa
    and DistilBERT have none). Both keep the input length, so shapes stay static; a one-sentence input
    gives an empty Q. `dtype` casts the states (the head's compute dtype).
    """
    states = features.sequence if dtype is None else features.sequence.astype(dtype)
    real = features.attention_mask.astype(bool)
    keep_a = real & (features.segment_ids == SEGMENT_A)
    keep_b = real & (features.segment_ids == SEGMENT_B)
    return _pack(states, keep_a), _pack(states, keep_b)


def stack_pair(p: jax.Array, q: jax.Array) -> jax.Array:
    """Stacks P and Q along the batch so one shared layer (one scan) processes both."""
    return jnp.concatenate([p, q], axis=0)


def unstack_pair(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    p, q = jnp.split(x, 2, axis=0)
    return p, q

"""Layers the task heads share, pair and single-sequence alike: pooling over padding and a BiLSTM over
left-aligned padded sequences. Sequences are `[batch, length, ...]` with the real positions first.
"""

import jax
import jax.numpy as jnp
from flax import nnx


def masked_max(x: jax.Array, mask: jax.Array, axis: int) -> jax.Array:
    """Max of `x` over `axis` where `mask` (broadcastable to x) is True; 0 where nothing is.

    Read out by index (argmax, then gather), so the gradient goes to the first maximal position.
    `jnp.max`'s own gradient divides by the number of positions equal to the max, which XLA's
    unoptimised pipeline can make 0 (NaN) when it recomputes x with different rounding: the DenseNet
    head's gradients were all NaN under `jax_disable_most_optimizations` (tests/test_heads.py).
    """
    mask = jnp.broadcast_to(mask, x.shape)
    index = jnp.argmax(jnp.where(mask, x, jnp.finfo(x.dtype).min), axis=axis, keepdims=True)
    out = jnp.take_along_axis(x, index, axis=axis).squeeze(axis)
    return jnp.where(mask.any(axis=axis), out, 0).astype(x.dtype)


def masked_mean(x: jax.Array, mask: jax.Array, axis: int) -> jax.Array:
    """Mean of `x` over `axis` where `mask` (broadcastable to x) is True; 0 where nothing is."""
    weights = jnp.broadcast_to(mask, x.shape).astype(x.dtype)
    return (x * weights).sum(axis=axis) / jnp.maximum(weights.sum(axis=axis), 1)


def last_valid(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """x[b, lengths[b] - 1] for left-aligned [batch, length, dim] x; zeros for empty rows."""
    index = jnp.maximum(lengths - 1, 0)
    last = jnp.take_along_axis(x, index[:, None, None], axis=1)[:, 0]
    return jnp.where((lengths > 0)[:, None], last, 0).astype(x.dtype)


class MaskedBiLstm(nnx.Module):
    """A BiLSTM over left-aligned padded sequences (Flax's `nnx.RNN` scans, `seq_lengths` masking).

    Returns the per-position outputs [batch, length, 2 * units] (forward then backward, zero at
    padding) and the final state [batch, 2 * units]: the forward output at the last real token and
    the backward output at the first, where each direction has read the whole sentence.
    """

    def __init__(self, in_features: int, units: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.units = units

        def direction() -> nnx.RNN:
            cell = nnx.OptimizedLSTMCell(in_features, units, dtype=dtype, rngs=rngs)
            # rngs=False: the carry starts at zeros passed in below, so no RNG state is kept.
            return nnx.RNN(cell, rngs=False)

        self.bilstm = nnx.Bidirectional(direction(), direction(), rngs=False)

    def __call__(self, x: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
        # A float32 cell state whatever the compute dtype: it accumulates over the whole sentence.
        zeros = jnp.zeros((x.shape[0], self.units), jnp.float32)
        carry = (zeros, zeros)
        outputs = self.bilstm(x, initial_carry=(carry, carry), seq_lengths=lengths)
        mask = jnp.arange(x.shape[1])[None, :, None] < lengths[:, None, None]
        outputs = jnp.where(mask, outputs, 0).astype(x.dtype)
        forward_last = last_valid(outputs[..., : self.units], lengths)
        backward_first = outputs[:, 0, self.units :]  # already zero for an empty sentence
        return outputs, jnp.concatenate([forward_last, backward_first], axis=-1)

"""Dropout whose mask costs a quarter of `nnx.Dropout`'s random bits.

`nnx.Dropout` draws one 32-bit number per element (`jax.random.bernoulli`). On CPU the threefry hash
behind those draws was the largest non-matmul cost of a BERT training step (benchmarks/RESULTS.md,
"Dropout masks and attention layout"). Here each 32-bit draw is cut into four bytes, one per element,
and an element is dropped where its byte is below `round(rate * 256)`. The drop probability is
therefore a multiple of 1/256 (0.1 -> 26/256 = 0.1016); kept elements are scaled by the inverse of the
exact keep probability, so the layer stays unbiased. The draws stay partitionable (one counter per four
elements along the last axis), so sharded runs produce the same masks on any number of devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

_LEVELS = 256  # one byte of randomness per element


def quantized_rate(rate: float) -> float:
    """The drop probability actually applied for a requested `rate`."""
    return round(rate * _LEVELS) / _LEVELS


def keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
    """Boolean mask, True with probability `1 - quantized_rate(rate)`, from one byte per element."""
    threshold = round(rate * _LEVELS)
    *lead, last = shape
    words = jax.random.bits(key, (*lead, -(-last // 4)), jnp.uint32)
    random_bytes = jnp.stack([(words >> (8 * i)) & 0xFF for i in range(4)], axis=-1)
    random_bytes = random_bytes.reshape(*lead, -1)[..., :last]
    return random_bytes >= threshold


class Dropout(nnx.Module):
    """Drop-in for `nnx.Dropout(rate)` called as `dropout(x, deterministic=..., rngs=...)`; the key
    comes from the `dropout` stream of the call's `nnx.Rngs`."""

    def __init__(self, rate: float, *, rng_collection: str = "dropout"):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
        self.rate = rate
        self.rng_collection = rng_collection

    def __call__(self, inputs: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> jax.Array:
        if deterministic or round(self.rate * _LEVELS) == 0:
            return inputs
        if rngs is None:
            raise ValueError("dropout with deterministic=False needs rngs=nnx.Rngs(dropout=key)")
        keep = keep_mask(rngs[self.rng_collection](), inputs.shape, self.rate)
        scale = jnp.asarray(1.0 / (1.0 - quantized_rate(self.rate)), inputs.dtype)
        return jnp.where(keep, inputs * scale, jnp.zeros_like(inputs))

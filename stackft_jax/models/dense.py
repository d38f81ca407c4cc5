"""A dense layer whose matrix-product gradient is written out instead of derived by autodiff.

`Dense` is `nnx.Linear` (same parameters, names, initialisers and forward), but the gradient of its
matrix product comes from `matmul`, a `jax.custom_vjp` that saves the input and kernel and computes

    dx = dy W^T,    dW = x^T dy (contracting every leading axis),

the same products autodiff derives (the bias gradient is autodiff's). XLA:CPU compiles the backward
of this form faster (benchmarks/RESULTS.md, section 2); the values are identical (tests/test_dense.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


@jax.custom_vjp
def matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """x @ kernel over x's last axis."""
    return jnp.einsum("...k,kn->...n", x, kernel)


def _matmul_fwd(x, kernel):
    return matmul(x, kernel), (x, kernel)


def _matmul_bwd(residuals, dy):
    x, kernel = residuals
    return jnp.einsum("...n,kn->...k", dy, kernel), jnp.einsum("...k,...n->kn", x, dy)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


class Dense(nnx.Linear):
    """`nnx.Linear` with the backward of `matmul`. Options that `matmul` does not implement
    (`preferred_element_type`, `precision`, a custom `dot_general`, `out_sharding`) fall back to
    `nnx.Linear.__call__`."""

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        if (
            out_sharding is not None
            or self.preferred_element_type is not None
            or self.precision is not None
            or self.dot_general is not jax.lax.dot_general
        ):
            return super().__call__(inputs, out_sharding=out_sharding)
        kernel = self.kernel[...]
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
        y = matmul(inputs, kernel)
        return y if bias is None else y + bias

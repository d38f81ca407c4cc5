"""The packed-bits dropout: rate, scaling, determinism, odd shapes, sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stackft_jax.models.dropout import Dropout, keep_mask, quantized_rate


def test_keep_fraction_matches_quantized_rate():
    keep = keep_mask(jax.random.key(0), (256, 1024), rate=0.1)
    assert quantized_rate(0.1) == 26 / 256
    assert abs(float(keep.mean()) - (1 - 26 / 256)) < 0.003


@pytest.mark.parametrize("shape", [(3, 7), (2, 5, 1), (4, 9, 130)])
def test_last_axis_not_a_multiple_of_four(shape):
    keep = keep_mask(jax.random.key(1), shape, rate=0.5)
    assert keep.shape == shape
    assert 0.3 < float(keep.mean()) < 0.7


def test_bytes_of_one_draw_are_independent_positions():
    # Neighbouring elements share a 32-bit draw; their masks must still differ across the array.
    keep = np.asarray(keep_mask(jax.random.key(2), (512, 64), rate=0.5))
    assert 0.4 < (keep[:, 0::4] == keep[:, 1::4]).mean() < 0.6


def test_layer_is_unbiased_and_deterministic_per_key():
    layer = Dropout(0.1)
    x = jnp.ones((64, 512))
    y = layer(x, deterministic=False, rngs=nnx.Rngs(dropout=3))
    assert abs(float(y.mean()) - 1.0) < 0.02
    kept = np.asarray(y)[np.asarray(y) != 0]
    np.testing.assert_allclose(kept, 1 / (1 - 26 / 256), rtol=1e-6)
    again = layer(x, deterministic=False, rngs=nnx.Rngs(dropout=3))
    np.testing.assert_array_equal(y, again)
    other = layer(x, deterministic=False, rngs=nnx.Rngs(dropout=4))
    assert not np.array_equal(y, other)


def test_deterministic_and_zero_rate_are_identity():
    x = jax.random.normal(jax.random.key(0), (4, 8))
    np.testing.assert_array_equal(Dropout(0.5)(x, deterministic=True), x)
    np.testing.assert_array_equal(Dropout(0.0)(x, deterministic=False), x)
    with pytest.raises(ValueError, match="rngs"):
        Dropout(0.5)(x, deterministic=False)
    with pytest.raises(ValueError, match="rate"):
        Dropout(1.0)


def test_bf16_input_keeps_dtype():
    x = jnp.ones((8, 16), jnp.bfloat16)
    assert Dropout(0.1)(x, deterministic=False, rngs=nnx.Rngs(dropout=0)).dtype == jnp.bfloat16


def test_same_mask_on_one_and_eight_devices():
    mesh = jax.make_mesh((len(jax.devices()),), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    fn = jax.jit(lambda key: keep_mask(key, (16, 8, 64), 0.1), out_shardings=sharding)
    np.testing.assert_array_equal(fn(jax.random.key(5)), keep_mask(jax.random.key(5), (16, 8, 64), 0.1))

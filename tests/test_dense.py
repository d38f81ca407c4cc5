"""models/dense.Dense: nnx.Linear's parameters and values, with a written-out backward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stackft_jax.models.dense import Dense
from stackft_jax.runtime import sharding


def _pair(use_bias: bool, dtype=jnp.float32) -> tuple[Dense, nnx.Linear]:
    ours = Dense(6, 5, use_bias=use_bias, dtype=dtype, rngs=nnx.Rngs(0))
    reference = nnx.Linear(6, 5, use_bias=use_bias, dtype=dtype, rngs=nnx.Rngs(0))
    if use_bias:  # zero-initialised by default: make the bias gradient path non-trivial
        for layer in (ours, reference):
            layer.bias[...] = jnp.arange(5.0)
    return ours, reference


def _value_and_grads(layer: nnx.Module, x: jax.Array):
    graphdef, params = nnx.split(layer)

    def loss(params, x):
        y = nnx.merge(graphdef, params)(x)
        return jnp.sum(jnp.sin(y.astype(jnp.float32)))

    return jax.value_and_grad(loss, argnums=(0, 1))(params, x)


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 6), (3, 4, 6)])
def test_same_parameters_values_and_gradients_as_nnx_linear(use_bias, shape):
    ours, reference = _pair(use_bias)
    # Same parameter tree: checkpoints, weight conversion and optimizer masks see no difference.
    assert jax.tree.structure(nnx.state(ours)) == jax.tree.structure(nnx.state(reference))
    x = jax.random.normal(jax.random.key(1), shape)
    np.testing.assert_array_equal(ours(x), reference(x))
    (value, (dparams, dx)), (ref_value, (ref_dparams, ref_dx)) = (
        _value_and_grads(layer, x) for layer in (ours, reference)
    )
    assert value == ref_value
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-6, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), dparams, ref_dparams)


def test_bfloat16_compute_keeps_float32_parameters_and_gradients():
    ours, reference = _pair(True, dtype=jnp.bfloat16)
    x = jax.random.normal(jax.random.key(2), (4, 3, 6))
    assert ours(x).dtype == jnp.bfloat16
    (_, (dparams, _)), (_, (ref_dparams, _)) = (_value_and_grads(layer, x) for layer in (ours, reference))
    for got, want in zip(jax.tree.leaves(dparams), jax.tree.leaves(ref_dparams), strict=True):
        assert got.dtype == want.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_options_it_does_not_implement_fall_back_to_nnx_linear():
    layer = Dense(6, 5, preferred_element_type=jnp.float32, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert layer(jnp.ones((2, 6))).dtype == jnp.float32


def test_gradients_with_a_data_sharded_batch_match_one_device():
    # The written-out backward contracts over the sharded batch axis: XLA must reduce across devices.
    mesh = sharding.make_mesh()
    assert mesh.size == 8
    ours, _ = _pair(True)
    x = jax.random.normal(jax.random.key(3), (16, 6))
    graphdef, params = nnx.split(ours)

    def grads(params, x):
        return jax.grad(lambda p: jnp.sum(jnp.sin(nnx.merge(graphdef, p)(x))))(params)

    sharded = jax.jit(grads)(params, jax.device_put(x, sharding.data_sharded(mesh)))
    expected = grads(params, x)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), sharded, expected)

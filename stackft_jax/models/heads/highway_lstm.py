"""A bidirectional highway LSTM over the BERT token states, the recurrent head of Wang et al. (2019)'s
Yahoo Answers experiment, after Zhang et al. (2016), "Highway Long Short-Term Memory RNNs for distant
speech recognition" (arXiv 1510.08983).

Each direction is its own stack of `num_lstm_layers` LSTM layers. Above the first, a layer's memory cell
takes a gated connection from the cell of the layer below at the same time step:

    c_t^l = d_t^l * c_t^{l-1} + f_t^l * c_{t-1}^l + i_t^l * g_t^l
    d_t^l = sigmoid(W_d x_t^l + w_c * c_{t-1}^l + w_l * c_t^{l-1} + b_d)     (the carry gate)

with elementwise (peephole-style) `w_c`, `w_l`. The gates i, f, o and the candidate g are a standard
LSTM's (from x_t and h_{t-1}, no peepholes). The first layer has no layer below: its lower cell is
zero, which removes the highway term, so it is built as a plain LSTM rather than with a carry gate
that could never receive gradient.

The input projection of every step is one matrix product over the whole sequence before the scan
(`jax.lax.scan` then carries only the recurrent product). Cell and hidden states are float32 whatever
the compute dtype: they accumulate over the sentence. The backward stack reads each sentence reversed
within its own length, so it starts at the last real token; outputs at padding are zeroed, and the
head pools them with masked max and mean, concatenated with the [CLS] state, before one dense layer.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from stackft_jax.models.dense import Dense
from stackft_jax.models.dropout import Dropout
from stackft_jax.models.features import Features
from stackft_jax.models.layers import masked_max, masked_mean
from stackft_jax.runtime.cli_errors import ConfigError


def default_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {
            "lstm_units": 128,  # units per direction of every LSTM layer
            "num_lstm_layers": 2,  # layers per direction; each above the first has the highway connection
        }
    )


def reverse_within_lengths(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """Reverses each row's first `lengths[b]` positions of [batch, length, ...] x; padding stays put.
    Its own inverse."""
    positions = jnp.arange(x.shape[1])[None, :]
    index = jnp.where(positions < lengths[:, None], lengths[:, None] - 1 - positions, positions)
    return jnp.take_along_axis(x, index.reshape(*index.shape, *([1] * (x.ndim - 2))), axis=1)


class HighwayLstmLayer(nnx.Module):
    """One direction's LSTM layer over [batch, length, in_features]; with `highway`, its cell also
    takes the gated lower-layer cell (module docstring). Gate order in the kernels: i, f, g, o[, d]."""

    def __init__(self, in_features: int, units: int, *, highway: bool, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.units = units
        self.highway = highway
        self.dtype = dtype
        # Flax's LSTM initialisers: LeCun-normal input kernel, orthogonal recurrent kernel, zero biases.
        self.input_projection = Dense(in_features, (5 if highway else 4) * units, dtype=dtype, rngs=rngs)
        self.recurrent_kernel = nnx.Param(nnx.initializers.orthogonal()(rngs.params(), (units, 4 * units)))
        if highway:
            self.carry_cell_weight = nnx.Param(jnp.zeros((units,)))  # w_c, on c_{t-1}^l
            self.carry_lower_weight = nnx.Param(jnp.zeros((units,)))  # w_l, on c_t^{l-1}

    def __call__(self, x: jax.Array, lower_cells: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Returns the hidden states (in the compute dtype) and the float32 cells, both
        [batch, length, units]; `lower_cells` (float32, same shape) is required with `highway`."""
        if self.highway != (lower_cells is not None):
            raise ValueError("a highway layer needs the lower layer's cells; a first layer takes none")
        units = self.units
        projected = jnp.swapaxes(self.input_projection(x).astype(jnp.float32), 0, 1)  # time-major
        lower = None if lower_cells is None else jnp.swapaxes(lower_cells, 0, 1)
        recurrent_kernel = self.recurrent_kernel[...].astype(self.dtype)
        if self.highway:
            w_cell, w_lower = self.carry_cell_weight[...], self.carry_lower_weight[...]

        def step(carry, inputs):
            h, c = carry
            xw, c_lower = inputs
            z = xw[:, : 4 * units] + (h.astype(self.dtype) @ recurrent_kernel).astype(jnp.float32)
            i, f, g, o = jnp.split(z, 4, axis=-1)
            c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            if self.highway:
                d = jax.nn.sigmoid(xw[:, 4 * units :] + w_cell * c + w_lower * c_lower)
                c_new = c_new + d * c_lower
            h_new = jax.nn.sigmoid(o) * jnp.tanh(c_new)
            return (h_new, c_new), (h_new, c_new)

        zeros = jnp.zeros((x.shape[0], units), jnp.float32)
        _, (hidden, cells) = jax.lax.scan(step, (zeros, zeros), (projected, lower))
        return jnp.swapaxes(hidden, 0, 1).astype(self.dtype), jnp.swapaxes(cells, 0, 1)


class HighwayLstmHead(nnx.Module):
    def __init__(
        self,
        config: ml_collections.ConfigDict,
        *,
        hidden_size: int,
        num_outputs: int,
        output_names: Sequence[str] = (),  # class names; unused by this head
        dropout_rate: float,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        for key in ("lstm_units", "num_lstm_layers"):
            if config[key] < 1:
                raise ConfigError(f"config.head.highway_lstm.{key}={config[key]} must be at least 1")
        units = config.lstm_units

        def stack() -> nnx.List:
            return nnx.List(
                [
                    HighwayLstmLayer(
                        hidden_size if layer == 0 else units, units, highway=layer > 0, dtype=dtype, rngs=rngs
                    )
                    for layer in range(config.num_lstm_layers)
                ]
            )

        self.dropout = Dropout(dropout_rate)
        self.forward_layers = stack()
        self.backward_layers = stack()
        # [masked max; masked mean] of both directions' top outputs, then the [CLS] state.
        self.output = Dense(
            4 * units + hidden_size,
            num_outputs,
            dtype=dtype,
            kernel_init=nnx.initializers.he_normal(),
            rngs=rngs,
        )

    def __call__(self, features: Features, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> jax.Array:
        def drop(x: jax.Array) -> jax.Array:
            return self.dropout(x, deterministic=deterministic, rngs=rngs)

        def run_stack(layers: nnx.List, x: jax.Array) -> jax.Array:
            cells = None
            for index, layer in enumerate(layers):
                x, cells = layer(drop(x) if index else x, cells)
            return x

        mask = features.attention_mask.astype(bool)
        lengths = mask.sum(axis=1)
        # Zeroed padding: no garbage state enters a scan, even past the last real token.
        x = jnp.where(mask[..., None], drop(features.sequence), 0)
        forward = run_stack(self.forward_layers, x)
        backward = reverse_within_lengths(
            run_stack(self.backward_layers, reverse_within_lengths(x, lengths)), lengths
        )
        outputs = jnp.where(mask[..., None], jnp.concatenate([forward, backward], axis=-1), 0)
        pooled = [masked_max(outputs, mask[..., None], axis=1), masked_mean(outputs, mask[..., None], axis=1)]
        return self.output(drop(jnp.concatenate([*pooled, features.sequence[:, 0]], axis=-1)))

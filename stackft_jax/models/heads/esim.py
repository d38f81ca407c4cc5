"""ESIM (Chen et al. 2017), the pair head Peters et al. (2019) put on frozen contextual features.

Here its two inputs are the P and Q token states cut out of one joint BERT encoding
(`pair_ops.split_pair`, special tokens left out). Layers: shared input BiLSTM -> soft alignment
attention -> enhancement [a; a~; a - a~; a * a~] -> projection (dense, ReLU, back to
`lstm_units`) -> shared composition BiLSTM -> masked average and max pooling of both sentences
-> dense(tanh) -> dense.

`lstm_units` defaults to the paper's 300 (as does the hidden layer); unlike the paper's word
embeddings, the input here is already contextual, so smaller values are a reasonable saving.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from stackft_jax.models.dense import Dense
from stackft_jax.models.dropout import Dropout
from stackft_jax.models.features import Features
from stackft_jax.models.heads.pair_ops import split_pair, stack_pair, unstack_pair
from stackft_jax.models.layers import MaskedBiLstm, masked_max, masked_mean


def default_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {
            "lstm_units": 300,  # units per direction of the input and composition BiLSTMs
            "mlp_hidden_dim": 300,  # width of the tanh layer before the output
        }
    )


def _masked_softmax(scores: jax.Array, mask: jax.Array, axis: int) -> jax.Array:
    """Softmax over `axis` restricted to `mask`; all-zero weights where the mask is empty."""
    weights = jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(scores.dtype).min), axis=axis)
    return weights * mask


class EsimHead(nnx.Module):
    reads = "sentence_pair"  # what it reads (heads.head_input): the two texts of a pair

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
        units = config.lstm_units
        self.dtype = dtype
        self.dropout = Dropout(dropout_rate)
        self.encoder = MaskedBiLstm(hidden_size, units, dtype=dtype, rngs=rngs)
        self.projection = Dense(4 * 2 * units, units, dtype=dtype, rngs=rngs)
        self.composition = MaskedBiLstm(units, units, dtype=dtype, rngs=rngs)
        # Pooled vector: [avg; max] of the 2*units composition outputs, for both sentences.
        self.hidden = Dense(4 * 2 * units, config.mlp_hidden_dim, dtype=dtype, rngs=rngs)
        self.output = Dense(config.mlp_hidden_dim, num_outputs, dtype=dtype, rngs=rngs)

    def __call__(self, features: Features, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> jax.Array:
        def drop(x: jax.Array) -> jax.Array:
            return self.dropout(x, deterministic=deterministic, rngs=rngs)

        p, q = split_pair(features, self.dtype)
        lengths = stack_pair(p.lengths, q.lengths)
        mask = stack_pair(p.mask, q.mask)[..., None]

        encoded, _ = self.encoder(drop(stack_pair(p.states, q.states)), lengths)
        a, b = unstack_pair(encoded)

        # Soft alignment: e_ij = a_i . b_j, each side attends over the other's real tokens.
        scores = jnp.einsum("bid,bjd->bij", a, b)
        pair_mask = p.mask[:, :, None] & q.mask[:, None, :]
        a_aligned = jnp.einsum("bij,bjd->bid", _masked_softmax(scores, pair_mask, axis=2), b)
        b_aligned = jnp.einsum("bij,bid->bjd", _masked_softmax(scores, pair_mask, axis=1), a)

        def enhance(x: jax.Array, x_aligned: jax.Array) -> jax.Array:
            return jnp.concatenate([x, x_aligned, x - x_aligned, x * x_aligned], axis=-1)

        enhanced = stack_pair(enhance(a, a_aligned), enhance(b, b_aligned))
        projected = drop(nnx.relu(self.projection(enhanced)))
        composed, _ = self.composition(projected, lengths)

        pooled = jnp.concatenate(
            [masked_mean(composed, mask, axis=1), masked_max(composed, mask, axis=1)], axis=-1
        )
        x = drop(jnp.concatenate(unstack_pair(pooled), axis=-1))
        x = drop(jnp.tanh(self.hidden(x)))
        return self.output(x)

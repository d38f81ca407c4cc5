"""A linear probe: one dense layer on the [CLS] state or the mean of the token states (LP-FT's head,
Kumar et al. 2022; the `lp_ft` strategy requires it)."""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from stackft_jax.models.dense import Dense
from stackft_jax.models.dropout import Dropout
from stackft_jax.models.features import Features
from stackft_jax.runtime.cli_errors import ConfigError

POOLINGS = ("cls", "mean")


def default_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {"pooling": "cls"}  # cls: the [CLS] state | mean: the mean of the real tokens' states
    )


class LinearHead(nnx.Module):
    """pooled state -> dropout -> dense(num_outputs)."""

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
        if config.pooling not in POOLINGS:
            raise ConfigError(f"config.head.linear.pooling={config.pooling!r}: choose one of {POOLINGS}")
        self.pooling = config.pooling
        self.dropout = Dropout(dropout_rate)
        self.output = Dense(hidden_size, num_outputs, dtype=dtype, rngs=rngs)

    def __call__(self, features: Features, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> jax.Array:
        if self.pooling == "cls":
            x = features.sequence[:, 0]
        else:
            mask = features.attention_mask[..., None].astype(features.sequence.dtype)
            x = (features.sequence * mask).sum(1) / jnp.maximum(mask.sum(1), 1)
        return self.output(self.dropout(x, deterministic=deterministic, rngs=rngs))

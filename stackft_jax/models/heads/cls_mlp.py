"""The paper's finetune-only head: two dense layers on the [CLS] state."""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from stackft_jax.models.dense import Dense
from stackft_jax.models.dropout import Dropout
from stackft_jax.models.features import Features


def default_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {"hidden_dim": 256}  # width of the tanh layer between [CLS] and the output
    )


class ClsMlpHead(nnx.Module):
    """[CLS] -> dropout -> dense(hidden_dim, tanh) -> dropout -> dense(num_outputs)."""

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
        self.dropout = Dropout(dropout_rate)
        self.hidden = Dense(hidden_size, config.hidden_dim, dtype=dtype, rngs=rngs)
        self.output = Dense(config.hidden_dim, num_outputs, dtype=dtype, rngs=rngs)

    def __call__(self, features: Features, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> jax.Array:
        x = features.sequence[:, 0]
        x = self.dropout(x, deterministic=deterministic, rngs=rngs)
        x = jnp.tanh(self.hidden(x))
        x = self.dropout(x, deterministic=deterministic, rngs=rngs)
        return self.output(x)

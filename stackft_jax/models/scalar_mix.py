"""Peters et al.'s learned scalar mix: gamma * sum_j softmax(w)_j * h_j over all BERT layers."""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx


class ScalarMix(nnx.Module):
    def __init__(self, num_layers: int):
        # Zero logits start as the plain layer average, as in AllenNLP's ScalarMix.
        self.layer_logits = nnx.Param(jnp.zeros((num_layers,), jnp.float32))
        self.gamma = nnx.Param(jnp.ones((), jnp.float32))

    def __call__(self, hidden_states: Sequence[jax.Array]) -> jax.Array:
        if len(hidden_states) != self.layer_logits.shape[0]:
            raise ValueError(
                f"ScalarMix built for {self.layer_logits.shape[0]} layers got {len(hidden_states)}"
            )
        weights = jax.nn.softmax(self.layer_logits[...])
        dtype = hidden_states[0].dtype
        mixed = sum(w.astype(dtype) * h for w, h in zip(weights, hidden_states, strict=True))
        return (self.gamma[...].astype(dtype) * mixed).astype(dtype)

"""Sim-Transformer: BiMPM's matching layer followed by a transformer encoder instead of the
aggregation BiLSTM.

P and Q go through `bimpm.BiMpmMatching` (context BiLSTM + multi-perspective matching); each
sentence's matching vectors are projected to `model_dim`, given sinusoidal positions (the BiLSTM
it replaces was order aware; a learned table would fix a maximum length), and encoded by a shared
pre-LayerNorm transformer. Pooling is the masked mean and max over each sentence (as ESIM pools),
so no [CLS] slot has to be inserted into the packed sentences; [mean_p; max_p; mean_q; max_q]
feeds dense(tanh) -> dense. All dropouts (attention included) use the head's `dropout_rate`.

The output layer starts at zero (`output_init`), so the first logits are 0 for every pair. The matching
vectors are mostly an example-independent offset (cosines of BERT states: on QQP with MiniLM, 87% of
their magnitude is the same for every pair), which a randomly initialised output layer turns into a
large random constant logit (a 1.4 logit lean towards one class at init). Adam at the phase-1 rate of
1e-3 then swings that constant from one class to the other instead of learning from the inputs: frozen
MiniLM, QQP, 60 steps, dev accuracy 0.45/0.43 (seeds 1, 0; every pair one class at steps 20 and 40)
with `lecun_normal`, 0.70/0.72 with `zeros`; Kaiming (He) initialisation of the dense layers swings too.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from stackft_jax.models.dense import Dense
from stackft_jax.models.dropout import Dropout
from stackft_jax.models.features import Features
from stackft_jax.models.heads.bimpm import BiMpmMatching
from stackft_jax.models.heads.pair_ops import split_pair, stack_pair, unstack_pair
from stackft_jax.models.layers import masked_max, masked_mean
from stackft_jax.runtime.cli_errors import ConfigError


def default_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {
            "use_context_lstm": True,  # a BiLSTM over the BERT states before matching
            "context_lstm_units": 100,  # units per direction of that context BiLSTM
            "num_perspectives": 20,  # perspectives l of each matching strategy
            "model_dim": 128,  # width of the transformer the matching vectors are projected to
            "num_layers": 2,  # transformer encoder layers
            "num_heads": 4,  # attention heads per layer
            "ff_dim": 512,  # feed-forward width inside each layer
            "mlp_hidden_dim": 200,  # width of the tanh layer before the output
            "output_init": "zeros",  # zeros | lecun_normal: the output layer's kernel at init (docstring)
        }
    )


OUTPUT_INITS = {"zeros": nnx.initializers.zeros_init(), "lecun_normal": nnx.initializers.lecun_normal()}


def sinusoidal_positions(length: int, dim: int) -> jax.Array:
    """[length, dim] sin/cos position codes of Vaswani et al. (2017)."""
    positions = jnp.arange(length, dtype=jnp.float32)[:, None]
    inv_freq = jnp.exp(-jnp.log(10000.0) * jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles = positions * inv_freq[None, :]
    codes = jnp.zeros((length, dim), jnp.float32)
    codes = codes.at[:, 0::2].set(jnp.sin(angles))
    return codes.at[:, 1::2].set(jnp.cos(angles[:, : dim // 2]))


class EncoderLayer(nnx.Module):
    """Pre-LayerNorm block: x + MHA(LN(x)), then x + FF(LN(x)). Pre-LN because the head trains from
    scratch (often with BERT frozen) and needs no warmup to be stable."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ff_dim: int,
        dropout_rate: float,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        self.attention_norm = nnx.LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(
            num_heads,
            dim,
            dropout_rate=dropout_rate,
            decode=False,
            dtype=dtype,
            keep_rngs=False,  # dropout keys come from the call's rngs, like every other dropout
            rngs=rngs,
        )
        self.ff_norm = nnx.LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.ff_in = Dense(dim, ff_dim, dtype=dtype, rngs=rngs)
        self.ff_out = Dense(ff_dim, dim, dtype=dtype, rngs=rngs)
        self.dropout = Dropout(dropout_rate)

    def __call__(
        self, x: jax.Array, mask: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        y = self.attention(
            self.attention_norm(x),
            mask=nnx.make_attention_mask(mask, mask),
            deterministic=deterministic,
            rngs=rngs,
        )
        x = x + self.dropout(y, deterministic=deterministic, rngs=rngs)
        y = self.ff_out(nnx.gelu(self.ff_in(self.ff_norm(x))))
        return x + self.dropout(y, deterministic=deterministic, rngs=rngs)


class SimTransformerHead(nnx.Module):
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
        if config.output_init not in OUTPUT_INITS:
            raise ConfigError(
                f"config key 'head.sim_transformer.output_init' = {config.output_init!r}: "
                f"choose one of {sorted(OUTPUT_INITS)}"
            )
        self.dtype = dtype
        self.matching = BiMpmMatching.from_config(
            config, hidden_size=hidden_size, dropout_rate=dropout_rate, dtype=dtype, rngs=rngs
        )
        dim = config.model_dim
        self.input_projection = Dense(self.matching.output_dim, dim, dtype=dtype, rngs=rngs)
        self.layers = nnx.List(
            [
                EncoderLayer(dim, config.num_heads, config.ff_dim, dropout_rate, dtype, rngs)
                for _ in range(config.num_layers)
            ]
        )
        self.final_norm = nnx.LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.dropout = Dropout(dropout_rate)
        self.hidden = Dense(4 * dim, config.mlp_hidden_dim, dtype=dtype, rngs=rngs)
        self.output = Dense(
            config.mlp_hidden_dim,
            num_outputs,
            kernel_init=OUTPUT_INITS[config.output_init],
            dtype=dtype,
            rngs=rngs,
        )

    def __call__(self, features: Features, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> jax.Array:
        p, q = split_pair(features, self.dtype)
        match_p, match_q = self.matching(p, q, deterministic=deterministic, rngs=rngs)
        mask = stack_pair(p.mask, q.mask)
        x = self.input_projection(stack_pair(match_p, match_q))
        x = x + sinusoidal_positions(x.shape[1], x.shape[2]).astype(x.dtype)
        x = self.dropout(x, deterministic=deterministic, rngs=rngs)
        for layer in self.layers:
            x = layer(x, mask, deterministic=deterministic, rngs=rngs)
        x = self.final_norm(x)
        pooled = jnp.concatenate(
            [masked_mean(x, mask[..., None], axis=1), masked_max(x, mask[..., None], axis=1)],
            axis=-1,
        )
        x = jnp.concatenate(unstack_pair(pooled), axis=-1)
        x = self.dropout(x, deterministic=deterministic, rngs=rngs)
        x = jnp.tanh(self.hidden(x))
        x = self.dropout(x, deterministic=deterministic, rngs=rngs)
        return self.output(x)

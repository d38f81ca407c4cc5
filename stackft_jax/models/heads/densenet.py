"""A 1-D DenseNet over the BERT token states, the convolutional head of Wang et al. (2019)'s Yahoo
Answers experiment, after Le, Cerisara & Denis (2018), "Do convolutional networks need to be deep for
text classification?".

Layers: stem convolution (hidden -> `stem_channels`) -> `num_blocks` dense blocks of `convs_per_block`
convolutions, in which each convolution reads the concatenation of the block input and every earlier
output of the block (so the k-th reads `block input + (k - 1) * growth_rate` channels) -> between
blocks a transition: 1x1 convolution compressing by `compression`, then pooling over time with
stride 2 -> masked global max and mean pooling -> [pooled; CLS state] -> dense -> logits.

What a block hands on (`block_output`): "concat", the default, is standard DenseNet (Huang et al.
2017): the block input and all its convolutions' outputs. "last" is what Le et al.'s code does: only
the block's last convolution (whose input still saw all earlier ones).

No batch normalisation: its running statistics would be state to checkpoint, restore and freeze per
phase. Each convolution is pre-activated with LayerNorm over the channels of each position instead
(norm -> ReLU -> conv, DenseNet's order): no state, and a position's value never depends on other
rows of the batch or on padding.

Padding never leaks: padded positions are zeroed before every convolution (so a kernel-3 convolution
at the last real token sees zeros, as at the edge of the sequence), a pooled position is real when any
of the positions it pools is (real tokens are left-aligned, so that is the first ceil(length / 2)) and
pools only real inputs, and the global pooling is masked.
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

BLOCK_OUTPUTS = ("concat", "last")
POOLINGS = {"max": masked_max, "mean": masked_mean}


def default_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {
            "stem_channels": 64,  # channels of the first convolution, from the BERT states into block 1
            "num_blocks": 4,  # dense blocks, with a transition (compress + pool by 2) between two
            "convs_per_block": 4,  # convolutions per dense block
            "growth_rate": 32,  # output channels of each convolution inside a block
            "kernel_size": 3,  # width over time of the stem and block convolutions ('SAME' padding)
            "compression": 0.5,  # a transition keeps this fraction of its input channels (at least 1)
            "block_output": "concat",  # "concat": block input + all its convs (DenseNet); "last": last conv
            "transition_pooling": "max",  # pooling over time (window 2, stride 2) in transitions: max|mean
        }
    )


def _check_choice(config: ml_collections.ConfigDict, key: str, choices) -> None:
    if config[key] not in choices:
        raise ConfigError(f"config.head.densenet.{key}={config[key]!r}: choose from {sorted(choices)}")


def _pool_by_two(x: jax.Array, mask: jax.Array, pooling) -> tuple[jax.Array, jax.Array]:
    """Masked pooling over windows of two positions, stride 2: [batch, length, channels] ->
    [batch, ceil(length / 2), channels]; a pooled position is real if any of its two is."""
    batch, length, channels = x.shape
    if length % 2:
        x = jnp.pad(x, ((0, 0), (0, 1), (0, 0)))
        mask = jnp.pad(mask, ((0, 0), (0, 1)))
    windows = x.reshape(batch, -1, 2, channels)
    window_mask = mask.reshape(batch, -1, 2)
    return pooling(windows, window_mask[..., None], axis=2), window_mask.any(axis=2)


class _PreActivatedConv(nnx.Module):
    """LayerNorm -> ReLU -> zero padding -> convolution (He-initialised) along time."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, dtype, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(in_channels, dtype=dtype, rngs=rngs)
        self.conv = nnx.Conv(
            in_channels,
            out_channels,
            kernel_size=(kernel_size,),
            padding="SAME",
            dtype=dtype,
            kernel_init=nnx.initializers.he_normal(),
            rngs=rngs,
        )

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = jnp.where(mask[..., None], nnx.relu(self.norm(x)), 0)
        return self.conv(x)


class _DenseBlock(nnx.Module):
    def __init__(self, in_channels: int, config: ml_collections.ConfigDict, *, dtype, rngs: nnx.Rngs):
        growth = config.growth_rate
        self.concat_output = config.block_output == "concat"
        self.convs = nnx.List(
            [
                _PreActivatedConv(
                    in_channels + k * growth, growth, config.kernel_size, dtype=dtype, rngs=rngs
                )
                for k in range(config.convs_per_block)
            ]
        )
        self.out_channels = in_channels + len(self.convs) * growth if self.concat_output else growth

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        outputs = [x]
        for conv in self.convs:
            outputs.append(conv(jnp.concatenate(outputs, axis=-1), mask))
        return jnp.concatenate(outputs, axis=-1) if self.concat_output else outputs[-1]


class DenseNetHead(nnx.Module):
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
        _check_choice(config, "block_output", BLOCK_OUTPUTS)
        _check_choice(config, "transition_pooling", POOLINGS)
        for key in ("stem_channels", "num_blocks", "convs_per_block", "growth_rate", "kernel_size"):
            if config[key] < 1:
                raise ConfigError(f"config.head.densenet.{key}={config[key]} must be at least 1")
        if not 0 < config.compression <= 1:
            raise ConfigError(f"config.head.densenet.compression={config.compression} must be in (0, 1]")
        self.pooling = POOLINGS[config.transition_pooling]
        self.dropout = Dropout(dropout_rate)
        he = nnx.initializers.he_normal()
        self.stem = nnx.Conv(
            hidden_size,
            config.stem_channels,
            kernel_size=(config.kernel_size,),
            padding="SAME",
            dtype=dtype,
            kernel_init=he,
            rngs=rngs,
        )
        blocks, transitions = [], []
        channels = config.stem_channels
        for index in range(config.num_blocks):
            if index:
                compressed = max(1, int(channels * config.compression))
                transitions.append(_PreActivatedConv(channels, compressed, 1, dtype=dtype, rngs=rngs))
                channels = compressed
            blocks.append(_DenseBlock(channels, config, dtype=dtype, rngs=rngs))
            channels = blocks[-1].out_channels
        self.blocks = nnx.List(blocks)
        self.transitions = nnx.List(transitions)
        self.final_norm = nnx.LayerNorm(channels, dtype=dtype, rngs=rngs)
        # [masked max; masked mean] of the last block, then the [CLS] state.
        self.output = Dense(2 * channels + hidden_size, num_outputs, dtype=dtype, kernel_init=he, rngs=rngs)

    def __call__(self, features: Features, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> jax.Array:
        mask = features.attention_mask.astype(bool)
        states = self.dropout(features.sequence, deterministic=deterministic, rngs=rngs)
        x = self.stem(jnp.where(mask[..., None], states, 0))
        for index, block in enumerate(self.blocks):
            if index:
                x, mask = _pool_by_two(self.transitions[index - 1](x, mask), mask, self.pooling)
            x = block(x, mask)
        x = nnx.relu(self.final_norm(x))
        pooled = jnp.concatenate(
            [masked_max(x, mask[..., None], axis=1), masked_mean(x, mask[..., None], axis=1)], axis=-1
        )
        x = jnp.concatenate([pooled, features.sequence[:, 0]], axis=-1)
        return self.output(self.dropout(x, deterministic=deterministic, rngs=rngs))

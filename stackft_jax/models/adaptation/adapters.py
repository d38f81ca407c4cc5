"""Houlsby bottleneck adapters (Houlsby et al. 2019): after each layer's attention and after its
feed-forward, the sublayer's output (after its dense and dropout, before the residual add and LayerNorm)
passes through x + up(act(down(x))). `up` starts at zero, so every adapter starts as an exact identity and
step 0 is the pretrained model bit for bit. A phase of this kind trains the adapters only.

They cannot be folded into the encoder's weights (the activation sits between down and up): transformers'
own model classes have no place for them, so such a run is used through stackft_jax (predict), not
exported to transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from flax import nnx

from stackft_jax.models.adaptation.kind import AdaptationKind, AdapterSettings, EncoderAdaptation
from stackft_jax.models.dense import Dense

OPTIONS = {
    "bottleneck": 64,  # the adapter's inner width (down: hidden -> bottleneck, up: bottleneck -> hidden)
    "activation": "gelu",  # between down and up: gelu (exact erf form) | relu
}
_ACTIVATIONS = {"gelu": lambda x: jax.nn.gelu(x, approximate=False), "relu": jax.nn.relu}
_DOWN_STD = 0.01  # near-identity start (Houlsby et al.); `up` is zero, so the adapter is identity anyway


class Adapter(nnx.Module):
    """x + up(act(down(x))) on [..., width]."""

    def __init__(
        self, width: int, settings: AdapterSettings, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs
    ):
        def dense(n_in: int, n_out: int, kernel_init) -> Dense:
            return Dense(
                n_in,
                n_out,
                dtype=dtype,
                param_dtype=param_dtype,
                kernel_init=kernel_init,
                bias_init=nnx.initializers.zeros,
                rngs=rngs,
            )

        self.down = dense(width, settings.bottleneck, nnx.initializers.normal(_DOWN_STD))
        self.up = dense(settings.bottleneck, width, nnx.initializers.zeros)
        self.activation = settings.activation

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.up(_ACTIVATIONS[self.activation](self.down(x)))


def _settings(options: Mapping[str, Any]) -> AdapterSettings:
    o = KIND.resolve(options)
    return AdapterSettings(bottleneck=o["bottleneck"], activation=o["activation"])


def _added_flops(options: Mapping[str, Any], hidden: int, intermediate: int) -> float:
    """Two adapters per layer, each down (hidden x bottleneck) then up (bottleneck x hidden)."""
    return float(2 * 2 * (2 * hidden * _settings(options).bottleneck))


KIND = AdaptationKind(
    name="adapters",
    options=OPTIONS,
    trained_patterns=lambda options: (r"backbone/layers/\d+/(attention|output)_adapter/.*",),
    encoder_settings=lambda options: EncoderAdaptation(adapters=_settings(options)),
    foldable=False,
    added_flops=_added_flops,
)

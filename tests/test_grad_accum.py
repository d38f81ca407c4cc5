"""Gradient accumulation and the step's two compiled variants: k micro-batches make the same optimizer
step as one batch k times as large, and the per-part norms change nothing but the metrics."""

import jax
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from stackft_jax.config import spec
from stackft_jax.data.tasks import get_task
from stackft_jax.models.bert import resolve_model_dir
from stackft_jax.runtime import sharding
from stackft_jax.runtime.cli_errors import ConfigError
from stackft_jax.training import loop, steps
from stackft_jax.training.build import build_model

ROWS, LENGTH = 16, 32


def _setup():
    config = tiny.get_config()
    config.model.dropout_rate = 0.0
    config.head.dropout_rate = 0.0
    task = get_task("qqp")
    model, _ = build_model(config, task, resolve_model_dir(config.model.name_or_path))
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, LENGTH, size=ROWS)
    mask = (np.arange(LENGTH)[None] < lengths[:, None]).astype(np.int32)
    batch = {
        "input_ids": rng.integers(1000, 2000, size=(ROWS, LENGTH)).astype(np.int32) * mask,
        "token_type_ids": ((np.arange(LENGTH)[None] > lengths[:, None] // 2) * mask).astype(np.int32),
        "segment_ids": ((np.arange(LENGTH)[None] > lengths[:, None] // 2) + 1) * mask,
        "attention_mask": mask,
        "labels": rng.integers(0, 2, size=ROWS).astype(np.int32),
        "example_mask": (np.arange(ROWS) < ROWS - 3).astype(np.float32),  # three padding rows
    }
    phase = spec.resolve(config).plan(10)[1]  # everything trains
    return config, task, graphdef, state.to_pure_dict(), batch, phase


def _phase_step(setup, devices: int = 1, **options) -> tuple[loop.PhaseStep, jax.sharding.Mesh]:
    """The setup's phase step on the first `devices` devices (`options`: build_phase_step's step
    options) and its mesh."""
    _, task, graphdef, params, _, phase = setup
    mesh = sharding.make_mesh(jax.devices()[:devices])
    phase_step = loop.build_phase_step(
        phase,
        1,
        params,
        graphdef=graphdef,
        objective=task.objective,
        mesh=mesh,
        seed=0,
        max_grad_norm=1.0,
        **options,
    )
    return phase_step, mesh


def _one_step(
    setup, *, grad_accum_steps: int, with_norms: bool = False, loss_denominator: float | None = None
):
    params, batch = setup[3], setup[4]
    phase_step, mesh = _phase_step(
        setup, grad_accum_steps=grad_accum_steps, loss_denominator=loss_denominator
    )
    state = steps.TrainState(**phase_step.init_state(params))
    for _ in range(2):  # the first step's warmup learning rate is 0
        state, metrics = phase_step.train_step(state, sharding.put_batch(batch, mesh), with_norms=with_norms)
    return jax.device_get(state.params), jax.device_get(metrics)


def test_micro_batches_make_the_step_of_the_whole_batch():
    setup = _setup()
    whole, m1 = _one_step(setup, grad_accum_steps=1)
    for k in (2, 4):
        accumulated, mk = _one_step(setup, grad_accum_steps=k)
        np.testing.assert_allclose(mk["loss"], m1["loss"], rtol=1e-6)
        np.testing.assert_allclose(mk["grad_norm"], m1["grad_norm"], rtol=1e-5)
        assert float(mk["count"]) == float(m1["count"]) == ROWS - 3
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), accumulated, whole)
    # And the step moved the parameters (an update of zero would match too).
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()), whole, setup[3]))
    assert max(moved) > 1e-4


def test_corpus_mean_divides_the_summed_loss_by_the_expected_count():
    # batching.corpus_mean: the gradient is the batch's summed loss over a fixed count. At the batch's
    # own count it is the batch's mean (batch_mean's step); at twice that, half the gradient; either
    # way the logged loss stays the batch's mean. With micro-batches, the same step.
    setup = _setup()
    whole, m1 = _one_step(setup, grad_accum_steps=1, loss_denominator=None)
    own, m_own = _one_step(setup, grad_accum_steps=1, loss_denominator=float(ROWS - 3))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), own, whole)
    half, m_half = _one_step(setup, grad_accum_steps=1, loss_denominator=2.0 * (ROWS - 3))
    np.testing.assert_allclose(m_half["grad_norm"], m1["grad_norm"] / 2, rtol=1e-5)
    np.testing.assert_allclose(m_half["loss"], m1["loss"], rtol=1e-6)
    accumulated, m_acc = _one_step(setup, grad_accum_steps=4, loss_denominator=2.0 * (ROWS - 3))
    np.testing.assert_allclose(m_acc["grad_norm"], m_half["grad_norm"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), accumulated, half)


def test_norms_variant_changes_only_the_metrics():
    setup = _setup()
    plain, m_plain = _one_step(setup, grad_accum_steps=1)
    normed, m_normed = _one_step(setup, grad_accum_steps=1, with_norms=True)
    assert not any(key.startswith(("grad_norm/", "update_norm/")) for key in m_plain)
    assert m_normed["grad_norm/head"] > 0 and m_normed["update_norm/backbone"] > 0
    jax.tree.map(np.testing.assert_array_equal, plain, normed)
    assert float(m_plain["real_tokens"]) == setup[4]["attention_mask"].sum()


@pytest.mark.parametrize("value", [0, -2, 1.5, "2", True])
def test_a_bad_grad_accum_steps_is_one_line_naming_the_key(value):
    config = tiny.get_config()
    with config.ignore_type():
        config.grad_accum_steps = value
    with pytest.raises(ConfigError, match=r"^config\.grad_accum_steps=.*$"):
        spec.resolve(config)


def test_the_steps_own_clip_is_optax_clip_by_global_norm():
    # build_phase_step clips inside the step with the norm its guard computes; optim's chain with
    # optax.clip_by_global_norm is what it replaces: the same parameters and optimizer state tree.
    from stackft_jax.training import optim

    config, task, graphdef, params, batch, phase = _setup()
    mesh = sharding.make_mesh(jax.devices()[:1])
    max_norm = 1e-3  # far below the tiny model's gradient norm: every step clips
    ours = loop.build_phase_step(
        phase,
        1,
        params,
        graphdef=graphdef,
        objective=task.objective,
        mesh=mesh,
        seed=0,
        max_grad_norm=max_norm,
    )
    tx, labels = optim.phase_optimizer(params, phase, max_grad_norm=max_norm)
    optax_step = jax.jit(
        lambda state, b, key: steps.train_step(
            state,
            b,
            graphdef=graphdef,
            tx=tx,
            trainable=optim.trainable_mask(labels),
            objective=task.objective,
            dropout_key=key,
            backbone_deterministic=not phase.backbone_dropout,
        )
    )
    a = steps.TrainState(**ours.init_state(params))
    b = steps.TrainState.create(params, tx.init(params))
    assert jax.tree.structure(a.opt_state) == jax.tree.structure(b.opt_state)
    device_batch = sharding.put_batch(batch, mesh)
    for _ in range(2):
        a, metrics = ours.train_step(a, device_batch)
        b, _ = optax_step(b, device_batch, ours.dropout_key)
    assert float(metrics["grad_norm"]) > 10 * max_norm
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7),
        jax.device_get(a.params),
        jax.device_get(b.params),
    )

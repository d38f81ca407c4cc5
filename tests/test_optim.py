"""Parameter labels, weight-decay masks and what each strategy trains."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import tiny
from stackft_jax.config import phases, spec
from stackft_jax.training import optim


def _params():
    return {
        "backbone": {
            "embeddings": {
                "word_embeddings": {"embedding": jnp.ones((5, 4))},
                "layer_norm": {"scale": jnp.ones(4), "bias": jnp.zeros(4)},
            },
            "layers": {
                0: {"attention": {"query": {"kernel": jnp.ones((4, 4)), "bias": jnp.zeros(4)}}},
                1: {"output": {"kernel": jnp.ones((4, 4)), "bias": jnp.zeros(4)}},
            },
        },
        "head": {
            "net": {"hidden": {"kernel": jnp.ones((4, 2)), "bias": jnp.zeros(2)}},
            "mix": {"layer_logits": jnp.zeros(3), "gamma": jnp.ones(())},
        },
    }


def _flat(tree):
    return {optim.path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_labels_follow_first_matching_rule():
    labels = _flat(optim.label_params(_params(), [("backbone/.*", optim.FROZEN), ("head/.*", "head")]))
    assert labels["backbone/layers/0/attention/query/kernel"] == optim.FROZEN
    assert labels["backbone/embeddings/layer_norm/scale"] == optim.FROZEN
    assert labels["head/net/hidden/kernel"] == "head"
    assert labels["head/mix/gamma"] == "head"


def test_unmatched_parameter_is_an_error():
    with pytest.raises(ValueError, match="match no rule"):
        optim.label_params(_params(), [("backbone/.*", "backbone")])


def test_weight_decay_only_on_kernels_and_embeddings():
    decay = _flat(optim.weight_decay_mask(_params()))
    assert decay["backbone/embeddings/word_embeddings/embedding"]
    assert decay["backbone/layers/1/output/kernel"]
    assert not decay["backbone/layers/1/output/bias"]
    assert not decay["backbone/embeddings/layer_norm/scale"]
    assert not decay["backbone/embeddings/layer_norm/bias"]
    assert not decay["head/mix/gamma"]


def _phase(strategy, index=0, **overrides):
    config = tiny.get_config()
    config.strategy = strategy
    for key, value in overrides.items():
        block, leaf = key.split(".")
        config[block][leaf] = value
    return spec.resolve(config).plan(10)[index]


def _optimizer(phase):
    return optim.phase_optimizer(_params(), phase, max_grad_norm=1.0)


def test_frozen_backbone_holds_no_optimizer_state():
    tx, labels = _optimizer(_phase("stack_and_finetune", 0))
    state = tx.init(_params())
    head_only = optim.optimizer_state_bytes(state)
    tx_full, _ = _optimizer(_phase("stack_and_finetune", 1))
    full = optim.optimizer_state_bytes(tx_full.init(_params()))
    head_floats = sum(x.size for x in jax.tree.leaves(_params()["head"]))
    all_floats = sum(x.size for x in jax.tree.leaves(_params()))
    # AdamW keeps mu and nu (+ a few int32 counters) for each trainable float.
    assert head_only - 2 * 4 * head_floats < 64
    assert full - 2 * 4 * all_floats < 64


def test_frozen_updates_are_zero_and_trainable_are_not():
    tx, labels = _optimizer(_phase("stack_and_finetune", 0))
    params = _params()
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    for name, update in _flat(updates).items():
        if name.startswith("backbone"):
            assert not np.any(update), name
        else:
            assert np.all(update != 0), name


def test_clipping_sees_only_trainable_leaves():
    tx, _ = _optimizer(_phase("stack_and_finetune", 0, **{"phase1.weight_decay": 0.0}))
    params = _params()
    # Huge backbone gradients must not shrink the head update through the global norm.
    grads = jax.tree.map(jnp.ones_like, params)
    grads["backbone"] = jax.tree.map(lambda g: g * 1e6, grads["backbone"])
    small = jax.tree.map(jnp.ones_like, params)
    a, _ = tx.update(grads, tx.init(params), params)
    b, _ = tx.update(small, tx.init(params), params)
    np.testing.assert_array_equal(_flat(a)["head/net/hidden/kernel"], _flat(b)["head/net/hidden/kernel"])


def test_strategies_as_data():
    run = spec.resolve(_cfg("finetune_only"))
    assert [p.name for p in run.phases] == ["finetune"]
    assert run.encoder.trains(run.phases[0])
    run = spec.resolve(_cfg("stack_only"))
    assert [p.name for p in run.phases] == ["stack"] and not run.encoder.trains(run.phases[0])
    assert run.phases[0].stop.max_train_dev_gap is None
    run = spec.resolve(_cfg("stack_and_finetune"))
    both = run.phases
    assert [(p.name, run.encoder.trains(p)) for p in both] == [("phase1", False), ("phase2", True)]
    assert both[0].learning_rates == {"head": 1e-3}
    assert both[1].learning_rates == {"backbone": 1e-3, "head": 1e-3}
    with pytest.raises(ValueError, match="config.strategy"):
        spec.resolve(_cfg("tune_everything")).plan(10)


def test_a_new_head_gets_its_own_rate_and_the_uniform_baseline_keeps_berts():
    config = _cfg("finetune_only")
    config.phase2.backbone_learning_rate = 5e-5
    config.phase2.new_head_learning_rate = 1e-3
    assert spec.resolve(config).plan(10)[0].learning_rates == {"backbone": 5e-5, "head": 1e-3}
    config.strategy = "finetune_only_uniform"
    assert spec.resolve(config).plan(10)[0].learning_rates == {"backbone": 5e-5, "head": 5e-5}
    # A head an earlier phase trained fine-tunes at BERT's rate (Wang et al.'s phase 2, LP-FT, ULMFiT).
    for strategy in ("stack_and_finetune", "lp_ft", "gradual_unfreezing"):
        config.strategy = strategy
        config.head.name = "linear" if strategy == "lp_ft" else "cls_mlp"
        assert spec.resolve(config).plan(10)[-1].learning_rates["head"] == 5e-5
    config.head.name = "cls_mlp"
    # An explicit head rate wins everywhere.
    config.phase2.head_learning_rate = 3e-4
    for strategy in ("finetune_only", "finetune_only_uniform", "stack_and_finetune"):
        config.strategy = strategy
        assert spec.resolve(config).plan(10)[-1].learning_rates["head"] == 3e-4


def _cfg(strategy):
    config = tiny.get_config()
    config.strategy = strategy
    return config


def test_epochs_become_steps_and_warmup_ratio_applies():
    config = _cfg("stack_and_finetune")
    config.phase1.num_steps = 0
    config.phase1.num_epochs = 2.5
    config.phase2.num_steps = 0
    config.phase2.num_epochs = 1.0
    config.phase2.warmup_ratio = 0.1
    p1, p2 = spec.resolve(config).plan(40)
    assert (p1.num_steps, p2.num_steps, p2.warmup_steps) == (100, 40, 4)


def test_layerwise_learning_rates_decay_towards_the_embeddings():
    config = _cfg("finetune_only")
    config.phase2.layerwise_lr_decay = 0.5
    config.phase2.backbone_learning_rate = 8e-5
    phase = spec.resolve(config).plan(10)[0]
    rates = phase.learning_rates
    assert rates["backbone_layer1"] == pytest.approx(4e-5)
    assert rates["backbone_layer0"] == pytest.approx(2e-5)
    assert rates["backbone_embeddings"] == pytest.approx(1e-5)
    labels = _flat(optim.label_params(_params(), phase.rules))
    assert labels["backbone/layers/0/attention/query/kernel"] == "backbone_layer0"
    assert labels["backbone/embeddings/layer_norm/bias"] == "backbone_embeddings"


@pytest.mark.parametrize("shape", ["constant", "warmup_linear", "slanted_triangular"])
def test_schedules(shape):
    schedule = optim.learning_rate_schedule(1.0, num_steps=100, warmup_steps=10, shape=shape)
    assert float(schedule(0)) == 0.0
    assert float(schedule(10)) == pytest.approx(1.0)
    end = {"constant": 1.0, "warmup_linear": 0.0, "slanted_triangular": 1 / 32}[shape]
    assert float(schedule(100)) == pytest.approx(end, abs=1e-6)


def test_stop_tracker_gap_and_patience():
    tracker = phases.StopTracker(phases.StopRule(max_train_dev_gap=0.05, patience_evals=2))
    assert tracker.update(0.70, train_score=0.72, dev_score=0.70) is None
    assert "gap" in tracker.update(0.71, train_score=0.80, dev_score=0.71)
    tracker = phases.StopTracker(phases.StopRule(patience_evals=2))
    assert tracker.update(0.70, train_score=None, dev_score=None) is None
    assert tracker.update(0.69, train_score=None, dev_score=None) is None
    assert "did not improve" in tracker.update(0.70, train_score=None, dev_score=None)
    restored = phases.StopTracker(tracker.rule)
    restored.load_state_dict(tracker.state_dict())
    assert restored.state_dict() == tracker.state_dict()


def test_optax_set_to_zero_is_stateless():
    assert optim.optimizer_state_bytes(optax.set_to_zero().init(_params())) == 0

"""Every registered head on synthetic features (random token states, hand-built pair layouts).

No BERT here, so the file stays fast; configs are shrunk by `small_config`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from stackft_jax.models.features import Features
from stackft_jax.models.heads import HEADS, default_head_configs
from stackft_jax.models.heads.pair_ops import split_pair
from stackft_jax.models.layers import MaskedBiLstm

HIDDEN = 16
LENGTH = 16
# (tokens of a, tokens of b) per example: all different, with a one-token a and an empty b (only its
# [SEP]), so every test also covers the edge cases of the pair split.
PAIR_LENGTHS = [(1, 5), (6, 2), (3, 3), (9, 0), (2, 7), (4, 4), (7, 3), (5, 6)]
SMALL = {
    "hidden_dim": 16,
    "context_lstm_units": 8,
    "num_perspectives": 4,
    "aggregation_lstm_units": 8,
    "mlp_hidden_dim": 16,
    "model_dim": 16,
    "num_layers": 1,
    "num_heads": 2,
    "ff_dim": 32,
    "lstm_units": 8,
    "stem_channels": 8,
    "growth_rate": 4,
}


def small_config(name: str):
    config = HEADS[name][0]()
    for key in config:
        if key in SMALL:
            config[key] = SMALL[key]
    return config


def build(name: str, num_outputs: int = 2, dtype=jnp.float32, dropout_rate: float = 0.1):
    cls = HEADS[name][1]
    return cls(
        small_config(name),
        hidden_size=HIDDEN,
        num_outputs=num_outputs,
        dropout_rate=dropout_rate,
        dtype=dtype,
        rngs=nnx.Rngs(0),
    )


def pair_features(pair_lengths, length: int = LENGTH, seed: int = 0) -> Features:
    """`[CLS] a [SEP] b [SEP] pad...` layouts; padded positions hold random garbage states."""
    token_type = np.zeros((len(pair_lengths), length), np.int32)
    mask = np.zeros((len(pair_lengths), length), np.int32)
    for row, (len_a, len_b) in enumerate(pair_lengths):
        first = len_a + 2
        total = first + len_b + 1
        assert total <= length
        token_type[row, first:total] = 1
        mask[row, :total] = 1
    key_seq, key_pooled = jax.random.split(jax.random.key(seed))
    return Features(
        sequence=jax.random.normal(key_seq, (len(pair_lengths), length, HIDDEN)),
        pooled=jax.random.normal(key_pooled, (len(pair_lengths), HIDDEN)),
        attention_mask=jnp.asarray(mask),
        token_type_ids=jnp.asarray(token_type),
    )


def with_extra_padding(features: Features, extra: int, seed: int = 1) -> Features:
    batch = features.sequence.shape[0]
    garbage = 10.0 * jax.random.normal(jax.random.key(seed), (batch, extra, HIDDEN))
    zeros = jnp.zeros((batch, extra), features.attention_mask.dtype)
    return Features(
        sequence=jnp.concatenate([features.sequence, garbage], axis=1),
        pooled=features.pooled,
        attention_mask=jnp.concatenate([features.attention_mask, zeros], axis=1),
        token_type_ids=jnp.concatenate([features.token_type_ids, zeros], axis=1),
    )


def perturbed(params, scale: float = 0.1):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    noise = [scale * jax.random.normal(k, leaf.shape) for k, leaf in zip(keys, leaves, strict=True)]
    return jax.tree.unflatten(treedef, [leaf + n for leaf, n in zip(leaves, noise, strict=True)])


# The steps in train.py merge a graphdef with parameters alone; these helpers do the same, jitted
# with the graphdef static so that each head/shape compiles once for the whole file.
@functools.partial(jax.jit, static_argnums=0)
def forward(graphdef, params, features: Features) -> jax.Array:
    return nnx.merge(graphdef, params)(features, deterministic=True)


def cross_entropy(graphdef, params, features, labels, *, deterministic, key):
    rngs = None if deterministic else nnx.Rngs(dropout=key)
    logits = nnx.merge(graphdef, params)(features, deterministic=deterministic, rngs=rngs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


TX = optax.adam(1e-2)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(1, 2))
def train_step(graphdef, params, opt_state, features, labels, key):
    grads = jax.grad(cross_entropy, argnums=1)(
        graphdef, params, features, labels, deterministic=False, key=key
    )
    updates, opt_state = TX.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, grads


@functools.cache
def overfit(name: str):
    """Trains a fresh head on 8 random labels as train.py would (dropout on, adam); returns the
    first step's gradients, the labels and the final predictions. Cached: two tests read it."""
    graphdef, params = nnx.split(build(name))
    features = pair_features(PAIR_LENGTHS, seed=3)
    labels = jax.random.bernoulli(jax.random.key(4), 0.5, (len(PAIR_LENGTHS),)).astype(jnp.int32)
    opt_state = TX.init(params)
    first_grads = None
    for step in range(40):
        params, opt_state, grads = train_step(
            graphdef, params, opt_state, features, labels, jax.random.key(step)
        )
        first_grads = grads if first_grads is None else first_grads
    predictions = jnp.argmax(forward(graphdef, params, features), axis=-1)
    return first_grads, labels, predictions


@pytest.fixture(autouse=True, scope="module")
def cheap_compiles():
    # XLA compilation, not execution, is what takes time here; its cheap pipeline is much faster.
    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)


ALL_HEADS = sorted(HEADS)


def test_every_head_has_a_config_block():
    configs = default_head_configs()
    assert sorted(configs) == ALL_HEADS
    assert configs.bimpm.use_context_lstm and not configs.bimpm_no_context.use_context_lstm


@pytest.mark.parametrize("name", ALL_HEADS)
@pytest.mark.parametrize("num_outputs", [1, 2])
def test_output_shape(name, num_outputs):
    head = build(name, num_outputs)
    graphdef, params = nnx.split(head)
    features = pair_features(PAIR_LENGTHS)
    out = jax.eval_shape(forward, graphdef, params, features)
    assert out.shape == (len(PAIR_LENGTHS), num_outputs)


@pytest.mark.parametrize("name", ALL_HEADS)
def test_head_holds_only_parameters(name):
    # eval_step rebuilds the model from (graphdef, params): any other state (RNG counters) would be
    # lost there and break nnx.merge.
    head = build(name)
    params = nnx.state(head, nnx.Param)
    assert len(jax.tree.leaves(nnx.state(head))) == len(jax.tree.leaves(params))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))


@pytest.mark.parametrize("name", ALL_HEADS)
def test_padding_changes_nothing(name):
    graphdef, params = nnx.split(build(name))
    # Nonzero biases, as after training: with zero-initialised LSTM biases a zero state stays zero
    # on zero inputs, which would hide a backward direction that starts in the padding.
    params = perturbed(params)
    features = pair_features(PAIR_LENGTHS)
    logits = forward(graphdef, params, features)
    padded = forward(graphdef, params, with_extra_padding(features, extra=5))
    assert np.all(np.isfinite(logits))
    np.testing.assert_allclose(padded, logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ALL_HEADS)
def test_gradient_reaches_every_parameter(name):
    grads, _, _ = overfit(name)
    dead = [
        jax.tree_util.keystr(path)
        for path, g in jax.tree_util.tree_leaves_with_path(grads)
        if not np.any(np.asarray(g) != 0)
    ]
    assert not dead, f"no gradient reaches {dead}"


@pytest.mark.parametrize("name", ALL_HEADS)
def test_overfits_a_tiny_batch(name):
    _, labels, predictions = overfit(name)
    np.testing.assert_array_equal(predictions, labels)


@pytest.mark.parametrize("name", ALL_HEADS)
def test_bfloat16_compute(name):
    head = build(name, dtype=jnp.bfloat16)
    graphdef, params = nnx.split(head)
    logits = forward(graphdef, params, pair_features(PAIR_LENGTHS))
    assert logits.shape == (len(PAIR_LENGTHS), 2)
    assert np.all(np.isfinite(np.asarray(logits, np.float32)))


def test_split_pair_extracts_both_sentences():
    # Position p holds the value p, so the packed states name the positions they came from.
    #   row 0: [CLS] a1 a2 [SEP] b1 b2 b3 [SEP] pad pad
    #   row 1: [CLS] a1 a2 a3 a4 [SEP] b1 [SEP] pad pad
    #   row 2: [CLS] a1 [SEP] [SEP] pad ...           (empty second sentence)
    #   row 3: [CLS] [SEP] b1 b2 [SEP] pad ...        (empty first sentence)
    token_type = np.array(
        [
            [0, 0, 0, 0, 1, 1, 1, 1, 0, 0],
            [0, 0, 0, 0, 0, 0, 1, 1, 0, 0],
            [0, 0, 0, 1, 0, 0, 0, 0, 0, 0],
            [0, 0, 1, 1, 1, 0, 0, 0, 0, 0],
        ]
    )
    totals = [8, 8, 4, 5]
    mask = (np.arange(10)[None, :] < np.array(totals)[:, None]).astype(np.int32)
    sequence = np.broadcast_to(np.arange(1, 11, dtype=np.float32)[None, :, None], (4, 10, 2))
    features = Features(jnp.asarray(sequence), jnp.zeros((4, 2)), jnp.asarray(mask), jnp.asarray(token_type))
    p, q = split_pair(features)

    def positions(sentence):  # 1-based positions per row, zeros for padding
        return np.asarray(sentence.states[..., 0]).astype(int).tolist()

    assert positions(p) == [
        [2, 3, 0, 0, 0, 0, 0, 0, 0, 0],
        [2, 3, 4, 5, 0, 0, 0, 0, 0, 0],
        [2, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [0] * 10,
    ]
    assert positions(q) == [
        [5, 6, 7, 0, 0, 0, 0, 0, 0, 0],
        [7, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [0] * 10,
        [3, 4, 0, 0, 0, 0, 0, 0, 0, 0],
    ]
    assert np.asarray(p.lengths).tolist() == [2, 4, 1, 0]
    assert np.asarray(q.lengths).tolist() == [3, 1, 0, 2]
    np.testing.assert_array_equal(p.mask, np.asarray(p.states[..., 0]) > 0)
    np.testing.assert_array_equal(q.mask, np.asarray(q.states[..., 0]) > 0)


def test_masked_bilstm_ignores_padding_and_returns_whole_sentence_states():
    lstm = MaskedBiLstm(3, 4, dtype=jnp.float32, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(lstm)
    run = jax.jit(lambda x, lengths, params: nnx.merge(graphdef, params)(x, lengths))
    lengths = jnp.array([4, 2, 0])
    x = jax.random.normal(jax.random.key(0), (3, 6, 3))
    real = (jnp.arange(6)[None, :] < lengths[:, None])[..., None]
    other_padding = jnp.where(real, x, 100.0 * jax.random.normal(jax.random.key(1), x.shape))
    outputs, final = run(x, lengths, params)
    outputs_2, final_2 = run(other_padding, lengths, params)
    # The backward direction starts at the last real token, so no output depends on the padding.
    np.testing.assert_array_equal(outputs, outputs_2)
    np.testing.assert_array_equal(final, final_2)
    assert not np.any(np.asarray(outputs) * ~np.asarray(real))
    # Final = forward output at the last real token, backward output at the first; 0 if empty.
    np.testing.assert_array_equal(final[0], jnp.concatenate([outputs[0, 3, :4], outputs[0, 0, 4:]]))
    np.testing.assert_array_equal(final[1], jnp.concatenate([outputs[1, 1, :4], outputs[1, 0, 4:]]))
    np.testing.assert_array_equal(final[2], np.zeros(8))

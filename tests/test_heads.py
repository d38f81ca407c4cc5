"""Every registered head on synthetic features (random token states, hand-built pair and word layouts).

Sentence(-pair) heads return `[batch, classes]` logits; tagging heads return word scores
(models/word_scores.py) that own their loss and decoding. The same tests run on both through
`loss_per_example` and `predictions_of`. No BERT here, so the file stays fast; configs are shrunk by
`small_config`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from stackft_jax.models import objectives
from stackft_jax.models.features import Features
from stackft_jax.models.heads import HEADS, default_head_configs, is_linear, tagger
from stackft_jax.models.heads.pair_ops import split_pair
from stackft_jax.models.layers import MaskedBiLstm
from stackft_jax.models.word_scores import CrfWordScores, WordLogits

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
    "pooling": "mean",  # the linear head: padding must not reach the mean (test_padding_changes_nothing)
}


def small_config(name: str):
    config = HEADS[name][0]()
    for key in config:
        if key in SMALL:
            config[key] = SMALL[key]
    return config


TAGGING_HEADS = sorted(name for name, (_, cls) in HEADS.items() if cls is tagger.WordTaggerHead)
# IOB2 tags, so the CRF heads build their transition constraints from the names.
TAGS = ("O", "B-X", "I-X", "B-Y", "I-Y")


def build(name: str, num_outputs: int | None = None, dtype=jnp.float32, dropout_rate: float = 0.1):
    """The head on `num_outputs` classes (default 2), or for a tagging head on `TAGS`."""
    cls = HEADS[name][1]
    if num_outputs is None:
        num_outputs = len(TAGS) if name in TAGGING_HEADS else 2
    return cls(
        small_config(name),
        hidden_size=HIDDEN,
        num_outputs=num_outputs,
        output_names=TAGS[:num_outputs],
        dropout_rate=dropout_rate,
        dtype=dtype,
        rngs=nnx.Rngs(0),
    )


def pair_features(pair_lengths, length: int = LENGTH, seed: int = 0) -> Features:
    """`[CLS] a [SEP] b [SEP] pad...` layouts; padded positions hold random garbage states."""
    segments = np.zeros((len(pair_lengths), length), np.int32)
    mask = np.zeros((len(pair_lengths), length), np.int32)
    for row, (len_a, len_b) in enumerate(pair_lengths):
        first = len_a + 2
        total = first + len_b + 1
        assert total <= length
        segments[row, 1 : len_a + 1] = 1
        segments[row, first : total - 1] = 2
        mask[row, :total] = 1
    key_seq, key_pooled = jax.random.split(jax.random.key(seed))
    return Features(
        sequence=jax.random.normal(key_seq, (len(pair_lengths), length, HIDDEN)),
        pooled=jax.random.normal(key_pooled, (len(pair_lengths), HIDDEN)),
        attention_mask=jnp.asarray(mask),
        segment_ids=jnp.asarray(segments),
    )


# Words per row and sub-tokens per word (a word's first sub-token carries it): one-word rows, words
# split into several pieces, and a row that fills the window.
WORD_PIECES = [[1, 2, 1], [3], [1, 1, 1, 1, 2, 1, 1], [2, 2], [1] * 14, [1, 3, 1, 1], [4, 1], [1, 1]]


def word_features(word_pieces=WORD_PIECES, length: int = LENGTH, seed: int = 0) -> Features:
    """`[CLS] words [SEP] pad...` with `word_starts` packed left (zeros past `num_words`), as
    data/word_pieces.py builds them; padded positions hold random garbage states."""
    max_words = max(len(pieces) for pieces in word_pieces)
    mask = np.zeros((len(word_pieces), length), np.int32)
    word_starts = np.zeros((len(word_pieces), max_words), np.int32)
    for row, pieces in enumerate(word_pieces):
        word_starts[row, : len(pieces)] = 1 + np.cumsum([0, *pieces[:-1]])
        mask[row, : sum(pieces) + 2] = 1
        assert sum(pieces) + 2 <= length
    key_seq, key_pooled = jax.random.split(jax.random.key(seed))
    return Features(
        sequence=jax.random.normal(key_seq, (len(word_pieces), length, HIDDEN)),
        pooled=jax.random.normal(key_pooled, (len(word_pieces), HIDDEN)),
        attention_mask=jnp.asarray(mask),
        segment_ids=jnp.asarray(mask),
        word_starts=jnp.asarray(word_starts),
        num_words=jnp.asarray([len(pieces) for pieces in word_pieces], jnp.int32),
    )


def iob2_tags(key: jax.Array, word_pieces=WORD_PIECES) -> jax.Array:
    """Random tags that are valid IOB2 (an I-X only after B-X or I-X), -1 past each row's words."""
    draws = np.asarray(jax.random.randint(key, (len(word_pieces), max(map(len, word_pieces))), 0, len(TAGS)))
    tags = np.full(draws.shape, -1, np.int32)
    for row, pieces in enumerate(word_pieces):
        previous = "O"
        for i in range(len(pieces)):
            name = TAGS[draws[row, i]]
            if name.startswith("I-") and previous[2:] != name[2:]:
                name = "B-" + name[2:]
            tags[row, i], previous = TAGS.index(name), name
    return jnp.asarray(tags)


def features_for(name: str, seed: int = 0) -> Features:
    return word_features(seed=seed) if name in TAGGING_HEADS else pair_features(PAIR_LENGTHS, seed=seed)


def with_extra_padding(features: Features, extra: int, seed: int = 1) -> Features:
    """`extra` more padded tokens of garbage and, for word features, `extra` more padded words."""
    batch = features.sequence.shape[0]
    garbage = 10.0 * jax.random.normal(jax.random.key(seed), (batch, extra, HIDDEN))
    zeros = jnp.zeros((batch, extra), features.attention_mask.dtype)
    padded = features._replace(
        sequence=jnp.concatenate([features.sequence, garbage], axis=1),
        attention_mask=jnp.concatenate([features.attention_mask, zeros], axis=1),
        segment_ids=jnp.concatenate([features.segment_ids, zeros], axis=1),
    )
    if features.word_starts is not None:
        padded = padded._replace(word_starts=jnp.concatenate([features.word_starts, zeros], axis=1))
    return padded


def perturbed(params, scale: float = 0.1):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    noise = [scale * jax.random.normal(k, leaf.shape) for k, leaf in zip(keys, leaves, strict=True)]
    return jax.tree.unflatten(treedef, [leaf + n for leaf, n in zip(leaves, noise, strict=True)])


# The steps loop.py jits merge a graphdef with parameters alone; these helpers do the same, jitted
# with the graphdef static so that each head/shape compiles once for the whole file.
@functools.partial(jax.jit, static_argnums=0)
def forward(graphdef, params, features: Features) -> jax.Array:
    return nnx.merge(graphdef, params)(features, deterministic=True)


def loss_per_example(outputs, features: Features, labels: jax.Array) -> jax.Array:
    if isinstance(outputs, jax.Array):  # sentence(-pair) logits
        return optax.softmax_cross_entropy_with_integer_labels(outputs, labels)
    return outputs.negative_log_likelihood(labels, features.num_words)  # word scores


def predictions_of(outputs, features: Features) -> jax.Array:
    if isinstance(outputs, jax.Array):
        return jnp.argmax(outputs, axis=-1)
    return outputs.decode(features.num_words)  # PAD_TAG past each row's words


def labels_for(name: str, key: jax.Array) -> jax.Array:
    if name in TAGGING_HEADS:
        return iob2_tags(key)
    return jax.random.bernoulli(key, 0.5, (len(PAIR_LENGTHS),)).astype(jnp.int32)


def mean_loss(graphdef, params, features, labels, *, deterministic, key):
    rngs = None if deterministic else nnx.Rngs(dropout=key)
    outputs = nnx.merge(graphdef, params)(features, deterministic=deterministic, rngs=rngs)
    return loss_per_example(outputs, features, labels).mean()


TX = optax.adam(1e-2)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(1, 2))
def train_step(graphdef, params, opt_state, features, labels, key):
    grads = jax.grad(mean_loss, argnums=1)(graphdef, params, features, labels, deterministic=False, key=key)
    updates, opt_state = TX.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, grads


@functools.cache
def overfit(name: str):
    """Trains a fresh head on 8 random labels as loop.py would (dropout on, adam); returns, per
    parameter, whether any step's gradient was non-zero (a zero-initialised output layer passes no
    gradient down at the first step, only from the second), the labels and the final predictions.
    Cached: two tests read it."""
    graphdef, params = nnx.split(build(name))
    features = features_for(name, seed=3)
    labels = labels_for(name, jax.random.key(4))
    opt_state = TX.init(params)
    reached = jax.tree.map(lambda p: np.zeros(p.shape, bool), params)
    for step in range(120 if name in TAGGING_HEADS else 40):  # many more labels to fit per batch
        params, opt_state, grads = train_step(
            graphdef, params, opt_state, features, labels, jax.random.key(step)
        )
        reached = jax.tree.map(lambda r, g: r | (np.asarray(g) != 0), reached, grads)
    predictions = predictions_of(forward(graphdef, params, features), features)
    return reached, labels, predictions


@pytest.fixture(autouse=True, scope="module")
def cheap_compiles():
    # XLA compilation, not execution, is what takes time here; its cheap pipeline is much faster.
    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)
    # The flag is not part of JAX's in-memory cache keys: programs compiled under it (eager ops of a
    # model's init among them) would be reused by later tests in this process and round differently
    # from a fresh process, which a resumed run's frozen-parameter fingerprint rightly refuses.
    jax.clear_caches()


ALL_HEADS = sorted(HEADS)


def test_every_head_has_a_config_block():
    configs = default_head_configs()
    assert sorted(configs) == ALL_HEADS
    assert configs.bimpm.use_context_lstm and not configs.bimpm_no_context.use_context_lstm


SENTENCE_HEADS = [name for name in ALL_HEADS if name not in TAGGING_HEADS]


@pytest.mark.parametrize("name", SENTENCE_HEADS)
@pytest.mark.parametrize("num_outputs", [1, 2])
def test_sentence_head_output_shape(name, num_outputs):
    head = build(name, num_outputs)
    graphdef, params = nnx.split(head)
    features = pair_features(PAIR_LENGTHS)
    out = jax.eval_shape(forward, graphdef, params, features)
    assert out.shape == (len(PAIR_LENGTHS), num_outputs)


@pytest.mark.parametrize("name", TAGGING_HEADS)
def test_tagging_head_scores_every_word(name):
    graphdef, params = nnx.split(build(name))
    features = word_features()
    outputs = forward(graphdef, params, features)
    scores = outputs.logits if isinstance(outputs, WordLogits) else outputs.emissions
    assert scores.shape == (len(WORD_PIECES), max(map(len, WORD_PIECES)), len(TAGS))
    assert isinstance(outputs, CrfWordScores) == small_config(name).crf
    tags = np.asarray(predictions_of(outputs, features))
    real = np.arange(tags.shape[1])[None, :] < np.asarray(features.num_words)[:, None]
    assert np.all((tags >= 0) == real) and np.all(tags < len(TAGS))


def with_padded_tokens(features: Features, length: int, seed: int = 2) -> Features:
    """The same rows in a longer length bucket: garbage token states past the old length, same words."""
    batch, old = features.sequence.shape[:2]
    garbage = 10.0 * jax.random.normal(jax.random.key(seed), (batch, length - old, HIDDEN))
    zeros = jnp.zeros((batch, length - old), features.attention_mask.dtype)
    return features._replace(
        sequence=jnp.concatenate([features.sequence, garbage], axis=1),
        attention_mask=jnp.concatenate([features.attention_mask, zeros], axis=1),
        segment_ids=jnp.concatenate([features.segment_ids, zeros], axis=1),
    )


@pytest.mark.parametrize("name", TAGGING_HEADS)
def test_word_slots_past_the_length_bucket_change_nothing(name):
    """Batches carry all `max_seq_length - 2` word slots whatever their length bucket; a tagging head
    scores only the first `word_width` (at most the bucket). In training (dropout on), a short bucket's
    loss equals that of the same rows in a bucket wide enough for every slot: trimming changes no number,
    dropout masks included; the objective's predictions still cover every slot."""
    graphdef, params = nnx.split(build(name))
    params = perturbed(params)
    slots = 3 * LENGTH
    features = word_features()
    features = features._replace(
        word_starts=jnp.pad(features.word_starts, ((0, 0), (0, slots - features.word_starts.shape[1])))
    )
    untrimmed = with_padded_tokens(features, slots + 2)
    assert (features.word_width, untrimmed.word_width) == (LENGTH, slots)
    labels = jnp.pad(
        iob2_tags(jax.random.key(5)), ((0, 0), (0, slots - max(map(len, WORD_PIECES)))), constant_values=-1
    )
    model = nnx.merge(graphdef, params)

    def train_mode_loss(f: Features) -> jax.Array:
        outputs = model(f, deterministic=False, rngs=nnx.Rngs(dropout=jax.random.key(3)))
        return outputs, loss_per_example(outputs, f, labels)

    trimmed_outputs, trimmed_loss = train_mode_loss(features)
    untrimmed_outputs, untrimmed_loss = train_mode_loss(untrimmed)
    scores = trimmed_outputs.logits if isinstance(trimmed_outputs, WordLogits) else trimmed_outputs.emissions
    assert scores.shape[1] == LENGTH
    np.testing.assert_allclose(trimmed_loss, untrimmed_loss, rtol=1e-6, atol=1e-6)
    deterministic = loss_per_example(model(features, deterministic=True), features, labels)
    assert not np.allclose(deterministic, trimmed_loss, rtol=1e-3)  # dropout was on
    batch = {"num_words": features.num_words, "labels": labels}
    predicted = objectives.word_tagging_predictions(trimmed_outputs, batch)["predictions"]
    expected = objectives.word_tagging_predictions(untrimmed_outputs, batch)["predictions"]
    assert predicted.shape == (len(WORD_PIECES), slots)
    np.testing.assert_array_equal(predicted, expected)


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
    features = features_for(name)
    labels = labels_for(name, jax.random.key(5))
    padded_features = with_extra_padding(features, extra=5)
    outputs = forward(graphdef, params, features)
    padded = forward(graphdef, params, padded_features)
    loss = loss_per_example(outputs, features, labels)
    if name in TAGGING_HEADS:  # the padded words are extra columns: labels gain padding too
        labels = jnp.pad(labels, ((0, 0), (0, 5)), constant_values=-1)
    assert np.all(np.isfinite(loss))
    np.testing.assert_allclose(loss_per_example(padded, padded_features, labels), loss, atol=1e-5, rtol=1e-5)
    predictions = predictions_of(outputs, features)
    if name in TAGGING_HEADS:
        padded_predictions = predictions_of(padded, padded_features)
        np.testing.assert_array_equal(padded_predictions[:, : predictions.shape[1]], predictions)
    else:
        np.testing.assert_allclose(padded, outputs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ALL_HEADS)
def test_gradient_reaches_every_parameter(name):
    reached, _, _ = overfit(name)
    dead = [
        jax.tree_util.keystr(path)
        for path, r in jax.tree_util.tree_leaves_with_path(reached)
        if not np.any(r)
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
    features = features_for(name)
    outputs = forward(graphdef, params, features)
    loss = loss_per_example(outputs, features, labels_for(name, jax.random.key(5)))
    assert loss.shape == (features.sequence.shape[0],)
    assert np.all(np.isfinite(np.asarray(loss, np.float32)))
    assert np.all(np.isfinite(np.asarray(jax.tree.leaves(outputs)[0], np.float32)))


def test_sim_transformer_starts_from_zero_logits():
    # Its matching vectors carry a large example-independent offset (the head's docstring): a random
    # output layer would turn it into a random constant lean towards one class.
    features = features_for("sim_transformer")
    graphdef, params = nnx.split(build("sim_transformer"))
    np.testing.assert_array_equal(np.asarray(forward(graphdef, params, features)), 0.0)
    config = small_config("sim_transformer")
    config.output_init = "lecun_normal"
    head = HEADS["sim_transformer"][1](
        config, hidden_size=HIDDEN, num_outputs=2, dropout_rate=0.1, dtype=jnp.float32, rngs=nnx.Rngs(0)
    )
    assert np.abs(np.asarray(head(features, deterministic=True))).max() > 1e-3
    config.output_init = "kaiming"
    with pytest.raises(ValueError, match="head.sim_transformer.output_init"):
        HEADS["sim_transformer"][1](
            config, hidden_size=HIDDEN, num_outputs=2, dropout_rate=0.1, dtype=jnp.float32, rngs=nnx.Rngs(0)
        )


def test_split_pair_extracts_both_sentences():
    # Position p holds the value p, so the packed states name the positions they came from. Segment ids
    # (data/tokenization.py): 1 first text, 2 second, 0 special tokens and padding.
    #   row 0: [CLS] a1 a2 [SEP] b1 b2 b3 [SEP] pad pad
    #   row 1: [CLS] a1 a2 a3 a4 [SEP] b1 [SEP] pad pad
    #   row 2: [CLS] a1 [SEP] [SEP] pad ...           (empty second sentence)
    #   row 3: [CLS] [SEP] b1 b2 [SEP] pad ...        (empty first sentence)
    #   row 4: <s> a1 a2 </s> </s> b1 b2 b3 </s> pad  (RoBERTa's layout, token types all 0)
    segments = np.array(
        [
            [0, 1, 1, 0, 2, 2, 2, 0, 0, 0],
            [0, 1, 1, 1, 1, 0, 2, 0, 0, 0],
            [0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            [0, 0, 2, 2, 0, 0, 0, 0, 0, 0],
            [0, 1, 1, 0, 0, 2, 2, 2, 0, 0],
        ]
    )
    totals = [8, 8, 4, 5, 9]
    mask = (np.arange(10)[None, :] < np.array(totals)[:, None]).astype(np.int32)
    sequence = np.broadcast_to(np.arange(1, 11, dtype=np.float32)[None, :, None], (5, 10, 2))
    features = Features(jnp.asarray(sequence), jnp.zeros((5, 2)), jnp.asarray(mask), jnp.asarray(segments))
    p, q = split_pair(features)

    def positions(sentence):  # 1-based positions per row, zeros for padding
        return np.asarray(sentence.states[..., 0]).astype(int).tolist()

    assert positions(p) == [
        [2, 3, 0, 0, 0, 0, 0, 0, 0, 0],
        [2, 3, 4, 5, 0, 0, 0, 0, 0, 0],
        [2, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [0] * 10,
        [2, 3, 0, 0, 0, 0, 0, 0, 0, 0],
    ]
    assert positions(q) == [
        [5, 6, 7, 0, 0, 0, 0, 0, 0, 0],
        [7, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [0] * 10,
        [3, 4, 0, 0, 0, 0, 0, 0, 0, 0],
        [6, 7, 8, 0, 0, 0, 0, 0, 0, 0],
    ]
    assert np.asarray(p.lengths).tolist() == [2, 4, 1, 0, 2]
    assert np.asarray(q.lengths).tolist() == [3, 1, 0, 2, 3]
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


def test_linear_head_pools_cls_or_the_mean_of_real_tokens():
    features = features_for("linear")
    config = HEADS["linear"][0]()
    outputs = {}
    for pooling in ("cls", "mean"):
        config.pooling = pooling
        head = HEADS["linear"][1](
            config, hidden_size=HIDDEN, num_outputs=2, dropout_rate=0.0, dtype=jnp.float32, rngs=nnx.Rngs(0)
        )
        outputs[pooling] = head(features, deterministic=True)
        mask = features.attention_mask[..., None]
        pooled = (
            features.sequence[:, 0] if pooling == "cls" else (features.sequence * mask).sum(1) / mask.sum(1)
        )
        expected = pooled @ head.output.kernel.value + head.output.bias.value
        np.testing.assert_allclose(outputs[pooling], expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(outputs["cls"], outputs["mean"])
    config.pooling = "max"
    with pytest.raises(ValueError, match="pooling='max'"):
        HEADS["linear"][1](
            config, hidden_size=HIDDEN, num_outputs=2, dropout_rate=0.0, dtype=jnp.float32, rngs=nnx.Rngs(0)
        )


def test_which_heads_are_linear():
    config = default_head_configs()
    for name, linear in [
        ("linear", True),
        ("cls_mlp", False),
        ("crf", False),
        ("bilstm", False),
        ("token_mlp", False),
    ]:
        config.name = name
        assert is_linear(config) is linear, name
    config.name, config.token_mlp.hidden_dim = "token_mlp", 0
    assert is_linear(config)  # words -> dense(tags): a linear probe for word tagging

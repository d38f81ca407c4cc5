"""The CRF against brute-force enumeration of every tag sequence (small tag sets and lengths)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.special
from flax import nnx

from stackft_jax.models import crf, word_scores

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _random_potentials(rng: np.random.Generator, num_tags: int) -> crf.Potentials:
    return crf.Potentials(
        start=jnp.asarray(rng.normal(size=num_tags), jnp.float32),
        transitions=jnp.asarray(rng.normal(size=(num_tags, num_tags)), jnp.float32),
        end=jnp.asarray(rng.normal(size=num_tags), jnp.float32),
    )


def _path_score(emissions: np.ndarray, path: tuple[int, ...], p: crf.Potentials) -> float:
    start, trans, end = (np.asarray(x, np.float64) for x in (p.start, p.transitions, p.end))
    score = start[path[0]] + end[path[-1]] + sum(emissions[t, tag] for t, tag in enumerate(path))
    return score + sum(trans[a, b] for a, b in itertools.pairwise(path))


def _brute_force(emissions: np.ndarray, length: int, p: crf.Potentials, allowed=None):
    """(log Z, best path, best score, marginals [length, K], transition counts [K, K]) by enumeration."""
    num_tags = emissions.shape[-1]
    paths = [
        path for path in itertools.product(range(num_tags), repeat=length) if allowed is None or allowed(path)
    ]
    scores = np.array([_path_score(emissions, path, p) for path in paths])
    log_z = np.logaddexp.reduce(scores)
    probs = np.exp(scores - log_z)
    marginals = np.zeros((length, num_tags))
    counts = np.zeros((num_tags, num_tags))
    for path, prob in zip(paths, probs, strict=True):
        for t, tag in enumerate(path):
            marginals[t, tag] += prob
        for a, b in itertools.pairwise(path):
            counts[a, b] += prob
    best = int(np.argmax(scores))
    return log_z, paths[best], scores[best], marginals, counts


def _batch(rng: np.random.Generator, lengths: list[int], num_tags: int, max_len: int = 4):
    """Emissions with garbage (large values) and tags with -1 at padding positions."""
    emissions = rng.normal(size=(len(lengths), max_len, num_tags)).astype(np.float32)
    tags = rng.integers(0, num_tags, size=(len(lengths), max_len))
    for i, length in enumerate(lengths):
        emissions[i, length:] = 1e3 * rng.normal(size=(max_len - length, num_tags))
        tags[i, length:] = -1
    return jnp.asarray(emissions), jnp.asarray(tags, jnp.int32), jnp.asarray(lengths, jnp.int32)


@pytest.mark.parametrize("num_tags", [2, 3, 5])
def test_log_partition_viterbi_and_likelihood_match_brute_force(num_tags):
    rng = np.random.default_rng(num_tags)
    potentials = _random_potentials(rng, num_tags)
    lengths = [4, 1, 3, 2, 4]
    emissions, tags, lengths_array = _batch(rng, lengths, num_tags)
    log_z = crf.log_partition(emissions, lengths_array, potentials)
    best_tags, best_scores = crf.decode(emissions, lengths_array, potentials)
    scores = crf.sequence_score(emissions, tags, lengths_array, potentials)
    for i, length in enumerate(lengths):
        e = np.asarray(emissions[i, :length], np.float64)
        expected_z, expected_path, expected_best, _, _ = _brute_force(e, length, potentials)
        np.testing.assert_allclose(log_z[i], expected_z, rtol=1e-5)
        assert tuple(np.asarray(best_tags[i, :length])) == expected_path
        assert (np.asarray(best_tags[i, length:]) == crf.PAD_TAG).all()
        np.testing.assert_allclose(best_scores[i], expected_best, rtol=1e-5)
        gold = tuple(int(t) for t in tags[i, :length])
        np.testing.assert_allclose(scores[i], _path_score(e, gold, potentials), rtol=1e-5)


def test_padding_amount_does_not_matter():
    rng = np.random.default_rng(1)
    potentials = _random_potentials(rng, 4)
    emissions, tags, lengths = _batch(rng, [3, 2], 4, max_len=3)
    wide_emissions = jnp.concatenate([emissions, 50.0 * jnp.ones((2, 5, 4))], axis=1)
    wide_tags = jnp.concatenate([tags, jnp.full((2, 5), 3, jnp.int32)], axis=1)
    for fn in (crf.log_partition, lambda e, n, p: crf.decode(e, n, p)[1]):
        np.testing.assert_allclose(
            fn(emissions, lengths, potentials), fn(wide_emissions, lengths, potentials)
        )
    np.testing.assert_allclose(
        crf.sequence_score(emissions, tags, lengths, potentials),
        crf.sequence_score(wide_emissions, wide_tags, lengths, potentials),
    )
    np.testing.assert_array_equal(
        crf.decode(emissions, lengths, potentials)[0],
        crf.decode(wide_emissions, lengths, potentials)[0][:, :3],
    )


def test_gradient_of_log_partition_is_the_marginals():
    rng = np.random.default_rng(2)
    potentials = _random_potentials(rng, 3)
    emissions, _, lengths = _batch(rng, [4, 2], 3)

    def total(e, transitions):
        p = crf.Potentials(start=potentials.start, transitions=transitions, end=potentials.end)
        return crf.log_partition(e, lengths, p).sum()

    grad_e, grad_t = jax.grad(total, argnums=(0, 1))(emissions, potentials.transitions)
    expected_counts = np.zeros((3, 3))
    for i, length in enumerate([4, 2]):
        _, _, _, marginals, counts = _brute_force(
            np.asarray(emissions[i, :length], np.float64), length, potentials
        )
        np.testing.assert_allclose(grad_e[i, :length], marginals, atol=1e-5)
        np.testing.assert_allclose(grad_e[i, length:], 0.0)  # padding gets no gradient
        expected_counts += counts
    np.testing.assert_allclose(grad_t, expected_counts, atol=1e-5)


def test_jit_and_vmap_equal_a_per_example_loop():
    rng = np.random.default_rng(3)
    potentials = _random_potentials(rng, 5)
    emissions, tags, lengths = _batch(rng, [4, 0, 1, 3], 5)

    def per_example(fn, *arrays):
        return jnp.stack([fn(*(a[i : i + 1] for a in arrays))[0] for i in range(arrays[0].shape[0])])

    def nll(e, t, n):
        return crf.log_partition(e, n, potentials) - crf.sequence_score(e, t, n, potentials)

    looped = per_example(nll, emissions, tags, lengths)
    np.testing.assert_allclose(jax.jit(nll)(emissions, tags, lengths), looped, rtol=1e-6)
    vmapped = jax.vmap(lambda e, t, n: nll(e[None], t[None], n[None])[0])(emissions, tags, lengths)
    np.testing.assert_allclose(vmapped, looped, rtol=1e-6)
    looped_tags = per_example(lambda e, n: crf.decode(e, n, potentials)[0], emissions, lengths)
    np.testing.assert_array_equal(jax.jit(crf.decode)(emissions, lengths, potentials)[0], looped_tags)


def test_iob2_constraints():
    c = crf.iob2_constraints(TAGS)
    assert c.start == (True, True, False, True, False)
    allowed = {(TAGS[a], TAGS[b]) for a in range(5) for b in range(5) if c.transitions[a][b]}
    forbidden = {(a, b) for a in TAGS for b in TAGS} - allowed
    assert forbidden == {
        ("O", "I-PER"),
        ("O", "I-LOC"),
        ("B-LOC", "I-PER"),
        ("I-LOC", "I-PER"),
        ("B-PER", "I-LOC"),
        ("I-PER", "I-LOC"),
    }
    assert all(c.end)
    with pytest.raises(ValueError, match="tag 'PER' is not IOB2"):
        crf.iob2_constraints(["O", "PER"])


def _is_allowed(path: tuple[int, ...]) -> bool:
    c = crf.iob2_constraints(TAGS)
    return bool(path) and c.start[path[0]] and all(c.transitions[a][b] for a, b in itertools.pairwise(path))


def test_constrained_decoding_and_likelihood():
    model = crf.CRF(len(TAGS), constraints=crf.iob2_constraints(TAGS), rngs=nnx.Rngs(params=0))
    potentials = model.potentials()
    rng = np.random.default_rng(4)
    # Emissions that favour I- tags everywhere: unconstrained decoding would emit forbidden moves.
    emissions = jnp.asarray(rng.normal(size=(200, 4, len(TAGS))) + np.array([0, 0, 3, 0, 3]), jnp.float32)
    lengths = jnp.asarray(rng.integers(1, 5, size=200), jnp.int32)
    tags, _ = model.decode(emissions, lengths)
    for row, length in zip(np.asarray(tags), np.asarray(lengths), strict=True):
        assert _is_allowed(tuple(row[:length]))
    for i in range(3):
        length = int(lengths[i])
        e = np.asarray(emissions[i, :length], np.float64)
        log_z, best, _, _, _ = _brute_force(e, length, potentials, allowed=_is_allowed)
        # Forbidden paths carry FORBIDDEN (-1e4): exp of it vanishes next to every allowed path.
        np.testing.assert_allclose(
            crf.log_partition(emissions[i : i + 1], lengths[i : i + 1], potentials), [log_z], rtol=1e-5
        )
        assert tuple(np.asarray(tags[i, :length])) == best


def test_empty_sequences_are_finite():
    model = crf.CRF(3, rngs=nnx.Rngs(params=0))
    emissions = jnp.ones((2, 3, 3))
    tags = jnp.full((2, 3), -1, jnp.int32)
    lengths = jnp.asarray([0, 2], jnp.int32)
    likelihood = model.log_likelihood(emissions, tags.at[1, :2].set(1), lengths)
    assert likelihood[0] == 0.0 and np.isfinite(likelihood[1])
    graph, params = nnx.split(model)
    grads = jax.grad(
        lambda p, e: nnx.merge(graph, p).log_likelihood(e, tags.at[1, :2].set(1), lengths).sum(),
        argnums=(0, 1),
    )(params, emissions)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
    decoded, scores = model.decode(emissions, lengths)
    assert (np.asarray(decoded[0]) == crf.PAD_TAG).all() and scores[0] == 0.0


@pytest.mark.slow
def test_training_recovers_the_gold_tags():
    """Gradient descent on the NLL of one batch, CRF parameters and emissions both trained."""
    rng = np.random.default_rng(5)
    gold = jnp.asarray(rng.integers(0, 4, size=(6, 5)), jnp.int32)
    lengths = jnp.asarray([5, 4, 3, 5, 2, 1], jnp.int32)
    model = crf.CRF(4, rngs=nnx.Rngs(params=0))
    graph, crf_params = nnx.split(model)
    params = {"crf": crf_params, "emissions": jnp.zeros((6, 5, 4))}

    def loss(p):
        return -nnx.merge(graph, p["crf"]).log_likelihood(p["emissions"], gold, lengths).mean()

    tx = optax.adam(0.1)
    opt_state = tx.init(params)
    first = loss(params)
    for _ in range(100):
        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state)
        params = optax.apply_updates(params, updates)
    assert loss(params) < 0.05 * first
    decoded, _ = nnx.merge(graph, params["crf"]).decode(params["emissions"], lengths)
    valid = np.arange(5)[None] < np.asarray(lengths)[:, None]
    np.testing.assert_array_equal(np.where(valid, decoded, -1), np.where(valid, gold, -1))


def test_bfloat16_emissions_are_close_to_float32():
    rng = np.random.default_rng(6)
    model = crf.CRF(5, rngs=nnx.Rngs(params=0))
    emissions, tags, lengths = _batch(rng, [4, 3], 5)
    emissions = jnp.where(jnp.arange(4)[None, :, None] < lengths[:, None, None], emissions, 0.0)
    full = model.log_likelihood(emissions, tags, lengths)
    half = model.log_likelihood(emissions.astype(jnp.bfloat16), tags, lengths)
    assert half.dtype == jnp.float32
    np.testing.assert_allclose(half, full, atol=0.1)


def test_a_softmax_tagger_decodes_the_most_probable_allowed_sequence_under_iob2_decoding():
    """WordLogits with the IOB2 constraints alone (head option `iob2_decoding`): every decoded sequence
    is well-formed, and it is the allowed path with the highest sum of per-word log-probabilities."""
    potentials = crf.constraint_potentials(crf.iob2_constraints(TAGS))
    rng = np.random.default_rng(7)
    # Logits that favour I- tags: the plain argmax would open entities with I- in most rows.
    logits = jnp.asarray(rng.normal(size=(100, 4, len(TAGS))) + np.array([0, 0, 2, 0, 2]), jnp.float32)
    lengths = jnp.asarray(rng.integers(1, 5, size=100), jnp.int32)
    plain = np.asarray(word_scores.WordLogits(logits).decode(lengths))
    tags = np.asarray(word_scores.WordLogits(logits, potentials).decode(lengths))
    assert not all(_is_allowed(tuple(row[:n])) for row, n in zip(plain, np.asarray(lengths), strict=True))
    log_probabilities = scipy.special.log_softmax(np.asarray(logits, np.float64), axis=-1)
    for row, plain_row, n, scores in zip(tags, plain, np.asarray(lengths), log_probabilities, strict=True):
        assert _is_allowed(tuple(row[:n])) and np.all(row[n:] == crf.PAD_TAG)
        allowed = [p for p in itertools.product(range(len(TAGS)), repeat=n) if _is_allowed(p)]
        best = max(allowed, key=lambda p: sum(scores[t, tag] for t, tag in enumerate(p)))
        assert tuple(row[:n]) == best
        if _is_allowed(tuple(plain_row[:n])):  # a well-formed argmax is already the best allowed path
            assert np.array_equal(row[:n], plain_row[:n])
    # Training reads the logits alone: the same loss with or without the constraints.
    labels = jnp.asarray(rng.integers(0, len(TAGS), size=(100, 4)), jnp.int32)
    np.testing.assert_array_equal(
        word_scores.WordLogits(logits, potentials).negative_log_likelihood(labels, lengths),
        word_scores.WordLogits(logits).negative_log_likelihood(labels, lengths),
    )

"""The text-classification heads of the Yahoo Answers experiment: `densenet` and `highway_lstm`.

tests/test_heads.py runs its every-head checks (shape, padding, gradients, overfitting, bfloat16) on
these too; here: single-sentence layouts, batch independence, jit, their structure (dense connectivity,
the highway cell against numpy, the carry gate's gradient) and one command-line run each.
"""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stackft_jax.models.features import Features
from stackft_jax.models.heads import HEADS, densenet, highway_lstm
from stackft_jax.models.layers import masked_max, masked_mean
from tests.test_heads import HIDDEN, cheap_compiles, forward, perturbed, small_config, with_extra_padding

assert cheap_compiles  # an autouse fixture: imported, it applies to this module too

CLASSIFICATION_HEADS = ["densenet", "highway_lstm"]
# Odd and even lengths, a [CLS]-only sentence and a full row: every pooling-window alignment.
LENGTHS = [1, 2, 5, 8, 11, 16]
LENGTH = 16


def sentence_features(lengths=LENGTHS, length: int = LENGTH, seed: int = 0) -> Features:
    """Left-aligned sentences; padded positions hold large random garbage."""
    key_real, key_pad, key_pooled = jax.random.split(jax.random.key(seed), 3)
    real = jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]
    shape = (len(lengths), length, HIDDEN)
    sequence = jnp.where(
        real[..., None], jax.random.normal(key_real, shape), 10.0 * jax.random.normal(key_pad, shape)
    )
    mask = real.astype(jnp.int32)
    return Features(
        sequence=sequence,
        pooled=jax.random.normal(key_pooled, (len(lengths), HIDDEN)),
        attention_mask=mask,
        segment_ids=mask,
    )


def build(name: str, dtype=jnp.float32, **overrides) -> nnx.Module:
    config = small_config(name)
    config.update(overrides)
    return HEADS[name][1](
        config, hidden_size=HIDDEN, num_outputs=3, dropout_rate=0.1, dtype=dtype, rngs=nnx.Rngs(0)
    )


def trained_like(name: str, **overrides):
    """(graphdef, params) with every parameter perturbed, so that no zero-initialised weight hides
    a path (as in tests/test_heads.py)."""
    graphdef, params = nnx.split(build(name, **overrides))
    return graphdef, perturbed(params)


@pytest.mark.slow
@pytest.mark.parametrize("name", CLASSIFICATION_HEADS)
def test_padding_changes_nothing_for_single_sentences(name):
    graphdef, params = trained_like(name)
    features = sentence_features()
    logits = forward(graphdef, params, features)
    # Seven more padded positions: an odd total length, so the pooling windows meet a new edge.
    padded = forward(graphdef, params, with_extra_padding(features, extra=7))
    assert logits.shape == (len(LENGTHS), 3) and np.all(np.isfinite(logits))
    np.testing.assert_allclose(padded, logits, atol=1e-5, rtol=1e-5)
    # Other garbage at the same padded positions.
    real = features.attention_mask.astype(bool)[..., None]
    regarbled = features._replace(sequence=jnp.where(real, features.sequence, -3.0))
    np.testing.assert_allclose(forward(graphdef, params, regarbled), logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", CLASSIFICATION_HEADS)
def test_a_row_does_not_depend_on_the_other_rows(name):
    graphdef, params = trained_like(name)
    features = sentence_features()
    logits = forward(graphdef, params, features)
    reordered = jax.tree.map(lambda x: x[::-1], features)
    np.testing.assert_allclose(forward(graphdef, params, reordered)[::-1], logits, atol=1e-5, rtol=1e-5)
    for row in (0, 3):
        alone = jax.tree.map(lambda x, row=row: x[row : row + 1], features)
        np.testing.assert_allclose(forward(graphdef, params, alone)[0], logits[row], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", CLASSIFICATION_HEADS)
def test_jit_matches_eager(name):
    graphdef, params = trained_like(name)
    features = sentence_features()
    eager = nnx.merge(graphdef, params)(features, deterministic=True)
    np.testing.assert_allclose(forward(graphdef, params, features), eager, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", CLASSIFICATION_HEADS)
def test_bfloat16_follows_float32(name):
    graphdef, params = nnx.split(build(name))
    graphdef_bf16, params_bf16 = nnx.split(build(name, dtype=jnp.bfloat16))
    jax.tree.map(np.testing.assert_array_equal, params, params_bf16)  # parameters stay float32
    features = sentence_features()
    logits = forward(graphdef, params, features)
    logits_bf16 = np.asarray(forward(graphdef_bf16, params_bf16, features), np.float32)
    assert np.all(np.isfinite(logits_bf16))
    np.testing.assert_allclose(logits_bf16, logits, atol=0.1 * float(np.abs(logits).max()))


@pytest.mark.parametrize("name", CLASSIFICATION_HEADS)
def test_every_parameter_gets_a_finite_nonzero_gradient(name):
    graphdef, params = trained_like(name)
    features = sentence_features()
    labels = jnp.array([0, 1, 2, 0, 1, 2])

    def loss(params):
        logits = nnx.merge(graphdef, params)(features, deterministic=True)
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1).mean()

    grads = jax.jit(jax.grad(loss))(params)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert np.all(np.isfinite(g)) and np.any(np.asarray(g) != 0), jax.tree_util.keystr(path)


# --- densenet ---------------------------------------------------------------------------------------

DENSE = {"stem_channels": 6, "growth_rate": 4, "convs_per_block": 3, "num_blocks": 3, "compression": 0.5}


def conv_input_widths(head: densenet.DenseNetHead) -> tuple[list[list[int]], list[int]]:
    """Input channels of every block convolution and every transition, read off the kernels."""
    blocks = [[conv.conv.kernel.shape[1] for conv in block.convs] for block in head.blocks]
    return blocks, [t.conv.kernel.shape[1] for t in head.transitions]


def test_densenet_convolutions_see_all_earlier_outputs_of_their_block():
    head = build("densenet", **DENSE)
    assert head.stem.kernel.shape == (3, HIDDEN, 6)
    blocks, transitions = conv_input_widths(head)
    # Block input + (k - 1) * growth: 6 | 6+4 | 6+8 -> 18 channels, compressed to 9, and so on.
    assert blocks == [[6, 10, 14], [9, 13, 17], [10, 14, 18]]
    assert transitions == [18, 21]
    assert [t.conv.kernel.shape for t in head.transitions] == [(1, 18, 9), (1, 21, 10)]
    assert all(conv.conv.kernel.shape[::2] == (3, 4) for block in head.blocks for conv in block.convs)
    # The classifier reads [max; mean] of the last block's 22 channels and the [CLS] state.
    assert head.output.kernel.shape == (2 * 22 + HIDDEN, 3)


def test_densenet_last_conv_block_output_feeds_only_the_last_convolution_on():
    head = build("densenet", **DENSE, block_output="last")
    blocks, transitions = conv_input_widths(head)
    assert transitions == [4, 4]  # one convolution's growth_rate channels, not 18 and 21
    assert blocks == [[6, 10, 14], [2, 6, 10], [2, 6, 10]]
    assert head.output.kernel.shape == (2 * 4 + HIDDEN, 3)
    graphdef, params = nnx.split(head)
    assert np.all(np.isfinite(forward(graphdef, params, sentence_features())))


def test_pooling_by_two_reads_only_real_positions():
    #   values  1  5  2 | 7  100      (first 3 real)  ->  windows [1 5] [2 |7] [|100 pad]
    x = jnp.array([1.0, 5.0, 2.0, 7.0, 100.0])[None, :, None]
    mask = jnp.array([[True, True, True, False, False]])
    pooled, pooled_mask = densenet._pool_by_two(x, mask, masked_max)
    np.testing.assert_array_equal(pooled[0, :, 0], [5.0, 2.0, 0.0])
    np.testing.assert_array_equal(pooled_mask[0], [True, True, False])
    pooled, _ = densenet._pool_by_two(x, mask, masked_mean)
    np.testing.assert_array_equal(pooled[0, :, 0], [3.0, 2.0, 0.0])


@pytest.mark.parametrize(
    "override, message",
    [
        ({"block_output": "sum"}, "config.head.densenet.block_output='sum': choose from ['concat', 'last']"),
        ({"transition_pooling": "avg"}, "config.head.densenet.transition_pooling='avg'"),
        ({"growth_rate": 0}, "config.head.densenet.growth_rate=0 must be at least 1"),
        ({"compression": 0.0}, "config.head.densenet.compression=0.0 must be in (0, 1]"),
    ],
)
def test_densenet_bad_config_names_the_key(override, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        build("densenet", **override)


# --- highway_lstm -----------------------------------------------------------------------------------


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def numpy_highway_layer(x, lower, kernel, bias, recurrent, w_cell, w_lower):
    """The module docstring's equations, one step at a time, for one sequence [length, in]."""
    units = recurrent.shape[0]
    h, c = np.zeros(units), np.zeros(units)
    hs, cs = [], []
    for t in range(len(x)):
        z = x[t] @ kernel + bias
        i, f, g, o = np.split(z[: 4 * units] + h @ recurrent, 4)
        d = sigmoid(z[4 * units :] + w_cell * c + w_lower * lower[t])
        c = d * lower[t] + sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        hs.append(h)
        cs.append(c)
    return np.array(hs), np.array(cs)


def highway_layer(units: int = 2, in_features: int = 3, seed: int = 0):
    """A highway layer with small fixed weights (none zero), and those weights as numpy arrays."""
    layer = highway_lstm.HighwayLstmLayer(
        in_features, units, highway=True, dtype=jnp.float32, rngs=nnx.Rngs(0)
    )
    rng = np.random.default_rng(seed)
    weights = {
        "kernel": rng.uniform(-0.5, 0.5, (in_features, 5 * units)),
        "bias": rng.uniform(-0.5, 0.5, 5 * units),
        "recurrent": rng.uniform(-0.5, 0.5, (units, 4 * units)),
        "w_cell": rng.uniform(-0.5, 0.5, units),
        "w_lower": rng.uniform(-0.5, 0.5, units),
    }
    layer.input_projection.kernel[...] = jnp.asarray(weights["kernel"], jnp.float32)
    layer.input_projection.bias[...] = jnp.asarray(weights["bias"], jnp.float32)
    layer.recurrent_kernel[...] = jnp.asarray(weights["recurrent"], jnp.float32)
    layer.carry_cell_weight[...] = jnp.asarray(weights["w_cell"], jnp.float32)
    layer.carry_lower_weight[...] = jnp.asarray(weights["w_lower"], jnp.float32)
    return layer, weights


def test_highway_cell_matches_the_equations():
    layer, weights = highway_layer()
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 3))
    lower = rng.normal(size=(3, 2))
    hidden, cells = layer(jnp.asarray(x[None], jnp.float32), jnp.asarray(lower[None], jnp.float32))
    expected_hidden, expected_cells = numpy_highway_layer(x, lower, **weights)
    np.testing.assert_allclose(cells[0], expected_cells, atol=1e-6)
    np.testing.assert_allclose(hidden[0], expected_hidden, atol=1e-6)
    # The first step by hand: c_0 = 0, so c_1 = d * c_lower + i * g with d from input and lower cell.
    units = 2
    z = x[0] @ weights["kernel"] + weights["bias"]
    d = sigmoid(z[8:] + weights["w_lower"] * lower[0])
    c1 = d * lower[0] + sigmoid(z[:units]) * np.tanh(z[2 * units : 3 * units])
    np.testing.assert_allclose(cells[0, 0], c1, atol=1e-6)


@pytest.mark.parametrize("gate_bias, expected", [(-1e4, 0.0), (1e4, 1.0), (None, None)])
def test_carry_gate_controls_the_gradient_through_the_highway(gate_bias, expected):
    layer, _ = highway_layer()
    if gate_bias is not None:  # the carry gate's bias is the last `units` entries
        layer.input_projection.bias[...] = layer.input_projection.bias[...].at[4 * 2 :].set(gate_bias)
    graphdef, params = nnx.split(layer)
    x = jnp.asarray(np.random.default_rng(2).normal(size=(1, 1, 3)), jnp.float32)

    def cell_sum(lower):  # one step: c = d * c_lower + i * g
        return nnx.merge(graphdef, params)(x, lower)[1].sum()

    grad = jax.grad(cell_sum)(jnp.asarray([[[0.7, -0.4]]], jnp.float32))
    if expected is None:  # open part way: the gate's value, plus its own dependence on c_lower
        assert np.all(np.abs(np.asarray(grad)) > 1e-3)
    else:  # shut, nothing passes; wide open, c_lower passes unchanged
        np.testing.assert_array_equal(grad, np.full((1, 1, 2), expected, np.float32))


def test_highway_head_carries_gradient_from_the_lower_layer_cells():
    # In the head, layer 2's carry gate is the only way layer 1's cell reaches the logits other than
    # through h^1; shutting that gate changes layer 1's input-projection gradient.
    graphdef, params = trained_like("highway_lstm")
    features = sentence_features()

    def first_layer_grad(params):
        def loss(params):
            return nnx.merge(graphdef, params)(features, deterministic=True).sum()

        return jax.jit(jax.grad(loss))(params)["forward_layers"][0]["input_projection"]["kernel"][...]

    head = nnx.merge(graphdef, jax.tree.map(jnp.copy, params))  # merge would share params' arrays
    bias = head.forward_layers[1].input_projection.bias
    bias[...] = bias[...].at[4 * 8 :].set(-1e4)  # lstm_units=8: the carry gate's bias
    _, shut = nnx.split(head)
    assert not np.allclose(first_layer_grad(params), first_layer_grad(shut), atol=1e-6)


def test_reverse_within_lengths_keeps_padding_in_place():
    x = jnp.arange(10.0).reshape(2, 5)[..., None]
    reversed_ = highway_lstm.reverse_within_lengths(x, jnp.array([3, 5]))
    np.testing.assert_array_equal(reversed_[..., 0], [[2, 1, 0, 3, 4], [9, 8, 7, 6, 5]])
    np.testing.assert_array_equal(highway_lstm.reverse_within_lengths(reversed_, jnp.array([3, 5])), x)


def test_highway_layer_and_config_errors():
    layer, _ = highway_layer()
    with pytest.raises(ValueError, match="needs the lower layer's cells"):
        layer(jnp.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match=r"config.head.highway_lstm.num_lstm_layers=0 must be at least 1"):
        build("highway_lstm", num_lstm_layers=0)


# --- end to end ---------------------------------------------------------------------------------------

TINY_HEADS = {
    # Two blocks of two convolutions: the compile of the full 4 x 4 stack dominated this test.
    "densenet": [
        "--config.head.densenet.stem_channels=8",
        "--config.head.densenet.growth_rate=4",
        "--config.head.densenet.num_blocks=2",
        "--config.head.densenet.convs_per_block=2",
    ],
    "highway_lstm": ["--config.head.highway_lstm.lstm_units=8"],
}


@pytest.mark.parametrize(
    "name, extra",
    [
        ("densenet", []),
        ("highway_lstm", []),
        ("highway_lstm", ["--config.model.scalar_mix=True", "--config.strategy=stack_only"]),
    ],
)
@pytest.mark.slow
def test_command_line_run(name, extra, tmp_path, run_cli):
    proc = run_cli(tmp_path, f"--config.head.name={name}", *TINY_HEADS[name], *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["config"]["head"]["name"] == name
    expected_phases = ["stack"] if extra else ["phase1", "phase2"]
    assert [p["phase"] for p in results["phases"]] == expected_phases
    assert all(math.isfinite(v) for v in results["final"]["dev"].values())

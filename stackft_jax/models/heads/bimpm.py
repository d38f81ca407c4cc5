"""BiMPM (Wang, Hamza & Florian 2017) on the token states of one joint BERT encoding of the pair.

P and Q are cut out of `[CLS] a [SEP] b [SEP]` by `pair_ops.split_pair` (special tokens left
out). Layers: context BiLSTM (optional) -> bilateral multi-perspective matching -> aggregation
BiLSTM -> two-layer feed-forward classifier. `BiMpmMatching` (context + matching) is reused by
sim_transformer.

Registered twice: `bimpm`, and `bimpm_no_context`, the same head with `use_context_lstm=False`,
which matches the BERT states directly.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from stackft_jax.models.dense import Dense
from stackft_jax.models.dropout import Dropout
from stackft_jax.models.features import Features
from stackft_jax.models.heads.pair_ops import Sentence, split_pair, stack_pair, unstack_pair
from stackft_jax.models.layers import MaskedBiLstm, last_valid, masked_max

_EPS = 1e-8
# Matching strategies, in the order of the rows of each direction's weight and of the output blocks.
STRATEGIES = ("full", "max_pooling", "attentive", "max_attentive")


def default_config() -> ml_collections.ConfigDict:
    # Sizes from the paper (Section 4.1); the hidden layer is half the matching vector, as in the
    # authors' code.
    return ml_collections.ConfigDict(
        {
            "use_context_lstm": True,  # a BiLSTM over the BERT states before matching
            "context_lstm_units": 100,  # units per direction of that context BiLSTM
            "num_perspectives": 20,  # perspectives l of each matching strategy
            "aggregation_lstm_units": 100,  # units per direction of the aggregation BiLSTM
            "mlp_hidden_dim": 200,  # width of the tanh layer before the output
        }
    )


def no_context_default_config() -> ml_collections.ConfigDict:
    config = default_config()
    config.use_context_lstm = False
    return config


def _cosine(a: jax.Array, b: jax.Array) -> jax.Array:
    """Cosine along the last axis; 0 for a zero vector (eps inside the sqrt keeps grads finite)."""
    norm_a = jnp.sqrt(jnp.sum(a * a, axis=-1) + _EPS)
    norm_b = jnp.sqrt(jnp.sum(b * b, axis=-1) + _EPS)
    return jnp.sum(a * b, axis=-1) / (norm_a * norm_b)


def _multi_perspective(v1: jax.Array, v2: jax.Array, weights: jax.Array) -> jax.Array:
    """The paper's f_m: cos(W_k * v1, W_k * v2) for each perspective k (row of weights [l, d])."""
    return _cosine(v1[..., None, :] * weights, v2[..., None, :] * weights)


def _pairwise_multi_perspective(p: jax.Array, q: jax.Array, weights: jax.Array) -> jax.Array:
    """f_m between every p_i and q_j: [b, lp, d], [b, lq, d], [l, d] -> [b, lp, lq, l]."""
    pw = p[:, :, None, :] * weights
    qw = q[:, :, None, :] * weights
    dot = jnp.einsum("bikd,bjkd->bijk", pw, qw)
    norm_p = jnp.sqrt(jnp.sum(pw * pw, axis=-1) + _EPS)
    norm_q = jnp.sqrt(jnp.sum(qw * qw, axis=-1) + _EPS)
    return dot / (norm_p[:, :, None, :] * norm_q[:, None, :, :])


def _pairwise_cosine(p: jax.Array, q: jax.Array) -> jax.Array:
    """Plain cosine between every p_i and q_j: [b, lp, d], [b, lq, d] -> [b, lp, lq]."""
    norm_p = jnp.sqrt(jnp.sum(p * p, axis=-1) + _EPS)
    norm_q = jnp.sqrt(jnp.sum(q * q, axis=-1) + _EPS)
    return jnp.einsum("bid,bjd->bij", p, q) / (norm_p[:, :, None] * norm_q[:, None, :])


def _signed_clamp(x: jax.Array) -> jax.Array:
    """x pushed away from 0 keeping its sign: a safe denominator for a cosine-weighted mean."""
    return jnp.where(x >= 0, jnp.maximum(x, _EPS), jnp.minimum(x, -_EPS))


def match_one_direction(
    p: jax.Array,
    q: jax.Array,
    p_anchor: jax.Array,
    q_anchor: jax.Array,
    p_mask: jax.Array,
    q_mask: jax.Array,
    weights: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The four matching strategies for one LSTM direction, P against Q and Q against P.

    p, q:       [batch, length, d] states of one direction, zero at padding.
    p_anchor:   [batch, d] P's state that has read all of P (forward: last token; backward: first),
                used by Q's full matching; q_anchor likewise.
    weights:    [4, l, d], one row per strategy in STRATEGIES, shared by both matching directions.
    Returns [batch, length, 4 * l] for P and for Q.
    """
    w_full, w_pool, w_attentive, w_max_attentive = weights

    full_p = _multi_perspective(p, q_anchor[:, None, :], w_full)
    full_q = _multi_perspective(q, p_anchor[:, None, :], w_full)

    pairwise = _pairwise_multi_perspective(p, q, w_pool)
    pool_p = masked_max(pairwise, q_mask[:, None, :, None], axis=2)
    pool_q = masked_max(pairwise, p_mask[:, :, None, None], axis=1)

    pair_mask = p_mask[:, :, None] & q_mask[:, None, :]
    alpha = jnp.where(pair_mask, _pairwise_cosine(p, q), 0)
    # The paper's attentive vector sum_j a_ij q_j / sum_j a_ij. f_m is scale invariant in its second
    # argument, so the denominator only contributes its sign; it is kept away from 0 for stability.
    mean_q = jnp.einsum("bij,bjd->bid", alpha, q) / _signed_clamp(alpha.sum(axis=2))[..., None]
    mean_p = jnp.einsum("bij,bid->bjd", alpha, p) / _signed_clamp(alpha.sum(axis=1))[..., None]
    attentive_p = _multi_perspective(p, mean_q, w_attentive)
    attentive_q = _multi_perspective(q, mean_p, w_attentive)

    # Max-attentive: the other sentence's state with the highest cosine (a zero row if it is empty).
    most_similar_j = jnp.argmax(jnp.where(pair_mask, alpha, -jnp.inf), axis=2)
    most_similar_i = jnp.argmax(jnp.where(pair_mask, alpha, -jnp.inf), axis=1)
    best_q = jnp.take_along_axis(q, most_similar_j[..., None], axis=1)
    best_p = jnp.take_along_axis(p, most_similar_i[..., None], axis=1)
    max_attentive_p = _multi_perspective(p, best_q, w_max_attentive)
    max_attentive_q = _multi_perspective(q, best_p, w_max_attentive)

    match_p = jnp.concatenate([full_p, pool_p, attentive_p, max_attentive_p], axis=-1)
    match_q = jnp.concatenate([full_q, pool_q, attentive_q, max_attentive_q], axis=-1)
    return match_p * p_mask[..., None], match_q * q_mask[..., None]


class BiMpmMatching(nnx.Module):
    """Context representation + matching layer: P and Q -> one 8l-dim matching vector per token.

    With `use_context_lstm` the forward and backward halves of a shared BiLSTM are matched
    separately, as in the paper. Without it the BERT states play both roles: "forward" full matching
    compares against the other sentence's last token and "backward" against its first, each with
    its own weights, so the output width (8l) is the same.
    """

    @classmethod
    def from_config(
        cls,
        config: ml_collections.ConfigDict,
        *,
        hidden_size: int,
        dropout_rate: float,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ) -> "BiMpmMatching":
        """The matching layer as configured by a `bimpm`-style head config block."""
        return cls(
            hidden_size=hidden_size,
            use_context_lstm=config.use_context_lstm,
            context_lstm_units=config.context_lstm_units,
            num_perspectives=config.num_perspectives,
            dropout_rate=dropout_rate,
            dtype=dtype,
            rngs=rngs,
        )

    def __init__(
        self,
        *,
        hidden_size: int,
        use_context_lstm: bool,
        context_lstm_units: int,
        num_perspectives: int,
        dropout_rate: float,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        self.dropout = Dropout(dropout_rate)
        if use_context_lstm:
            self.context = MaskedBiLstm(hidden_size, context_lstm_units, dtype=dtype, rngs=rngs)
            dim = context_lstm_units
        else:
            self.context = None
            dim = hidden_size
        init = nnx.initializers.xavier_uniform(batch_axis=(0,))
        shape = (len(STRATEGIES), num_perspectives, dim)
        self.forward_weights = nnx.Param(init(rngs.params(), shape, jnp.float32))
        self.backward_weights = nnx.Param(init(rngs.params(), shape, jnp.float32))
        self.output_dim = 2 * len(STRATEGIES) * num_perspectives

    def __call__(
        self, p: Sentence, q: Sentence, *, deterministic: bool, rngs: nnx.Rngs | None = None
    ) -> tuple[jax.Array, jax.Array]:
        def drop(x: jax.Array) -> jax.Array:
            return self.dropout(x, deterministic=deterministic, rngs=rngs)

        p_states, q_states = drop(p.states), drop(q.states)
        if self.context is not None:
            lengths = stack_pair(p.lengths, q.lengths)
            context, _ = self.context(stack_pair(p_states, q_states), lengths)
            p_states, q_states = unstack_pair(drop(context))
            units = self.context.units
            p_fw, p_bw = p_states[..., :units], p_states[..., units:]
            q_fw, q_bw = q_states[..., :units], q_states[..., units:]
        else:
            p_fw = p_bw = p_states
            q_fw = q_bw = q_states

        dtype = p_states.dtype
        fw_p, fw_q = match_one_direction(
            p_fw,
            q_fw,
            last_valid(p_fw, p.lengths),
            last_valid(q_fw, q.lengths),
            p.mask,
            q.mask,
            self.forward_weights[...].astype(dtype),
        )
        bw_p, bw_q = match_one_direction(
            p_bw,
            q_bw,
            p_bw[:, 0],
            q_bw[:, 0],
            p.mask,
            q.mask,
            self.backward_weights[...].astype(dtype),
        )
        return jnp.concatenate([fw_p, bw_p], axis=-1), jnp.concatenate([fw_q, bw_q], axis=-1)


class BiMpmHead(nnx.Module):
    """Matching -> shared aggregation BiLSTM over each sentence's matching vectors -> the four
    final states (forward at the last token, backward at the first, of P and of Q) -> dense(tanh)
    -> dense."""

    reads = "sentence_pair"  # what it reads (heads.head_input): the two texts of a pair

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        *,
        hidden_size: int,
        num_outputs: int,
        output_names: Sequence[str] = (),  # class names; unused by this head
        dropout_rate: float,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        self.dtype = dtype
        self.matching = BiMpmMatching.from_config(
            config, hidden_size=hidden_size, dropout_rate=dropout_rate, dtype=dtype, rngs=rngs
        )
        self.aggregation = MaskedBiLstm(
            self.matching.output_dim, config.aggregation_lstm_units, dtype=dtype, rngs=rngs
        )
        self.dropout = Dropout(dropout_rate)
        self.hidden = Dense(4 * config.aggregation_lstm_units, config.mlp_hidden_dim, dtype=dtype, rngs=rngs)
        self.output = Dense(config.mlp_hidden_dim, num_outputs, dtype=dtype, rngs=rngs)

    def __call__(self, features: Features, *, deterministic: bool, rngs: nnx.Rngs | None = None) -> jax.Array:
        p, q = split_pair(features, self.dtype)
        match_p, match_q = self.matching(p, q, deterministic=deterministic, rngs=rngs)
        match = self.dropout(stack_pair(match_p, match_q), deterministic=deterministic, rngs=rngs)
        _, final = self.aggregation(match, stack_pair(p.lengths, q.lengths))
        x = jnp.concatenate(unstack_pair(final), axis=-1)
        x = self.dropout(x, deterministic=deterministic, rngs=rngs)
        x = jnp.tanh(self.hidden(x))
        x = self.dropout(x, deterministic=deterministic, rngs=rngs)
        return self.output(x)

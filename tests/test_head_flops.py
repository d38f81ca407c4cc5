"""models/flops.py's head counts against XLA's own count of each registered head's forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stackft_jax.models import flops
from stackft_jax.models.features import SEGMENT_A, SEGMENT_B, Features
from stackft_jax.models.heads import HEADS, WORDS, head_input

BATCH, LENGTH, HIDDEN = 2, 16, 128
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]


def _features(name: str) -> Features:
    """Full rows at one length bucket (what the analytic count assumes: static shapes, no trimming)."""
    rng = np.random.default_rng(0)
    sequence = jnp.asarray(rng.normal(size=(BATCH, LENGTH, HIDDEN)), jnp.float32)
    mask = jnp.ones((BATCH, LENGTH), jnp.int32)
    if head_input(name) == WORDS:
        slots = flops.word_slots(LENGTH)
        starts = jnp.tile(jnp.arange(1, slots + 1, dtype=jnp.int32), (BATCH, 1))
        return Features(sequence, sequence[:, 0], mask, mask, starts, jnp.full((BATCH,), slots, jnp.int32))
    segments = np.zeros((BATCH, LENGTH), np.int32)
    segments[:, 1:8], segments[:, 9:-1] = SEGMENT_A, SEGMENT_B
    return Features(sequence, sequence[:, 0], mask, jnp.asarray(segments))


def _xla_forward_flops(name: str, outputs: int, monkeypatch) -> float:
    """XLA's FLOPs of the head's forward (a tagger's: to its training loss, a CRF's forward algorithm
    included) per example. Scans are unrolled: XLA's cost analysis counts a loop body once."""
    scan = jax.lax.scan
    monkeypatch.setattr(jax.lax, "scan", lambda *args, **kwargs: scan(*args, **{**kwargs, "unroll": True}))
    default, cls = HEADS[name]
    head = cls(
        default(),
        hidden_size=HIDDEN,
        num_outputs=outputs,
        output_names=TAGS[:outputs],
        dropout_rate=0.0,
        dtype=jnp.float32,
        rngs=nnx.Rngs(0),
    )
    for _, module in nnx.iter_graph(head):
        if isinstance(module, nnx.RNN):
            module.unroll = True
    graphdef, params = nnx.split(head)
    features = _features(name)

    def forward(params, sequence):
        out = nnx.merge(graphdef, params)(features._replace(sequence=sequence), deterministic=True)
        if head_input(name) == WORDS:
            labels = jnp.zeros(features.word_starts.shape, jnp.int32)
            return out.negative_log_likelihood(labels, features.num_words).sum()
        return out.sum()

    cost = jax.jit(forward).lower(params, features.sequence).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return cost["flops"] / BATCH


@pytest.mark.parametrize("name", sorted(HEADS))
def test_every_head_is_counted_within_ten_percent_of_xla(name, monkeypatch):
    outputs = len(TAGS) if head_input(name) == WORDS else 3
    head = {"name": name, name: HEADS[name][0]().to_dict()}
    analytic = flops.head_flops(head, hidden=HIDDEN, outputs=outputs, seq_len=LENGTH)
    assert analytic is not None, f"models/flops.py HEAD_FLOPS has no count for the head {name!r}"
    assert analytic == pytest.approx(_xla_forward_flops(name, outputs, monkeypatch), rel=0.1)


def test_a_head_count_follows_its_config():
    """Twice the transformer layers cost the added layers' matmuls and attention, no more."""
    block = HEADS["sim_transformer"][0]().to_dict()

    def count(block):
        return flops.head_flops(
            {"name": "sim_transformer", "sim_transformer": block}, hidden=64, outputs=2, seq_len=8
        )

    base = count(block)
    more = count({**block, "num_layers": 2 * block["num_layers"]})
    dim, tokens = block["model_dim"], 2 * 8
    per_layer = tokens * (2 * 4 * dim * dim + 2 * 2 * dim * block["ff_dim"] + 2 * 2 * 8 * dim)
    assert more - base == block["num_layers"] * per_layer

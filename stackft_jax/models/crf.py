"""A linear-chain conditional random field for tagging heads (BiLSTM-CRF, CRF on BERT word states).

No well-kept JAX CRF library exists, so this one is written out and tested against brute-force
enumeration (tests/test_crf.py). Conventions:

- emissions `[batch, time, num_tags]` (any float dtype; computed in float32), tags `[batch, time]`,
  lengths `[batch]`: each sequence is a packed, left-aligned prefix of `length` real positions (a word
  sequence gathered from first sub-tokens). Positions at or past the length are padding: any emission or
  tag value there (-1 included) changes nothing.
- A length-0 sequence has log-likelihood 0 (log Z = 0, score 0) and decodes to all padding.
- Scores: `start[y_0] + sum_t emissions[t, y_t] + sum_t transitions[y_{t-1}, y_t] + end[y_{n-1}]`.
- Constraints (`iob2_constraints`) are fixed at construction, not trained: a forbidden start, end or
  transition scores `FORBIDDEN`, a large negative number rather than -inf so gradients stay finite;
  they apply in training (log Z sums over allowed paths only) and in decoding.
"""

import dataclasses
import re
from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

FORBIDDEN = -1e4
PAD_TAG = -1  # what `decode` returns at padding positions
_TAG = re.compile(r"(?P<prefix>[BI])-(?P<type>.+)")


@dataclasses.dataclass(frozen=True)
class Constraints:
    """Which starts, transitions (from -> to) and ends are allowed; hashable so it can live in a module's
    static structure."""

    start: tuple[bool, ...]
    transitions: tuple[tuple[bool, ...], ...]
    end: tuple[bool, ...]


def iob2_constraints(tag_names: Sequence[str]) -> Constraints:
    """IOB2: `I-X` may only follow `B-X` or `I-X`, so no sequence starts with `I-X` and `O -> I-X`,
    `B-X -> I-Y`, `I-X -> I-Y` (X != Y) are forbidden. Any tag may end a sequence."""
    parsed = []
    for name in tag_names:
        match = _TAG.fullmatch(name)
        if name != "O" and match is None:
            raise ValueError(f"tag {name!r} is not IOB2: expected 'O', 'B-TYPE' or 'I-TYPE'")
        parsed.append(None if match is None else (match["prefix"], match["type"]))

    def allowed(previous, current) -> bool:
        if current is None or current[0] == "B":
            return True
        return previous is not None and previous[1] == current[1]

    return Constraints(
        start=tuple(tag is None or tag[0] == "B" for tag in parsed),
        transitions=tuple(tuple(allowed(p, c) for c in parsed) for p in parsed),
        end=(True,) * len(parsed),
    )


@flax.struct.dataclass
class Potentials:
    """The CRF's scores in float32, with forbidden moves already set to FORBIDDEN (a pytree: jit takes it)."""

    start: jax.Array  # [K]
    transitions: jax.Array  # [K, K], from -> to
    end: jax.Array  # [K]


def constrained(
    constraints: Constraints, start: jax.Array, transitions: jax.Array, end: jax.Array
) -> Potentials:
    """Potentials with every move `constraints` forbids set to FORBIDDEN."""
    return Potentials(
        start=jnp.where(np.asarray(constraints.start), start, FORBIDDEN),
        transitions=jnp.where(np.asarray(constraints.transitions), transitions, FORBIDDEN),
        end=jnp.where(np.asarray(constraints.end), end, FORBIDDEN),
    )


def constraint_potentials(constraints: Constraints) -> Potentials:
    """The constraints alone, as potentials: 0 for an allowed move, FORBIDDEN otherwise. Viterbi over
    per-word log-probabilities with these finds the most probable sequence the constraints allow
    (a softmax tagger's constrained decoding: word_scores.WordLogits)."""
    k = len(constraints.start)
    return constrained(constraints, jnp.zeros(k), jnp.zeros((k, k)), jnp.zeros(k))


def _positions(emissions: jax.Array, lengths: jax.Array) -> jax.Array:
    return jnp.arange(emissions.shape[1])[None, :] < lengths[:, None]  # [B, T]


def log_partition(emissions: jax.Array, lengths: jax.Array, potentials: Potentials) -> jax.Array:
    """log Z per sequence [B]: the forward algorithm in log space."""
    emissions = emissions.astype(jnp.float32)
    valid = _positions(emissions, lengths)
    alpha = potentials.start[None, :] + emissions[:, 0]

    def forward(alpha, inputs):
        emission, real = inputs
        stepped = jax.nn.logsumexp(alpha[:, :, None] + potentials.transitions[None], axis=1) + emission
        return jnp.where(real[:, None], stepped, alpha), None

    alpha, _ = jax.lax.scan(forward, alpha, (emissions[:, 1:].swapaxes(0, 1), valid[:, 1:].swapaxes(0, 1)))
    return jnp.where(lengths > 0, jax.nn.logsumexp(alpha + potentials.end[None, :], axis=-1), 0.0)


def sequence_score(
    emissions: jax.Array, tags: jax.Array, lengths: jax.Array, potentials: Potentials
) -> jax.Array:
    """The unnormalised log score of `tags` per sequence [B]."""
    emissions = emissions.astype(jnp.float32)
    valid = _positions(emissions, lengths)
    tags = jnp.where(valid, tags, 0)  # padding may hold -1 or anything: never index with it
    emitted = jnp.take_along_axis(emissions, tags[..., None], axis=-1)[..., 0]
    moved = potentials.transitions[tags[:, :-1], tags[:, 1:]]
    last = jnp.take_along_axis(tags, jnp.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]
    score = (
        potentials.start[tags[:, 0]]
        + jnp.sum(emitted * valid, axis=1)
        + jnp.sum(moved * valid[:, 1:], axis=1)
        + potentials.end[last]
    )
    return jnp.where(lengths > 0, score, 0.0)


def decode(emissions: jax.Array, lengths: jax.Array, potentials: Potentials) -> tuple[jax.Array, jax.Array]:
    """Viterbi: the best tags [B, T] (PAD_TAG at padding) and their scores [B]."""
    emissions = emissions.astype(jnp.float32)
    valid = _positions(emissions, lengths)
    num_tags = emissions.shape[-1]
    delta = potentials.start[None, :] + emissions[:, 0]

    def forward(delta, inputs):
        emission, real = inputs
        candidates = delta[:, :, None] + potentials.transitions[None]  # [B, from, to]
        pointers = jnp.argmax(candidates, axis=1)
        stepped = jnp.max(candidates, axis=1) + emission
        # Past the end a tag points to itself, so backtracking walks through padding unchanged.
        keep = jnp.broadcast_to(jnp.arange(num_tags), pointers.shape)
        return jnp.where(real[:, None], stepped, delta), jnp.where(real[:, None], pointers, keep)

    delta, pointers = jax.lax.scan(
        forward, delta, (emissions[:, 1:].swapaxes(0, 1), valid[:, 1:].swapaxes(0, 1))
    )  # pointers: [T-1, B, K]
    final = delta + potentials.end[None, :]
    last_tag = jnp.argmax(final, axis=-1)

    def backward(tag, step_pointers):
        previous = jnp.take_along_axis(step_pointers, tag[:, None], axis=1)[:, 0]
        return previous, tag

    first_tag, later_tags = jax.lax.scan(backward, last_tag, pointers, reverse=True)
    tags = jnp.concatenate([first_tag[:, None], later_tags.swapaxes(0, 1)], axis=1)
    tags = jnp.where(valid, tags, PAD_TAG)
    return tags, jnp.where(lengths > 0, jnp.max(final, axis=-1), 0.0)


class CRF(nnx.Module):
    """Start, end and transition scores (uniform(-0.1, 0.1), as pytorch-crf: small, so the emissions
    decide at first), with optional fixed constraints."""

    def __init__(self, num_tags: int, *, constraints: Constraints | None = None, rngs: nnx.Rngs):
        if constraints is not None and len(constraints.start) != num_tags:
            raise ValueError(f"constraints for {len(constraints.start)} tags given to a CRF of {num_tags}")

        def uniform(*shape):
            return nnx.Param(jax.random.uniform(rngs.params(), shape, jnp.float32, -0.1, 0.1))

        self.num_tags = num_tags
        self.constraints = constraints
        self.start = uniform(num_tags)
        self.end = uniform(num_tags)
        self.transitions = uniform(num_tags, num_tags)

    def potentials(self) -> Potentials:
        start, transitions, end = self.start[...], self.transitions[...], self.end[...]
        if self.constraints is None:
            return Potentials(start=start, transitions=transitions, end=end)
        return constrained(self.constraints, start, transitions, end)

    def log_likelihood(self, emissions: jax.Array, tags: jax.Array, lengths: jax.Array) -> jax.Array:
        """log p(tags | emissions) per sequence [B]."""
        potentials = self.potentials()
        return sequence_score(emissions, tags, lengths, potentials) - log_partition(
            emissions, lengths, potentials
        )

    def decode(self, emissions: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
        return decode(emissions, lengths, self.potentials())

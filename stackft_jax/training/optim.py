"""The only place that builds optax transforms and parameter labels.

Freezing is data: a phase lists `(regex, group)` rules over '/'-joined parameter paths
(`backbone/layers/3/attention/query/kernel`, `head/net/hidden/bias`, ...). The first matching rule labels a
leaf; every leaf must match one rule. Groups with a learning rate get AdamW; the `FROZEN` group gets
`optax.set_to_zero()`, which holds no optimizer state, and the train step stops gradients into it.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import optax

from stackft_jax.config import phases
from stackft_jax.config.phases import FROZEN

# BERT-Adam: weight decay only on matrices (dense kernels, embeddings); never on biases or LayerNorm.
DECAYED_LEAF_NAMES = ("kernel", "embedding")

Params = Any  # a nested dict of arrays


def path_str(path: tuple) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def label_params(params: Params, rules: Sequence[tuple[str, str]]) -> Params:
    """A tree of group names, one per leaf: the group of the first rule whose regex fully matches."""
    unmatched = []

    def label(path, _):
        group = phases.group_of(rules, path_str(path))
        if group is None:
            unmatched.append(path_str(path))
        return group

    labels = jax.tree_util.tree_map_with_path(label, params)
    if unmatched:
        raise ValueError(
            f"{len(unmatched)} parameters match no rule {[p for p, _ in rules]}, e.g. {unmatched[:3]}"
        )
    return labels


def weight_decay_mask(params: Params) -> Params:
    return jax.tree_util.tree_map_with_path(
        lambda path, _: path_str(path).rsplit("/", 1)[-1] in DECAYED_LEAF_NAMES, params
    )


def trainable_mask(labels: Params) -> Params:
    return jax.tree.map(lambda group: group != FROZEN, labels)


def phase_optimizer(
    params: Params, phase: phases.Phase, *, max_grad_norm: float
) -> tuple[optax.GradientTransformation, Params]:
    """`build_optimizer` for one phase of a run's plan (its rules, rates, budget, schedule and decay)."""
    return build_optimizer(
        params,
        rules=phase.rules,
        learning_rates=phase.learning_rates,
        num_steps=phase.num_steps,
        warmup_steps=phase.warmup_steps,
        schedule=phase.schedule,
        weight_decay=phase.weight_decay,
        max_grad_norm=max_grad_norm,
    )


def learning_rate_schedule(peak: float, *, num_steps: int, warmup_steps: int, shape: str) -> optax.Schedule:
    """`constant`, `warmup_linear` (BERT: linear warm-up, then linear decay to 0) or `slanted_triangular`
    (Howard & Ruder 2018: the same shape, but decaying to peak/32 instead of 0)."""
    warmup_steps = min(warmup_steps, num_steps)
    if shape == "constant":
        if not warmup_steps:
            return optax.constant_schedule(peak)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, peak, warmup_steps), optax.constant_schedule(peak)],
            [warmup_steps],
        )
    if shape in ("warmup_linear", "slanted_triangular"):
        end = 0.0 if shape == "warmup_linear" else peak / 32
        return optax.join_schedules(
            [
                optax.linear_schedule(0.0, peak, warmup_steps),
                optax.linear_schedule(peak, end, max(num_steps - warmup_steps, 1)),
            ],
            [warmup_steps],
        )
    raise ValueError(f"unknown schedule {shape!r}: choose constant, warmup_linear or slanted_triangular")


def build_optimizer(
    params: Params,
    *,
    rules: Sequence[tuple[str, str]],
    learning_rates: Mapping[str, float],
    num_steps: int,
    warmup_steps: int,
    schedule: str,
    weight_decay: float,
    max_grad_norm: float,
) -> tuple[optax.GradientTransformation, Params]:
    """One `multi_transform` over the whole tree; returns it with the label tree."""
    labels = label_params(params, rules)
    used = set(jax.tree.leaves(labels))
    missing = used - set(learning_rates) - {FROZEN}
    if missing:
        raise ValueError(f"parameter groups {sorted(missing)} have no learning rate")
    decay = weight_decay_mask(params)
    transforms: dict[str, optax.GradientTransformation] = {FROZEN: optax.set_to_zero()}
    for group, peak in learning_rates.items():
        lr = learning_rate_schedule(peak, num_steps=num_steps, warmup_steps=warmup_steps, shape=schedule)
        transforms[group] = optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-6, weight_decay=weight_decay, mask=decay)
    trainable = trainable_mask(labels)
    tx = optax.multi_transform(transforms, labels)
    if max_grad_norm > 0:
        # Clip by the norm of the trainable leaves only: frozen leaves carry zero gradients anyway,
        # and masking keeps the frozen subtree out of the clipping state and computation.
        tx = optax.chain(optax.masked(optax.clip_by_global_norm(max_grad_norm), trainable), tx)
    return tx, labels


def optimizer_state_bytes(opt_state: Any) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(opt_state) if hasattr(x, "dtype"))

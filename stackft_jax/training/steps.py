"""Pure, module-level train and eval steps. `loop.py` binds the static arguments and jits them once
per phase; the state is donated.

Every step takes a batch of tokens, or (train and eval steps) a batch that also carries cached
backbone features (feature_cache.py); the batch's keys pick the path when the step is traced.
"""

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from stackft_jax.models.objectives import Objective

Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any
    # The step whose loss or gradients were first not finite, -1 while all were. From that step on the
    # train step leaves params and optimizer state as they were, so NaN never reaches them.
    first_nonfinite_step: jax.Array

    @classmethod
    def create(cls, params: Any, opt_state: Any) -> "TrainState":
        return cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=opt_state,
            first_nonfinite_step=jnp.full((), -1, jnp.int32),
        )

    def as_dict(self) -> dict[str, Any]:
        """The checkpointed form (orbax restores into plain dicts)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


def mean_loss(
    params: Any,
    batch: Batch,
    *,
    graphdef: nnx.GraphDef,
    objective: Objective,
    dropout_key: jax.Array | None,
    backbone_deterministic: bool = False,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The objective's mean loss over the batch's real rows (and its stats), in training mode with
    dropout from `dropout_key`; None: deterministic (benchmarks/cases.py times both)."""
    model = nnx.merge(graphdef, params)
    outputs = model(
        batch,
        deterministic=dropout_key is None,
        backbone_deterministic=backbone_deterministic,
        rngs=None if dropout_key is None else nnx.Rngs(dropout=dropout_key),
    )
    loss_sum, stats = objective.loss(outputs, batch)
    return loss_sum / jnp.maximum(stats["count"], 1.0), stats


def train_step(
    state: TrainState,
    batch: Batch,
    *,
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    trainable: Any,
    objective: Objective,
    dropout_key: jax.Array,
    backbone_deterministic: bool = False,
    with_norms: bool = False,
    grad_accum_steps: int = 1,
    max_grad_norm: float = 0.0,
    nonfinite_guard: str = "skip_update",
    loss_denominator: float | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step. Frozen leaves (`trainable` False) enter the forward pass behind
    `stop_gradient`, so no backward pass runs through a frozen backbone, and they are returned untouched
    (bit-identical, not `p + 0`). `backbone_deterministic` runs the backbone without dropout; on a batch
    with cached features the backbone does not run at all.

    `with_norms` (static) adds the per-part gradient and update norms: the loop asks for them only on
    the steps it logs, so the other steps skip their passes over the parameters. `grad_accum_steps`
    (static) splits the batch into that many micro-batches whose gradients are summed before the one
    optimizer update: the same update as the whole batch at once, in a k-th of the activation memory.
    `max_grad_norm` > 0 clips the gradients here, with the norm the step computes anyway, as
    `optax.clip_by_global_norm` would (loop.build_phase_step builds `tx` without its own clip): one pass
    over the gradients fewer. `nonfinite_guard` (static): how a non-finite step leaves the state as
    it was, "skip_update" or "select" (below). `loss_denominator` (static) is what the batch's summed
    loss is divided by for the gradient (batching.TrainOrder.loss_denominator); None: the batch's own
    count. The logged `loss` is the batch's mean either way."""
    # Dropout masks depend only on (seed, phase, step): a resumed run draws the same ones.
    step_key = jax.random.fold_in(dropout_key, state.step)
    if grad_accum_steps == 1:
        (loss, stats), grads = loss_and_grads(
            state.params,
            batch,
            step_key,
            trainable=trainable,
            graphdef=graphdef,
            objective=objective,
            backbone_deterministic=backbone_deterministic,
            loss_denominator=loss_denominator,
        )
    else:
        loss, stats, grads = _accumulated(
            state.params,
            batch,
            step_key,
            trainable,
            graphdef,
            objective,
            backbone_deterministic,
            grad_accum_steps,
            loss_denominator,
        )
    if loss_denominator is not None:  # the log reads the batch's mean, whatever the gradient divides by
        loss = stats["loss_sum"] / jnp.maximum(stats["count"], 1.0)
    trainable_grads = jax.tree.map(lambda t, g: g if t else None, trainable, grads)
    grad_norm = optax.tree.norm(trainable_grads)
    # Checked here, every step; the host reads the flag only when it logs, evaluates or saves, so the
    # check never stalls the step pipeline.
    first_nonfinite_step = jnp.where(
        (state.first_nonfinite_step < 0) & ~(jnp.isfinite(loss) & jnp.isfinite(grad_norm)),
        state.step,
        state.first_nonfinite_step,
    )
    healthy = first_nonfinite_step < 0
    update = functools.partial(
        _update, grads=grads, grad_norm=grad_norm, tx=tx, trainable=trainable, max_grad_norm=max_grad_norm
    )
    # A non-finite step (or any after it) changes nothing (config.nonfinite_guard). skip_update: one
    # scalar decides a `lax.cond` around the whole update, so such a step runs no optimizer at all and a
    # healthy one writes each leaf once (2.6 GB less per BERT-base step than select, benchmarks/RESULTS.md
    # §13). select: the update always runs, then a select per trainable leaf and moment; XLA fuses the
    # optimizer's reductions differently there, so runs recorded with it rerun to the digit only with it.
    if nonfinite_guard == "skip_update":
        params, opt_state = jax.lax.cond(
            healthy,
            lambda operands: update(*operands),
            lambda operands: operands,
            (state.params, state.opt_state),
        )
    elif nonfinite_guard == "select":
        stepped, new_opt_state = update(state.params, state.opt_state)
        params = jax.tree.map(
            lambda t, old, new: jnp.where(healthy, new, old) if t else old, trainable, state.params, stepped
        )
        opt_state = jax.tree.map(
            lambda new, old: jnp.where(healthy, new, old), new_opt_state, state.opt_state
        )
    else:
        raise ValueError(f"nonfinite_guard={nonfinite_guard!r}: skip_update or select")
    metrics = {"loss": loss, "grad_norm": grad_norm, **stats, "real_tokens": _real_tokens(batch)}
    if with_norms:
        metrics.update(_norms_by_part(trainable, grads, state.params, params))
    new_state = TrainState(
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
        first_nonfinite_step=first_nonfinite_step,
    )
    return new_state, metrics


def _update(
    params: Any,
    opt_state: Any,
    *,
    grads: Any,
    grad_norm: jax.Array,
    tx: optax.GradientTransformation,
    trainable: Any,
    max_grad_norm: float,
) -> tuple[Any, Any]:
    """The optimizer update: (new params, frozen leaves untouched; new optimizer state)."""
    clipped = grads
    if max_grad_norm > 0:  # optax.clip_by_global_norm's formula, with the norm computed above
        keep = grad_norm < max_grad_norm
        clipped = jax.tree.map(
            lambda t, g: jax.lax.select(keep, g, (g / grad_norm.astype(g.dtype)) * max_grad_norm) if t else g,
            trainable,
            grads,
        )
    updates, new_opt_state = tx.update(clipped, opt_state, params)
    stepped = optax.apply_updates(params, updates)
    return jax.tree.map(lambda t, old, new: new if t else old, trainable, params, stepped), new_opt_state


def loss_and_grads(
    params: Any,
    batch: Batch,
    dropout_key: jax.Array,
    *,
    trainable: Any,
    graphdef: nnx.GraphDef,
    objective: Objective,
    backbone_deterministic: bool,
    loss_denominator: float | None = None,
) -> tuple[tuple[jax.Array, dict[str, jax.Array]], Any]:
    """((loss, stats), gradients) of one batch, the loss its mean (or its sum over `loss_denominator`):
    the step before its optimizer tail (what benchmarks/profile_step.py --tail subtracts to measure
    that tail)."""
    return jax.value_and_grad(_trainable_loss, has_aux=True)(
        params, batch, dropout_key, trainable, graphdef, objective, backbone_deterministic, loss_denominator
    )


def _trainable_loss(
    params, batch, key, trainable, graphdef, objective, backbone_deterministic, denominator
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The batch's loss with frozen leaves behind `stop_gradient`: its mean over its real rows (or
    words) with `denominator` None, else its sum divided by `denominator` (1.0: the sum)."""
    params = jax.tree.map(lambda t, p: p if t else jax.lax.stop_gradient(p), trainable, params)
    loss, stats = mean_loss(
        params,
        batch,
        graphdef=graphdef,
        objective=objective,
        dropout_key=key,
        backbone_deterministic=backbone_deterministic,
    )
    return (loss if denominator is None else stats["loss_sum"] / denominator), stats


def _accumulated(
    params,
    batch,
    step_key,
    trainable,
    graphdef,
    objective,
    backbone_deterministic,
    k: int,
    loss_denominator: float | None,
) -> tuple[jax.Array, dict[str, jax.Array], Any]:
    """Mean loss, summed stats and gradients of the batch over `k` micro-batches in a `lax.scan`.
    Micro-batch j is rows j, j+k, j+2k, ...: each device's shard of the batch holds its share of every
    micro-batch, so no micro-batch waits on a subset of the devices. A packed batch is laid out for
    this split (data/packing.py): micro-batch j's rows of the packed arrays are its own packing.
    Summed losses, divided once by the batch's count (or `loss_denominator`), make the gradient the
    whole batch's (not a mean of micro-batch means)."""
    micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1), batch)
    grad_fn = jax.grad(_trainable_loss, has_aux=True)

    def body(carry, inputs):
        grads_sum, stats_sum = carry
        index, micro_batch = inputs
        key = jax.random.fold_in(step_key, index)
        grads, stats = grad_fn(
            params, micro_batch, key, trainable, graphdef, objective, backbone_deterministic, 1.0
        )
        add = functools.partial(jax.tree.map, jnp.add)
        return (add(grads_sum, grads), add(stats_sum, stats)), None

    first = jax.tree.map(lambda x: x[0], micro)
    stats_shape = jax.eval_shape(
        lambda: _trainable_loss(
            params, first, step_key, trainable, graphdef, objective, backbone_deterministic, 1.0
        )[1]
    )
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (jax.eval_shape(lambda: params), stats_shape))
    (grads, stats), _ = jax.lax.scan(body, zeros, (jnp.arange(k), micro))
    count = jnp.maximum(stats["count"], 1.0)
    divisor = count if loss_denominator is None else loss_denominator
    grads = jax.tree.map(lambda g: g / jnp.asarray(divisor, g.dtype), grads)
    return stats["loss_sum"] / count, stats, grads


def _real_tokens(batch: Batch) -> jax.Array:
    """Non-padding tokens of the batch (its attention mask's sum), which the log's tokens/s counts."""
    return jnp.sum(batch["attention_mask"], dtype=jnp.float32)


def _norms_by_part(trainable: Any, grads: Any, old: Any, new: Any) -> dict[str, jax.Array]:
    """`grad_norm/<part>` and `update_norm/<part>` (the step's parameter change) for each top-level
    part (`backbone`, `head`) that trains: a new head at BERT's rate barely moves, which these show
    from the first steps (docs/finetune_collapse.md)."""
    norms = {}
    for part in trainable:
        if not any(jax.tree.leaves(trainable[part])):
            continue
        mask = trainable[part]
        norms[f"grad_norm/{part}"] = optax.tree.norm(
            jax.tree.map(lambda t, g: g if t else None, mask, grads[part])
        )
        change = jax.tree.map(lambda t, a, b: b - a if t else None, mask, old[part], new[part])
        norms[f"update_norm/{part}"] = optax.tree.norm(change)
    return norms


def eval_step(params: Any, batch: Batch, *, graphdef: nnx.GraphDef, objective: Objective) -> dict[str, Any]:
    """`rows`: the objective's per-row predictions (evaluation.py drops padding rows); `loss_sum` and
    `count`, padding excluded."""
    model = nnx.merge(graphdef, params)
    outputs = model(batch, deterministic=True)
    _, stats = objective.loss(outputs, batch)
    return {"rows": objective.predict(outputs, batch), "loss_sum": stats["loss_sum"], "count": stats["count"]}


def features_step(
    params: Any, batch: Batch, *, graphdef: nnx.GraphDef, all_layers: bool, dtype: Any
) -> dict[str, jax.Array]:
    """The backbone's deterministic outputs as feature_cache.py stores them: `hidden_states`
    [batch, length, layers, hidden] (every layer with the embeddings first, or only the last) and
    `pooled` [batch, hidden], both in `dtype`."""
    backbone = nnx.merge(graphdef, params).backbone
    out = backbone(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], deterministic=True)
    layers = out.hidden_states if all_layers else out.hidden_states[-1:]
    return {
        "hidden_states": jnp.stack(layers, axis=2).astype(dtype),
        "pooled": out.pooled.astype(dtype),
    }

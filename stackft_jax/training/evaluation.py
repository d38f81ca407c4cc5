"""Evaluation: the model over one split in padded eval batches, its per-row outputs gathered back into
dataset order, and the task's scores.

`Evaluator.evaluate` returns the objective's per-row predictions (objectives.py: class ids and class
probabilities, regression values, or word tags), which the task turns into scores and into the records
of WORKDIR/predictions/<split>.jsonl (predictions.py).
"""

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
from flax import nnx
from tqdm import tqdm

from stackft_jax.data import batching
from stackft_jax.data.task_spec import Split, TaskSpec
from stackft_jax.models.objectives import Objective
from stackft_jax.runtime import sharding
from stackft_jax.training import steps
from stackft_jax.training.feature_cache import FeatureCache


@dataclasses.dataclass(frozen=True)
class Evaluation:
    rows: dict[str, np.ndarray]  # per row, in dataset order (the first `limit` rows when limited)
    scores: dict[str, float]  # the task's metrics and `loss`; empty for an unlabelled split


@dataclasses.dataclass(frozen=True)
class Evaluator:
    task: TaskSpec
    eval_fn: Any  # jitted steps.eval_step: (params, device batch) -> {"rows", "loss_sum", "count"}
    mesh: jax.sharding.Mesh
    global_batch_size: int
    buckets: tuple[int, ...]

    def evaluate(
        self,
        params: Any,
        split: Split,
        *,
        limit: int | None = None,
        features: FeatureCache | None = None,
        progress: bool = True,
    ) -> Evaluation:
        """`split` (its first `limit` rows), from its cached backbone features when `features` is given;
        `progress`: a progress bar (process 0)."""
        num_rows = split.num_rows if limit is None else min(limit, split.num_rows)
        rows: dict[str, np.ndarray] = {}
        loss_sum, count = 0.0, 0.0
        # Its own bar, counting batches whose outputs reached the host: a long evaluation shows progress.
        progress = tqdm(
            total=-(-num_rows // self.global_batch_size),
            desc=f"eval {split.name}",
            unit="batch",
            leave=False,
            dynamic_ncols=True,
            disable=not progress or jax.process_index() != 0,
        )

        def gather(pending: tuple[dict, np.ndarray]) -> None:
            nonlocal loss_sum, count
            out, index = sharding.to_host(pending[0]), pending[1]
            real = index >= 0
            for key, value in out["rows"].items():
                value = np.asarray(value)
                if key not in rows:
                    rows[key] = np.empty((num_rows, *value.shape[1:]), value.dtype)
                rows[key][index[real]] = value[real]
            loss_sum += float(out["loss_sum"])
            count += float(out["count"])
            progress.update(1)

        # Batch k+1 is dispatched before batch k's outputs are fetched: the device always has the
        # next batch queued while the host copies and scatters the last one.
        pending = None
        for batch in batching.eval_batches(
            split.arrays, global_batch_size=self.global_batch_size, buckets=self.buckets, limit=limit
        ):
            index = batch.pop("index")
            if features is not None:
                # Padding rows repeat the batch's first example (eval_batches); so do their features.
                batch["index"] = np.where(index >= 0, index, index[0])
            local = batching.process_slice(batch, jax.process_index(), jax.process_count())
            if features is not None:
                local = features.attach(local)
            dispatched = (self.eval_fn(params, sharding.put_batch(local, self.mesh)), index)
            if pending is not None:
                gather(pending)
            pending = dispatched
        if pending is not None:
            gather(pending)
        progress.close()
        if not split.labelled:
            return Evaluation(rows, {})
        scores = self.task.score(split, rows)
        return Evaluation(rows, {**scores, "loss": loss_sum / max(count, 1.0)})


def probabilities_and_labels(split: Split, done: Evaluation) -> tuple[np.ndarray, np.ndarray]:
    """A classification evaluation's class probabilities and the labels of the rows it scored (what
    calibration.py reads)."""
    probabilities = done.rows["probabilities"]
    return probabilities, split.arrays["labels"][: len(probabilities)]


def build_evaluator(
    task: TaskSpec,
    graphdef: nnx.GraphDef,
    mesh: jax.sharding.Mesh,
    *,
    global_batch_size: int,
    buckets: tuple[int, ...],
) -> Evaluator:
    """The evaluator of `task`'s model `graphdef`; its eval step is jitted once (per length bucket)."""
    return Evaluator(task, jit_eval_step(task.objective, graphdef, mesh), mesh, global_batch_size, buckets)


def jit_eval_step(objective: Objective, graphdef: nnx.GraphDef, mesh: jax.sharding.Mesh):
    """`steps.eval_step` jitted as runs jit it: `(params, device batch) -> outputs` (also what benchmarks
    time)."""
    return jax.jit(
        functools.partial(steps.eval_step, graphdef=graphdef, objective=objective),
        in_shardings=(sharding.replicated(mesh), sharding.data_sharded(mesh)),
        out_shardings=sharding.replicated(mesh),
    )

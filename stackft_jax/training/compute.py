"""What a run's training cost, per phase and in total: optimizer steps, examples through the backbone's
forward and backward, analytic FLOPs (models/flops.py) and wall seconds.

    from stackft_jax.training.compute import run_compute
    run_compute("docs/grids/paper_qqp_small/runs/strategy=stack_and_finetune-name=cls_mlp-seed0")

New runs record it in results.json (`compute`, written by train.run with `of_results`); `run_compute`
derives the same from any finished run's results.json (and timings.json), so the runs committed before
it existed are accounted alike. `planned` gives what a config would cost before it runs (matched budgets:
experiments/budgets.py).

What is counted: training only; dev, test and gap-subset evaluations are not (their wall time is in
`wall_seconds`). A phase that trains the backbone runs it forward and backward over each batch (3x the
forward's FLOPs); a frozen phase runs it forward over each batch (1x), and one trained from a feature
cache runs it once over the train split it caches (the examples the run read) and then costs the head
alone. A shared feature cache (a grid's WORKDIR/feature_cache) is charged to the run that built it: the
others read it for nothing. New runs record which caches they built (results.json
`phases[i].feature_cache_built`); for runs from before that, a build is read from timings.json's
`feature_cache` seconds (builds took 17-390 s in the committed grids, opening an existing cache under
1 s). So the realized cost (`total`) depends on which run of a grid built the cache; beside it, every
run gets its standalone costs at the steps it took (`standalone`): `own_cache`, the run alone building
its own caches (a forward over the train split it caches), and `no_cache`, the run alone with no cache
(a frozen phase runs the backbone forward over each batch: cheaper than a cache when the phase reads
fewer examples than the split holds). `planned` gives both at the whole step budgets (its `total` is
`own_cache`), and experiments/budgets.py matches to either. `flops` counts every example as
`max_seq_length` tokens (batches pad to length buckets up to it, so this is an upper bound: a ratio of
`flops` compares token slots at max_seq_length); what the batches really held is `tokens_real` and
`tokens_padding` (the padding up to each batch's bucket, config.batching), so a ratio of real tokens
says what was computed on text (their share is what length grouping raises); the head
counts where models/flops.py counts it (`head_counted`). A phase that trains the backbone only through an
adaptation kind (LoRA, BitFit, adapters) runs the backbone forward and the backward's activation half
(2x the forward: its frozen kernels need no weight gradients), plus 3x the forward FLOPs the kind's own
matrices add (`AdaptationKind.added_flops`; rank-8 LoRA on query and value adds 0.7% per token on
MiniLM): 0.67-0.68x a fine-tuning step on MiniLM, where XLA's cost analysis gives 0.68-0.72x
(benchmarks/adaptation.py). A phase that trains some layers' own weights (gradual unfreezing, or a
kind plus backbone rules) counts as fine-tuning: an upper bound.
"""

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from stackft_jax.config import phases, spec
from stackft_jax.config.spec import RunSpec
from stackft_jax.data import batching
from stackft_jax.models import adaptation, flops
from stackft_jax.runtime import records
from stackft_jax.training import build

RESULTS_KEY = "compute"  # results.json's record of it
TIMINGS_FILE = "timings.json"  # timing.FILE_NAME (importing timing would start jax)
# timings.json `feature_cache` seconds from which a run without the record built its train cache.
BUILD_SECONDS = 10.0
MEASURES = ("optimizer_steps", "examples_forward", "examples_backward", "flops")
# Summed only when every phase has them (runs recorded before token counts have none).
TOKEN_MEASURES = ("tokens_real", "tokens_padding")


@dataclasses.dataclass(frozen=True)
class _Model:
    encoder: Any  # models.bert.BertConfig
    head: Mapping[str, Any]
    outputs: int
    seq_len: int
    heads: str = "every"  # which heads' FLOPs count (flops.HEAD_COUNTS): every one, or the light ones

    def encoder_flops(self, examples: int) -> float:
        return flops.encoder_flops(self.encoder, examples=examples, seq_len=self.seq_len)

    def head_flops(self, examples: int) -> float:
        per_example = flops.head_flops(
            self.head,
            hidden=self.encoder.hidden_size,
            outputs=self.outputs,
            seq_len=self.seq_len,
            counted=self.heads,
        )
        return 0.0 if per_example is None else per_example * examples

    def adaptation_flops(self, kind: str, options: Mapping[str, Mapping[str, Any]], examples: int) -> float:
        """The forward FLOPs an adaptation kind's own matrices add over `examples` examples."""
        per_token_layer = adaptation.KINDS[kind].added_flops(
            options.get(kind) or {}, self.encoder.hidden_size, self.encoder.intermediate_size
        )
        return per_token_layer * self.encoder.num_hidden_layers * self.seq_len * examples

    @property
    def head_counted(self) -> bool:
        return flops.head_flops(self.head, hidden=1, outputs=1, seq_len=1, counted=self.heads) is not None


def _adapted_only(phase: phases.Phase, run_spec: RunSpec) -> bool:
    """Whether every backbone parameter `phase` trains is its adaptation kind's."""
    trained = run_spec.encoder.trained_by(phase)
    return bool(phase.adaptation) and all(
        phases.group_of(phase.rules, name) == phases.ADAPTATION for name in trained
    )


def _model(run_spec: RunSpec, heads: str = "every") -> tuple[_Model, Any]:

    _, encoder = build.resolve_encoder(run_spec)
    head = run_spec.head.to_dict()
    model = _Model(encoder, head, run_spec.task.num_outputs, run_spec.max_seq_length, heads)
    return model, encoder


def _phase(
    phase: phases.Phase,
    run_spec: RunSpec,
    model: _Model,
    *,
    steps: int,
    batch: int,
    cached_examples: int,
    wall_seconds: float | None,
    cache: str | None,
    use_cache: bool = True,
) -> dict[str, Any]:
    """`use_cache=False`: as if the phase ran without its feature cache (the backbone forward every
    step), the standalone no-cache cost."""
    examples = steps * batch
    trains_backbone = run_spec.encoder.trains(phase)
    if trains_backbone and _adapted_only(phase, run_spec):
        forward, backward = examples, examples
        added = model.adaptation_flops(phase.adaptation, run_spec.adaptation_options, examples)
        total = flops.PASS_THROUGH_FACTOR * model.encoder_flops(examples) + flops.BACKWARD_FACTOR * (
            added + model.head_flops(examples)
        )
    elif trains_backbone:
        forward, backward = examples, examples
        total = flops.BACKWARD_FACTOR * (model.encoder_flops(examples) + model.head_flops(examples))
    else:
        forward = cached_examples if phase.feature_cache and use_cache else examples
        total = model.encoder_flops(forward) + flops.BACKWARD_FACTOR * model.head_flops(examples)
        backward = 0
    return {
        "phase": phase.name,
        "optimizer_steps": steps,
        "examples_forward": forward,
        "examples_backward": backward,
        "flops": total,
        "wall_seconds": wall_seconds,
        "trains_backbone": trains_backbone,
        "feature_cache": cache,
    }


def _totals(per_phase: list[dict[str, Any]]) -> dict[str, Any]:
    return {measure: sum(p[measure] for p in per_phase) for measure in MEASURES}


def _summed(
    per_phase: list[dict[str, Any]],
    model: _Model,
    wall_seconds: float | None,
    standalone: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    total = _totals(per_phase)
    if per_phase and all("tokens_real" in p for p in per_phase):
        total.update({measure: sum(p[measure] for p in per_phase) for measure in TOKEN_MEASURES})
    return {
        "phases": per_phase,
        "total": {**total, "wall_seconds": wall_seconds},
        "standalone": {kind: _totals(phases_) for kind, phases_ in standalone.items()},
        "head_counted": model.head_counted,
        "seq_len": model.seq_len,
    }


# The standalone costs beside the realized one: the run alone, building its own feature caches
# (`own_cache`), or with none (`no_cache`: every frozen phase runs the backbone forward each step).
STANDALONE = ("own_cache", "no_cache")


def _standalone(
    run_spec: RunSpec, model: _Model, steps: list[tuple[phases.Phase, int]], batch: int, train_examples: int
) -> dict[str, list[dict[str, Any]]]:
    """The phases' cost at these step counts under each of STANDALONE's accountings."""

    def one(phase: phases.Phase, n: int, use_cache: bool) -> dict[str, Any]:
        return _phase(
            phase,
            run_spec,
            model,
            steps=n,
            batch=batch,
            cached_examples=train_examples,
            wall_seconds=None,
            cache=("built" if use_cache else None) if phase.feature_cache else None,
            use_cache=use_cache,
        )

    return {
        "own_cache": [one(phase, n, True) for phase, n in steps],
        "no_cache": [one(phase, n, False) for phase, n in steps],
    }


def _built_train_cache(record: Mapping[str, Any], timings: Mapping[str, Any] | None) -> bool | None:
    if "feature_cache_built" in record:
        return "train" in record["feature_cache_built"]
    if timings is None:
        return None
    return timings.get("seconds", {}).get("feature_cache", 0.0) >= BUILD_SECONDS


def tokens(
    run_spec: RunSpec,
    phase_index: int,
    *,
    steps: int,
    global_batch_size: int,
    train_lengths: np.ndarray,
    cached: bool = False,
) -> dict[str, int]:
    """The real and padding tokens of a phase's training batches (batching.token_counts: the data order
    is a pure function of seed, phase and step, so the train split's lengths give them exactly);
    `cached`: the phase reads cached features, so draws unpacked batches (loop.device_batches)."""
    order = run_spec.train_order.unpacked if cached else run_spec.train_order
    real, padding = batching.token_counts(
        train_lengths,
        steps=steps,
        global_batch_size=global_batch_size,
        seed=batching.phase_seed(run_spec.seed, phase_index),
        order=order,
    )
    return {"tokens_real": real, "tokens_padding": padding}


def of_results(
    run_spec: RunSpec,
    results: Mapping[str, Any],
    timings: Mapping[str, Any] | None = None,
    *,
    train_lengths: np.ndarray | None = None,
) -> dict[str, Any]:
    """The compute of a finished run from its results.json (`results`) and, for runs that did not record
    which feature caches they built, its timings.json. The shape is `run_compute`'s. Each phase's real
    and padding tokens are counted from the train split's `lengths` (train.run has them), else read
    from the record's own `compute` (runs recorded before the counts have none)."""
    recorded = (results.get(RESULTS_KEY) or {}).get("phases", [])
    if not (len(recorded) == len(results["phases"]) and all("tokens_real" in p for p in recorded)):
        recorded = None
    model, _ = _model(run_spec)
    blocks = {phase.name: phase for phase in run_spec.phases}
    batch = results["global_batch_size"]
    train_examples = results["data"]["num_examples"]["train"]
    per_phase, steps = [], []
    for index, record in enumerate(results["phases"]):
        phase = blocks[record["phase"]]
        built = _built_train_cache(record, timings) if phase.feature_cache else None
        per_phase.append(
            _phase(
                phase,
                run_spec,
                model,
                steps=record["steps"],
                batch=batch,
                cached_examples=train_examples if built else 0,
                wall_seconds=record.get("wall_time_s"),
                cache=None if built is None else ("built" if built else "read"),
            )
        )
        steps.append((phase, record["steps"]))
        if train_lengths is not None:
            per_phase[-1].update(
                tokens(
                    run_spec,
                    index,
                    steps=record["steps"],
                    global_batch_size=batch,
                    train_lengths=train_lengths,
                    cached=phase.feature_cache,
                )
            )
        elif recorded is not None:
            per_phase[-1].update({measure: recorded[index][measure] for measure in TOKEN_MEASURES})
    wall = results.get("wall_time_s")
    if wall is None and timings is not None:
        wall = timings.get("total_s")
    return _summed(per_phase, model, wall, _standalone(run_spec, model, steps, batch, train_examples))


def run_compute(run_dir: str | Path) -> dict[str, Any] | None:
    """A finished run's training compute (None when `run_dir` has no results.json, or one without its
    config and global batch), the same that new
    runs record in results.json's `compute`:

        {"phases": [{"phase": str,              # as results.json's phases[i].phase
                     "optimizer_steps": int,    # steps the phase took (early stops included)
                     "examples_forward": int,   # examples through the backbone's forward
                     "examples_backward": int,  # examples through the backbone's backward
                     "flops": float,            # analytic: encoder matmuls (+ head where counted)
                     "wall_seconds": float | None,  # the phase's wall time, evaluations included
                     "trains_backbone": bool,
                     "feature_cache": "built" | "read" | None,  # None: the phase reads no cache
                     # Runs that recorded them (results.json's compute, since config.batching): the
                     # training batches' tokens, real ones and padding up to each batch's length bucket.
                     "tokens_real": int, "tokens_padding": int},
                    ...],
         "total": {"optimizer_steps", "examples_forward", "examples_backward", "flops" (and the token
                   counts where every phase has them): sums over phases, "wall_seconds": the whole
                   run's (set-up and final scoring included)},
         "standalone": {"own_cache" | "no_cache": {the same four sums}},  # the run alone, at the
                   # steps it took: building its own feature caches, or with none (module docstring)
         "head_counted": bool,  # whether `flops` includes the head (models/flops.py HEAD_FLOPS)
         "seq_len": int}        # tokens counted per example (max_seq_length)

    What each counts, and how a shared feature cache is charged: the module docstring."""
    run_dir = Path(run_dir)
    results_file = run_dir / "results.json"
    if not results_file.is_file():
        return None
    results = records.read_json(results_file, records.RERUN_RESULTS.format(workdir=run_dir))
    hand_written = not isinstance(results, dict) or not {"config", "global_batch_size"} <= results.keys()
    if hand_written:
        return None
    timings_file = run_dir / TIMINGS_FILE
    remedy = records.RERUN_RESULTS.format(workdir=run_dir)
    timings = records.read_json(timings_file, remedy) if timings_file.is_file() else None
    run_spec = spec.resolve(spec.config_from_plain(results["config"]), recorded=True)
    return of_results(run_spec, results, timings)


def planned(
    run_spec: RunSpec, *, train_examples: int, global_batch_size: int, heads: str = "every"
) -> dict[str, Any]:
    """What `run_spec` costs if every phase runs its whole step budget and builds its own feature cache
    (no early stop, no shared cache), over a train split of `train_examples` examples; `run_compute`'s
    shape, without wall seconds; `standalone.no_cache` the same budgets without any feature cache.
    `global_batch_size`: one micro-batch's (per-device batch x devices); a step is `grad_accum_steps` of
    them. `heads`: which heads' FLOPs count (flops.HEAD_COUNTS; "light": as matched cells planned before
    every head had its count)."""
    model, _ = _model(run_spec, heads)
    global_batch_size *= run_spec.grad_accum_steps
    # Full batches, as batching.steps_per_epoch (which counts rows: a CoNLL sentence longer than
    # max_seq_length is several, so an epoch budget may plan a few steps short there).
    steps_per_epoch = max(1, train_examples // global_batch_size)
    standalone = _standalone(
        run_spec,
        model,
        [(phase, phase.num_steps) for phase in run_spec.plan(steps_per_epoch)],
        global_batch_size,
        train_examples,
    )
    return _summed(standalone["own_cache"], model, None, standalone)


def step_flops_of(run_spec: RunSpec, phase: phases.Phase) -> Callable[[int, int], float]:
    """(examples, padded length) -> the analytic FLOPs of one train step of `phase` over that batch,
    counted as the phase's record counts them (a cached step costs the head alone): the log's model
    TFLOP/s and MFU."""
    model, _ = _model(run_spec)

    def step_flops(examples: int, seq_len: int) -> float:
        shaped = dataclasses.replace(model, seq_len=seq_len)
        return _phase(
            phase,
            run_spec,
            shaped,
            steps=1,
            batch=examples,
            cached_examples=0,
            wall_seconds=None,
            cache=None,
        )["flops"]

    return step_flops

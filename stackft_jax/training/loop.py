"""One phase's step loop: train steps, then the periodic actions due after each (the train log, the dev
evaluation with the stop rule and the best-on-dev checkpoint, the periodic checkpoint, the observer),
preemption; then the phase's end (boundaries.py).

`run_phase` trains one phase from its latest checkpoint (or its first step) to its stop and returns its
final parameters and record; train.py calls it per phase. Where the phase is lives in one `Progress`;
what runs after a step is the list `periodic_actions`, each with its cadence; the decisions are small
pure functions (`due`, `train_stats`, `improved_best`; the stop rule is phases.StopTracker).
"""

import collections
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

from stackft_jax.config import phases
from stackft_jax.config.spec import RunSpec
from stackft_jax.data import batching, task_spec
from stackft_jax.models import flops
from stackft_jax.models.objectives import Objective
from stackft_jax.runtime import sharding, timing
from stackft_jax.training import (
    boundaries,
    checkpointing,
    compute,
    degenerate,
    evaluation,
    feature_cache,
    optim,
    preemption,
    prefetch,
    steps,
)
from stackft_jax.training.run_report import RunReport

log = logging.getLogger(__name__)

PREFETCH_DEPTH = 2  # global batches on the devices ahead of the step that runs


class LoopObserver:
    """Told where the training loop is; subclass it to watch a run (benchmarks/compile_count.py
    attributes each compilation to a phase and step; tests/kill_after.py kills a run after a step) and
    pass it as `train.run(observer=...)`. The base class does nothing."""

    def phase_started(self, name: str) -> None:
        """`name` starts or resumes: its optimizer state, feature cache and first steps follow."""

    def step_started(self, phase: str, step: int) -> None:
        """The batch of `step` (0-based within the phase) goes to the train step."""

    def step_ended(self, phase: str, step: int) -> None:
        """`step` steps of the phase are done, and every periodic action due after them (log,
        evaluation, checkpoint) has run: the loop's last periodic action (tests kill a run here)."""

    def phase_ended(self, name: str) -> None:
        """`name` trained to its stop (its boundary measurements and checkpoint follow)."""


@dataclasses.dataclass(frozen=True)
class Context:
    """What every phase of a run shares: built once by train.run."""

    spec: RunSpec
    workdir: Path
    mesh: jax.sharding.Mesh
    datasets: dict[str, task_spec.Split]
    graphdef: nnx.GraphDef
    param_names: tuple[str, ...]  # '/'-joined parameter paths, which phases' rules label
    buckets: tuple[int, ...]  # evaluation's and the feature caches' lengths
    train_order: batching.TrainOrder  # how training batches are drawn (config.batching)
    global_batch_size: int
    eval_global_batch_size: int
    report: RunReport
    evaluator: evaluation.Evaluator
    timer: timing.RunTimer
    observer: LoopObserver

    @property
    def task(self) -> task_spec.TaskSpec:
        return self.spec.task

    @property
    def primary_metric(self) -> str:
        return self.task.metrics[0]


class PhaseResult(NamedTuple):
    params: Any  # the phase's last parameters
    record: dict  # results.json's `phases` entry
    # The dev evaluation of `params` when the loop ended on one of the backbone's own outputs (cached
    # features may round differently): exactly what final scoring would compute, so it need not again.
    dev_at_end: evaluation.Evaluation | None


class PhaseStep(NamedTuple):
    init_state: Callable  # params -> TrainState.as_dict() (a dict: checkpoints restore into it)
    jitted_step: Callable  # jitted (TrainState, device batch, dropout_key) -> (TrainState, metrics)
    dropout_key: jax.Array
    # The same step that also returns the per-part gradient and update norms (steps.train_step's
    # `with_norms`): a second program, compiled on the phase's first logged step.
    jitted_step_with_norms: Callable | None = None

    def train_step(self, state, batch, *, with_norms: bool = False):
        """One step with the phase's dropout key; donates `state`."""
        jitted = (
            self.jitted_step_with_norms if with_norms and self.jitted_step_with_norms else self.jitted_step
        )
        return jitted(state, batch, self.dropout_key)


def build_phase_step(
    phase: phases.Phase,
    index: int,
    params,
    *,
    graphdef: nnx.GraphDef,
    objective: Objective,
    mesh: jax.sharding.Mesh,
    seed: int,
    max_grad_norm: float,
    grad_accum_steps: int = 1,
    nonfinite_guard: str = "skip_update",
    loss_denominator: float | None = None,
) -> PhaseStep:
    """The phase's optimizer state initialiser and jitted train steps (also what benchmarks time)."""
    replicated = sharding.replicated(mesh)
    # The step clips with the gradient norm it computes for its guard (steps.train_step), so tx does
    # not; an identity holds the clip's (empty) place in the optimizer state, whose checkpointed
    # structure stays what optim.phase_optimizer with clipping gives.
    tx, labels = optim.phase_optimizer(params, phase, max_grad_norm=0.0)
    trainable = optim.trainable_mask(labels)
    if max_grad_norm > 0:
        tx = optax.chain(optax.masked(optax.identity(), trainable), tx)

    @functools.partial(jax.jit, out_shardings=replicated)
    def init_state(p):
        return steps.TrainState.create(p, tx.init(p)).as_dict()

    def jitted(with_norms: bool) -> Callable:
        def train_step(state, batch, dropout_key):  # named so for compile logs (benchmarks/compile_count)
            return steps.train_step(
                state,
                batch,
                graphdef=graphdef,
                tx=tx,
                trainable=trainable,
                objective=objective,
                dropout_key=dropout_key,
                backbone_deterministic=not phase.backbone_dropout,
                with_norms=with_norms,
                grad_accum_steps=grad_accum_steps,
                max_grad_norm=max_grad_norm,
                nonfinite_guard=nonfinite_guard,
                loss_denominator=loss_denominator,
            )

        if with_norms:  # its own name in compile logs: it compiles when a logged step first meets a bucket
            train_step.__name__ = train_step.__qualname__ = "train_step_logged"
        # The dropout key is an argument, not a constant baked into the program: runs that differ only
        # in their seed compile the same program (one persistent-cache entry serves them all).
        return jax.jit(
            train_step,
            in_shardings=(replicated, sharding.data_sharded(mesh), replicated),
            out_shardings=(replicated, replicated),
            donate_argnums=0,
        )

    # Made by a jitted function, not device_put: a multi-host mesh has devices this process cannot
    # address, and device_put of a key onto them fails.
    dropout_key = jax.jit(lambda s, i: jax.random.fold_in(jax.random.key(s), i), out_shardings=replicated)(
        seed, index
    )
    return PhaseStep(init_state, jitted(False), dropout_key, jitted(True))


def build_run_phase_step(
    run_spec: RunSpec,
    phase: phases.Phase,
    index: int,
    params,
    *,
    graphdef: nnx.GraphDef,
    mesh: jax.sharding.Mesh,
    train: batching.Dataset,
    global_batch_size: int,
) -> PhaseStep:
    """`build_phase_step` with the run's step options, as `run_phase` trains the phase (and a benchmark
    that times the same steps builds them); `train`: the training split's arrays."""
    return build_phase_step(
        phase,
        index,
        params,
        graphdef=graphdef,
        objective=run_spec.task.objective,
        mesh=mesh,
        seed=run_spec.seed,
        max_grad_norm=run_spec.max_grad_norm,
        grad_accum_steps=run_spec.grad_accum_steps,
        nonfinite_guard=run_spec.nonfinite_guard,
        loss_denominator=run_spec.train_order.loss_denominator(train, global_batch_size),
    )


def gap_examples(run_spec: RunSpec, phase: phases.Phase) -> int:
    """How many train examples (the first ones) a frozen-backbone phase scores: the gap rule's, else the
    boundary measurement's."""
    return phase.gap_eval_examples or run_spec.boundary_train_examples


def gap_metric_of(ctx: Context, phase: phases.Phase) -> str:
    """The metric `phase`'s train/dev gap rule compares: its own `gap_metric`, else the task's."""
    return ctx.task.rule_metric(phase.gap_metric or ctx.task.gap_metric)


def feature_caches(ctx: Context, phase: phases.Phase, params) -> dict[str, feature_cache.FeatureCache]:
    """The frozen backbone's features for `phase`: dev, and the train split's (every example with
    `phase.feature_cache`, which the steps train on; else only the first `gap_examples`, which the
    train/dev gap scores). Every evaluation of the phase reads them, so the backbone runs once per
    split and phase, not at every evaluation. Built once per workdir (a resumed run reopens them), or
    once for every run sharing the run's `feature_cache_dir`."""
    folder = ctx.spec.feature_cache_dir
    shared = folder not in ("", "none")  # "none": the workdir, also in a grid
    train = ctx.datasets["train"].arrays
    if not phase.feature_cache:
        limit = min(gap_examples(ctx.spec, phase), ctx.datasets["train"].num_rows)
        train = {key: value[:limit] for key, value in train.items()}
    caches = {}
    selection = ctx.datasets[task_spec.selection_split(ctx.datasets)].arrays  # "dev" keys it
    for split, arrays in (("train", train), ("dev", selection)):
        # One folder per process: hosts sharing a filesystem must not replace each other's files
        # (a shared folder is content-addressed and never replaces one).
        name = "train_subset" if split == "train" and not phase.feature_cache else split
        name = name if jax.process_count() == 1 else f"{name}.process{jax.process_index()}"
        caches[split] = feature_cache.open_or_build(
            folder if shared else ctx.workdir / "feature_cache" / phase.name / name,
            arrays,
            params,
            graphdef=ctx.graphdef,
            mesh=ctx.mesh,
            all_layers=ctx.spec.model.scalar_mix,
            dtype=phase.feature_cache_dtype,
            global_batch_size=ctx.eval_global_batch_size,
            buckets=ctx.buckets,
            shared=shared,
        )
    return caches


# Pure decisions of the loop.


def due(step: int, every: int, num_steps: int) -> bool:
    """Whether a periodic action (log, evaluation, checkpoint) runs after `step`: every `every` steps
    and after the phase's last step."""
    return step % every == 0 or step == num_steps


def train_stats(
    window: list[dict], seconds: float, peak_flops_per_device: float | None, devices: int
) -> dict:
    """metrics.jsonl's train record for the steps of `window` (their metrics on the host, each with its
    `examples`, `padded_tokens` and analytic `flops`), which ran for `seconds` (compilation, evaluation
    and checkpoints left out). `mfu` only where the device's bf16 peak is known (not on CPU)."""
    seconds = max(seconds, 1e-9)
    total_flops = sum(m["flops"] for m in window)
    stats = {
        "loss": float(np.mean([m["loss"] for m in window])),
        "grad_norm": float(np.mean([m["grad_norm"] for m in window])),
        "step_seconds": seconds,
        "examples_per_s": sum(m["examples"] for m in window) / seconds,
        "real_tokens_per_s": sum(float(m["real_tokens"]) for m in window) / seconds,
        "padded_tokens_per_s": sum(m["padded_tokens"] for m in window) / seconds,
        "model_tflops_per_s": total_flops / seconds / 1e12,
    }
    if peak_flops_per_device:
        stats["mfu"] = total_flops / seconds / (peak_flops_per_device * devices)
    # The per-part norms come from the window's last step (the one the step computed them for).
    stats.update(
        {
            key: float(value)
            for key, value in window[-1].items()
            if key.startswith(("grad_norm/", "update_norm/"))
        }
    )
    if "correct" in window[0]:  # objectives whose predictions are right or wrong
        stats["running_accuracy"] = sum(float(m["correct"]) for m in window) / sum(
            float(m["count"]) for m in window
        )
    return stats


THROUGHPUT_SUMS = ("step_seconds", "examples", "real_tokens", "padded_tokens", "flops")


def throughput_record(
    sums: dict[str, float], peak_flops_per_device: float | None, devices: int, kind: str
) -> dict:
    """results.json `phases[i].throughput`: the phase's logged windows together (this process's: a
    resumed phase counts the steps since its resume)."""
    seconds = sums.get("step_seconds", 0.0)
    rate = (lambda key: sums[key] / seconds) if seconds > 0 else (lambda key: None)
    tflops = None if seconds <= 0 else sums["flops"] / seconds / 1e12
    return {
        "step_seconds": seconds,
        "examples_per_s": rate("examples"),
        "real_tokens_per_s": rate("real_tokens"),
        "padded_tokens_per_s": rate("padded_tokens"),
        "model_tflops_per_s": tflops,
        "mfu": tflops * 1e12 / (peak_flops_per_device * devices)
        if tflops is not None and peak_flops_per_device
        else None,
        "device_kind": kind,
        "devices": devices,
        "peak_bf16_flops_per_device": peak_flops_per_device,
    }


def improved_best(best: dict, dev: dict[str, float], metric: str, **where: Any) -> dict | None:
    """The new best record when `dev[metric]` beats `best` (or there is none yet), else None. `where`:
    phase, step and global_step of the evaluation."""
    if best.get("value") is not None and not dev[metric] > best["value"]:
        return None
    return {"value": dev[metric], "metric": metric, **where, "dev": dev}


# The loop.


@dataclasses.dataclass
class Progress:
    """Where one phase is: what the loop advances step by step and the periodic actions read and update."""

    phase: phases.Phase
    global_offset: int  # global steps before this phase
    state: steps.TrainState
    step: int  # steps of the phase done (on the host: reading state.step would wait for the device)
    tracker: phases.StopTracker
    best: dict  # the run's best-on-dev record so far
    wall_time_before: float  # the phase's seconds in earlier processes (its checkpoint's)
    started: float = dataclasses.field(default_factory=time.time)  # when this process took it up
    window: list[dict] = dataclasses.field(default_factory=list)  # step metrics since the last log
    window_start: float = dataclasses.field(default_factory=time.time)
    # Seconds inside the window that were not training steps (evaluation, checkpoints, compilation),
    # and the run's compilation seconds when the window (or its last excluded action) began.
    window_paused: float = 0.0
    window_compile: float = 0.0
    throughput: dict = dataclasses.field(default_factory=dict)  # THROUGHPUT_SUMS over logged windows
    evaluated: "_Evaluated | None" = None  # this step's evaluation, when it had one
    stop_reason: str | None = None  # set by the stop rule after an evaluation
    preempted: bool = False  # SIGTERM or Ctrl-C, agreed on by every process: save and stop

    @property
    def global_step(self) -> int:
        return self.global_offset + self.step

    def wall_time(self) -> float:
        return self.wall_time_before + time.time() - self.started


class PeriodicAction(NamedTuple):
    """Something the loop does after the steps `due` picks, in list order (levanter's hooks, clu's
    periodic actions). `reads_params`: it reads the parameters, so the step must be finite first."""

    name: str
    due: Callable[[Progress], bool]
    run: Callable[[Progress], None]
    reads_params: bool = True


class _Checkpoints(NamedTuple):
    periodic: checkpointing.PhaseCheckpoints  # the phase's, to resume it
    best: checkpointing.BestCheckpoint  # the run's best on dev

    @classmethod
    def open(cls, ctx: Context, phase: phases.Phase, *, trained, frozen: str) -> "_Checkpoints":
        return cls(
            checkpointing.PhaseCheckpoints(
                ctx.workdir,
                phase.name,
                trained=trained,
                frozen=frozen,
                max_to_keep=ctx.spec.keep_checkpoints,
                async_save=ctx.spec.async_checkpointing,
            ),
            checkpointing.BestCheckpoint(ctx.workdir, async_save=ctx.spec.async_checkpointing),
        )

    def close(self) -> None:
        self.periodic.close()
        self.best.close()


class _StepBar:
    """The phase's progress bar (process 0). It counts finished steps without stalling the pipeline: up
    to `IN_FLIGHT` steps stay queued on the device, the host waits only for the oldest beyond them."""

    # Three rather than two: a host pause (the prefetch thread holding the GIL, a train log, the OS
    # scheduling another process) as long as two short steps still leaves the device a step to run.
    IN_FLIGHT = 3

    def __init__(self, phase: phases.Phase, step: int):
        self.tqdm = tqdm(
            total=phase.num_steps,
            initial=step,
            desc=phase.name,
            dynamic_ncols=True,
            disable=jax.process_index() != 0,
        )
        self.uncounted: collections.deque = collections.deque()  # losses of dispatched, uncounted steps

    def dispatched(self, loss: jax.Array) -> None:
        self.uncounted.append(loss)
        while len(self.uncounted) > self.IN_FLIGHT:
            jax.block_until_ready(self.uncounted.popleft())
            self.tqdm.update(1)

    def waited(self) -> None:
        """The loop waited for every dispatched step."""
        self.tqdm.update(len(self.uncounted))
        self.uncounted.clear()


class _Evaluated(NamedTuple):
    dev: evaluation.Evaluation
    train: evaluation.Evaluation | None  # the train subset the gap rule scores, when it has one
    train_score: float | None  # the task's gap metric on it


def _raise_if_nonfinite(state: steps.TrainState, phase_name: str, checkpoints: _Checkpoints) -> None:
    bad_step = int(state.first_nonfinite_step)
    if bad_step < 0:
        return
    checkpoints.close()
    latest = checkpoints.periodic.manager.latest_step()
    last_good = (
        f"the last good checkpoint is {checkpoints.periodic.manager.directory / str(latest)}"
        if latest is not None
        else f"{phase_name} has no checkpoint yet (a rerun starts it again from its initial parameters)"
    )
    raise FloatingPointError(
        f"{phase_name} step {bad_step + 1}: the training loss or gradient norm is not finite "
        f"(NaN or inf). That step and later ones were not applied, and nothing after it was evaluated "
        f"or saved; {last_good}. Try a lower learning rate, float32 (config.model.dtype) or "
        "gradient clipping (config.max_grad_norm)."
    )


def _evaluate(
    ctx: Context, phase: phases.Phase, params, features: dict, step: int, global_step: int
) -> _Evaluated:
    """Dev, and the train subset when the phase has a gap rule; each written to metrics.jsonl."""
    with ctx.timer.phase("evaluation"):
        selection = task_spec.selection_split(ctx.datasets)
        dev = ctx.evaluator.evaluate(params, ctx.datasets[selection], features=features.get("dev"))
    at = {"phase": phase.name, "step": step, "global_step": global_step}
    ctx.report.eval(**at, split=selection, metrics=dev.scores)
    if not phase.gap_eval_examples:
        return _Evaluated(dev, None, None)
    with ctx.timer.phase("gap_evaluation"):
        train = ctx.evaluator.evaluate(
            params, ctx.datasets["train"], limit=phase.gap_eval_examples, features=features.get("train")
        )
    ctx.report.eval(**at, split="train_subset", metrics=train.scores)
    return _Evaluated(dev, train, train.scores.get(gap_metric_of(ctx, phase)))


def _restore_or_start(
    ctx: Context,
    phase: phases.Phase,
    phase_step: PhaseStep,
    checkpoints: _Checkpoints,
    params,
    global_offset: int,
    best: dict,
) -> Progress:
    """The phase's progress: from its latest checkpoint (train state, stop tracker, the run's best
    record, the phase's wall time so far), else its first step. Best checkpoints and metrics.jsonl
    records a killed run wrote after that checkpoint are dropped (they are written again)."""
    tracker = phases.StopTracker(phase.stop)
    wall_time = 0.0
    abstract = checkpointing.abstract_like(
        jax.eval_shape(phase_step.init_state, params), sharding.replicated(ctx.mesh)
    )
    restored = checkpoints.periodic.restore_latest(abstract, params)
    if restored is not None:
        latest, state, meta = restored
        checkpoints.best.discard_between(global_offset + latest, global_offset + phase.num_steps)
        tracker.load_state_dict(meta["stop"])
        best, wall_time = meta["best"], meta["wall_time_s"]
        log.info("resumed %s at step %d", phase.name, latest)
    else:
        state = phase_step.init_state(params)
    start_step = int(state["step"])
    ctx.report.keep_records(lambda r: r["phase"] != phase.name or r["step"] <= start_step)
    state = steps.TrainState(**state)
    log.info(
        "%s: %d steps, trainable groups %s, optimizer state %.1f MB",
        phase.name,
        phase.num_steps,
        phase.learning_rates,
        optim.optimizer_state_bytes(state.opt_state) / 2**20,
    )
    return Progress(phase, global_offset, state, start_step, tracker, best, wall_time)


def _compile_seconds(ctx: Context) -> float:
    return ctx.timer.seconds.get(timing.COMPILATION, 0.0)


def _start_window(ctx: Context, p: Progress) -> None:
    p.window, p.window_start, p.window_paused, p.window_compile = [], time.time(), 0.0, _compile_seconds(ctx)


def _log_train(ctx: Context, bar: "_StepBar", peak: float | None, kind: str) -> Callable[[Progress], None]:
    """metrics.jsonl's train record of the steps since the last one, and the progress bar's numbers; the
    window's seconds leave out evaluation, checkpoints and compilation inside it."""
    devices = ctx.mesh.devices.size

    def run(p: Progress) -> None:
        window = jax.device_get(p.window)  # waits for the window's steps
        compiling = _compile_seconds(ctx) - p.window_compile
        seconds = time.time() - p.window_start - p.window_paused - compiling
        stats = train_stats(window, seconds, peak, devices)
        for key in THROUGHPUT_SUMS:
            total = stats["step_seconds"] if key == "step_seconds" else sum(float(m[key]) for m in window)
            p.throughput[key] = p.throughput.get(key, 0.0) + total
        ctx.report.train(global_step=p.global_step, metrics=stats)
        bar.tqdm.set_postfix(loss=f"{stats['loss']:.4f}", ex_per_s=f"{stats['examples_per_s']:.1f}")
        _start_window(ctx, p)

    return run


def _evaluate_and_track(
    ctx: Context, features: dict, best_checkpoint: checkpointing.BestCheckpoint, bar: "_StepBar"
) -> Callable[[Progress], None]:
    """Dev (and the gap rule's train subset) scored; the stop rule and the best-on-dev record (saving a
    new best) updated from it."""

    def run(p: Progress) -> None:
        p.evaluated = evaluated = _evaluate(ctx, p.phase, p.state.params, features, p.step, p.global_step)
        dev, gap_metric = evaluated.dev.scores, gap_metric_of(ctx, p.phase)
        p.stop_reason = p.tracker.update(
            dev[ctx.primary_metric],
            train_score=evaluated.train_score,
            dev_score=dev.get(gap_metric),
            gap_metric=gap_metric,
        )
        where = {"phase": p.phase.name, "step": p.step, "global_step": p.global_step}
        new_best = improved_best(p.best, dev, ctx.primary_metric, **where)
        if new_best is not None:
            p.best = new_best
            with ctx.timer.phase("checkpoint_writes"):
                best_checkpoint.save(p.global_step, p.state.params, p.best)
        train_subset = (
            f" train_subset {gap_metric}={evaluated.train_score:.4f}"
            if evaluated.train_score is not None
            else ""
        )
        scores = " ".join(f"{k}={v:.4f}" for k, v in dev.items())
        bar.tqdm.write(f"{p.phase.name} step {p.step}: dev {scores}{train_subset}")

    return run


def _save(ctx: Context, periodic: checkpointing.PhaseCheckpoints) -> Callable[[Progress], None]:
    """The phase's resumable state: train state, stop tracker, best record, wall time."""

    def run(p: Progress) -> None:
        meta = {"stop": p.tracker.state_dict(), "best": p.best, "wall_time_s": p.wall_time()}
        with ctx.timer.phase("checkpoint_writes"):
            periodic.save(p.step, p.state.as_dict(), meta)

    return run


def periodic_actions(
    ctx: Context, phase: phases.Phase, checkpoints: _Checkpoints, features: dict, bar: "_StepBar"
) -> list[PeriodicAction]:
    peak = device_peak()
    """What runs after a step, in this order, each at its cadence: the train log, the dev evaluation
    (with the stop rule and the best checkpoint), the periodic checkpoint (also when preempted, so the
    stop loses nothing), then the observer's `step_ended`."""
    spec, n = ctx.spec, phase.num_steps
    return [
        PeriodicAction("log", lambda p: due(p.step, spec.log_every_steps, n), _log_train(ctx, bar, *peak)),
        PeriodicAction(
            "evaluate",
            lambda p: due(p.step, spec.eval_every_steps, n),
            _evaluate_and_track(ctx, features, checkpoints.best, bar),
        ),
        PeriodicAction(
            "checkpoint",
            lambda p: p.step % spec.checkpoint_every_steps == 0 or p.preempted,
            _save(ctx, checkpoints.periodic),
        ),
        PeriodicAction(
            "observer",
            lambda p: True,
            lambda p: ctx.observer.step_ended(p.phase.name, p.step),
            reads_params=False,
        ),
    ]


def device_peak() -> tuple[float | None, str]:
    """The devices' bf16 peak FLOP/s (None where unknown, as on CPU) and their kind."""
    kind = jax.devices()[0].device_kind
    return flops.peak_flops(kind), kind


def device_peak_and_devices(ctx: Context) -> tuple[float | None, int, str]:
    peak, kind = device_peak()
    return peak, ctx.mesh.devices.size, kind


# Periodic actions whose time is not training time: the log window leaves them out.
_PAUSES_WINDOW = frozenset({"evaluate", "checkpoint"})


def _phase_end(
    ctx: Context, progress: Progress, features: dict[str, feature_cache.FeatureCache], frozen_backbone: bool
) -> dict:
    """The phase's record (results.json's `phases` entry), with the boundary measurements of a
    frozen-backbone phase (also written to metrics.jsonl); the last step's evaluation is reused when
    there is one."""
    phase, step, evaluated = progress.phase, progress.step, progress.evaluated
    measured = None
    if frozen_backbone:
        with ctx.timer.phase("evaluation"):
            measured = boundaries.measure(
                ctx.evaluator,
                ctx.datasets,
                ctx.task.metrics,
                progress.state.params,
                features=features,
                dev=evaluated.dev if evaluated else None,
                train=evaluated.train if evaluated else None,
                train_examples=gap_examples(ctx.spec, phase),
            )
        ctx.report.eval(
            phase=phase.name,
            step=step,
            global_step=progress.global_step,
            split="boundary",
            metrics={k: v for k, v in measured.items() if isinstance(v, float)},
        )
    noise = _stopped_on_noise(ctx, phase, progress.stop_reason, evaluated)
    stop_reason = progress.stop_reason or phases.budget_reason(phase.num_steps)
    log.info("%s stopped after %d steps: %s", phase.name, step, stop_reason)
    record = {
        "phase": phase.name,
        "steps": step,
        "end_global_step": progress.global_step,  # where the phase's boundary checkpoint sits
        "stop_reason": stop_reason,
        "wall_time_s": progress.wall_time(),
        "best": progress.best,
        "learning_rates": phase.learning_rates,
        "optimizer_state_bytes": optim.optimizer_state_bytes(progress.state.opt_state),
        "feature_cache_bytes": sum(cache.nbytes for cache in features.values()),
        # The caches this run's backbone computed (a shared one another run built costs it nothing):
        # training/compute.py charges their forward pass here.
        "feature_cache_built": sorted(split for split, cache in features.items() if cache.built),
    }
    if measured is not None:
        record["boundary"] = measured
    if noise:
        record["dev_degenerate_at_stop"] = noise
    return record


def parameter_counts(params, trained) -> dict[str, int]:
    """How many parameters the phase trained and how many the model has (results.json
    `phases[i].parameters`): a LoRA or BitFit phase trains a small share."""
    sizes = [int(x.size) for x in jax.tree.leaves(params)]
    marks = [bool(t) for t in jax.tree.leaves(trained)]
    return {"trained": sum(n for n, t in zip(sizes, marks, strict=True) if t), "total": sum(sizes)}


def _stopped_on_noise(
    ctx: Context, phase: phases.Phase, stop_reason: str | None, evaluated: _Evaluated | None
) -> list[str]:
    """The degenerate flags (degenerate.py) of the dev evaluation at which a stop rule ended the phase,
    warned about: a head that has not learned the task (e.g. below the majority class) is not
    overfitting, so a gap rule that fires there measured the noise of its small train subset."""
    selection = ctx.datasets[task_spec.selection_split(ctx.datasets)]
    if stop_reason is None or evaluated is None or not selection.labelled:
        return []
    dev = evaluated.dev
    records = ctx.task.prediction_records(selection, dev.rows)
    flags = degenerate.flags(records, dev.scores, ctx.task.objective.name)
    if flags:
        log.warning(
            "%s: a stop rule (%s) ended the phase while its dev predictions are degenerate (%s): the head "
            "had not learned the task, and the phase hands on an unlearned head; a larger gap_eval_examples "
            "(the train examples the gap is measured on), max_train_dev_gap or patience_evals (%s) lets it "
            "learn first",
            phase.name,
            stop_reason,
            ", ".join(flags),
            phase.source or phase.name,
        )
    return flags


def batch_feed(
    train: batching.Dataset,
    *,
    seed: int,
    phase_index: int,
    start_step: int,
    global_batch_size: int,
    order: batching.TrainOrder,
    with_index: bool,
) -> Iterator[batching.Batch]:
    """This process's rows of each global batch of a phase from `start_step` on, as host arrays: what the
    step loop feeds (benchmarks time the same feed). A pure function of (seed, phase, step), so a
    resumed phase replays the same batches. `order`: how the batches are drawn, padded and (packed) laid
    out for the step's devices and micro-batches; `with_index`: each row's example, which cached features
    are looked up by. Packed batches pad their rows up to the phase's row plan (`TrainOrder.for_phase`)."""
    phase_seed = batching.phase_seed(seed, phase_index)
    order = order.for_phase(train["lengths"], global_batch_size=global_batch_size, seed=phase_seed)
    batches = batching.train_batches(
        train,
        start_step=start_step,
        global_batch_size=global_batch_size,
        seed=phase_seed,
        buckets=order.buckets,
        scheme=order.scheme,
        group_batches=order.group_batches,
        with_index=with_index,
        groups=order.groups(global_batch_size),
        micro_batches=order.micro_batches,
        row_plan=order.row_plan,
    )
    for batch in batches:
        yield batching.process_slice(batch, jax.process_index(), jax.process_count())


def device_batches(
    ctx: Context, phase: phases.Phase, index: int, start_step: int, train_features
) -> Iterator[tuple[dict[str, jax.Array], int]]:
    """The phase's global batches on the devices from `start_step` on, with the rows and padded length
    the encoder computes: what
    the prefetch thread makes ready while earlier steps run. A phase that reads cached features runs
    no encoder, so it draws unpacked batches (TrainOrder.unpacked)."""
    order = ctx.train_order if train_features is None else ctx.train_order.unpacked
    batches = batch_feed(
        ctx.datasets["train"].arrays,
        seed=ctx.spec.seed,
        phase_index=index,
        start_step=start_step,
        global_batch_size=ctx.global_batch_size,
        order=order,
        with_index=train_features is not None,
    )
    for local in batches:
        if train_features is not None:
            local = train_features.attach(local)
        # The rows the encoder computes: a packed batch's packed rows (the same count on every host).
        packed = local.get("packed_input_ids")
        rows = ctx.global_batch_size if packed is None else packed.shape[0] * jax.process_count()
        yield sharding.put_batch(local, ctx.mesh), rows, int(local["input_ids"].shape[1])


def run_phase(
    ctx: Context,
    phase: phases.Phase,
    index: int,
    params,
    global_offset: int,
    best: dict,
    *,
    trained,
    frozen: str,
) -> PhaseResult:
    """Trains one phase to its stop, resuming from its latest checkpoint; `trained` marks the parameters
    the phase's rules train, `frozen` fingerprints the others (checkpointing.py). `best`: the run's
    best-on-dev record so far."""
    phase_step = build_run_phase_step(
        ctx.spec,
        phase,
        index,
        params,
        graphdef=ctx.graphdef,
        mesh=ctx.mesh,
        train=ctx.datasets["train"].arrays,
        global_batch_size=ctx.global_batch_size,
    )
    checkpoints = _Checkpoints.open(ctx, phase, trained=trained, frozen=frozen)
    progress = _restore_or_start(ctx, phase, phase_step, checkpoints, params, global_offset, best)

    preemption.install_sigterm_flag()
    progress.started = time.time()
    frozen_backbone = not ctx.spec.encoder.trains(phase)
    # Built before the first step donates the state: its backbone is the phase's frozen one.
    with ctx.timer.phase("feature_cache"):  # built, or opened (shared by another run)
        features = feature_caches(ctx, phase, progress.state.params) if frozen_backbone else {}
    train_features = features["train"] if phase.feature_cache else None
    _start_window(ctx, progress)  # the first log's rates: steps only, not the cache build
    bar = _StepBar(phase, progress.step)
    actions = periodic_actions(ctx, phase, checkpoints, features, bar)
    step_flops = functools.lru_cache(compute.step_flops_of(ctx.spec, phase))
    feed = prefetch.Prefetch(device_batches(ctx, phase, index, progress.step, train_features), PREFETCH_DEPTH)
    try:
        while progress.stop_reason is None and progress.step < phase.num_steps:
            device_batch, rows, length = next(feed)
            ctx.observer.step_started(phase.name, progress.step)
            logs = due(progress.step + 1, ctx.spec.log_every_steps, phase.num_steps)
            progress.state, step_metrics = phase_step.train_step(
                progress.state, device_batch, with_norms=logs
            )
            progress.step += 1
            progress.window.append(
                {
                    **step_metrics,
                    "examples": ctx.global_batch_size,
                    "padded_tokens": rows * length,
                    "flops": step_flops(rows, length),
                }
            )
            bar.dispatched(step_metrics["loss"])

            progress.preempted = preemption.should_stop(progress.global_step)  # every step, every process
            progress.evaluated = None
            due_now = [action for action in actions if action.due(progress)]
            if any(action.reads_params for action in due_now):
                # Before anything reads the parameters: NaN is never logged as progress, evaluated, saved.
                _raise_if_nonfinite(progress.state, phase.name, checkpoints)
                bar.waited()
            for action in due_now:
                if action.name in _PAUSES_WINDOW:
                    paused, compiled = time.time(), _compile_seconds(ctx)
                    action.run(progress)
                    progress.window_paused += time.time() - paused
                    progress.window_compile += _compile_seconds(ctx) - compiled  # counted in the pause
                else:
                    action.run(progress)
            if progress.preempted:
                checkpoints.close()
                bar.tqdm.close()  # before the message, so that it is the last line
                raise preemption.stopped(f"{phase.name} step {progress.step}")
    finally:
        feed.close()
    bar.tqdm.close()
    with ctx.timer.phase("checkpoint_writes"):  # waits for background writes
        checkpoints.close()

    boundaries.check_frozen(phase.name, progress.state.params, trained, frozen)
    record = _phase_end(ctx, progress, features, frozen_backbone)
    record["parameters"] = parameter_counts(progress.state.params, trained)
    record["throughput"] = throughput_record(progress.throughput, *device_peak_and_devices(ctx))
    # Cached features may round differently from the backbone's own outputs: only an evaluation without
    # them scored exactly what final scoring would.
    dev_at_end = progress.evaluated.dev if progress.evaluated is not None and not features else None
    return PhaseResult(progress.state.params, record, dev_at_end)

"""Orchestration only: mesh, data, model, then `for phase in phases`.

`run(config, workdir)` is what the command line, the Colab notebook and the tests call. Rerunning it with
the same workdir resumes where the last run stopped (see checkpointing.py for the order).
"""

import dataclasses
import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from tqdm import tqdm

from stackft_jax import (
    calibration,
    checkpointing,
    degenerate,
    evaluation,
    feature_cache,
    optim,
    phases,
    preemption,
    sharding,
    spec,
    steps,
    timing,
    workdirs,
)
from stackft_jax.data import batching, task_spec, tokenization
from stackft_jax.models import bert
from stackft_jax.models.task_model import TaskModel
from stackft_jax.objectives import Objective
from stackft_jax.report import RunReport
from stackft_jax.spec import RunSpec

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")


@dataclasses.dataclass
class Context:
    """What every phase shares: built once in `run`."""

    spec: RunSpec
    workdir: Path
    mesh: jax.sharding.Mesh
    task: task_spec.TaskSpec
    datasets: dict[str, task_spec.Split]
    graphdef: nnx.GraphDef
    buckets: tuple[int, ...]
    global_batch_size: int
    eval_global_batch_size: int
    report: RunReport
    evaluator: evaluation.Evaluator
    timer: timing.RunTimer
    # Per phase run in this process: its dev evaluation when it was taken on the parameters the phase
    # ends with (at its last step), so the final scoring need not evaluate the same parameters again.
    dev_at_phase_end: dict[str, evaluation.Evaluation] = dataclasses.field(default_factory=dict)
    param_names: tuple[str, ...] = ()  # '/'-joined parameter paths, which phases' rules label
    observer: "LoopObserver" = dataclasses.field(default_factory=lambda: LoopObserver())

    @property
    def primary_metric(self) -> str:
        return self.task.metrics[0]


class LoopObserver:
    """Told where the training loop is; subclass it to watch a run (benchmarks/compile_count.py
    attributes each compilation to a phase and step). The base class does nothing."""

    def phase_started(self, name: str) -> None:
        """`name` starts or resumes: its optimizer state, feature cache and first steps follow."""

    def step_started(self, phase: str, step: int) -> None:
        """The batch of `step` (0-based within the phase) goes to the train step."""

    def phase_ended(self, name: str) -> None:
        """`name` trained to its stop (its boundary measurements and checkpoint follow)."""


def check_config(config: ml_collections.ConfigDict) -> None:
    """Fails early, naming the config key, before any expensive work (spec.resolve's checks)."""
    spec.resolve(config)


def load_datasets(run_spec: RunSpec, task: task_spec.TaskSpec, tokenizer) -> dict[str, task_spec.Split]:
    """Train, dev and (when given as a local file) test, read and encoded; an unlabelled test split
    is predicted but not scored."""
    cache_dir = run_spec.data.cache_dir or os.environ.get(
        "STACKFT_JAX_CACHE", str(Path.home() / ".cache" / "stackft_jax")
    )
    # A test split is evaluated only when given as a local file; dev may be held out of train.
    paths = {split: run_spec.data.file(split) for split in SPLITS}
    datasets = {}
    for split, examples in task_spec.read_splits(task, paths).items():
        datasets[split] = task_spec.load_split(
            task,
            split,
            paths[split],
            examples=examples,
            tokenizer=tokenizer,
            max_seq_length=run_spec.max_seq_length,
            options=task.encoding_options(run_spec.data.as_mapping()),
            cache_dir=Path(cache_dir) / "tokenized",
        )
    if "test" in datasets and not datasets["test"].labelled:
        log.info("test split has no labels: predicted, not scored")
    return datasets


_DROPOUT_KEYS = {"hidden_dropout_prob", "attention_probs_dropout_prob"}


def backbone_config(config: RunSpec | ml_collections.ConfigDict, model_dir: Path) -> bert.BertConfig:
    """The checkpoint's encoder config (any family of bert.FAMILIES) with `config.model.config_overrides`
    and `dropout_rate` applied (`config`: a run spec, or a config: both have these keys)."""
    overrides = {k: v for k, v in config.model.config_overrides.items() if v}
    if config.model.dropout_rate is not None:
        overrides.update(dict.fromkeys(_DROPOUT_KEYS, config.model.dropout_rate))
    return dataclasses.replace(bert.BertConfig.from_pretrained(model_dir), **overrides)


def build_model(
    config: RunSpec | ml_collections.ConfigDict, task, model_dir: Path
) -> tuple[TaskModel, bert.BertConfig]:
    bert_config = backbone_config(config, model_dir)
    model = TaskModel(
        bert_config,
        config.head,
        num_outputs=task.num_outputs,
        output_names=task.output_names,
        scalar_mix=config.model.scalar_mix,
        dtype=jnp.dtype(config.model.dtype),
        rngs=nnx.Rngs(params=config.seed),
    )
    if config.model.init == "pretrained":
        if {k for k, v in config.model.config_overrides.items() if v} - _DROPOUT_KEYS:
            raise ValueError(
                "config.model.config_overrides change the architecture: they need config.model.init='random'"
            )
        bert.load_pretrained_weights(model.backbone, model_dir, allow_pickle=config.model.allow_pickle)
    return model, bert_config


def gap_examples(run_spec: RunSpec, phase: phases.Phase) -> int:
    """How many train examples (the first ones) a frozen-backbone phase scores: the gap rule's, else the
    boundary measurement's."""
    return phase.gap_eval_examples or run_spec.boundary_train_examples


def initial_model(
    run_spec: RunSpec, model_dir: Path, mesh: jax.sharding.Mesh
) -> tuple[nnx.GraphDef, Any, bert.BertConfig]:
    """The run's model before its first phase: (graph, parameters replicated over `mesh`, encoder
    config); what benchmarks build too."""
    model, bert_config = build_model(run_spec, run_spec.task, model_dir)
    graphdef, state = nnx.split(model)
    params = jax.device_put(nnx.to_pure_dict(state), sharding.replicated(mesh))
    return graphdef, params, bert_config


def feature_caches(ctx: Context, phase: phases.Phase, params) -> dict[str, feature_cache.FeatureCache]:
    """The frozen backbone's features for `phase`: dev, and the train split's (every example with
    `phase.feature_cache`, which the steps train on; else only the first `gap_examples`, which the
    train/dev gap scores). Every evaluation of the phase reads them, so the backbone runs once per
    split and phase, not at every evaluation. Built once per workdir (a resumed run reopens them), or
    once for every run sharing `phase.feature_cache_dir`."""
    shared = phase.feature_cache_dir not in ("", "none")  # "none": the workdir, also in a grid
    train = ctx.datasets["train"].arrays
    if not phase.feature_cache:
        limit = min(gap_examples(ctx.spec, phase), ctx.datasets["train"].num_rows)
        train = {key: value[:limit] for key, value in train.items()}
    caches = {}
    for split, arrays in (("train", train), ("dev", ctx.datasets["dev"].arrays)):
        # One folder per process: hosts sharing a filesystem must not replace each other's files
        # (a shared folder is content-addressed and never replaces one).
        name = "train_subset" if split == "train" and not phase.feature_cache else split
        name = name if jax.process_count() == 1 else f"{name}.process{jax.process_index()}"
        caches[split] = feature_cache.open_or_build(
            phase.feature_cache_dir if shared else ctx.workdir / "feature_cache" / phase.name / name,
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


class PhaseStep(NamedTuple):
    init_state: Callable  # params -> TrainState.as_dict() (a dict: checkpoints restore into it)
    jitted_step: Callable  # jitted (TrainState, device batch, dropout_key) -> (TrainState, metrics)
    dropout_key: jax.Array

    def train_step(self, state, batch):
        """One step with the phase's dropout key; donates `state`."""
        return self.jitted_step(state, batch, self.dropout_key)


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
) -> PhaseStep:
    """The phase's optimizer state initialiser and jitted train step (also what benchmarks time)."""
    replicated = sharding.replicated(mesh)
    tx, labels = optim.build_optimizer(
        params,
        rules=phase.rules,
        learning_rates=phase.learning_rates,
        num_steps=phase.num_steps,
        warmup_steps=phase.warmup_steps,
        schedule=phase.schedule,
        weight_decay=phase.weight_decay,
        max_grad_norm=max_grad_norm,
    )
    trainable = optim.trainable_mask(labels)

    @functools.partial(jax.jit, out_shardings=replicated)
    def init_state(p):
        return steps.TrainState.create(p, tx.init(p)).as_dict()

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
        )

    # The dropout key is an argument, not a constant baked into the program: runs that differ only in
    # their seed compile the same program (one persistent-cache entry serves them all).
    jitted_train_step = jax.jit(
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
    return PhaseStep(init_state, jitted_train_step, dropout_key)


def _raise_if_nonfinite(
    state: steps.TrainState,
    phase_name: str,
    checkpoints: checkpointing.PhaseCheckpoints,
    best_checkpoint: checkpointing.BestCheckpoint,
) -> None:
    bad_step = int(state.first_nonfinite_step)
    if bad_step < 0:
        return
    checkpoints.close()
    best_checkpoint.close()
    latest = checkpoints.manager.latest_step()
    last_good = (
        f"the last good checkpoint is {checkpoints.manager.directory / str(latest)}"
        if latest is not None
        else f"{phase_name} has no checkpoint yet (a rerun starts it again from its initial parameters)"
    )
    raise FloatingPointError(
        f"{phase_name} step {bad_step + 1}: the training loss or gradient norm is not finite "
        f"(NaN or inf). That step and later ones were not applied, and nothing after it was evaluated "
        f"or saved; {last_good}. Try a lower learning rate, float32 (config.model.dtype) or "
        "gradient clipping (config.max_grad_norm)."
    )


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
) -> tuple[Any, dict]:
    """Trains one phase to its stop; returns its final parameters and its record. `trained` marks the
    parameters the phase's rules train; `frozen` fingerprints the others (checkpointing.py)."""
    config, mesh = ctx.spec, ctx.mesh
    replicated = sharding.replicated(mesh)
    phase_step = build_phase_step(
        phase,
        index,
        params,
        graphdef=ctx.graphdef,
        objective=ctx.task.objective,
        mesh=mesh,
        seed=config.seed,
        max_grad_norm=config.max_grad_norm,
    )
    init_state = phase_step.init_state

    checkpoints = checkpointing.PhaseCheckpoints(
        ctx.workdir,
        phase.name,
        trained=trained,
        frozen=frozen,
        max_to_keep=config.keep_checkpoints,
        async_save=config.async_checkpointing,
    )
    best_checkpoint = checkpointing.BestCheckpoint(ctx.workdir, async_save=config.async_checkpointing)
    tracker = phases.StopTracker(phase.stop)
    wall_time = 0.0
    abstract = checkpointing.abstract_like(jax.eval_shape(init_state, params), replicated)
    restored = checkpoints.restore_latest(abstract, params)
    if restored is not None:
        latest, state, meta = restored
        best_checkpoint.discard_between(global_offset + latest, global_offset + phase.num_steps)
        tracker.load_state_dict(meta["stop"])
        best, wall_time = meta["best"], meta["wall_time_s"]
        log.info("resumed %s at step %d", phase.name, latest)
    else:
        state = init_state(params)
    start_step = int(state["step"])
    # Drop what a killed run logged in this phase after its last checkpoint, so it is written once.
    ctx.report.keep_records(lambda r: r["phase"] != phase.name or r["step"] <= start_step)

    state = steps.TrainState(**state)
    log.info(
        "%s: %d steps, trainable groups %s, optimizer state %.1f MB",
        phase.name,
        phase.num_steps,
        phase.learning_rates,
        optim.optimizer_state_bytes(state.opt_state) / 2**20,
    )

    def meta() -> dict:
        return {
            "stop": tracker.state_dict(),
            "best": best,
            "wall_time_s": wall_time + time.time() - started,
        }

    def save(step: int) -> None:
        with ctx.timer.phase("checkpoint_writes"):
            checkpoints.save(step, state.as_dict(), meta())

    preemption.install_sigterm_flag()
    started = time.time()
    # Built before the first step donates the state: its backbone is the phase's frozen one.
    with ctx.timer.phase("feature_cache"):  # built, or opened (shared by another run)
        frozen_backbone = not phases.trains_backbone(phase, ctx.param_names)
        features = feature_caches(ctx, phase, state.params) if frozen_backbone else {}
    train_features = features["train"] if phase.feature_cache else None
    step, stop_reason = start_step, None
    eval_now = False  # whether the last step run was evaluated on dev
    uncounted = None  # the last dispatched step's loss, until the bar counts that step
    window: list[dict] = []
    window_start = time.time()
    progress = tqdm(
        total=phase.num_steps,
        initial=step,
        desc=phase.name,
        dynamic_ncols=True,
        disable=jax.process_index() != 0,
    )
    batches: Iterator = batching.train_batches(
        ctx.datasets["train"].arrays,
        start_step=step,
        global_batch_size=ctx.global_batch_size,
        seed=config.seed * 1000 + index,
        buckets=ctx.buckets,
        with_index=train_features is not None,
    )
    while stop_reason is None and step < phase.num_steps:
        local = batching.process_slice(next(batches), jax.process_index(), jax.process_count())
        ctx.observer.step_started(phase.name, step)
        if train_features is not None:
            local = train_features.attach(local)
        state, step_metrics = phase_step.train_step(state, sharding.put_batch(local, mesh))
        step += 1
        window.append(step_metrics)
        # The bar counts completed steps: the previous one, waited for while this one is queued behind it.
        if uncounted is not None:
            jax.block_until_ready(uncounted)
            progress.update(1)
        uncounted = step_metrics["loss"]

        log_now = step % config.log_every_steps == 0 or step == phase.num_steps
        eval_now = step % config.eval_every_steps == 0 or step == phase.num_steps
        stop_now = preemption.should_stop(global_offset + step)  # every step, on every process
        save_now = step % config.checkpoint_every_steps == 0 or stop_now
        if log_now or eval_now or save_now:
            # Before anything reads the parameters: NaN is never logged as progress, evaluated, saved.
            _raise_if_nonfinite(state, phase.name, checkpoints, best_checkpoint)
            progress.update(1)  # that waited for this step
            uncounted = None

        if log_now:
            host = jax.device_get(window)
            loss = float(np.mean([m["loss"] for m in host]))
            rate = len(host) * ctx.global_batch_size / max(time.time() - window_start, 1e-9)
            train_stats = {
                "loss": loss,
                "grad_norm": float(np.mean([m["grad_norm"] for m in host])),
                "examples_per_s": rate,
                **{
                    key: float(np.mean([m[key] for m in host]))
                    for key in host[0]
                    if key.startswith(("grad_norm/", "update_norm/"))
                },
            }
            if "correct" in host[0]:  # objectives whose predictions are right or wrong
                train_stats["running_accuracy"] = sum(float(m["correct"]) for m in host) / sum(
                    float(m["count"]) for m in host
                )
            ctx.report.train(global_step=global_offset + step, metrics=train_stats)
            progress.set_postfix(loss=f"{loss:.4f}", ex_per_s=f"{rate:.1f}")
            window, window_start = [], time.time()

        if eval_now:
            with ctx.timer.phase("evaluation"):
                dev_evaluation = ctx.evaluator.evaluate(
                    state.params, ctx.datasets["dev"], features=features.get("dev")
                )
            dev = dev_evaluation.scores
            ctx.report.eval(
                phase=phase.name,
                step=step,
                global_step=global_offset + step,
                split="dev",
                metrics=dev,
            )
            train_score = None  # the task's gap metric on the train subset
            if phase.gap_eval_examples:
                with ctx.timer.phase("gap_evaluation"):
                    train_evaluation = ctx.evaluator.evaluate(
                        state.params,
                        ctx.datasets["train"],
                        limit=phase.gap_eval_examples,
                        features=features.get("train"),
                    )
                train_eval = train_evaluation.scores
                ctx.report.eval(
                    phase=phase.name,
                    step=step,
                    global_step=global_offset + step,
                    split="train_subset",
                    metrics=train_eval,
                )
                train_score = train_eval.get(ctx.task.gap_metric)
            stop_reason = tracker.update(
                dev[ctx.primary_metric],
                train_score=train_score,
                dev_score=dev.get(ctx.task.gap_metric),
                gap_metric=ctx.task.gap_metric,
            )
            if best.get("value") is None or dev[ctx.primary_metric] > best["value"]:
                best = {
                    "value": dev[ctx.primary_metric],
                    "metric": ctx.primary_metric,
                    "phase": phase.name,
                    "step": step,
                    "global_step": global_offset + step,
                    "dev": dev,
                }
                with ctx.timer.phase("checkpoint_writes"):
                    best_checkpoint.save(global_offset + step, state.params, best)
            progress.write(
                f"{phase.name} step {step}: dev "
                + " ".join(f"{k}={v:.4f}" for k, v in dev.items())
                + (
                    f" train_subset {ctx.task.gap_metric}={train_score:.4f}"
                    if train_score is not None
                    else ""
                )
            )

        if save_now:
            save(step)
        if stop_now:
            checkpoints.close()
            best_checkpoint.close()
            progress.close()  # before the message, so that it is the last line
            raise preemption.stopped(f"{phase.name} step {step}")
        if preemption.kill_requested(phase.name, step):
            os.kill(os.getpid(), signal.SIGKILL)
    progress.close()
    with ctx.timer.phase("checkpoint_writes"):  # waits for background writes
        checkpoints.close()
        best_checkpoint.close()

    if checkpointing.frozen_fingerprint(state.params, trained) != frozen:  # what checkpoints rely on
        raise checkpointing.FrozenParametersChanged(f"{phase.name} changed parameters its rules freeze")
    if eval_now and not features:
        # The loop ended on an evaluation of the backbone's own outputs (cached features may round
        # differently): it scored exactly the parameters and computation this phase's final scoring would.
        ctx.dev_at_phase_end[phase.name] = dev_evaluation
    boundary = None
    if not phases.trains_backbone(phase, ctx.param_names):
        with ctx.timer.phase("evaluation"):
            boundary = boundary_measurements(
                ctx,
                state.params,
                features=features,
                dev=dev_evaluation if eval_now else None,
                train=train_evaluation if eval_now and phase.gap_eval_examples else None,
                train_examples=gap_examples(config, phase),
            )
        ctx.report.eval(
            phase=phase.name,
            step=step,
            global_step=global_offset + step,
            split="boundary",
            metrics={k: v for k, v in boundary.items() if isinstance(v, float)},
        )
    stop_reason = stop_reason or f"step budget of {phase.num_steps} steps"
    log.info("%s stopped after %d steps: %s", phase.name, step, stop_reason)
    record = {
        "phase": phase.name,
        "steps": step,
        "end_global_step": global_offset + step,  # where the phase's boundary checkpoint sits
        "stop_reason": stop_reason,
        "wall_time_s": wall_time + time.time() - started,
        "best": best,
        "learning_rates": phase.learning_rates,
        "optimizer_state_bytes": optim.optimizer_state_bytes(state.opt_state),
        "feature_cache_bytes": sum(cache.nbytes for cache in features.values()),
    }
    if boundary is not None:
        record["boundary"] = boundary
    return state.params, record


def _probabilities_and_labels(split: task_spec.Split, done: evaluation.Evaluation):
    probabilities = done.rows["probabilities"]
    return probabilities, split.arrays["labels"][: len(probabilities)]


def _norm_on_host(tree) -> float:
    """The global L2 norm of replicated arrays, from this process's copy (eager device ops would compile
    one program each)."""
    leaves = [np.asarray(x.addressable_data(0), np.float64) for x in jax.tree.leaves(tree)]
    return float(np.sqrt(sum(np.sum(np.square(x)) for x in leaves)))


def boundary_measurements(
    ctx: Context,
    params,
    *,
    features: dict[str, feature_cache.FeatureCache],
    dev: evaluation.Evaluation | None,
    train: evaluation.Evaluation | None,
    train_examples: int,
) -> dict[str, Any]:
    """What a frozen-backbone phase hands on: the head's parameter norm (Tomihari & Sato 2024 tie LP-FT's
    behaviour to it), dev expected calibration error (classification; else None) and the train/dev gap
    per metric (train subset minus dev). `dev`/`train`: evaluations of `params` already taken."""
    if dev is None:
        dev = ctx.evaluator.evaluate(params, ctx.datasets["dev"], features=features.get("dev"))
    if train is None:
        train = ctx.evaluator.evaluate(
            params, ctx.datasets["train"], limit=train_examples, features=features.get("train")
        )
    measured = {
        "head_param_norm": _norm_on_host(params["head"]),
        "dev_ece": (
            calibration.expected_calibration_error(*_probabilities_and_labels(ctx.datasets["dev"], dev))
            if "probabilities" in dev.rows
            else None
        ),
    }
    for metric in ctx.task.metrics:
        if dev.scores.get(metric) is not None and train.scores.get(metric) is not None:
            measured[f"train_dev_gap_{metric}"] = float(train.scores[metric] - dev.scores[metric])
    train_rows = len(train.rows["predictions"])
    return {**measured, "dev": dev.scores, "train_subset": train.scores, "train_examples": train_rows}


def _best_or_last(workdir: Path, last_params, best: dict, mesh: jax.sharding.Mesh) -> tuple[Any, str]:
    """The best-on-dev parameters (checkpoints/best), or the last ones with a warning when the best
    checkpoint is unreadable (it is then moved aside) or missing."""
    abstract = checkpointing.abstract_like(last_params, sharding.replicated(mesh))
    with checkpointing.BestCheckpoint(workdir, async_save=False) as best_checkpoint:
        restored = best_checkpoint.restore_latest(abstract)
    if restored is None or restored[0] != best.get("global_step"):
        log.warning(
            "config.final_params=best, but the best checkpoint (global step %s) is unreadable or "
            "missing: scoring the last parameters instead",
            best.get("global_step"),
        )
        return last_params, "last (best checkpoint unreadable)"
    global_step, params = restored
    return params, f"best (global step {global_step})"


def run(
    config: ml_collections.ConfigDict | RunSpec,
    workdir: str | Path,
    *,
    allow_config_change: bool = False,
    observer: "LoopObserver | None" = None,
) -> dict[str, Any]:
    """Trains and evaluates every phase of the run `config` describes (a config, resolved here, or a
    spec.resolve result); returns (and writes) results.json.

    The workdir belongs to this run: a rerun with the same config resumes, one whose results-relevant
    keys differ is refused unless `allow_config_change` (workdirs.py), and so is a second live process.
    `observer` is told which phase and step the loop is at (benchmarks/compile_count.py).
    """
    run_spec = config if isinstance(config, RunSpec) else spec.resolve(config)
    if "://" in str(workdir):
        raise ValueError(
            f"--workdir={workdir}: use a local or shared-filesystem folder; object stores "
            "are not supported for metrics.jsonl/results.json (launch/run.sh can mirror "
            "a workdir to a bucket with BACKUP_URL)"
        )
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    mesh = sharding.make_mesh()
    with workdirs.exclusive(workdir):
        global_batch = sharding.global_batch_size(run_spec.per_device_batch_size, mesh)
        record = {"config": run_spec.raw, "global_batch_size": global_batch}

        def binding(r: dict) -> dict:
            # Both sides resolved: only what the run uses binds it, and a key newer than the record
            # reads as its value now (a record lacking it predates it).
            if r is record:
                form = spec.binding_form(run_spec)
            else:
                try:
                    form = spec.recorded_binding_form(r["config"], run_spec.raw)
                except ValueError as error:
                    raise workdirs.ConfigMismatch(
                        f"{workdir}/{workdirs.CONFIG_FILE}: its recorded config no longer resolves "
                        f"({error}); use a new --workdir"
                    ) from None
            return {**form, "global_batch_size": r.get("global_batch_size")}

        changed = workdirs.bind_config(workdir, record, allow_change=allow_config_change, compare=binding)
        if workdirs.restarts(changed):  # another phase plan: the old one's checkpoints and best go
            workdirs.set_aside_progress(workdir, f"--allow_config_change changed {sorted(changed)[0]}")
        data_files = {f"data.{split}_file": run_spec.data.file(split) for split in SPLITS}
        workdirs.bind_data(workdir, data_files, allow_change=allow_config_change)
        with timing.RunTimer() as timer:
            results = _run(run_spec, workdir, mesh, timer, observer or LoopObserver())
            if jax.process_index() == 0:
                timer.write(workdir)  # this process's phases (benchmarks/time_to_result.py)
        closing = degenerate.warning(results["degenerate"])
        if closing is not None:
            log.warning("%s", closing)
        return results


def _run(
    run_spec: RunSpec,
    workdir: Path,
    mesh: jax.sharding.Mesh,
    timer: timing.RunTimer,
    observer: "LoopObserver",
) -> dict[str, Any]:
    task = run_spec.task
    model_dir = bert.resolve_model_dir(run_spec.model.name_or_path)
    encoder = backbone_config(run_spec, model_dir)
    if run_spec.max_seq_length > encoder.max_sequence_length:
        raise ValueError(
            f"config.max_seq_length={run_spec.max_seq_length} exceeds the {encoder.max_sequence_length} "
            f"tokens the model in {model_dir} holds (max_position_embeddings="
            f"{encoder.max_position_embeddings} in its config.json)"
        )
    with timer.phase("data"):
        datasets = load_datasets(run_spec, task, tokenization.load_tokenizer(model_dir))
    with timer.phase("model_load"):
        graphdef, params, bert_config = initial_model(run_spec, model_dir, mesh)

    global_batch = sharding.global_batch_size(run_spec.per_device_batch_size, mesh)
    buckets = batching.length_buckets(run_spec.max_seq_length)
    eval_global_batch = sharding.global_batch_size(run_spec.eval_per_device_batch_size, mesh)
    ctx = Context(
        spec=run_spec,
        workdir=workdir,
        mesh=mesh,
        task=task,
        datasets=datasets,
        graphdef=graphdef,
        buckets=buckets,
        global_batch_size=global_batch,
        eval_global_batch_size=eval_global_batch,
        report=RunReport(workdir),
        evaluator=evaluation.build_evaluator(
            task, graphdef, mesh, global_batch_size=eval_global_batch, buckets=buckets
        ),
        timer=timer,
        observer=observer,
    )
    steps_per_epoch = batching.steps_per_epoch(datasets["train"].num_rows, global_batch)
    plan = run_spec.plan(
        steps_per_epoch, bert_config.num_hidden_layers, has_pooler=bert_config.family.has_pooler
    )
    ctx.param_names = tuple(optim.path_str(path) for path, _ in jax.tree_util.tree_leaves_with_path(params))
    phases.check_rules(plan, ctx.param_names)  # every phase's, before the first one trains
    log.info(
        "%s on %d devices, global batch %d, %d train rows (%d steps/epoch), phases %s",
        run_spec.strategy,
        mesh.size,
        global_batch,
        datasets["train"].num_rows,
        steps_per_epoch,
        [(p.name, p.num_steps) for p in plan],
    )

    records, best, global_offset = [], {}, 0
    for index, phase in enumerate(plan):
        # Checkpoints store what the phase trains; the rest is `params` as they are now (a fingerprint).
        trained = optim.trainable_mask(optim.label_params(params, phase.rules))
        frozen = checkpointing.frozen_fingerprint(params, trained)
        finished = checkpointing.load_phase_end(
            workdir, phase.name, params, trained, frozen=frozen, sharding=sharding.replicated(mesh)
        )
        if finished is not None:
            params, record = finished
            log.info("%s already finished (%s)", phase.name, record["stop_reason"])
        else:
            ctx.observer.phase_started(phase.name)
            try:
                # Ctrl-C in a phase saves like SIGTERM (preemption.py).
                with timer.phase("train_steps"), preemption.sigint_saves():  # less evals, saves, compiles
                    params, record = run_phase(
                        ctx, phase, index, params, global_offset, best, trained=trained, frozen=frozen
                    )
            finally:
                ctx.observer.phase_ended(phase.name)
            with timer.phase("checkpoint_writes"):
                checkpointing.save_phase_end(workdir, phase.name, params, trained, record, frozen=frozen)
        # The boundary checkpoint replaces the phase's periodic ones (a lost boundary reruns the phase).
        checkpointing.discard_periodic(workdir, phase.name)
        records.append(record)
        best = record["best"]
        global_offset += record["steps"]

    final_started = time.time()
    scored = "last"
    if run_spec.final_params == "best":
        params, scored = _best_or_last(workdir, params, best, mesh)
    evaluations = {}
    if scored == "last" and plan[-1].name in ctx.dev_at_phase_end:
        evaluations["dev"] = ctx.dev_at_phase_end[plan[-1].name]  # these parameters, already scored
    with timer.phase("evaluation"):
        for name in ("dev", "test"):
            if name in datasets and name not in evaluations:
                evaluations[name] = ctx.evaluator.evaluate(params, datasets[name])
    written = {name: task.prediction_records(datasets[name], done.rows) for name, done in evaluations.items()}
    for name, split_records in written.items():
        ctx.report.predictions(name, split_records)
    final = {name: done.scores for name, done in evaluations.items() if datasets[name].labelled}
    calibrated = {}
    if run_spec.calibration_temperature:  # fitted on dev; test (when labelled) shows how well it carries
        labelled = {name: _probabilities_and_labels(datasets[name], evaluations[name]) for name in final}
        calibrated = {"calibration": calibration.temperature_report(labelled.pop("dev"), **labelled)}
    results = {
        "config": run_spec.raw,
        "task": task.describe(),
        "strategy": run_spec.strategy,
        "seed": run_spec.seed,
        "num_devices": mesh.size,
        "global_batch_size": global_batch,
        "phases": records,
        "final": final,
        # Per scored split, why its score says the model learned nothing ([]: it learned; degenerate.py).
        "degenerate": {name: degenerate.flags(written[name], scores) for name, scores in final.items()},
        "best": best,
        "data": {
            "label_names": list(task.output_names),
            "num_examples": {name: len(split.examples) for name, split in datasets.items()},
            # The fraction of train held out as dev; null: dev is its own file or hub split.
            "dev_held_out_fraction": (
                task.dev_fraction if task_spec.dev_is_held_out(task, run_spec.data.dev_file) else None
            ),
        },
        "final_params": scored,  # which parameters `final` scored: "last", or "best (global step N)"
        # What the result cost (the grid report's cost table): optimizer steps and training examples.
        "train_steps": sum(r["steps"] for r in records),
        "examples_seen": sum(r["steps"] for r in records) * global_batch,
        # Training and evaluation time summed over every process lifetime of this run (resumes too).
        "wall_time_s": sum(r["wall_time_s"] for r in records) + time.time() - final_started,
        **calibrated,
    }
    ctx.report.sort_records()
    ctx.report.results(results)
    ctx.report.close()
    return results

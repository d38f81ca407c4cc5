"""Orchestration only: set-up (workdir, mesh, data, model), then each phase (resumed when finished, else
trained), then the final scoring and results.json.

`run(config, workdir)` is what the command line, the Colab notebook and the tests call. Rerunning it with
the same workdir resumes where the last run stopped (see checkpointing.py for the order). Where the rest
lives: the step loop of one phase in loop.py, what a phase hands on at its end in boundaries.py, the
final scoring in scoring.py, the model in models/build.py, the workdir's binding in workdirs.py.
"""

import logging
import os
import time
from pathlib import Path
from typing import Any

import jax
import ml_collections

from stackft_jax.config import phases, spec
from stackft_jax.config.spec import RunSpec
from stackft_jax.data import batching, task_spec, tokenization
from stackft_jax.runtime import sharding, timing
from stackft_jax.runtime.cli_errors import DataError, UsageError
from stackft_jax.training import (
    build,
    checkpointing,
    compute,
    degenerate,
    evaluation,
    loop,
    optim,
    preemption,
    scoring,
    workdirs,
)
from stackft_jax.training.run_report import RunReport

log = logging.getLogger(__name__)


def run(
    config: ml_collections.ConfigDict | RunSpec,
    workdir: str | Path,
    *,
    allow_config_change: bool = False,
    observer: loop.LoopObserver | None = None,
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
    if workdir.exists() and not workdir.is_dir():
        raise UsageError(f"--workdir={workdir} is a file: a workdir is a folder (give a new path)")
    # Another tool's folder, a grid's, an export: refused before anything is written into it.
    workdirs.refuse_foreign(workdir, workdirs.RUN)
    build.resolve_encoder(run_spec)  # the model folder's checks (tokenizer, positions) before any write
    workdir.mkdir(parents=True, exist_ok=True)  # a read-only parent: one line (cli_errors, PermissionError)
    if not os.access(workdir, os.W_OK):  # exit 1, as a read-only parent (cli_errors: a read-only folder)
        raise DataError(f"--workdir={workdir} is not writable: the run writes its checkpoints there")
    mesh = sharding.make_mesh()
    # The effective batch: grad_accum_steps micro-batches per optimizer step (steps.train_step).
    global_batch = (
        sharding.global_batch_size(run_spec.per_device_batch_size, mesh) * run_spec.grad_accum_steps
    )
    with workdirs.exclusive(workdir):
        workdirs.bind_run(workdir, run_spec, global_batch_size=global_batch, allow_change=allow_config_change)
        with timing.RunTimer() as timer:
            ctx, params, plan = _set_up(run_spec, workdir, mesh, timer, observer or loop.LoopObserver())

            records, best, dev_at_end = [], {}, None
            # Ctrl-C while phases train or save their boundaries saves like SIGTERM (preemption.py).
            with preemption.sigint_saves():
                for index, phase in enumerate(plan):
                    global_offset = sum(r["steps"] for r in records)
                    params, record, dev_at_end = _resume_or_train(
                        ctx, phase, index, params, global_offset, best
                    )
                    records.append(record)
                    best = record["best"]

            scoring_started = time.time()
            final = scoring.score(
                run_spec,
                params,
                best=best,
                dev_at_end=dev_at_end,
                workdir=workdir,
                mesh=mesh,
                evaluator=ctx.evaluator,
                datasets=ctx.datasets,
                report=ctx.report,
                timer=timer,
            )
            results = scoring.results(
                run_spec,
                final,
                phase_records=records,
                best=best,
                datasets=ctx.datasets,
                num_devices=mesh.size,
                global_batch_size=global_batch,
                scoring_s=time.time() - scoring_started,
            )
            # What it cost, per phase (the same training/compute.run_compute derives for older runs).
            results[compute.RESULTS_KEY] = compute.of_results(
                run_spec, results, train_lengths=ctx.datasets["train"].arrays["lengths"]
            )
            ctx.report.sort_records()
            ctx.report.results(results)
            ctx.report.close()
            if jax.process_index() == 0:
                timer.write(workdir)  # this process's phases (benchmarks/time_to_result.py)
    closing = degenerate.warning(results["degenerate"])
    if closing is not None:
        log.warning("%s", closing)
    return results


def _set_up(
    run_spec: RunSpec,
    workdir: Path,
    mesh: jax.sharding.Mesh,
    timer: timing.RunTimer,
    observer: loop.LoopObserver,
) -> tuple[loop.Context, Any, list[phases.Phase]]:
    """What every phase shares, the model's initial parameters and the phase plan (every phase's rules
    checked against the parameters before the first one trains)."""
    model_dir, encoder = build.resolve_encoder(run_spec)
    with timer.phase("data"):
        datasets = _load_datasets(run_spec, tokenization.load_tokenizer(model_dir))
    tokenization.check_ids_fit(model_dir, encoder.vocab_size, {k: d.arrays for k, d in datasets.items()})
    with timer.phase("model_load"):
        graphdef, params, bert_config = build.initial_model(run_spec, model_dir, mesh)

    # The effective batch: grad_accum_steps micro-batches per optimizer step (steps.train_step).
    global_batch = (
        sharding.global_batch_size(run_spec.per_device_batch_size, mesh) * run_spec.grad_accum_steps
    )
    buckets = batching.length_buckets(run_spec.max_seq_length)
    eval_global_batch = sharding.global_batch_size(run_spec.eval_per_device_batch_size, mesh)
    param_names = tuple(optim.path_str(path) for path, _ in jax.tree_util.tree_leaves_with_path(params))
    ctx = loop.Context(
        spec=run_spec,
        workdir=workdir,
        mesh=mesh,
        datasets=datasets,
        graphdef=graphdef,
        param_names=param_names,
        buckets=buckets,
        train_order=run_spec.train_order,
        global_batch_size=global_batch,
        eval_global_batch_size=eval_global_batch,
        report=RunReport(workdir),
        evaluator=evaluation.build_evaluator(
            run_spec.task, graphdef, mesh, global_batch_size=eval_global_batch, buckets=buckets
        ),
        timer=timer,
        observer=observer,
    )
    steps_per_epoch = batching.steps_per_epoch(datasets["train"].num_rows, global_batch)
    plan = run_spec.plan(steps_per_epoch)
    phases.check_rules(plan, param_names)
    log.info(
        "%s on %d devices, global batch %d, %d train rows (%d steps/epoch), phases %s",
        run_spec.strategy,
        mesh.size,
        global_batch,
        datasets["train"].num_rows,
        steps_per_epoch,
        [(p.name, p.num_steps) for p in plan],
    )
    return ctx, params, plan


def _load_datasets(run_spec: RunSpec, tokenizer: tokenization.Tokenizer) -> dict[str, task_spec.Split]:
    """Train, dev and (when given as a local file) test, read and encoded; an unlabelled test split
    is predicted but not scored."""
    task = run_spec.task
    cache_dir = run_spec.data.cache_dir or os.environ.get(
        "STACKFT_JAX_CACHE", str(Path.home() / ".cache" / "stackft_jax")
    )
    # A test split is evaluated only when given as a local file; dev may be held out of train.
    paths = {split: run_spec.data.file(split) for split in spec.SPLITS}
    datasets = {}
    read = task_spec.read_splits(
        task,
        paths,
        selection_fraction=run_spec.data.selection_fraction,
        selection_seed=run_spec.data.selection_seed,
    )
    for split, examples in read.items():
        datasets[split] = task_spec.load_split(
            task,
            split,
            paths.get(split),
            examples=examples,
            tokenizer=tokenizer,
            max_seq_length=run_spec.max_seq_length,
            options=task.encoding_options(run_spec.data.as_mapping()),
            cache_dir=Path(cache_dir) / "tokenized",
        )
    if "test" in datasets and not datasets["test"].labelled:
        log.info("test split has no labels: predicted, not scored")
    return datasets


def _resume_or_train(
    ctx: loop.Context, phase: phases.Phase, index: int, params, global_offset: int, best: dict
) -> loop.PhaseResult:
    """`phase` from its boundary checkpoint when it finished before, else trained (loop.run_phase) and
    its boundary checkpoint written."""
    # Checkpoints store what the phase trains; the rest is `params` as they are now (a fingerprint).
    trained = optim.trainable_mask(optim.label_params(params, phase.rules))
    frozen = checkpointing.frozen_fingerprint(params, trained)
    finished = checkpointing.load_phase_end(
        ctx.workdir, phase.name, params, trained, frozen=frozen, sharding=sharding.replicated(ctx.mesh)
    )
    if finished is not None:
        result = loop.PhaseResult(*finished, dev_at_end=None)
        log.info("%s already finished (%s)", phase.name, result.record["stop_reason"])
    else:
        ctx.observer.phase_started(phase.name)
        try:
            with ctx.timer.phase("train_steps"):  # less evals, saves, compiles
                result = loop.run_phase(
                    ctx, phase, index, params, global_offset, best, trained=trained, frozen=frozen
                )
        finally:
            ctx.observer.phase_ended(phase.name)
        with ctx.timer.phase("checkpoint_writes"):
            checkpointing.save_phase_end(
                ctx.workdir, phase.name, result.params, trained, result.record, frozen=frozen
            )
    # The boundary checkpoint replaces the phase's periodic ones (a lost boundary reruns the phase).
    checkpointing.discard_periodic(ctx.workdir, phase.name)
    if preemption.stop_requested():  # a signal after the loop's last look at the flag: stop here, saved
        raise preemption.stopped(f"{phase.name} end")
    return result

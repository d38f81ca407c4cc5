"""The run's final scoring, after its last phase: which parameters are scored (`final_params`: the last,
or the best on dev), their predictions on dev and test (WORKDIR/predictions/<split>.jsonl), the labelled
splits' scores with their degenerate-model flags and optional temperature calibration, and the
results.json document they go into."""

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import jax
import jaxlib

from stackft_jax.config.spec import RunSpec
from stackft_jax.data import metrics, task_spec
from stackft_jax.runtime import sharding, timing
from stackft_jax.training import calibration, checkpointing, degenerate, evaluation, prediction_files
from stackft_jax.training.run_report import RunReport, json_safe

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FinalScores:
    scores: dict[str, dict[str, float]]  # per labelled split: the task's metrics and loss
    # Per scored split, why its score says the model learned nothing ([]: it learned; degenerate.py).
    degenerate: dict[str, list[str]]
    params_used: str  # "last", or "best (global step N)"
    calibration: dict | None  # the temperature fitted on dev and how it carries (calibration.py)


def best_or_last(workdir: Path, last_params: Any, best: dict, mesh: jax.sharding.Mesh) -> tuple[Any, str]:
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


def score(
    run_spec: RunSpec,
    last_params: Any,
    *,
    best: dict,
    dev_at_end: evaluation.Evaluation | None,
    workdir: Path,
    mesh: jax.sharding.Mesh,
    evaluator: evaluation.Evaluator,
    datasets: dict[str, task_spec.Split],
    report: RunReport,
    timer: timing.RunTimer,
) -> FinalScores:
    """Scores the parameters `run_spec.final_params` names on dev, test and the selection slice (where
    the run holds one out: data.selection_fraction) and writes their predictions. `dev_at_end`: the last
    phase's evaluation of `last_params` on the split selection reads, reused rather than taken again."""
    params, used = last_params, "last"
    if run_spec.final_params == "best":
        params, used = best_or_last(workdir, last_params, best, mesh)
    evaluations = {}
    if used == "last" and dev_at_end is not None:  # the loop evaluated the split selection reads
        evaluations[task_spec.selection_split(datasets)] = dev_at_end
    with timer.phase("evaluation"):
        for name in ("dev", "test", task_spec.SELECTION):
            if name in datasets and name not in evaluations:
                evaluations[name] = evaluator.evaluate(params, datasets[name])
    task = run_spec.task
    written = {name: task.prediction_records(datasets[name], done.rows) for name, done in evaluations.items()}
    for name, split_records in written.items():
        report.predictions(name, split_records)
    scores = {name: done.scores for name, done in evaluations.items() if datasets[name].labelled}
    calibrated = None
    if run_spec.calibration_temperature:  # fitted on dev; test (when labelled) shows how well it carries
        labelled = {
            name: evaluation.probabilities_and_labels(datasets[name], evaluations[name]) for name in scores
        }
        calibrated = calibration.temperature_report(labelled.pop("dev"), **labelled)
    return FinalScores(
        scores=scores,
        degenerate={
            name: degenerate.flags(written[name], split_scores, run_spec.task.objective.name)
            for name, split_scores in scores.items()
        },
        params_used=used,
        calibration=calibrated,
    )


# The vector extensions XLA:CPU may compile for (a subset of /proc/cpuinfo's flags).
VECTOR_EXTENSIONS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile")


def _host_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The host CPU's model name and vector extensions, where /proc/cpuinfo tells them (Linux)."""
    fields: dict[str, str] = {}
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {
        "cpu_model": fields.get("model name", ""),
        "cpu_vector_extensions": [name for name in VECTOR_EXTENSIONS if name in flags],
    }


def environment() -> dict[str, Any]:
    """What a rerun must match to reproduce this run's numbers to the digit (results.json `environment`):
    the versions, the platform and, on CPU, the host CPU and the threads XLA may use. XLA:CPU compiles
    for the host's vector extensions, and the threads change how its matrix products split their sums:
    measured, one pinned core and two cores give different float32 bits (docs/guarantees.md), and
    another CPU may too; after hundreds of steps such bits can change a prediction. Pin a rerun's
    threads with `taskset`."""
    device = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "platform": device.platform,
        "device_kind": device.device_kind,
        "cpu_threads": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        **_host_cpu(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def results(
    run_spec: RunSpec,
    final: FinalScores,
    *,
    phase_records: list[dict],
    best: dict,
    datasets: dict[str, task_spec.Split],
    num_devices: int,
    global_batch_size: int,
    scoring_s: float,
) -> dict[str, Any]:
    """results.json: the run's config, task and phases, and its final scores (the grid report reads it)."""
    task = run_spec.task
    train_steps = sum(r["steps"] for r in phase_records)
    document = {
        "config": run_spec.raw,
        "task": task.describe(),
        "strategy": run_spec.strategy,
        "seed": run_spec.seed,
        "num_devices": num_devices,
        "global_batch_size": global_batch_size,
        "phases": phase_records,
        "final": final.scores,
        "degenerate": final.degenerate,
        "best": best,
        "data": {
            "label_names": list(task.output_names),
            "num_examples": {name: len(split.examples) for name, split in datasets.items()},
            # The fraction of train held out as dev; null: dev is its own file or hub split.
            "dev_held_out_fraction": (
                task.dev_fraction if task_spec.dev_is_held_out(task, run_spec.data.dev_file) else None
            ),
            # The fraction of train held out for selection (data.selection_fraction); null: selection
            # (the loop's evaluations, best checkpoint, stop rules) read dev.
            "selection_fraction": run_spec.data.selection_fraction or None,
        },
        "final_params": final.params_used,  # which parameters `final` scored
        # What the result cost (the grid report's cost table): optimizer steps and training examples.
        "train_steps": train_steps,
        "examples_seen": train_steps * global_batch_size,
        # Training and evaluation time summed over every process lifetime of this run (resumes too).
        "wall_time_s": sum(r["wall_time_s"] for r in phase_records) + scoring_s,
        "environment": environment(),
    }
    if final.calibration is not None:
        document["calibration"] = final.calibration
    return document


def _strict_names(scores: dict[str, Any]) -> dict[str, Any]:
    """A score dict recorded before conlleval's entity F1, its entity scores renamed to what they were
    (`f1` -> `strict_f1`, `train_dev_gap_f1` -> `train_dev_gap_strict_f1`, ...)."""
    renamed = {}
    for key, value in scores.items():
        prefix = "train_dev_gap_" if key.startswith("train_dev_gap_") else ""
        name = key.removeprefix(prefix)
        entity = name in ("f1", "precision", "recall") or name.startswith("f1_")
        renamed[f"{prefix}{metrics.STRICT_PREFIX}{name}" if entity else key] = (
            _strict_names(value) if isinstance(value, dict) else value
        )
    return renamed


def rescore_entity_scores(workdir: Path) -> bool:
    """Rescores a finished tagging run recorded before conlleval's entity F1 (its config without
    `data.entity_f1`) from its own prediction files, no retraining: `final` gets both entity F1s
    (metrics.entity_scores; its recorded loss kept) and its degenerate flags again; the scores recorded
    during training (`best`, each phase's `best` and `boundary`), strict IOB2 then and never saved as
    predictions, keep their values under their strict names. Returns whether results.json changed
    (False: not a tagging run, or already rescored)."""
    file = Path(workdir) / "results.json"
    results = json.loads(file.read_text())
    if results["task"]["objective"] != "word_tagging" or "entity_f1" in results["config"]["data"]:
        return False
    if any(metrics.STRICT_PREFIX + "f1" in scores for scores in results["final"].values()):
        return False
    for split, recorded in results["final"].items():
        records = list(prediction_files.read(prediction_files.path(workdir, split)).values())
        scores = metrics.entity_scores([r["label"] for r in records], [r["prediction"] for r in records])
        results["final"][split] = {**scores, "loss": recorded["loss"]}
        results["degenerate"][split] = degenerate.flags(records, results["final"][split], "word_tagging")
    results["best"] = _strict_names(results["best"])
    if results["best"].get("metric") in ("f1", "precision", "recall"):
        results["best"]["metric"] = metrics.STRICT_PREFIX + results["best"]["metric"]
    for phase in results["phases"]:
        for key in ("best", "boundary"):
            if key in phase:
                phase[key] = _strict_names(phase[key])
                if phase[key].get("metric") in ("f1", "precision", "recall"):
                    phase[key]["metric"] = metrics.STRICT_PREFIX + phase[key]["metric"]
    results["task"]["scoring"] = metrics.ENTITY_SCORING
    results["rescored"] = (
        "final: both entity F1s from predictions/ (training/scoring.rescore_entity_scores); best, "
        "phases' best and boundary: strict IOB2 as recorded during training (the run read strict F1)"
    )
    tmp = file.with_name("results.json.tmp")
    tmp.write_text(json.dumps(json_safe(results), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, file)
    return True

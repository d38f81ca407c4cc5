"""Ensembles of finished classification runs: their saved class probabilities averaged, example by example
(the command, what it refuses and the weight rules: stackft_jax/ensemble.py; a grid's `ensembles`:
experiments/report.py).

Each member is read back from its workdir: results.json, whose recorded `config` resolves (spec.resolve)
into the configured task that scores it, and predictions/{dev,test}.jsonl (predictions.py). A mistake is
an EnsembleError: one line naming the run and the mismatch (exit status 2).
"""

import dataclasses
import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stackft_jax.config import spec
from stackft_jax.data import metrics
from stackft_jax.models import objectives
from stackft_jax.runtime import cli_errors, records
from stackft_jax.training import prediction_files
from stackft_jax.training import workdirs as workdirs_module  # `workdirs` names the runs here

WEIGHT_RULES = ("equal", "dev")
GRID_STEPS = 10  # dev weights are multiples of 1 / GRID_STEPS
MAX_DEV_WEIGHTED = 5  # members; the grid has C(GRID_STEPS + m - 1, m - 1) points (1001 for 5)
_TOLERANCE = 1e-9


class EnsembleError(cli_errors.UsageError):
    """Runs that cannot be ensembled, or an --out it must not write; the message names the run and the
    mismatch (exit 2)."""


@dataclasses.dataclass(frozen=True)
class Member:
    workdir: Path
    results: dict[str, Any]
    records: dict[str, dict[str, dict[str, Any]]]  # split -> key -> record, in file order
    run_spec: spec.RunSpec  # its recorded config, resolved: the configured task, the head, the seed

    @property
    def task(self) -> str:
        return self.run_spec.task.name

    @property
    def label_names(self) -> list[str] | None:
        return self.results.get("data", {}).get("label_names")


def _recorded_spec(workdir: Path, results: dict[str, Any]) -> spec.RunSpec:
    """The member's results.json `config` resolved as a workdir's record (its data files need not exist)."""
    try:
        return spec.resolve(spec.config_from_plain(results["config"]), recorded=True)
    except (KeyError, AttributeError, ValueError) as error:
        raise EnsembleError(
            f"{workdir / 'results.json'}: its recorded config does not resolve ({error})"
        ) from None


def load_member(workdir: str | Path) -> Member:
    """A finished run's results.json and prediction files (dev; test when it has one)."""
    workdir = Path(workdir)
    results_file = workdir / "results.json"
    if not results_file.is_file():
        raise EnsembleError(f"{workdir}: no results.json (not a finished run)")
    results = records.read_json(
        results_file, records.RERUN_RESULTS.format(workdir=workdir), keys=("config", "final")
    )
    run_spec = _recorded_spec(workdir, results)
    task = run_spec.task
    if task.objective is not objectives.CLASSIFICATION:
        raise EnsembleError(
            f"{workdir} ran data.task={task.name!r}, a {task.objective.name} task: ensembles average class "
            "probabilities, which only classification runs have"
        )
    split_files = {}
    for split in ("dev", "test"):
        file = prediction_files.path(workdir, split)
        if file.is_file():
            split_files[split] = prediction_files.read(file)
    if "dev" not in split_files:
        raise EnsembleError(f"{workdir}: no predictions/dev.jsonl (written by runs since prediction files)")
    for split, split_records in split_files.items():
        missing = next((k for k, r in split_records.items() if "probabilities" not in r), None)
        if missing is not None:
            raise EnsembleError(
                f"{prediction_files.path(workdir, split)}: record {missing!r} has no `probabilities`, which "
                "the classification run writes (predictions edited, or from another run)"
            )
    return Member(workdir, results, split_files, run_spec)


def _check_distinct(workdirs: Sequence[str | Path]) -> None:
    seen: dict[Path, str | Path] = {}
    for workdir in workdirs:
        first = seen.setdefault(Path(workdir).resolve(), workdir)
        if first is not workdir:
            raise EnsembleError(
                f"--workdirs names {first} twice (as {first} and {workdir}): an ensemble's members are "
                "different runs; to weight one run more, use --weights=dev"
            )


# What `write` puts in OUT: an existing OUT holding anything else was not written by an ensemble.
_OUT_ENTRIES = frozenset({"results.json", "predictions", "results.json.tmp"})


def check_out(out: str | Path, workdirs: Sequence[str | Path]) -> None:
    """Refuses an --out that this ensemble did not write itself: a member, a finished run, another
    ensemble, any non-empty folder. Its own earlier output (the same members) it may write again."""
    out = Path(out)
    members = {Path(w).resolve() for w in workdirs}
    if out.resolve() in members:
        raise EnsembleError(f"--out={out} is one of the --workdirs; choose a new folder for the ensemble")
    workdirs_module.refuse_run_target("out", out)
    if not out.exists():
        return
    if not out.is_dir():
        raise EnsembleError(f"--out={out} is a file; choose a new folder for the ensemble")
    entries = {p.name for p in out.iterdir()}
    if not entries:
        return
    results_file = out / "results.json"
    try:
        earlier = json.loads(results_file.read_text()) if results_file.is_file() else {}
    except (OSError, ValueError):
        earlier = {}
    earlier_members = {Path(m["workdir"]).resolve() for m in earlier.get("members", []) if "workdir" in m}
    own = entries <= _OUT_ENTRIES and "ensemble" in earlier and earlier_members == members
    if not own:
        what = (
            "another ensemble's output"
            if "ensemble" in earlier
            else "a run's results"
            if "config" in earlier
            else f"{len(entries)} entries"
        )
        raise EnsembleError(
            f"--out={out} exists and holds {what}, which this ensemble did not write; choose a new "
            "folder (nothing was written)"
        )


def _check_compatible(members: Sequence[Member]) -> list[str]:
    """The splits to ensemble; refuses members of other tasks, labels or examples."""
    first = members[0]
    for other in members[1:]:
        if other.task != first.task:
            raise EnsembleError(
                f"{first.workdir} ran data.task={first.task!r} but {other.workdir} ran {other.task!r}"
            )
        if other.label_names != first.label_names:
            raise EnsembleError(
                f"{first.workdir} has label names {first.label_names} but {other.workdir} has "
                f"{other.label_names} (data.classes differ)"
            )
        if set(other.records) != set(first.records):
            raise EnsembleError(
                f"{first.workdir} has predictions for {sorted(first.records)} but {other.workdir} for "
                f"{sorted(other.records)}"
            )
        for split in first.records:
            file_a, file_b = (
                prediction_files.path(first.workdir, split),
                prediction_files.path(other.workdir, split),
            )
            try:
                pairs = prediction_files.paired(file_a, file_b)
            except ValueError as e:
                raise EnsembleError(f"the runs scored different examples: {e}") from None
            for a, b in pairs:
                if a.get("label") != b.get("label") or len(a["probabilities"]) != len(b["probabilities"]):
                    raise EnsembleError(
                        f"{file_a} and {file_b} differ on example {a['key']!r}: label {a.get('label')} vs "
                        f"{b.get('label')}, {len(a['probabilities'])} vs {len(b['probabilities'])} classes"
                    )
    return list(first.records)


def _score(names: Sequence[str], predicted: np.ndarray, labels: np.ndarray | None) -> dict[str, float] | None:
    return None if labels is None else metrics.compute_metrics(names, predicted, labels)


def _same(a: float | None, b: float | None) -> bool:
    """Equal within rounding; NaN (null in JSON: an undefined metric) equals NaN."""
    a, b = (math.nan if v is None else v for v in (a, b))
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= _TOLERANCE


def _check_against_results(member: Member, split: str, scores: dict[str, float]) -> None:
    recorded = member.results.get("final", {}).get(split, {})
    for name, value in scores.items():
        if name not in recorded or not _same(recorded[name], value):
            raise EnsembleError(
                f"{prediction_files.path(member.workdir, split)} gives {name}={value} but "
                f"{member.workdir / 'results.json'} has final.{split}.{name}={recorded.get(name)} "
                "(predictions edited, or from another run)"
            )


def _simplex_grid(num_members: int) -> np.ndarray:
    """All weight vectors with entries in multiples of 1/GRID_STEPS summing to 1, [points, members]."""
    points = [
        counts
        for counts in itertools.product(range(GRID_STEPS + 1), repeat=num_members)
        if sum(counts) == GRID_STEPS
    ]
    return np.asarray(points, np.float64) / GRID_STEPS


def choose_weights(probabilities: np.ndarray, labels: np.ndarray, metric: str) -> tuple[np.ndarray, float]:
    """The grid weights [members] maximising `metric` of the weighted average of `probabilities`
    [members, examples, classes] against `labels`; ties go to the weights nearest to equal."""
    num_members = probabilities.shape[0]
    if num_members > MAX_DEV_WEIGHTED:
        raise EnsembleError(
            f"--weights=dev takes at most {MAX_DEV_WEIGHTED} runs (a grid over the simplex), got "
            f"{num_members}; use --weights=equal"
        )
    equal = np.full(num_members, 1 / num_members)
    best, best_key = None, None
    for weights in _simplex_grid(num_members):
        predicted = np.argmax(np.tensordot(weights, probabilities, axes=1), axis=-1)
        score = metrics.METRICS[metric](predicted, labels)
        key = (score, -float(np.sum((weights - equal) ** 2)))
        if best_key is None or key > best_key:
            best, best_key = weights, key
    return best, best_key[0]


def ensemble(workdirs: Sequence[str | Path], weights: str = "equal") -> dict[str, Any]:
    """The ensemble of the finished runs in `workdirs`: a results dict (members' and ensemble's
    metrics per split, weights) with its prediction records under "predictions" (split -> records)."""
    if weights not in WEIGHT_RULES:
        raise EnsembleError(f"--weights={weights}: choose one of {WEIGHT_RULES}")
    if len(workdirs) < 2:
        raise EnsembleError(f"an ensemble needs at least two runs, got {len(workdirs)}: {list(workdirs)}")
    _check_distinct(workdirs)
    members = [load_member(w) for w in workdirs]
    splits = _check_compatible(members)
    task = members[0].run_spec.task  # configured by its data.* keys (a Yahoo class subset)
    keys = {split: list(members[0].records[split]) for split in splits}
    # probabilities[split]: [members, examples, classes], in the first member's example order.
    probabilities = {
        split: np.asarray(
            [[m.records[split][k]["probabilities"] for k in keys[split]] for m in members], np.float64
        )
        for split in splits
    }
    labels = {}
    for split in splits:
        first_records = members[0].records[split]
        labelled = all("label" in first_records[k] for k in keys[split])
        labels[split] = np.asarray([first_records[k]["label"] for k in keys[split]]) if labelled else None

    member_rows = []
    for member in members:
        row = {
            "workdir": str(member.workdir),
            "strategy": member.run_spec.strategy,
            "seed": member.run_spec.seed,
            "head": member.run_spec.head.name,
        }
        for split in splits:
            predicted = np.asarray([member.records[split][k]["prediction"] for k in keys[split]])
            scores = _score(task.metrics, predicted, labels[split])
            if scores is not None:
                _check_against_results(member, split, scores)
            row[split] = scores
        member_rows.append(row)

    if weights == "dev":
        if labels["dev"] is None:
            raise EnsembleError("--weights=dev needs labelled dev predictions")
        chosen, _ = choose_weights(probabilities["dev"], labels["dev"], task.metrics[0])
        rule = f"dev: best dev {task.metrics[0]} on a 1/{GRID_STEPS} grid over the simplex"
    else:
        chosen, rule = np.full(len(members), 1 / len(members)), "equal"
    for row, weight in zip(member_rows, chosen, strict=True):
        row["weight"] = round(float(weight), 12)

    scores, records = {}, {}
    for split in splits:
        averaged = np.tensordot(chosen, probabilities[split], axes=1)
        predicted = np.argmax(averaged, axis=-1)
        scores[split] = _score(task.metrics, predicted, labels[split])
        records[split] = [
            {"key": key, "prediction": int(predicted[i])}
            | ({"label": int(labels[split][i])} if labels[split] is not None else {})
            | {"probabilities": averaged[i].tolist()}
            for i, key in enumerate(keys[split])
        ]
    return {
        "task": task.name,
        "label_names": members[0].label_names,
        "metrics": list(task.metrics),
        "weights": rule,
        "num_examples": {split: len(keys[split]) for split in splits},
        "members": member_rows,
        "ensemble": scores,
        "predictions": records,
    }


def write(out: str | Path, ensembled: dict[str, Any]) -> Path:
    """OUT/results.json and OUT/predictions/<split>.jsonl; returns the results file."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for split, split_records in ensembled["predictions"].items():
        prediction_files.write(prediction_files.path(out, split), split_records)
    results = {k: v for k, v in ensembled.items() if k != "predictions"}
    # An undefined metric (NaN) is written as null, as runs write it.
    results["members"] = [{k: _nan_to_null(v) for k, v in row.items()} for row in results["members"]]
    results["ensemble"] = {split: _nan_to_null(scores) for split, scores in results["ensemble"].items()}
    results_file = out / "results.json"
    tmp = results_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(results_file)
    return results_file


def _nan_to_null(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in value.items()}
    return value


def _cell(value: float | None, width: int) -> str:
    return f"{'null':>{width}}" if value is None or math.isnan(value) else f"{value:>{width}.4f}"


def table(ensembled: dict[str, Any]) -> str:
    """Members and ensemble side by side, one line each."""
    columns = [(split, name) for split, s in ensembled["ensemble"].items() if s for name in s]
    rows = [(r["workdir"], r["weight"], r) for r in ensembled["members"]]
    rows.append(("ensemble", 1.0, ensembled["ensemble"]))
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{'run':<{width}}  weight  " + "  ".join(f"{s}.{m}" for s, m in columns)]
    for name, weight, scores in rows:
        values = "  ".join(_cell(scores[s][m], len(s) + len(m) + 1) for s, m in columns)
        lines.append(f"{name:<{width}}  {weight:6.3f}  {values}")
    return "\n".join(lines)

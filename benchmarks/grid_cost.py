"""What one cell of a paper grid costs: wall seconds per run, split where the time goes.

  python -m benchmarks.grid_cost                                  # the three cases below, seeds 0 and 1
  python -m benchmarks.grid_cost --cases conll_bilstm_crf --set phase1.num_steps=100
  python -m benchmarks.grid_cost --compare benchmarks/out/grid_cost_before.json   # before/after table
  python -m benchmarks.grid_cost --quick                          # configs/tiny.py bases (the smoke test)

A case is one cell of a grid config (its axis values), run for each of `--seeds` as the grid runs it:
the grid's own config for that cell (`grid.run_config`), its shared feature-cache folder
(`grid.share_feature_cache`), then `train.run`, all in a fresh grid folder; every case of one
invocation shares one fresh persistent compilation cache, so seed 0 pays for building the shared
caches and compiling, and seed 1 is what each later seed of the grid costs. Per run: wall seconds around
`train.run`, the library's own split of them (WORKDIR/timings.json: compilation, feature_cache,
train_steps, evaluation, gap_evaluation, ...), train steps, final dev scores and a hash of the dev
predictions file, so two invocations (say, before and after a change, on the same machine) can be
compared cell by cell: `--compare OLD.json` prints the speed-up and whether scores and predictions are
identical. `--set key=value` overrides every run's config (e.g. smaller step budgets).

Cases (cell values of configs/experiments/paper_conll.py:small and paper_qqp.py:short):
  conll_bilstm_crf        stack_and_finetune, head bilstm_crf: a frozen phase and a fine-tuning phase
  qqp_stack_only          stack_only, head bimpm (the grid's feature cache: the head alone trains)
  qqp_stack_and_finetune  stack_and_finetune, head bimpm
"""

import argparse
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import ml_collections

from benchmarks.machine import finish, machine_info
from stackft_jax.config import config_cli
from stackft_jax.experiments import cells, grid
from stackft_jax.runtime import compilation_cache
from stackft_jax.training import train

# case -> (grid config, the cell's axis values)
CASES = {
    "conll_bilstm_crf": (
        "configs/experiments/paper_conll.py:small",
        {"strategy": "stack_and_finetune", "head.name": "bilstm_crf"},
    ),
    "qqp_stack_only": (
        "configs/experiments/paper_qqp.py:short",
        {"strategy": "stack_only", "head.name": "bimpm"},
    ),
    "qqp_stack_and_finetune": (
        "configs/experiments/paper_qqp.py:short",
        {"strategy": "stack_and_finetune", "head.name": "bimpm"},
    ),
}
# --quick: the same cells on configs/tiny.py (random tiny BERT, packaged samples), a few steps.
QUICK_BASES = {
    "conll_bilstm_crf": "configs/tiny.py:conll",
    "qqp_stack_only": "configs/tiny.py",
    "qqp_stack_and_finetune": "configs/tiny.py",
}
QUICK_SETTINGS = [
    "phase1.num_steps=4",
    "phase2.num_steps=2",
    "eval_every_steps=2",
    "phase1.gap_eval_examples=8",
]
COLUMNS = ("compilation", "feature_cache", "train_steps", "evaluation", "gap_evaluation")


def case_run(case: str, seed: int, *, quick: bool) -> tuple[ml_collections.ConfigDict, cells.Run]:
    """The grid config of `case` and its cell's run at `seed`."""
    path, cell = CASES[case]
    grid_config = config_cli.load(path, [f"base={QUICK_BASES[case]}"] if quick else [])
    for run in cells.runs_of(grid_config):
        if run.seed == seed and dict(run.cell) == cell:
            return grid_config, run
    raise ValueError(f"{path} has no cell {cell} at seed {seed} (num_seeds={grid_config.num_seeds})")


def _predictions_hash(workdir: Path) -> str | None:
    """A hash of each dev record's key, prediction and probabilities (other fields, such as names added
    to the file's format, do not count)."""
    path = workdir / "predictions" / "dev.jsonl"
    if not path.is_file():
        return None
    h = hashlib.sha256()
    for line in path.read_text().splitlines():
        record = json.loads(line)
        h.update(json.dumps([record["key"], record["prediction"], record.get("probabilities")]).encode())
    return h.hexdigest()[:16]


def measure(case: str, seed: int, grid_dir: Path, *, quick: bool, settings: list[str]) -> dict:
    grid_config, run = case_run(case, seed, quick=quick)
    config = config_cli.load(
        grid_config.base, [*run.overrides(), *(QUICK_SETTINGS if quick else []), *settings]
    )
    grid.share_feature_cache(config, grid_dir)
    workdir = grid_dir / "runs" / run.name
    started = time.perf_counter()
    results = train.run(config, workdir)
    wall = time.perf_counter() - started
    timings = json.loads((workdir / "timings.json").read_text())["seconds"]
    return {
        "case": case,
        "run": run.name,
        "seed": seed,
        "wall_s": round(wall, 2),
        "seconds": timings,
        "train_steps": results["train_steps"],
        "phases": {p["phase"]: p["steps"] for p in results["phases"]},
        "dev": results["final"].get("dev", {}),
        "dev_predictions_sha256": _predictions_hash(workdir),
    }


def _table(records: list[dict], before: dict[tuple[str, int], dict]) -> str:
    header = ["case", "seed", "steps", "wall s", *COLUMNS]
    if before:
        header += ["before wall s", "speed-up", "same dev scores", "same predictions"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in records:
        row = [r["case"], str(r["seed"]), str(r["train_steps"]), f"{r['wall_s']:.1f}"]
        row += [f"{r['seconds'].get(c, 0.0):.1f}" for c in COLUMNS]
        old = before.get((r["case"], r["seed"]))
        if old is not None:
            row += [
                f"{old['wall_s']:.1f}",
                f"{old['wall_s'] / r['wall_s']:.2f}x",
                "yes" if old["dev"] == r["dev"] else _score_difference(old["dev"], r["dev"]),
                "yes" if old["dev_predictions_sha256"] == r["dev_predictions_sha256"] else "no",
            ]
        elif before:
            row += ["-"] * 4
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _score_difference(old: dict, new: dict) -> str:
    diffs = {k: abs(new[k] - old[k]) for k in old if k in new}
    return f"no (max |diff| {max(diffs.values(), default=float('nan')):.2g})"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {sorted(CASES)}")
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 per case, in one grid folder")
    parser.add_argument("--set", action="append", default=[], help="key=value for every run's config")
    parser.add_argument("--quick", action="store_true", help="configs/tiny.py bases, a few steps")
    parser.add_argument("--compare", type=Path, help="an earlier JSON of this script: before/after columns")
    parser.add_argument("--workdir", type=Path, help="keep the grid folders here (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/grid_cost.json"))
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown {unknown}; choose from {sorted(CASES)}")

    machine = machine_info()
    records = []
    root = args.workdir or Path(tempfile.mkdtemp(prefix="grid_cost."))
    try:
        # Fresh: seed 0 compiles, seed 1 reuses. --quick (no timing claims) keeps the default, warm one.
        compilation_cache.enable("auto" if args.quick else str(root / "compilation_cache"))
        for case in cases:
            for seed in range(args.seeds):
                record = measure(case, seed, root / case, quick=args.quick, settings=args.set)
                records.append(record)
                print(f"{case} seed {seed}: {record['wall_s']:.1f} s", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    before = {}
    if args.compare is not None:
        before = {(r["case"], r["seed"]): r for r in json.loads(args.compare.read_text())["results"]["runs"]}
    args.compare, args.workdir, args.out = (
        str(p) if p else None for p in (args.compare, args.workdir, args.out)
    )
    return finish("grid_cost", args, machine, {"runs": records}, _table(records, before))


if __name__ == "__main__":
    main()

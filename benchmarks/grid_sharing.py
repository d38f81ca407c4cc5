"""An experiment grid's frozen-feature caches, shared by its runs or built by each: the same grid both ways.

  python -m benchmarks.grid_sharing            # MiniLM, 2 stack-only cells x 3 seeds, 1024 + 256 QQP pairs
  python -m benchmarks.grid_sharing --quick    # configs/tiny.py on the test fixtures (the smoke test;
                                               # the default compilation cache, so no timing claims)

Each mode runs `python -m stackft_jax.experiment` as a subprocess on a fresh workdir, with its own empty
compilation cache (neither mode inherits the other's compiled programs):
  shared   `feature_cache_dir` unset: the grid points every run at WORKDIR/feature_cache, where
           the caches are built once per split and reopened by every later cell and seed
  per_run  `feature_cache_dir=none`: each run builds its own caches in its workdir (what a grid
           did before the shared folder)
Reported per mode: seconds until the last run finished (the report written after it is left out), the
caches built, and per run the seconds its caches took (built or opened; WORKDIR/runs/*/timings.json's
`feature_cache`); and whether both modes' runs scored the same.

Pretrained weights are what makes seeds share: the same backbone for every seed. The quick mode's tiny
random BERT is drawn from the seed, so there only the cells of one seed share.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import finish, machine_info
from stackft_jax.runtime import timing

REPO = Path(__file__).resolve().parent.parent
MODES = {"shared": "", "per_run": "feature_cache_dir=none"}
STACK_ONLY = "strategy=stack_only,phase1.backbone_dropout=false,phase1.feature_cache=true"
# configs/tiny.py's sizes undone: the real MiniLM, the same weights for every seed.
PRETRAINED_MINILM = (
    "model.init=pretrained,model.config_overrides.hidden_size=0,model.config_overrides.num_hidden_layers=0,"
    "model.config_overrides.num_attention_heads=0,model.config_overrides.intermediate_size=0"
)
GRID_FILE = """import ml_collections


def get_config(arg=None):
    return ml_collections.ConfigDict({grid!r})
"""


def first_rows(source: Path, rows: int, target: Path) -> Path:
    """The header and the first `rows` examples of a TSV file."""
    with source.open(encoding="utf-8") as f:
        lines = [line for _, line in zip(range(rows + 1), f, strict=False)]
    target.write_text("".join(lines), encoding="utf-8")
    return target


def base_config(args: argparse.Namespace, data: Path) -> str:
    if args.quick:
        return f"configs/tiny.py:{STACK_ONLY},phase1.num_steps={args.steps}"
    train = first_rows(Path(args.train_file), args.train_examples, data / "train.tsv")
    dev = first_rows(Path(args.dev_file), args.dev_examples, data / "dev.tsv")
    return (
        f"configs/tiny.py:{STACK_ONLY},{PRETRAINED_MINILM},data.train_file={train},data.dev_file={dev},"
        f"max_seq_length={args.max_seq_length},per_device_batch_size=8,eval_per_device_batch_size=64,"
        f"phase1.num_steps={args.steps},phase1.gap_eval_examples=128,eval_every_steps={args.steps},"
        f"checkpoint_every_steps={args.steps},log_every_steps={args.steps}"
    )


def run_mode(mode: str, base: str, args: argparse.Namespace, root: Path) -> dict:
    # --quick (a smoke test, no timing claims) keeps the default compilation cache, warm from earlier runs.
    compilation_cache = "" if args.quick else f"compilation_cache_dir={root / mode / 'jax_compilation_cache'}"
    items = [base, MODES[mode], compilation_cache]
    grid = {
        "base": ",".join(filter(None, items)),
        "axes": f"phase1.learning_rate={args.learning_rates}",
        "num_seeds": args.seeds,
        "baseline": f"phase1.learning_rate={args.learning_rates.split('|')[0]}",
        "metric": "accuracy",
    }
    grid_file = root / f"grid_{mode}.py"
    grid_file.write_text(GRID_FILE.format(grid=grid))
    workdir = root / mode / "grid"
    cmd = [sys.executable, "-m", "stackft_jax.experiment", f"--config={grid_file}", f"--workdir={workdir}"]
    launched = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.time() - launched
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    runs = {}
    for run_dir in sorted((workdir / "runs").iterdir()):
        seconds = json.loads((run_dir / timing.FILE_NAME).read_text())["seconds"]
        runs[run_dir.name] = {
            "feature_cache_s": round(seconds.get("feature_cache", 0.0), 2),
            "final": json.loads((run_dir / "results.json").read_text())["final"],
            "finished_unix": (run_dir / "results.json").stat().st_mtime,
        }
    caches = [*workdir.glob("feature_cache/*/meta.json"), *workdir.glob("runs/*/feature_cache/*/*/meta.json")]
    return {
        "command": " ".join(cmd),
        "grid": grid,
        "runs_s": round(max(r["finished_unix"] for r in runs.values()) - launched, 2),
        "process_s": round(wall, 2),
        "caches_built": len(caches),
        "feature_cache_s": round(sum(r["feature_cache_s"] for r in runs.values()), 2),
        "runs": runs,
    }


def table(results: dict) -> str:
    lines = [
        "| mode | runs | caches built | feature caches s (all runs) | until last run s | process s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for mode, r in results.items():
        lines.append(
            f"| {mode} | {len(r['runs'])} | {r['caches_built']} | {r['feature_cache_s']:.1f} | "
            f"{r['runs_s']:.1f} | {r['process_s']:.1f} |"
        )
    runs = list(results["shared"]["runs"])
    lines += ["", "| run | " + " | ".join(f"{mode} feature caches s" for mode in results) + " |"]
    lines.append("|" + " --- |" * (len(results) + 1))
    for name in runs:
        cells = " | ".join(f"{r['runs'][name]['feature_cache_s']:.2f}" for r in results.values())
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="configs/tiny.py, 2 cells x 1 seed, 2 steps")
    parser.add_argument("--train-file", default=str(REPO.parent / "shared" / "data" / "qqp" / "train.tsv"))
    parser.add_argument("--dev-file", default=str(REPO.parent / "shared" / "data" / "qqp" / "dev.tsv"))
    parser.add_argument("--train-examples", type=int, default=1024, help="first N training pairs")
    parser.add_argument("--dev-examples", type=int, default=256, help="first N dev pairs")
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="phase 1 steps per run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--learning-rates", default="0.001|0.003", help="the cells: phase1.learning_rate")
    parser.add_argument("--root", help="keep the grids' workdirs here (default: a temporary folder)")
    parser.add_argument("--out", default="benchmarks/out/grid_sharing.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps = 1, 2
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    machine = machine_info()
    root = Path(args.root or tempfile.mkdtemp(prefix="grid_sharing_"))
    try:
        (root / "data").mkdir(parents=True, exist_ok=True)
        base = base_config(args, root / "data")
        results = {}
        for mode in MODES:
            results[mode] = run_mode(mode, base, args, root)
            print(mode, {k: results[mode][k] for k in ("caches_built", "runs_s", "process_s")}, flush=True)
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    finals = {mode: {name: r["final"] for name, r in res["runs"].items()} for mode, res in results.items()}
    shared, per_run = results["shared"], results["per_run"]
    return finish(
        "grid_sharing",
        args,
        machine,
        results,
        table(results),
        results_match=finals["shared"] == finals["per_run"],
        per_run_over_shared={
            "until_last_run": round(per_run["runs_s"] / shared["runs_s"], 2),
            "feature_cache_s": round(per_run["feature_cache_s"] / max(shared["feature_cache_s"], 1e-9), 2),
        },
    )


if __name__ == "__main__":
    main()

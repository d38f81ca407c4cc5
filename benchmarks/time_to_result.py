"""Time to result: where a real command-line run's wall time goes, cold and warm.

  python -m benchmarks.time_to_result                        # the README demo and a QQP run (minutes)
  python -m benchmarks.time_to_result --cases demo --demo-steps 20
  python -m benchmarks.time_to_result --quick                # configs/tiny.py, 2 + 2 steps (the smoke test)

Each case runs `python -m stackft_jax.main` as a subprocess twice: cold (an empty compilation cache and
tokenization cache, a fresh workdir) and warm (the same caches, another seed, a fresh workdir). Its wall
time, from launch to exit, is split into
  startup     process start and imports, up to `train.run` (the timer's start, WORKDIR/timings.json)
  data        reading and tokenizing the splits (or loading them from the tokenization cache)
  model_load  building the model and loading its pretrained weights
  compilation tracing, lowering and compiling (or loading from the persistent cache) every program
  train_steps the step loop, less what the other rows took
  evaluation  dev (and final) evaluations; gap_evaluation, phase 1's train-subset scoring, also counted
              apart
  checkpoint_writes  saving checkpoints, and waiting for background saves at the end of a phase
  rest        what none of those covered, process exit included
from the timings the library itself records (stackft_jax/runtime/timing.py). `outside_steps_share` is the part
of wall time outside training steps and evaluation (target for warm runs: <= 0.10).

`--eval-padding` also counts, for QQP dev as the qqp case evaluates it, the tokens the eval batches
compute against the real ones: the most that cutting padding could save (evaluation is linear in tokens
at these lengths on XLA:CPU).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.machine import finish, machine_info
from configs import quora
from stackft_jax.data import batching, task_spec, tasks, tokenization
from stackft_jax.models import bert
from stackft_jax.runtime import sharding, timing

REPO = Path(__file__).resolve().parent.parent
ROWS = (
    "startup",
    "data",
    "model_load",
    "compilation",
    "train_steps",
    "evaluation",
    "checkpoint_writes",
    "rest",
)
TARGET_OUTSIDE_STEPS_SHARE = 0.10


def case_args(name: str, args: argparse.Namespace) -> list[str]:
    """The command-line config of case `name`, with its step budgets from the flags."""
    if name == "tiny":
        steps = args.tiny_steps
        return [
            "--config=configs/tiny.py",
            f"--config.phase1.num_steps={steps}",
            f"--config.phase2.num_steps={steps}",
            f"--config.eval_every_steps={steps}",
        ]
    if name == "demo":
        overrides = [] if args.demo_steps is None else [f"phase1.num_steps={args.demo_steps}"]
        overrides += [] if args.demo_steps is None else [f"phase2.num_steps={args.demo_steps}"]
        return ["--config=configs/quora.py:" + ",".join(["demo", *overrides])]
    if name == "qqp":
        data = Path(args.qqp_dir)
        steps = args.qqp_steps
        return [
            "--config=configs/quora.py:mini",
            f"--config.data.train_file={data / 'train.tsv'}",
            f"--config.data.dev_file={data / 'dev.tsv'}",
            f"--config.phase1.num_steps={steps}",
            f"--config.phase2.num_steps={steps}",
            f"--config.eval_every_steps={args.qqp_eval_every_steps or steps}",
            f"--config.checkpoint_every_steps={args.qqp_eval_every_steps or steps}",
        ]
    raise ValueError(f"unknown case {name!r}: choose tiny, demo or qqp")


def directory_bytes(path: Path) -> int:
    """The bytes of the files under `path` as they are while a run writes it: os.walk skips a folder that
    vanishes under it (orbax renames its temporary checkpoint folders), which Path.rglob raises on."""
    total = 0
    for folder, _, files in os.walk(path, onerror=lambda _: None):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_size
            except FileNotFoundError:  # a checkpoint deleted or renamed while being counted
                pass
    return total


def _file_count(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def peak_bytes_while(proc: subprocess.Popen, path: Path, every_s: float = 0.5) -> int:
    """The largest size of `path` sampled every `every_s` seconds until `proc` exits."""
    peak = 0
    while proc.poll() is None:
        if path.exists():
            peak = max(peak, directory_bytes(path))
        time.sleep(every_s)
    return peak


def timed_run(config_args: list[str], workdir: Path, caches: Path, seed: int) -> dict:
    """One command-line run; its wall time split into ROWS."""
    cmd = [
        sys.executable,
        "-m",
        "stackft_jax.main",
        *config_args,
        f"--workdir={workdir}",
        f"--config.seed={seed}",
        f"--config.data.cache_dir={caches / 'data'}",
        f"--config.compilation_cache_dir={caches / 'jax_compilation_cache'}",
    ]
    compiled = caches / "jax_compilation_cache"
    cached_before = _file_count(compiled)
    launched = time.time()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log, text=True)
        checkpoint_peak = peak_bytes_while(proc, workdir / "checkpoints")
        wall = time.time() - launched
        if proc.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log.read()[-3000:]}")
    recorded = json.loads((workdir / timing.FILE_NAME).read_text())
    phases = recorded["seconds"]
    seconds = {
        "startup": recorded["started_unix"] - launched,
        "data": phases.get("data", 0.0),
        "model_load": phases.get("model_load", 0.0),
        "compilation": phases.get(timing.COMPILATION, 0.0),
        "train_steps": phases.get("train_steps", 0.0) + phases.get("feature_cache", 0.0),
        "evaluation": phases.get("evaluation", 0.0) + phases.get("gap_evaluation", 0.0),
        "checkpoint_writes": phases.get("checkpoint_writes", 0.0),
    }
    seconds["rest"] = wall - sum(seconds.values())
    results = json.loads((workdir / "results.json").read_text())
    phase1_s = results["phases"][0]["wall_time_s"]  # its loop, evaluations and checkpoints included
    return {
        "command": " ".join(cmd),
        "wall_s": round(wall, 2),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},  # the library records ms
        "gap_evaluation_s": round(phases.get("gap_evaluation", 0.0), 2),
        "gap_share_of_phase1": round(phases.get("gap_evaluation", 0.0) / phase1_s, 3),
        "outside_steps_share": round(1 - (seconds["train_steps"] + seconds["evaluation"]) / wall, 3),
        "checkpoint_bytes_end": directory_bytes(workdir / "checkpoints"),
        "checkpoint_bytes_peak": checkpoint_peak,
        # Programs this run compiled and stored (a warm run loads them instead): a count, not a time.
        "compilation_cache_files_added": _file_count(compiled) - cached_before,
        "final": results["final"],
        "library_timings": recorded,
    }


def eval_padding(dev_file: str | Path) -> dict:
    """Real and computed tokens of the qqp case's dev evaluation (configs/quora.py:mini's lengths and
    eval batch, on this process's devices), and the same for finer length buckets."""
    config = quora.get_config("mini")
    task = tasks.get_task(config.data.task)
    tokenizer = tokenization.load_tokenizer(bert.resolve_model_dir(config.model.name_or_path))
    split = task_spec.load_split(
        task, "dev", dev_file, tokenizer=tokenizer, max_seq_length=config.max_seq_length
    )
    global_batch = sharding.global_batch_size(config.eval_per_device_batch_size, sharding.make_mesh())
    real = int(split.arrays["lengths"].sum())
    schemes = {
        "library buckets": batching.length_buckets(config.max_seq_length),
        "every 16 tokens": tuple(range(16, config.max_seq_length + 1, 16)),
        "every 8 tokens": tuple(range(8, config.max_seq_length + 1, 8)),
    }
    computed = {}
    for name, buckets in schemes.items():
        batches = batching.eval_batches(split.arrays, global_batch_size=global_batch, buckets=buckets)
        computed[name] = int(sum(np.size(batch["attention_mask"]) for batch in batches))
    return {
        "rows": split.num_rows,
        "global_batch_size": global_batch,
        "real_tokens": real,
        "computed_tokens": computed,
        "computed_over_real": {name: round(tokens / real, 3) for name, tokens in computed.items()},
    }


def table(results: dict) -> str:
    header = (
        "| run | wall s | " + " | ".join(ROWS) + " | outside steps | gap check / phase 1 "
        "| checkpoints MB end | peak |"
    )
    lines = [header, "|" + "---|" * (len(ROWS) + 6)]
    for name, runs in results.items():
        for kind, run in runs.items():
            cells = " | ".join(f"{run['seconds'][row]:.1f}" for row in ROWS)
            lines.append(
                f"| {name} {kind} | {run['wall_s']:.1f} | {cells} | {run['outside_steps_share']:.0%} "
                f"| {run['gap_share_of_phase1']:.0%} | {run['checkpoint_bytes_end'] / 1e6:.0f} "
                f"| {run['checkpoint_bytes_peak'] / 1e6:.0f} |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="demo,qqp", help="comma list of tiny, demo, qqp; '' for none")
    parser.add_argument("--quick", action="store_true", help="--cases=tiny (seconds: the smoke test)")
    parser.add_argument("--tiny-steps", type=int, default=2, help="steps per phase of the tiny case")
    parser.add_argument("--demo-steps", type=int, help="steps per phase of the demo (default: its own 60)")
    parser.add_argument("--qqp-dir", default=str(REPO.parent / "shared" / "data" / "qqp"))
    parser.add_argument("--qqp-steps", type=int, default=200, help="steps per phase of the QQP run")
    parser.add_argument("--qqp-eval-every-steps", type=int, help="default: once per phase")
    parser.add_argument("--eval-padding", action="store_true", help="count QQP dev's padded eval tokens")
    parser.add_argument("--keep", help="keep the workdirs and caches under this folder (default: a temp dir)")
    parser.add_argument("--out", default="benchmarks/out/time_to_result.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.cases = "tiny"
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    machine = machine_info()
    root = Path(args.keep or tempfile.mkdtemp(prefix="time_to_result_"))
    results = {}
    try:
        for name in filter(None, args.cases.split(",")):
            config_args = case_args(name, args)
            caches = root / name / "caches"
            shutil.rmtree(root / name, ignore_errors=True)  # cold means cold
            results[name] = {
                kind: timed_run(config_args, root / name / kind, caches, seed)
                for kind, seed in (("cold", 0), ("warm", 1))
            }
            print(name, {kind: run["wall_s"] for kind, run in results[name].items()}, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    extra = {}
    if args.eval_padding:
        extra["qqp_dev_eval_padding"] = eval_padding(Path(args.qqp_dir) / "dev.tsv")
        print(extra["qqp_dev_eval_padding"])
    return finish(
        "time_to_result",
        args,
        machine,
        results,
        table(results),
        targets={"warm_outside_steps_share": TARGET_OUTSIDE_STEPS_SHARE},
        **extra,
    )


if __name__ == "__main__":
    main()

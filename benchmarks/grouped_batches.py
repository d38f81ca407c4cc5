"""Time to result, old batching against new: random batches in the doubling buckets (what the committed
grids ran, "old") against config.batching's default (random batches packed for the encoder, "new"),
against packed compiling every row count its batches need (no row plan: "packed_every"), against
random batches in buckets of 16 tokens (the default before packing, "random16") and against
length-grouped batches in buckets of 16 tokens weighed by the corpus mean ("grouped", opt-in).

  nice -n 10 python -m benchmarks.grouped_batches               # QQP at 48 and 128, CoNLL-2003 at 128
  python -m benchmarks.grouped_batches --offline                # the real-token shares alone (seconds)
  python -m benchmarks.grouped_batches --quick                  # configs/tiny.py, a few steps (smoke test)

Per case, first the real-token share of the run's training batches under several schemes, counted from
the train split's lengths (batching.token_counts: no training); then one real fine-tuning run
(finetune_only, embedded MiniLM, the paper grids' budget of 300 steps and their dev cadence, seed 0) per
scheme,
each `python -m stackft_jax.main` in a subprocess with its own empty compilation cache (its programs are
compiled, as a single run's are) and the case's shared tokenization cache (filled before either runs).
A row gives the run's wall time from launch to exit, its process time (user + system seconds of all
its threads: what the run itself took on a shared machine, where wall time follows the others' load),
its compilation and step-loop seconds (WORKDIR/timings.json), steps/s of the step loop, the real-token
share of its batches (results.json `compute`) and its final dev score. Cases run one after another
and the JSON is rewritten after each run, so a cut-short benchmark keeps what it measured.
"""

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import finish, machine_info, write_json
from stackft_jax.config import config_cli, defaults, spec
from stackft_jax.data import batching, task_spec, tokenization
from stackft_jax.models import bert
from stackft_jax.runtime import sharding, timing
from stackft_jax.training import compute

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data"
# The default, the old scheme (what runs recorded before config.batching ran), packed without its row
# plan, the default before packing and length grouping, in the order they run: a benchmark cut short
# on a busy machine keeps the default's run of each case.
SCHEMES = {
    "new": {f"batching.{key}": value for key, value in defaults.get_config().batching.items()},
    "old": {f"batching.{key}": value for key, value in config_cli.LEGACY_BATCHING.items()},
    # Packed compiling every row count its batches need (the default before the row plan).
    "packed_every": {
        **{f"batching.{key}": value for key, value in defaults.get_config().batching.items()},
        "batching.min_row_share": 0.0,
    },
    "random16": {
        "batching.scheme": "random",
        "batching.bucket_tokens": 16,
        "batching.group_batches": 50,
        "batching.loss_weighting": "batch_mean",
    },
    "grouped": {
        "batching.scheme": "length_grouped",
        "batching.bucket_tokens": 16,
        "batching.group_batches": 50,
        "batching.loss_weighting": "corpus_mean",
    },
}
# Shares counted offline, besides the two run: (scheme, bucket_tokens).
OFFLINE = [
    ("random", 0),
    ("random", 16),
    ("length_grouped", 0),
    ("length_grouped", 16),
    ("length_grouped", 8),
    ("packed", 16),
]
TARGETS = {"qqp128_real_token_share_new": 0.65, "conll128_wall_time_old_over_new": 1.8}


def cases(args: argparse.Namespace) -> dict[str, tuple[str, dict[str, object]]]:
    """{case: (config file and preset, overrides)}: the paper grids' `small` fine-tuning runs
    (configs/experiments/paper_qqp.py, paper_conll.py), finetune_only with the light head."""
    steps = args.steps
    qqp = {
        "data.train_file": DATA / "qqp" / "train.tsv",
        "data.dev_file": DATA / "qqp" / "dev.tsv",
        "per_device_batch_size": 16,
        "strategy": "finetune_only",
        "head.name": "cls_mlp",
        "phase2.num_steps": steps,
        "eval_every_steps": max(1, steps // 3),
        "checkpoint_every_steps": 1000,
    }
    conll = {
        "data.train_file": DATA / "conll2003" / "eng.train",
        "data.dev_file": DATA / "conll2003" / "eng.testa",
        "strategy": "finetune_only",
        "head.name": "token_mlp",
        "phase2.num_steps": steps,
        "eval_every_steps": max(1, steps // 2),
        "checkpoint_every_steps": 1000,
    }
    tiny = {"strategy": "finetune_only", "phase2.num_steps": steps, "eval_every_steps": steps}
    every = {
        "qqp48": ("configs/quora.py:mini", {**qqp, "max_seq_length": 48}),
        "qqp128": ("configs/quora.py:mini", {**qqp, "max_seq_length": 128}),
        "conll128": ("configs/conll03.py:mini", {**conll, "max_seq_length": 128}),
        "tiny": ("configs/tiny.py", {**tiny, "max_seq_length": 32}),
    }
    return {name: every[name] for name in args.cases.split(",")}


def _items(overrides: dict[str, object]) -> list[str]:
    return [f"{key}={value}" for key, value in overrides.items()]


def offline_shares(config_arg: str, overrides: dict[str, object], data_cache: Path) -> dict:
    """The real-token share of the run's training batches under each OFFLINE scheme, from the train
    split's lengths; tokenizes train and dev into `data_cache` (the runs then read them from it)."""
    run_spec = spec.resolve(config_cli.load(config_arg, _items(overrides)))
    model_dir = bert.resolve_model_dir(run_spec.model.name_or_path)
    tokenizer = tokenization.load_tokenizer(model_dir)
    task = run_spec.task
    paths = {split: run_spec.data.file(split) for split in ("train", "dev")}
    splits = {}
    for split, examples in task_spec.read_splits(task, paths).items():
        splits[split] = task_spec.load_split(
            task,
            split,
            paths[split],
            examples=examples,
            tokenizer=tokenizer,
            max_seq_length=run_spec.max_seq_length,
            options=task.encoding_options(run_spec.data.as_mapping()),
            cache_dir=data_cache / "tokenized",
        )
    lengths = splits["train"].arrays["lengths"]
    steps = run_spec.phases[-1].num_steps
    # The runs' global batch: their processes see this one's devices (the same environment).
    global_batch = sharding.global_batch_size(run_spec.per_device_batch_size, sharding.make_mesh())
    shares = {}
    for scheme, width in OFFLINE:
        order = batching.TrainOrder.of(
            scheme,
            max_seq_length=run_spec.max_seq_length,
            bucket_tokens=width,
            group_batches=50,
            per_device_batch_size=run_spec.per_device_batch_size,
        )
        real, padding = batching.token_counts(
            lengths,
            steps=steps,
            global_batch_size=global_batch,
            seed=batching.phase_seed(0, 0),
            order=order,
        )
        shares[f"{scheme} / {width or 'doubling'}"] = {
            "real_token_share": round(real / (real + padding), 4),
            "buckets": list(order.buckets),
        }
    return {
        "train_rows": int(len(lengths)),
        "mean_tokens": round(float(lengths.mean()), 1),
        "steps": steps,
        "global_batch_size": global_batch,
        "shares": shares,
    }


def timed_run(config_arg: str, overrides: dict[str, object], workdir: Path, data_cache: Path) -> dict:
    """One command-line run, with its own empty compilation cache; what it took and scored."""
    compiled = workdir.parent / f"{workdir.name}_jax_compilation_cache"
    cmd = [
        sys.executable,
        "-m",
        "stackft_jax.main",
        f"--config={config_arg}",
        *(f"--config.{item}" for item in _items(overrides)),
        f"--config.data.cache_dir={data_cache}",
        f"--config.compilation_cache_dir={compiled}",
        f"--workdir={workdir}",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched = time.time()
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.time() - launched
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Process time (user + system, all threads): on a shared machine, what the run itself took.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    seconds = json.loads((workdir / timing.FILE_NAME).read_text())["seconds"]
    results = json.loads((workdir / "results.json").read_text())
    total = results["compute"]["total"]
    steps = total["optimizer_steps"]
    dev = results["final"]["dev"]
    return {
        "command": " ".join(cmd),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "compilation_s": round(seconds.get(timing.COMPILATION, 0.0), 1),
        "train_steps_s": round(seconds.get("train_steps", 0.0), 1),
        "evaluation_s": round(seconds.get("evaluation", 0.0), 1),
        "steps": steps,
        "steps_per_s": round(steps / seconds["train_steps"], 3) if seconds.get("train_steps") else None,
        "tokens_real": total["tokens_real"],
        "tokens_padding": total["tokens_padding"],
        "real_token_share": round(total["tokens_real"] / (total["tokens_real"] + total["tokens_padding"]), 4),
        "dev": dev,
    }


# The committed paper grids each case's runs are (their fine-tuning runs: the same configs and budget).
GRIDS = {
    "qqp48": ("paper_qqp_small", "paper_qqp_test"),
    "conll128": ("paper_conll_small", "paper_conll_test"),
}


def grid_cost(folder: Path, speedup: float) -> dict:
    """A committed grid's recorded cost (the sum of its runs' wall seconds, what its reading page quotes)
    and the same with every phase that trains the backbone taking 1/`speedup` of its recorded seconds
    (compute.run_compute says which phases do): what the grid would cost with the default batching,
    its frozen-backbone phases (cached features) unchanged."""
    recorded = saved = 0.0
    runs = sorted(d for d in (folder / "runs").iterdir() if (d / "results.json").is_file())
    for run_dir in runs:
        record = compute.run_compute(run_dir)
        recorded += record["total"]["wall_seconds"]
        saved += sum(p["wall_seconds"] for p in record["phases"] if p["trains_backbone"]) * (1 - 1 / speedup)
    return {
        "runs": len(runs),
        "recorded_hours": round(recorded / 3600, 2),
        "scaled_hours": round((recorded - saved) / 3600, 2),
        "speedup": round(speedup, 3),
    }


def _primary(case: str, dev: dict) -> tuple[str, float]:
    """The grids' comparison metric: entity F1 on CoNLL, accuracy on QQP."""
    name = "f1" if case.startswith("conll") else "accuracy"
    return name, dev[name]


def table(results: dict) -> str:
    lines = [
        "| case | batching | real-token share | steps/s | wall s | process s | compile s | step loop s "
        "| eval s | dev |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, record in results.items():
        for kind in SCHEMES:
            run = record.get("runs", {}).get(kind)
            if run is None:
                continue
            name, score = _primary(case, run["dev"])
            lines.append(
                f"| {case} | {kind} | {run['real_token_share']:.1%} | {run['steps_per_s']} "
                f"| {run['wall_s']:.0f} | {run['cpu_s']:.0f} | {run['compilation_s']:.0f} "
                f"| {run['train_steps_s']:.0f} | {run['evaluation_s']:.0f} | {name} {score:.4f} |"
            )
        for base, kind in (("old", "new"), ("random16", "new"), ("old", "grouped")):
            if {base, kind} <= set(record.get("runs", {})):
                old, new = record["runs"][base], record["runs"][kind]
                loop_ratio = old["train_steps_s"] / new["train_steps_s"]
                lines.append(
                    f"| {case} | {base} / {kind} | | {new['steps_per_s'] / old['steps_per_s']:.2f}x | "
                    f"{old['wall_s'] / new['wall_s']:.2f}x | {old['cpu_s'] / new['cpu_s']:.2f}x | "
                    f"| {loop_ratio:.2f}x | | |"
                )
    lines += ["", "| case | " + " | ".join(f"{s} / {w or 'doubling'}" for s, w in OFFLINE) + " |"]
    lines.append("|---|" + "---|" * len(OFFLINE))
    for case, record in results.items():
        shares = record["offline"]["shares"]
        lines.append(
            f"| {case} | " + " | ".join(f"{v['real_token_share']:.1%}" for v in shares.values()) + " |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", default="conll128,qqp128,qqp48", help="comma list of qqp48, qqp128, conll128, tiny"
    )
    parser.add_argument("--steps", type=int, default=300, help="fine-tuning steps per run")
    parser.add_argument(
        "--schemes", default=",".join(SCHEMES), help=f"comma list of the runs per case: {', '.join(SCHEMES)}"
    )
    parser.add_argument("--offline", action="store_true", help="the real-token shares only, no runs")
    parser.add_argument("--quick", action="store_true", help="--cases=tiny --steps=4 (the smoke test)")
    parser.add_argument("--keep", help="keep the workdirs and caches under this folder (default: a temp dir)")
    parser.add_argument("--out", default="benchmarks/out/grouped_batches.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.cases, args.steps = "tiny", 4
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    machine = machine_info()
    root = Path(args.keep or tempfile.mkdtemp(prefix="grouped_batches_"))
    results: dict = {}
    try:
        for case, (config_arg, overrides) in cases(args).items():
            data_cache = root / case / "data_cache"
            results[case] = {"config": config_arg, "overrides": {k: str(v) for k, v in overrides.items()}}
            results[case]["offline"] = offline_shares(config_arg, overrides, data_cache)
            print(case, results[case]["offline"]["shares"], flush=True)
            if args.offline:
                continue
            results[case]["runs"] = {}
            for kind in args.schemes.split(","):
                scheme = SCHEMES[kind]
                workdir = root / case / kind
                shutil.rmtree(workdir, ignore_errors=True)
                run = timed_run(config_arg, {**overrides, **scheme}, workdir, data_cache)
                results[case]["runs"][kind] = run
                print(
                    case, kind, {k: run[k] for k in ("wall_s", "steps_per_s", "real_token_share")}, flush=True
                )
                write_json(args.out, {"benchmark": "grouped_batches", "partial": True, "results": results})
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    costs = {}
    for case, record in results.items():
        runs = record.get("runs", {})
        if {"old", "new"} <= set(runs):
            speedup = runs["old"]["cpu_s"] / runs["new"]["cpu_s"]  # process time: the load-robust measure
            for grid in GRIDS.get(case, ()):
                costs[grid] = grid_cost(REPO / "docs" / "grids" / grid, speedup)
    text = table(results)
    if costs:
        text += "\n\n| grid | runs | recorded hours | with the default batching | fine-tuning speedup |\n"
        text += "|---|---|---|---|---|\n" + "\n".join(
            f"| {grid} | {c['runs']} | {c['recorded_hours']} | {c['scaled_hours']} | {c['speedup']}x |"
            for grid, c in costs.items()
        )
    return finish("grouped_batches", args, machine, results, text, targets=TARGETS, grid_costs=costs)


if __name__ == "__main__":
    main()

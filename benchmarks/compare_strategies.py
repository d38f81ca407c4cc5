"""Dev accuracy and F1 of every head x strategy x seed on one task: the comparison the papers argue about.

Each run is a normal `train.run` in its own workdir (so an interrupted grid resumes where it stopped:
finished runs are read back from their results.json). Prints a mean +- std table and writes JSON.

    python benchmarks/compare_strategies.py --model=embedded:minilm \
        --train_file=../shared/data/qqp/train.tsv --dev_file=../shared/data/qqp/dev.tsv \
        --heads=cls_mlp,bimpm,bimpm_no_context,sim_transformer,esim --seeds=0,1,2 \
        --steps=100 --out=benchmarks/out/compare_qqp

Any task config works (`--config`, default configs/quora.py); for CoNLL-2003 NER, F1 is entity F1 and
accuracy is token accuracy:

    python benchmarks/compare_strategies.py --config=configs/conll03.py \
        --train_file=../shared/data/conll2003/eng.train --dev_file=../shared/data/conll2003/eng.testa \
        --heads=token_mlp,bilstm,bilstm_crf,crf --seeds=0 --steps=100 --out=benchmarks/out/compare_conll

Runs go seed by seed (every head x strategy for seed 0, then seed 1, ...), so a grid cut short still
has comparable cells. `--dev_examples N` scores a fixed random sample of N dev pairs (the same sample
for every run; written next to the results, outside the repository's tracked files) to save time.

Budget: every strategy gets the same number of optimizer steps, `--steps`; stack_and_finetune splits
them between its phases (phase 1 may stop early by its gap rule; phase 2 then still gets its half).
"""

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# Runs of one head share programs (eval steps; train steps across strategies): compile each once.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path.home() / ".cache/stackft_jax/jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")

from stackft_jax import config_cli, train, xla_flags  # noqa: E402

xla_flags.apply_cpu_defaults()

STRATEGIES = ("finetune_only", "stack_only", "stack_and_finetune")


def make_config(args: argparse.Namespace, head: str, strategy: str, seed: int):
    config = config_cli.load(args.config)
    config.model.name_or_path = args.model
    config.data.train_file = args.train_file
    config.data.dev_file = args.dev_sample_file or args.dev_file
    config.head.name = head
    config.strategy = strategy
    config.seed = seed
    config.max_seq_length = args.max_seq_length
    config.per_device_batch_size = args.per_device_batch_size
    config.model.scalar_mix = strategy == "stack_only" and args.scalar_mix_for_stack_only
    half = args.steps // 2
    config.phase1.num_steps = args.steps if strategy == "stack_only" else half
    config.phase2.num_steps = args.steps if strategy == "finetune_only" else args.steps - half
    config.phase1.gap_eval_examples = args.gap_eval_examples
    config.phase2.backbone_learning_rate = args.backbone_lr
    config.eval_every_steps = args.eval_every_steps
    config.checkpoint_every_steps = args.eval_every_steps
    config.keep_checkpoints = 1
    return config


def write_dev_sample(dev_file: Path, num_examples: int, out: Path) -> Path:
    """A fixed random sample (seed 0) of the dev TSV's rows, header kept, original order."""
    header, *rows = dev_file.read_text(encoding="utf-8").splitlines(keepends=True)
    if num_examples > len(rows):
        raise ValueError(f"--dev_examples={num_examples}: {dev_file} has only {len(rows)} rows")
    chosen = sorted(random.Random(0).sample(range(len(rows)), num_examples))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"dev_sample_{num_examples}.tsv"
    path.write_text(header + "".join(rows[i] for i in chosen), encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--config", default="configs/quora.py", help="task config, FILE.py[:presets]")
    parser.add_argument("--model", default="embedded:minilm")
    parser.add_argument("--train_file", default=str(REPO.parent / "shared/data/qqp/train.tsv"))
    parser.add_argument("--dev_file", default=str(REPO.parent / "shared/data/qqp/dev.tsv"))
    parser.add_argument("--heads", default="cls_mlp,bimpm,bimpm_no_context,sim_transformer,esim")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--max_seq_length", type=int, default=64)
    parser.add_argument("--per_device_batch_size", type=int, default=32)
    parser.add_argument("--gap_eval_examples", type=int, default=1000)
    parser.add_argument("--backbone_lr", type=float, default=5e-5)
    parser.add_argument("--eval_every_steps", type=int, default=50)
    parser.add_argument("--scalar_mix_for_stack_only", action=argparse.BooleanOptionalAction,
                        default=True)
    parser.add_argument("--dev_examples", type=int, default=0, help="0: the whole dev file")
    parser.add_argument("--out", default="benchmarks/out/compare")
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.dev_sample_file = None
    if args.dev_examples:
        if not args.dev_file.endswith(".tsv"):
            parser.error("--dev_examples samples rows of a TSV file with a header")
        args.dev_sample_file = str(write_dev_sample(Path(args.dev_file), args.dev_examples, out))
    rows = []
    for seed in map(int, args.seeds.split(",")):
        for head in args.heads.split(","):
            for strategy in args.strategies.split(","):
                workdir = out / "runs" / f"{head}-{strategy}-seed{seed}"
                results_path = workdir / "results.json"
                started = time.time()
                if results_path.exists():
                    results = json.loads(results_path.read_text())
                else:
                    results = train.run(make_config(args, head, strategy, seed), workdir)
                dev = results["final"]["dev"]
                rows.append({"head": head, "strategy": strategy, "seed": seed, **dev,
                             "phases": [(p["phase"], p["steps"], p["stop_reason"])
                                        for p in results["phases"]],
                             "wall_time_s": results["wall_time_s"]})
                print(f"{head:18s} {strategy:20s} seed {seed}: dev accuracy {dev['accuracy']:.4f} "
                      f"f1 {dev['f1']:.4f} ({time.time() - started:.0f} s)", flush=True)

    table = ["| head | strategy | dev accuracy (mean ± std) | dev F1 (mean ± std) | seeds |",
             "| --- | --- | --- | --- | --- |"]
    summary = []
    for head in args.heads.split(","):
        for strategy in args.strategies.split(","):
            runs = [r for r in rows if r["head"] == head and r["strategy"] == strategy]
            acc = [r["accuracy"] for r in runs]
            f1 = [r["f1"] for r in runs]
            std = statistics.stdev if len(runs) > 1 else (lambda _: 0.0)
            summary.append({"head": head, "strategy": strategy, "accuracy_mean": statistics.mean(acc),
                            "accuracy_std": std(acc), "f1_mean": statistics.mean(f1),
                            "f1_std": std(f1), "seeds": len(runs)})
            s = summary[-1]
            table.append(f"| {head} | {strategy} | {s['accuracy_mean']:.4f} ± {s['accuracy_std']:.4f} "
                         f"| {s['f1_mean']:.4f} ± {s['f1_std']:.4f} | {len(runs)} |")
    paired = paired_differences(rows, args.heads.split(","), args.strategies.split(","))
    if paired:
        table += ["", "Seed-paired differences in dev accuracy (points), stack_and_finetune minus the other "
                  "strategy; p from a paired t-test over seeds (scipy.stats.ttest_rel):", "",
                  "| head | vs | difference (mean) | per seed | p |", "| --- | --- | --- | --- | --- |"]
        for d in paired:
            per_seed = ", ".join(f"{x:+.1f}" for x in d["per_seed"])
            p_value = f"{d['p_value']:.3f}" if d["p_value"] is not None else "-"
            table.append(f"| {d['head']} | {d['versus']} | {d['mean']:+.2f} | {per_seed} | {p_value} |")
    majority = None
    if (args.dev_sample_file or args.dev_file).endswith(".tsv"):
        majority = majority_accuracy(Path(args.dev_sample_file or args.dev_file))
        table += ["", f"Majority-class accuracy of the scored dev pairs: {majority:.4f}"]
    print("\n".join(table))
    (out / "compare.json").write_text(json.dumps(
        {"args": vars(args), "runs": rows, "summary": summary, "paired": paired,
         "dev_majority_accuracy": majority}, indent=2))
    (out / "table.md").write_text("\n".join(table) + "\n")


def paired_differences(rows: list[dict], heads: list[str], strategies: list[str]) -> list[dict]:
    """stack_and_finetune minus each other strategy, per head, matched by seed."""
    from scipy import stats

    if "stack_and_finetune" not in strategies:
        return []
    def accuracy_by_seed(head: str, strategy: str) -> dict[int, float]:
        return {r["seed"]: r["accuracy"] for r in rows if r["head"] == head and r["strategy"] == strategy}

    result = []
    for head in heads:
        ours = accuracy_by_seed(head, "stack_and_finetune")
        for other in (s for s in strategies if s != "stack_and_finetune"):
            theirs = accuracy_by_seed(head, other)
            seeds = sorted(ours.keys() & theirs.keys())
            if not seeds:
                continue
            diffs = [100 * (ours[s] - theirs[s]) for s in seeds]
            p_value = None
            if len(seeds) > 1 and len(set(diffs)) > 1:
                p_value = float(stats.ttest_rel([ours[s] for s in seeds], [theirs[s] for s in seeds]).pvalue)
            result.append({"head": head, "versus": other, "seeds": seeds, "per_seed": diffs,
                           "mean": statistics.mean(diffs), "p_value": p_value})
    return result


def majority_accuracy(dev_file: Path) -> float:
    """Accuracy of always predicting the dev file's most frequent label (last TSV column)."""
    lines = dev_file.read_text(encoding="utf-8").splitlines()[1:]
    labels = [line.rsplit("\t", 1)[-1].strip() for line in lines]
    counts = {label: labels.count(label) for label in set(labels)}
    return max(counts.values()) / len(labels)


if __name__ == "__main__":
    main()

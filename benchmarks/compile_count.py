"""Static shapes: how many XLA compilations a real training run triggers, and at which step.

  python -m benchmarks.compile_count                 # tiny model, 4 epochs per phase, 3 length buckets
  python -m benchmarks.compile_count --quick         # 2 epochs per phase, 2 buckets (the smoke test)

Runs `stackft_jax.training.train.run` (strategy stack_and_finetune: phase 1, then phase 2) on configs/tiny.py
with `max_seq_length` 128, so evaluation batches are padded to the buckets (32, 64, 128) and training
batches to config.batching's (every 16 tokens by default), on a synthetic QQP file whose pairs are
spread over all three doubling buckets (the packaged fixtures are all under 32 tokens, which would
exercise one bucket only). `--train-file/--dev-file` take real files instead.

How compilations are counted: a `jax.monitoring` duration listener on
`/jax/core/compile/backend_compile_duration`, the event JAX records around every XLA compilation it
requests (an in-memory jit-cache miss; a persistent-cache hit is still counted, and also tallied
separately), with the function's name. Each event is attributed to the phase and the training step
whose batch was last handed out, as the loop reports them to `train.run(..., observer=...)` (a
`loop.LoopObserver`). The claim checked, per program that runs once per batch:
- `train_step` at most once per (phase, bucket), and `train_step_logged`, the variant of the steps that
  log (it also computes the per-part norms: steps.train_step's `with_norms`), at most once per
  (phase, bucket) too; it compiles when a logged step first meets a bucket, which can be in any epoch,
  so it is left out of the "after the first epoch" count;
- `eval_step` at most once per (bucket, input kind): token batches, and the cached-feature batches of
  a frozen-backbone phase (a different program: the backbone does not run);
- `features_step` at most once per (bucket, cached split) of each frozen-backbone phase (train subset
  and dev: feature_cache.py jits it per cache it builds);
everything else is a small constant, and nothing compiles after the first epoch of each phase.
"""

import argparse
import collections
import tempfile
from pathlib import Path

import jax
import numpy as np

from benchmarks.machine import machine_info, write_json
from configs import tiny
from stackft_jax.config import spec
from stackft_jax.data import batching
from stackft_jax.training import loop, train

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
# Words that are one WordPiece token each in the uncased BERT vocabulary.
WORDS = (
    "what how why is the best way to learn a new language do you think people can make money "
    "online from home should i buy house or car in city which are good books for students"
).split()
# Words per question pair, chosen so that [CLS] a [SEP] b [SEP] falls in each of the 3 buckets.
PAIR_WORDS = {32: (8, 26), 64: (34, 58), 128: (70, 120)}


def write_synthetic_qqp(path: Path, num_examples: int, seed: int) -> Path:
    """A GLUE-format QQP TSV with equally many pairs in each length bucket."""
    rng = np.random.default_rng(seed)
    lines = ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"]
    buckets = list(PAIR_WORDS)
    for i in range(num_examples):
        low, high = PAIR_WORDS[buckets[i % len(buckets)]]
        total = int(rng.integers(low, high + 1))
        first = total // 2
        words = rng.choice(WORDS, total)
        a, b = " ".join(words[:first]) + "?", " ".join(words[first:]) + "?"
        lines.append(f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{int(rng.integers(0, 2))}")
    path.write_text("\n".join(lines) + "\n")
    return path


class CompileLog(loop.LoopObserver):
    """Compile events, each with the phase and step current when it happened."""

    def __init__(self):
        self.phase: str | None = None  # None: before the first phase, or after the last
        self.step: int | None = None  # 0-based index of the batch last handed to train_step
        self.events: list[dict] = []
        self.cache_hits = 0

    # loop.LoopObserver: where the loop is.
    def phase_started(self, name: str) -> None:
        self.phase, self.step = name, None

    def step_started(self, phase: str, step: int) -> None:
        self.step = step

    def phase_ended(self, name: str) -> None:
        self.phase, self.step = None, None

    def on_duration(self, event: str, duration: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            name = str(kwargs.get("fun_name", "?"))  # "jit(train_step)"
            self.events.append(
                {
                    "fun_name": name.removeprefix("jit(").removesuffix(")"),
                    "phase": self.phase,
                    "step": self.step,
                    "seconds": round(duration, 4),
                }
            )

    def on_event(self, event: str, **kwargs) -> None:
        if event == CACHE_HIT_EVENT:
            self.cache_hits += 1

    def __enter__(self) -> "CompileLog":
        jax.monitoring.register_event_duration_secs_listener(self.on_duration)
        jax.monitoring.register_event_listener(self.on_event)
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_duration_listener(self.on_duration)
        jax.monitoring.unregister_event_listener(self.on_event)


def make_config(args: argparse.Namespace, data_dir: Path, num_devices: int):
    config = tiny.get_config()
    config.max_seq_length = args.max_seq_length
    config.data.train_file = args.train_file or str(
        write_synthetic_qqp(data_dir / "train.tsv", args.train_examples, seed=0)
    )
    config.data.dev_file = args.dev_file or str(
        write_synthetic_qqp(data_dir / "dev.tsv", args.dev_examples, seed=1)
    )
    config.data.cache_dir = str(data_dir / "cache")
    with open(config.data.train_file) as f:
        num_train = sum(1 for line in f if line.strip()) - 1  # GLUE files have a header
    global_batch = config.per_device_batch_size * num_devices
    per_epoch = batching.steps_per_epoch(num_train, global_batch)
    for block in (config.phase1, config.phase2):
        block.num_steps = args.epochs * per_epoch
    config.eval_every_steps = per_epoch
    config.log_every_steps = per_epoch
    config.checkpoint_every_steps = per_epoch
    config.phase1.gap_eval_examples = min(16, num_train)
    return config, per_epoch


# Per-batch programs and how many compilations each may take, from (training buckets: config.batching,
# evaluation buckets, phases, cached phases).
STEP_BOUNDS = {
    "train_step": lambda train, evaluation, phases, cached: train * phases,
    "train_step_logged": lambda train, evaluation, phases, cached: train * phases,
    "eval_step": lambda train, evaluation, phases, cached: evaluation * (2 if cached else 1),
    "features_step": lambda train, evaluation, phases, cached: 2 * evaluation * cached,
}


def summarize(
    log: CompileLog,
    steps_per_epoch: int,
    buckets: tuple[int, ...],
    phase_names,
    train_buckets: tuple[int, ...],
    cached_phases: int = 0,
) -> dict:
    by_name = collections.Counter(e["fun_name"] for e in log.events)
    per_phase = {}
    for name in phase_names:
        events = [e for e in log.events if e["phase"] == name]
        after_warmup = [
            e
            for e in events
            if e["step"] is not None and e["step"] >= steps_per_epoch and e["fun_name"] != "train_step_logged"
        ]
        per_epoch = collections.Counter(
            "before first step" if e["step"] is None else f"epoch {e['step'] // steps_per_epoch + 1}"
            for e in events
        )
        per_phase[name] = {
            "compiles": len(events),
            "by_epoch": dict(per_epoch),
            "train_step_compiles": sum(e["fun_name"] == "train_step" for e in events),
            "compiles_after_first_epoch": len(after_warmup),
            "events_after_first_epoch": after_warmup,
        }
    bounds = {
        name: bound(len(train_buckets), len(buckets), len(phase_names), cached_phases)
        for name, bound in STEP_BOUNDS.items()
    }
    step_compiles = sum(by_name.get(name, 0) for name in STEP_BOUNDS)
    return {
        "total_compiles": len(log.events),
        "by_function": dict(by_name.most_common()),
        "step_compiles": {name: by_name.get(name, 0) for name in STEP_BOUNDS},
        "step_bounds": bounds,
        "other_compiles": len(log.events) - step_compiles,
        "within_bound": all(by_name.get(name, 0) <= bound for name, bound in bounds.items()),
        "per_phase": per_phase,
        "compiles_after_first_epoch": sum(p["compiles_after_first_epoch"] for p in per_phase.values()),
        "persistent_cache_hits": log.cache_hits,
        "events": log.events,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, help="epochs per phase (4; --quick: 2)")
    parser.add_argument("--max-seq-length", type=int, help="128: buckets 32, 64, 128 (--quick: 64)")
    parser.add_argument("--train-examples", type=int, default=24, help="synthetic train pairs")
    parser.add_argument("--dev-examples", type=int, default=9, help="synthetic dev pairs")
    parser.add_argument("--train-file", help="a QQP TSV instead of the synthetic one")
    parser.add_argument("--dev-file", help="a QQP TSV instead of the synthetic one")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="benchmarks/out/compile_count.json")
    args = parser.parse_args(argv)
    if args.epochs is None:
        args.epochs = 2 if args.quick else 4
    if args.max_seq_length is None:
        args.max_seq_length = 64 if args.quick else 128
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="compile_count_") as tmp, CompileLog() as log:
        data_dir = Path(tmp)
        config, per_epoch = make_config(args, data_dir, jax.device_count())
        buckets = batching.length_buckets(config.max_seq_length)
        train_buckets = spec.resolve(config).train_order.buckets
        results = train.run(config, data_dir / "workdir", observer=log)
    phase_names = [p["phase"] for p in results["phases"]]
    cached = sum(1 for p in results["phases"] if p["feature_cache_bytes"] > 0)
    summary = summarize(log, per_epoch, buckets, phase_names, train_buckets, cached)
    print(
        f"{jax.device_count()} device(s), buckets {buckets}, {per_epoch} steps/epoch, "
        f"{args.epochs} epochs per phase, phases {phase_names}"
    )
    print("| function | XLA compilations |\n| --- | --- |")
    for name, count in summary["by_function"].items():
        print(f"| {name} | {count} |")
    for name, p in summary["per_phase"].items():
        print(
            f"{name}: {p['compiles']} compilations {p['by_epoch']}; train_step "
            f"{p['train_step_compiles']}; after the first epoch: {p['compiles_after_first_epoch']}"
        )
    print("| per-batch program | compilations | bound |\n| --- | --- | --- |")
    for name, bound in summary["step_bounds"].items():
        print(f"| {name} | {summary['step_compiles'][name]} | {bound} |")
    print(
        f"within_bound {summary['within_bound']} ({len(train_buckets)} training buckets, {len(buckets)} "
        f"eval buckets, {len(phase_names)} phases, {cached} with cached features); "
        f"other {summary['other_compiles']}; after the first epoch: "
        f"{summary['compiles_after_first_epoch']}"
    )
    payload = {
        "benchmark": "compile_count",
        "machine": machine_info(),
        "args": vars(args),
        "buckets": list(buckets),
        "train_buckets": list(train_buckets),
        "steps_per_epoch": per_epoch,
        "steps_per_phase": {p["phase"]: p["steps"] for p in results["phases"]},
        **summary,
    }
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()

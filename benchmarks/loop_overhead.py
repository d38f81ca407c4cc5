"""The training loop's overhead: steps/s of a real `train.run` against a bare Python loop over the same
compiled steps.

  python -m benchmarks.loop_overhead                  # `small`: 4 x 128 encoder, batch 16 x 64 tokens
  python -m benchmarks.loop_overhead --size tiny      # configs/tiny.py's encoder: the loop's cost alone
  python -m benchmarks.loop_overhead --quick          # the smoke test

Both sides run one `finetune_only` phase of configs/tiny.py (resized by `--size`), random batches each
padded to `max_seq_length` (`batching.scheme=random`, `bucket_tokens` = `max_seq_length`), so each side
compiles one plain step and one logged step (the per-part norms of logged steps) and nothing else:

  loop  `train.run` in a temporary workdir, exactly as the command runs it (the prefetch thread, the
        progress bar's bounded queue, the train log every `--window` steps, checkpoints and evaluation
        off until the phase's end). A `loop.LoopObserver` reads the clock after each step's periodic
        actions; the train log waits for its window's steps, so each window from one log to the next
        is timed from a synchronised point to the next.
  raw   `loop.build_phase_step` built as `loop.run_phase` builds it, called in a bare `for` loop on the
        same phase's batches (`loop.batch_feed`, the run's seed) put on the device beforehand, the
        logged step every `--window` steps as the loop calls it; each window ends in
        `block_until_ready`.

The first window of each side compiles (warm-up) and the loop's last one holds the phase-end evaluation:
neither is timed. The two sides alternate `--repeats` times (raw, loop, raw, loop, ...), so a change in
the machine's load falls on both. Reported: each side's median window over its `--windows` x
`--repeats` windows in steps/s, and the loop's overhead, raw steps/s over loop steps/s less 1 (goal: at
most 5%).
"""

import argparse
import statistics
import tempfile
import time

import jax

from benchmarks.machine import finish, machine_info
from configs import tiny
from stackft_jax.config import spec
from stackft_jax.data import task_spec, tokenization
from stackft_jax.runtime import sharding
from stackft_jax.training import build, loop, steps, train

GOAL = 0.05  # the loop at most 5% slower than the bare loop
# (global batch, config items) per size; the batch is split over the devices.
SIZES = {
    # configs/tiny.py's encoder (hidden 32, 2 layers): a step of a few milliseconds, the loop's cost bare
    "tiny": (8, []),
    # a step of some tens of milliseconds on a 2-core CPU
    "small": (
        16,
        [
            "model.config_overrides.hidden_size=128",
            "model.config_overrides.num_hidden_layers=4",
            "model.config_overrides.intermediate_size=512",
            "max_seq_length=64",
        ],
    ),
}


def run_config(size: str, window: int, windows: int):
    """The phase both sides run: (warm-up window, timed windows, evaluation window) x `window` steps."""
    global_batch, items = SIZES[size]
    items = [
        "strategy=finetune_only",
        f"phase2.num_steps={window * (windows + 2)}",
        f"log_every_steps={window}",
        f"eval_every_steps={window * (windows + 2)}",  # only at the phase's end (untimed)
        "checkpoint_every_steps=1000000000",  # never inside the phase
        f"per_device_batch_size={max(1, global_batch // jax.device_count())}",
        *items,
    ]
    config = tiny.get_config(",".join(items))
    # One batch shape, so nothing compiles after warm-up: random batches padded to max_seq_length (packed
    # batches' row counts vary; their host-side packing costs about 0.1 ms a batch, data/packing.py).
    config.batching.scheme = "random"
    config.batching.bucket_tokens = config.max_seq_length
    return config


class _StepClock(loop.LoopObserver):
    """When each step of the phase ended, its periodic actions (the train log) done."""

    def __init__(self):
        self.ended: dict[int, float] = {}

    def step_ended(self, phase: str, step: int) -> None:
        self.ended[step] = time.perf_counter()


def loop_windows(config, window: int, windows: int) -> list[float]:
    """Seconds of each timed window of `train.run`."""
    clock = _StepClock()
    with tempfile.TemporaryDirectory(prefix="loop_overhead_") as workdir:
        train.run(config, workdir, observer=clock)
    ends = [clock.ended[window * k] for k in range(1, windows + 2)]
    return [b - a for a, b in zip(ends, ends[1:], strict=False)]


def raw_windows(config, window: int, windows: int) -> list[float]:
    """Seconds of each timed window of a bare loop over the same phase's steps and batches."""
    run_spec = spec.resolve(config)
    model_dir, _ = build.resolve_encoder(run_spec)
    mesh = sharding.make_mesh()
    graphdef, params, _ = build.initial_model(run_spec, model_dir, mesh)
    task = run_spec.task
    examples = task_spec.read_examples(task, "train", run_spec.data.train_file)
    dataset = task_spec.encode_examples(
        task,
        tokenization.load_tokenizer(model_dir),
        examples,
        max_seq_length=run_spec.max_seq_length,
        options=task.encoding_options(run_spec.data.as_mapping()),
    )
    (phase,) = run_spec.plan(1)  # finetune_only: one phase; its budget is in steps
    global_batch = sharding.global_batch_size(run_spec.per_device_batch_size, mesh)
    phase_step = loop.build_run_phase_step(
        run_spec,
        phase,
        0,
        params,
        graphdef=graphdef,
        mesh=mesh,
        train=dataset,
        global_batch_size=global_batch,
    )
    feed = loop.batch_feed(
        dataset,
        seed=run_spec.seed,
        phase_index=0,
        start_step=0,
        global_batch_size=global_batch,
        order=run_spec.train_order,
        with_index=False,
    )
    batches = [sharding.put_batch(next(feed), mesh) for _ in range(window * (windows + 1))]
    jax.block_until_ready(batches)
    state = steps.TrainState(**phase_step.init_state(params))
    seconds = []
    for k in range(windows + 1):  # the first window compiles
        started = time.perf_counter()
        for i in range(window * k, window * (k + 1)):
            state, _ = phase_step.train_step(
                state, batches[i], with_norms=loop.due(i + 1, window, phase.num_steps)
            )
        jax.block_until_ready(state)
        seconds.append(time.perf_counter() - started)
    return seconds[1:]


def summary(seconds: list[float], window: int) -> dict:
    median = statistics.median(seconds)
    return {"window_s": seconds, "median_window_s": median, "steps_per_s": window / median}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), help="the encoder and batch (small; --quick: tiny)")
    parser.add_argument("--window", type=int, help="steps per timed window = log_every_steps (50; quick 5)")
    parser.add_argument("--windows", type=int, help="timed windows per side (7; quick 2)")
    parser.add_argument("--repeats", type=int, help="alternating raw and loop runs (3; quick 1)")
    parser.add_argument("--quick", action="store_true", help="tiny, 2 windows of 5 steps, once")
    parser.add_argument("--out", default="benchmarks/out/loop_overhead.json")
    args = parser.parse_args(argv)
    args.size = args.size or ("tiny" if args.quick else "small")
    args.window = args.window or (5 if args.quick else 50)
    args.windows = args.windows or (2 if args.quick else 7)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    machine = machine_info()
    config = run_config(args.size, args.window, args.windows)
    raw_s, loop_s = [], []
    for _ in range(args.repeats):
        raw_s += raw_windows(config, args.window, args.windows)
        loop_s += loop_windows(config, args.window, args.windows)
    raw, real = summary(raw_s, args.window), summary(loop_s, args.window)
    overhead = raw["steps_per_s"] / real["steps_per_s"] - 1
    results = {
        "size": args.size,
        "global_batch": sharding.global_batch_size(config.per_device_batch_size, sharding.make_mesh()),
        "max_seq_length": config.max_seq_length,
        "raw": raw,
        "loop": real,
        "loop_overhead": overhead,
        "goal": GOAL,
        "goal_met": overhead <= GOAL,
    }
    table = "\n".join(
        [
            f"{args.size}: {args.repeats} x {args.windows} windows of {args.window} steps per side, median",
            "| loop | ms/step | steps/s |",
            "| --- | --- | --- |",
            *(
                f"| {name} | {1e3 / r['steps_per_s']:.2f} | {r['steps_per_s']:.1f} |"
                for name, r in (("raw (bare for loop)", raw), ("train.run", real))
            ),
            f"loop overhead: {overhead:+.1%} (goal: at most {GOAL:.0%})",
        ]
    )
    return finish("loop_overhead", args, machine, results, table)


if __name__ == "__main__":
    main()

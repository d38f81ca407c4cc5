"""Input pipeline alone: tokenization (first call vs cached) and batching speed, against the train step.

  python -m benchmarks.input_pipeline                     # ../shared/data/qqp/train.tsv, 32 x 128
  python -m benchmarks.input_pipeline --steps-per-s 0.9   # compare with a known step rate instead
  python -m benchmarks.input_pipeline --quick --train-file tests/fixtures/qqp/train.tsv --step-model tiny

Measured, each alone on the host:
  - reading the TSV (`task_spec.read_examples`);
  - `task_spec.encode_examples` into an empty temporary cache dir (tokenize + write the cache),
    then again (hash the examples + load the cache);
  - batches/s of `batching.train_batches` + `batching.process_slice` (what the train loop pulls per
    step), and the same plus `sharding.put_batch` (the host-to-device copy);
  - the MiniLM full fine-tuning step's steps/s at the same batch and length (`--steps-per-s` to give it).
Target: the pipeline produces batches at least 5x as fast as the train step consumes them. The file is
read in place, never copied.
"""

import argparse
import collections
import statistics
import tempfile
import time
from pathlib import Path

import jax

from benchmarks import cases
from benchmarks.machine import load_average, machine_info, write_json
from stackft_jax.data import batching, task_spec, tasks, tokenization
from stackft_jax.models import bert
from stackft_jax.runtime import sharding
from stackft_jax.training import loop

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRAIN_FILE = REPO.parent / "shared" / "data" / "qqp" / "train.tsv"
TARGET_SPEEDUP = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-file", default=str(DEFAULT_TRAIN_FILE), help="a QQP TSV")
    parser.add_argument("--model", default=bert.EMBEDDED_MODEL, help="its tokenizer is used")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--limit", type=int, help="use only the first N examples")
    parser.add_argument("--batches", type=int, help="batches timed (default: one epoch, at most 2000)")
    parser.add_argument("--steps-per-s", type=float, help="the train step's rate; measured if unset")
    parser.add_argument("--step-model", default="minilm", help=f"model whose step is timed {cases.MODELS}")
    parser.add_argument("--step-repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer batches and step repeats")
    parser.add_argument("--out", default="benchmarks/out/input_pipeline.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches = args.batches or 50
        args.step_repeats = 1
    return args


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def batches_per_s(dataset, args, buckets, *, put: bool) -> dict:
    """Pull batches exactly as `loop.run_phase` does (optionally including the device copy)."""
    mesh = sharding.make_mesh()
    per_epoch = batching.steps_per_epoch(batching.num_rows(dataset), args.batch_size)
    num = args.batches or min(per_epoch, 2000)
    stream = loop.batch_feed(
        dataset,
        seed=0,
        phase_index=0,
        start_step=0,
        global_batch_size=args.batch_size,
        order=batching.TrainOrder(buckets=buckets),
        with_index=False,
    )
    lengths: collections.Counter = collections.Counter()
    started = time.perf_counter()
    for _ in range(num):
        local = next(stream)
        if put:
            jax.block_until_ready(sharding.put_batch(local, mesh))
        lengths[local["input_ids"].shape[1]] += 1
    elapsed = time.perf_counter() - started
    return {
        "batches": num,
        "seconds": elapsed,
        "batches_per_s": num / elapsed,
        "bucket_counts": {str(k): v for k, v in sorted(lengths.items())},
    }


def measure_step_rate(args) -> dict:
    """Steps/s of the full fine-tuning step (benchmarks/cases.py) at this batch and length."""
    config = cases.experiment_config(args.step_model, args.max_seq_length)
    model = cases.build_jax(config)
    batch = cases.synthetic_batch(args.batch_size, args.max_seq_length, 30522, seed=0)
    case = cases.jax_case(model, "full", batch)
    case.step()  # compiles
    times = []
    for _ in range(args.step_repeats):
        _, seconds = timed(case.step)
        times.append(seconds)
    median = statistics.median(times)
    return {"model": args.step_model, "times_s": times, "median_s": median, "steps_per_s": 1 / median}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    task = tasks.get_task("qqp")
    load_start = load_average()
    examples, read_s = timed(lambda: task_spec.read_examples(task, "train", args.train_file))
    if args.limit:
        examples = examples[: args.limit]
    tokenizer = tokenization.load_tokenizer(bert.resolve_model_dir(args.model))

    def tokenize(cache_dir):
        return task_spec.encode_examples(
            task, tokenizer, examples, max_seq_length=args.max_seq_length, cache_dir=cache_dir
        )

    with tempfile.TemporaryDirectory(prefix="input_pipeline_") as cache_dir:
        dataset, first_s = timed(lambda: tokenize(cache_dir))
        cached, cached_s = timed(lambda: tokenize(cache_dir))
    assert (cached["input_ids"] == dataset["input_ids"]).all()

    buckets = batching.length_buckets(args.max_seq_length)
    host = batches_per_s(dataset, args, buckets, put=False)
    with_put = batches_per_s(dataset, args, buckets, put=True)
    if args.steps_per_s:
        step = {"model": "given by --steps-per-s", "steps_per_s": args.steps_per_s}
    else:
        step = measure_step_rate(args)
    speedup = with_put["batches_per_s"] / step["steps_per_s"]
    n = len(examples)
    payload = {
        "benchmark": "input_pipeline",
        "machine": machine_info(),
        "args": vars(args),
        "load_average_1_5_15": {"start": load_start, "end": load_average()},
        "num_examples": n,
        "buckets": list(buckets),
        "read_tsv_s": read_s,
        "tokenize_first_call_s": first_s,
        "tokenize_cached_call_s": cached_s,
        "tokenize_first_examples_per_s": n / first_s,
        "tokenize_cached_examples_per_s": n / cached_s,
        "cache_speedup": first_s / cached_s,
        "batching": host,
        "batching_with_put_batch": with_put,
        "train_step": step,
        "pipeline_over_step_rate": speedup,
        "target": f">= {TARGET_SPEEDUP}",
        "target_met": speedup >= TARGET_SPEEDUP,
    }
    print(f"{n} examples from {args.train_file}; batch {args.batch_size}, buckets {buckets}")
    print("| stage | time | rate |\n| --- | --- | --- |")
    print(f"| read TSV | {read_s:.3f} s | {n / read_s:,.0f} examples/s |")
    print(f"| tokenize, first call (empty cache) | {first_s:.3f} s | {n / first_s:,.0f} examples/s |")
    print(f"| tokenize, cached call | {cached_s:.3f} s | {n / cached_s:,.0f} examples/s |")
    print(
        f"| train_batches + process_slice | {host['seconds']:.3f} s / {host['batches']} batches | "
        f"{host['batches_per_s']:,.0f} batches/s |"
    )
    print(
        f"| ... + put_batch | {with_put['seconds']:.3f} s / {with_put['batches']} batches | "
        f"{with_put['batches_per_s']:,.0f} batches/s |"
    )
    print(f"| train step ({step['model']}) | | {step['steps_per_s']:.3f} steps/s |")
    print(
        f"pipeline / step rate = {speedup:,.0f}x (target >= {TARGET_SPEEDUP}x): "
        f"{'met' if payload['target_met'] else 'MISSED'}; buckets {host['bucket_counts']}"
    )
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()

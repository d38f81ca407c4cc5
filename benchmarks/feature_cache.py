"""Frozen-backbone phase: epoch time recomputing the backbone at every step vs training from the cache.

  python -m benchmarks.feature_cache                        # MiniLM, first 2048 QQP train pairs, 32 x 128
  python -m benchmarks.feature_cache --modes recompute_dropout,recompute,cached --epochs 3 --scalar-mix
  python -m benchmarks.feature_cache --quick --model tiny --train-file tests/fixtures/qqp/train.tsv

Each mode trains phase 1 of stack_and_finetune (configs/quora.py:demo resized to `--model`, cls_mlp head)
for `--epochs` epochs from the same parameters over the same batches (`batching.train_batches`, the
run's seed), with the step jitted as `loop.run_phase` jits it (`cases.jax_train_state`):

  recompute_dropout  today's default: the frozen backbone runs in training mode, dropout on, every step
  recompute          phase1.backbone_dropout=False: the backbone runs deterministically every step
  cached             phase1.feature_cache=True: `feature_cache.open_or_build` runs the backbone once
                     over the split (the build, timed apart), then each step trains the head on the
                     stored features

Epoch 1 includes compiling the step for each length bucket (and the build its own compilation);
epochs 2+ are the steady state. Reported per mode: build s, epoch 1 s, median s of epochs 2+, and
examples/s; then recompute / cached time for epochs 2+ and for epoch 1 against build + epoch 1. The
mean training loss per epoch is recorded too: cached and recompute compute the same function, so
their losses must agree (a check that does not depend on speed).
"""

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks import cases
from benchmarks.machine import load_average, machine_info, write_json
from stackft_jax.data import batching, task_spec, tasks, tokenization
from stackft_jax.models import bert
from stackft_jax.runtime import sharding
from stackft_jax.training import feature_cache, loop

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRAIN_FILE = REPO.parent / "shared" / "data" / "qqp" / "train.tsv"
MODES = ("recompute_dropout", "recompute", "cached")
QUICK = {"examples": 0, "batch_size": 8, "eval_batch_size": 16, "max_seq_length": 32, "epochs": 2}
DEFAULTS = {"examples": 2048, "batch_size": 32, "eval_batch_size": 64, "max_seq_length": 128, "epochs": 2}
LOSS_RTOL = 1e-3  # cached vs recompute mean epoch loss: equal up to float rounding


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", help=f"one of {cases.MODELS}")
    parser.add_argument("--train-file", default=str(DEFAULT_TRAIN_FILE), help="a QQP TSV, read in place")
    parser.add_argument("--examples", type=int, help="first N training pairs; 0: all")
    parser.add_argument("--batch-size", type=int, help=f"global train batch ({DEFAULTS['batch_size']})")
    parser.add_argument("--eval-batch-size", type=int, help="global batch of the cache build")
    parser.add_argument("--max-seq-length", type=int, help=f"({DEFAULTS['max_seq_length']})")
    parser.add_argument("--epochs", type=int, help="epochs per mode, >= 2 (the first compiles)")
    parser.add_argument("--modes", default="recompute,cached", help=f"comma list of {MODES}")
    parser.add_argument(
        "--scalar-mix", action="store_true", help="model.scalar_mix: the cache stores every layer"
    )
    parser.add_argument("--cache-dtype", default="float32", choices=sorted(feature_cache.DTYPES))
    parser.add_argument("--cache-dir", help="where the cache is written (default: a temporary folder)")
    parser.add_argument("--quick", action="store_true", help=f"defaults {QUICK} (smoke test)")
    parser.add_argument("--out", default="benchmarks/out/feature_cache.json")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: epoch 1 includes compilation")
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    return args


def load_split(args: argparse.Namespace, model_dir: Path) -> batching.Dataset:
    task = tasks.get_task("qqp")
    examples = task_spec.read_examples(task, "train", args.train_file)
    if args.examples:
        examples = examples[: args.examples]
    return task_spec.encode_examples(
        task, tokenization.load_tokenizer(model_dir), examples, max_seq_length=args.max_seq_length
    )


def run_mode(
    model: cases.JaxModel, mode: str, ds: batching.Dataset, args: argparse.Namespace, cache_dir: Path
) -> dict:
    """`args.epochs` timed epochs of phase 1 in `mode` (after the timed cache build when cached)."""
    phase = dataclasses.replace(
        model.plan["phase1"],
        backbone_dropout=mode == "recompute_dropout",
        feature_cache=mode == "cached",
        feature_cache_dtype=args.cache_dtype,
    )
    model = dataclasses.replace(model, plan={**model.plan, "phase1": phase})
    buckets = batching.length_buckets(args.max_seq_length)
    record: dict = {"build_s": None, "cache_bytes": 0}
    cache = None
    if mode == "cached":
        started = time.perf_counter()
        cache = feature_cache.open_or_build(
            cache_dir / mode,
            ds,
            model.params,
            graphdef=model.graphdef,
            mesh=model.mesh,
            all_layers=model.spec.model.scalar_mix,
            dtype=args.cache_dtype,
            global_batch_size=args.eval_batch_size,
            buckets=buckets,
        )
        record["build_s"] = time.perf_counter() - started
        record["cache_bytes"] = cache.nbytes
    state, train_step = cases.jax_train_state(model, "phase1")
    steps = batching.steps_per_epoch(batching.num_rows(ds), args.batch_size)
    batches = loop.batch_feed(  # phase 1's feed, as loop.run_phase pulls it
        ds,
        seed=model.spec.seed,
        phase_index=0,
        start_step=0,
        global_batch_size=args.batch_size,
        order=batching.TrainOrder(buckets=buckets),
        with_index=cache is not None,
    )
    epochs = []
    for _ in range(args.epochs):
        started = time.perf_counter()
        losses = []
        for _ in range(steps):
            local = next(batches)
            if cache is not None:
                local = cache.attach(local)
            state, metrics = train_step(state, sharding.put_batch(local, model.mesh))
            losses.append(metrics["loss"])
        jax.block_until_ready(state)
        seconds = time.perf_counter() - started
        epochs.append(
            {
                "seconds": seconds,
                "examples_per_s": steps * args.batch_size / seconds,
                "mean_loss": float(np.mean(jax.device_get(losses))),
            }
        )
    steady = float(np.median([e["seconds"] for e in epochs[1:]]))
    record.update(
        epochs=epochs,
        epoch1_s=epochs[0]["seconds"],
        epoch1_incl_build_s=epochs[0]["seconds"] + (record["build_s"] or 0.0),
        steady_epoch_s=steady,
        steady_examples_per_s=steps * args.batch_size / steady,
    )
    return record


def ratios(results: dict) -> dict:
    """Recomputing / cached time, per recompute mode that ran; and whether their losses agree."""
    out = {}
    cached = results.get("cached")
    for mode in ("recompute", "recompute_dropout"):
        if cached is None or mode not in results:
            continue
        entry = {
            "steady_epoch": results[mode]["steady_epoch_s"] / cached["steady_epoch_s"],
            "epoch1_incl_build": results[mode]["epoch1_s"] / cached["epoch1_incl_build_s"],
        }
        if mode == "recompute":
            a = np.array([e["mean_loss"] for e in results[mode]["epochs"]])
            b = np.array([e["mean_loss"] for e in cached["epochs"]])
            entry["max_loss_rel_diff"] = float(np.max(np.abs(a - b) / np.abs(a)))
            entry["losses_match"] = bool(np.allclose(b, a, rtol=LOSS_RTOL, atol=0))
        out[f"{mode}_over_cached"] = entry
    return out


def table(results: dict, ratio: dict) -> str:
    lines = [
        "| mode | cache build s | epoch 1 s | epoch 1 + build s | epochs 2+ s (median) | "
        "ex/s (epochs 2+) | mean loss, last epoch |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mode, r in results.items():
        build = f"{r['build_s']:.2f}" if r["build_s"] is not None else "-"
        lines.append(
            f"| {mode} | {build} | {r['epoch1_s']:.2f} | {r['epoch1_incl_build_s']:.2f} | "
            f"{r['steady_epoch_s']:.2f} | {r['steady_examples_per_s']:.1f} | "
            f"{r['epochs'][-1]['mean_loss']:.5f} |"
        )
    if ratio:
        lines += ["", "| time ratio | epochs 2+ | epoch 1 / (build + epoch 1) |", "| --- | --- | --- |"]
    for name, entry in ratio.items():
        lines.append(
            f"| {name.replace('_over_', ' / ')} | {entry['steady_epoch']:.2f}x | "
            f"{entry['epoch1_incl_build']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    load_start = load_average()
    config = cases.experiment_config(args.model, args.max_seq_length)
    config.model.scalar_mix = args.scalar_mix
    model = cases.build_jax(config)
    ds = load_split(args, bert.resolve_model_dir(config.model.name_or_path))
    steps = batching.steps_per_epoch(batching.num_rows(ds), args.batch_size)
    print(
        f"{args.model}: {batching.num_rows(ds)} examples ({int(ds['lengths'].sum())} real tokens) "
        f"from {args.train_file}, "
        f"batch {args.batch_size}, max length {args.max_seq_length}, {steps} steps/epoch, "
        f"{args.epochs} epochs per mode, load {load_start}",
        flush=True,
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="feature_cache_", dir=args.cache_dir) as cache_dir:
        for mode in args.modes.split(","):
            results[mode] = run_mode(model, mode, ds, args, Path(cache_dir))
            print(f"  {mode}: {[round(e['seconds'], 2) for e in results[mode]['epochs']]} s", flush=True)
    ratio = ratios(results)
    text = table(results, ratio)
    print(text)
    for name, entry in ratio.items():
        if "losses_match" in entry:
            print(
                f"{name}: mean epoch losses agree to {entry['max_loss_rel_diff']:.1e} relative "
                f"({'match' if entry['losses_match'] else 'DIFFER'}, rtol {LOSS_RTOL})"
            )
    payload = {
        "benchmark": "feature_cache",
        "machine": machine_info(),
        "args": vars(args),
        "load_average_1_5_15": {"start": load_start, "end": load_average()},
        "num_examples": batching.num_rows(ds),
        "real_tokens": int(ds["lengths"].sum()),
        "steps_per_epoch": steps,
        "buckets": list(batching.length_buckets(args.max_seq_length)),
        "results": results,
        "ratios": ratio,
        "table_markdown": text,
    }
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()

"""What one accelerator gives stackft_jax: a single command for a person with one H100 or one TPU VM,
run after the README's install (about 5-8 minutes there; on CPU use --smoke).

  python -m benchmarks.accelerator_check              # BERT-base shape, seq 128, bfloat16
  python -m benchmarks.accelerator_check --smoke      # tiny shape on CPU: the test suite's run

Measured, on `jax.devices()`:
1. the phase-2 train step (the one runs jit, `loop.build_phase_step`) of a randomly initialised
   BERT-base shape (`model.config_overrides`) at sequence length 128 in bfloat16, at batch 32 and 256:
   median seconds per step, examples/s, model TFLOP/s (benchmarks/flops.py) and MFU against the
   device's bf16 peak (stackft_jax/models/flops.py's table; n/a on CPU);
2. the phase-1 step (frozen backbone, head trains) at batch 32: examples/s;
3. the real loop: a short `train.run` of the same shape (finetune_only on the packaged QQP demo
   sample), and the MFU its log windows report (results.json `phases[0].throughput`);
4. peak device memory (`Device.memory_stats()` where the backend has it);
5. bfloat16 against float32: the losses of the same steps on the same batches, and their largest
   relative difference.
It writes one JSON (`--out`) and prints one table.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks import cases, flops
from benchmarks.machine import finish, machine_info
from stackft_jax.runtime import sharding
from stackft_jax.training import train


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shape, few steps (CPU)")
    parser.add_argument("--steps", type=int, help="timed steps per case (20; --smoke: 2)")
    parser.add_argument("--out", default="benchmarks/out/accelerator_check.json")
    args = parser.parse_args(argv)
    args.model = "tiny" if args.smoke else "bert_base"
    args.seq_len = 32 if args.smoke else 128
    args.batch_sizes = (8, 16) if args.smoke else (32, 256)
    args.steps = args.steps or (2 if args.smoke else 20)
    args.loop_steps = 6 if args.smoke else 60
    return args


def _config(args: argparse.Namespace, dtype: str):
    config = cases.experiment_config(args.model, args.seq_len)
    config.model.dtype = dtype
    return config


def _peak_memory() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def time_step(args: argparse.Namespace, case: str, batch_size: int, dtype: str = "bfloat16") -> dict:
    """Median seconds of the jitted `case` step over `args.steps` calls (after one compiling call), and
    its losses."""
    model = cases.build_jax(_config(args, dtype))
    state, phase_step = cases.jax_phase_step(model, case, copy_params=False)
    batch = sharding.put_batch(cases.synthetic_batch(batch_size, args.seq_len, 30522), model.mesh)
    state, metrics = phase_step.train_step(state, batch)  # compiles
    losses = [float(metrics["loss"])]
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        state, metrics = phase_step.train_step(state, batch)
        jax.block_until_ready(metrics["loss"])
        times.append(time.perf_counter() - started)
        losses.append(float(metrics["loss"]))
    seconds = statistics.median(times)
    shape = {
        "num_layers": model.bert_config.num_hidden_layers,
        "hidden": model.bert_config.hidden_size,
        "intermediate": model.bert_config.intermediate_size,
        "batch": batch_size,
        "seq_len": args.seq_len,
    }
    model_flops = flops.step_flops("full" if case == "full" else "phase1", **shape)
    peak = flops.peak_flops(jax.devices()[0].device_kind)
    return {
        "case": case,
        "dtype": dtype,
        "batch_size": batch_size,
        "median_s": seconds,
        "examples_per_s": batch_size / seconds,
        "model_tflops_per_s": model_flops / seconds / 1e12,
        "mfu": flops.mfu(model_flops, seconds, peak, len(model.mesh.devices.flat)) if peak else None,
        "losses": losses,
        "peak_memory_bytes": _peak_memory(),
    }


def real_loop(args: argparse.Namespace, batch_size: int) -> dict:
    """A short run of the library's loop; the throughput its log windows recorded."""
    config = _config(args, "bfloat16")
    config.strategy = "finetune_only"
    config.per_device_batch_size = max(1, batch_size // jax.device_count())
    config.phase2.num_steps = args.loop_steps
    config.log_every_steps = max(1, args.loop_steps // 3)
    config.eval_every_steps = config.checkpoint_every_steps = args.loop_steps
    with tempfile.TemporaryDirectory(prefix="accelerator_check_") as workdir:
        results = train.run(config, Path(workdir))
    return results["phases"][-1]["throughput"]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    machine = machine_info()
    devices = jax.devices()
    phase2 = [time_step(args, "full", b) for b in args.batch_sizes]
    phase1 = time_step(args, "phase1", args.batch_sizes[0])
    loop = real_loop(args, args.batch_sizes[0])
    f32 = time_step(args, "full", args.batch_sizes[0], dtype="float32")
    bf16_losses, f32_losses = np.array(phase2[0]["losses"]), np.array(f32["losses"])
    agreement = float(np.max(np.abs(bf16_losses - f32_losses) / np.abs(f32_losses)))
    bare = phase2[0]["examples_per_s"]
    results = {
        "device_kind": devices[0].device_kind,
        "devices": len(devices),
        "model": args.model,
        "seq_len": args.seq_len,
        "phase2": phase2,
        "phase1": phase1,
        "real_loop": loop,
        "real_loop_vs_bare_step": loop["examples_per_s"] / bare if loop["examples_per_s"] else None,
        "float32_losses": f32["losses"],
        "bf16_vs_float32_max_relative_loss_difference": agreement,
        "peak_memory_bytes": _peak_memory(),
    }

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1%}"

    def row(name: str, r: dict) -> str:
        return f"| {name} | {r['examples_per_s']:.1f} | {r['model_tflops_per_s']:.3f} | {pct(r['mfu'])} |"

    rows = [row(f"phase-2 step, batch {r['batch_size']}", r) for r in phase2]
    rows.append(row(f"phase-1 step, batch {phase1['batch_size']}", phase1))
    rows.append(row(f"real loop (logged), batch {args.batch_sizes[0]}", loop))
    memory = results["peak_memory_bytes"]
    table = "\n".join(
        [
            f"{devices[0].device_kind} x{len(devices)}, {args.model} shape, seq {args.seq_len}, bfloat16",
            "| measurement | examples/s | model TFLOP/s | MFU |",
            "| --- | --- | --- | --- |",
            *rows,
            f"real loop / bare step examples/s: {pct(results['real_loop_vs_bare_step'])}; "
            f"bf16 vs float32 loss, largest relative difference over {len(f32_losses)} steps: "
            f"{agreement:.2e}; "
            f"peak memory: {'n/a' if memory is None else f'{memory / 2**30:.2f} GiB'}",
        ]
    )
    return finish("accelerator_check", args, machine, results, table)


if __name__ == "__main__":
    main()

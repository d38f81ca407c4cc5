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
   relative difference;
6. packed rows (batching.scheme=packed, data/packing.py) on this device's attention path (cuDNN's fused
   kernel with the segments as its mask on a GPU in bfloat16): the encoder's last layer and pooled
   output over packed rows against the same batch unpacked, in bfloat16 and float32 (relative norm of
   the difference over real tokens), and the real loop with packed against random batches.
It writes one JSON (`--out`) and prints one table.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from benchmarks import cases, flops
from benchmarks.machine import finish, machine_info
from stackft_jax.data import packing
from stackft_jax.models.packed import Packed
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


def _config(args: argparse.Namespace, dtype: str, attention: str = "auto"):
    config = cases.experiment_config(args.model, args.seq_len)
    config.model.dtype = dtype
    config.model.attention = attention
    return config


def _peak_memory() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def time_step(
    args: argparse.Namespace, case: str, batch_size: int, dtype: str = "bfloat16", attention: str = "auto"
) -> dict:
    """Median seconds of the jitted `case` step over `args.steps` calls (after one compiling call), and
    its losses."""
    model = cases.build_jax(_config(args, dtype, attention))
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
        "attention": model.spec.model.attention,
        "batch_size": batch_size,
        "median_s": seconds,
        "examples_per_s": batch_size / seconds,
        "model_tflops_per_s": model_flops / seconds / 1e12,
        "mfu": flops.mfu(model_flops, seconds, peak, len(model.mesh.devices.flat)) if peak else None,
        "losses": losses,
        "peak_memory_bytes": _peak_memory(),
    }


def _relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def packed_parity(args: argparse.Namespace, batch_size: int, dtype: str) -> dict:
    """The backbone over packed rows against the same batch unpacked (as task_model runs either), at
    half the sequence length so that rows hold several examples: relative differences of the last
    layer over real tokens and of the pooled output."""
    model = cases.build_jax(_config(args, dtype))
    batch = cases.synthetic_batch(batch_size, args.seq_len // 2, 30522, seed=1)
    lengths = batch["attention_mask"].sum(axis=1)
    groups = len(model.mesh.devices.flat)
    packed = packing.pack(batch["input_ids"], batch["token_type_ids"], lengths, groups=groups)

    @jax.jit
    def encode(params: dict, device_batch: dict) -> tuple[jax.Array, jax.Array]:
        backbone = nnx.merge(model.graphdef, params).backbone
        if "packed_input_ids" in device_batch:
            out = backbone.packed(Packed.of(device_batch), deterministic=True)
        else:
            ids, types, mask = (device_batch[k] for k in ("input_ids", "token_type_ids", "attention_mask"))
            out = backbone(ids, types, mask, deterministic=True)
        return out.hidden_states[-1], out.pooled

    plain_last, plain_pooled = jax.device_get(encode(model.params, sharding.put_batch(batch, model.mesh)))
    packed_last, packed_pooled = jax.device_get(
        encode(model.params, sharding.put_batch({**batch, **packed}, model.mesh))
    )
    real = batch["attention_mask"].astype(bool)
    return {
        "dtype": dtype,
        "attention": model.spec.model.attention,
        "examples": batch_size,
        "packed_rows": int(packed["packed_input_ids"].shape[0]),
        "row_length": int(packed["packed_input_ids"].shape[1]),
        "last_layer_relative_difference": _relative_difference(packed_last[real], plain_last[real]),
        "pooled_relative_difference": _relative_difference(packed_pooled, plain_pooled),
    }


def real_loop(args: argparse.Namespace, batch_size: int, scheme: str = "packed") -> dict:
    """A short run of the library's loop with `scheme` batches; the throughput its log windows recorded."""
    config = _config(args, "bfloat16")
    config.strategy = "finetune_only"
    config.batching.scheme = scheme
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
    # The same attention path in both: "auto" picks cuDNN's kernel (no attention-probability dropout)
    # in bfloat16 on a GPU but einsum (with it) in float32, which would compare two different models.
    f32 = time_step(args, "full", args.batch_sizes[0], dtype="float32", attention=phase2[0]["attention"])
    parity = [packed_parity(args, args.batch_sizes[0], dtype) for dtype in ("bfloat16", "float32")]
    random_loop = real_loop(args, args.batch_sizes[0], scheme="random")
    bf16_losses, f32_losses = np.array(phase2[0]["losses"]), np.array(f32["losses"])
    relative = np.abs(bf16_losses - f32_losses) / np.abs(f32_losses)
    # The first loss is the same parameters on the same batch; later ones also carry the updates' drift.
    agreement, first_step = float(np.max(relative)), float(relative[0])
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
        "real_loop_random_batches": random_loop,
        "packed_parity": parity,
        "float32_losses": f32["losses"],
        "float32_attention": f32["attention"],
        "bf16_vs_float32_max_relative_loss_difference": agreement,
        "bf16_vs_float32_first_step_relative_loss_difference": first_step,
        "peak_memory_bytes": _peak_memory(),
    }

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1%}"

    def row(name: str, r: dict) -> str:
        return f"| {name} | {r['examples_per_s']:.1f} | {r['model_tflops_per_s']:.3f} | {pct(r['mfu'])} |"

    rows = [row(f"phase-2 step, batch {r['batch_size']}", r) for r in phase2]
    rows.append(row(f"phase-1 step, batch {phase1['batch_size']}", phase1))
    rows.append(row(f"real loop (logged), batch {args.batch_sizes[0]}, packed", loop))
    rows.append(row(f"real loop (logged), batch {args.batch_sizes[0]}, random", random_loop))
    memory = results["peak_memory_bytes"]
    table = "\n".join(
        [
            f"{devices[0].device_kind} x{len(devices)}, {args.model} shape, seq {args.seq_len}, bfloat16",
            "| measurement | examples/s | model TFLOP/s | MFU |",
            "| --- | --- | --- | --- |",
            *rows,
            f"real loop / bare step examples/s: {pct(results['real_loop_vs_bare_step'])}; "
            f"bf16 vs float32 loss ({f32['attention']} attention), relative difference at the first step "
            f"{first_step:.2e}, largest over {len(f32_losses)} steps {agreement:.2e}; "
            f"peak memory: {'n/a' if memory is None else f'{memory / 2**30:.2f} GiB'}",
            *(
                f"packed vs unpacked encoder ({p['dtype']}, {p['attention']}, {p['examples']} examples in "
                f"{p['packed_rows']} rows of {p['row_length']}): relative difference last layer "
                f"{p['last_layer_relative_difference']:.2e}, pooled {p['pooled_relative_difference']:.2e}"
                for p in parity
            ),
        ]
    )
    return finish("accelerator_check", args, machine, results, table)


if __name__ == "__main__":
    main()

"""Parameter-efficient adaptation against full fine-tuning: step time, peak memory, optimizer state and
checkpoint size of each kind's training step on the same model and batch.

  python -m benchmarks.adaptation                            # embedded MiniLM, 32 x 128, every case
  python -m benchmarks.adaptation --cases finetune,lora --repeats 3 --no-memory
  python -m benchmarks.adaptation --quick --model tiny       # the smoke test

The cases are `cases.ADAPTATION_CASES`: `finetune` (finetune_only's phase: every parameter trains),
`lora`, `bitfit`, `adapters` (each preset's adapted phase with the kind's default options) and
`lora_all` (LoRA on every projection, `adaptation.lora.targets=.*`). Each case builds its own model
(`cases.adaptation_config`: the LoRA and adapter parameters exist only in their kinds' encoders) with
the same seed, pretrained weights and head, and runs the step `loop.build_phase_step` jits for that
phase (`steps.train_step` with the run's shardings and state donation) on one synthetic batch.

Per case:
- step time: in this process, warm-up calls excluded (the first compiles), then the timed repeats
  round-robin over the cases, one step each (`train_speed.time_steps`), so a change in machine load
  hits every case alike; median s/step and IQR;
- peak memory: a fresh subprocess per case, run before the timing (`memory.run_in_subprocess`, i.e.
  `benchmarks.memory --single jax MODEL CASE`): peak RSS after build, after compiling the step ahead
  of time and after `--steps` steps; XLA's temp buffers of the compiled step and its estimated work
  (`cost_analysis()`: flops, bytes accessed), which no machine load changes (`--no-memory` skips this);
- optimizer-state bytes (`optim.optimizer_state_bytes` of the train state after the timed steps);
- the bytes a phase-end checkpoint of the phase holds (`checkpointing.trained_part` of its trainable
  mask, as train.py saves it; a periodic checkpoint adds the optimizer state to that);
- trained and total parameter counts (`loop.parameter_counts`, what results.json records per phase).
"""

import argparse
import gc

import jax

from benchmarks import cases, memory, train_speed
from benchmarks.machine import finish, machine_info
from stackft_jax.training import checkpointing, loop, optim

QUICK = {"batch_size": 8, "seq_len": 32, "warmup": 1, "repeats": 2, "steps": 1}
DEFAULTS = {"batch_size": 32, "seq_len": 128, "warmup": 2, "repeats": 7, "steps": 3}
MIB = 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", choices=cases.MODELS)
    parser.add_argument(
        "--cases",
        default=",".join(cases.ADAPTATION_CASES),
        help=f"comma list of {tuple(cases.ADAPTATION_CASES)}; the first is the others' reference",
    )
    parser.add_argument("--batch-size", type=int, help=f"examples per step ({DEFAULTS['batch_size']})")
    parser.add_argument("--seq-len", type=int, help=f"tokens per example ({DEFAULTS['seq_len']})")
    parser.add_argument("--warmup", type=int, help="untimed calls first, >= 1 (the first compiles)")
    parser.add_argument("--repeats", type=int, help=f"timed steps per case ({DEFAULTS['repeats']})")
    parser.add_argument("--steps", type=int, help=f"steps per memory subprocess ({DEFAULTS['steps']})")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS subprocesses")
    parser.add_argument("--quick", action="store_true", help=f"defaults {QUICK} (smoke test)")
    parser.add_argument("--out", default="benchmarks/out/adaptation.json")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    unknown = sorted(set(args.cases.split(",")) - set(cases.ADAPTATION_CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {tuple(cases.ADAPTATION_CASES)}")
    if args.warmup < 1 or args.repeats < 1:
        parser.error("--warmup and --repeats must be at least 1")
    return args


def _nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def describe(m: cases.JaxModel, case: str) -> dict:
    """What the case's phase trains and keeps, read from the model before any step."""
    phase = cases.case_phase(m, case)
    trained = optim.trainable_mask(optim.label_params(m.params, phase.rules))
    preset, overrides = cases.ADAPTATION_CASES[case]
    return {
        "preset": preset,
        "overrides": list(overrides),
        "phase": phase.name,
        "rules": [list(rule) for rule in phase.rules],
        "learning_rates": dict(phase.learning_rates),
        "parameters": loop.parameter_counts(m.params, trained),
        "parameter_bytes": _nbytes(m.params),
        "checkpoint_bytes": _nbytes(checkpointing.trained_part(m.params, trained)),
    }


def time_cases(args: argparse.Namespace, names: list[str]) -> dict[str, dict]:
    """Builds every case's model and step, then times them round-robin on one batch."""
    records, built = {}, {}
    for case in names:
        config = cases.adaptation_config(args.model, args.seq_len, case)
        batch = cases.synthetic_batch(args.batch_size, args.seq_len, 30522, seed=config.seed)
        m = cases.build_jax(config)
        records[case] = describe(m, case)
        built[case] = cases.jax_case(m, case, batch)
        del m  # the case's train state holds its own copy of the parameters
        print(f"  built {case}: {records[case]['parameters']}", flush=True)
    timed = train_speed.time_steps(
        {case: c.step for case, c in built.items()},
        args.warmup,
        args.repeats,
        args.batch_size,
        interleave=True,
    )
    for case, c in built.items():
        records[case]["step"] = timed[case]
        records[case]["optimizer_state_bytes"] = c.optimizer_state_bytes()
        print(f"  {case}: {timed[case]['median_s'] * 1e3:.1f} ms/step", flush=True)
    built.clear()
    gc.collect()
    return records


def add_ratios(records: dict[str, dict], reference: str) -> None:
    """Each case's step time, optimizer state, checkpoint and peak RSS over the reference case's."""
    ref = records[reference]
    for record in records.values():
        ratios = {
            "step_time": record["step"]["median_s"] / ref["step"]["median_s"],
            "optimizer_state": record["optimizer_state_bytes"] / ref["optimizer_state_bytes"],
            "checkpoint": record["checkpoint_bytes"] / ref["checkpoint_bytes"],
            "trained_parameters": record["parameters"]["trained"] / ref["parameters"]["trained"],
        }
        if "memory" in record and "memory" in ref:
            mem, ref_mem = record["memory"], ref["memory"]
            ratios["peak_rss_after_steps"] = (
                mem["peak_rss_after_steps_mib"] / ref_mem["peak_rss_after_steps_mib"]
            )
            for key in ("flops", "bytes accessed"):
                ratios[f"xla_{key.replace(' ', '_')}"] = (
                    mem["xla_cost_analysis"][key] / ref_mem["xla_cost_analysis"][key]
                )
        record[f"over_{reference}"] = ratios


def table(records: dict[str, dict], reference: str) -> str:
    lines = [
        f"| case | trained params (share) | total params | optimizer state MiB | phase-end checkpoint MiB | "
        f"median s/step (IQR) | time / {reference} | peak RSS MiB | added by steps MiB | XLA temp MiB | "
        "XLA GFLOP | XLA GB accessed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case, r in records.items():
        counts, step = r["parameters"], r["step"]
        mem = r.get("memory")
        memory_cells = (
            f"{mem['peak_rss_after_steps_mib']:.0f} | {mem['steps_added_mib']:.0f} | "
            f"{mem['xla_memory_analysis_bytes']['temp_size'] / MIB:.0f} | "
            f"{mem['xla_cost_analysis']['flops'] / 1e9:.1f} | "
            f"{mem['xla_cost_analysis']['bytes accessed'] / 1e9:.2f}"
            if mem
            else "- | - | - | - | -"
        )
        lines.append(
            f"| {case} | {counts['trained']:,} ({counts['trained'] / counts['total']:.2%}) | "
            f"{counts['total']:,} | {r['optimizer_state_bytes'] / MIB:.2f} | "
            f"{r['checkpoint_bytes'] / MIB:.2f} | "
            f"{step['median_s']:.3f} ({step['iqr_s']:.3f}) | {r[f'over_{reference}']['step_time']:.2f} | "
            f"{memory_cells} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    machine = machine_info()
    names = args.cases.split(",")
    # The subprocesses run first, while this process is small: Linux carries a process's peak RSS
    # across exec, so a child's ru_maxrss starts at its parent's peak (here: the imports only).
    peaks = {}
    if not args.no_memory:
        for case in names:
            peaks[case] = memory.run_in_subprocess(
                "jax", args.model, case, argparse.Namespace(**vars(args), jax_variant="baseline")
            )
            print(f"  {case}: peak {peaks[case]['peak_rss_after_steps_mib']:.0f} MiB", flush=True)
    records = time_cases(args, names)
    for case, row in peaks.items():
        records[case]["memory"] = row
    add_ratios(records, names[0])
    print(f"({args.model}, batch {args.batch_size} x {args.seq_len}; peak RSS = ru_maxrss after the steps)")
    return finish("adaptation", args, machine, records, table(records, names[0]), reference=names[0])


if __name__ == "__main__":
    main()

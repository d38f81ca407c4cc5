"""Train- and eval-step speed: stackft_jax against PyTorch + transformers on the same model and batch.

  python -m benchmarks.train_speed                          # MiniLM and a bert-base-sized model, 32 x 128
  python -m benchmarks.train_speed --models minilm --components   # + where the full step's time goes
  python -m benchmarks.train_speed --quick --models tiny    # seconds: the smoke test

Per model and case (full fine-tuning step, phase-1 step with the backbone frozen, eval step; see
benchmarks/cases.py) both frameworks run in this process on the same batch. Warm-up calls (the first
includes compilation) are excluded; then the timed repeats alternate between the frameworks, one step
each, so a change in machine load hits both alike. Reported: median seconds per step and its IQR,
examples/s at the median, jax/torch speed ratios and each framework's phase-1 / full-step time.

Targets on a 2-core CPU: full step >= 1.15x torch examples/s; phase-1 step <= 0.35x our own full step's
time; eval >= 1.2x torch examples/s.

On an accelerator (JAX's default backend is not the CPU; or `--accelerator-report on`) the JAX steps
are also timed with `model.dtype` float32 and bfloat16 (parameters stay float32), with model FLOP/s and
model FLOPs utilisation against the devices' bf16 peak (benchmarks/flops.py; `--peak-tflops` for a
device the table does not know):

  python -m benchmarks.train_speed --models minilm,bert_base --frameworks jax --batch-size 256
"""

import argparse
import time

import numpy as np

from benchmarks import cases, flops
from benchmarks.machine import finish, load_average, machine_info

TARGETS = {
    "full_speedup_vs_torch": 1.15,  # jax examples/s / torch examples/s, at least
    "phase1_time_over_full_time": 0.35,  # our phase-1 step time / our full step time, at most
    "eval_speedup_vs_torch": 1.2,
}
QUICK = {"batch_size": 8, "seq_len": 32, "warmup": 1, "repeats": 2}
DEFAULTS = {"batch_size": 32, "seq_len": 128, "warmup": 2, "repeats": 7}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="minilm,bert_base", help=f"comma list of {cases.MODELS}")
    parser.add_argument("--cases", default=",".join(cases.CASES), help=f"comma list of {cases.CASES}")
    parser.add_argument("--frameworks", default="jax,torch", help="jax, torch or both")
    parser.add_argument("--batch-size", type=int, help=f"examples per step ({DEFAULTS['batch_size']})")
    parser.add_argument("--seq-len", type=int, help=f"tokens per example ({DEFAULTS['seq_len']})")
    parser.add_argument("--warmup", type=int, help="untimed calls first, >= 1 (the first compiles)")
    parser.add_argument("--repeats", type=int, help=f"timed steps per case ({DEFAULTS['repeats']})")
    parser.add_argument("--quick", action="store_true", help=f"defaults {QUICK} (smoke test)")
    parser.add_argument(
        "--components",
        action="store_true",
        help="also time pieces of the full step: forward alone, forward+backward, without dropout",
    )
    parser.add_argument(
        "--order",
        choices=("interleaved", "blocked"),
        default="interleaved",
        help="timed calls alternate between frameworks, or run all of one framework's first",
    )
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--torch-attn", help="attn_implementation for transformers (default: its own)")
    parser.add_argument(
        "--jax-dtype", help="experiment: model.dtype for JAX only (bfloat16); torch stays float32"
    )
    parser.add_argument(
        "--jax-prng-impl", help="experiment: jax_default_prng_impl (rbg, unsafe_rbg) for dropout"
    )
    parser.add_argument(
        "--accelerator-report",
        choices=("auto", "on", "off"),
        default="auto",
        help="float32 vs bfloat16 JAX throughput and MFU (auto: when the backend is not the CPU)",
    )
    parser.add_argument("--peak-tflops", type=float, help="per-device bf16 peak for MFU (default: table)")
    parser.add_argument("--out", default="benchmarks/out/train_speed.json")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.warmup < 1 or args.repeats < 1:
        parser.error("--warmup and --repeats must be at least 1")
    return args


def summarize(times: list[float], batch_size: int, first_call_s: float) -> dict:
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return {
        "median_s": float(median),
        "iqr_s": float(q3 - q1),
        "examples_per_s": batch_size / float(median),
        "first_call_s": first_call_s,
        "times_s": [round(t, 6) for t in times],
    }


def time_steps(
    steps: dict[str, cases.Step], warmup: int, repeats: int, batch_size: int, *, interleave: bool
) -> dict:
    """Warm each step up, then time `repeats` calls of each: round-robin (one call per step per
    round) when `interleave`, else all of one step's calls before the next step's."""
    first_call, times = {}, {name: [] for name in steps}

    def timed_call(name: str) -> float:
        started = time.perf_counter()
        steps[name]()
        return time.perf_counter() - started

    for name in steps:
        first_call[name] = timed_call(name)
        for _ in range(warmup - 1):
            steps[name]()
        if not interleave:
            times[name] = [timed_call(name) for _ in range(repeats)]
    if interleave:
        for _ in range(repeats):
            for name in steps:
                times[name].append(timed_call(name))
    return {name: summarize(times[name], batch_size, first_call[name]) for name in steps}


def bench_model(model: str, args: argparse.Namespace, frameworks: list[str]) -> dict:
    config = cases.experiment_config(model, args.seq_len)
    if args.jax_dtype:
        config.model.dtype = args.jax_dtype
    built = {}
    if "jax" in frameworks:
        built["jax"] = cases.build_jax(config)
    if "torch" in frameworks:
        built["torch"] = cases.build_torch(config, args.torch_attn)
    vocab = config.model.config_overrides.get("vocab_size") or 30522
    batch = cases.synthetic_batch(args.batch_size, args.seq_len, vocab, seed=config.seed)
    record: dict = {"cases": {}, "load_average_1_5_15": {"start": load_average()}}
    if "torch" in built:
        record["torch_info"] = cases.torch_info(built["torch"])
    make = {"jax": cases.jax_case, "torch": cases.torch_case}
    for case in args.cases.split(","):
        made = {fw: make[fw](built[fw], case, batch) for fw in frameworks}
        timed = time_steps(
            {fw: c.step for fw, c in made.items()},
            args.warmup,
            args.repeats,
            args.batch_size,
            interleave=args.order == "interleaved",
        )
        for fw, c in made.items():
            timed[fw]["optimizer_state_bytes"] = c.optimizer_state_bytes()
        if len(frameworks) == 2:
            timed["jax_over_torch_examples_per_s"] = (
                timed["jax"]["examples_per_s"] / timed["torch"]["examples_per_s"]
            )
        record["cases"][case] = timed
        print(
            f"  {model} {case}: "
            + ", ".join(f"{fw} {timed[fw]['median_s'] * 1e3:.1f} ms" for fw in frameworks),
            flush=True,
        )
        del made
    if args.components:
        components = {}
        if "jax" in built:
            components["jax"] = cases.jax_components(built["jax"], batch)
        if "torch" in built:
            components["torch"] = cases.torch_components(built["torch"], batch)
        record["components"] = {}
        for name in next(iter(components.values())):
            timed = time_steps(
                {fw: parts[name] for fw, parts in components.items()},
                args.warmup,
                args.repeats,
                args.batch_size,
                interleave=args.order == "interleaved",
            )
            record["components"][name] = timed
            print(
                f"  {model} component {name}: "
                + ", ".join(f"{fw} {timed[fw]['median_s'] * 1e3:.1f} ms" for fw in timed),
                flush=True,
            )
    if {"full", "phase1"} <= set(record["cases"]):
        record["phase1_time_over_full_time"] = {
            fw: record["cases"]["phase1"][fw]["median_s"] / record["cases"]["full"][fw]["median_s"]
            for fw in frameworks
        }
    record["targets"] = check_targets(record)
    record["load_average_1_5_15"]["end"] = load_average()
    return record


def accelerator_report(model: str, args: argparse.Namespace) -> dict:
    """JAX only: each case in float32 and bfloat16 compute; examples/s, model TFLOP/s and MFU."""
    import jax

    devices = jax.devices()
    peak = args.peak_tflops * 1e12 if args.peak_tflops else flops.peak_flops(devices[0].device_kind)
    report: dict = {
        "device_kind": devices[0].device_kind,
        "num_devices": len(devices),
        "peak_flops_per_device": peak,
        "dtypes": {},
    }
    for dtype in ("float32", "bfloat16"):
        config = cases.experiment_config(model, args.seq_len)
        config.model.dtype = dtype
        built = cases.build_jax(config)
        shape = {
            "num_layers": built.bert_config.num_hidden_layers,
            "hidden": built.bert_config.hidden_size,
            "intermediate": built.bert_config.intermediate_size,
            "batch": args.batch_size,
            "seq_len": args.seq_len,
        }
        batch = cases.synthetic_batch(args.batch_size, args.seq_len, built.bert_config.vocab_size)
        by_case = {}
        for case in args.cases.split(","):
            made = cases.jax_case(built, case, batch)
            entry = time_steps(
                {"jax": made.step}, args.warmup, args.repeats, args.batch_size, interleave=False
            )["jax"]
            entry["model_flops_per_step"] = flops.step_flops(case, **shape)
            entry["model_tflops_per_s"] = entry["model_flops_per_step"] / entry["median_s"] / 1e12
            entry["mfu"] = (
                flops.mfu(entry["model_flops_per_step"], entry["median_s"], peak, len(devices))
                if peak
                else None
            )
            by_case[case] = entry
            del made
        report["dtypes"][dtype] = by_case
        print(
            f"  {model} {dtype}: "
            + ", ".join(f"{c} {e['median_s'] * 1e3:.1f} ms" for c, e in by_case.items()),
            flush=True,
        )
    return report


def accelerator_table(results: dict) -> str:
    lines = [
        "| model | device | case | dtype | ex/s | model TFLOP/s | MFU |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, record in results.items():
        report = record.get("accelerator")
        if not report:
            continue
        device = f"{report['num_devices']} x {report['device_kind']}"
        for dtype, by_case in report["dtypes"].items():
            for case, e in by_case.items():
                mfu = f"{e['mfu']:.1%}" if e["mfu"] is not None else "- (peak unknown)"
                lines.append(
                    f"| {model} | {device} | {case} | {dtype} | {e['examples_per_s']:.1f} | "
                    f"{e['model_tflops_per_s']:.3f} | {mfu} |"
                )
    return "\n".join(lines)


def check_targets(record: dict) -> dict:
    measured = {}
    for case, key in (("full", "full_speedup_vs_torch"), ("eval", "eval_speedup_vs_torch")):
        ratio = record["cases"].get(case, {}).get("jax_over_torch_examples_per_s")
        if ratio is not None:
            measured[key] = {"target": f">= {TARGETS[key]}", "value": ratio, "met": ratio >= TARGETS[key]}
    ratio = record.get("phase1_time_over_full_time", {}).get("jax")
    if ratio is not None:
        key = "phase1_time_over_full_time"
        measured[key] = {"target": f"<= {TARGETS[key]}", "value": ratio, "met": ratio <= TARGETS[key]}
    return measured


def table(results: dict, frameworks: list[str]) -> str:
    lines = [
        "| model | case | "
        + " | ".join(f"{fw} ex/s (median s/step, IQR)" for fw in frameworks)
        + (" | jax / torch |" if len(frameworks) == 2 else " |"),
        "| --- | --- | "
        + " | ".join("---" for _ in frameworks)
        + (" | --- |" if len(frameworks) == 2 else " |"),
    ]
    for model, record in results.items():
        for case, timed in record["cases"].items():
            cells = [
                f"{timed[fw]['examples_per_s']:.1f} ({timed[fw]['median_s']:.3f}, {timed[fw]['iqr_s']:.3f})"
                for fw in frameworks
            ]
            ratio = timed.get("jax_over_torch_examples_per_s")
            lines.append(
                f"| {model} | {case} | "
                + " | ".join(cells)
                + (f" | {ratio:.2f}x |" if ratio is not None else " |")
            )
        for fw, ratio in record.get("phase1_time_over_full_time", {}).items():
            lines.append(f"| {model} | phase-1 time / full time, {fw} | {ratio:.2f} |")
        for name, timed in record.get("components", {}).items():
            cells = " | ".join(f"{fw} {timed[fw]['median_s']:.3f} s" for fw in timed)
            lines.append(f"| {model} | component {name} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    frameworks = args.frameworks.split(",")
    if "torch" in frameworks:
        import torch

        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
    if args.jax_prng_impl:
        import jax

        jax.config.update("jax_default_prng_impl", args.jax_prng_impl)
    machine = machine_info()
    if "torch" in frameworks:
        machine["torch"] = torch.__version__
        machine["torch_num_threads"] = torch.get_num_threads()
    print(
        f"{machine['cpu_model']}, {machine['cpus_available']} cores, load {machine['load_average_1_5_15']}, "
        f"batch {args.batch_size} x {args.seq_len}, warm-up {args.warmup}, repeats {args.repeats}",
        flush=True,
    )
    import jax

    on_accelerator = jax.default_backend() != "cpu"
    report_accelerator = args.accelerator_report == "on" or (
        args.accelerator_report == "auto" and on_accelerator
    )
    machine["jax_backend"] = jax.default_backend()
    results = {}
    for model in args.models.split(","):
        results[model] = bench_model(model, args, frameworks)
        if report_accelerator:
            results[model]["accelerator"] = accelerator_report(model, args)
    text = table(results, frameworks)
    if report_accelerator:
        text += "\n\n" + accelerator_table(results)
    payload = finish("train_speed", args, machine, results, text, targets=TARGETS)
    for model, record in results.items():
        for key, target in record["targets"].items():
            print(
                f"{model}: {key} = {target['value']:.3f} (target {target['target']}): "
                f"{'met' if target['met'] else 'MISSED'}"
            )
    return payload


if __name__ == "__main__":
    main()

"""Peak memory of the full and phase-1 training steps, per framework, and optimizer-state bytes.

  python -m benchmarks.memory                                  # MiniLM and bert-base size, 32 x 128
  python -m benchmarks.memory --quick --models tiny            # the smoke test

Every (framework, model, case) runs in a fresh subprocess (`--single`), so each peak is its own:
the process's peak RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`) once the model, optimizer state
(JAX; torch creates its lazily in the first step) and batch are built; after compiling the JAX step
ahead of time (`jit(...).lower(...).compile()`: the compiler's own peak); and after `--steps` steps.
"Added by steps" is the last minus the peak after compile: the step's working memory (activations,
gradients, and for torch its optimizer state). For JAX also XLA's own accounting of the compiled step
(`compiled.memory_analysis()`: temp buffers = activations, gradients and other intermediates) and its
estimate of the step's work (`compiled.cost_analysis()`: flops, bytes accessed).
Optimizer state: `optim.optimizer_state_bytes` of the real train state for JAX (phase 1 holds none
for the frozen backbone), the tensors in `optimizer.state` for torch. The JAX steps of
`cases.ADAPTATION_CASES` (LoRA, BitFit, adapters) run here too, each on its own model: adaptation.py
measures them this way.
"""

import argparse
import json
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks import cases, model_variants
from benchmarks.machine import load_average, machine_info, write_json

REPO = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "MEMORY_RESULT "
TRAIN_CASES = ("full", "phase1")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def current_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def parameter_bytes(framework: str, model) -> dict[str, int]:
    if framework == "jax":
        import jax

        return {
            part: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model.params[part]))
            for part in ("backbone", "head")
        }
    module = model.module
    backbone = sum(p.numel() * p.element_size() for p in module.backbone.parameters())
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    return {"backbone": backbone, "head": total - backbone}


def _jax_case(model, case: str, batch: dict) -> tuple[cases.Case, Callable[[], tuple[dict, dict]]]:
    """The case's step compiled ahead of time, so that the compiler's own peak is measured apart
    from the step's; the parameters are donated to the train state, not copied."""
    import jax

    from stackft_jax.runtime import sharding
    from stackft_jax.training import optim

    device_batch = sharding.put_batch(batch, model.mesh)
    if case == "eval":
        fn, args = cases.jax_eval_fn(model), (model.params, device_batch)
    else:
        state, phase_step = cases.jax_phase_step(model, case, copy_params=False)
        fn, args = phase_step.jitted_step, (state, device_batch, phase_step.dropout_key)
    compiled = {}

    def compile_step() -> tuple[dict, dict]:
        """XLA's accounting of the compiled step: its buffers (bytes), and its estimated work (flops,
        bytes read and written)."""
        compiled["fn"] = fn.lower(*args).compile()
        analysis = compiled["fn"].memory_analysis()
        cost = compiled["fn"].cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        return (
            {
                key: getattr(analysis, f"{key}_in_bytes")
                for key in ("temp_size", "argument_size", "output_size", "alias_size")
            },
            {key: cost.get(key) for key in ("flops", "bytes accessed")},
        )

    holder = {"args": args}

    def step() -> None:
        out = compiled["fn"](*holder["args"])
        jax.block_until_ready(out)
        if case != "eval":
            holder["args"] = (out[0], *holder["args"][1:])

    def state_bytes() -> int:
        return 0 if case == "eval" else optim.optimizer_state_bytes(holder["args"][0].opt_state)

    return cases.Case(step, state_bytes), compile_step


def run_single(framework: str, model_name: str, case: str, args: argparse.Namespace) -> dict:
    after_imports = current_rss_mib()
    config = cases.case_config(model_name, args.seq_len, case)
    batch = cases.synthetic_batch(args.batch_size, args.seq_len, 30522, seed=config.seed)
    if framework == "jax":
        model = cases.build_jax(config)
        params = parameter_bytes(framework, model)
        built, compile_step = _jax_case(model, case, batch)
    else:
        model = cases.build_torch(config)
        params = parameter_bytes(framework, model)
        built, compile_step = cases.torch_case(model, case, batch), lambda: ({}, {})
    after_build = peak_rss_mib()
    # XLA's own accounting of the compiled step: temp = its working buffers (activations, gradients).
    with model_variants.patched(args.jax_variant):
        xla_memory, xla_cost = compile_step()
    after_compile = peak_rss_mib()
    for _ in range(args.steps):
        built.step()
    after_steps = peak_rss_mib()
    return {
        "framework": framework,
        "model": model_name,
        "case": case,
        # stackft_jax imports transformers, whose AutoTokenizer imports torch: JAX processes hold it too.
        "torch_imported": "torch" in sys.modules,
        "rss_after_imports_mib": after_imports,
        "peak_rss_after_build_mib": after_build,
        "peak_rss_after_compile_mib": after_compile,
        "peak_rss_after_steps_mib": after_steps,
        "steps_added_mib": after_steps - after_compile,
        "rss_at_end_mib": current_rss_mib(),
        "optimizer_state_bytes": built.optimizer_state_bytes(),
        "parameter_bytes": params,
        "xla_memory_analysis_bytes": xla_memory,
        "xla_cost_analysis": xla_cost,
    }


def run_in_subprocess(framework: str, model: str, case: str, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.memory",
        "--single",
        framework,
        model,
        case,
        f"--batch-size={args.batch_size}",
        f"--seq-len={args.seq_len}",
        f"--steps={args.steps}",
        f"--jax-variant={args.jax_variant}",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="minilm,bert_base", help=f"comma list of {cases.MODELS}")
    parser.add_argument("--frameworks", default="jax,torch")
    parser.add_argument(
        "--cases",
        default=",".join(TRAIN_CASES),
        help=f"comma list of {cases.CASES}, or (jax only) of {tuple(cases.ADAPTATION_CASES)}",
    )
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--steps", type=int, help="training steps per subprocess (3; --quick: 1)")
    parser.add_argument(
        "--jax-variant",
        default="baseline",
        help="experiment: a benchmarks/model_variants.py patch applied while the JAX step compiles",
    )
    parser.add_argument("--quick", action="store_true", help="batch 8 x 32, one step")
    parser.add_argument("--single", nargs=3, metavar=("FRAMEWORK", "MODEL", "CASE"), help="(internal)")
    parser.add_argument("--out", default="benchmarks/out/memory.json")
    args = parser.parse_args(argv)
    defaults = (
        {"batch_size": 8, "seq_len": 32, "steps": 1}
        if args.quick
        else {
            "batch_size": 32,
            "seq_len": 128,
            "steps": 3,
        }
    )
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.single:
        print(RESULT_PREFIX + json.dumps(run_single(*args.single, args)), flush=True)
        return None
    load_start = load_average()
    rows = []
    for model in args.models.split(","):
        for framework in args.frameworks.split(","):
            for case in args.cases.split(","):
                row = run_in_subprocess(framework, model, case, args)
                rows.append(row)
                print(
                    f"  {framework} {model} {case}: peak {row['peak_rss_after_steps_mib']:.0f} MiB",
                    flush=True,
                )
    lines = [
        "| model | framework | case | RSS after imports | peak after build | peak after compile | "
        "peak after steps | added by steps | optimizer state | XLA temp buffers |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['framework']} | {r['case']} | {r['rss_after_imports_mib']:.0f} | "
            f"{r['peak_rss_after_build_mib']:.0f} | {r['peak_rss_after_compile_mib']:.0f} | "
            f"{r['peak_rss_after_steps_mib']:.0f} | {r['steps_added_mib']:.0f} | "
            f"{r['optimizer_state_bytes'] / 2**20:.2f} | "
            + (
                f"{r['xla_memory_analysis_bytes']['temp_size'] / 2**20:.0f} |"
                if r["xla_memory_analysis_bytes"]
                else "- |"
            )
        )
    text = "\n".join(lines)
    print("(MiB; peaks are ru_maxrss; torch builds its optimizer state in the first step)")
    print(text)
    payload = {
        "benchmark": "memory",
        "machine": machine_info(),
        "args": vars(args),
        "load_average_1_5_15": {"start": load_start, "end": load_average()},
        "results": rows,
        "table_markdown": text,
    }
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()

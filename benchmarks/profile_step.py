"""Where a jitted step's time goes: per-XLA-op time from a `jax.profiler` trace, mapped to source lines.

  python -m benchmarks.profile_step --model minilm --case eval
  python -m benchmarks.profile_step --model minilm --case full --steps 3 --top 30
  python -m benchmarks.profile_step --quick --model tiny           # the smoke test
  python -m benchmarks.profile_step --tail --model bert_base       # the optimizer tail's bytes

`--tail` profiles nothing: it reads XLA's cost analysis (`compiled.cost_analysis()`, bytes accessed) of
the phase-2 train step as runs compile it, with and without the per-part norms of logged steps, under
each non-finite guard (`config.nonfinite_guard`: the default `skip_update` and `select`, `--guards`), and
of its gradient part alone (`steps.loss_and_grads`); the difference is the post-gradient tail (the
non-finite guard, clipping, AdamW, the parameter update, and on logged steps the norms).

Builds the same jitted step as `train_speed` (benchmarks/cases.py), warms it up, traces `--steps` calls
with `jax.profiler.trace`, and reads the trace back with `jax.profiler.ProfileData`: every executed XLA
thunk is an event whose `hlo_op` stat names the HLO instruction. The compiled module's text gives each
instruction its fusion kind (`ynn` = run by YNNPACK: dots and some reductions; `kLoop` = an
elementwise/reduce loop emitted by XLA), the JAX primitive path (`op_name`) and the Python source line
that produced it.
Reported per step: time per instruction, per source line and per category (matmul, dropout RNG,
other elementwise). Thunks can run concurrently on the CPU's threads, so the sum can exceed the wall
time.
"""

import argparse
import collections
import glob
import re
import statistics
import tempfile
import time

import jax
from jax._src.profiler import ProfileData  # public as jax.profiler.ProfileData in newer releases

from benchmarks import cases
from benchmarks.machine import load_average, machine_info, write_json
from stackft_jax.config import spec
from stackft_jax.runtime import sharding
from stackft_jax.training import optim, steps

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = .*?(?:kind=(?P<kind>\w+))?.*?"
    r'metadata=\{op_name="(?P<op_name>[^"]*)"(?: stack_frame_id=(?P<frame>\d+))?'
)


def _table(text: str, header: str, pattern: str) -> dict[int, re.Match]:
    """One of the numbered tables (FileNames, FunctionNames, FileLocations, StackFrames) at the top of
    a compiled module's text."""
    rows = {}
    inside = False
    for line in text.splitlines():
        if line.strip() == header:
            inside = True
            continue
        if inside:
            match = re.match(r"^(\d+) " + pattern, line)
            if not match:
                break
            rows[int(match.group(1))] = match
    return rows


def instruction_sources(hlo_text: str) -> dict[str, dict]:
    """HLO instruction name -> fusion kind, op_name and 'file.py:line function' of its source."""
    files = _table(hlo_text, "FileNames", r'"(.*)"$')
    functions = _table(hlo_text, "FunctionNames", r'"(.*)"$')
    locations = _table(hlo_text, "FileLocations", r"\{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)")
    frames = _table(hlo_text, "StackFrames", r"\{file_location_id=(\d+) parent_frame_id=(\d+)")

    def source(frame_id: int | None) -> str:
        if frame_id is None or frame_id not in frames:
            return "?"
        location = locations.get(int(frames[frame_id].group(2)))
        if location is None:
            return "?"
        path = files[int(location.group(2))].group(2)
        function = functions[int(location.group(3))].group(2)
        return f"{path.rsplit('/', 1)[-1]}:{location.group(4)} {function}"

    out = {}
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            frame = match.group("frame")
            ynn = "__ynn_fusion" in line
            onednn = "onednn" in line.lower()
            out[match.group("name")] = {
                "kind": "ynn" if ynn else "onednn" if onednn else match.group("kind") or "op",
                "op_name": match.group("op_name"),
                "source": source(int(frame) if frame else None),
            }
    return out


def category(info: dict) -> str:
    op_name = info["op_name"]
    if op_name.endswith("dot_general"):
        return "matmul"
    if any(word in op_name for word in ("threefry", "random_bits", "bernoulli", "random_wrap")):
        return "dropout RNG"
    return "other (elementwise, reductions, copies)"


def build(model_name: str, case: str, batch_size: int, seq_len: int):
    """The jitted function and its arguments, as `cases.jax_case` builds them."""
    config = cases.experiment_config(model_name, seq_len)
    model = cases.build_jax(config)
    batch = sharding.put_batch(
        cases.synthetic_batch(batch_size, seq_len, 30522, seed=config.seed), model.mesh
    )
    if case == "eval":
        return cases.jax_eval_fn(model), (model.params, batch), False
    state, phase_step = cases.jax_phase_step(model, case)
    return phase_step.jitted_step, (state, batch, phase_step.dropout_key), True


def profile(model_name: str, case: str, args: argparse.Namespace) -> dict:
    fn, fn_args, donates = build(model_name, case, args.batch_size, args.seq_len)
    hlo_text = fn.lower(*fn_args).compile().as_text()
    module = re.search(r"HloModule (\S+?),", hlo_text).group(1)
    sources = instruction_sources(hlo_text)

    def call():
        nonlocal fn_args
        out = fn(*fn_args)
        jax.block_until_ready(out)
        if donates:  # the train step's new state replaces the donated one
            fn_args = (out[0], *fn_args[1:])

    for _ in range(args.warmup):
        call()
    wall = []
    with tempfile.TemporaryDirectory(prefix="profile_step_") as trace_dir:
        with jax.profiler.trace(trace_dir):
            for _ in range(args.steps):
                started = time.perf_counter()
                call()
                wall.append(time.perf_counter() - started)
        (path,) = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
        data = ProfileData.from_file(path)
    per_op: collections.Counter = collections.Counter()
    plane = data.find_plane_with_name("/host:CPU")
    for line in plane.lines:
        for event in line.events:
            stats = dict(event.stats)
            if stats.get("hlo_module") == module and "hlo_op" in stats:
                per_op[stats["hlo_op"]] += event.duration_ns / 1e6 / args.steps
    step_ms = statistics.median(wall) * 1e3
    rows = []
    for name, ms in per_op.most_common():
        info = sources.get(name, {"kind": "?", "op_name": "?", "source": "?"})
        rows.append({"hlo_op": name, "ms_per_step": ms, **info, "category": category(info)})
    by_source: collections.Counter = collections.Counter()
    by_category: collections.Counter = collections.Counter()
    for row in rows:
        by_source[row["source"]] += row["ms_per_step"]
        by_category[row["category"]] += row["ms_per_step"]
    return {
        "model": model_name,
        "case": case,
        "hlo_module": module,
        "traced_step_wall_ms_median": step_ms,
        "op_time_sum_ms_per_step": sum(per_op.values()),
        "by_category_ms": dict(by_category.most_common()),
        "by_source_ms": dict(by_source.most_common()),
        "ops": rows,
    }


def _bytes_accessed(compiled) -> float:
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis  # older jax: one per program
    return float(analysis["bytes accessed"])


def tail_bytes(model_name: str, batch_size: int, seq_len: int, guards: list[str]) -> dict:
    """Bytes accessed (XLA cost analysis) of the phase-2 step and its logged-step variant under each
    non-finite guard (config.nonfinite_guard), and of its gradient part alone; the tail is the step less
    the gradient part."""
    by_guard = {}
    for guard in guards:
        config = cases.experiment_config(model_name, seq_len)
        config.nonfinite_guard = guard
        model = cases.build_jax(config)
        state, phase_step = cases.jax_phase_step(model, "full")
        batch = sharding.put_batch(
            cases.synthetic_batch(batch_size, seq_len, 30522, seed=config.seed), model.mesh
        )
        args = (state, batch, phase_step.dropout_key)
        if not by_guard:  # the gradient part is the same under every guard
            gradient_bytes = _bytes_accessed(_gradients_only(model).lower(*args).compile())
            parameters = sum(int(x.size) for x in jax.tree.leaves(state.params))
        step_bytes = _bytes_accessed(phase_step.jitted_step.lower(*args).compile())
        logged_bytes = _bytes_accessed(phase_step.jitted_step_with_norms.lower(*args).compile())
        by_guard[guard] = {
            "step_bytes": step_bytes,
            "logged_step_bytes": logged_bytes,
            "step_tail_bytes": step_bytes - gradient_bytes,
            "logged_step_tail_bytes": logged_bytes - gradient_bytes,
        }
    return {
        "model": model_name,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "parameters": parameters,
        "default_guard": cases.experiment_config(model_name, seq_len).nonfinite_guard,
        "gradient_part_bytes": gradient_bytes,
        "by_guard": by_guard,
    }


def _gradients_only(model: cases.JaxModel):
    """The phase-2 step's gradient part (`steps.loss_and_grads`), jitted with the step's shardings."""
    phase = cases.case_phase(model, "full")
    _, labels = optim.phase_optimizer(model.params, phase, max_grad_norm=model.spec.max_grad_norm)
    trainable = optim.trainable_mask(labels)

    def gradients(state, batch, dropout_key):
        return steps.loss_and_grads(
            state.params,
            batch,
            jax.random.fold_in(dropout_key, state.step),
            trainable=trainable,
            graphdef=model.graphdef,
            objective=model.task.objective,
            backbone_deterministic=not phase.backbone_dropout,
        )

    replicated = sharding.replicated(model.mesh)
    return jax.jit(
        gradients,
        in_shardings=(replicated, sharding.data_sharded(model.mesh), replicated),
        out_shardings=replicated,
    )


def print_tail(result: dict) -> None:
    print("| program | non-finite guard | GB accessed | post-gradient GB |\n| --- | --- | --- | --- |")
    print(f"| gradients only | - | {result['gradient_part_bytes'] / 1e9:.2f} | - |")
    for name, key in (("train step", "step"), ("logged train step (per-part norms)", "logged_step")):
        for guard, row in result["by_guard"].items():
            label = f"{guard} (default)" if guard == result["default_guard"] else guard
            accessed, tail = row[f"{key}_bytes"] / 1e9, row[f"{key}_tail_bytes"] / 1e9
            print(f"| {name} | {label} | {accessed:.2f} | {tail:.2f} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", help=f"one of {cases.MODELS}")
    parser.add_argument("--case", default="eval", help=f"comma list of {cases.CASES}")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, help="traced calls (3; --quick: 1)")
    parser.add_argument("--top", type=int, default=20, help="rows printed per table")
    parser.add_argument("--quick", action="store_true", help="batch 8 x 32, one traced call")
    parser.add_argument("--tail", action="store_true", help="the phase-2 step's post-gradient bytes")
    parser.add_argument(
        "--guards",
        default=",".join(spec.NONFINITE_GUARDS),
        help="--tail: comma list of config.nonfinite_guard values to compare",
    )
    parser.add_argument("--out", default="benchmarks/out/profile_step.json")
    args = parser.parse_args(argv)
    quick = args.quick
    args.batch_size = args.batch_size or (8 if quick else 32)
    args.seq_len = args.seq_len or (32 if quick else 128)
    args.steps = args.steps or (1 if quick else 3)
    if quick:
        args.warmup = 1
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.tail:
        result = tail_bytes(args.model, args.batch_size, args.seq_len, args.guards.split(","))
        print_tail(result)
        payload = {
            "benchmark": "profile_step_tail",
            "machine": machine_info(),
            "args": vars(args),
            "results": result,
        }
        write_json(args.out.replace(".json", "_tail.json"), payload)
        return payload
    load_start = load_average()
    results = [profile(args.model, case, args) for case in args.case.split(",")]
    for r in results:
        print(
            f"\n{r['model']} {r['case']}: traced step {r['traced_step_wall_ms_median']:.0f} ms wall, "
            f"XLA ops sum {r['op_time_sum_ms_per_step']:.0f} ms"
        )
        print("| category | ms/step |\n| --- | --- |")
        for name, ms in r["by_category_ms"].items():
            print(f"| {name} | {ms:.1f} |")
        print("| source line | ms/step |\n| --- | --- |")
        for name, ms in list(r["by_source_ms"].items())[: args.top]:
            print(f"| {name} | {ms:.1f} |")
        print("| HLO op | kind | ms/step | op_name | source |\n| --- | --- | --- | --- | --- |")
        for row in r["ops"][: args.top]:
            op_name = row["op_name"].rsplit("/", 2)[-2:]
            print(
                f"| {row['hlo_op']} | {row['kind']} | {row['ms_per_step']:.1f} | {'/'.join(op_name)} "
                f"| {row['source']} |"
            )
    payload = {
        "benchmark": "profile_step",
        "machine": machine_info(),
        "args": vars(args),
        "load_average_1_5_15": {"start": load_start, "end": load_average()},
        "results": results,
    }
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()

"""The matmuls of a BERT step timed alone, JAX (XLA) against torch: how fast either step could be.

  python -m benchmarks.gemm                                   # MiniLM, 32 x 128
  python -m benchmarks.gemm --models minilm,bert_base --xla-flag-sets all
  python -m benchmarks.gemm --train-speed-json benchmarks/out/train_speed_now.json   # + reachable ratios
  python -m benchmarks.gemm --dtype bfloat16                  # both frameworks' bf16 matmuls
  python -m benchmarks.gemm --quick --models tiny             # the smoke test

Every matrix product of the encoder, in the canonical layout and in float32 (or `--dtype`), as each
framework runs a plain product (jitted `jnp.einsum` / `torch.einsum`): per layer the Q, K, V and output
projections ([T, H] x [H, H], four of them), the feed-forward in and out projections ([T, H] x [H, I],
[T, I] x [I, H]) and the attention scores and context (batched over batch x heads); T = batch x length tokens.
A training step runs each dense product three times (forward y = x W, input gradient dx = dy W^T,
weight gradient dW = x^T dy) and the two attention products' four gradient products; phase 1 and eval
run the forward products only (the frozen backbone has no backward). Per product, JAX's calls and then
torch's, warm-up excluded, median of the repeats.

What it is for: the sum over a step's products ("GEMM floor") is the time that step needs if
everything else (softmax, LayerNorm, GELU, dropout, the optimizer) were free. With `--train-speed-json`
(a `train_speed` run of the same shapes), each case also gets

    reachable jax / torch = torch's measured step time / JAX's GEMM floor,

the examples/s ratio JAX cannot exceed with XLA's matmuls, whatever the rest of the step costs.

XLA:CPU picks its matmul library by flag, process-wide, so `--xla-flag-sets` times the JAX products
again in a subprocess per flag set (torch is timed once, in this process):
  stackft_jax   XLA's own defaults (YNNPACK fusions): what every stackft_jax command runs.
  eigen         --xla_cpu_experimental_ynn_fusion_type= (dots to XLA's Eigen runtime).
  onednn        --xla_cpu_experimental_onednn_custom_call=true.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import cases
from benchmarks.machine import finish, machine_info
from stackft_jax.models import bert
from stackft_jax.training import build

# name -> (environment changes of the subprocess, extra XLA flags)
XLA_FLAG_SETS: dict[str, tuple[dict[str, str], str]] = {
    "stackft_jax": ({}, ""),
    "eigen": ({}, "--xla_cpu_experimental_ynn_fusion_type="),
    "onednn": ({}, "--xla_cpu_experimental_onednn_custom_call=true"),
}


def model_dims(model: str) -> dict[str, int]:
    """Hidden size, intermediate size, layers and heads of a `benchmarks.cases` model."""
    config = cases.experiment_config(model, seq_len=128)
    b = build.backbone_config(config, bert.resolve_model_dir(config.model.name_or_path))
    return {
        "hidden_size": b.hidden_size,
        "num_hidden_layers": b.num_hidden_layers,
        "num_attention_heads": b.num_attention_heads,
        "intermediate_size": b.intermediate_size,
    }


def products(dims: dict[str, int], batch: int, seq_len: int) -> list[dict[str, Any]]:
    """The distinct matrix products of one step: einsum spec, operand shapes, and how many of each
    a step runs per case (0 where the case does not run it)."""
    t, h, i = batch * seq_len, dims["hidden_size"], dims["intermediate_size"]
    layers, heads = dims["num_hidden_layers"], dims["num_attention_heads"]
    bh, d, length = batch * heads, h // heads, seq_len
    rows = []

    def add(name: str, spec: str, a: tuple, b: tuple, forward: int, backward: int) -> None:
        rows.append(
            {
                "name": name,
                "spec": spec,
                "shapes": [list(a), list(b)],
                "per_step": {
                    "full": layers * (forward + backward),
                    "phase1": layers * forward,
                    "eval": layers * forward,
                },
            }
        )

    for name, (k, n), count in (("qkvo", (h, h), 4), ("ffn_in", (h, i), 1), ("ffn_out", (i, h), 1)):
        add(f"{name} forward", "mk,kn->mn", (t, k), (k, n), count, 0)
        add(f"{name} input grad", "mn,kn->mk", (t, n), (k, n), 0, count)
        add(f"{name} weight grad", "mk,mn->kn", (t, k), (t, n), 0, count)
    # Attention: scores S = Q K^T and context C = P V forward; dQ = dS K and dP = dC V^T have the same
    # forms as the forward two, dK = dS^T Q and dV = P^T dC contract over the query axis.
    add("attn q.k / dC.v", "bqd,bkd->bqk", (bh, length, d), (bh, length, d), 1, 1)
    add("attn p.v / dS.k", "bqk,bkd->bqd", (bh, length, length), (bh, length, d), 1, 1)
    add("attn dS^T.q / P^T.dC", "bqk,bqd->bkd", (bh, length, length), (bh, length, d), 0, 2)
    return rows


def flops(row: dict) -> float:
    """2 x the product of every distinct index size of the einsum."""
    sizes: dict[str, int] = {}
    operands, _ = row["spec"].split("->")
    for letters, shape in zip(operands.split(","), row["shapes"], strict=True):
        sizes.update(zip(letters, shape, strict=True))
    return 2.0 * float(np.prod(list(sizes.values())))


def _jax_product(row: dict, dtype: str):
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal(s, dtype=np.float32), dtype=dtype) for s in row["shapes"])
    fn = jax.jit(lambda x, y: jnp.einsum(row["spec"], x, y))
    return lambda: jax.block_until_ready(fn(a, b))


def _torch_product(row: dict, dtype: str):
    import torch

    rng = np.random.default_rng(0)
    a, b = (
        torch.from_numpy(rng.standard_normal(s, dtype=np.float32)).to(getattr(torch, dtype))
        for s in row["shapes"]
    )
    return lambda: torch.einsum(row["spec"], a, b)


def time_products(
    rows: list[dict], frameworks: list[str], warmup: int, repeats: int, dtype: str = "float32"
) -> None:
    """Adds `{framework}_s` (median seconds per call) to every row. Per product, each framework's calls
    run as one block: calls of a few ms are slowed when the other framework's threads are still
    spinning from its previous call (alternating call by call made JAX's products up to 1.5x slower)."""
    builders = {"jax": _jax_product, "torch": _torch_product}
    for row in rows:
        for fw in frameworks:
            call = builders[fw](row, dtype)
            for _ in range(warmup):
                call()
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                call()
                times.append(time.perf_counter() - started)
            row[f"{fw}_s"] = statistics.median(times)


def floors(rows: list[dict], key: str) -> dict[str, float]:
    """Per case, the summed time of its products: the step time if only matmuls cost anything."""
    return {case: sum(r["per_step"][case] * r[key] for r in rows) for case in cases.CASES}


def _jax_in_subprocess(flag_set: str, args: argparse.Namespace, model: str) -> dict:
    env_changes, extra_flags = XLA_FLAG_SETS[flag_set]
    env = {**os.environ, **env_changes}
    env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {extra_flags}".strip()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gemm.json"
        cmd = [
            sys.executable, "-m", "benchmarks.gemm", f"--models={model}", "--frameworks=jax",
            f"--batch-size={args.batch_size}", f"--seq-len={args.seq_len}", f"--warmup={args.warmup}",
            f"--repeats={args.repeats}", f"--dtype={args.dtype}", "--xla-flag-sets=", f"--out={out}",
        ]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"flag set {flag_set!r} failed:\n{proc.stdout}\n{proc.stderr}")
        payload = json.loads(out.read_text())
    record = payload["results"][model]
    record["xla_flags"] = payload["machine"]["xla_flags"]
    return record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="minilm", help=f"comma list of {cases.MODELS}")
    parser.add_argument("--frameworks", default="jax,torch", help="jax, torch or both")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="operands of both frameworks"
    )
    parser.add_argument("--repeats", type=int, help="timed calls per product and framework (9)")
    parser.add_argument(
        "--xla-flag-sets",
        default="",
        help=f"comma list of {sorted(XLA_FLAG_SETS)} (or 'all'): JAX products again per flag set",
    )
    parser.add_argument(
        "--train-speed-json", help="a train_speed JSON of the same shapes: adds reachable ratios"
    )
    parser.add_argument("--quick", action="store_true", help="batch 4 x 16, 2 repeats")
    parser.add_argument("--out", default="benchmarks/out/gemm.json")
    args = parser.parse_args(argv)
    args.batch_size = args.batch_size or (4 if args.quick else 32)
    args.seq_len = args.seq_len or (16 if args.quick else 128)
    args.repeats = args.repeats or (2 if args.quick else 9)
    if args.xla_flag_sets == "all":
        args.xla_flag_sets = ",".join(XLA_FLAG_SETS)
    unknown = {s for s in args.xla_flag_sets.split(",") if s} - set(XLA_FLAG_SETS)
    if unknown:
        parser.error(f"--xla-flag-sets: unknown {sorted(unknown)}; choose from {sorted(XLA_FLAG_SETS)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    frameworks = args.frameworks.split(",")
    machine = machine_info()
    step_times = json.loads(Path(args.train_speed_json).read_text()) if args.train_speed_json else None
    results: dict[str, Any] = {}
    lines = []
    for model in args.models.split(","):
        rows = products(model_dims(model), args.batch_size, args.seq_len)
        time_products(rows, frameworks, args.warmup, args.repeats, args.dtype)
        record: dict[str, Any] = {"products": rows}
        for fw in frameworks:
            record[f"{fw}_floor_s"] = floors(rows, f"{fw}_s")
        flag_sets = {}
        for flag_set in filter(None, args.xla_flag_sets.split(",")):
            sub = _jax_in_subprocess(flag_set, args, model)
            flag_sets[flag_set] = {
                "xla_flags": sub["xla_flags"],
                "jax_floor_s": sub["jax_floor_s"],
                "jax_s": {r["name"]: r["jax_s"] for r in sub["products"]},
            }
        record["xla_flag_sets"] = flag_sets
        if step_times is not None:
            measured = step_times["results"][model]["cases"]
            record["reachable_jax_over_torch"] = {
                case: measured[case]["torch"]["median_s"] / record["jax_floor_s"][case]
                for case in cases.CASES
                if "jax_floor_s" in record and case in measured and "torch" in measured[case]
            }
            record["measured_step_s"] = {
                case: {fw: measured[case][fw]["median_s"] for fw in ("jax", "torch") if fw in measured[case]}
                for case in cases.CASES
                if case in measured
            }
        results[model] = record
        lines += _tables(model, record, frameworks)
    return finish("gemm", args, machine, results, "\n".join(lines))


def _markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _tables(model: str, record: dict, frameworks: list[str]) -> list[str]:
    both = {"jax", "torch"} <= set(frameworks)
    header = ["product", "shapes", "per full step"] + [f"{fw} ms (GFLOP/s)" for fw in frameworks]
    header += ["jax time / torch"] if both else []
    lines = ["", f"{model}: per product", _markdown_row(header), _markdown_row(["---"] * len(header))]
    for r in record["products"]:
        shapes = " x ".join("[" + ",".join(map(str, s)) + "]" for s in r["shapes"])
        cells = [r["name"], shapes, str(r["per_step"]["full"])]
        cells += [f"{r[f'{fw}_s'] * 1e3:.2f} ({flops(r) / r[f'{fw}_s'] / 1e9:.0f})" for fw in frameworks]
        cells += [f"{r['jax_s'] / r['torch_s']:.2f}"] if both else []
        lines.append(_markdown_row(cells))

    measured = "measured_step_s" in record
    header = ["case"] + [f"{fw} floor" for fw in frameworks]
    header += [f"jax floor, {name}" for name in record["xla_flag_sets"]]
    header += ["measured jax step", "measured torch step", "reachable jax / torch"] if measured else []
    lines += ["", f"{model}: GEMM floor per step (s)", _markdown_row(header)]
    lines.append(_markdown_row(["---"] * len(header)))
    for case in cases.CASES:
        cells = [case] + [f"{record[f'{fw}_floor_s'][case]:.3f}" for fw in frameworks]
        cells += [f"{fs['jax_floor_s'][case]:.3f}" for fs in record["xla_flag_sets"].values()]
        if measured:
            step = record["measured_step_s"].get(case, {})
            reach = record["reachable_jax_over_torch"].get(case)
            cells += [f"{step[fw]:.3f}" if fw in step else "-" for fw in ("jax", "torch")]
            cells.append(f"{reach:.2f}x" if reach is not None else "-")
        lines.append(_markdown_row(cells))
    return lines


if __name__ == "__main__":
    main()

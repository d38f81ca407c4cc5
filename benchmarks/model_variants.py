"""Experiment: what model-code choices cost in the JAX steps, measured against stackft_jax as it is.

  python -m benchmarks.model_variants                             # MiniLM, 32 x 128, all variants
  STACKFT_JAX_NO_XLA_DEFAULTS=1 python -m benchmarks.model_variants   # without xla_flags.py's flags
  python -m benchmarks.model_variants --quick --models tiny       # the smoke test

Nothing in stackft_jax/ is edited: each variant patches a method at trace time only, the step is
jitted and warmed up under the patch, and the patch is undone; compiled steps keep what they traced.
All variants' steps then run in this one process, round-robin, so machine load affects them alike.

Variants (combined with "+") put back what stackft_jax used before the changes measured in
benchmarks/RESULTS.md, so "time over baseline" > 1 is what each change saves:
  baseline           stackft_jax as it is (packed-bits dropout, attention context in [b, h, k, d]).
  bernoulli_dropout  dropout masks from `jax.random.bernoulli`, one 32-bit draw per element, as
                     `nnx.Dropout` does, instead of models/dropout.py's one byte per element.
  attn_bqhd          the attention context as `einsum("bhqk,bkhd->bqhd", probs, v)`: the same math,
                     with the output layout XLA:CPU's dot emitter handles badly.
"""

import argparse
import contextlib
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks import cases
from benchmarks.machine import load_average, machine_info, write_json
from stackft_jax.models import bert, dropout


def _attention_bqhd(self, x, mask_bias, *, deterministic, rngs):
    batch, length, hidden = x.shape

    def heads(t):
        return t.reshape(batch, length, self.num_heads, self.head_dim)

    q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    scores = scores * (self.head_dim**-0.5) + mask_bias
    probs = jax.nn.softmax(scores, axis=-1)
    probs = self.dropout(probs, deterministic=deterministic, rngs=rngs).astype(self.dtype)
    context = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, hidden)
    return self.output(context)


def _bernoulli_dropout(self, inputs, *, deterministic, rngs=None):
    if deterministic or self.rate == 0.0:
        return inputs
    keep = jax.random.bernoulli(rngs[self.rng_collection](), 1.0 - self.rate, inputs.shape)
    return jax.lax.select(keep, inputs / (1.0 - self.rate), jnp.zeros_like(inputs))


PATCHES = {
    "attn_bqhd": (bert.BertSelfAttention, "__call__", _attention_bqhd),
    "bernoulli_dropout": (dropout.Dropout, "__call__", _bernoulli_dropout),
}


@contextlib.contextmanager
def patched(variant: str):
    names = [] if variant == "baseline" else variant.split("+")
    unknown = set(names) - set(PATCHES)
    if unknown:
        raise ValueError(f"unknown variant part(s) {sorted(unknown)}; choose from {sorted(PATCHES)}")
    saved = [(PATCHES[n][0], PATCHES[n][1], getattr(PATCHES[n][0], PATCHES[n][1])) for n in names]
    try:
        for name in names:
            owner, attr, replacement = PATCHES[name]
            setattr(owner, attr, replacement)
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="minilm", help=f"comma list of {cases.MODELS}")
    parser.add_argument("--cases", default=",".join(cases.CASES))
    parser.add_argument(
        "--variants", default="baseline,bernoulli_dropout,attn_bqhd,attn_bqhd+bernoulli_dropout"
    )
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--repeats", type=int, help="timed rounds (5; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="batch 8 x 32, one round")
    parser.add_argument("--out", default="benchmarks/out/model_variants.json")
    args = parser.parse_args(argv)
    args.batch_size = args.batch_size or (8 if args.quick else 32)
    args.seq_len = args.seq_len or (32 if args.quick else 128)
    args.repeats = args.repeats or (1 if args.quick else 5)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    machine = machine_info()
    results = {}
    for model_name in args.models.split(","):
        config = cases.experiment_config(model_name, args.seq_len)
        model = cases.build_jax(config)
        batch = cases.synthetic_batch(args.batch_size, args.seq_len, 30522, seed=config.seed)
        steps = {}
        for variant in args.variants.split(","):
            for case in args.cases.split(","):
                with patched(variant):
                    built = cases.jax_case(model, case, batch)
                    built.step()  # traces and compiles under the patch
                built.step()
                steps[(variant, case)] = built.step
        times = {key: [] for key in steps}
        for _ in range(args.repeats):
            for key, step in steps.items():
                started = time.perf_counter()
                step()
                times[key].append(time.perf_counter() - started)
        record = {}
        for (variant, case), values in times.items():
            median = statistics.median(values)
            baseline = statistics.median(times.get(("baseline", case), values))
            record.setdefault(variant, {})[case] = {
                "median_s": median,
                "times_s": [round(t, 6) for t in values],
                "time_over_baseline": median / baseline,
            }
        results[model_name] = record
    lines = [
        "| model | variant | "
        + " | ".join(f"{c} s (vs baseline)" for c in args.cases.split(","))
        + " | phase1 / full |",
        "| --- | --- | " + " | ".join("---" for _ in args.cases.split(",")) + " | --- |",
    ]
    for model_name, record in results.items():
        for variant, by_case in record.items():
            cells = [f"{v['median_s']:.3f} ({v['time_over_baseline']:.2f}x)" for v in by_case.values()]
            ratio = (
                f"{by_case['phase1']['median_s'] / by_case['full']['median_s']:.2f}"
                if {"full", "phase1"} <= set(by_case)
                else "-"
            )
            lines.append(f"| {model_name} | {variant} | " + " | ".join(cells) + f" | {ratio} |")
    text = "\n".join(lines)
    print(text)
    machine["load_average_1_5_15_end"] = load_average()
    payload = {
        "benchmark": "model_variants",
        "machine": machine,
        "args": vars(args),
        "results": results,
        "table_markdown": text,
    }
    write_json(args.out, payload)
    return payload


if __name__ == "__main__":
    main()

"""Experiment: what model-code choices cost in the JAX steps, measured against stackft_jax as it is.

  python -m benchmarks.model_variants                             # MiniLM, 32 x 128, old code of each change
  XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python -m benchmarks.model_variants  # Eigen dots
  python -m benchmarks.model_variants --quick --models tiny       # the smoke test

Nothing in stackft_jax/ is edited: each variant patches a method or module function at trace time
only, the step is jitted and warmed up under the patch, and the patch is undone; compiled steps keep
what they traced.
All variants' steps then run in this one process, round-robin, so machine load affects them alike.

Variants (combined with "+"). The first three put back what stackft_jax used before the changes measured
in benchmarks/RESULTS.md, so "time over baseline" > 1 is what each change saves:
  baseline           stackft_jax as it is (packed-bits dropout, attention context in [b, h, k, d]).
  bernoulli_dropout  dropout masks from `jax.random.bernoulli`, one 32-bit draw per element, as
                     `nnx.Dropout` does, instead of models/dropout.py's one byte per element.
  attn_bqhd          the attention context as `einsum("bhqk,bkhd->bqhd", probs, v)`: the same math,
                     with the output layout XLA:CPU's dot emitter handles badly.
  autodiff_dense     every dense layer's gradient derived by autodiff (`nnx.Linear.__call__`) instead
                     of models/dense.py's written-out `matmul` backward.
The others are proposals that were measured and not adopted (< 1 would be a saving):
  mask_bitcast       dropout bytes by `lax.bitcast_convert_type(words, uint8)` instead of shifts + stack.
  bias_grad_dot      every dense layer's bias gradient as a matrix-vector product (ones @ dy) through a
                     custom VJP, instead of XLA's reduction (14 ms vs 1.3 ms alone for [4096, 1536]).
  ln_vjp             LayerNorm (float32) with its backward written out (a custom VJP) instead of autodiff's.
  attn_bhld          Q, K, V transposed to [b, h, l, d] once, both attention einsums in that layout.
  qkv_fused          one [H, 3H] matmul for Q, K and V (kernels concatenated per call).
"""

import argparse
import contextlib
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks import cases
from benchmarks.machine import finish, machine_info
from stackft_jax.models import attention, bert, dense, dropout


def _attention_bqhd(self, x, attention_mask, *, deterministic, rngs):
    mask_bias = attention.additive_mask(attention_mask, x.dtype)
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


def _keep_mask_bitcast(key, shape, rate):
    *lead, last = shape
    words = jax.random.bits(key, (*lead, -(-last // 4)), jnp.uint32)
    random_bytes = jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(*lead, -1)[..., :last]
    return random_bytes >= round(rate * 256)


@jax.custom_vjp
def _add_bias(y, bias):
    return y + bias


def _add_bias_fwd(y, bias):
    return y + bias, None


def _add_bias_bwd(_, dy):
    flat = dy.reshape(-1, dy.shape[-1])
    ones = jnp.ones((flat.shape[0],), dy.dtype)
    return dy, jnp.dot(ones, flat, preferred_element_type=jnp.float32).astype(dy.dtype)


_add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


def _linear_bias_grad_dot(self, inputs, out_sharding=None):
    kernel = self.kernel[...]
    bias = self.bias[...] if self.bias is not None else None
    inputs, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
    y = jax.lax.dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())))
    return y if bias is None else _add_bias(y, bias)


def _layer_norm_stats(x, eps):
    centred = x - x.mean(-1, keepdims=True)
    inverse_std = jax.lax.rsqrt(jnp.mean(centred * centred, -1, keepdims=True) + eps)
    return centred * inverse_std, inverse_std


@jax.custom_vjp
def _layer_norm(x, scale, bias, eps):
    return _layer_norm_stats(x, eps)[0] * scale + bias


def _layer_norm_fwd(x, scale, bias, eps):
    normalized, inverse_std = _layer_norm_stats(x, eps)
    return normalized * scale + bias, (normalized, inverse_std, scale)


def _layer_norm_bwd(residuals, dy):
    normalized, inverse_std, scale = residuals
    g = dy * scale
    dx = inverse_std * (g - g.mean(-1, keepdims=True) - normalized * (g * normalized).mean(-1, keepdims=True))
    leading = tuple(range(dy.ndim - 1))
    return dx, (dy * normalized).sum(leading), dy.sum(leading), None


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def _layer_norm_call(self, x, *, mask=None):
    return _layer_norm(x, self.scale[...], self.bias[...], self.epsilon)


def _attention_tail(self, q, k, v, mask_bias, deterministic, rngs):
    """Scores to context from [b, h, l, d] inputs; returns [b, l, hidden] before the output dense."""
    batch, _, length, _ = q.shape
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(scores * (self.head_dim**-0.5) + mask_bias, axis=-1)
    probs = self.dropout(probs, deterministic=deterministic, rngs=rngs).astype(self.dtype)
    context = jnp.einsum("bhqk,bhkd->bhqd", probs, v)
    return context.transpose(0, 2, 1, 3).reshape(batch, length, -1)


def _attention_bhld(self, x, attention_mask, *, deterministic, rngs):
    mask_bias = attention.additive_mask(attention_mask, x.dtype)
    batch, length, _ = x.shape

    def heads(t):
        return t.reshape(batch, length, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

    q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
    return self.output(_attention_tail(self, q, k, v, mask_bias, deterministic, rngs))


def _attention_qkv_fused(self, x, attention_mask, *, deterministic, rngs):
    mask_bias = attention.additive_mask(attention_mask, x.dtype)
    batch, length, _ = x.shape
    projections = (self.query, self.key, self.value)
    kernel = jnp.concatenate([p.kernel[...] for p in projections], axis=1)
    bias = jnp.concatenate([p.bias[...] for p in projections])
    qkv = (x @ kernel + bias).reshape(batch, length, 3, self.num_heads, self.head_dim)
    q, k, v = qkv.transpose(2, 0, 3, 1, 4)
    return self.output(_attention_tail(self, q, k, v, mask_bias, deterministic, rngs))


PATCHES = {
    "attn_bqhd": (bert.BertSelfAttention, "__call__", _attention_bqhd),
    "bernoulli_dropout": (dropout.Dropout, "__call__", _bernoulli_dropout),
    "mask_bitcast": (dropout, "keep_mask", _keep_mask_bitcast),
    "autodiff_dense": (dense.Dense, "__call__", nnx.Linear.__call__),
    "bias_grad_dot": (dense.Dense, "__call__", _linear_bias_grad_dot),
    "ln_vjp": (nnx.LayerNorm, "__call__", _layer_norm_call),
    "attn_bhld": (bert.BertSelfAttention, "__call__", _attention_bhld),
    "qkv_fused": (bert.BertSelfAttention, "__call__", _attention_qkv_fused),
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
        "--variants",
        default="baseline,bernoulli_dropout,attn_bqhd,autodiff_dense,attn_bqhd+bernoulli_dropout+autodiff_dense",
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
    return finish("model_variants", args, machine, results, "\n".join(lines))


if __name__ == "__main__":
    main()

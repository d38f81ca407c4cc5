"""The attention core of an encoder layer (softmax(q k^T / sqrt(d) + mask) v), as a choice
(`model.attention`):

    einsum       two einsums around a float32 softmax, dropout on the probabilities (the reference path;
                 what every run recorded before this choice existed ran)
    dot_product  jax.nn.dot_product_attention: cuDNN's fused kernel on GPU in bfloat16 / float16
                 (implementation="cudnn"), XLA's unfused form elsewhere and in float32
    splash       Pallas splash attention (jax.experimental.pallas.ops.tpu), TPU only
    auto         the fused kernel where the platform has one: dot_product (cuDNN) on an Ampere or
                 later GPU in half precision, splash on a single TPU chip, einsum everywhere else

**Attention dropout.** The fused APIs have no dropout on the attention probabilities, so `dot_product`
and `splash` apply none (BERT's `attention_probs_dropout_prob` is then unused; the hidden dropout
stays). That is a different model in training, so it is a recorded choice: spec.resolve writes the
resolved name into the run's config (config.json, results.json), and a recorded config without
`model.attention` reads as `einsum` (config_cli.with_legacy_keys), the path it ran.

**float32 products in a bfloat16 step.** The einsum path has none (`scores_f32`). dot_product's XLA
form (jax.nn's own code: CPU, TPU without splash) computes the score gradient's two products (dQ, dK)
from a float32 cotangent and half-precision operands: `XLA_DOT_PRODUCT_F32_DOTS` per layer. On GPU in
half precision cuDNN's kernel runs instead, with no XLA product at all.

Padding is passed as key lengths (`attention_mask` is a prefix of ones: data/batching.py), so padded
query rows attend to the real keys on every path but splash (where padding attends to padding); their
outputs are masked downstream either way. A row with no real token keeps one key (length 1), so no
path divides by zero.

**Packed rows** (data/packing.py) pass `Segments` instead of the mask: a token attends to the tokens of
its own segment only, padding (segment 0) to padding, so no row is fully masked. einsum adds a
[batch, 1, length, length] bias built from the segment ids; dot_product passes the same as `mask=`
(XLA's form applies it; jax.nn's cuDNN form turns it into a bias); splash takes the ids as its segment
ids.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from stackft_jax.models.dropout import Dropout
from stackft_jax.runtime.cli_errors import ConfigError

ATTENTIONS = ("auto", "einsum", "dot_product", "splash")
# Pallas splash attention tiles the sequence in blocks of 128 (TPU lanes); a shorter length bucket
# runs dot_product's XLA form instead (the same attention without dropout).
SPLASH_BLOCK = 128
# Products with a float32 operand per layer in a half-precision step of dot_product's XLA form (above).
XLA_DOT_PRODUCT_F32_DOTS = 2


def splash_available() -> bool:
    try:
        from jax.experimental.pallas.ops.tpu import splash_attention  # noqa: F401
    except ImportError:
        return False
    return True


# cuDNN's fused attention (flash attention) needs an Ampere or later GPU.
CUDNN_MIN_CAPABILITY = 8.0


def resolve_attention(
    name: str, *, platform: str, dtype: str, num_devices: int = 1, gpu_capability: float | None = None
) -> str:
    """The attention path `model.attention`=`name` runs on `platform` (jax's: cpu, gpu, tpu) with
    compute `dtype` over `num_devices` devices (`gpu_capability`: the CUDA compute capability, None when
    unknown); ConfigError (one line naming the key and the allowed values) for an unknown name or a
    kernel the platform lacks."""
    if name not in ATTENTIONS:
        raise ConfigError(f"config.model.attention={name!r}: choose {' or '.join(ATTENTIONS)}")
    if name == "splash" and platform != "tpu":
        raise ConfigError(
            f"config.model.attention='splash' is a TPU kernel and this platform is {platform}: choose "
            "auto, einsum or dot_product"
        )
    if name == "splash" and not splash_available():
        raise ConfigError(
            "config.model.attention='splash': this jax has no jax.experimental.pallas.ops.tpu."
            "splash_attention; choose auto, einsum or dot_product"
        )
    if name != "auto":
        return name
    cudnn = gpu_capability is not None and gpu_capability >= CUDNN_MIN_CAPABILITY
    if platform == "gpu" and cudnn and dtype in ("bfloat16", "float16"):
        return "dot_product"  # cuDNN's fused kernel, which needs half precision
    # Splash has no partitioning rule: over several chips XLA would gather the batch around it.
    if platform == "tpu" and num_devices == 1 and splash_available():
        return "splash"
    return "einsum"


@jax.custom_vjp
def scores_f32(q: jax.Array, k: jax.Array) -> jax.Array:
    """q k^T ("bqhd,bkhd->bhqk") accumulated and returned in float32 from half-precision q and k.

    Autodiff of that einsum would compute dQ and dK from the float32 score gradient, as float32 x
    float32 products at twice the bytes; here the gradient is rounded to q's dtype first (as
    FlashAttention-2 does with dS), so both are half-precision products accumulated in float32."""
    return jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)


def _scores_fwd(q: jax.Array, k: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return scores_f32(q, k), (q, k)


def _scores_bwd(residuals: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    q, k = residuals
    g = g.astype(q.dtype)
    dq = jnp.einsum("bhqk,bkhd->bqhd", g, k, preferred_element_type=jnp.float32).astype(q.dtype)
    dk = jnp.einsum("bhqk,bqhd->bkhd", g, q, preferred_element_type=jnp.float32).astype(k.dtype)
    return dq, dk


scores_f32.defvjp(_scores_fwd, _scores_bwd)


class Segments(NamedTuple):
    """Packed rows' segment ids, [batch, length] ints: 1..k the row's k-th example, 0 padding."""

    ids: jax.Array


# What a layer's attention is restricted by: an unpacked batch's attention mask or packed rows' segments.
Mask = jax.Array | Segments


def segment_mask(segments: Segments) -> jax.Array:
    """[batch, 1, length, length] bool: query and key in the same segment."""
    return segments.ids[:, None, :, None] == segments.ids[:, None, None, :]


def _bias(mask: Mask, dtype: jnp.dtype) -> jax.Array:
    if isinstance(mask, Segments):
        return jnp.where(segment_mask(mask), 0.0, jnp.finfo(dtype).min)
    return additive_mask(mask, dtype)


def additive_mask(attention_mask: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """HF's additive mask, [batch, 1, 1, length]: 0 for real keys, `dtype`'s min for padding. A row with
    no real key (a fully masked padding example) softmaxes to uniform, not NaN."""
    return jnp.where(attention_mask[:, None, None, :] > 0, 0.0, jnp.finfo(dtype).min)


def einsum_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    attention_mask: Mask,
    *,
    dropout: Dropout,
    deterministic: bool,
    rngs: nnx.Rngs | None,
) -> jax.Array:
    """[batch, length, heads, head_dim] q, k, v -> the context, same shape, in v's dtype."""
    head_dim = q.shape[-1]
    mask_bias = _bias(attention_mask, v.dtype)
    # Scores, mask and softmax in float32 so half-precision compute cannot overflow or lose the mask.
    if q.dtype == jnp.float32:
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    else:
        scores = scores_f32(q, k)
    scores = scores * (head_dim**-0.5) + mask_bias.astype(jnp.float32)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = dropout(probs, deterministic=deterministic, rngs=rngs).astype(v.dtype)
    # Contract in [b, h, k, d] and transpose back: the same math as "bhqk,bkhd->bqhd", but XLA:CPU's
    # dot emitter handles that output layout badly (eval step 0.82x the time this way).
    context = jnp.einsum("bhqk,bhkd->bhqd", probs, v.transpose(0, 2, 1, 3))
    return context.transpose(0, 2, 1, 3)


def key_lengths(attention_mask: jax.Array) -> jax.Array:
    """Real tokens per row (the mask is a prefix of ones), at least 1."""
    return jnp.maximum(attention_mask.sum(axis=-1), 1).astype(jnp.int32)


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, attention_mask: Mask) -> jax.Array:
    """jax.nn.dot_product_attention with the padding as key lengths (packed rows: their segments as
    its mask); cuDNN on a GPU in half precision."""
    fused = jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
    if isinstance(attention_mask, Segments):
        return jax.nn.dot_product_attention(
            q, k, v, mask=segment_mask(attention_mask), implementation="cudnn" if fused else None
        )
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        key_value_seq_lengths=key_lengths(attention_mask),
        implementation="cudnn" if fused else None,
    )


@functools.cache
def _splash_kernel(length: int, heads: int, interpret: bool) -> Any:
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    mask = splash.MultiHeadMask([splash.FullMask((length, length)) for _ in range(heads)])
    return splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, attention_mask: Mask, *, interpret: bool = False
) -> jax.Array:
    """Pallas splash attention per example, padding as its own segment (real tokens attend to real
    tokens only; packed rows: their `Segments`); a length that is not a multiple of `SPLASH_BLOCK`
    runs `dot_product_attention`.
    `interpret`: run the kernel in Pallas' interpreter (tests on CPU)."""
    batch, length, heads, head_dim = q.shape
    if length % SPLASH_BLOCK:
        return dot_product_attention(q, k, v, attention_mask)
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    kernel = _splash_kernel(length, heads, interpret)
    if isinstance(attention_mask, Segments):
        segments = attention_mask.ids.astype(jnp.int32)
    else:
        segments = (attention_mask > 0).astype(jnp.int32)

    def per_example(q1: jax.Array, k1: jax.Array, v1: jax.Array, segment: jax.Array) -> jax.Array:
        return kernel(q1, k1, v1, segment_ids=SegmentIds(q=segment, kv=segment))

    # The kernel takes [heads, length, head_dim] and does not scale the logits itself.
    scaled = (q * jnp.asarray(head_dim**-0.5, q.dtype)).transpose(0, 2, 1, 3)
    context = jax.vmap(per_example)(scaled, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), segments)
    return context.transpose(0, 2, 1, 3)


def attend(
    kind: str,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    attention_mask: Mask,
    *,
    dropout: Dropout,
    deterministic: bool,
    rngs: nnx.Rngs | None,
) -> jax.Array:
    """The context of attention path `kind` (a resolved name: einsum, dot_product or splash), restricted
    by an unpacked batch's attention mask or packed rows' `Segments`."""
    if kind == "einsum":
        return einsum_attention(
            q, k, v, attention_mask, dropout=dropout, deterministic=deterministic, rngs=rngs
        )
    if kind == "dot_product":
        return dot_product_attention(q, k, v, attention_mask)
    if kind == "splash":
        return splash_attention(q, k, v, attention_mask)
    raise ValueError(f"attention {kind!r} is not one of {ATTENTIONS[1:]} (resolve 'auto' first)")

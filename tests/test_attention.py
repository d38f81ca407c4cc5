"""model.attention (models/attention.py) and model.remat: the fused paths equal the einsum path in
float32 (forward and gradients, without dropout), apply no attention dropout, `auto` picks per platform;
remat changes neither loss nor gradients."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stackft_jax.models import attention, bert
from stackft_jax.models.dropout import Dropout

CONFIG = bert.tiny_config()


def batch_of(lengths=(12, 7, 3, 0), length: int = 12, seed: int = 0) -> dict[str, jnp.ndarray]:
    """Right-padded rows (as data/batching.py builds them), the last one fully masked."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(length)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = rng.integers(1, CONFIG.vocab_size, (len(lengths), length)).astype(np.int32) * mask
    return {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": mask}


def encoder(kind: str = "einsum", remat: str = "none", config: bert.BertConfig = CONFIG) -> bert.BertModel:
    return bert.BertModel(config, attention=kind, remat=remat, rngs=nnx.Rngs(0))


def loss_and_grads(model: bert.BertModel, batch: dict, *, deterministic: bool = True, seed: int = 0):
    """A loss over the real positions of every layer and the pooled state, and its parameter gradients."""
    graphdef, params = nnx.split(model)
    real = jnp.asarray(batch["attention_mask"], jnp.float32)[:, :, None]
    weights = jax.random.normal(jax.random.key(1), (CONFIG.hidden_size,))

    def loss(p):
        out = nnx.merge(graphdef, p)(
            *(batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")),
            deterministic=deterministic,
            rngs=None if deterministic else nnx.Rngs(dropout=seed),
        )
        per_layer = [jnp.sum(jnp.tanh(h * weights) * real) for h in out.hidden_states]
        return sum(per_layer) + jnp.sum(jnp.tanh(out.pooled[:-1]))  # the masked row's pooled is noise

    return jax.value_and_grad(loss)(params)


def assert_trees_close(a, b, atol: float, scaled: float = 0.0) -> None:
    """Leaf by leaf, |a - b| <= atol + scaled * max|b|: float32 rounding grows with a leaf's largest
    entries (gradients up to about 200 here)."""
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert np.abs(x - y).max() <= atol + scaled * np.abs(y).max(), (np.abs(x - y).max(), np.abs(y).max())


def test_dot_product_matches_einsum_in_float32_forward_and_gradients():
    batch = batch_of()
    real = batch["attention_mask"].astype(bool)
    ours, reference = encoder("dot_product"), encoder("einsum")
    run = [
        m(*(batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")), deterministic=True)
        for m in (ours, reference)
    ]
    for a, b in zip(run[0].hidden_states, run[1].hidden_states, strict=True):
        np.testing.assert_allclose(np.asarray(a)[real], np.asarray(b)[real], atol=1e-6, rtol=0)
        assert np.isfinite(np.asarray(a)).all()  # the fully masked row too
    (loss, grads), (ref_loss, ref_grads) = loss_and_grads(ours, batch), loss_and_grads(reference, batch)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    assert_trees_close(grads, ref_grads, atol=1e-6, scaled=2e-7)


def test_splash_kernel_matches_einsum_in_float32_forward_and_gradients():
    """The Pallas kernel itself, run by Pallas' interpreter on CPU (on TPU it compiles)."""
    keys = jax.random.split(jax.random.key(0), 3)
    shape = (2, attention.SPLASH_BLOCK, 2, 16)  # batch, length, heads, head_dim
    q, k, v = (jax.random.normal(key, shape) for key in keys)
    mask = (np.arange(shape[1])[None] < np.array([[100], [37]])).astype(np.int32)
    real = jnp.asarray(mask, jnp.float32)[:, :, None, None]
    no_dropout = Dropout(0.0)

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v, mask)) * real)

    def splash(q, k, v, mask):
        return attention.splash_attention(q, k, v, mask, interpret=True)

    def einsum(q, k, v, mask):
        return attention.einsum_attention(q, k, v, mask, dropout=no_dropout, deterministic=True, rngs=None)

    real_rows = mask.astype(bool)
    np.testing.assert_allclose(
        np.asarray(splash(q, k, v, mask))[real_rows], np.asarray(einsum(q, k, v, mask))[real_rows], atol=2e-6
    )
    ours = jax.grad(loss(splash), argnums=(0, 1, 2))(q, k, v)
    theirs = jax.grad(loss(einsum), argnums=(0, 1, 2))(q, k, v)
    assert_trees_close(ours, theirs, atol=2e-6)


def test_splash_runs_the_xla_form_below_its_block_length():
    q = k = v = jax.random.normal(jax.random.key(0), (2, 16, 2, 8))
    mask = (np.arange(16)[None] < np.array([[16], [5]])).astype(np.int32)
    np.testing.assert_array_equal(
        attention.splash_attention(q, k, v, mask), attention.dot_product_attention(q, k, v, mask)
    )


def test_fused_paths_apply_no_attention_dropout_and_einsum_does():
    """The recorded choice (models/attention.py): only the attention probabilities' dropout differs."""
    config = dataclasses.replace(CONFIG, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5)
    batch = batch_of()
    args = [batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")]
    for kind, changes in (("dot_product", False), ("einsum", True)):
        model = encoder(kind, config=config)
        train = model(*args, deterministic=False, rngs=nnx.Rngs(dropout=3)).hidden_states[-1]
        infer = model(*args, deterministic=True).hidden_states[-1]
        assert (np.abs(np.asarray(train) - np.asarray(infer)).max() > 1e-3) == changes, kind


@pytest.mark.parametrize("remat", ["dots_saveable", "full"])
def test_remat_keeps_loss_and_gradients(remat):
    """With dropout on: recomputation draws the same masks."""
    batch = batch_of()
    loss, grads = loss_and_grads(encoder(remat=remat), batch, deterministic=False, seed=5)
    ref_loss, ref_grads = loss_and_grads(encoder(), batch, deterministic=False, seed=5)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    assert_trees_close(grads, ref_grads, atol=1e-6, scaled=2e-7)


def test_remat_recomputes_in_the_backward_pass():
    """The lowered gradient of a rematerialized encoder holds more products than the plain one's."""
    batch = batch_of()

    def dots(remat: str) -> int:
        graphdef, params = nnx.split(encoder(remat=remat))

        def loss(p):
            args = (batch[k] for k in ("input_ids", "token_type_ids", "attention_mask"))
            return jnp.sum(nnx.merge(graphdef, p)(*args, deterministic=True).hidden_states[-1] ** 2)

        return jax.jit(jax.grad(loss)).lower(params).as_text().count("stablehlo.dot_general")

    none, saveable, full = dots("none"), dots("dots_saveable"), dots("full")
    # dots_saveable recomputes the attention products, full the projections too.
    assert none < saveable < full, (none, saveable, full)


@pytest.mark.parametrize(
    "name, platform, dtype, devices, capability, resolved",
    [
        ("auto", "cpu", "float32", 1, None, "einsum"),
        ("auto", "gpu", "bfloat16", 1, 9.0, "dot_product"),  # cuDNN
        ("auto", "gpu", "float32", 1, 9.0, "einsum"),  # cuDNN's kernel needs half precision
        ("auto", "gpu", "bfloat16", 1, 7.5, "einsum"),  # and an Ampere or later GPU
        ("auto", "tpu", "bfloat16", 1, None, "splash"),
        ("auto", "tpu", "bfloat16", 8, None, "einsum"),  # splash has no partitioning rule
        ("dot_product", "cpu", "float32", 1, None, "dot_product"),
        ("splash", "tpu", "bfloat16", 8, None, "splash"),
    ],
)
def test_auto_picks_the_platforms_fused_kernel(name, platform, dtype, devices, capability, resolved):
    chosen = attention.resolve_attention(
        name, platform=platform, dtype=dtype, num_devices=devices, gpu_capability=capability
    )
    assert chosen == resolved


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_splash_off_tpu_is_refused_naming_the_key(platform):
    with pytest.raises(
        ValueError, match=rf"^config.model.attention='splash' is a TPU kernel .* is {platform}"
    ):
        attention.resolve_attention("splash", platform=platform, dtype="bfloat16")


def test_unknown_remat_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"^config.model.remat='all': choose none or dots_saveable or full$"):
        encoder(remat="all")

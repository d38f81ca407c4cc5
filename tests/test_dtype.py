"""model.dtype: `auto` resolved for the platform and recorded resolved; a bfloat16 step keeps parameters,
optimizer state, softmax, LayerNorm statistics and the loss in float32 and has no float32 matrix product
(read from the lowered program); 50 bfloat16 steps follow their float32 twin."""

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import tiny
from stackft_jax.config import config_cli, spec
from stackft_jax.models import attention, bert
from stackft_jax.models.objectives import CLASSIFICATION
from stackft_jax.models.task_model import TaskModel

BATCH, LENGTH = 4, 16
CONFIG = bert.tiny_config()  # 2 layers, hidden 32, 4 heads, feed-forward 64


def tiny_model(dtype: str, attention_path: str = "einsum", remat: str = "none") -> TaskModel:
    return TaskModel(
        CONFIG,
        tiny.get_config().head,
        num_outputs=2,
        scalar_mix=False,
        dtype=jnp.dtype(dtype),
        attention=attention_path,
        remat=remat,
        rngs=nnx.Rngs(0),
    )


def make_batch(seed: int, lengths=(16, 9, 4, 0)) -> dict[str, np.ndarray]:
    """Random tokens, a learnable label (is the second token in the lower half of the vocabulary), and a
    fully masked padding row."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    mask = (np.arange(LENGTH)[None] < lengths[:, None]).astype(np.int32)
    ids = rng.integers(1, CONFIG.vocab_size, (len(lengths), LENGTH)).astype(np.int32) * mask
    return {
        "input_ids": ids,
        "token_type_ids": np.zeros_like(ids),
        "attention_mask": mask,
        "segment_ids": mask,
        "labels": (ids[:, 1] < CONFIG.vocab_size // 2).astype(np.int32),
        "example_mask": (lengths > 0).astype(np.float32),
    }


def step_fn(graphdef: nnx.GraphDef, tx: optax.GradientTransformation):
    """One AdamW step on the objective's mean loss, the loss path the train step takes."""

    def step(params, opt_state, batch, key):
        def loss_fn(p):
            outputs = nnx.merge(graphdef, p)(batch, deterministic=False, rngs=nnx.Rngs(dropout=key))
            loss_sum, stats = CLASSIFICATION.loss(outputs, batch)
            return loss_sum / jnp.maximum(stats["count"], 1.0)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def lowered_step(dtype: str, attention_path: str = "einsum") -> tuple[str, dict, object]:
    graphdef, state = nnx.split(tiny_model(dtype, attention_path))
    params = nnx.to_pure_dict(state)
    tx = optax.adamw(1e-3)
    opt_state = tx.init(params)
    step = jax.jit(step_fn(graphdef, tx))
    text = step.lower(params, opt_state, make_batch(0), jax.random.key(0)).as_text()
    return text, params, opt_state


def dot_operand_dtypes(text: str) -> collections.Counter:
    """(lhs, rhs) element types of every stablehlo.dot_general in `text`."""
    found = re.findall(r"stablehlo\.dot_general .*: \(tensor<(?:\d+x)*(\w+)>, tensor<(?:\d+x)*(\w+)>\)", text)
    return collections.Counter(found)


def op_types(text: str, op: str, operand_shape: str = "") -> collections.Counter:
    """Element types of the first operand of each `op` whose first operand has shape `operand_shape`
    ("4x2x16x16"; "": any)."""
    shape = rf"{operand_shape}x" if operand_shape else r"(?:\d+x)*"
    pattern = rf"stablehlo\.{op}\b.*?: \(?tensor<{shape}(\w+)>"
    return collections.Counter(re.findall(pattern, text))


@pytest.fixture(scope="module")
def bf16_step():
    return lowered_step("bfloat16")


def test_bfloat16_step_keeps_params_optimizer_state_softmax_layer_norm_and_loss_in_float32(bf16_step):
    text, params, opt_state = bf16_step
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    moments = [leaf for leaf in jax.tree.leaves(opt_state) if getattr(leaf, "ndim", 0) > 0]
    assert moments and {leaf.dtype for leaf in moments} == {jnp.dtype(jnp.float32)}
    heads = CONFIG.num_attention_heads
    scores = f"{BATCH}x{heads}x{LENGTH}x{LENGTH}"
    hidden = f"{BATCH}x{LENGTH}x{CONFIG.hidden_size}"
    # Softmax over the attention scores: its exponential and its max / sum reductions.
    assert op_types(text, "exponential", scores) == {"f32": CONFIG.num_hidden_layers}
    assert set(op_types(text, "reduce", scores)) == {"f32"}
    # LayerNorm statistics: mean and variance over the hidden axis, and the rsqrt of the variance.
    layer_norm = re.findall(rf"across dimensions = \[2\] : \(tensor<{hidden}x(\w+)>", text)
    assert len(layer_norm) >= 2 * (2 * CONFIG.num_hidden_layers + 1) and set(layer_norm) == {"f32"}
    assert set(op_types(text, "rsqrt")) == {"f32"}
    # The loss: log-softmax over the [batch, classes] logits.
    assert op_types(text, "exponential", f"{BATCH}x2") == {"f32": 1}
    assert set(op_types(text, "log")) == {"f32"}
    # The compute itself is bfloat16: the layers' products are.
    assert dot_operand_dtypes(text)[("bf16", "bf16")] >= 12 * CONFIG.num_hidden_layers


def test_bfloat16_step_has_no_float32_product(bf16_step):
    """Not even the attention scores' backward (attention.scores_f32 rounds their gradient)."""
    dots = dot_operand_dtypes(bf16_step[0])
    assert set(dots) == {("bf16", "bf16")}, dots


def test_dot_product_xla_form_has_only_its_named_float32_products():
    dots = dot_operand_dtypes(lowered_step("bfloat16", "dot_product")[0])
    with_f32 = sum(n for pair, n in dots.items() if "f32" in pair)
    assert with_f32 == attention.XLA_DOT_PRODUCT_F32_DOTS * CONFIG.num_hidden_layers, dots


def test_float32_step_has_only_float32_products():
    dots = dot_operand_dtypes(lowered_step("float32")[0])
    assert set(dots) == {("f32", "f32")}


def test_bfloat16_follows_its_float32_twin_for_50_steps():
    """The same initial parameters, batches and dropout masks; bfloat16 compute only. Measured on
    CPU: the curves differ by at most 0.012 (loss from 0.66, mean of the first 5 steps, to 0.015, of the
    last 5); the tolerance is 0.05."""
    losses = {}
    for dtype in ("float32", "bfloat16"):
        graphdef, state = nnx.split(tiny_model(dtype))
        params = nnx.to_pure_dict(state)
        tx = optax.adamw(3e-3)
        opt_state = tx.init(params)
        step = jax.jit(step_fn(graphdef, tx))
        curve = []
        for i in range(50):
            batch = make_batch(i % 8, lengths=(16, 12, 9, 5, 16, 3, 7, 11))
            params, opt_state, loss = step(params, opt_state, batch, jax.random.key(i))
            curve.append(float(loss))
        losses[dtype] = np.asarray(curve)
    f32, bf16 = losses["float32"], losses["bfloat16"]
    assert f32[-5:].mean() < 0.5 * f32[:5].mean()  # it learns, so the comparison means something
    np.testing.assert_allclose(bf16, f32, atol=0.05)


# --- auto, resolved and recorded --------------------------------------------------------------------


@pytest.mark.parametrize(
    "platform, dtype, attention_path",
    [("cpu", "float32", "einsum"), ("gpu", "bfloat16", "dot_product"), ("tpu", "bfloat16", "einsum")],
)
def test_auto_resolves_for_the_platform_and_is_recorded_resolved(
    monkeypatch, platform, dtype, attention_path
):
    """An H100 (compute capability 9.0); 8 TPU chips, on which auto picks einsum (splash on one)."""
    monkeypatch.setattr(spec, "_device", lambda: (platform, 9.0 if platform == "gpu" else None, 8))
    run_spec = spec.resolve(tiny.get_config())
    assert (run_spec.model.dtype, run_spec.model.attention) == (dtype, attention_path)
    # run_spec.raw is what config.json and results.json's `config` hold.
    assert run_spec.raw["model"]["dtype"] == dtype
    assert run_spec.raw["model"]["attention"] == attention_path
    assert run_spec.raw["model"]["remat"] == "none"


def test_a_recorded_dtype_is_kept_on_any_platform(monkeypatch):
    monkeypatch.setattr(spec, "_device", lambda: ("gpu", 9.0, 1))
    recorded = spec.resolve(tiny.get_config()).raw  # a GPU run's record: bfloat16, dot_product
    monkeypatch.setattr(spec, "_device", lambda: ("cpu", None, 8))
    rerun = spec.resolve(spec.config_from_plain(recorded), recorded=True)
    assert (rerun.model.dtype, rerun.model.attention) == ("bfloat16", "dot_product")


def test_records_older_than_auto_read_as_what_they_ran():
    """Every record has model.dtype (float32 was the default); none has attention or remat: einsum, none.
    Bound today on CPU, such a record matches today's default config."""
    current = spec.resolve(tiny.get_config())
    old = config_cli.to_plain(tiny.get_config())
    old["model"]["dtype"] = "float32"
    del old["model"]["attention"], old["model"]["remat"]
    reread = spec.resolve(spec.config_from_plain(old), recorded=True)
    assert (reread.model.dtype, reread.model.attention, reread.model.remat) == ("float32", "einsum", "none")
    assert spec.recorded_binding_form(old, current.raw) == spec.binding_form(current)


def test_resuming_an_older_record_under_auto_on_gpu_is_a_listed_difference(monkeypatch):
    """Not a silent switch to bfloat16 and the fused path: the binding differs in exactly those keys."""
    old = config_cli.to_plain(tiny.get_config())
    old["model"]["dtype"] = "float32"
    del old["model"]["attention"], old["model"]["remat"]
    monkeypatch.setattr(spec, "_device", lambda: ("gpu", 9.0, 1))
    current = spec.resolve(tiny.get_config())
    recorded = spec.recorded_binding_form(old, current.raw)["config"]["model"]
    now = spec.binding_form(current)["config"]["model"]
    assert {k for k in now if recorded[k] != now[k]} == {"dtype", "attention"}
    assert (recorded["dtype"], recorded["attention"]) == ("float32", "einsum")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("dtype", "float16", "config.model.dtype='float16': choose auto or float32 or bfloat16"),
        (
            "attention",
            "flash",
            "config.model.attention='flash': choose auto or einsum or dot_product or splash",
        ),
        ("remat", "some", "config.model.remat='some': choose none or dots_saveable or full"),
        (
            "attention",
            "splash",
            "config.model.attention='splash' is a TPU kernel and this platform is cpu: choose auto, einsum "
            "or dot_product",
        ),
    ],
)
def test_bad_compute_settings_are_one_line_naming_the_key(key, value, message):
    config = tiny.get_config()
    config.model[key] = value
    with pytest.raises(ValueError) as error:
        spec.resolve(config)
    assert str(error.value) == message

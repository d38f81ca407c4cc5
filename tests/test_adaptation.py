"""Parameter-efficient adaptation on the model side (models/adaptation/, models/bert.py): every kind's
patterns name real parameters and only the intended ones; LoRA and adapters start as the pretrained model
bit for bit without moving the base or head initialisation; LoRA folds into the kernels and writes the
peft format that peft loads onto transformers' model with the same outputs."""

import dataclasses
import hashlib
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

from stackft_jax.config import spec
from stackft_jax.config.config_cli import source_comments
from stackft_jax.models import adaptation, bert
from stackft_jax.models.adaptation import (
    KINDS,
    AdapterSettings,
    EncoderAdaptation,
    LoraSettings,
    default_adaptation_configs,
    encoder_adaptation,
    lora,
)
from stackft_jax.models.bert import BertConfig, BertModel
from stackft_jax.models.heads import default_head_configs
from stackft_jax.models.task_model import TaskModel
from stackft_jax.runtime.cli_errors import ConfigError, UsageError
from stackft_jax.trained import hf_export, opening
from stackft_jax.training import build
from tests import encoders

ALL_LORA = EncoderAdaptation(lora=LoraSettings(rank=4, alpha=8.0, dropout=0.0, targets=".*"))
BOTH = EncoderAdaptation(
    lora=LoraSettings(rank=4, alpha=8.0, dropout=0.0, targets=".*"),
    adapters=AdapterSettings(bottleneck=8, activation="gelu"),
)


def encoder_config(family: str) -> BertConfig:
    return BertConfig.from_dict(encoders.hf_config(family, **encoders.SMALL).to_dict())


def task_model(config: BertConfig, adaptation_settings=None, rngs=None) -> TaskModel:
    head = default_head_configs()
    head.name, head.dropout_rate = "cls_mlp", 0.1
    return TaskModel(
        config,
        head,
        num_outputs=3,
        scalar_mix=False,
        adaptation=adaptation_settings,
        rngs=rngs or nnx.Rngs(params=0),
    )


def flat(params) -> dict[str, np.ndarray]:
    return {
        "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    }


def params_of(model: nnx.Module) -> dict:
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def batch_for(config: BertConfig, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = (np.arange(10)[None, :] < np.array([[10], [6], [3]])).astype(np.int32)
    ids = rng.integers(config.pad_token_id + 1, config.vocab_size, size=mask.shape)
    return {
        "input_ids": np.where(mask, ids, config.pad_token_id).astype(np.int32),
        "token_type_ids": np.zeros_like(mask),
        "attention_mask": mask,
        "segment_ids": np.zeros_like(mask),
    }


def encode(model: BertModel, batch: dict, **kwargs) -> list[np.ndarray]:
    out = model(
        *(jnp.asarray(batch[k]) for k in ("input_ids", "token_type_ids", "attention_mask")),
        deterministic=kwargs.pop("deterministic", True),
        **kwargs,
    )
    return [np.asarray(h) for h in (*out.hidden_states, out.pooled)]


def randomize_lora(model: nnx.Module, seed: int = 1, std: float = 0.2) -> None:
    """lora_b (zero at init) and lora_a redrawn, so the LoRA update is not a no-op."""
    params = params_of(model)
    leaves, tree = jax.tree_util.tree_flatten_with_path(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [
        std * jax.random.normal(k, v.shape, v.dtype)
        if str(getattr(p[-1], "key", "")).startswith("lora_")
        else v
        for k, (p, v) in zip(keys, leaves, strict=True)
    ]
    nnx.update(model, nnx.State(jax.tree_util.tree_unflatten(tree, new)))


# --- adaptation=None builds as before -------------------------------------------------------------

# sha256 of the TaskModel parameters (cls_mlp head, seed 0) per family, and the first example's logits,
# both recorded with the code before adaptation existed. A change here moves every committed result.
BEFORE = {
    "bert": (
        "618860c9e211213aa3acf96d2c9c7706cadc890ac6caeb5cd0694c9fc5105844",
        [0.0452669, 0.7290092, -0.6252230],
    ),
    "roberta": (
        "c83e1c607ae459c3581a1b03e6f5cd53635d1458a6ece5d0d22b30cb1340eafc",
        [0.3074455, 1.6135789, -0.0388486],
    ),
    "electra": (
        "9289325c48701959cbf32e0652dec765117616706510d0745a3673b76e81c647",
        [-0.0413266, 1.2926512, 0.4769420],
    ),
    "distilbert": (
        "d0a68533c93f05391d897f669324224230ae44c8d785beaf36dbae0f229fbcf4",
        [0.3377390, 0.7351320, -0.4528924],
    ),
}


def params_hash(params: dict) -> str:
    digest = hashlib.sha256()
    for path, leaf in sorted(flat(params).items()):
        digest.update(f"{path}:{leaf.dtype}:{leaf.shape}".encode())
        digest.update(np.ascontiguousarray(leaf).tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("family", sorted(BEFORE))
def test_a_model_without_adaptation_has_the_parameters_and_outputs_of_before(family):
    config = encoder_config(family)
    model = task_model(config)
    expected_hash, expected_logits = BEFORE[family]
    assert params_hash(params_of(model)) == expected_hash
    logits = np.asarray(model(batch_for(config), deterministic=True))
    np.testing.assert_allclose(logits[0], expected_logits, atol=1e-6)


# --- Step 0 is the pretrained model; the base and head initialisation do not move -------------------


@pytest.mark.parametrize("family", encoders.FAMILIES)
def test_lora_and_adapters_start_as_the_base_model_bit_for_bit(family):
    config = encoder_config(family)
    base, adapted = task_model(config), task_model(config, BOTH)
    base_params, adapted_params = flat(params_of(base)), flat(params_of(adapted))
    extra = set(adapted_params) - set(base_params)
    assert set(base_params) <= set(adapted_params)
    assert any("/lora_a" in p for p in extra) and any("_adapter/" in p for p in extra)
    for path, value in base_params.items():  # the encoder's and the head's own init, unchanged
        np.testing.assert_array_equal(adapted_params[path], value, err_msg=path)
    batch = batch_for(config)
    for ours, theirs in zip(encode(adapted.backbone, batch), encode(base.backbone, batch), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    # Training mode too: the same dropout masks (a LoRA dropout of 0 draws no keys).
    train = {"deterministic": False}
    ours = encode(adapted.backbone, batch, **train, rngs=nnx.Rngs(dropout=3))
    theirs = encode(base.backbone, batch, **train, rngs=nnx.Rngs(dropout=3))
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(adapted(batch, deterministic=True), base(batch, deterministic=True))


def test_adaptation_parameters_come_from_their_own_stream():
    config = encoder_config("bert")
    derived = flat(params_of(task_model(config, BOTH)))
    own_stream = flat(params_of(task_model(config, BOTH, rngs=nnx.Rngs(params=0, adaptation=7))))
    other_seed = flat(params_of(task_model(config, BOTH, rngs=nnx.Rngs(params=1))))
    lora_a = "backbone/layers/0/attention/query/lora_a"
    down = "backbone/layers/1/output_adapter/down/kernel"
    assert not np.array_equal(derived[lora_a], own_stream[lora_a])
    assert not np.array_equal(derived[lora_a], other_seed[lora_a])  # derived from the seed
    assert np.abs(derived[down]).max() > 0
    np.testing.assert_array_equal(derived["backbone/layers/0/attention/query/lora_b"], 0.0)
    np.testing.assert_array_equal(derived["backbone/layers/1/output_adapter/up/kernel"], 0.0)
    bound = 1 / np.sqrt(config.hidden_size)  # peft's kaiming-uniform(a=sqrt(5)) on (rank, in)
    assert np.abs(derived[lora_a]).max() <= bound and derived[lora_a].std() > bound / 4
    base_paths = [p for p in flat(params_of(task_model(config)))]
    for path in base_paths:
        np.testing.assert_array_equal(derived[path], own_stream[path], err_msg=path)


def test_at_init_the_gradient_reaches_lora_b_and_the_adapters_up_projection_under_jit():
    """What training starts from: B (zero) and `up` (zero) get gradients, A and `down` none until they move
    (their gradient flows through the zero matrix), as in LoRA and Houlsby's adapters."""
    config = encoder_config("bert")
    graphdef, params = nnx.split(task_model(config, BOTH), nnx.Param)
    batch = {k: jnp.asarray(v) for k, v in batch_for(config).items()}

    @jax.jit
    def grads(params):
        def loss(params):
            return jnp.sum(nnx.merge(graphdef, params)(batch, deterministic=True) ** 2)

        return jax.grad(loss)(params)

    g = flat(nnx.to_pure_dict(grads(params)))
    layer = "backbone/layers/1"
    assert np.abs(g[f"{layer}/attention/query/lora_b"]).max() > 0
    assert np.abs(g[f"{layer}/output_adapter/up/kernel"]).max() > 0
    np.testing.assert_array_equal(g[f"{layer}/attention/query/lora_a"], 0.0)
    np.testing.assert_array_equal(g[f"{layer}/output_adapter/down/kernel"], 0.0)


# --- Each kind's patterns name real parameters, and only the intended ones --------------------------


def matched(patterns, paths) -> set[str]:
    return {p for p in paths if any(re.fullmatch(pattern, p) for pattern in patterns)}


@pytest.mark.parametrize("family", encoders.FAMILIES)
def test_each_kind_trains_exactly_its_parameters(family):
    config = encoder_config(family)
    n = config.num_hidden_layers
    paths = set(flat(params_of(task_model(config, BOTH))))
    backbone = {p for p in paths if p.startswith("backbone/")}
    adapter_leaves = {p for p in backbone if "_adapter/" in p}

    for name, kind in KINDS.items():
        for pattern in kind.trained_patterns({}):
            assert matched([pattern], paths), f"{name}: {pattern} matches no parameter of {family}"
        assert matched(kind.trained_patterns({}), paths) <= backbone

    biases = {p for p in backbone if p.endswith("/bias")} - adapter_leaves
    assert matched(KINDS["bitfit"].trained_patterns({}), paths) == biases
    assert "backbone/embeddings/layer_norm/bias" in biases and len(biases) >= 8 * n
    scales = {p for p in backbone if p.endswith("layer_norm/scale")}
    assert len(scales) == 2 * n + 1
    assert matched(KINDS["bitfit"].trained_patterns({"layer_norm": True}), paths) == biases | scales

    assert matched(KINDS["lora"].trained_patterns({}), paths) == {
        f"backbone/layers/{i}/attention/{m}/lora_{ab}"
        for i in range(n)
        for m in ("query", "value")
        for ab in "ab"
    }
    # "output" is the feed-forward's output; the attention's is "attention_output".
    assert matched(KINDS["lora"].trained_patterns({"targets": "output"}), paths) == {
        f"backbone/layers/{i}/output/lora_{ab}" for i in range(n) for ab in "ab"
    }
    assert matched(KINDS["lora"].trained_patterns({"targets": "attention_output|intermediate"}), paths) == {
        f"backbone/layers/{i}/{m}/lora_{ab}"
        for i in range(n)
        for m in ("attention/output", "intermediate")
        for ab in "ab"
    }
    assert matched(KINDS["adapters"].trained_patterns({}), paths) == adapter_leaves
    assert len(adapter_leaves) == n * 2 * 4  # down and up, kernel and bias, two per layer


def test_phase_rules_of_a_kind_label_every_parameter():
    """The rules the config side builds: the kind's patterns, then the frozen backbone, then the head."""
    paths = flat(params_of(task_model(encoder_config("bert"), BOTH)))
    rules = [(p, "adaptation") for p in KINDS["lora"].trained_patterns({})]
    rules += [("backbone/.*", "frozen"), ("head/.*", "head")]
    labels = {path: next(label for pattern, label in rules if re.fullmatch(pattern, path)) for path in paths}
    assert {p for p, label in labels.items() if label == "adaptation"} == {
        p for p in paths if re.search(r"attention/(query|value)/lora_", p)
    }
    assert {p for p, label in labels.items() if label == "head"} == {
        p for p in paths if p.startswith("head/")
    }


def test_options_defaults_are_written_once_with_a_comment_each():
    configs = default_adaptation_configs()
    for name, kind in KINDS.items():
        assert configs[name].to_dict() == dict(kind.options)
        comments = source_comments(adaptation.option_sources()[name])
        assert all(comments.get(key) for key in kind.options), (name, comments)


def test_settings_from_options():
    assert encoder_adaptation(["bitfit"]) is None
    both = encoder_adaptation(["lora", "adapters"], {"lora": {"rank": 2, "targets": "key"}})
    assert both.lora == LoraSettings(rank=2, alpha=16.0, dropout=0.0, targets="key")
    assert both.adapters == AdapterSettings(bottleneck=64, activation="gelu")
    assert both.lora.scale == 8.0 and both.lora.projections == ("key",)


@pytest.mark.parametrize(
    "kinds, options, message",
    [
        (["lora"], {"lora": {"rnak": 4}}, r"adaptation.lora has no option\(s\) \['rnak'\]"),
        (["lora"], {"lora": {"rank": 0}}, "adaptation.lora.rank=0: a positive integer"),
        (["lora"], {"lora": {"targets": "attention/query"}}, "fullmatches none of the projections"),
        (["adapters"], {"adapters": {"activation": "tanh"}}, "adaptation.adapters.activation='tanh'"),
        (["prefix"], {}, "adaptation kind 'prefix' is not registered"),
    ],
)
def test_bad_options_are_refused_naming_the_key(kinds, options, message):
    with pytest.raises(ConfigError, match=message):
        encoder_adaptation(kinds, options)


# --- Folding LoRA; what transformers' layout refuses -----------------------------------------------


@pytest.mark.parametrize("family", encoders.FAMILIES)
def test_merged_lora_gives_the_unmerged_outputs(family):
    config = encoder_config(family)
    adapted = BertModel(config, adaptation=ALL_LORA, rngs=nnx.Rngs(0))
    randomize_lora(adapted)
    plain = BertModel(config, rngs=nnx.Rngs(0))
    base_out = encode(plain, batch_for(config))
    merged = lora.merge(params_of(adapted), ALL_LORA.lora)
    assert set(flat(merged)) == set(flat(params_of(plain)))
    bert.assign_params(plain, merged)
    ours, folded = encode(adapted, batch_for(config)), encode(plain, batch_for(config))
    assert max(np.abs(a - b).max() for a, b in zip(ours, base_out, strict=True)) > 1e-2  # LoRA acts
    for a, b in zip(ours, folded, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_to_hf_weights_refuses_adaptation_leaves_until_lora_is_folded():
    config = encoder_config("bert")
    params = params_of(BertModel(config, adaptation=BOTH, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=r"have no place in transformers' bert model: fold LoRA first") as e:
        bert.to_hf_weights(params, config)
    assert "\n" not in str(e.value) and "lora_a" in str(e.value)
    only_adapters = lora.merge(params, BOTH.lora)
    with pytest.raises(ValueError, match=r"layers/0/attention_adapter/down/bias.*adapters cannot be folded"):
        bert.to_hf_weights(only_adapters, config)
    lora_only = params_of(BertModel(config, adaptation=ALL_LORA, rngs=nnx.Rngs(0)))
    tensors = bert.to_hf_weights(lora.merge(lora_only, ALL_LORA.lora), config)
    assert tensors.keys() == bert.to_hf_weights(params_of(BertModel(config, rngs=nnx.Rngs(0))), config).keys()


# --- Pretrained checkpoints and peft -----------------------------------------------------------------


@pytest.mark.parametrize("family", encoders.FAMILIES)
def test_pretrained_loading_keeps_adaptation_leaves_and_loads_the_base(family, tmp_path):
    reference = encoders.random_encoder(family, **encoders.SMALL)
    reference.save_pretrained(tmp_path)
    config = BertConfig.from_pretrained(tmp_path)
    model = BertModel(config, adaptation=BOTH, rngs=nnx.Rngs(0))
    initial = flat(params_of(model))
    report = bert.load_pretrained_weights(model, tmp_path)
    assert (report.missing, report.unexpected) == ([], [])
    checkpoint, _ = bert.convert_hf_weights(bert.load_hf_weights(tmp_path), config)
    loaded = flat(params_of(model))
    for path, value in flat(checkpoint).items():
        np.testing.assert_array_equal(loaded[path], value, err_msg=path)
    extra = set(loaded) - set(flat(checkpoint))
    assert extra and all(("lora_" in p or "_adapter/" in p) for p in extra)
    for path in extra:
        np.testing.assert_array_equal(loaded[path], initial[path], err_msg=path)
    # ... and the encoder is still transformers' model exactly (adaptation starts as a no-op).
    batch = batch_for(config)
    theirs = encoders.torch_hidden_states(reference, {k: batch[k] for k in ("input_ids", "attention_mask")})
    real = batch["attention_mask"].astype(bool)
    for a, b in zip(encode(model, batch), theirs, strict=False):
        np.testing.assert_allclose(a[real], b[real], atol=1e-5)


def peft_hidden_states(base_dir, adapter_dir, batch) -> list[np.ndarray]:
    import peft

    base = transformers.AutoModel.from_pretrained(base_dir)
    model = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
    keys = ("input_ids", "token_type_ids", "attention_mask")
    return encoders.torch_hidden_states(model, {k: v for k, v in batch.items() if k in keys})


@pytest.mark.parametrize("family", encoders.FAMILIES)
def test_peft_loads_the_lora_adapter_with_our_outputs(family, tmp_path):
    """All six projections targeted (the attention's and the feed-forward's `output` must not be confused),
    LoRA weights random; peft's model on transformers' encoder and the merged plain encoder in transformers
    both give our hidden states."""
    reference = encoders.random_encoder(family, **encoders.SMALL, matrix_std=0.1)
    base_dir, adapter_dir, merged_dir = tmp_path / "base", tmp_path / "adapter", tmp_path / "merged"
    reference.save_pretrained(base_dir)
    config = BertConfig.from_pretrained(base_dir)
    model = BertModel(config, adaptation=ALL_LORA, rngs=nnx.Rngs(0))
    bert.load_pretrained_weights(model, base_dir)
    randomize_lora(model, std=0.3)
    params = params_of(model)
    tensors = lora.peft_tensors(params, ALL_LORA.lora, lambda i, p: bert.hf_projection_name(config, i, p))
    assert len(tensors) == config.num_hidden_layers * 6 * 2
    lora.write_peft_adapter(adapter_dir, tensors, ALL_LORA.lora, base_model=str(base_dir))

    batch = batch_for(config)
    ours = encode(model, batch)[:-1]
    real = batch["attention_mask"].astype(bool)
    base_out = encoders.torch_hidden_states(reference, {k: batch[k] for k in ("input_ids", "attention_mask")})
    assert np.abs(ours[-1][real] - base_out[-1][real]).max() > 1e-2  # the adapter changes the outputs
    for layer, (a, b) in enumerate(zip(ours, peft_hidden_states(base_dir, adapter_dir, batch), strict=True)):
        np.testing.assert_allclose(a[real], b[real], atol=1e-4, err_msg=f"peft, layer {layer}")

    merged_dir.mkdir()
    (merged_dir / "config.json").write_text((base_dir / "config.json").read_text())
    from safetensors.numpy import save_file

    save_file(
        bert.to_hf_weights(lora.merge(params, ALL_LORA.lora), config), str(merged_dir / "model.safetensors")
    )
    plain = transformers.AutoModel.from_pretrained(merged_dir).eval()
    merged_out = encoders.torch_hidden_states(plain, {k: batch[k] for k in ("input_ids", "attention_mask")})
    for layer, (a, b) in enumerate(zip(ours, merged_out, strict=True)):
        np.testing.assert_allclose(a[real], b[real], atol=1e-4, err_msg=f"merged, layer {layer}")


def test_lora_dropout_drops_the_branch_input_in_training_only():
    config = dataclasses_replace_dropout(encoder_config("bert"))
    settings = EncoderAdaptation(lora=LoraSettings(rank=4, alpha=8.0, dropout=0.5, targets="query"))
    model = BertModel(config, adaptation=settings, rngs=nnx.Rngs(0))
    randomize_lora(model)
    batch = batch_for(config)
    eval_a, eval_b = encode(model, batch), encode(model, batch)
    np.testing.assert_array_equal(eval_a[-2], eval_b[-2])
    with pytest.raises(ValueError, match="needs rngs"):
        encode(model, batch, deterministic=False)
    first = encode(model, batch, deterministic=False, rngs=nnx.Rngs(dropout=1))
    second = encode(model, batch, deterministic=False, rngs=nnx.Rngs(dropout=2))
    assert np.abs(first[-2] - second[-2]).max() > 1e-4
    assert np.abs(first[-2] - eval_a[-2]).max() > 1e-4


def dataclasses_replace_dropout(config: BertConfig) -> BertConfig:
    """No dropout in the encoder itself: only the LoRA branch's can make training differ from eval."""
    return dataclasses.replace(config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


# --- Export: a LoRA run is the merged encoder plus its peft adapter; an adapters run has none -------------

REPO = Path(__file__).resolve().parent.parent


def adapted_run(
    tmp_path: Path, kind: str, options: dict, lora_std: float = 0.3, **keys
) -> tuple[opening.Source, opening.Loaded]:
    """The tiny config's model as a run of the preset `kind` (config.strategy) with the kind's `options`
    (config.adaptation.<kind>), its LoRA leaves redrawn from N(0, lora_std) (B too, so the update is not a
    no-op) as if trained."""
    sys.path.insert(0, str(REPO))
    from configs import tiny

    config = tiny.get_config(f"strategy={kind}")
    config.adaptation[kind].update(options)
    for key, value in keys.items():
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    run_spec = spec.resolve(config)
    source = opening.Source(tmp_path, run_spec, False, "last", None, {})
    model, bert_config = build.build_model(run_spec, run_spec.task, source.model_dir, source.adaptation)
    randomize_lora(model, std=lora_std)
    graphdef, state = nnx.split(model)
    return source, opening.Loaded(graphdef, nnx.to_pure_dict(state), bert_config, "last")


def tokenized(folder: Path) -> dict:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(["How do I learn Python?", "x"], ["What is Python?", "short y z"], padding=True)
    return {k: np.asarray(v, np.int32) for k, v in encoded.items()}


def our_hidden_states(loaded: opening.Loaded, batch: dict) -> list[np.ndarray]:
    model = nnx.merge(loaded.graphdef, loaded.params)
    return encode(
        model.backbone, {**batch, "token_type_ids": batch.get("token_type_ids", 0 * batch["input_ids"])}
    )[:-1]


def test_a_lora_run_exports_the_merged_encoder_and_a_peft_adapter(tmp_path):
    source, loaded = adapted_run(tmp_path, "lora", {"rank": 4, "alpha": 8.0, "targets": ".*"})
    folder = tmp_path / "export"
    folder.mkdir()
    record = hf_export.write(source, loaded, folder)
    batch = tokenized(folder)
    ours = our_hidden_states(loaded, batch)
    real = batch["attention_mask"].astype(bool)

    plain = transformers.AutoModel.from_pretrained(folder).eval()
    for a, b in zip(ours, encoders.torch_hidden_states(plain, batch), strict=True):
        np.testing.assert_allclose(a[real], b[real], atol=1e-4)
    # model.init=random: the weights LoRA applies to are no checkpoint's, so the export holds them.
    assert record["peft_adapter"]["base_model"] == "peft_adapter/base_model"
    assert (record["peft_adapter"]["rank"], record["peft_adapter"]["alpha"]) == (4, 8.0)
    adapter = folder / hf_export.PEFT_DIR
    for a, b in zip(ours, peft_hidden_states(adapter / "base_model", adapter, batch), strict=True):
        np.testing.assert_allclose(a[real], b[real], atol=1e-4)
    assert "PeftModel.from_pretrained" in (folder / "README.md").read_text()

    exported = opening.open_export(folder)
    assert exported.adaptation is None  # the export's encoder is plain
    again = exported.load()
    assert not [p for p in flat(again.params) if "lora_" in p]
    for a, b in zip(ours, our_hidden_states(again, batch), strict=True):
        np.testing.assert_allclose(a[real], b[real], atol=1e-5)


def test_a_lora_run_on_an_untouched_checkpoint_names_it_as_the_adapters_base(tmp_path):
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    overrides = {f"model.config_overrides.{k}": 0 for k in keys}
    # MiniLM's weights are ~0.05: an update of that size (std 0.3 would swamp them and the float32 error).
    source, loaded = adapted_run(
        tmp_path, "lora", {"rank": 2}, 0.05, **{"model.init": "pretrained", **overrides}
    )
    folder = tmp_path / "export"
    folder.mkdir()
    record = hf_export.write(source, loaded, folder)
    assert record["peft_adapter"]["base_model"] == str(source.model_dir)
    assert not (folder / hf_export.PEFT_DIR / hf_export.PEFT_BASE_DIR).exists()
    batch = tokenized(folder)
    real = batch["attention_mask"].astype(bool)
    theirs = peft_hidden_states(source.model_dir, folder / hf_export.PEFT_DIR, batch)
    for a, b in zip(our_hidden_states(loaded, batch), theirs, strict=True):
        np.testing.assert_allclose(a[real], b[real], atol=1e-4)


def test_a_bitfit_run_exports_as_before(tmp_path):
    source, loaded = adapted_run(tmp_path, "bitfit", {"layer_norm": True})
    assert source.adaptation is None
    folder = tmp_path / "export"
    folder.mkdir()
    assert hf_export.write(source, loaded, folder)["peft_adapter"] is None
    assert not (folder / hf_export.PEFT_DIR).exists()


def test_an_adapters_run_is_refused_in_one_line_before_any_work(tmp_path):
    source, loaded = adapted_run(tmp_path, "adapters", {"bottleneck": 4})
    with pytest.raises(UsageError, match=r"Houlsby adapters .* no export; predict runs it") as e:
        hf_export.write(source, loaded, tmp_path)
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="Houlsby adapters"):
        hf_export.export(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()

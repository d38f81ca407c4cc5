"""Parity with Hugging Face for every encoder family (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT), checkpoint
conversion and loading, dtype, dropout and padding."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch
import transformers
from flax import nnx

from stackft_jax.models import bert
from stackft_jax.models.bert import (
    EMBEDDED_MODEL,
    BertConfig,
    BertModel,
    convert_hf_weights,
    load_hf_weights,
    load_pretrained_bert,
    resolve_model_dir,
    tiny_config,
)
from tests import encoders

PAIRS = [
    ("A man is playing a guitar.", "Someone plays music on a stage."),
    ("Hi", "Hello there, how are you doing on this fine morning?"),
    ("The quick brown fox jumps over the lazy dog near the river.", "A fox."),
    ("Is it raining?", "No."),
]


def run(
    model: BertModel, batch: dict, *, deterministic: bool = True, rngs: nnx.Rngs | None = None
) -> bert.BertOutput:
    arrays = [jnp.asarray(batch[k]) for k in ("input_ids", "token_type_ids", "attention_mask")]
    return model(*arrays, deterministic=deterministic, rngs=rngs)


def torch_outputs(model: transformers.BertModel, batch: dict):
    with torch.no_grad():
        out = model(
            **{k: torch.as_tensor(np.asarray(v)) for k, v in batch.items()},
            output_hidden_states=True,
        )
    return [h.numpy() for h in out.hidden_states], out.pooler_output.numpy()


def max_diff_real(ours: bert.BertOutput, theirs, mask: np.ndarray) -> float:
    hidden, pooled = theirs
    real = mask.astype(bool)
    assert len(ours.hidden_states) == len(hidden)
    diffs = [
        np.abs(np.asarray(a)[real] - b[real]).max() for a, b in zip(ours.hidden_states, hidden, strict=True)
    ]
    return max(*diffs, float(np.abs(np.asarray(ours.pooled) - pooled).max()))


def random_batch(vocab_size: int, lengths: list[int], length: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab_size, size=(len(lengths), length))
    mask = (np.arange(length)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    types = (np.arange(length)[None, :] >= np.asarray(lengths)[:, None] // 2) * mask
    return {
        "input_ids": (ids * mask).astype(np.int32),
        "token_type_ids": types.astype(np.int32),
        "attention_mask": mask,
    }


# --- Parity with the real MiniLM checkpoint ------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    model_dir = resolve_model_dir(EMBEDDED_MODEL)
    model, config, report = load_pretrained_bert(EMBEDDED_MODEL, rngs=nnx.Rngs(0))
    reference = transformers.BertModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    return model, config, report, reference, tokenizer


@pytest.mark.slow
def test_minilm_matches_transformers_on_every_layer(minilm):
    model, config, report, reference, tokenizer = minilm
    assert config.num_hidden_layers == 6 and config.hidden_size == 384
    assert report.missing == [] and report.unexpected == []
    batch = dict(tokenizer([a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True, return_tensors="np"))
    assert batch["attention_mask"].min() == 0  # the batch really has padding
    ours = run(model, batch)
    assert len(ours.hidden_states) == 7
    assert max_diff_real(ours, torch_outputs(reference, batch), batch["attention_mask"]) < 1e-4


# --- Conversion from a random tiny torch BERT ----------------------------------------------------


def tiny_torch_bert(hidden_act: str = "gelu") -> transformers.BertModel:
    c = tiny_config()
    hf_config = transformers.BertConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings,
        hidden_act=hidden_act,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(hf_config).eval()
    # Large random values everywhere (LayerNorm and biases too), so a swapped or untransposed
    # tensor cannot hide behind BERT's small init.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_bert")
    tiny_torch_bert().save_pretrained(path)
    return path


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "relu"])
def test_tiny_checkpoint_loads_and_matches(tmp_path, hidden_act):
    reference = tiny_torch_bert(hidden_act)
    reference.save_pretrained(tmp_path)
    model, config, report = load_pretrained_bert(str(tmp_path), rngs=nnx.Rngs(0))
    assert config.hidden_act == hidden_act
    assert (report.missing, report.unexpected) == ([], [])
    batch = random_batch(128, [12, 7, 3], 12)
    assert max_diff_real(run(model, batch), torch_outputs(reference, batch), batch["attention_mask"]) < 1e-5


def test_prefixed_checkpoint_with_pretraining_head_loads_the_same(tiny_dir, tmp_path):
    tensors = safetensors.torch.load_file(tiny_dir / "model.safetensors")
    prefixed = {f"bert.{k}": v for k, v in tensors.items()}
    prefixed["cls.predictions.bias"] = torch.zeros(tiny_config().vocab_size)
    prefixed["bert.embeddings.position_ids"] = torch.arange(128)[None]
    safetensors.torch.save_file(prefixed, tmp_path / "model.safetensors")
    shutil.copy(tiny_dir / "config.json", tmp_path / "config.json")

    plain, _, _ = load_pretrained_bert(str(tiny_dir), rngs=nnx.Rngs(0))
    model, _, report = load_pretrained_bert(str(tmp_path), rngs=nnx.Rngs(1))
    assert report.ignored == ["bert.embeddings.position_ids", "cls.predictions.bias"]
    assert (report.missing, report.unexpected) == ([], [])
    jax.tree.map(
        np.testing.assert_array_equal,
        nnx.to_pure_dict(nnx.state(plain, nnx.Param)),
        nnx.to_pure_dict(nnx.state(model, nnx.Param)),
    )


def test_old_gamma_beta_names_and_transposed_kernels(tiny_dir):
    tensors = load_hf_weights(tiny_dir)
    renamed = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in tensors.items()
    }
    params, report = convert_hf_weights(renamed, tiny_config())
    assert report.missing == [] and report.unexpected == []
    np.testing.assert_array_equal(
        params["embeddings"]["layer_norm"]["scale"], tensors["embeddings.LayerNorm.weight"]
    )
    np.testing.assert_array_equal(
        params["layers"][1]["intermediate"]["kernel"],
        tensors["encoder.layer.1.intermediate.dense.weight"].T,
    )
    assert params["layers"][1]["intermediate"]["kernel"].shape == (32, 64)


def test_unknown_and_missing_tensors_are_reported(tiny_dir):
    tensors = load_hf_weights(tiny_dir)
    del tensors["encoder.layer.0.output.dense.bias"]
    tensors["encoder.layer.0.adapter.weight"] = np.zeros((2, 2), np.float32)
    tensors["encoder.layer.7.output.dense.bias"] = np.zeros((32,), np.float32)
    _, report = convert_hf_weights(tensors, tiny_config())
    assert report.missing == ["layers/0/output/bias"]
    assert report.unexpected == [
        "encoder.layer.0.adapter.weight",
        "encoder.layer.7.output.dense.bias",
    ]


def test_missing_pooler_keeps_random_init_but_missing_encoder_is_an_error(tiny_dir, tmp_path):
    tensors = safetensors.torch.load_file(tiny_dir / "model.safetensors")
    shutil.copy(tiny_dir / "config.json", tmp_path / "config.json")
    no_pooler = {k: v for k, v in tensors.items() if not k.startswith("pooler.")}
    safetensors.torch.save_file(no_pooler, tmp_path / "model.safetensors")
    model, _, report = load_pretrained_bert(str(tmp_path), rngs=nnx.Rngs(0))
    assert report.missing == ["pooler/kernel", "pooler/bias"]
    np.testing.assert_array_equal(model.pooler.bias[...], np.zeros(32))

    del no_pooler["encoder.layer.1.attention.self.key.weight"]
    safetensors.torch.save_file(no_pooler, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="layers/1/attention/key/kernel"):
        load_pretrained_bert(str(tmp_path), rngs=nnx.Rngs(0))


def test_pickle_checkpoint_needs_allow_pickle(tiny_dir, tmp_path):
    reference = transformers.BertModel.from_pretrained(tiny_dir).eval()
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    shutil.copy(tiny_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(ValueError, match="allow_pickle"):
        load_pretrained_bert(str(tmp_path), rngs=nnx.Rngs(0))
    model, _, report = load_pretrained_bert(str(tmp_path), allow_pickle=True, rngs=nnx.Rngs(0))
    assert (report.missing, report.unexpected) == ([], [])
    batch = random_batch(128, [12, 7, 3], 12)
    assert max_diff_real(run(model, batch), torch_outputs(reference, batch), batch["attention_mask"]) < 1e-5


# --- Every family: random transformers models of each, saved as a user's checkpoint ----------------


def family_batch(config: BertConfig, lengths: list[int], length: int, seed: int = 0) -> dict:
    """Random real tokens (never the padding id), padded with the family's padding id; two token
    types where the model has them, else zeros."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(length)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = rng.integers(config.pad_token_id + 1, config.vocab_size, size=mask.shape)
    types = (np.arange(length)[None, :] >= np.asarray(lengths)[:, None] // 2) * mask
    return {
        "input_ids": np.where(mask, ids, config.pad_token_id).astype(np.int32),
        "token_type_ids": (types if config.type_vocab_size > 1 else 0 * types).astype(np.int32),
        "attention_mask": mask,
    }


def assert_family_parity(model: BertModel, reference, batch: dict, atol: float) -> None:
    """Every layer's hidden states at the real positions within `atol` of transformers', and the pooled
    output: the pooler's where both have one; the last layer's first token where the family has none."""
    ours = run(model, batch)
    theirs = encoders.torch_hidden_states(reference, batch)
    real = batch["attention_mask"].astype(bool)
    assert len(ours.hidden_states) == len(theirs) == model.config.num_hidden_layers + 1
    for layer, (a, b) in enumerate(zip(ours.hidden_states, theirs, strict=True)):
        diff = np.abs(np.asarray(a)[real] - b[real]).max()
        assert diff < atol, f"layer {layer}: max |ours - transformers| = {diff}"
    if model.pooler is None:
        np.testing.assert_array_equal(ours.pooled, np.asarray(ours.hidden_states[-1])[:, 0])
    elif getattr(reference, "pooler", None) is not None:
        inputs = {k: torch.as_tensor(v).long() for k, v in batch.items()}
        with torch.no_grad():
            pooled = reference(**inputs).pooler_output.numpy()
        np.testing.assert_allclose(ours.pooled, pooled, atol=atol)


@pytest.mark.parametrize("family", encoders.FAMILIES)
def test_family_matches_transformers_on_every_layer(family, tmp_path):
    reference = encoders.random_encoder(family, **encoders.SMALL)
    reference.save_pretrained(tmp_path)
    model, config, report = load_pretrained_bert(str(tmp_path), rngs=nnx.Rngs(0))
    assert config.model_type == family
    assert (report.missing, report.unexpected) == ([], [])
    assert (model.pooler is not None) == (family in ("bert", "roberta", "xlm-roberta"))
    assert (model.embeddings.token_type_embeddings is None) == (family == "distilbert")
    assert (model.embeddings.projection is not None) == (family == "electra")
    assert_family_parity(model, reference, family_batch(config, [12, 7, 3], 12), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("family", encoders.FAMILIES)
def test_base_sized_family_matches_transformers_on_every_layer(family, tmp_path):
    """12 layers of 768 (the released base checkpoints' shape; a 1000-token vocabulary keeps the file
    small), 128 tokens, within 1e-4."""
    reference = encoders.random_encoder(
        family, **encoders.BASE, vocab_size=1000, max_length=512, std=0.3, matrix_std=0.02
    )
    reference.save_pretrained(tmp_path)
    model, config, report = load_pretrained_bert(str(tmp_path), rngs=nnx.Rngs(0))
    assert (report.missing, report.unexpected) == ([], [])
    assert_family_parity(model, reference, family_batch(config, [128, 77, 5], 128), atol=1e-4)


@pytest.mark.parametrize(
    "family, model_class, heads",
    [
        ("bert", transformers.BertForPreTraining, "cls."),
        ("roberta", transformers.RobertaForMaskedLM, "lm_head."),
        ("xlm-roberta", transformers.XLMRobertaForSequenceClassification, "classifier."),
        ("electra", transformers.ElectraForPreTraining, "discriminator_predictions."),
        ("distilbert", transformers.DistilBertForMaskedLM, "vocab_"),
    ],
)
def test_task_and_pretraining_checkpoints_load_their_encoder(family, model_class, heads, tmp_path):
    """What the hub holds (roberta-base is a RobertaForMaskedLM, google/electra-base-discriminator an
    ElectraForPreTraining): the encoder under the family's prefix loads, the heads are ignored."""
    reference = encoders.random_encoder(family, model_class=model_class, **encoders.SMALL)
    reference.save_pretrained(tmp_path)
    model, config, report = load_pretrained_bert(str(tmp_path), rngs=nnx.Rngs(0))
    # RoBERTa's masked-LM and classification classes have no pooler: ours keeps its init, as for BERT.
    no_pooler = config.family.has_pooler and getattr(reference.base_model, "pooler", None) is None
    assert report.missing == (["pooler/kernel", "pooler/bias"] if no_pooler else [])
    assert report.unexpected == []
    assert report.ignored and all(name.startswith(heads) for name in report.ignored)
    assert_family_parity(model, reference.base_model, family_batch(config, [12, 7, 3], 12), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("family", ["roberta", "electra", "distilbert"])
def test_half_precision_checkpoints_load_exactly(family, dtype, tmp_path):
    reference = encoders.random_encoder(family, **encoders.SMALL)
    reference.to(dtype).save_pretrained(tmp_path)
    assert (
        safetensors.safe_open(str(tmp_path / "model.safetensors"), "pt")
        .get_tensor(next(iter(safetensors.safe_open(str(tmp_path / "model.safetensors"), "pt").keys())))
        .dtype
        == dtype
    )
    model, config, _ = load_pretrained_bert(str(tmp_path), rngs=nnx.Rngs(0))
    # Every stored value survives exactly (float32 holds fp16 and bf16), so the float32 model of the
    # rounded weights is matched as closely as a float32 checkpoint is.
    assert_family_parity(model, reference.float(), family_batch(config, [12, 7, 3], 12), atol=1e-5)
    ours = model.embeddings.word_embeddings.embedding[...]
    np.testing.assert_array_equal(ours, reference.embeddings.word_embeddings.weight.detach().numpy())


def test_roberta_positions_count_from_the_padding_id_and_cap_the_length(tmp_path):
    reference = encoders.random_encoder("roberta", **encoders.SMALL, max_length=16)
    reference.save_pretrained(tmp_path)
    model, config, _ = load_pretrained_bert(str(tmp_path), rngs=nnx.Rngs(0))
    assert config.max_position_embeddings == 18 and config.first_position == 2
    assert config.max_sequence_length == 16
    assert_family_parity(model, reference, family_batch(config, [16, 9], 16), atol=1e-5)
    with pytest.raises(ValueError, match="sequence length 17 exceeds the 16 tokens"):
        run(model, family_batch(config, [17], 17))


# --- Config and model resolution ------------------------------------------------------------------


def test_config_rejects_other_architectures_naming_the_file(tiny_dir, tmp_path):
    config = json.loads((tiny_dir / "config.json").read_text())
    assert BertConfig.from_dict(config) == tiny_config()
    for key, value in [
        ("model_type", "gpt2"),
        ("position_embedding_type", "relative_key"),
        ("hidden_act", "swish"),
    ]:
        (tmp_path / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(ValueError, match=f"config.json.*{value}"):
            BertConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(ValueError) as error:
        BertConfig.from_pretrained(tmp_path)
    assert str(error.value) == (
        f"{tmp_path / 'config.json'}: model_type='gpt2' is not supported; "
        "supported: bert, roberta, xlm-roberta, electra, distilbert"
    )


def test_unknown_hub_id_offline_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="neither a local folder nor in the Hugging Face"):
        resolve_model_dir("stackft-tests/no-such-bert")


def test_local_folder_without_config_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}.*no config.json"):
        resolve_model_dir(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "nope"))
    assert resolve_model_dir(EMBEDDED_MODEL).joinpath("config.json").is_file()


# --- Behaviour of the model itself ----------------------------------------------------------------


def test_bfloat16_compute_keeps_float32_params():
    batch = random_batch(128, [12, 7, 3], 12)
    f32 = run(BertModel(tiny_config(), rngs=nnx.Rngs(0)), batch)
    model = BertModel(tiny_config(), dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    bf16 = run(model, batch)
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert {p.dtype for p in params} == {jnp.dtype(jnp.float32)}
    assert all(h.dtype == jnp.bfloat16 for h in bf16.hidden_states)
    assert bf16.pooled.dtype == jnp.bfloat16
    for a, b in zip(bf16.hidden_states, f32.hidden_states, strict=True):
        np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=0.1)


def test_dropout_only_when_not_deterministic():
    model = BertModel(tiny_config(), rngs=nnx.Rngs(0))
    batch = random_batch(128, [12, 7, 3], 12)

    def last(deterministic: bool, seed: int) -> np.ndarray:
        out = run(model, batch, deterministic=deterministic, rngs=nnx.Rngs(dropout=seed))
        return np.asarray(out.hidden_states[-1])

    np.testing.assert_array_equal(last(True, 0), last(True, 1))
    np.testing.assert_array_equal(last(False, 3), last(False, 3))
    assert np.abs(last(False, 0) - last(False, 1)).max() > 1e-3
    with pytest.raises(ValueError, match="rngs"):
        run(model, batch, deterministic=False)


def test_padding_does_not_change_real_positions():
    c = tiny_config()
    model = BertModel(c, rngs=nnx.Rngs(0))
    batch = random_batch(c.vocab_size, [12, 7, 0], 12)  # the last row is a fully masked example
    longer = {k: np.pad(v, ((0, 0), (0, 9))) for k, v in batch.items()}
    short, long = run(model, batch), run(model, longer)
    real = batch["attention_mask"].astype(bool)
    for a, b in zip(short.hidden_states, long.hidden_states, strict=True):
        np.testing.assert_allclose(np.asarray(a)[real], np.asarray(b)[:, :12][real], atol=1e-5)
        assert np.isfinite(np.asarray(b)).all()
    np.testing.assert_allclose(short.pooled[:2], long.pooled[:2], atol=1e-5)

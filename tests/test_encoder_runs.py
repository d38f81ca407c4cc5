"""End to end with a RoBERTa-shaped encoder (random weights, a byte-level BPE tokenizer trained here): a
pair head and a tagging head under stack_and_finetune, each resumed bit-identically after kills and
exported to transformers (RobertaModel loads it, same hidden states). Then the
families without a pooler (DistilBERT, ELECTRA) through the feature cache, the scalar mix and gradual
unfreezing, and XLM-R tagging words with a SentencePiece-style tokenizer.

Nothing here is specific to RoBERTa in the library: the run goes through the same command line as BERT's,
with `model.name_or_path` pointing at a folder that holds the family's config.json, safetensors weights
and tokenizer, as a downloaded roberta-base would.
"""

import json
import math
import shutil
import signal
from pathlib import Path

import pytest

from configs import tiny
from stackft_jax.data.samples import sample_path
from stackft_jax.models import bert
from stackft_jax.trained import opening
from tests import encoders
from tests.test_export import _check_encoder, _cli
from tests.test_train import _assert_same_run

# The tiny config's architecture overrides off: the architecture is the folder's config.json.
PRETRAINED = (
    "--config.model.init=pretrained",
    *(
        f"--config.model.config_overrides.{key}=0"
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    ),
)
HEADS = {
    "bimpm": (
        "configs/tiny.py",
        16,
        (
            "--config.head.name=bimpm",
            "--config.head.bimpm.context_lstm_units=8",
            "--config.head.bimpm.num_perspectives=4",
            "--config.head.bimpm.aggregation_lstm_units=8",
            "--config.head.bimpm.mlp_hidden_dim=16",
        ),
    ),
    "bilstm_crf": ("configs/tiny.py:conll", 101, ("--config.head.name=bilstm_crf",)),
}


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory) -> Path:
    """A random 2-layer RoBERTa (padding id 1, one token type, positions from 2) and a BPE tokenizer
    trained on the fixtures' texts, saved together."""
    folder = tmp_path_factory.mktemp("roberta")
    texts = [
        line
        for path in (
            tiny.FIXTURES / "qqp" / "train.tsv",
            tiny.FIXTURES / "qqp" / "dev.tsv",
            sample_path("conll_train.txt"),
            sample_path("conll_dev.txt"),
        )
        for line in Path(path).read_text().splitlines()
    ]
    tokenizer = encoders.train_bpe(folder, texts, vocab_size=500)
    model = encoders.random_encoder("roberta", **encoders.SMALL, vocab_size=len(tokenizer), std=0.05)
    model.save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "roberta"
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("head", HEADS)
def test_roberta_runs_stack_and_finetune_and_resumes_bit_identically(head, roberta_dir, tmp_path, run_cli):
    config, num_dev_examples, head_args = HEADS[head]
    args = (f"--config.model.name_or_path={roberta_dir}", *PRETRAINED, *head_args)
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    proc = run_cli(uninterrupted, *args, config=config)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((uninterrupted / "results.json").read_text())
    assert results["strategy"] == "stack_and_finetune"
    assert [p["phase"] for p in results["phases"]] == ["phase1", "phase2"]
    assert math.isfinite(results["final"]["dev"]["accuracy"]) and results["final"]["dev"]["loss"] > 0
    for kill_at in ("phase1:3", "phase2:5"):
        proc = run_cli(resumed, *args, config=config, kill_at=kill_at)
        assert proc.returncode == -signal.SIGKILL, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = run_cli(resumed, *args, config=config)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _assert_same_run(uninterrupted, resumed, num_dev_examples=num_dev_examples)
    # The trained RoBERTa exports as transformers' RobertaModel with its BPE tokenizer.
    exported = tmp_path / "export"
    proc = _cli("export", f"--workdir={uninterrupted}", f"--out={exported}")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((exported / "config.json").read_text())["model_type"] == "roberta"
    _check_encoder(exported, opening.open_workdir(uninterrupted))


@pytest.fixture(scope="module")
def wordpiece_family_dir(tmp_path_factory):
    """`make(family)`: a folder with a random 2-layer encoder of `family` and the embedded MiniLM's
    WordPiece tokenizer (ELECTRA's and DistilBERT's released tokenizers are BERT's)."""
    minilm = bert.resolve_model_dir(bert.EMBEDDED_MODEL)

    def make(family: str) -> Path:
        folder = tmp_path_factory.mktemp(family)
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(minilm / name, folder / name)
        vocab_size = len((minilm / "vocab.txt").read_text().splitlines())
        model = encoders.random_encoder(family, **encoders.SMALL, vocab_size=vocab_size, std=0.05)
        model.save_pretrained(folder)
        return folder

    return make


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "args"),
    [
        # No pooler, no token types: a pair head on a scalar mix of frozen layers, read from the cache.
        (
            "distilbert",
            (
                "--config.head.name=esim",
                "--config.model.scalar_mix=True",
                "--config.phase1.backbone_dropout=False",
                "--config.phase1.feature_cache=True",
            ),
        ),
        # No pooler, a projected embedding: layer-by-layer unfreezing with discriminative rates.
        (
            "electra",
            (
                "--config.strategy=gradual_unfreezing",
                "--config.unfreezing.num_steps=2",
                "--config.unfreezing.layerwise_lr_decay=0.5",
            ),
        ),
    ],
)
@pytest.mark.slow
def test_families_without_a_pooler_run_the_other_strategies(
    family, args, wordpiece_family_dir, tmp_path, run_cli
):
    folder = wordpiece_family_dir(family)
    proc = run_cli(tmp_path, f"--config.model.name_or_path={folder}", *PRETRAINED, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert math.isfinite(results["final"]["dev"]["accuracy"]) and results["final"]["dev"]["loss"] > 0
    if family == "electra":
        names = ["head", "unfreeze_layer1", "unfreeze_layer0", "unfreeze_embeddings"]
        assert [p["phase"] for p in results["phases"]] == names
    else:
        assert (tmp_path / "feature_cache").is_dir()


@pytest.mark.slow
def test_xlm_roberta_tags_words_with_a_sentencepiece_tokenizer(tmp_path, run_cli):
    """Multilingual NER's usual encoder: XLM-R's layout and a Unigram ("▁word") tokenizer trained here."""
    folder = tmp_path / "xlmr"
    texts = [
        line
        for path in (sample_path("conll_train.txt"), sample_path("conll_dev.txt"))
        for line in Path(path).read_text().splitlines()
    ]
    tokenizer = encoders.train_unigram(folder, texts, vocab_size=400)
    model = encoders.random_encoder("xlm-roberta", **encoders.SMALL, vocab_size=len(tokenizer), std=0.05)
    model.save_pretrained(folder)
    args = (f"--config.model.name_or_path={folder}", *PRETRAINED, "--config.head.name=crf")
    proc = run_cli(tmp_path / "run", *args, config="configs/tiny.py:conll")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    final = json.loads((tmp_path / "run" / "results.json").read_text())["final"]["dev"]
    assert {"f1", "accuracy"} <= set(final) and math.isfinite(final["accuracy"])
